//! virtio-fs driven from the guest's side: FUSE requests laid out in guest
//! memory as Linux's driver lays them out (a readable request, then room
//! for the reply), served over a temporary share; the requests a hostile
//! guest would send to leave the share; malformed chains and messages.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::sync::Arc;

use fuse_backend_rs::abi::fuse_abi::{
    Attr, CreateIn, EntryOut, ForgetIn, InHeader, InitIn, LinkIn, MkdirIn, MknodIn, Opcode, OpenIn,
    OpenOut, OutHeader, ReadIn, WriteIn,
};
use vm_memory::{ByteValued, Bytes, GuestAddress, GuestMemoryMmap};

use crate::microvm::vmm::builtin::jail::{jailed, Role};

use super::{queues, sandbox, Fs, QUEUE_SIZE, REQUEST_QUEUES, TAG_LEN, TYPE_FS};
use crate::microvm::vmm::builtin::virtio::chain::{DESC_F_NEXT, DESC_F_WRITE};
use crate::microvm::vmm::builtin::virtio::test_utils::{memory, GuestQueue};
use crate::microvm::vmm::builtin::virtio::{Interrupt, VirtioDevice, F_VERSION_1, INT_VRING};

const MEM: usize = 8 << 20;
const HIPRIO_AT: GuestAddress = GuestAddress(0x1000);
const REQUEST_AT: GuestAddress = GuestAddress(0x4000);
/// Where a request is written, and where its reply goes.
const IN: u64 = 0x10_0000;
const OUT: u64 = 0x20_0000;
const OUT_LEN: u32 = 0x2_0000;
const W: u16 = DESC_F_WRITE;
const ROOT: u64 = 1;

struct Fixture {
    mem: GuestMemoryMmap,
    fs: Fs,
    interrupt: Arc<Interrupt>,
    dir: tempfile::TempDir,
    unique: u64,
    /// The uid and gid the guest's requests carry.
    creds: (u32, u32),
}

