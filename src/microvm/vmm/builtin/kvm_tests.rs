//! Tests on the host's real `/dev/kvm`: short hand-written guest programs
//! (32-bit protected mode, the state the PVH entry point is entered in)
//! whose port and MMIO accesses must reach the right device, whose queue
//! notification must be served by the device's event loop, and whose
//! reset or crash must stop the vCPU. Where `/dev/kvm` cannot be used
//! they print `skipped: <why>` and pass: nothing else is tested then.
//!
//! On `kvm_pvm` (these development machines) kernel-mode guest code is
//! emulated, about 2000 times slower than native (docs/builtin-vmm.md):
//! the programs are a few dozen instructions.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use event_manager::{EventManager, MutEventSubscriber, SubscriberOps};
use kvm_ioctls::Kvm;
use vm_memory::{Bytes, GuestAddress};

use super::boot::{self, Entry};
use super::bus::BusDevice;
use super::legacy::i8042::{self, I8042};
use super::vcpu::{StopReason, Vcpu};
use super::virtio::chain::DESC_F_WRITE;
use super::virtio::mmio::{reg, MAGIC};
use super::virtio::rng::{Pattern, Rng};
use super::virtio::test_utils::GuestQueue;
use super::virtio::{status, INT_VRING, TYPE_RNG};
use super::vm::Vm;
use super::{layout, memory};

/// `/dev/kvm`, or why the test is skipped (printed, never silent).
fn open_kvm(test: &str) -> Option<Kvm> {
    match Kvm::new() {
        Ok(k) => Some(k),
        Err(e) => {
            println!("skipped: {test}: cannot open /dev/kvm: {e}");
            None
        }
    }
}

/// A port that records the 32-bit values the guest writes to it.
#[derive(Default)]
struct Recorder(Vec<u32>);

impl BusDevice for Recorder {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn write(&mut self, _offset: u64, data: &[u8]) {
        let mut word = [0u8; 4];
        let n = data.len().min(4);
        word[..n].copy_from_slice(&data[..n]);
        self.0.push(u32::from_le_bytes(word));
    }
}

/// The recorder's port.
const REPORT: u8 = 0xe0;
/// Where the programs are put and entered.
const CODE: u64 = layout::HIMEM_START;

/// A few 32-bit x86 instructions, encoded by hand.
#[derive(Default)]
struct Asm(Vec<u8>);

impl Asm {
    fn bytes(&mut self, b: &[u8]) -> &mut Self {
        self.0.extend_from_slice(b);
        self
    }
    fn imm(&mut self, v: u32) -> &mut Self {
        self.bytes(&v.to_le_bytes())
    }
    /// mov eax, [addr]
    fn load(&mut self, addr: u64) -> &mut Self {
        self.bytes(&[0xa1]).imm(addr as u32)
    }
    /// mov dword [addr], value
    fn store(&mut self, addr: u64, value: u32) -> &mut Self {
        self.bytes(&[0xc7, 0x05]).imm(addr as u32).imm(value)
    }
    /// mov eax, [ebx + disp]
    fn load_ebx(&mut self, disp: u8) -> &mut Self {
        self.bytes(&[0x8b, 0x43, disp])
    }
    /// mov eax, [eax]
    fn deref_eax(&mut self) -> &mut Self {
        self.bytes(&[0x8b, 0x00])
    }
    /// out REPORT, eax
    fn report(&mut self) -> &mut Self {
        self.bytes(&[0xe7, REPORT])
    }
    /// The i8042's reset: mov al, 0xfe; out 0x64, al
    fn reset(&mut self) -> &mut Self {
        self.bytes(&[0xb0, 0xfe, 0xe6, 0x64])
    }
    fn here(&self) -> usize {
        self.0.len()
    }
    /// jnz to `target` (backwards)
    fn jnz_back(&mut self, target: usize) -> &mut Self {
        let rel = target as isize - (self.here() as isize + 2);
        self.bytes(&[0x75, rel as i8 as u8])
    }
}

/// A VM with 16 MiB of memfd memory, the reset line and a recorder.
fn machine(kvm: Kvm, irqchip: bool) -> (Vm, Arc<Mutex<Recorder>>) {
    let mem = memory::create(16).unwrap();
    let vm = Vm::new(kvm, mem.guest, irqchip).unwrap();
    let rec = Arc::new(Mutex::new(Recorder::default()));
    vm.pio.insert(rec.clone(), u64::from(REPORT), 4).unwrap();
    vm.pio
        .insert(
            Arc::new(Mutex::new(I8042::new(vm.stop.clone()))),
            i8042::BASE,
            i8042::LEN,
        )
        .unwrap();
    (vm, rec)
}

/// Loads `code` at [`CODE`] and makes vCPU 0 enter it as a PVH kernel.
fn vcpu_at(vm: &Vm, code: &Asm) -> Vcpu {
    vm.memory.write_slice(&code.0, GuestAddress(CODE)).unwrap();
    let entry = Entry {
        pvh_entry: GuestAddress(CODE),
        start_info: GuestAddress(layout::START_INFO),
    };
    vm.create_vcpu(0, Some(entry)).unwrap()
}

