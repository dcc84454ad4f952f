//! The descriptor-chain validation layer every device uses.
//!
//! A chain the guest made available is walked once, here, before a device
//! sees any of it: at most `queue size` descriptors (a loop is a chain
//! longer than the queue), each index inside the table, no indirect
//! descriptor (the feature is never offered), no zero-length descriptor,
//! readable descriptors before writable ones and in the direction the
//! device expects, every buffer inside guest memory and the total length
//! within 2^32 bytes, all with checked arithmetic. Devices then only see
//! the bounded [`ChainReader`] and [`ChainWriter`] cursors over the
//! validated segments. A chain that fails is completed with length 0 and
//! counted by the caller ([`super::queue`]); nothing here panics.

use virtio_queue::desc::split::Descriptor;
use vm_memory::{Address, ByteValued, Bytes, GuestAddress, GuestMemory};

/// `VIRTQ_DESC_F_NEXT`: the chain goes on at `next`.
pub const DESC_F_NEXT: u16 = 1;
/// `VIRTQ_DESC_F_WRITE`: the device writes this buffer.
pub const DESC_F_WRITE: u16 = 2;
/// `VIRTQ_DESC_F_INDIRECT`: the buffer is a table of descriptors.
pub const DESC_F_INDIRECT: u16 = 4;
/// Size of one descriptor in the table.
pub const DESC_SIZE: u64 = 16;

/// Why a chain was refused. Each names the descriptor (its index in the
/// table) that was wrong.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ChainError {
    #[error("descriptor index {index} is outside the queue of {size}")]
    IndexOutOfRange { index: u16, size: u16 },
    #[error("the chain has more descriptors than the queue ({size}): a loop")]
    TooLong { size: u16 },
    #[error("descriptor {index}: its table entry is outside guest memory")]
    TableOutsideMemory { index: u16 },
    #[error("descriptor {index} is indirect, a feature that was not offered")]
    Indirect { index: u16 },
    #[error("descriptor {index} has length 0")]
    ZeroLength { index: u16 },
    #[error("descriptor {index}: {len} bytes at {addr:#x} are outside guest memory")]
    OutsideMemory { index: u16, addr: u64, len: u32 },
    #[error("descriptor {index} is readable but follows a writable one")]
    ReadableAfterWritable { index: u16 },
    #[error("descriptor {index} is readable, but this device reads nothing")]
    UnexpectedReadable { index: u16 },
    #[error("descriptor {index} is writable, but this device writes nothing")]
    UnexpectedWritable { index: u16 },
    #[error("the chain's buffers add up to more than 2^32 bytes")]
    TotalTooLong,
    #[error("the chain has no {0} buffer")]
    Missing(&'static str),
    #[error("the request needs {need} readable bytes, the chain has {have}")]
    ShortRead { need: usize, have: usize },
    #[error("guest memory at {addr:#x} cannot be accessed")]
    Memory { addr: u64 },
}

/// Which buffers a device's requests hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Direction {
    /// Only buffers the device reads (e.g. a transmit queue).
    DeviceReads,
    /// Only buffers the device writes (e.g. virtio-rng).
    DeviceWrites,
    /// A request to read, then room for the answer.
    Both,
    /// A request to read, then room for an answer if the request has one
    /// (virtio-fs: a `FORGET` is answered by nothing).
    ReadsMaybeWrites,
}

/// One buffer of a validated chain: inside guest memory, not empty.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Segment {
    pub addr: GuestAddress,
    pub len: u32,
}

/// A chain that passed every check.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ValidChain {
    /// The head's index, what the used ring is told.
    pub head: u16,
    readable: Vec<Segment>,
    writable: Vec<Segment>,
    readable_len: u32,
    writable_len: u32,
}

