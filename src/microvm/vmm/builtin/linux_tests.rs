//! A real Linux guest under the builtin VMM: the guest kernel built by
//! `kernels/build.sh`, entered through PVH by a [`Machine`], runs a busybox
//! `/init` that reports over the serial console and resets the VM.
//!
//! These need a standard hardware KVM (`HostKvm::standard`): on these
//! development machines that is only inside the test host of
//! `make test-builtin` (a QEMU TCG VM whose vCPU emulates AMD SVM,
//! docs/testing.md). Elsewhere they print `skipped: <why>` and pass;
//! `make test-builtin` checks that they ran there, not skipped.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use super::machine::{self, Options};
use super::vcpu::StopReason;
use crate::microvm::initramfs::Cpio;
use crate::microvm::vmm::choice::HostKvm;
use crate::microvm::vmm::VmConfig;
use crate::protocol::PORT_NAME;

/// What the guest's `/init` prints before its checks, and after each.
const MARK: &str = "agentvm-guest:";
/// How long a boot may take inside the test host (TCG emulating the
/// nested guest's kernel) before the test stops the VM and fails.
const LIMIT: Duration = Duration::from_secs(60);
/// What the guest writes to the control port, and what the host answers.
const PING: &str = "ping-from-the-guest";
const PONG: &str = "pong-from-the-host";

/// Why Linux cannot be booted here, or the guest kernel and the static
/// busybox its `/init` uses.
fn prerequisites(test: &str) -> Option<(PathBuf, PathBuf)> {
    if let Err(why) = HostKvm::probe().standard() {
        println!("skipped: {test}: {why}");
        return None;
    }
    let kernel = std::env::var_os("AGENTVM_KERNEL")
        .map(PathBuf::from)
        .unwrap_or_else(|| crate::microvm::host::DEFAULT_KERNEL.into());
    if !kernel.is_file() {
        println!(
            "skipped: {test}: no guest kernel at {} (AGENTVM_KERNEL)",
            kernel.display()
        );
        return None;
    }
    let busybox = PathBuf::from("/bin/busybox");
    if !busybox.is_file() {
        println!("skipped: {test}: no static /bin/busybox for the guest's /init");
        return None;
    }
    Some((kernel, busybox))
}

/// An initramfs whose `/init` (busybox sh) mounts /proc, prints the
/// kernel's release, its CPUs and virtio's interrupt line, reads 16 bytes
/// from virtio-rng, finds the control port by its sysfs name (as the agent
/// does), writes [`PING`] to it and prints the line the host answers,
/// sleeps on each CPU (a timer that works on each), and resets the VM.
fn initramfs(busybox: &Path, dir: &Path) -> PathBuf {
    let init = format!(
        "#!/bin/busybox sh\n\
         /bin/busybox mount -t proc proc /proc\n\
         /bin/busybox mount -t sysfs sysfs /sys\n\
         /bin/busybox mount -t devtmpfs devtmpfs /dev\n\
         echo \"{MARK} init $(/bin/busybox uname -r) uptime $(/bin/busybox cut -d' ' -f1 /proc/uptime)\"\n\
         echo \"{MARK} cpus $(/bin/busybox grep -c ^processor /proc/cpuinfo)\"\n\
         echo \"{MARK} virtio-irq $(/bin/busybox grep virtio /proc/interrupts)\"\n\
         echo \"{MARK} hwrng $(/bin/busybox cat /sys/class/misc/hw_random/rng_current)\"\n\
         echo \"{MARK} rng-bytes $(/bin/busybox head -c 16 /dev/hwrng | /bin/busybox wc -c)\"\n\
         for p in /sys/class/virtio-ports/*; do\n\
           [ \"$(/bin/busybox cat $p/name)\" = {PORT_NAME} ] && port=/dev/${{p##*/}}\n\
         done\n\
         echo \"{MARK} port $port\"\n\
         exec 3<>$port\n\
         echo {PING} >&3\n\
         read -r reply <&3\n\
         echo \"{MARK} reply $reply\"\n\
         exec 3>&-\n\
         for cpu in 0 1; do\n\
           /bin/busybox taskset -c $cpu /bin/busybox sleep 0.2 && echo \"{MARK} timer on cpu $cpu\"\n\
         done\n\
         echo \"{MARK} done\"\n\
         /bin/busybox reboot -f\n"
    );
    cpio_with(busybox, dir, &init)
}