/// A minimal ELF `vmlinux`: one loadable segment at 1 MiB holding `code`
/// at offset 0x200, and the Xen PVH note naming it as the entry point.
fn elf_kernel(code: &[u8]) -> Vec<u8> {
    const LOAD: u64 = 0x10_0000;
    const CODE_OFF: usize = 0x200;
    const NOTE_OFF: usize = 64 + 2 * 56;
    let mut f = vec![0u8; CODE_OFF];
    f.extend_from_slice(code);
    let size = f.len() as u64;
    // ELF header.
    f[0..4].copy_from_slice(b"\x7fELF");
    f[4] = 2; // 64-bit
    f[5] = 1; // little-endian
    f[6] = 1; // version
    f[16..18].copy_from_slice(&2u16.to_le_bytes()); // ET_EXEC
    f[18..20].copy_from_slice(&62u16.to_le_bytes()); // EM_X86_64
    f[20..24].copy_from_slice(&1u32.to_le_bytes());
    f[24..32].copy_from_slice(&(LOAD + CODE_OFF as u64).to_le_bytes()); // e_entry
    f[32..40].copy_from_slice(&64u64.to_le_bytes()); // e_phoff
    f[52..54].copy_from_slice(&64u16.to_le_bytes()); // e_ehsize
    f[54..56].copy_from_slice(&56u16.to_le_bytes()); // e_phentsize
    f[56..58].copy_from_slice(&2u16.to_le_bytes()); // e_phnum
    let phdr = |f: &mut Vec<u8>, at: usize, kind: u32, off: u64, addr: u64, len: u64| {
        f[at..at + 4].copy_from_slice(&kind.to_le_bytes());
        f[at + 4..at + 8].copy_from_slice(&5u32.to_le_bytes()); // R+X
        f[at + 8..at + 16].copy_from_slice(&off.to_le_bytes());
        f[at + 16..at + 24].copy_from_slice(&addr.to_le_bytes());
        f[at + 24..at + 32].copy_from_slice(&addr.to_le_bytes());
        f[at + 32..at + 40].copy_from_slice(&len.to_le_bytes());
        f[at + 40..at + 48].copy_from_slice(&len.to_le_bytes());
        f[at + 48..at + 56].copy_from_slice(&4u64.to_le_bytes());
    };
    phdr(&mut f, 64, 1, 0, LOAD, size); // PT_LOAD
    phdr(&mut f, 120, 4, NOTE_OFF as u64, 0, 20); // PT_NOTE
    let note = NOTE_OFF;
    f[note..note + 4].copy_from_slice(&4u32.to_le_bytes()); // namesz
    f[note + 4..note + 8].copy_from_slice(&4u32.to_le_bytes()); // descsz
    f[note + 8..note + 12].copy_from_slice(&18u32.to_le_bytes()); // PHYS32_ENTRY
    f[note + 12..note + 16].copy_from_slice(b"Xen\0");
    f[note + 16..note + 20].copy_from_slice(&((LOAD as u32) + CODE_OFF as u32).to_le_bytes());
    f
}

#[test]
fn a_pvh_kernel_is_entered_with_its_start_info_and_resets_the_vm() {
    let Some(kvm) = open_kvm("pvh entry") else {
        return;
    };
    // The guest reports the start info's magic, the first bytes of its
    // command line and of its initramfs module, then pulses reset.
    let mut code = Asm::default();
    code.load_ebx(0).report(); // magic
    code.load_ebx(24).deref_eax().report(); // *cmdline_paddr
    code.load_ebx(12).report(); // nr_modules
    code.load_ebx(16).deref_eax().deref_eax().report(); // *modlist[0].paddr
    code.reset();
    code.bytes(&[0xf4]);
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("vmlinux");
    std::fs::write(&kernel, elf_kernel(&code.0)).unwrap();
    let initramfs = dir.path().join("initramfs");
    std::fs::write(&initramfs, b"070701 a cpio archive").unwrap();

    let (vm, rec) = machine(kvm, true);
    let cmdline = boot::cmdline("console=ttyS0 reboot=k").unwrap();
    let entry = boot::load(&vm.memory, &kernel, Some(&initramfs), &cmdline).unwrap();
    assert_eq!(entry.pvh_entry, GuestAddress(0x10_0200));
    let mut vcpu = vm.create_vcpu(0, Some(entry)).unwrap();
    assert_eq!(vcpu.run().unwrap(), StopReason::Reset);
    assert_eq!(
        rec.lock().unwrap().0,
        vec![
            boot::START_MAGIC,
            u32::from_le_bytes(*b"cons"),
            1,
            u32::from_le_bytes(*b"0707"),
        ]
    );
}

