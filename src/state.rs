//! Per-container state under `--root` and the locks that keep concurrent
//! commands on the same id from interleaving.
//!
//! Layout: `<root>/<id>/` holds the tier's own state (for the container tier,
//! libcontainer's `state.json` and `config.json`) plus `agentvm.json`, which
//! records the tier so later commands dispatch to the right one.
//!
//! Locking: commands that change whether a container exists (`create`) hold
//! an exclusive lock on the root; commands on one container lock its
//! directory, exclusively when they change it, shared when they only read.
//! `delete` holds the directory's exclusive lock while removing it, so a
//! command that was waiting finds the container gone.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use crate::config::Isolation;

pub const RECORD_FILE: &str = "agentvm.json";

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("container {0} does not exist")]
    NotFound(String),
    #[error("cannot lock {path}: {source}")]
    Lock {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("cannot read {path}: {source}")]
    Read {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("corrupt state file {path}: {source}")]
    Corrupt {
        path: PathBuf,
        source: serde_json::Error,
    },
    #[error("cannot write {path}: {source}")]
    Write {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// An flock(2) held on a directory until dropped.
pub struct DirLock {
    file: File,
}

impl Drop for DirLock {
    fn drop(&mut self) {
        // Unlock explicitly: the lock belongs to the open file description,
        // which a container's init (cloned while we held it, waiting for
        // `start` before its exec closes the descriptor) shares with us.
        // Closing our copy alone would leave the lock held.
        // SAFETY: flock on a descriptor we own; no memory is passed.
        unsafe { libc::flock(self.file.as_raw_fd(), libc::LOCK_UN) };
    }
}

#[derive(Clone, Copy)]
pub enum LockMode {
    Shared,
    Exclusive,
}

impl DirLock {
    pub fn acquire(path: &Path, mode: LockMode) -> std::io::Result<DirLock> {
        let file = File::open(path)?;
        let op = match mode {
            LockMode::Shared => libc::LOCK_SH,
            LockMode::Exclusive => libc::LOCK_EX,
        };
        loop {
            // SAFETY: flock on a descriptor we own; no memory is passed.
            let rc = unsafe { libc::flock(file.as_raw_fd(), op) };
            if rc == 0 {
                return Ok(DirLock { file });
            }
            let err = std::io::Error::last_os_error();
            if err.kind() != std::io::ErrorKind::Interrupted {
                return Err(err);
            }
        }
    }
}

/// Locks the directory of an existing container. Fails with `NotFound` if
/// the container does not exist, including when it was deleted while we
/// waited for the lock.
pub fn lock_container(root: &Path, id: &str, mode: LockMode) -> Result<DirLock, StateError> {
    let dir = root.join(id);
    let lock = match DirLock::acquire(&dir, mode) {
        Ok(l) => l,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            return Err(StateError::NotFound(id.to_string()))
        }
        Err(source) => return Err(StateError::Lock { path: dir, source }),
    };
    // The directory may have been removed between open and flock.
    if !dir.join(RECORD_FILE).exists() && !dir.join("state.json").exists() {
        drop(lock);
        return Err(StateError::NotFound(id.to_string()));
    }
    Ok(lock)
}

pub fn lock_root(root: &Path) -> Result<DirLock, StateError> {
    DirLock::acquire(root, LockMode::Exclusive).map_err(|source| StateError::Lock {
        path: root.to_path_buf(),
        source,
    })
}

/// What agentvm itself records about a container, beside the tier's state.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    pub isolation: Isolation,
    /// Start time (clock ticks since boot) of the init process, to tell it
    /// from an unrelated process that later got the same pid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_start_time: Option<u64>,
}

impl Record {
    pub fn load(root: &Path, id: &str) -> Result<Option<Record>, StateError> {
        let path = root.join(id).join(RECORD_FILE);
        let text = match std::fs::read(&path) {
            Ok(t) => t,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(source) => return Err(StateError::Read { path, source }),
        };
        serde_json::from_slice(&text)
            .map(Some)
            .map_err(|source| StateError::Corrupt { path, source })
    }

    pub fn save(&self, root: &Path, id: &str) -> Result<(), StateError> {
        write_json_atomic(&root.join(id).join(RECORD_FILE), self)
    }
}

/// Writes `value` as JSON to `path` atomically (a temp file of this
/// process beside it, then rename), so readers never see half a file.
pub fn write_json_atomic<T: Serialize>(path: &Path, value: &T) -> Result<(), StateError> {
    let data = serde_json::to_vec(value).map_err(|source| StateError::Corrupt {
        path: path.to_path_buf(),
        source,
    })?;
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}", std::process::id()));
    std::fs::write(&tmp, data)
        .and_then(|_| std::fs::rename(&tmp, path))
        .map_err(|source| StateError::Write {
            path: path.to_path_buf(),
            source,
        })
}

/// True when `pid` no longer runs: absent, a zombie, or dead.
pub fn process_gone(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Ok(s) => s
            .rfind(')')
            .and_then(|i| s[i + 1..].split_whitespace().next())
            .is_none_or(|st| st == "Z" || st == "X"),
        Err(_) => true,
    }
}

/// The tier a container was created in.
pub fn tier_of(root: &Path, id: &str) -> Result<Isolation, StateError> {
    match Record::load(root, id)? {
        Some(r) => Ok(r.isolation),
        None if root.join(id).join("state.json").exists() => Ok(Isolation::Container),
        None => Err(StateError::NotFound(id.to_string())),
    }
}

/// Start time of a process in clock ticks since boot (field 22 of
/// /proc/PID/stat), or None if it does not exist.
pub fn process_start_time(pid: i32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name may contain spaces and parentheses: skip past the last ')'.
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(19)?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_time_of_self() {
        let me = std::process::id() as i32;
        assert!(process_start_time(me).is_some());
        assert_eq!(process_start_time(me), process_start_time(me));
        assert_eq!(process_start_time(i32::MAX), None);
    }

    #[test]
    fn record_round_trip_and_missing() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir(root.path().join("c1")).unwrap();
        assert!(Record::load(root.path(), "c1").unwrap().is_none());
        let r = Record {
            isolation: Isolation::Container,
            init_start_time: Some(42),
        };
        r.save(root.path(), "c1").unwrap();
        let back = Record::load(root.path(), "c1").unwrap().unwrap();
        assert_eq!(back.isolation, Isolation::Container);
        assert_eq!(back.init_start_time, Some(42));
    }

    #[test]
    fn lock_missing_container_is_not_found() {
        let root = tempfile::tempdir().unwrap();
        assert!(matches!(
            lock_container(root.path(), "nope", LockMode::Shared),
            Err(StateError::NotFound(_))
        ));
    }
}
