//! The builtin VMM's virtio-fs device
//! ([`agentvm::microvm::vmm::builtin::virtio::fs::Fs`]) and the FUSE
//! server behind it, as a hostile guest drives them, over a real share.
//!
//! An input is read with `arbitrary` as up to 32 requests, each on either
//! queue: a FUSE header (an opcode from those a guest sends, or any
//! number; a node id the server handed out, the root, or any number; a
//! length that is right, short or anything), a body (the opcode's fixed
//! part as random bytes, sometimes with a file handle the server handed
//! out, then names: ordinary ones, `..`, paths, empty, very long, without
//! their NUL), laid out in one to three readable descriptors, and room for
//! the reply (none, a few bytes, or enough) — or a raw descriptor chain
//! (any address, length and flags).
//!
//! The share holds a file, a directory and a symlink pointing out of it;
//! beside the share, outside it, is a file the guest must never reach.
//! Nothing may panic or hang; every chain offered is completed exactly
//! once; a used length never exceeds the room the chain gave and, when
//! not 0, is the reply header's own length for that request; and at the
//! end the file outside the share is unchanged and nothing new appeared
//! beside the share.
//!
//! Opcodes that could take the host's disk or block the device
//! (`FALLOCATE`, the POSIX lock calls) are never sent: they are what a
//! guest may do within its share, not a way out of it, and a fuzz run is
//! not the place to fill the disk.

use std::sync::Arc;

use agentvm::microvm::vmm::builtin::virtio::fs::{queues, sandbox, Fs, QUEUE_SIZE};
use agentvm::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use agentvm::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, F_VERSION_1};
use arbitrary::{Arbitrary, Unstructured};
use vm_memory::{Bytes, GuestAddress};

const MEM: u64 = 0x10_0000;
const HIPRIO_AT: u64 = 0x1000;
const REQUEST_AT: u64 = 0x4000;
/// Where requests and replies go.
const BUFS: u64 = 0x8000;
const REPLY_AT: u64 = 0x8_0000;
const W: u16 = 2;
const NEXT: u16 = 1;
const IN_HEADER: usize = 40;
const OUT_HEADER: usize = 16;
/// What the share's root is inside the file outside it.
const SECRET: &[u8] = b"outside the share";

/// Opcodes a guest sends, with the size of their fixed part (Linux's
/// `fuse_*_in`).
const OPCODES: &[(u32, usize)] = &[
    (1, 0),   // LOOKUP
    (2, 8),   // FORGET
    (3, 16),  // GETATTR
    (4, 88),  // SETATTR
    (5, 0),   // READLINK
    (6, 0),   // SYMLINK
    (8, 16),  // MKNOD
    (9, 8),   // MKDIR
    (10, 0),  // UNLINK
    (11, 0),  // RMDIR
    (12, 8),  // RENAME
    (13, 8),  // LINK
    (14, 8),  // OPEN
    (15, 40), // READ
    (16, 40), // WRITE
    (17, 0),  // STATFS
    (18, 24), // RELEASE
    (20, 16), // FSYNC
    (21, 16), // SETXATTR
    (22, 8),  // GETXATTR
    (23, 8),  // LISTXATTR
    (24, 0),  // REMOVEXATTR
    (25, 24), // FLUSH
    (26, 16), // INIT
    (27, 8),  // OPENDIR
    (28, 40), // READDIR
    (29, 24), // RELEASEDIR
    (30, 16), // FSYNCDIR
    (34, 8),  // ACCESS
    (35, 16), // CREATE
    (36, 8),  // INTERRUPT
    (38, 0),  // DESTROY
    (42, 8),  // BATCH_FORGET
    (44, 40), // READDIRPLUS
    (45, 16), // RENAME2
    (46, 24), // LSEEK
    (47, 56), // COPY_FILE_RANGE
    (48, 16), // SETUPMAPPING
    (49, 16), // REMOVEMAPPING
];
/// FALLOCATE and the lock calls (see the module's comment).
const NEVER: &[u32] = &[31, 32, 33, 43];

#[derive(Arbitrary, Debug)]
enum Name {
    Known(u8),
    Raw(Vec<u8>),
    Long(u16),
}

#[derive(Arbitrary, Debug)]
enum Node {
    Root,
    Learned(u8),
    Raw(u64),
}

#[derive(Arbitrary, Debug)]
struct Request {
    hiprio: bool,
    opcode: u8,
    raw_opcode: Option<u32>,
    node: Node,
    len_kind: u8,
    raw_len: u32,
    fixed: Vec<u8>,
    handle: Option<u8>,
    names: Vec<(Name, bool)>,
    pieces: u8,
    reply: u8,
    uid: u8,
}

#[derive(Arbitrary, Debug)]
struct RawDesc {
    addr: u32,
    len: u32,
    flags: u8,
    next: u8,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Request(Request),
    Raw { hiprio: bool, descs: Vec<RawDesc> },
}