/// An initramfs of busybox and `init` as its `/init`.
fn cpio_with(busybox: &Path, dir: &Path, init: &str) -> PathBuf {
    let mut cpio = Cpio::default();
    for d in ["bin", "dev", "proc", "sys"] {
        cpio.dir(d);
    }
    cpio.char_dev("dev/console", 0o600, 5, 1);
    cpio.file("bin/busybox", 0o755, &std::fs::read(busybox).unwrap());
    cpio.file("init", 0o755, init.as_bytes());
    let path = dir.join("initramfs.cpio");
    std::fs::write(&path, cpio.finish()).unwrap();
    path
}

/// The VM of a test: `extra` goes at the end of the kernel's command line.
fn config(kernel: &Path, initramfs: Option<&Path>, extra: &str) -> VmConfig {
    VmConfig {
        name: "linux-test".into(),
        kernel: kernel.to_path_buf(),
        initramfs: initramfs.map(Path::to_path_buf),
        // reboot=k: `reboot -f` pulses the i8042 reset line, which stops
        // the VM; panic=-1 turns a panic into the same (but the test
        // tells them apart by the console).
        cmdline: format!("console=ttyS0 reboot=k panic=-1 tsc=reliable {extra}"),
        vcpus: 2,
        memory_mib: 256,
        balloon: false,
        share_dir: PathBuf::new(),
        control_socket: PathBuf::new(),
        console_log: PathBuf::new(),
        run_dir: PathBuf::new(),
        kvm: true,
        nics: Vec::new(),
        vmm_user: crate::microvm::vmm::jail::Identity { uid: 0, gid: 0 },
    }
}

/// A file that grows (the guest's console), read from where the last
/// read ended.
struct Tail {
    file: std::fs::File,
    text: String,
    printed: usize,
}

impl Tail {
    fn new(path: &Path) -> Tail {
        Tail {
            file: std::fs::File::open(path).unwrap(),
            text: String::new(),
            printed: 0,
        }
    }

    /// Reads what was appended and prints its complete lines.
    fn echo_new(&mut self) {
        let mut bytes = Vec::new();
        self.file.read_to_end(&mut bytes).unwrap();
        self.text.push_str(&String::from_utf8_lossy(&bytes));
        if let Some(end) = self.text.rfind('\n') {
            if end + 1 > self.printed {
                print!("{}", &self.text[self.printed..end + 1]);
                self.printed = end + 1;
            }
        }
    }
}

/// What a boot under [`boot`] came to.
struct Booted {
    /// How the run ended; `None` if the guest did not stop in [`LIMIT`].
    result: Option<Result<StopReason, machine::MachineError>>,
    /// The guest's serial console.
    text: String,
}

/// Builds the VM, runs it until it stops or [`LIMIT`] passes, and copies
/// its console (written to `console_path`) to the test's output as it
/// grows: if the test host itself dies mid-boot, its serial log still
/// shows how far the guest got.
fn boot(config: &VmConfig, options: Options, console_path: &Path) -> Booted {
    let started = Instant::now();
    let m = machine::build(config, options).unwrap();
    let built = started.elapsed();
    let stop = m.vm.stop.clone();
    let (tx, rx) = std::sync::mpsc::channel();
    let runner = std::thread::spawn(move || {
        let _ = tx.send(m.run());
    });
    // While it runs, watch the console for the init's first line (the
    // time from the start of the run to the guest's /init).
    let run_started = Instant::now();
    let init_line = format!("{MARK} init ");
    let mut to_init = None;
    let mut console = Tail::new(console_path);
    println!("--- guest console ---");
    let result = loop {
        match rx.recv_timeout(Duration::from_millis(20)) {
            Ok(r) => break Some(r),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break None,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {}
        }
        console.echo_new();
        if to_init.is_none() && console.text.contains(&init_line) {
            to_init = Some(run_started.elapsed());
        }
        if run_started.elapsed() > LIMIT {
            // The run loop sees the request and kicks every vCPU out.
            stop.request(StopReason::Requested);
            break None;
        }
    };
    runner.join().unwrap();
    let ran = run_started.elapsed();
    console.echo_new();
    if console.printed < console.text.len() {
        println!("{}", &console.text[console.printed..]);
    }
    println!("--- end of guest console ---");
    println!(
        "built in {built:?}; the guest's /init printed {to_init:?} after the run started \
         (20 ms polls); the guest reset the VM {ran:?} after it started"
    );
    Booted {
        result,
        text: console.text,
    }
}

