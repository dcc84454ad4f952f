//! Each check run against the test process itself: once with what is true
//! here (must pass) and once with something false (must fail).

use oci_validation::expect::{Check, Probe};

use crate::{run, Failure};

fn passes(c: Check) {
    if let Err(e) = run(&c) {
        panic!("{c:?} should pass: {e}");
    }
}

fn fails(c: Check) {
    match run(&c) {
        Err(Failure::Mismatch(_)) => {}
        other => panic!("{c:?} should fail, got {other:?}"),
    }
}

#[test]
fn env_and_cwd() {
    let unset = "OCI_CHECKER_TEST_SURELY_UNSET";
    passes(Check::Env {
        var: unset.into(),
        value: None,
    });
    fails(Check::Env {
        var: unset.into(),
        value: Some("x".into()),
    });
    let cwd = std::env::current_dir().unwrap();
    passes(Check::Cwd {
        path: cwd.to_string_lossy().into(),
    });
    fails(Check::Cwd {
        path: "/no/such/dir".into(),
    });
}

#[test]
fn identity_and_caps() {
    let uid = nix::unistd::getuid().as_raw();
    passes(Check::Uid { uid });
    fails(Check::Uid { uid: uid + 1 });
    let status = std::fs::read_to_string("/proc/self/status").unwrap();
    let bnd = status
        .lines()
        .find_map(|l| l.strip_prefix("CapBnd:"))
        .unwrap()
        .trim();
    let mask = u64::from_str_radix(bnd, 16).unwrap();
    passes(Check::CapSet {
        field: "CapBnd".into(),
        mask,
    });
    fails(Check::CapSet {
        field: "CapBnd".into(),
        mask: mask ^ 1,
    });
}

#[test]
fn rlimit_matches_getrlimit() {
    let (soft, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    passes(Check::Rlimit {
        resource: "RLIMIT_NOFILE".into(),
        soft,
        hard,
    });
    fails(Check::Rlimit {
        resource: "RLIMIT_NOFILE".into(),
        soft: soft.wrapping_add(1),
        hard,
    });
}

#[test]
fn files_nodes_and_mounts() {
    let dir = std::env::temp_dir().join(format!("oci-checker-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let empty = dir.join("empty");
    let full = dir.join("full");
    std::fs::write(&empty, "").unwrap();
    std::fs::write(&full, "a  b\n").unwrap();
    let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
    passes(Check::Masked { path: s(&empty) });
    fails(Check::Masked { path: s(&full) });
    passes(Check::FileContent {
        path: s(&full),
        content: "a b".into(),
    });
    fails(Check::FileContent {
        path: s(&full),
        content: "a c".into(),
    });
    passes(Check::Writable { path: s(&dir) });
    let null = |minor| Check::Node {
        path: "/dev/null".into(),
        node_type: 'c',
        major: Some(1),
        minor: Some(minor),
        mode: None,
        uid: None,
        gid: None,
    };
    passes(null(3));
    fails(null(4));
    passes(Check::Mount {
        target: "/".into(),
        fstype: None,
        options: vec![],
        absent_options: vec![],
        propagation: None,
    });
    fails(Check::NotMounted { target: "/".into() });
    fails(Check::Mount {
        target: "/no/such/mount".into(),
        fstype: None,
        options: vec![],
        absent_options: vec![],
        propagation: None,
    });
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn syscall_probes() {
    passes(Check::Syscall {
        probe: Probe::Getpgid { pid: 0 },
        errno: None,
    });
    fails(Check::Syscall {
        probe: Probe::Getpgid { pid: 0 },
        errno: Some(libc::EPERM),
    });
    passes(Check::Syscall {
        probe: Probe::Mkdir {
            path: "/no/such/parent/dir".into(),
        },
        errno: Some(libc::ENOENT),
    });
    fails(Check::KilledBy {
        probe: Probe::Getppid,
        signal: libc::SIGSYS,
    });
    passes(Check::Open {
        path: "/dev/null".into(),
        write: true,
        errno: None,
    });
    fails(Check::Open {
        path: "/no/such/file".into(),
        write: false,
        errno: None,
    });
}