impl ValidChain {
    /// Walks the chain that starts at `head` in the descriptor table at
    /// `table` of a queue of `size` entries, and checks it.
    pub fn parse<M: GuestMemory>(
        mem: &M,
        table: GuestAddress,
        size: u16,
        head: u16,
        direction: Direction,
    ) -> Result<ValidChain, ChainError> {
        let mut chain = ValidChain {
            head,
            readable: Vec::new(),
            writable: Vec::new(),
            readable_len: 0,
            writable_len: 0,
        };
        let mut index = head;
        let mut total: u32 = 0;
        // The loop bound: a chain holds at most `size` descriptors.
        for _ in 0..size {
            if index >= size {
                return Err(ChainError::IndexOutOfRange { index, size });
            }
            let entry = table
                .checked_add(u64::from(index) * DESC_SIZE)
                .ok_or(ChainError::TableOutsideMemory { index })?;
            let desc: Descriptor = mem
                .read_obj(entry)
                .map_err(|_| ChainError::TableOutsideMemory { index })?;
            let flags = desc.flags();
            if flags & DESC_F_INDIRECT != 0 {
                return Err(ChainError::Indirect { index });
            }
            let len = desc.len();
            if len == 0 {
                return Err(ChainError::ZeroLength { index });
            }
            let addr = desc.addr();
            let inside =
                addr.checked_add(u64::from(len)).is_some() && mem.check_range(addr, len as usize);
            if !inside {
                return Err(ChainError::OutsideMemory {
                    index,
                    addr: addr.raw_value(),
                    len,
                });
            }
            total = total.checked_add(len).ok_or(ChainError::TotalTooLong)?;
            let segment = Segment { addr, len };
            if flags & DESC_F_WRITE != 0 {
                if direction == Direction::DeviceReads {
                    return Err(ChainError::UnexpectedWritable { index });
                }
                chain.writable.push(segment);
                chain.writable_len += len;
            } else {
                if direction == Direction::DeviceWrites {
                    return Err(ChainError::UnexpectedReadable { index });
                }
                if !chain.writable.is_empty() {
                    return Err(ChainError::ReadableAfterWritable { index });
                }
                chain.readable.push(segment);
                chain.readable_len += len;
            }
            if flags & DESC_F_NEXT == 0 {
                return chain.complete(direction);
            }
            index = desc.next();
        }
        Err(ChainError::TooLong { size })
    }

    fn complete(self, direction: Direction) -> Result<ValidChain, ChainError> {
        match direction {
            Direction::DeviceReads | Direction::Both | Direction::ReadsMaybeWrites
                if self.readable.is_empty() =>
            {
                Err(ChainError::Missing("readable"))
            }
            Direction::DeviceWrites | Direction::Both if self.writable.is_empty() => {
                Err(ChainError::Missing("writable"))
            }
            _ => Ok(self),
        }
    }

    /// The buffers the device reads, in order.
    pub fn readable(&self) -> &[Segment] {
        &self.readable
    }

    /// The buffers the device writes, in order.
    pub fn writable(&self) -> &[Segment] {
        &self.writable
    }

    /// Bytes the device may read.
    pub fn readable_len(&self) -> u32 {
        self.readable_len
    }

    /// Bytes the device may write.
    pub fn writable_len(&self) -> u32 {
        self.writable_len
    }

    pub fn reader<'a, M: GuestMemory>(&'a self, mem: &'a M) -> ChainReader<'a, M> {
        ChainReader {
            mem,
            segments: &self.readable,
            at: 0,
            offset: 0,
        }
    }

    pub fn writer<'a, M: GuestMemory>(&'a self, mem: &'a M) -> ChainWriter<'a, M> {
        ChainWriter {
            mem,
            segments: &self.writable,
            at: 0,
            offset: 0,
            written: 0,
        }
    }
}

/// Reads the readable buffers of a chain in order, never past their end.
pub struct ChainReader<'a, M> {
    mem: &'a M,
    segments: &'a [Segment],
    at: usize,
    offset: u32,
}

impl<M: GuestMemory> ChainReader<'_, M> {
    /// Fills as much of `buf` as the chain has left; returns how much.
    pub fn read(&mut self, buf: &mut [u8]) -> Result<usize, ChainError> {
        let mut done = 0;
        while done < buf.len() {
            let Some(seg) = self.segments.get(self.at) else {
                break;
            };
            let left = (seg.len - self.offset) as usize;
            let n = left.min(buf.len() - done);
            // Inside the segment, which was checked against memory.
            let addr = seg.addr.unchecked_add(u64::from(self.offset));
            self.mem
                .read_slice(&mut buf[done..done + n], addr)
                .map_err(|_| ChainError::Memory {
                    addr: addr.raw_value(),
                })?;
            done += n;
            self.offset += n as u32;
            if self.offset == seg.len {
                self.at += 1;
                self.offset = 0;
            }
        }
        Ok(done)
    }

    /// Moves past `n` bytes without reading them (a device that resumes a
    /// chain it partly consumed); returns how many were skipped.
    pub fn skip(&mut self, n: u32) -> u32 {
        let mut done = 0;
        while done < n {
            let Some(seg) = self.segments.get(self.at) else {
                break;
            };
            let step = (seg.len - self.offset).min(n - done);
            done += step;
            self.offset += step;
            if self.offset == seg.len {
                self.at += 1;
                self.offset = 0;
            }
        }
        done
    }

    /// Copies a header (or any fixed-size request) out of guest memory,
    /// once; a chain too short for it is an error, not a partial header.
    pub fn read_obj<T: ByteValued + Default>(&mut self) -> Result<T, ChainError> {
        let mut value = T::default();
        let need = std::mem::size_of::<T>();
        let have = self.read(value.as_mut_slice())?;
        if have < need {
            return Err(ChainError::ShortRead { need, have });
        }
        Ok(value)
    }
}

