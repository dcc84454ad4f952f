//! cgroup behaviour of runc that libcontainer 0.7 leaves out.
//!
//! - `linux.resources.memory.disableOOMKiller`: libcontainer always hands
//!   its cgroup manager `disable_oom_killer: false`, so the v1 memory
//!   controller writes `0` to `memory.oom_control`. runc writes `1` there
//!   when the spec asks for it (and nothing on cgroup v2, which has no such
//!   switch), at create and again at every `update`.

use std::io;
use std::path::PathBuf;

use libcontainer::container::Container;
use oci_spec::runtime::Spec;

#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    #[error("cannot write {path}: {source}")]
    Write { path: PathBuf, source: io::Error },
}

/// v1's switch of the OOM killer.
const OOM_CONTROL: &str = "memory.oom_control";

/// Whether the spec asks for the OOM killer to be disabled.
pub fn oom_killer_disabled(spec: &Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.disable_oom_killer())
        .unwrap_or(false)
}

/// Disables the OOM killer of the container's v1 memory cgroup when the spec
/// asks for it, as runc does. On a host without a v1 memory hierarchy
/// nothing is written (runc ignores the setting on cgroup v2).
pub fn apply_oom_killer(container: &Container, spec: &Spec) -> Result<(), CgroupError> {
    if !oom_killer_disabled(spec) {
        return Ok(());
    }
    let Some(dir) = super::cgroup_dir(container, "memory") else {
        return Ok(());
    };
    let path = dir.join(OOM_CONTROL);
    if !path.exists() {
        // The unified hierarchy: no oom_control.
        return Ok(());
    }
    std::fs::write(&path, "1").map_err(|source| CgroupError::Write { path, source })
}

/// Whether the container's v1 memory cgroup has its OOM killer disabled
/// now; `update` passes this on, so that it keeps what `create` set (runc
/// rewrites the setting from the container's config at every update).
pub fn oom_killer_is_disabled(container: &Container) -> bool {
    super::cgroup_dir(container, "memory")
        .and_then(|dir| std::fs::read_to_string(dir.join(OOM_CONTROL)).ok())
        .is_some_and(|text| text.lines().any(|l| l.trim() == "oom_kill_disable 1"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(memory: serde_json::Value) -> Spec {
        let mut v = serde_json::to_value(Spec::default()).expect("default spec as JSON");
        v["linux"]["resources"]["memory"] = memory;
        serde_json::from_value(v).expect("spec from JSON")
    }

    #[test]
    fn oom_killer_disabled_only_when_asked() {
        assert!(oom_killer_disabled(&spec(
            serde_json::json!({"disableOOMKiller": true})
        )));
        assert!(!oom_killer_disabled(&spec(
            serde_json::json!({"disableOOMKiller": false})
        )));
        assert!(!oom_killer_disabled(&spec(
            serde_json::json!({"limit": 1048576})
        )));
        assert!(!oom_killer_disabled(&Spec::default()));
    }
}