#[test]
fn a_kernel_without_a_pvh_note_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("vmlinux");
    let mut image = elf_kernel(&[0xf4]);
    image[64 + 56] = 0; // the PT_NOTE header becomes PT_NULL
    std::fs::write(&kernel, image).unwrap();
    let mem = memory::create(4).unwrap();
    let err = boot::load(&mem.guest, &kernel, None, &boot::cmdline("").unwrap()).unwrap_err();
    assert!(matches!(err, boot::BootError::NoPvh(_)), "{err}");
    let err = boot::load(
        &mem.guest,
        &dir.path().join("nope"),
        None,
        &boot::cmdline("").unwrap(),
    )
    .unwrap_err();
    assert!(err.to_string().contains("nope"), "{err}");
}

#[test]
fn port_and_mmio_accesses_reach_the_right_device() {
    let Some(kvm) = open_kvm("mmio dispatch") else {
        return;
    };
    let (mut vm, rec) = machine(kvm, true);
    let rng = |seed| Arc::new(Mutex::new(Rng::new(Box::new(Pattern(seed))).unwrap()));
    let (_, first) = vm.add_virtio(0, rng(0)).unwrap();
    let (entry, second) = vm.add_virtio(1, rng(1)).unwrap();
    assert_eq!(entry, "virtio_mmio.device=4K@0xd0001000:6");
    let d0 = layout::MMIO_START;
    let d1 = d0 + 0x1000;
    let mut code = Asm::default();
    code.load(d0 + reg::MAGIC).report();
    code.load(d1 + reg::DEVICE_ID).report();
    code.store(d1 + reg::STATUS, status::ACKNOWLEDGE);
    code.load(d1 + reg::STATUS).report();
    code.load(d0 + reg::STATUS).report();
    // Between the devices' windows: no device, reads as zero.
    code.load(d0 + 0x10_0000).report();
    code.reset();
    let mut vcpu = vcpu_at(&vm, &code);
    assert_eq!(vcpu.run().unwrap(), StopReason::Reset);
    assert_eq!(
        rec.lock().unwrap().0,
        vec![MAGIC, TYPE_RNG, status::ACKNOWLEDGE, 0, 0]
    );
    assert_eq!(second.lock().unwrap().status(), status::ACKNOWLEDGE);
    assert_eq!(first.lock().unwrap().status(), 0);
    assert_eq!(vm.mmio.unhandled(), 1);
    assert_eq!(vcpu.metrics.mmio(), 6);
    // 5 reports and the reset.
    assert_eq!(vcpu.metrics.pio(), 6);
}

#[test]
fn a_queue_notify_is_served_and_the_used_ring_updated() {
    let Some(kvm) = open_kvm("queue notify") else {
        return;
    };
    let (mut vm, rec) = machine(kvm, true);
    let rng = Arc::new(Mutex::new(Rng::new(Box::new(Pattern(40))).unwrap()));
    let (_, transport) = vm.add_virtio(0, rng.clone()).unwrap();
    // The device's event loop, on its own thread as in the VMM.
    let stop = Arc::new(AtomicBool::new(false));
    let events = {
        let rng = rng.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut events: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
                EventManager::new().unwrap();
            events.add_subscriber(rng);
            while !stop.load(Ordering::SeqCst) {
                events.run_with_timeout(50).unwrap();
            }
        })
    };
    // The driver's structures, laid out in guest memory.
    let mut q = GuestQueue::new(&vm.memory, GuestAddress(0x20_0000), 16).unwrap();
    q.set_chain(
        0,
        &[(0x30_0000, 48, DESC_F_WRITE), (0x30_1000, 16, DESC_F_WRITE)],
    )
    .unwrap();
    q.offer(0).unwrap();
    // The guest brings the device up as Linux's driver does, notifies
    // queue 0 (absorbed by KVM's ioeventfd), and polls the interrupt
    // status until the device has served it.
    let base = layout::MMIO_START;
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    let mut code = Asm::default();
    code.store(base + reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    code.store(base + reg::DRIVER_FEATURES_SEL, 1);
    code.store(base + reg::DRIVER_FEATURES, 1); // VIRTIO_F_VERSION_1
    code.store(base + reg::STATUS, s);
    code.store(base + reg::QUEUE_SEL, 0);
    code.store(base + reg::QUEUE_NUM, 16);
    code.store(base + reg::QUEUE_DESC_LOW, q.desc.0 as u32);
    code.store(base + reg::QUEUE_DRIVER_LOW, q.avail.0 as u32);
    code.store(base + reg::QUEUE_DEVICE_LOW, q.used.0 as u32);
    code.store(base + reg::QUEUE_READY, 1);
    code.store(base + reg::STATUS, s | status::DRIVER_OK);
    code.load(base + reg::STATUS).report();
    code.store(base + reg::QUEUE_NOTIFY, 0);
    code.bytes(&[0xb9]).imm(200_000); // mov ecx, 200000
    let poll = code.here();
    code.load(base + reg::INTERRUPT_STATUS);
    code.bytes(&[0xa9]).imm(INT_VRING); // test eax, INT_VRING
    code.bytes(&[0x75, 0x03]); // jnz +3 (past dec and jnz)
    code.bytes(&[0x49]); // dec ecx
    code.jnz_back(poll);
    code.report();
    code.store(base + reg::INTERRUPT_ACK, INT_VRING);
    code.load(base + reg::INTERRUPT_STATUS).report();
    code.reset();
    let mut vcpu = vcpu_at(&vm, &code);
    let stopped = vcpu.run();
    stop.store(true, Ordering::SeqCst);
    events.join().unwrap();
    assert_eq!(stopped.unwrap(), StopReason::Reset);
    assert_eq!(
        rec.lock().unwrap().0,
        vec![s | status::DRIVER_OK, INT_VRING, 0],
        "DRIVER_OK, the interrupt seen, then acknowledged"
    );
    assert_eq!(q.used_idx().unwrap(), 1);
    assert_eq!(q.used_elem(0).unwrap(), (0, 64));
    let mut buf = [0u8; 16];
    vm.memory
        .read_slice(&mut buf, GuestAddress(0x30_1000))
        .unwrap();
    let want: Vec<u8> = (0..16).map(|i| 40 + 48 + i).collect();
    assert_eq!(buf.to_vec(), want);
    assert_eq!(rng.lock().unwrap().metrics.chains(), 1);
    assert_eq!(transport.lock().unwrap().ignored, 0);
    // The notify never left the kernel: KVM's ioeventfd took it.
    let notify_exits = vcpu.metrics.mmio();
    assert!(notify_exits >= 13, "{notify_exits}");
}