#[test]
fn the_guest_kernel_boots_to_its_init_and_resets_the_vm() {
    let test = "the_guest_kernel_boots_to_its_init_and_resets_the_vm";
    let Some((kernel, busybox)) = prerequisites(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let initramfs = initramfs(&busybox, dir.path());
    let console_path = dir.path().join("console");
    let console = std::fs::File::create(&console_path).unwrap();
    // The host's end of the control port answers the guest's line.
    let (control, host) = std::os::unix::net::UnixStream::pair().unwrap();
    host.set_read_timeout(Some(LIMIT)).unwrap();
    let answerer = std::thread::spawn(move || -> std::io::Result<String> {
        use std::io::{BufRead, Write};
        let mut line = String::new();
        std::io::BufReader::new(&host).read_line(&mut line)?;
        (&host).write_all(format!("{PONG}\n").as_bytes())?;
        Ok(line)
    });
    let Booted { result, text } = boot(
        &config(&kernel, Some(&initramfs), ""),
        Options {
            serial: Some(console),
            entropy: None,
            control: Some(control),
            share: None,
            nics: Vec::new(),
            jail: true,
        },
        &console_path,
    );
    let result = result.unwrap_or_else(|| panic!("the guest did not stop within {LIMIT:?}"));
    assert_eq!(
        result.unwrap(),
        StopReason::Reset,
        "the guest must end the VM with the i8042 reset (reboot=k)"
    );
    let release = text
        .lines()
        .find_map(|l| l.split_once(&format!("{MARK} init ")).map(|(_, r)| r))
        .unwrap_or_else(|| panic!("the guest's /init never reported"));
    assert!(
        release.starts_with("6.1."),
        "unexpected kernel release {release}"
    );
    assert!(
        text.contains("Linux version 6.1."),
        "no kernel banner on the console"
    );
    // Both vCPUs and the IO-APIC, from the MP table: without it Linux
    // would see one CPU and route virtio's interrupt through the PIC.
    assert!(
        text.contains(&format!("{MARK} cpus 2")),
        "the guest did not bring up its second vCPU"
    );
    let irq = text
        .lines()
        .find_map(|l| l.split_once(&format!("{MARK} virtio-irq ")).map(|(_, r)| r))
        .unwrap_or_default();
    assert!(
        irq.contains("IO-APIC"),
        "virtio's interrupt is not on the IO-APIC: {irq}"
    );
    assert!(
        text.contains(&format!("{MARK} hwrng virtio_rng")),
        "the guest did not bind virtio-rng"
    );
    assert!(
        text.contains(&format!("{MARK} rng-bytes 16")),
        "16 bytes from virtio-rng did not arrive"
    );
    // The control port, both ways: the guest found it by its name, the
    // host read the guest's line and the guest read the host's.
    let heard = answerer.join().unwrap();
    assert_eq!(
        heard.ok().as_deref(),
        Some(format!("{PING}\n").as_str()),
        "the host did not read the guest's line from the control port"
    );
    assert!(
        text.contains(&format!("{MARK} port /dev/vport")),
        "the guest did not find the port named {PORT_NAME}"
    );
    assert!(
        text.contains(&format!("{MARK} reply {PONG}")),
        "the guest did not read the host's line"
    );
    // Each vCPU's local APIC timer fires (without the TSC-deadline bit
    // in CPUID, the second one never did and its sleep never ended).
    for cpu in 0..2 {
        assert!(
            text.contains(&format!("{MARK} timer on cpu {cpu}")),
            "a sleep on vCPU {cpu} did not end"
        );
    }
    assert!(text.contains(&format!("{MARK} done")));
    assert!(!text.contains("Kernel panic"), "the guest panicked");
}

/// Bytes of the file the guest writes into its share.
const BIG: usize = 1 << 20;

/// The share a guest boots from: busybox, an `/init` that reports what it
/// finds and changes in the share (through virtio-fs, as the guest agent
/// and a container's rootfs do), and host files for it to read and
/// remove.
fn boot_share(busybox: &Path, share: &Path) {
    for d in ["bin", "dev", "proc", "sys", "data"] {
        std::fs::create_dir(share.join(d)).unwrap();
    }
    std::fs::copy(busybox, share.join("bin/busybox")).unwrap();
    std::fs::write(share.join("data/hello"), "written by the host\n").unwrap();
    std::fs::write(share.join("data/gone"), "the guest removes this").unwrap();
    let b = "/bin/busybox";
    let init = format!(
        "#!{b} sh\n\
         {b} mount -t proc proc /proc\n\
         {b} mount -t sysfs sysfs /sys\n\
         {b} mount -t devtmpfs devtmpfs /dev\n\
         echo \"{MARK} init $({b} uname -r)\"\n\
         echo \"{MARK} root $({b} awk '$2 == \"/\" {{ print $1, $3 }}' /proc/mounts)\"\n\
         echo \"{MARK} read $({b} cat /data/hello)\"\n\
         echo from-the-guest > /data/out\n\
         {b} mkdir /data/dir\n\
         {b} mv /data/out /data/dir/moved\n\
         {b} chmod 600 /data/dir/moved\n\
         {b} ln -s /etc/guest-target /data/dir/link\n\
         {b} rm /data/gone\n\
         {b} yes guest-data | {b} head -c {BIG} > /data/big\n\
         echo \"{MARK} big $({b} wc -c < /data/big)\"\n\
         echo \"{MARK} listing $({b} ls /data | {b} tr '\\n' ' ')\"\n\
         {b} sync\n\
         echo \"{MARK} done\"\n\
         {b} reboot -f\n"
    );
    std::fs::write(share.join("init"), init).unwrap();
    std::fs::set_permissions(
        share.join("init"),
        std::os::unix::fs::PermissionsExt::from_mode(0o755),
    )
    .unwrap();
}

/// The value after `{MARK} {key} ` on the guest's console.
fn reported<'a>(text: &'a str, key: &str) -> Option<&'a str> {
    let prefix = format!("{MARK} {key} ");
    text.lines()
        .find_map(|l| l.split_once(&prefix).map(|(_, r)| r.trim_end()))
}

