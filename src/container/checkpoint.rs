//! `checkpoint` in the container tier: libcontainer's CRIU dump, with
//! runc's refusals and runc's words when CRIU fails.
//!
//! What runc 1.1 does and this follows: a created or stopped container is
//! refused (`Container cannot be checkpointed in created state`); the
//! images (and CRIU's `dump.log`) go to `--image-path`; without
//! `--leave-running` CRIU kills the processes after the dump and the
//! container is deleted; a CRIU failure leaves the container running and
//! reads `criu failed: ...` with the log file's name.

use std::path::PathBuf;

use libcontainer::container::{CheckpointOptions, ContainerStatus};

use super::{load, status_str, ContainerError};
use crate::context::Context;
use crate::tier::{CgroupsMode, CheckpointRequest};

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    /// runc's words (`checkpoint.go`), capital letter included.
    #[error("Container cannot be checkpointed in {0} state")]
    State(&'static str),
    #[error("checkpoint of container {0} under an egress policy is not supported yet: the router's namespaces would have to be in the images")]
    Egress(String),
    /// `message` starts `criu failed: ` as runc's does (rust-criu's own
    /// words for a failed dump; added when a step before CRIU failed).
    #[error("{message}\nlog file: {}", log.display())]
    Criu { message: String, log: PathBuf },
}

fn cg_mode(mode: CgroupsMode) -> rust_criu::CgMode {
    match mode {
        CgroupsMode::Soft => rust_criu::CgMode::SOFT,
        CgroupsMode::Full => rust_criu::CgMode::FULL,
        CgroupsMode::Strict => rust_criu::CgMode::STRICT,
        CgroupsMode::Ignore => rust_criu::CgMode::IGNORE,
    }
}

pub fn checkpoint(ctx: &Context, id: &str, req: &CheckpointRequest) -> Result<(), ContainerError> {
    let mut container = load(ctx, id)?;
    match container.status() {
        ContainerStatus::Running => {}
        status => return Err(CheckpointError::State(status_str(status)).into()),
    }
    if super::egress::in_force(&container.root) {
        return Err(CheckpointError::Egress(id.to_string()).into());
    }
    let opts = CheckpointOptions {
        ext_unix_sk: req.ext_unix_sk,
        file_locks: req.file_locks,
        image_path: req.image_path.clone(),
        leave_running: req.leave_running,
        shell_job: req.shell_job,
        tcp_established: req.tcp_established,
        work_path: req.work_path.clone(),
        manage_cgroups_mode: cg_mode(req.cgroups_mode),
        link_remap: false,
    };
    let log = req
        .work_path
        .as_ref()
        .unwrap_or(&req.image_path)
        .join("dump.log");
    container
        .checkpoint(&opts)
        .map_err(|e| CheckpointError::Criu {
            message: runc_words(&super::lc_error(e).to_string()),
            log,
        })?;
    Ok(())
}

/// A failed checkpoint's message as runc starts it: `criu failed: `.
fn runc_words(message: &str) -> String {
    match message.starts_with("criu failed: ") {
        true => message.to_string(),
        false => format!("criu failed: {message}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_in_runc_words() {
        assert_eq!(
            CheckpointError::State("created").to_string(),
            "Container cannot be checkpointed in created state"
        );
        assert_eq!(
            runc_words("criu failed: type \"DUMP\" errno 0"),
            "criu failed: type \"DUMP\" errno 0"
        );
        assert_eq!(
            runc_words("criu version 31600 is too old"),
            "criu failed: criu version 31600 is too old"
        );
        let e = CheckpointError::Criu {
            message: runc_words("x"),
            log: PathBuf::from("/i/dump.log"),
        };
        assert_eq!(e.to_string(), "criu failed: x\nlog file: /i/dump.log");
    }

    #[test]
    fn cgroups_modes_as_runc_names_them() {
        for (name, mode) in [
            ("soft", CgroupsMode::Soft),
            ("full", CgroupsMode::Full),
            ("strict", CgroupsMode::Strict),
            ("ignore", CgroupsMode::Ignore),
        ] {
            assert_eq!(name.parse::<CgroupsMode>(), Ok(mode));
        }
        assert!("props".parse::<CgroupsMode>().is_err());
        assert!(matches!(
            cg_mode(CgroupsMode::Soft),
            rust_criu::CgMode::SOFT
        ));
    }
}