#[test]
fn a_halt_a_crash_and_a_stop_request_end_the_run() {
    let Some(kvm) = open_kvm("halt and shutdown") else {
        return;
    };
    // Without KVM's interrupt controller, hlt comes back to the VMM.
    let (vm, _) = machine(kvm, false);
    let mut code = Asm::default();
    code.bytes(&[0xf4]);
    assert_eq!(vcpu_at(&vm, &code).run().unwrap(), StopReason::Halted);

    // ud2 with no IDT: #UD, #DF, triple fault.
    let Some(kvm) = open_kvm("triple fault") else {
        return;
    };
    let (vm, _) = machine(kvm, true);
    let mut code = Asm::default();
    code.bytes(&[0x0f, 0x0b]);
    assert_eq!(vcpu_at(&vm, &code).run().unwrap(), StopReason::Shutdown);

    // A stop the VMM asked for before the vCPU ran.
    let Some(kvm) = open_kvm("stop request") else {
        return;
    };
    let (vm, rec) = machine(kvm, true);
    let mut code = Asm::default();
    code.report().reset();
    let mut vcpu = vcpu_at(&vm, &code);
    vm.stop.request(StopReason::Requested);
    assert_eq!(vcpu.run().unwrap(), StopReason::Requested);
    assert!(rec.lock().unwrap().0.is_empty());
}

/// The [`crate::microvm::vmm::VmConfig`] of a test VM booting `kernel`.
fn vm_config(kernel: &std::path::Path, vcpus: u32) -> crate::microvm::vmm::VmConfig {
    crate::microvm::vmm::VmConfig {
        name: "test".into(),
        kernel: kernel.to_path_buf(),
        initramfs: None,
        cmdline: "console=ttyS0 reboot=k".into(),
        vcpus,
        memory_mib: 32,
        balloon: false,
        share_dir: std::path::PathBuf::new(),
        control_socket: std::path::PathBuf::new(),
        console_log: std::path::PathBuf::new(),
        run_dir: std::path::PathBuf::new(),
        kvm: true,
        nics: Vec::new(),
        vmm_user: crate::microvm::vmm::jail::Identity { uid: 0, gid: 0 },
    }
}

/// "ok\n" to COM1, then reset.
fn serial_program() -> Asm {
    let mut code = Asm::default();
    code.bytes(&[0x66, 0xba, 0xf8, 0x03]); // mov dx, 0x3f8
    for b in b"ok\n" {
        code.bytes(&[0xb0, *b, 0xee]); // mov al, b; out dx, al
    }
    code.reset();
    code
}

