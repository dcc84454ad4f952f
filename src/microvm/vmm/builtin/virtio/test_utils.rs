//! The guest's side of a split virtqueue, for tests and fuzz targets that
//! drive a device as a driver would: a descriptor table, an avail ring and
//! a used ring laid out in guest memory, written and read with the
//! virtio 1.x layout (2.7), independently of `virtio-queue`'s own code.

use virtio_queue::{Queue, QueueT};
use vm_memory::{Address, Bytes, GuestAddress, GuestMemory, GuestMemoryError, GuestMemoryMmap};

use super::chain::{DESC_F_NEXT, DESC_SIZE};

/// Guest memory of `size` bytes from address 0, anonymous (tests only).
pub fn memory(
    size: usize,
) -> std::result::Result<GuestMemoryMmap, vm_memory::mmap::FromRangesError> {
    GuestMemoryMmap::from_ranges(&[(GuestAddress(0), size)])
}

/// A driver's view of one queue.
pub struct GuestQueue<'a> {
    mem: &'a GuestMemoryMmap,
    pub size: u16,
    pub desc: GuestAddress,
    pub avail: GuestAddress,
    pub used: GuestAddress,
    avail_idx: u16,
}

type Result<T> = std::result::Result<T, GuestMemoryError>;

impl<'a> GuestQueue<'a> {
    /// Lays out a queue of `size` entries at `base` (16-byte aligned): the
    /// table, then the avail ring, then the used ring (4-byte aligned), all
    /// zeroed.
    pub fn new(mem: &'a GuestMemoryMmap, base: GuestAddress, size: u16) -> Result<GuestQueue<'a>> {
        let q = Self::layout(mem, base, size);
        let end = q.used.raw_value() + 6 + 8 * u64::from(size);
        let zeros = vec![0u8; (end - base.raw_value()) as usize];
        mem.write_slice(&zeros, base)?;
        Ok(q)
    }

    /// The driver's view of a queue that [`GuestQueue::new`] laid out at
    /// `base` earlier, its rings as they are now (the next request goes
    /// after those already offered).
    pub fn attach(
        mem: &'a GuestMemoryMmap,
        base: GuestAddress,
        size: u16,
    ) -> Result<GuestQueue<'a>> {
        let mut q = Self::layout(mem, base, size);
        q.avail_idx = u16::from_le(mem.read_obj(q.avail.unchecked_add(2))?);
        Ok(q)
    }

    fn layout(mem: &'a GuestMemoryMmap, base: GuestAddress, size: u16) -> GuestQueue<'a> {
        let n = u64::from(size);
        let desc = base;
        let avail = desc.unchecked_add(DESC_SIZE * n);
        let used = GuestAddress((avail.raw_value() + 6 + 2 * n + 3) & !3);
        GuestQueue {
            mem,
            size,
            desc,
            avail,
            used,
            avail_idx: 0,
        }
    }

    /// Writes descriptor `index` as it is, whatever it says.
    pub fn set_desc(&self, index: u16, addr: u64, len: u32, flags: u16, next: u16) -> Result<()> {
        let at = self.desc.unchecked_add(u64::from(index) * DESC_SIZE);
        let mut raw = [0u8; 16];
        raw[0..8].copy_from_slice(&addr.to_le_bytes());
        raw[8..12].copy_from_slice(&len.to_le_bytes());
        raw[12..14].copy_from_slice(&flags.to_le_bytes());
        raw[14..16].copy_from_slice(&next.to_le_bytes());
        self.mem.write_slice(&raw, at)
    }

    /// Writes a chain into descriptors `first`, `first` + 1, … (each
    /// `(addr, len, flags)`, `NEXT` added where another follows) and
    /// returns its head.
    pub fn set_chain(&self, first: u16, bufs: &[(u64, u32, u16)]) -> Result<u16> {
        for (i, &(addr, len, flags)) in bufs.iter().enumerate() {
            let index = first + i as u16;
            let last = i + 1 == bufs.len();
            let flags = if last { flags } else { flags | DESC_F_NEXT };
            self.set_desc(index, addr, len, flags, index + 1)?;
        }
        Ok(first)
    }

    /// Puts `head` on the avail ring and publishes the new index.
    pub fn offer(&mut self, head: u16) -> Result<()> {
        let slot = u64::from(self.avail_idx % self.size);
        self.mem
            .write_obj(head.to_le(), self.avail.unchecked_add(4 + 2 * slot))?;
        self.avail_idx = self.avail_idx.wrapping_add(1);
        self.set_avail_idx(self.avail_idx)
    }

    /// Writes the avail ring's index directly (a hostile driver may).
    pub fn set_avail_idx(&self, idx: u16) -> Result<()> {
        self.mem.write_obj(idx.to_le(), self.avail.unchecked_add(2))
    }

    /// The used ring's index.
    pub fn used_idx(&self) -> Result<u16> {
        Ok(u16::from_le(self.mem.read_obj(self.used.unchecked_add(2))?))
    }

    /// Used ring entry `i`: (head, length written).
    pub fn used_elem(&self, i: u16) -> Result<(u32, u32)> {
        let at = self.used.unchecked_add(4 + 8 * u64::from(i % self.size));
        let id: u32 = self.mem.read_obj(at)?;
        let len: u32 = self.mem.read_obj(at.unchecked_add(4))?;
        Ok((u32::from_le(id), u32::from_le(len)))
    }

    /// The device's queue, set up as a driver would through the transport.
    pub fn device_queue(&self) -> std::result::Result<Queue, virtio_queue::Error> {
        let mut q = Queue::new(self.size)?;
        q.try_set_desc_table_address(self.desc)?;
        q.try_set_avail_ring_address(self.avail)?;
        q.try_set_used_ring_address(self.used)?;
        q.set_ready(true);
        Ok(q)
    }

    pub fn memory(&self) -> &GuestMemoryMmap {
        self.mem
    }
}

/// Whether `[addr, addr + len)` is guest memory (for fuzz targets' checks).
pub fn in_memory(mem: &GuestMemoryMmap, addr: u64, len: u64) -> bool {
    len == 0 || (usize::try_from(len).is_ok_and(|l| mem.check_range(GuestAddress(addr), l)))
}
