//! Warming a pool VM before its container comes (`HostMessage::Warm`).
//!
//! A container's creation is the first time the guest runs most of the
//! agent's code: the container tier, libcontainer, libseccomp. The agent
//! runs from the share, so each first touch of that code is a page fault
//! read through virtio-fs, and under TCG each new block of it is also
//! translated before it runs. In a VM that just booted that is most of
//! `create`: measured under TCG, a pod's first container took 600 ms to
//! create and the next ones 150-160 ms.
//!
//! A pool VM has time for that before anyone asks (`microvm::pool`): its
//! keeper sends `Warm` after Hello, and the agent runs a throwaway
//! container through the path a real one takes: create, start, its exit,
//! delete. Its spec is the default one (`runc spec`'s namespaces, mounts,
//! masked paths and capabilities) with a cgroup namespace, as the host
//! plans every container's, and a small seccomp profile so that
//! libseccomp's compiler runs too; its rootfs is a directory of the
//! guest's tmpfs holding one program, [`EXIT_PROGRAM`], which exits 0.
//! Nothing of it is left: its state, cgroup, bundle and rootfs go with
//! it, and its init is reaped.
//!
//! The code it read stays in the guest's page cache (the agent does not
//! trim a VM that no container has asked for, `agent.rs`), and its
//! translations in QEMU's cache.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use oci_spec::runtime::{
    Arch, LinuxNamespace, LinuxNamespaceType, LinuxSeccomp, LinuxSeccompAction, LinuxSyscall, Spec,
};

use libcontainer::container::Container;
use nix::errno::Errno;
use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};

use super::stream::pipes;
use super::sys::SigchldUnblocked;
use super::AGENT_DIR;
use crate::bundle::{Bundle, BundleError};
use crate::container::create::CreateOptions;
use crate::container::ContainerError;
use crate::context::Context;

/// The throwaway container's id in the guest's container tier: not a
/// name the host ever gives a container of the VM (`container`,
/// `member-N`).
pub const WARM_ID: &str = "warm-up";
/// Its cgroup, beside the one a container gets ([`super::GUEST_CGROUP`]).
const WARM_CGROUP: &str = "/agentvm-warm-up";
/// Its process, [`EXIT_PROGRAM`] in its rootfs.
const WARM_PROCESS: &str = "/warm-up";
/// How long its process may take to exit once started.
const EXIT_WAIT: Duration = Duration::from_secs(10);
/// The system calls its profile refuses (any will do: they only make
/// libseccomp compile rules).
const REFUSED: [&str; 3] = ["add_key", "keyctl", "request_key"];

#[derive(Debug, thiserror::Error)]
pub enum WarmError {
    #[error("warm-up: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("warm-up: cannot create stdio pipes: {0}")]
    Pipes(nix::errno::Errno),
    #[error("warm-up: {0}")]
    Bundle(#[from] BundleError),
    #[error("warm-up: {0}")]
    Tier(#[from] ContainerError),
    #[error("warm-up: the container was created without a process")]
    NoProcess,
    #[error("warm-up: its process did not exit 0: {0}")]
    Exit(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> WarmError {
    let what = what.into();
    move |source| WarmError::Io { what, source }
}

/// The warm-up's directory: its bundle, and its rootfs below.
fn dir() -> PathBuf {
    Path::new(AGENT_DIR).join(WARM_ID)
}

/// Runs the throwaway container from its creation to its deletion;
/// returns how long that took. Whatever happens, nothing of it is left
/// behind.
pub fn warm(ctx: &Context) -> Result<Duration, WarmError> {
    let started = Instant::now();
    let result = run_through(ctx);
    // The container tier removed its own state; the bundle is ours.
    let _ = std::fs::remove_dir_all(dir());
    result.map(|()| started.elapsed())
}

fn run_through(ctx: &Context) -> Result<(), WarmError> {
    let bundle_dir = dir();
    let rootfs = bundle_dir.join("rootfs");
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&rootfs)
        .map_err(io(format!("cannot create {}", rootfs.display())))?;
    let process = rootfs.join(WARM_PROCESS.trim_start_matches('/'));
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o755)
        .open(&process)
        .and_then(|mut f| f.write_all(&EXIT_PROGRAM))
        .map_err(io(format!("cannot write {}", process.display())))?;
    let spec = warm_spec(&rootfs);
    let config = bundle_dir.join("config.json");
    let text = serde_json::to_vec(&spec).map_err(|e| WarmError::Io {
        what: "cannot encode the spec".into(),
        source: std::io::Error::other(e),
    })?;
    std::fs::write(&config, text).map_err(io(format!("cannot write {}", config.display())))?;
    let bundle = Bundle::with_spec(&bundle_dir, spec)?;
    // As a container's: pipes for its stdio (dropped with it).
    let (child, _parent) = pipes().map_err(WarmError::Pipes)?;
    let opts = CreateOptions {
        detached: true,
        fresh_cgroup: true,
        enosys_added: true,
        stdin: Some(child.stdin),
        stdout: Some(child.stdout),
        stderr: Some(child.stderr),
        ..Default::default()
    };
    let created = {
        let _unblocked = SigchldUnblocked::new().map_err(WarmError::Pipes)?;
        crate::container::create::create(ctx, WARM_ID, &bundle, opts)
    };
    // The container tier works in the bundle; the bundle goes.
    let _ = std::env::set_current_dir(AGENT_DIR);
    let mut container = created?;
    let started = start_and_wait(ctx, &container);
    // Whatever start did, the container goes (its init killed if alive).
    crate::container::delete::delete(&mut container, true)?;
    started
}

/// Starts the created throwaway container as the agent starts one (its
/// state loaded again, as a `Start` request loads it) and reaps its init
/// (a child of the agent, which is PID 1).
fn start_and_wait(ctx: &Context, container: &Container) -> Result<(), WarmError> {
    let pid = container.pid().ok_or(WarmError::NoProcess)?;
    let mut loaded = crate::container::load(ctx, WARM_ID)?;
    loaded.start().map_err(crate::container::lc_error)?;
    let deadline = Instant::now() + EXIT_WAIT;
    loop {
        match waitpid(pid, Some(WaitPidFlag::WNOHANG)) {
            Ok(WaitStatus::Exited(_, 0)) => return Ok(()),
            Ok(WaitStatus::StillAlive) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(1))
            }
            Ok(WaitStatus::StillAlive) => return Err(WarmError::Exit("still running".into())),
            Ok(status) => return Err(WarmError::Exit(format!("{status:?}"))),
            Err(Errno::EINTR) => {}
            Err(e) => return Err(WarmError::Exit(e.to_string())),
        }
    }
}