#[derive(Arbitrary, Debug)]
struct Case {
    init: bool,
    ops: Vec<Op>,
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

const KNOWN: &[&str] = &[
    "file",
    "dir",
    "out",
    "..",
    ".",
    "new",
    "../secret",
    "/etc",
    "dir/..",
    "",
    "a\nb",
];

fn name(n: &Name) -> Vec<u8> {
    match n {
        Name::Known(i) => KNOWN[usize::from(*i) % KNOWN.len()].as_bytes().to_vec(),
        Name::Raw(b) => b.iter().take(64).copied().collect(),
        Name::Long(l) => vec![b'x'; usize::from(*l % 4096)],
    }
}

struct Guest<'a> {
    queues: [GuestQueue<'a>; 2],
    offered: [u16; 2],
    unique: u64,
    nodes: Vec<u64>,
    handles: Vec<u64>,
}

impl Guest<'_> {
    fn queue(&self, hiprio: bool) -> usize {
        if hiprio {
            queues::HIPRIO
        } else {
            queues::REQUEST
        }
    }
}

/// The request's bytes: its header and body.
fn encode(g: &mut Guest, r: &Request) -> Vec<u8> {
    let (mut opcode, fixed_len) = OPCODES[usize::from(r.opcode) % OPCODES.len()];
    if let Some(raw) = r.raw_opcode {
        if !NEVER.contains(&raw) {
            opcode = raw;
        }
    }
    let mut body: Vec<u8> = r.fixed.iter().copied().take(128).collect();
    if !r.fixed.len().is_multiple_of(4) {
        // Most requests carry a fixed part of the right size.
        body.resize(fixed_len, 0);
    }
    if let Some(h) = r.handle {
        if let Some(fh) = g.handles.get(usize::from(h) % g.handles.len().max(1)) {
            if body.len() >= 8 {
                body[..8].copy_from_slice(&fh.to_le_bytes());
            }
        }
    }
    for (n, terminated) in r.names.iter().take(3) {
        body.extend(name(n));
        if *terminated {
            body.push(0);
        }
    }
    let node = match &r.node {
        Node::Root => 1,
        Node::Learned(i) => g
            .nodes
            .get(usize::from(*i) % g.nodes.len().max(1))
            .copied()
            .unwrap_or(1),
        Node::Raw(n) => *n,
    };
    let right = (IN_HEADER + body.len()) as u32;
    // Mostly right: a request the server decodes reaches the file system.
    let len = match r.len_kind % 8 {
        6 => right.saturating_sub(r.raw_len % 64),
        7 => r.raw_len,
        _ => right,
    };
    g.unique += 1;
    let mut v = Vec::with_capacity(IN_HEADER + body.len());
    v.extend_from_slice(&len.to_le_bytes());
    v.extend_from_slice(&opcode.to_le_bytes());
    v.extend_from_slice(&g.unique.to_le_bytes());
    v.extend_from_slice(&node.to_le_bytes());
    let id = u32::from(r.uid % 3) * 1000;
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&id.to_le_bytes());
    v.extend_from_slice(&1u32.to_le_bytes());
    v.extend_from_slice(&0u32.to_le_bytes());
    v.extend(body);
    v
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    b.get(at..at + 8)
        .and_then(|s| s.try_into().ok())
        .map(u64::from_le_bytes)
}

