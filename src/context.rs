//! What every stateful command needs: the state root, the loaded config and
//! the global flags that the tiers act on. The command line fills it in
//! (`cli::context`); the tiers and the guest agent only read it.

use std::path::{Path, PathBuf};

use crate::config::{Config, Isolation};

pub struct Context {
    pub root: PathBuf,
    pub config: Config,
    pub isolation_flag: Option<Isolation>,
    /// `--egress`, as given.
    pub egress_flag: Option<String>,
    pub systemd_cgroup: bool,
    /// The --config path, passed on to the microvm supervisor.
    pub config_path: Option<PathBuf>,
    pub log: Option<PathBuf>,
    pub log_json: bool,
}

impl Context {
    /// The state directory of one container (it may not exist).
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }
}

/// Makes a path absolute against the current directory without resolving
/// symlinks (as runc does with `--root` and `--bundle`).
pub fn absolute(path: &Path) -> std::io::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    Ok(std::env::current_dir()?.join(path))
}