#[test]
fn a_machine_built_from_a_vm_config_runs_until_the_guest_resets_it() {
    if open_kvm("machine").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("vmlinux");
    std::fs::write(&kernel, elf_kernel(&serial_program().0)).unwrap();
    let console = dir.path().join("console");
    let (control, _agent_side) = std::os::unix::net::UnixStream::pair().unwrap();
    let options = super::machine::Options {
        serial: Some(std::fs::File::create(&console).unwrap()),
        entropy: Some(Box::new(Pattern(0))),
        control: Some(control),
        share: Some(dir.path().to_path_buf()),
        nics: vec![super::machine::NicPort {
            fd: std::os::unix::net::UnixDatagram::pair().unwrap().0.into(),
            mac: [2, 0, 0, 0, 0, 1],
        }],
        // This test runs the machine on its own thread, which a jail
        // would keep.
        jail: false,
    };
    // Two vCPUs: the second waits for a SIPI inside KVM and must be
    // kicked out when the first stops the VM.
    let m = super::machine::build(&vm_config(&kernel, 2), options).unwrap();
    assert_eq!(m.memfd.metadata().unwrap().len(), 32 << 20);
    // virtio-rng in slot 0, the control port's virtio-console in slot 1,
    // the share's virtio-fs in slot 2 (served by its own event loop), the
    // NIC in slot 3.
    assert_eq!(
        m.cmdline,
        "console=ttyS0 reboot=k virtio_mmio.device=4K@0xd0000000:5 \
         virtio_mmio.device=4K@0xd0001000:6 virtio_mmio.device=4K@0xd0002000:7 \
         virtio_mmio.device=4K@0xd0003000:8"
    );
    assert_eq!(m.nics.len(), 1);
    assert!(m.console.is_some());
    assert!(m.fs.is_some());
    assert_eq!(m.vcpus.len(), 2);
    assert!(m.serial.is_some());
    let counters = m.counters.clone();
    assert_eq!(counters.read().first_instruction_us, None, "not run yet");
    let started = std::time::Instant::now();
    assert_eq!(m.run().unwrap(), StopReason::Reset);
    let elapsed = started.elapsed();
    assert!(elapsed < std::time::Duration::from_secs(10));
    assert_eq!(std::fs::read(&console).unwrap(), b"ok\n");
    // The VMM timed its own start, and counted the serial port's writes
    // (three bytes) and the reset as port exits.
    let c = counters.read();
    let first = c.first_instruction_us.expect("first instruction timed");
    assert!(first > 0 && u128::from(first) < elapsed.as_micros() + 10_000_000);
    assert!(c.pio_exits >= 4, "{c:?}");
    assert!(c.vcpu_exits >= c.pio_exits + c.mmio_exits, "{c:?}");
    assert_eq!(c.nics.len(), 1);
    assert_eq!(c.bad_chains, 0);
}

#[test]
fn the_serial_port_is_off_unless_asked_for() {
    if open_kvm("serial off").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let kernel = dir.path().join("vmlinux");
    std::fs::write(&kernel, elf_kernel(&serial_program().0)).unwrap();
    let options = super::machine::Options {
        serial: None,
        entropy: Some(Box::new(Pattern(0))),
        control: None,
        share: None,
        nics: Vec::new(),
        jail: false,
    };
    let mut m = super::machine::build(&vm_config(&kernel, 1), options).unwrap();
    assert!(m.serial.is_none());
    assert!(m.console.is_none());
    assert!(m.fs.is_none());
    assert_eq!(m.vcpus[0].run().unwrap(), StopReason::Reset);
    // The three bytes went nowhere.
    assert_eq!(m.vm.pio.unhandled(), 3);
    assert!(matches!(
        super::machine::build(&vm_config(&kernel, 0), Default::default()),
        Err(super::machine::MachineError::NoVcpus)
    ));
}

/// The guest kernel `make install` puts in place, or `AGENTVM_KERNEL`.
fn guest_kernel() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("AGENTVM_KERNEL")
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| crate::microvm::host::DEFAULT_KERNEL.into());
    path.is_file().then_some(path)
}

#[test]
fn the_guest_kernel_loads_with_a_pvh_entry_point() {
    let Some(kernel) = guest_kernel() else {
        println!(
            "skipped: no guest kernel at {} (make kernel && make install, or AGENTVM_KERNEL)",
            crate::microvm::host::DEFAULT_KERNEL
        );
        return;
    };
    // Loading only: a Linux guest does not boot on kvm_pvm, and this
    // test needs no /dev/kvm.
    let mem = memory::create(256).unwrap();
    let cmdline = boot::cmdline("console=ttyS0 reboot=k").unwrap();
    let entry = boot::load(&mem.guest, &kernel, None, &cmdline).unwrap();
    let pvh = entry.pvh_entry.0;
    assert!(
        (layout::HIMEM_START..1 << 32).contains(&pvh),
        "PVH entry {pvh:#x} is not a 32-bit address above 1 MiB"
    );
    let magic: u32 = mem.guest.read_obj(entry.start_info).unwrap();
    assert_eq!(magic, boot::START_MAGIC);
    let mut text = [0u8; 13];
    mem.guest
        .read_slice(&mut text, GuestAddress(layout::CMDLINE))
        .unwrap();
    assert_eq!(&text, b"console=ttyS0");
    println!("{}: PVH entry at {pvh:#x}", kernel.display());
}

