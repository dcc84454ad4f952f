//! What the harness asks the checker to verify inside the container.

use serde::{Deserialize, Serialize};

/// The expectations file: every check the checker runs, in order.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Expectations {
    pub checks: Vec<Expect>,
}

impl Expectations {
    pub fn push(&mut self, name: impl Into<String>, check: Check) {
        self.checks.push(Expect {
            name: name.into(),
            check,
        });
    }
}

/// One named check.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Expect {
    pub name: String,
    pub check: Check,
}

/// How a namespace of the checker relates to a reference namespace link.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    Same,
    Differs,
}

/// Mount propagation as mountinfo(5) shows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Propagation {
    Private,
    Shared,
    Slave,
}

/// A syscall the checker makes to observe its effect (seccomp, caps, ...).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "call", rename_all = "snake_case")]
pub enum Probe {
    /// mkdir(path, 0755); a created directory is removed again.
    Mkdir { path: String },
    /// getpgid(pid)
    Getpgid { pid: i32 },
    /// chown(path, uid, gid)
    Chown { path: String, uid: u32, gid: u32 },
    /// sethostname(name)
    Sethostname { name: String },
    /// bind a TCP socket to 127.0.0.1:port (needs a network namespace with lo up
    /// or down; binding does not need the interface up).
    BindTcp { port: u16 },
    /// open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644) and write a byte.
    WriteFile { path: String },
    /// getppid(); cannot fail, so it can only be denied by seccomp.
    Getppid,
    /// getsid(pid)
    Getsid { pid: i32 },
    /// add_key(NULL, NULL, NULL, 0, 0): refused by the kernel (EFAULT)
    /// unless a seccomp filter answers first; it changes nothing.
    AddKey,
    /// faccessat2(AT_FDCWD, "/", F_OK, 0), a system call of Linux 5.8
    /// (number 439 on x86-64): succeeds unless a filter answers.
    Faccessat2,
}

/// The checks the checker knows how to run.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Check {
    /// argv equals `args` exactly.
    Args { args: Vec<String> },
    /// Environment variable `var` has `value`, or is unset when `None`.
    Env { var: String, value: Option<String> },
    /// The working directory is `path`.
    Cwd { path: String },
    /// Real and effective uid.
    Uid { uid: u32 },
    /// Real and effective gid.
    Gid { gid: u32 },
    /// Supplementary groups, as a set.
    Groups { gids: Vec<u32> },
    /// The process umask.
    Umask { mask: u32 },
    /// A capability set from /proc/self/status (`field` is CapBnd, CapEff, ...).
    CapSet { field: String, mask: u64 },
    /// getrlimit(resource); `u64::MAX` means unlimited.
    Rlimit {
        resource: String,
        soft: u64,
        hard: u64,
    },
    /// A `Name:\tvalue` line of /proc/self/status.
    Status { field: String, value: String },
    /// A file's content, compared after collapsing whitespace runs.
    FileContent { path: String, content: String },
    /// Two files have the same content (e.g. /proc/self/cgroup, /proc/1/cgroup).
    SameContent { path: String, other: String },
    /// /proc/self/ns/`ns` relative to a reference link string or another path.
    Namespace {
        ns: String,
        relation: Relation,
        reference: String,
    },
    /// The topmost mount at `target`.
    Mount {
        target: String,
        fstype: Option<String>,
        options: Vec<String>,
        absent_options: Vec<String>,
        propagation: Option<Propagation>,
    },
    /// Nothing is mounted at `target`.
    NotMounted { target: String },
    /// A file reads empty, or a directory lists empty.
    Masked { path: String },
    /// The filesystem holding `path` is read-only (statvfs ST_RDONLY).
    ReadOnly { path: String },
    /// A file can be created in directory `path`.
    Writable { path: String },
    /// A node's type (c, b, p, d, f), device numbers, mode and owner.
    Node {
        path: String,
        node_type: char,
        major: Option<u64>,
        minor: Option<u64>,
        mode: Option<u32>,
        uid: Option<u32>,
        gid: Option<u32>,
    },
    /// A symlink's target.
    Symlink { path: String, target: String },
    /// open(path) for reading or writing succeeds, or fails with `errno`.
    Open {
        path: String,
        write: bool,
        errno: Option<i32>,
    },
    /// A probe succeeds, or fails with `errno`.
    Syscall { probe: Probe, errno: Option<i32> },
    /// A forked child making the probe is killed by `signal`.
    KilledBy { probe: Probe, signal: i32 },
    /// A cgroup interface file of the checker's own cgroup, v1 or v2,
    /// whichever the container sees.
    Cgroup {
        v1_controller: String,
        v1_file: String,
        v1_value: String,
        v2_file: String,
        v2_value: String,
    },
    /// Every line of /proc/self/cgroup names the root cgroup `/`.
    CgroupNsRoot,
    /// At least one cgroup or cgroup2 mount is visible, and all are read-only.
    CgroupMountsReadOnly,
    /// isatty(fd) is `tty`.
    Tty { fd: i32, tty: bool },
    /// The terminal on stdin has this size.
    WinSize { rows: u16, cols: u16 },
    /// getpid() returns `pid`.
    Pid { pid: i32 },
}