#[test]
fn the_guest_boots_from_its_virtio_fs_share_and_writes_to_it() {
    let test = "the_guest_boots_from_its_virtio_fs_share_and_writes_to_it";
    let Some((kernel, busybox)) = prerequisites(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let share = dir.path().join("share");
    std::fs::create_dir(&share).unwrap();
    boot_share(&busybox, &share);
    let console_path = dir.path().join("console");
    let console = std::fs::File::create(&console_path).unwrap();
    // As the microvm tier boots a container's guest: no initramfs, the
    // share is the root file system.
    let root = format!(
        "root={} rootfstype=virtiofs rw init=/init",
        crate::protocol::SHARE_TAG
    );
    let Booted { result, text } = boot(
        &config(&kernel, None, &root),
        Options {
            serial: Some(console),
            entropy: None,
            control: None,
            share: Some(share.clone()),
            nics: Vec::new(),
            jail: true,
        },
        &console_path,
    );
    let result = result.unwrap_or_else(|| panic!("the guest did not stop within {LIMIT:?}"));
    assert!(!text.contains("Kernel panic"), "the guest panicked");
    assert_eq!(result.unwrap(), StopReason::Reset);
    assert_eq!(
        reported(&text, "root"),
        Some(format!("{} virtiofs", crate::protocol::SHARE_TAG).as_str()),
        "the guest's root is not the share"
    );
    assert_eq!(reported(&text, "read"), Some("written by the host"));
    assert!(text.contains(&format!("{MARK} done")));
    // What the guest did, seen on the host.
    let moved = share.join("data/dir/moved");
    assert_eq!(std::fs::read_to_string(&moved).unwrap(), "from-the-guest\n");
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&std::fs::metadata(&moved).unwrap().permissions())
            & 0o777,
        0o600
    );
    assert_eq!(
        std::fs::read_link(share.join("data/dir/link")).unwrap(),
        Path::new("/etc/guest-target")
    );
    assert!(!share.join("data/gone").exists());
    assert!(!share.join("data/out").exists());
    // 1 MiB through the request queue, every byte where it belongs.
    let big = std::fs::read(share.join("data/big")).unwrap();
    let want: Vec<u8> = b"guest-data\n".iter().copied().cycle().take(BIG).collect();
    assert!(
        big == want,
        "the host's copy differs from what the guest wrote"
    );
    assert_eq!(reported(&text, "big"), Some(BIG.to_string().as_str()));
}