/// Runs `vcpu` on a thread for at most `limit`; past it the VM is asked to
/// stop and the vCPU kicked out of `KVM_RUN`, and `None` returned.
fn run_with_limit(vm: &Vm, mut vcpu: Vcpu, limit: std::time::Duration) -> Option<StopReason> {
    use vmm_sys_util::signal::Killable;
    super::machine::install_kick().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let _ = tx.send(vcpu.run());
    });
    match rx.recv_timeout(limit) {
        Ok(r) => {
            thread.join().unwrap();
            Some(r.unwrap())
        }
        Err(_) => {
            vm.stop.request(StopReason::Requested);
            while !thread.is_finished() {
                let _ = thread.kill(super::machine::kick_signal());
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            None
        }
    }
}

#[test]
fn a_device_interrupt_reaches_the_guest_through_the_io_apic() {
    let Some(kvm) = open_kvm("interrupt") else {
        return;
    };
    let (mut vm, rec) = machine(kvm, true);
    let rng = Arc::new(Mutex::new(Rng::new(Box::new(Pattern(0))).unwrap()));
    vm.add_virtio(0, rng.clone()).unwrap();
    let stop = Arc::new(AtomicBool::new(false));
    let events = {
        let rng = rng.clone();
        let stop = stop.clone();
        std::thread::spawn(move || {
            let mut events: EventManager<Arc<Mutex<dyn MutEventSubscriber + Send>>> =
                EventManager::new().unwrap();
            events.add_subscriber(rng);
            while !stop.load(Ordering::SeqCst) {
                events.run_with_timeout(50).unwrap();
            }
        })
    };
    let mut q = GuestQueue::new(&vm.memory, GuestAddress(0x20_0000), 16).unwrap();
    q.set_chain(0, &[(0x30_0000, 8, DESC_F_WRITE)]).unwrap();
    q.offer(0).unwrap();

    const VECTOR: u32 = 0x30;
    const IOAPIC: u64 = 0xfec0_0000;
    const LAPIC: u64 = 0xfee0_0000;
    const IRQ: u32 = layout::FIRST_VIRTIO_IRQ;
    let base = layout::MMIO_START;
    let s = status::ACKNOWLEDGE | status::DRIVER | status::FEATURES_OK;
    let mut code = Asm::default();
    // The PIC masked; the local APIC on; IO-APIC pin 5 to VECTOR, CPU 0.
    code.bytes(&[0xb0, 0xff, 0xe6, 0x21, 0xe6, 0xa1]);
    code.store(LAPIC + 0xf0, 0x1ff);
    code.store(IOAPIC, 0x10 + 2 * IRQ)
        .store(IOAPIC + 0x10, VECTOR);
    code.store(IOAPIC, 0x11 + 2 * IRQ).store(IOAPIC + 0x10, 0);
    // virtio-rng up, queue 0 notified.
    code.store(base + reg::STATUS, status::ACKNOWLEDGE | status::DRIVER);
    code.store(base + reg::DRIVER_FEATURES_SEL, 1);
    code.store(base + reg::DRIVER_FEATURES, 1);
    code.store(base + reg::STATUS, s);
    code.store(base + reg::QUEUE_NUM, 16);
    code.store(base + reg::QUEUE_DESC_LOW, q.desc.0 as u32);
    code.store(base + reg::QUEUE_DRIVER_LOW, q.avail.0 as u32);
    code.store(base + reg::QUEUE_DEVICE_LOW, q.used.0 as u32);
    code.store(base + reg::QUEUE_READY, 1);
    code.store(base + reg::STATUS, s | status::DRIVER_OK);
    code.store(base + reg::QUEUE_NOTIFY, 0);
    // Wait for the interrupt: sti; hlt; jmp back to the hlt.
    code.bytes(&[0xfb, 0xf4, 0xeb, 0xfd]);
    // The handler: report the vector and the status, ack, EOI, reset.
    let handler = CODE + code.here() as u64;
    code.bytes(&[0xb8]).imm(VECTOR).report();
    code.load(base + reg::INTERRUPT_STATUS).report();
    code.store(base + reg::INTERRUPT_ACK, INT_VRING);
    code.store(LAPIC + 0xb0, 0);
    code.reset();
    // The IDT (one gate, at VECTOR) and a stack, set up by the test.
    const IDT: u64 = 0x8000;
    let gate_low = (u32::from(super::cpu::CODE_SELECTOR) << 16) | (handler as u32 & 0xffff);
    let gate_high = (handler as u32 & 0xffff_0000) | 0x8e00;
    let at = GuestAddress(IDT + 8 * u64::from(VECTOR));
    vm.memory.write_obj(gate_low, at).unwrap();
    vm.memory
        .write_obj(gate_high, GuestAddress(at.0 + 4))
        .unwrap();
    let vcpu = vcpu_at(&vm, &code);
    let mut sregs = vcpu.fd.get_sregs().unwrap();
    sregs.idt.base = IDT;
    sregs.idt.limit = (8 * (VECTOR + 1) - 1) as u16;
    vcpu.fd.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.fd.get_regs().unwrap();
    regs.rsp = 0x5000;
    vcpu.fd.set_regs(&regs).unwrap();

    let stopped = run_with_limit(&vm, vcpu, std::time::Duration::from_secs(30));
    stop.store(true, Ordering::SeqCst);
    events.join().unwrap();
    assert_eq!(
        q.used_elem(0).unwrap(),
        (0, 8),
        "the device served the queue"
    );
    assert_eq!(
        stopped,
        Some(StopReason::Reset),
        "the guest was not interrupted within 30 s (reported {:x?})",
        rec.lock().unwrap().0
    );
    assert_eq!(rec.lock().unwrap().0, vec![VECTOR, INT_VRING]);
}