pub fn run(data: &[u8]) {
    let Ok(case) = Case::arbitrary_take_rest(Unstructured::new(data)) else {
        return;
    };
    let dir = match tempfile::tempdir() {
        Ok(d) => d,
        Err(e) => panic!("a temporary directory: {e}"),
    };
    let share = dir.path().join("share");
    let setup = (|| -> std::io::Result<()> {
        std::fs::create_dir(&share)?;
        std::fs::write(dir.path().join("secret"), SECRET)?;
        std::fs::write(share.join("file"), b"in the share")?;
        std::fs::create_dir(share.join("dir"))?;
        std::os::unix::fs::symlink(dir.path(), share.join("out"))
    })();
    if let Err(e) = setup {
        panic!("the share: {e}");
    }
    let fs = match sandbox::passthrough(&share) {
        Ok(fs) => fs,
        Err(e) => panic!("the passthrough file system: {e}"),
    };
    let mut dev = match Fs::new("agentvm", fs) {
        Ok(d) => d,
        Err(e) => panic!("the device: {e}"),
    };
    let mem = match memory(MEM as usize) {
        Ok(m) => m,
        Err(e) => panic!("guest memory: {e}"),
    };
    let (Ok(hq), Ok(rq)) = (
        GuestQueue::new(&mem, GuestAddress(HIPRIO_AT), QUEUE_SIZE),
        GuestQueue::new(&mem, GuestAddress(REQUEST_AT), QUEUE_SIZE),
    ) else {
        panic!("the queues do not fit");
    };
    let (Ok(h), Ok(r), Ok(interrupt)) = (hq.device_queue(), rq.device_queue(), Interrupt::new())
    else {
        panic!("the device's queues");
    };
    if let Err(e) = dev.activate(mem.clone(), F_VERSION_1, vec![h, r], Arc::new(interrupt)) {
        panic!("activation: {e}");
    }
    let mut g = Guest {
        queues: [hq, rq],
        offered: [0, 0],
        unique: 0,
        nodes: Vec::new(),
        handles: Vec::new(),
    };
    let mut ops = Vec::new();
    if case.init {
        ops.push(Op::Request(Request {
            hiprio: false,
            opcode: 0,
            raw_opcode: Some(26), // INIT

            node: Node::Root,
            len_kind: 0,
            raw_len: 0,
            fixed: [7u32, 31, 0x2_0000, 0]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect(),
            handle: None,
            names: Vec::new(),
            pieces: 1,
            reply: 255,
            uid: 0,
        }));
    }
    ops.extend(case.ops.into_iter().take(32));
    for op in &ops {
        let (q, room, unique) = match op {
            Op::Request(r) => {
                let q = g.queue(r.hiprio);
                let bytes = encode(&mut g, r);
                if mem.write_slice(&bytes, GuestAddress(BUFS)).is_err() {
                    panic!("the request does not fit");
                }
                // The request in one to three pieces, then the reply's room.
                let pieces = usize::from(r.pieces % 3) + 1;
                let step = bytes.len().div_ceil(pieces).max(1);
                let mut bufs = Vec::new();
                let mut at = 0;
                while at < bytes.len() {
                    let n = step.min(bytes.len() - at);
                    bufs.push((BUFS + at as u64, n as u32, 0u16));
                    at += n;
                }
                let room: u32 = match r.reply % 4 {
                    0 => 0,
                    1 => u32::from(r.reply),
                    _ => 0x1_0000,
                };
                if room > 0 {
                    bufs.push((REPLY_AT, room, W));
                }
                if g.queues[q].set_chain(0, &bufs).is_err() {
                    panic!("the chain cannot be written");
                }
                (q, room, Some(g.unique))
            }
            Op::Raw { hiprio, descs } => {
                let q = g.queue(*hiprio);
                let mut room = 0u32;
                for (i, d) in descs.iter().take(8).enumerate() {
                    let flags = u16::from(d.flags & 7);
                    if flags & W != 0 {
                        room = room.saturating_add(d.len);
                    }
                    let addr = BUFS + u64::from(d.addr) % (MEM + 0x1000 - BUFS);
                    let next = u16::from(d.next) % 16;
                    if g.queues[q]
                        .set_desc(
                            i as u16,
                            addr,
                            d.len,
                            flags | (NEXT * u16::from(i + 1 < descs.len().min(8))),
                            next,
                        )
                        .is_err()
                    {
                        panic!("a descriptor cannot be written");
                    }
                }
                if descs.is_empty() && g.queues[q].set_desc(0, BUFS, 0, 0, 0).is_err() {
                    panic!("a descriptor cannot be written");
                }
                (q, room, None)
            }
        };
        if g.queues[q].offer(0).is_err() {
            panic!("the avail ring cannot be written");
        }
        if let Err(e) = dev.process_queue(q) {
            panic!("serving the queue: {e}");
        }
        let before = g.offered[q];
        g.offered[q] = g.offered[q].wrapping_add(1);
        let (Ok(used), Ok((head, len))) = (g.queues[q].used_idx(), g.queues[q].used_elem(before))
        else {
            panic!("the used ring");
        };
        assert_eq!(used, g.offered[q], "each chain completed exactly once");
        assert_eq!(head, 0);
        assert!(len <= room, "{len} bytes used of {room}");
        if let (Some(unique), true) = (unique, len > 0) {
            let mut reply = vec![0u8; len as usize];
            if mem.read_slice(&mut reply, GuestAddress(REPLY_AT)).is_err() {
                panic!("the reply cannot be read");
            }
            let said = u32::from_le_bytes([reply[0], reply[1], reply[2], reply[3]]);
            assert_eq!(said, len, "the reply's length is the used length");
            assert_eq!(
                u64_at(&reply, 8),
                Some(unique),
                "a reply to another request"
            );
            let error = i32::from_le_bytes([reply[4], reply[5], reply[6], reply[7]]);
            // Learn node ids and handles as a driver would.
            if error == 0 {
                if let Some(n) = u64_at(&reply, OUT_HEADER) {
                    g.nodes.push(n);
                    g.handles.push(n);
                }
            }
        }
    }
    // Nothing reached past the share.
    match std::fs::read(dir.path().join("secret")) {
        Ok(b) => assert_eq!(b, SECRET, "the file outside the share changed"),
        Err(e) => panic!("the file outside the share: {e}"),
    }
    let mut beside: Vec<String> = match std::fs::read_dir(dir.path()) {
        Ok(rd) => rd
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect(),
        Err(e) => panic!("listing beside the share: {e}"),
    };
    beside.sort();
    assert_eq!(
        beside,
        ["secret", "share"],
        "something appeared beside the share"
    );
}