impl Fixture {
    /// A device over `dir/share`, activated with both queues; `dir` also
    /// holds a file outside the share (`secret`).
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let share = dir.path().join("share");
        std::fs::create_dir(&share).unwrap();
        std::fs::write(dir.path().join("secret"), b"host only").unwrap();
        std::fs::write(share.join("hello"), b"hello from the host").unwrap();
        let mut fs = Fs::new("agentvm", sandbox::passthrough(&share).unwrap()).unwrap();
        let mem = memory(MEM).unwrap();
        let interrupt = Arc::new(Interrupt::new().unwrap());
        let hiprio = GuestQueue::new(&mem, HIPRIO_AT, QUEUE_SIZE).unwrap();
        let request = GuestQueue::new(&mem, REQUEST_AT, QUEUE_SIZE).unwrap();
        fs.activate(
            mem.clone(),
            F_VERSION_1,
            vec![
                hiprio.device_queue().unwrap(),
                request.device_queue().unwrap(),
            ],
            interrupt.clone(),
        )
        .unwrap();
        Fixture {
            mem,
            fs,
            interrupt,
            dir,
            unique: 0,
            creds: (0, 0),
        }
    }

    fn share(&self) -> std::path::PathBuf {
        self.dir.path().join("share")
    }

    /// The driver's view of queue `index` (its rings as the device left
    /// them: a new `GuestQueue` starts its avail index from what the ring
    /// says).
    fn queue(&self, index: usize) -> GuestQueue<'_> {
        let at = if index == queues::HIPRIO {
            HIPRIO_AT
        } else {
            REQUEST_AT
        };
        GuestQueue::attach(&self.mem, at, QUEUE_SIZE).unwrap()
    }

    /// Lays out one request (header + `body`) and offers it on `index`
    /// with `bufs` as its chain; serves the queue; returns the used
    /// length.
    fn offer(&mut self, index: usize, bufs: &[(u64, u32, u16)]) -> u32 {
        let mut q = self.queue(index);
        let before = q.used_idx().unwrap();
        let head = q.set_chain(0, bufs).unwrap();
        q.offer(head).unwrap();
        self.serve(index).unwrap();
        let q = self.queue(index);
        assert_eq!(
            q.used_idx().unwrap(),
            before.wrapping_add(1),
            "the chain was not completed"
        );
        q.used_elem(before).unwrap().1
    }

    /// Serves queue `index` as the VMM does: on a thread in the fs
    /// thread's jail.
    fn serve(&mut self, index: usize) -> Result<bool, super::FsError> {
        let fs = &mut self.fs;
        jailed(Role::Fs, move || fs.process_queue(index))
    }

    fn header(&mut self, op: Opcode, nodeid: u64, body_len: usize) -> InHeader {
        self.unique += 1;
        InHeader {
            len: (std::mem::size_of::<InHeader>() + body_len) as u32,
            opcode: op as u32,
            unique: self.unique,
            nodeid,
            uid: self.creds.0,
            gid: self.creds.1,
            pid: 1,
            padding: 0,
        }
    }

    /// Sends a request on the request queue and returns the reply's
    /// header and body.
    fn call(&mut self, op: Opcode, nodeid: u64, body: &[u8]) -> (OutHeader, Vec<u8>) {
        let header = self.header(op, nodeid, body.len());
        let mut request = header.as_slice().to_vec();
        request.extend_from_slice(body);
        self.mem.write_slice(&request, GuestAddress(IN)).unwrap();
        let len = self.offer(
            queues::REQUEST,
            &[(IN, request.len() as u32, 0), (OUT, OUT_LEN, W)],
        );
        let mut reply = vec![0u8; len as usize];
        self.mem.read_slice(&mut reply, GuestAddress(OUT)).unwrap();
        let out: OutHeader = read(&reply);
        assert_eq!(out.unique, header.unique, "a reply to another request");
        assert_eq!(out.len, len, "the header's length is not the used length");
        (out, reply[std::mem::size_of::<OutHeader>()..].to_vec())
    }

    fn init(&mut self) {
        let init = InitIn {
            major: 7,
            minor: 31,
            max_readahead: 128 << 10,
            flags: 0,
        };
        let (out, _) = self.call(Opcode::Init, 0, init.as_slice());
        assert_eq!(out.error, 0, "FUSE_INIT failed");
    }

    /// LOOKUP of `name` in `parent`: the entry, or the errno.
    fn lookup(&mut self, parent: u64, name: &str) -> Result<EntryOut, i32> {
        let (out, body) = self.call(Opcode::Lookup, parent, &cstr(name));
        answer(out, &body)
    }

    fn open(&mut self, node: u64, flags: i32) -> Result<OpenOut, i32> {
        let open = OpenIn {
            flags: flags as u32,
            fuse_flags: 0,
        };
        let (out, body) = self.call(Opcode::Open, node, open.as_slice());
        answer(out, &body)
    }

    fn read_file(&mut self, node: u64, fh: u64, size: u32) -> Result<Vec<u8>, i32> {
        let read = ReadIn {
            fh,
            offset: 0,
            size,
            ..Default::default()
        };
        let (out, body) = self.call(Opcode::Read, node, read.as_slice());
        if out.error != 0 {
            return Err(-out.error);
        }
        Ok(body)
    }
}

/// A NUL-terminated name, as FUSE carries names.
fn cstr(name: &str) -> Vec<u8> {
    let mut v = name.as_bytes().to_vec();
    v.push(0);
    v
}

fn read<T: ByteValued + Default>(bytes: &[u8]) -> T {
    let mut value = T::default();
    let n = std::mem::size_of::<T>();
    value.as_mut_slice().copy_from_slice(&bytes[..n]);
    value
}

/// The body as `T`, or the reply's errno.
fn answer<T: ByteValued + Default>(out: OutHeader, body: &[u8]) -> Result<T, i32> {
    if out.error != 0 {
        return Err(-out.error);
    }
    Ok(read(body))
}

fn kind(attr: &Attr) -> u32 {
    attr.mode & libc::S_IFMT
}