/// Page tables at 0x9000 mapping the first 4 GiB one to one with 2 MiB
/// pages, user-accessible when `user`.
fn identity_map(vm: &Vm, user: bool) -> u64 {
    let u = if user { 4 } else { 0 };
    let w = |a: u64, v: u64| vm.memory.write_obj(v, GuestAddress(a)).unwrap();
    w(0x9000, 0xa000 | 3 | u);
    for i in 0..4u64 {
        w(0xa000 + 8 * i, (0xb000 + 0x1000 * i) | 3 | u);
    }
    for i in 0..2048u64 {
        w(0xb000 + 8 * i, (i << 21) | 0x83 | u);
    }
    0x9000
}

/// Sets vCPU `vcpu` up for 64-bit long mode at privilege level `cpl`
/// (0 or 3), entering `rip`; at CPL 3 with IOPL 3, so ports are allowed.
fn long_mode(vm: &Vm, vcpu: &Vcpu, cpl: u8, rip: u64) {
    let cr3 = identity_map(vm, cpl == 3);
    let mut sregs = vcpu.fd.get_sregs().unwrap();
    let seg = |selector: u16, type_: u8, l: u8, db: u8| kvm_bindings::kvm_segment {
        base: 0,
        limit: 0xffff_ffff,
        selector: selector | u16::from(cpl),
        type_,
        present: 1,
        dpl: cpl,
        db,
        s: 1,
        l,
        g: 1,
        avl: 0,
        unusable: 0,
        padding: 0,
    };
    sregs.cs = seg(0x08, 0xb, 1, 0);
    let data = seg(0x10, 0x3, 0, 1);
    (sregs.ds, sregs.es, sregs.fs, sregs.gs, sregs.ss) = (data, data, data, data, data);
    sregs.cr3 = cr3;
    sregs.cr4 = 1 << 5; // PAE
    sregs.efer = (1 << 8) | (1 << 10); // LME, LMA
    sregs.cr0 = 1 | (1 << 31); // PE, PG
    vcpu.fd.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.fd.get_regs().unwrap();
    regs.rip = rip;
    regs.rflags = if cpl == 3 { 0x3002 } else { 2 };
    vcpu.fd.set_regs(&regs).unwrap();
}

/// What kvm_pvm runs, as tests (docs/builtin-vmm.md, "What kvm_pvm
/// runs"): real mode, 64-bit long mode at CPL 0 and at CPL 3, each with
/// the exits the VMM relies on.
#[test]
fn guest_code_runs_in_real_mode_and_in_long_mode_at_cpl_0_and_3() {
    let Some(kvm) = open_kvm("cpu modes") else {
        return;
    };
    // Real mode: mov al, 1; out REPORT, al; hlt.
    let (vm, rec) = machine(kvm, false);
    vm.memory
        .write_slice(&[0xb0, 1, 0xe6, REPORT, 0xf4], GuestAddress(0x1000))
        .unwrap();
    let mut vcpu = vm.create_vcpu(0, None).unwrap();
    let mut sregs = vcpu.fd.get_sregs().unwrap();
    sregs.cs.base = 0;
    sregs.cs.selector = 0;
    vcpu.fd.set_sregs(&sregs).unwrap();
    let mut regs = vcpu.fd.get_regs().unwrap();
    (regs.rip, regs.rflags) = (0x1000, 2);
    vcpu.fd.set_regs(&regs).unwrap();
    assert_eq!(vcpu.run().unwrap(), StopReason::Halted);
    assert_eq!(rec.lock().unwrap().0, vec![1]);

    // Long mode: mov eax, MMIO; mov dword [rax], cpl; mov al, cpl;
    // out REPORT, al; mov ecx, 10M; dec ecx; jnz; hlt. At CPL 3 the hlt
    // faults, and with no IDT that is a triple fault.
    for cpl in [0u8, 3] {
        let Some(kvm) = open_kvm("long mode") else {
            return;
        };
        let (vm, rec) = machine(kvm, false);
        let mmio = Arc::new(Mutex::new(Recorder::default()));
        vm.mmio
            .insert(mmio.clone(), layout::MMIO_START, 0x1000)
            .unwrap();
        let loops: u32 = if cpl == 3 { 10_000_000 } else { 1000 };
        let mut code = Asm::default();
        code.bytes(&[0xb8]).imm(layout::MMIO_START as u32);
        code.bytes(&[0xc7, 0x00]).imm(u32::from(cpl));
        code.bytes(&[0xb0, cpl, 0xe6, REPORT]);
        code.bytes(&[0xb9]).imm(loops);
        code.bytes(&[0xff, 0xc9, 0x75, 0xfc, 0xf4]);
        vm.memory.write_slice(&code.0, GuestAddress(CODE)).unwrap();
        let mut vcpu = vm.create_vcpu(0, None).unwrap();
        long_mode(&vm, &vcpu, cpl, CODE);
        let started = std::time::Instant::now();
        let stopped = vcpu.run().unwrap();
        println!(
            "long mode, CPL {cpl}: {loops} loop iterations and the exits in {:?}",
            started.elapsed()
        );
        let want = if cpl == 3 {
            StopReason::Shutdown
        } else {
            StopReason::Halted
        };
        assert_eq!(stopped, want, "CPL {cpl}");
        assert_eq!(rec.lock().unwrap().0, vec![u32::from(cpl)], "CPL {cpl}");
        assert_eq!(mmio.lock().unwrap().0, vec![u32::from(cpl)], "CPL {cpl}");
    }
}