/// The warm-up's process: a static x86-64 ELF executable of 129 bytes
/// whose code is `exit_group(0)`. One `PT_LOAD` segment maps the whole
/// file, readable and executable, at [`EXIT_BASE`]; the code follows the
/// two headers.
pub const EXIT_PROGRAM: [u8; 129] = exit_program();
const EXIT_BASE: u64 = 0x40_0000;
const ELF_HEADER: usize = 64;
const PROGRAM_HEADER: usize = 56;
/// `mov eax, 231` (exit_group); `xor edi, edi`; `syscall`.
const EXIT_CODE: [u8; 9] = [0xb8, 0xe7, 0x00, 0x00, 0x00, 0x31, 0xff, 0x0f, 0x05];

const fn put(mut buf: [u8; 129], at: usize, bytes: &[u8]) -> [u8; 129] {
    let mut i = 0;
    while i < bytes.len() {
        buf[at + i] = bytes[i];
        i += 1;
    }
    buf
}

const fn exit_program() -> [u8; 129] {
    let size = (ELF_HEADER + PROGRAM_HEADER + EXIT_CODE.len()) as u64;
    let entry = EXIT_BASE + (ELF_HEADER + PROGRAM_HEADER) as u64;
    let b = [0u8; 129];
    // e_ident: magic, 64-bit, little-endian, version 1, System V ABI.
    let b = put(b, 0, &[0x7f, b'E', b'L', b'F', 2, 1, 1, 0]);
    let b = put(b, 16, &2u16.to_le_bytes()); // e_type: executable
    let b = put(b, 18, &0x3eu16.to_le_bytes()); // e_machine: x86-64
    let b = put(b, 20, &1u32.to_le_bytes()); // e_version
    let b = put(b, 24, &entry.to_le_bytes()); // e_entry
    let b = put(b, 32, &(ELF_HEADER as u64).to_le_bytes()); // e_phoff (e_shoff, e_flags: 0)
    let b = put(b, 52, &(ELF_HEADER as u16).to_le_bytes()); // e_ehsize
    let b = put(b, 54, &(PROGRAM_HEADER as u16).to_le_bytes()); // e_phentsize
    let b = put(b, 56, &1u16.to_le_bytes()); // e_phnum (no section headers)
    let p = ELF_HEADER;
    let b = put(b, p, &1u32.to_le_bytes()); // p_type: PT_LOAD
    let b = put(b, p + 4, &5u32.to_le_bytes()); // p_flags: R + X (p_offset 0: all the file)
    let b = put(b, p + 16, &EXIT_BASE.to_le_bytes()); // p_vaddr
    let b = put(b, p + 24, &EXIT_BASE.to_le_bytes()); // p_paddr
    let b = put(b, p + 32, &size.to_le_bytes()); // p_filesz
    let b = put(b, p + 40, &size.to_le_bytes()); // p_memsz
    let b = put(b, p + 48, &0x1000u64.to_le_bytes()); // p_align
    put(b, ELF_HEADER + PROGRAM_HEADER, &EXIT_CODE)
}