#[test]
fn the_configuration_space_carries_the_tag_and_one_request_queue() {
    let f = Fixture::new();
    assert_eq!(f.fs.device_type(), TYPE_FS);
    assert_eq!(f.fs.features(), F_VERSION_1);
    assert_eq!(f.fs.queue_max_sizes(), &[QUEUE_SIZE; 2]);
    assert_eq!(f.fs.queue_events().len(), queues::COUNT);
    let mut config = [0xffu8; TAG_LEN + 8];
    f.fs.read_config(0, &mut config);
    assert_eq!(&config[..7], b"agentvm");
    assert!(config[7..TAG_LEN].iter().all(|b| *b == 0));
    assert_eq!(
        u32::from_le_bytes(config[TAG_LEN..TAG_LEN + 4].try_into().unwrap()),
        REQUEST_QUEUES
    );
    // Past the end reads zeros, and so does an absurd offset.
    assert_eq!(&config[TAG_LEN + 4..], &[0; 4]);
    let mut far = [0xffu8; 4];
    f.fs.read_config(u64::MAX, &mut far);
    assert_eq!(far, [0; 4]);
    // A tag the configuration space cannot carry is refused.
    let share = f.share();
    for bad in ["", "a\0b", &"x".repeat(TAG_LEN + 1)] {
        assert!(Fs::new(bad, sandbox::passthrough(&share).unwrap()).is_err());
    }
    assert!(Fs::new(&"x".repeat(TAG_LEN), sandbox::passthrough(&share).unwrap()).is_ok());
}

#[test]
fn a_share_that_is_not_a_directory_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("f");
    std::fs::write(&file, b"").unwrap();
    for bad in [
        file.as_path(),
        &dir.path().join("missing"),
        Path::new("relative"),
    ] {
        let err = sandbox::passthrough(bad).err().unwrap().to_string();
        assert!(err.contains(&bad.display().to_string()), "{err}");
    }
}

#[test]
fn files_are_read_created_and_written_through_the_share() {
    let mut f = Fixture::new();
    f.init();
    let hello = f.lookup(ROOT, "hello").unwrap();
    assert_eq!(kind(&hello.attr), libc::S_IFREG);
    assert_eq!(hello.attr.size, 19);
    let fh = f.open(hello.nodeid, libc::O_RDONLY).unwrap().fh;
    assert_eq!(
        f.read_file(hello.nodeid, fh, 4096).unwrap(),
        b"hello from the host"
    );
    // A new directory and a new file in it, written.
    let mkdir = MkdirIn {
        mode: 0o750,
        umask: 0,
    };
    let mut body = mkdir.as_slice().to_vec();
    body.extend(cstr("dir"));
    let (out, body) = f.call(Opcode::Mkdir, ROOT, &body);
    let dir: EntryOut = answer(out, &body).unwrap();
    let create = CreateIn {
        flags: (libc::O_WRONLY | libc::O_CREAT) as u32,
        mode: 0o640,
        umask: 0,
        fuse_flags: 0,
    };
    let mut body = create.as_slice().to_vec();
    body.extend(cstr("new"));
    let (out, body) = f.call(Opcode::Create, dir.nodeid, &body);
    let entry: EntryOut = answer(out, &body).unwrap();
    let opened: OpenOut = read(&body[std::mem::size_of::<EntryOut>()..]);
    let data = b"written by the guest";
    let write = WriteIn {
        fh: opened.fh,
        offset: 0,
        size: data.len() as u32,
        ..Default::default()
    };
    let mut body = write.as_slice().to_vec();
    body.extend_from_slice(data);
    let (out, _) = f.call(Opcode::Write, entry.nodeid, &body);
    assert_eq!(out.error, 0);
    let host = f.share().join("dir/new");
    assert_eq!(std::fs::read(&host).unwrap(), data);
    assert_eq!(
        std::fs::metadata(&host).unwrap().permissions().mode() & 0o777,
        0o640
    );
    assert_eq!(
        std::fs::metadata(f.share().join("dir"))
            .unwrap()
            .permissions()
            .mode()
            & 0o777,
        0o750
    );
    assert_eq!(f.interrupt.status() & INT_VRING, INT_VRING);
    assert_eq!(f.fs.metrics.bad_chains(), 0);
    assert_eq!(f.fs.metrics.failed(), 0);
    // INIT, LOOKUP, OPEN, READ, MKDIR, CREATE, WRITE.
    assert_eq!(f.fs.metrics.requests(), 7);
}

