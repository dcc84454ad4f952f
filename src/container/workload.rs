//! The last step before a container process's exec, run inside the
//! container by libcontainer's init (the `Executor` seam).

use std::collections::HashMap;

use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::{LinuxSeccomp, Spec};

use super::cgroups::JoinCgroups;
use super::notify::NotifyFdSender;

/// Starts the workload:
/// - gives it every signal at its default disposition and none blocked
///   (see [`reset_signals`]);
/// - for `exec`, installs the container's seccomp profile, which
///   libcontainer leaves out of an exec'd process's spec, so that `exec`
///   never runs with fewer restrictions than the container's init.
///   Installing a filter needs CAP_SYS_ADMIN or no_new_privs: a process with
///   neither gets no_new_privs (stricter than runc, never weaker);
/// - for `exec --cgroup`, moves the process into the sub-cgroups agentvm
///   opened for it.
#[derive(Clone, Default)]
pub struct Workload {
    pub seccomp: Option<LinuxSeccomp>,
    /// `exec --cgroup`: the sub-cgroups the process moves itself into.
    pub join_cgroups: JoinCgroups,
    /// `exec` under a profile with `SCMP_ACT_NOTIFY`: where the notify fd
    /// goes (see [`super::notify`]).
    pub notify: NotifyFdSender,
}

/// Gives the process every signal at its default disposition and an empty
/// signal mask.
///
/// An ignored disposition and the mask survive `execve`, and the container's
/// process is cloned from the `agentvm create` (or `exec`) process, so without
/// this the workload inherits whatever agentvm's invoker left ignored or
/// blocked: SIGPIPE, which agentvm itself ignores; SIGHUP under `nohup`;
/// SIGINT and SIGQUIT in a background job of a script. A shell cannot trap a
/// signal that was ignored when it started (POSIX `trap`), so under `nohup`
/// a workload's `trap ... HUP` was silently void, where runc's workloads
/// never inherit an ignored signal. A blocked one would never arrive at all
/// (runc leaves some blocked; no program expects that).
///
/// For an init this runs after libcontainer installed the container's
/// seccomp filter: under a profile that denies `rt_sigaction` or
/// `rt_sigprocmask` the calls fail and the inherited state stays.
fn reset_signals() {
    for sig in 1..=libc::SIGRTMAX() {
        if sig == libc::SIGKILL || sig == libc::SIGSTOP {
            continue;
        }
        // SAFETY: installing SIG_DFL passes no handler code and no memory;
        // numbers libc reserves for itself only make the call fail (EINVAL).
        unsafe { libc::signal(sig, libc::SIG_DFL) };
    }
    // Unblock only now: a signal pending until here gets its default action,
    // as it would have right after the exec.
    let _ = nix::sys::signal::SigSet::empty().thread_set_mask();
}

impl Executor for Workload {
    fn exec(&self, spec: &Spec) -> Result<(), ExecutorError> {
        self.join_cgroups.join().map_err(|e| {
            ExecutorError::Other(format!("cannot join the --cgroup sub-cgroup: {e}"))
        })?;
        reset_signals();
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
            let notify_fd = libcontainer::seccomp::initialize_seccomp(seccomp)
                .map_err(|e| ExecutorError::Other(format!("cannot load seccomp profile: {e}")))?;
            self.notify.send(notify_fd).map_err(|e| {
                ExecutorError::Other(format!("cannot pass on the seccomp notify fd: {e}"))
            })?;
        }
        DefaultExecutor {}.exec(spec)
    }

    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        // libcontainer's check wants a PATH even for a path like /bin/id,
        // which execvp runs without one; runc runs it (a process file with
        // no env at all is valid). Check such a spec as if PATH were empty.
        let process = spec.process().as_ref();
        let by_path = process
            .and_then(|p| p.args().as_ref())
            .and_then(|a| a.first())
            .is_some_and(|a| a.contains('/'));
        let env = process.and_then(|p| p.env().as_ref());
        let has_path = env.is_some_and(|e| e.iter().any(|v| v.starts_with("PATH=")));
        if by_path && !has_path {
            let mut spec = spec.clone();
            if let Some(p) = spec.process_mut() {
                let mut env = p.env().clone().unwrap_or_default();
                env.push("PATH=".to_string());
                p.set_env(Some(env));
            }
            return DefaultExecutor {}.validate(&spec);
        }
        DefaultExecutor {}.validate(spec)
    }

    fn setup_envs(&self, envs: HashMap<String, String>) -> Result<(), ExecutorSetEnvsError> {
        DefaultExecutor {}.setup_envs(envs)
    }
}