/// The default spec, as the host would plan it for the guest, on
/// `rootfs`, with a seccomp profile.
pub fn warm_spec(rootfs: &Path) -> Spec {
    let mut spec = Spec::default();
    let mut root = spec.root().clone().unwrap_or_default();
    root.set_path(rootfs.to_path_buf());
    root.set_readonly(Some(true));
    spec.set_root(Some(root));
    let mut process = spec.process().clone().unwrap_or_default();
    process.set_args(Some(vec![WARM_PROCESS.to_string()]));
    process.set_terminal(Some(false));
    // As Docker's: no no_new_privileges, so the filter is loaded while
    // the init still holds its capabilities.
    process.set_no_new_privileges(None);
    spec.set_process(Some(process));
    let mut linux = spec.linux().clone().unwrap_or_default();
    let mut namespaces = linux.namespaces().clone().unwrap_or_default();
    if !namespaces
        .iter()
        .any(|n| n.typ() == LinuxNamespaceType::Cgroup)
    {
        let mut ns = LinuxNamespace::default();
        ns.set_typ(LinuxNamespaceType::Cgroup);
        namespaces.push(ns);
    }
    linux.set_namespaces(Some(namespaces));
    linux.set_cgroups_path(Some(PathBuf::from(WARM_CGROUP)));
    let mut rule = LinuxSyscall::default();
    rule.set_names(REFUSED.iter().map(|s| s.to_string()).collect());
    rule.set_action(LinuxSeccompAction::ScmpActErrno);
    rule.set_errno_ret(Some(libc::EPERM as u32));
    let mut seccomp = LinuxSeccomp::default();
    seccomp.set_default_action(LinuxSeccompAction::ScmpActAllow);
    seccomp.set_architectures(Some(vec![Arch::ScmpArchX86_64]));
    seccomp.set_syscalls(Some(vec![rule]));
    linux.set_seccomp(Some(seccomp));
    spec.set_linux(Some(linux));
    spec
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_warm_up_container_is_a_default_one_of_its_own() {
        let spec = warm_spec(Path::new("/run/agentvm/warm-up/rootfs"));
        let root = spec.root().as_ref().unwrap();
        assert_eq!(root.path(), Path::new("/run/agentvm/warm-up/rootfs"));
        assert_eq!(root.readonly(), Some(true));
        let process = spec.process().as_ref().unwrap();
        assert_eq!(
            process.args().as_deref(),
            Some(&[WARM_PROCESS.to_string()][..])
        );
        assert_eq!(process.no_new_privileges(), None);
        let linux = spec.linux().as_ref().unwrap();
        // Never the cgroup a container of the VM gets.
        assert_ne!(
            linux.cgroups_path().as_deref(),
            Some(Path::new(super::super::GUEST_CGROUP))
        );
        let types: Vec<LinuxNamespaceType> = linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .map(|n| n.typ())
            .collect();
        for t in [
            LinuxNamespaceType::Pid,
            LinuxNamespaceType::Mount,
            LinuxNamespaceType::Network,
            LinuxNamespaceType::Cgroup,
        ] {
            assert!(types.contains(&t), "{t:?} missing from {types:?}");
        }
        // No namespace of the guest's own is joined.
        assert!(linux
            .namespaces()
            .as_ref()
            .unwrap()
            .iter()
            .all(|n| n.path().is_none()));
        let seccomp = linux.seccomp().as_ref().unwrap();
        assert_eq!(seccomp.default_action(), LinuxSeccompAction::ScmpActAllow);
        assert!(!seccomp.syscalls().as_ref().unwrap().is_empty());
        // Its id is none the host gives a container of the VM.
        assert_ne!(WARM_ID, super::super::CONTAINER_ID);
        assert!(!WARM_ID.starts_with("member-"));
    }

    /// The program is run for real by tests/microvm_pool.rs (the warm-up
    /// fails unless it exits 0); here it also runs on the host.
    #[test]
    fn the_exit_program_is_an_elf_executable_that_exits_0() {
        assert_eq!(&EXIT_PROGRAM[..4], b"\x7fELF");
        assert_eq!(
            EXIT_PROGRAM.len(),
            ELF_HEADER + PROGRAM_HEADER + EXIT_CODE.len()
        );
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("exit");
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .open(&path)
            .and_then(|mut f| f.write_all(&EXIT_PROGRAM))
            .expect("write");
        // Another test's fork may hold the written file open for a moment
        // (ETXTBSY); it closes at that child's exec.
        let mut tries = 0;
        let status = loop {
            match std::process::Command::new(&path).status() {
                Err(e) if e.raw_os_error() == Some(libc::ETXTBSY) && tries < 50 => {
                    tries += 1;
                    std::thread::sleep(Duration::from_millis(20));
                }
                other => break other.expect("run"),
            }
        };
        assert_eq!(status.code(), Some(0));
    }
}
