//! The last step before a container process's exec, run inside the
//! container by libcontainer's init (the `Executor` seam).

use std::collections::HashMap;

use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::{LinuxSeccomp, Spec};

/// Starts the workload:
/// - gives it the default SIGPIPE disposition (agentvm itself ignores
///   SIGPIPE, and an ignored disposition would survive the exec);
/// - for `exec`, installs the container's seccomp profile, which
///   libcontainer leaves out of an exec'd process's spec, so that `exec`
///   never runs with fewer restrictions than the container's init.
///   Installing a filter needs CAP_SYS_ADMIN or no_new_privs: a process with
///   neither gets no_new_privs (stricter than runc, never weaker).
#[derive(Clone, Default)]
pub struct Workload {
    pub seccomp: Option<LinuxSeccomp>,
}

impl Executor for Workload {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        // SAFETY: resetting a disposition to SIG_DFL has no preconditions.
        unsafe { libc::signal(libc::SIGPIPE, libc::SIG_DFL) };
        if let Some(seccomp) = &self.seccomp {
            let has_admin = caps::has_cap(
                None,
                caps::CapSet::Effective,
                caps::Capability::CAP_SYS_ADMIN,
            )
            .unwrap_or(false);
            if !has_admin {
                // SAFETY: prctl(PR_SET_NO_NEW_PRIVS, 1) takes no pointers.
                let rc = unsafe { libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) };
                if rc != 0 {
                    return Err(ExecutorError::Other(format!(
                        "cannot set no_new_privs: {}",
                        std::io::Error::last_os_error()
                    )));
                }
            }
            libcontainer::seccomp::initialize_seccomp(seccomp)
                .map_err(|e| ExecutorError::Other(format!("cannot load seccomp profile: {e}")))?;
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        DefaultExecutor {}.validate(spec)
    }

    fn setup_envs(&self, envs: HashMap<String, String>) -> Result<(), ExecutorSetEnvsError> {
        DefaultExecutor {}.setup_envs(envs)
    }
}