/// A request carries its caller's uid and gid; the server takes them as its
/// effective ids for the call (the fs thread's jail allows only that form
/// of setresuid), so a file a guest user makes is that user's on the host,
/// and the host's permission checks apply to it.
#[test]
fn a_guest_user_s_requests_are_served_with_its_own_ids() {
    let mut f = Fixture::new();
    f.init();
    let mkdir = |f: &mut Fixture, parent, name: &str, mode| {
        let mut body = MkdirIn { mode, umask: 0 }.as_slice().to_vec();
        body.extend(cstr(name));
        let (out, body) = f.call(Opcode::Mkdir, parent, &body);
        answer::<EntryOut>(out, &body)
    };
    let open = mkdir(&mut f, ROOT, "open", 0o777).unwrap();
    let closed = mkdir(&mut f, ROOT, "closed", 0o755).unwrap();
    f.creds = (1000, 1001);
    let mine = mkdir(&mut f, open.nodeid, "mine", 0o700).unwrap();
    let host = std::fs::metadata(f.share().join("open/mine")).unwrap();
    assert_eq!((host.uid(), host.gid()), (1000, 1001));
    assert_eq!(mine.attr.uid, 1000);
    // Root's directory without write permission for others: refused as
    // the host refuses uid 1000, not served as root.
    assert_eq!(
        mkdir(&mut f, closed.nodeid, "theirs", 0o700).err(),
        Some(libc::EACCES)
    );
    assert!(!f.share().join("closed/theirs").exists());
    // Back to root, the server is root again.
    f.creds = (0, 0);
    mkdir(&mut f, closed.nodeid, "roots", 0o700).unwrap();
    let host = std::fs::metadata(f.share().join("closed/roots")).unwrap();
    assert_eq!((host.uid(), host.gid()), (0, 0));
}

#[test]
fn a_guest_cannot_name_a_host_file_outside_its_share() {
    let mut f = Fixture::new();
    f.init();
    let share_ino = std::fs::metadata(f.share()).unwrap().ino();
    // `..` of the root is the root.
    let up = f.lookup(ROOT, "..").unwrap();
    assert_eq!(up.attr.ino, share_ino, "`..` left the share");
    // A name is one component: a path is refused, whatever it names.
    for name in ["../secret", "/etc/passwd", "hello/..", "x/../../secret"] {
        assert_eq!(f.lookup(ROOT, name).err(), Some(libc::EINVAL), "{name}");
    }
    assert_eq!(f.lookup(up.nodeid, "secret").err(), Some(libc::ENOENT));
    // Symlinks the host left in the share (or the guest made) are never
    // followed on the host: looking up through one fails, and opening one
    // opens nothing.
    let share = f.share();
    std::os::unix::fs::symlink(f.dir.path(), share.join("out")).unwrap();
    std::os::unix::fs::symlink("../secret", share.join("rel")).unwrap();
    let out = f.lookup(ROOT, "out").unwrap();
    assert_eq!(kind(&out.attr), libc::S_IFLNK);
    assert_eq!(f.lookup(out.nodeid, "secret").err(), Some(libc::ENOTDIR));
    let rel = f.lookup(ROOT, "rel").unwrap();
    assert_eq!(kind(&rel.attr), libc::S_IFLNK);
    assert!(f.open(rel.nodeid, libc::O_RDONLY).is_err());
    // A symlink the guest creates is only text on the host.
    let mut body = cstr("made");
    body.extend(cstr("/etc/shadow"));
    let (out, body) = f.call(Opcode::Symlink, ROOT, &body);
    let made: EntryOut = answer(out, &body).unwrap();
    assert!(f.open(made.nodeid, libc::O_RDONLY).is_err());
    assert_eq!(
        std::fs::read_link(share.join("made")).unwrap(),
        Path::new("/etc/shadow")
    );
    // A hard link needs a source node the server handed out: a node id
    // the guest made up names nothing.
    let link = LinkIn {
        oldnodeid: 0xdead_beef,
    };
    let mut body = link.as_slice().to_vec();
    body.extend(cstr("stolen"));
    let (out, _) = f.call(Opcode::Link, ROOT, &body);
    assert_ne!(out.error, 0, "a link to an unknown node was made");
    assert!(!share.join("stolen").exists());
    // A device node the guest makes is never opened by the host.
    let mknod = MknodIn {
        mode: libc::S_IFCHR | 0o666,
        rdev: libc::makedev(1, 3) as u32,
        umask: 0,
        padding: 0,
    };
    let mut body = mknod.as_slice().to_vec();
    body.extend(cstr("null"));
    let (out, body) = f.call(Opcode::Mknod, ROOT, &body);
    if let Ok(node) = answer::<EntryOut>(out, &body) {
        assert_eq!(f.open(node.nodeid, libc::O_RDWR).err(), Some(libc::EBADF));
    }
    // None of it was a malformed request.
    assert_eq!((f.fs.metrics.bad_chains(), f.fs.metrics.failed()), (0, 0));
    assert_eq!(
        std::fs::read(f.dir.path().join("secret")).unwrap(),
        b"host only"
    );
}

