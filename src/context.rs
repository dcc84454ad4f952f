//! What every stateful command needs: the state root, the loaded config and
//! the global flags.

use std::os::unix::fs::DirBuilderExt;
use std::path::{Path, PathBuf};

use anyhow::Context as _;

use crate::cli::GlobalOpts;
use crate::config::{Config, Isolation};

pub struct Context {
    pub root: PathBuf,
    pub config: Config,
    pub isolation_flag: Option<Isolation>,
    pub systemd_cgroup: bool,
    /// The --config path, passed on to the microvm supervisor.
    pub config_path: Option<PathBuf>,
    pub log: Option<PathBuf>,
    pub log_json: bool,
}

impl Context {
    pub fn new(global: &GlobalOpts) -> anyhow::Result<Context> {
        let config = Config::load(global.config.as_deref())?;
        let root = absolute(&global.root)?;
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(&root)
            .with_context(|| format!("cannot create state root {}", root.display()))?;
        Ok(Context {
            root,
            config,
            isolation_flag: global.isolation,
            systemd_cgroup: global.systemd_cgroup,
            config_path: global.config.as_ref().map(|p| absolute(p)).transpose()?,
            log: global.log.as_ref().map(|p| absolute(p)).transpose()?,
            log_json: global.log_format == crate::cli::LogFormat::Json,
        })
    }

    /// The state directory of one container (it may not exist).
    pub fn container_dir(&self, id: &str) -> PathBuf {
        self.root.join(id)
    }
}

/// Makes a path absolute against the current directory without resolving
/// symlinks (as runc does with `--root` and `--bundle`).
pub fn absolute(path: &Path) -> anyhow::Result<PathBuf> {
    if path.is_absolute() {
        return Ok(path.to_path_buf());
    }
    let cwd = std::env::current_dir().context("cannot read the current directory")?;
    Ok(cwd.join(path))
}