/// The test's end of the guest's NIC: a peer at [`PEER_IP`] that answers
/// ARP for itself and ICMP echo requests, as a router on a tap would.
const PEER_IP: [u8; 4] = [10, 0, 2, 1];
const GUEST_IP: [u8; 4] = [10, 0, 2, 15];
const PEER_MAC: [u8; 6] = [0x02, 0x00, 0x00, 0x00, 0x00, 0x01];
const GUEST_MAC: [u8; 6] = [0x02, 0xa6, 0x00, 0x00, 0x00, 0x0f];

/// The Internet checksum of `bytes`.
fn checksum(bytes: &[u8]) -> u16 {
    let mut sum: u32 = 0;
    for pair in bytes.chunks(2) {
        let word = u16::from_be_bytes([pair[0], *pair.get(1).unwrap_or(&0)]);
        sum += u32::from(word);
    }
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !(sum as u16)
}

/// The peer's answer to one Ethernet frame from the guest, if any.
fn answer(frame: &[u8]) -> Option<Vec<u8>> {
    if frame.len() < 14 || frame[6..12] != GUEST_MAC {
        return None;
    }
    let mut reply = Vec::with_capacity(frame.len());
    reply.extend_from_slice(&frame[6..12]);
    reply.extend_from_slice(&PEER_MAC);
    match u16::from_be_bytes([frame[12], frame[13]]) {
        0x0806 if frame.len() >= 42 && frame[20..22] == [0, 1] && frame[38..42] == PEER_IP => {
            // ARP request for the peer: a reply.
            reply.extend_from_slice(&frame[12..20]);
            reply.extend_from_slice(&[0, 2]);
            reply.extend_from_slice(&PEER_MAC);
            reply.extend_from_slice(&PEER_IP);
            reply.extend_from_slice(&frame[22..32]);
            Some(reply)
        }
        0x0800 if frame.len() >= 34 && frame[23] == 1 => {
            let ihl = usize::from(frame[14] & 0xf) * 4;
            let icmp = 14 + ihl;
            if frame.get(icmp) != Some(&8) || frame[30..34] != PEER_IP {
                return None;
            }
            // An echo request: the same datagram back, addresses swapped
            // (the header's checksum stays), type 0, checksum again.
            let mut ip = frame[14..].to_vec();
            ip[12..16].copy_from_slice(&PEER_IP);
            ip[16..20].copy_from_slice(&frame[26..30]);
            let at = ihl;
            ip[at] = 0;
            ip[at + 2..at + 4].copy_from_slice(&[0, 0]);
            let sum = checksum(&ip[at..]);
            ip[at + 2..at + 4].copy_from_slice(&sum.to_be_bytes());
            reply.extend_from_slice(&frame[12..14]);
            reply.extend(ip);
            Some(reply)
        }
        _ => None,
    }
}