#[test]
fn a_forget_on_the_high_priority_queue_needs_no_reply_buffer() {
    let mut f = Fixture::new();
    f.init();
    let hello = f.lookup(ROOT, "hello").unwrap();
    let header = f.header(Opcode::Forget, hello.nodeid, 8);
    let mut request = header.as_slice().to_vec();
    request.extend_from_slice(ForgetIn { nlookup: 1 }.as_slice());
    f.mem.write_slice(&request, GuestAddress(IN)).unwrap();
    let len = f.offer(queues::HIPRIO, &[(IN, request.len() as u32, 0)]);
    assert_eq!(len, 0);
    assert_eq!(f.fs.metrics.bad_chains(), 0);
    assert_eq!(f.fs.metrics.failed(), 0);
    // The name is looked up again as a new entry.
    assert!(f.lookup(ROOT, "hello").is_ok());
}

#[test]
fn malformed_chains_and_messages_are_completed_empty_and_counted() {
    let mut f = Fixture::new();
    f.init();
    // A chain with nothing to read: refused by the validator.
    assert_eq!(f.offer(queues::REQUEST, &[(OUT, 64, W)]), 0);
    assert_eq!(f.fs.metrics.bad_chains(), 1);
    // A chain that loops on itself.
    {
        let mut q = f.queue(queues::REQUEST);
        q.set_desc(0, IN, 64, DESC_F_NEXT, 0).unwrap();
        q.offer(0).unwrap();
    }
    f.serve(queues::REQUEST).unwrap();
    assert_eq!(f.fs.metrics.bad_chains(), 2);
    // A buffer outside guest memory.
    assert_eq!(
        f.offer(queues::REQUEST, &[(MEM as u64 - 8, 64, 0), (OUT, 64, W)]),
        0
    );
    assert_eq!(f.fs.metrics.bad_chains(), 3);
    // Shorter than a FUSE header.
    f.mem.write_slice(&[1, 2, 3, 4], GuestAddress(IN)).unwrap();
    assert_eq!(f.offer(queues::REQUEST, &[(IN, 4, 0), (OUT, 64, W)]), 0);
    // A header whose length is past what the chain holds, and one far past
    // any request the server takes.
    for len in [4096, u32::MAX] {
        let mut header = f.header(Opcode::Lookup, ROOT, 6);
        header.len = len;
        let mut request = header.as_slice().to_vec();
        request.extend(cstr("hello"));
        f.mem.write_slice(&request, GuestAddress(IN)).unwrap();
        f.offer(
            queues::REQUEST,
            &[(IN, request.len() as u32, 0), (OUT, OUT_LEN, W)],
        );
    }
    // A name with no terminating NUL.
    let header = f.header(Opcode::Lookup, ROOT, 5);
    let mut request = header.as_slice().to_vec();
    request.extend_from_slice(b"hello");
    f.mem.write_slice(&request, GuestAddress(IN)).unwrap();
    f.offer(
        queues::REQUEST,
        &[(IN, request.len() as u32, 0), (OUT, OUT_LEN, W)],
    );
    // A LOOKUP with no room for its reply.
    let header = f.header(Opcode::Lookup, ROOT, 6);
    let mut request = header.as_slice().to_vec();
    request.extend(cstr("hello"));
    f.mem.write_slice(&request, GuestAddress(IN)).unwrap();
    assert_eq!(
        f.offer(queues::REQUEST, &[(IN, request.len() as u32, 0)]),
        0
    );
    // A reply buffer too small for the reply.
    f.mem.write_slice(&request, GuestAddress(IN)).unwrap();
    f.offer(
        queues::REQUEST,
        &[(IN, request.len() as u32, 0), (OUT, 8, W)],
    );
    assert!(f.fs.metrics.failed() >= 1, "{:?}", f.fs.metrics);
    // An opcode nobody knows is answered with ENOSYS, and a node id the
    // server never gave out with an error.
    let (out, _) = f.call(Opcode::Lookup, 0x4141_4141, &cstr("x"));
    assert_ne!(out.error, 0);
    let header = f.header(Opcode::Lookup, ROOT, 0);
    let mut raw = header;
    raw.opcode = 9999;
    f.mem.write_slice(raw.as_slice(), GuestAddress(IN)).unwrap();
    let len = f.offer(
        queues::REQUEST,
        &[
            (IN, std::mem::size_of::<InHeader>() as u32, 0),
            (OUT, OUT_LEN, W),
        ],
    );
    let mut reply = vec![0u8; len as usize];
    f.mem.read_slice(&mut reply, GuestAddress(OUT)).unwrap();
    assert_eq!(read::<OutHeader>(&reply).error, -libc::ENOSYS);
    // After all that, the device still serves.
    let hello = f.lookup(ROOT, "hello").unwrap();
    let fh = f.open(hello.nodeid, libc::O_RDONLY).unwrap().fh;
    assert_eq!(f.read_file(hello.nodeid, fh, 5).unwrap(), b"hello");
}

