//! What can go wrong while measuring.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("cannot start `{command}`: {source}")]
    Spawn {
        command: String,
        source: std::io::Error,
    },
    #[error("`{command}` failed with {status}\n{output}")]
    Failed {
        command: String,
        status: std::process::ExitStatus,
        output: String,
    },
    #[error("{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{what}: {source}")]
    Sys {
        what: String,
        source: std::io::Error,
    },
    #[error("pid file {} holds {content:?}, not a pid", path.display())]
    BadPid { path: PathBuf, content: String },
    #[error("container {id}: /bin/true exited with {status}, not 0")]
    Workload { id: String, status: String },
    #[error("container {id}: still running after {secs} s")]
    Hung { id: String, secs: u64 },
    #[error("{0}")]
    ForeignAgentvm(String),
    #[error("CRI: {0}")]
    Cri(String),
    #[error("container {id}: not running {secs} s after `start`")]
    NotRunning { id: String, secs: u64 },
    /// A microVM round that failed, with what its VM showed then.
    #[error("{source}\n{detail}")]
    Diagnosed {
        source: Box<BenchError>,
        detail: String,
    },
}

impl BenchError {
    /// The last OS error, for a failed system call.
    pub fn last_os(what: impl Into<String>) -> BenchError {
        BenchError::Sys {
            what: what.into(),
            source: std::io::Error::last_os_error(),
        }
    }
}