#[test]
fn the_guest_pings_a_peer_through_virtio_net() {
    let test = "the_guest_pings_a_peer_through_virtio_net";
    let Some((kernel, busybox)) = prerequisites(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let b = "/bin/busybox";
    let ip = |a: [u8; 4]| format!("{}.{}.{}.{}", a[0], a[1], a[2], a[3]);
    let init = format!(
        "#!{b} sh\n\
         {b} mount -t proc proc /proc\n\
         {b} mount -t sysfs sysfs /sys\n\
         echo \"{MARK} init $({b} uname -r)\"\n\
         echo \"{MARK} mac $({b} cat /sys/class/net/eth0/address)\"\n\
         {b} ip link set eth0 up\n\
         {b} ip addr add {guest}/24 dev eth0\n\
         {b} ping -c 3 -W 5 {peer} > /dev/null; echo \"{MARK} ping $?\"\n\
         {b} ping -c 2 -s 1400 -W 5 {peer} > /dev/null; echo \"{MARK} big-ping $?\"\n\
         echo \"{MARK} rx-packets $({b} cat /sys/class/net/eth0/statistics/rx_packets)\"\n\
         echo \"{MARK} done\"\n\
         {b} reboot -f\n",
        guest = ip(GUEST_IP),
        peer = ip(PEER_IP),
    );
    let initramfs = cpio_with(&busybox, dir.path(), &init);
    let console_path = dir.path().join("console");
    let console = std::fs::File::create(&console_path).unwrap();
    let (vm_end, peer) = std::os::unix::net::UnixDatagram::pair().unwrap();
    peer.set_read_timeout(Some(Duration::from_millis(100)))
        .unwrap();
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let answering = {
        let stop = stop.clone();
        std::thread::spawn(move || -> (u32, u32) {
            let (mut seen, mut answered) = (0, 0);
            let mut buf = vec![0u8; 70_000];
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                let Ok(n) = peer.recv(&mut buf) else {
                    continue;
                };
                seen += 1;
                let frame = &buf[super::virtio::net::HDR_LEN.min(n)..n];
                if let Some(reply) = answer(frame) {
                    let mut out = vec![0u8; super::virtio::net::HDR_LEN];
                    out.extend(reply);
                    if peer.send(&out).is_ok() {
                        answered += 1;
                    }
                }
            }
            (seen, answered)
        })
    };
    let Booted { result, text } = boot(
        &config(&kernel, Some(&initramfs), ""),
        Options {
            serial: Some(console),
            entropy: None,
            control: None,
            share: None,
            nics: vec![machine::NicPort {
                fd: vm_end.into(),
                mac: GUEST_MAC,
            }],
            jail: true,
        },
        &console_path,
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let (seen, answered) = answering.join().unwrap();
    println!("the peer saw {seen} frames from the guest and answered {answered}");
    let result = result.unwrap_or_else(|| panic!("the guest did not stop within {LIMIT:?}"));
    assert!(!text.contains("Kernel panic"), "the guest panicked");
    assert_eq!(result.unwrap(), StopReason::Reset);
    assert_eq!(
        reported(&text, "mac"),
        Some("02:a6:00:00:00:0f"),
        "the guest's MAC is not the configuration space's"
    );
    assert_eq!(
        reported(&text, "ping"),
        Some("0"),
        "ping through virtio-net failed"
    );
    assert_eq!(
        reported(&text, "big-ping"),
        Some("0"),
        "1400-byte pings through virtio-net failed"
    );
    // An ARP reply and five echo replies, at least.
    assert!(answered >= 6, "the peer answered {answered} frames");
    let rx: u32 = reported(&text, "rx-packets")
        .and_then(|v| v.parse().ok())
        .unwrap_or(0);
    assert!(rx >= 6, "the guest counted {rx} received packets");
    assert!(text.contains(&format!("{MARK} done")));
}