#[test]
fn a_full_ring_of_requests_is_served_in_one_turn() {
    let mut f = Fixture::new();
    f.init();
    // QUEUE_SIZE requests at once, each its own chain of two descriptors
    // (the table has QUEUE_SIZE entries, so half as many chains fit).
    let header = f.header(Opcode::Lookup, ROOT, 6);
    let mut request = header.as_slice().to_vec();
    request.extend(cstr("hello"));
    f.mem.write_slice(&request, GuestAddress(IN)).unwrap();
    let chains = QUEUE_SIZE / 2;
    {
        let mut q = f.queue(queues::REQUEST);
        for i in 0..chains {
            let out = OUT + u64::from(i) * 256;
            q.set_chain(2 * i, &[(IN, request.len() as u32, 0), (out, 256, W)])
                .unwrap();
            q.offer(2 * i).unwrap();
        }
    }
    f.serve(queues::REQUEST).unwrap();
    // The INIT before them, then all of them.
    assert_eq!(f.queue(queues::REQUEST).used_idx().unwrap(), chains + 1);
    assert_eq!(f.fs.metrics.failed(), 0);
    assert_eq!(f.fs.metrics.requests(), u64::from(chains) + 1);
}

#[test]
fn nothing_is_served_before_activation_or_after_a_reset() {
    let mut f = Fixture::new();
    f.fs.reset();
    assert!(!f.fs.is_activated());
    assert!(!f.serve(queues::REQUEST).unwrap());
    assert!(!f.serve(7).unwrap());
    // Activation checks the number of queues.
    let q = GuestQueue::new(&f.mem, REQUEST_AT, QUEUE_SIZE).unwrap();
    assert!(f
        .fs
        .activate(
            f.mem.clone(),
            F_VERSION_1,
            vec![q.device_queue().unwrap()],
            f.interrupt.clone()
        )
        .is_err());
}