/// Writes into the writable buffers of a chain in order, never past
/// their end; counts what it wrote (the used length).
pub struct ChainWriter<'a, M> {
    mem: &'a M,
    segments: &'a [Segment],
    at: usize,
    offset: u32,
    written: u32,
}

impl<M: GuestMemory> ChainWriter<'_, M> {
    /// Writes as much of `data` as fits; returns how much.
    pub fn write(&mut self, data: &[u8]) -> Result<usize, ChainError> {
        let mut done = 0;
        while done < data.len() {
            let Some(seg) = self.segments.get(self.at) else {
                break;
            };
            let left = (seg.len - self.offset) as usize;
            let n = left.min(data.len() - done);
            let addr = seg.addr.unchecked_add(u64::from(self.offset));
            self.mem
                .write_slice(&data[done..done + n], addr)
                .map_err(|_| ChainError::Memory {
                    addr: addr.raw_value(),
                })?;
            done += n;
            self.offset += n as u32;
            self.written += n as u32;
            if self.offset == seg.len {
                self.at += 1;
                self.offset = 0;
            }
        }
        Ok(done)
    }

    /// Room left.
    pub fn available(&self) -> u32 {
        let total: u32 = self.segments.iter().map(|s| s.len).sum();
        total - self.written
    }

    /// Bytes written so far: the length the used ring reports.
    pub fn written(&self) -> u32 {
        self.written
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};

    const W: u16 = DESC_F_WRITE;
    /// A descriptor as a test writes it: (index, addr, len, flags, next).
    type Desc = (u16, u64, u32, u16, u16);

    fn parse(q: &GuestQueue, head: u16, d: Direction) -> Result<ValidChain, ChainError> {
        ValidChain::parse(q.memory(), q.desc, q.size, head, d)
    }

    #[test]
    fn a_request_and_its_answer_are_read_and_written_in_order() {
        let mem = memory(1 << 20).unwrap();
        let q = GuestQueue::new(&mem, GuestAddress(0), 8).unwrap();
        mem.write_slice(&[1, 2, 3, 4, 5, 6], GuestAddress(0x8000))
            .unwrap();
        mem.write_slice(&[7, 8], GuestAddress(0x9000)).unwrap();
        q.set_chain(
            2,
            &[
                (0x8000, 6, 0),
                (0x9000, 2, 0),
                (0xa000, 3, W),
                (0xb000, 5, W),
            ],
        )
        .unwrap();
        let c = parse(&q, 2, Direction::Both).unwrap();
        assert_eq!((c.head, c.readable_len(), c.writable_len()), (2, 8, 8));
        let mut r = c.reader(&mem);
        let header: u32 = r.read_obj().unwrap();
        assert_eq!(header, u32::from_le_bytes([1, 2, 3, 4]));
        let mut rest = [0u8; 10];
        assert_eq!(r.read(&mut rest).unwrap(), 4);
        assert_eq!(rest[..4], [5, 6, 7, 8]);
        let mut w = c.writer(&mem);
        assert_eq!(w.write(&[9; 6]).unwrap(), 6);
        assert_eq!(w.available(), 2);
        assert_eq!(w.write(&[10; 6]).unwrap(), 2);
        assert_eq!(w.written(), 8);
        let mut out = [0u8; 5];
        mem.read_slice(&mut out, GuestAddress(0xb000)).unwrap();
        assert_eq!(out, [9, 9, 9, 10, 10]);
    }

    #[test]
    fn a_header_longer_than_the_chain_is_refused_whole() {
        let mem = memory(1 << 20).unwrap();
        let q = GuestQueue::new(&mem, GuestAddress(0), 8).unwrap();
        q.set_chain(0, &[(0x8000, 3, 0), (0x9000, 4, W)]).unwrap();
        let c = parse(&q, 0, Direction::Both).unwrap();
        assert_eq!(
            c.reader(&mem).read_obj::<u64>(),
            Err(ChainError::ShortRead { need: 8, have: 3 })
        );
        // A zero-length header never reaches a device.
        q.set_chain(0, &[(0x8000, 0, 0), (0x9000, 4, W)]).unwrap();
        assert_eq!(
            parse(&q, 0, Direction::Both),
            Err(ChainError::ZeroLength { index: 0 })
        );
    }

    #[test]
    fn each_check_names_what_was_wrong() {
        let mem = memory(1 << 20).unwrap();
        let q = GuestQueue::new(&mem, GuestAddress(0), 4).unwrap();
        let mut cases: Vec<(Vec<Desc>, Direction, ChainError)> = vec![
            (
                vec![(0, 0x8000, 8, W | DESC_F_NEXT, 0)],
                Direction::DeviceWrites,
                ChainError::TooLong { size: 4 },
            ),
            (
                vec![(0, 0x8000, 8, W | DESC_F_NEXT, 4)],
                Direction::DeviceWrites,
                ChainError::IndexOutOfRange { index: 4, size: 4 },
            ),
            (
                vec![(0, 0xf_fff8, 9, W, 0)],
                Direction::DeviceWrites,
                ChainError::OutsideMemory {
                    index: 0,
                    addr: 0xf_fff8,
                    len: 9,
                },
            ),
            (
                vec![(0, 0x8000, 8, 0, 0)],
                Direction::DeviceWrites,
                ChainError::UnexpectedReadable { index: 0 },
            ),
            (
                vec![(0, 0x8000, 8, W, 0)],
                Direction::DeviceReads,
                ChainError::UnexpectedWritable { index: 0 },
            ),
            (
                vec![(0, 0x8000, 8, 0, 0)],
                Direction::Both,
                ChainError::Missing("writable"),
            ),
            (
                vec![(0, 0x8000, 8, W, 0)],
                Direction::Both,
                ChainError::Missing("readable"),
            ),
            (
                vec![(0, 0x8000, 8, W | DESC_F_NEXT, 1), (1, 0x9000, 8, 0, 0)],
                Direction::Both,
                ChainError::ReadableAfterWritable { index: 1 },
            ),
            (
                vec![(0, 0x8000, 16, DESC_F_INDIRECT, 0)],
                Direction::Both,
                ChainError::Indirect { index: 0 },
            ),
        ];
        // The last descriptor's index in a chain that visits all four.
        cases.push((
            vec![
                (0, 0x8000, 1, W | DESC_F_NEXT, 3),
                (3, 0x8001, 1, W | DESC_F_NEXT, 1),
                (1, 0x8002, 1, W | DESC_F_NEXT, 2),
                (2, 0x8003, 1, W | DESC_F_NEXT, 0),
            ],
            Direction::DeviceWrites,
            ChainError::TooLong { size: 4 },
        ));
        for (descs, d, want) in cases {
            for &(i, addr, len, flags, next) in &descs {
                q.set_desc(i, addr, len, flags, next).unwrap();
            }
            assert_eq!(parse(&q, 0, d), Err(want), "{descs:x?}");
        }
        // A head outside the table, and a table outside memory.
        assert_eq!(
            parse(&q, 9, Direction::Both),
            Err(ChainError::IndexOutOfRange { index: 9, size: 4 })
        );
        assert_eq!(
            ValidChain::parse(&mem, GuestAddress(u64::MAX - 8), 4, 1, Direction::Both),
            Err(ChainError::TableOutsideMemory { index: 1 })
        );
    }

    #[test]
    fn lengths_adding_up_past_4_gib_are_refused() {
        // 2 GiB, never touched (anonymous, no reserve): each buffer is
        // inside memory, their sum is not a u32.
        let mem = memory(2 << 30).unwrap();
        let q = GuestQueue::new(&mem, GuestAddress(0), 4).unwrap();
        let big = 0x7000_0000;
        q.set_chain(
            0,
            &[
                (0x10_0000, big, W),
                (0x10_0000, big, W),
                (0x10_0000, big, W),
            ],
        )
        .unwrap();
        assert_eq!(
            parse(&q, 0, Direction::DeviceWrites),
            Err(ChainError::TotalTooLong)
        );
        q.set_chain(0, &[(0x10_0000, big, W), (0x10_0000, big, W)])
            .unwrap();
        assert_eq!(
            parse(&q, 0, Direction::DeviceWrites).map(|c| c.writable_len()),
            Ok(2 * big)
        );
    }
}