/// The backend seam's view of a builtin VM: a guest that resets the VM is
/// reported as ended, with why, and one that never stops is stopped by
/// `kill`; no host process of its own, no balloon.
#[test]
fn a_launched_vm_reports_its_end_and_is_stopped_by_kill() {
    use crate::microvm::vmm::builtin::backend::launch_machine;
    if open_kvm("backend").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // Jailed as the supervisor runs it: each vCPU, the devices' and the
    // share's event loops, and the runner.
    let share = tempfile::tempdir().unwrap();
    let options = |name: &str| super::machine::Options {
        serial: Some(std::fs::File::create(dir.path().join(name)).unwrap()),
        entropy: Some(Box::new(Pattern(0))),
        control: None,
        share: Some(share.path().to_path_buf()),
        nics: Vec::new(),
        jail: true,
    };
    // "ok", then the reset line.
    let resets = dir.path().join("resets");
    std::fs::write(&resets, elf_kernel(&serial_program().0)).unwrap();
    let mut vm = launch_machine(&vm_config(&resets, 1), options("console-1")).unwrap();
    assert!(vm.host_pids().is_empty());
    assert!(vm.take_guest_ram().is_none());
    let started = std::time::Instant::now();
    let ended = loop {
        if let Some(e) = vm.exited() {
            break e;
        }
        assert!(
            started.elapsed() < std::time::Duration::from_secs(10),
            "the VM did not end"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    };
    assert_eq!(ended.part, "builtin VMM");
    assert_eq!(ended.how, "the guest reset the VM");
    assert_eq!(
        std::fs::read(dir.path().join("console-1")).unwrap(),
        b"ok\n"
    );
    // Asked again, the same answer.
    assert_eq!(vm.exited(), Some(ended));
    // `jmp $`: runs until stopped.
    let spins = dir.path().join("spins");
    std::fs::write(&spins, elf_kernel(&[0xeb, 0xfe])).unwrap();
    let mut vm = launch_machine(&vm_config(&spins, 2), options("console-2")).unwrap();
    std::thread::sleep(std::time::Duration::from_millis(200));
    assert_eq!(vm.exited(), None, "a spinning guest ended by itself");
    // Paused, both vCPUs park out of KVM_RUN (the second waits for a
    // SIPI inside it); resumed, the guest spins on.
    let pauser = vm.pauser().expect("the builtin VMM pauses by itself");
    pauser.pause().unwrap();
    assert!(pauser.paused());
    pauser.resume();
    assert!(!pauser.paused());
    std::thread::sleep(std::time::Duration::from_millis(50));
    assert_eq!(vm.exited(), None, "the guest ended after resume");
    // Paused again, kill still stops it.
    pauser.pause().unwrap();
    let started = std::time::Instant::now();
    vm.kill();
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
    let ended = vm.exited().expect("kill waits for the end");
    assert_eq!(ended.how, "stopped by the supervisor");
}

/// A launch that cannot reach the supervisor's control socket fails
/// naming it, before any KVM call.
#[test]
fn a_launch_without_the_control_socket_names_it() {
    use crate::microvm::vmm::Backend;
    let dir = tempfile::tempdir().unwrap();
    let mut config = vm_config(&dir.path().join("vmlinux"), 1);
    config.run_dir = dir.path().to_path_buf();
    config.control_socket = "control.sock".into();
    config.console_log = dir.path().join("console");
    let err = super::backend::Builtin
        .launch(&config)
        .err()
        .expect("launched without a control socket")
        .to_string();
    assert!(err.contains("control.sock"), "{err}");
}
