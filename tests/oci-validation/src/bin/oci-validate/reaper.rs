//! The harness is a child subreaper, as containerd's shims are: container
//! processes whose runtime command exited are reparented to it, and it reaps
//! them promptly, so a container's end is not delayed by whoever is pid 1.
//!
//! Children the harness spawned itself are registered and left to their
//! owners (`std::process::Child::wait`).

use std::collections::BTreeSet;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{bail, Result};
use nix::sys::wait::{waitpid, WaitPidFlag};
use nix::unistd::Pid;

static OWN: Mutex<BTreeSet<u32>> = Mutex::new(BTreeSet::new());

/// Makes this process the reaper of its orphaned descendants.
pub fn become_subreaper() -> Result<()> {
    // SAFETY: PR_SET_CHILD_SUBREAPER takes an integer flag and no pointers.
    let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    if rc != 0 {
        bail!(
            "prctl(PR_SET_CHILD_SUBREAPER): {}",
            std::io::Error::last_os_error()
        );
    }
    Ok(())
}

fn own() -> std::sync::MutexGuard<'static, BTreeSet<u32>> {
    OWN.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Marks a spawned child as waited for by its owner.
pub fn register(pid: u32) {
    own().insert(pid);
}

/// Forgets a child once its owner has waited for it.
pub fn unregister(pid: u32) {
    own().remove(&pid);
}

static LAST: Mutex<Option<Instant>> = Mutex::new(None);

/// Reaps every zombie child that nobody else waits for (at most every 20 ms).
pub fn reap_orphans() {
    {
        let mut last = LAST
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if last.is_some_and(|t| t.elapsed() < Duration::from_millis(20)) {
            return;
        }
        *last = Some(Instant::now());
    }
    let me = std::process::id();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return;
    };
    for e in entries.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // "pid (comm) S ppid ...": comm may hold spaces, so split after ')'.
        let mut rest = stat
            .rsplit_once(')')
            .map(|(_, r)| r)
            .unwrap_or("")
            .split_whitespace();
        let (state, ppid) = (rest.next(), rest.next().and_then(|p| p.parse::<u32>().ok()));
        if state != Some("Z") || ppid != Some(me) || own().contains(&pid) {
            continue;
        }
        if let Ok(raw) = i32::try_from(pid) {
            // The zombie is ours and unclaimed; its status is of no interest.
            let _ = waitpid(Pid::from_raw(raw), Some(WaitPidFlag::WNOHANG));
        }
    }
}

/// Sleeps a little, reaping orphans first: the body of every polling loop.
pub fn tick(d: Duration) {
    reap_orphans();
    std::thread::sleep(d);
}
