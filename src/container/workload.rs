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

    /// Looks the executable up as runc 1.1 does before `create` returns
    /// (see [`look_path`]): a missing or unrunnable one fails `create` in
    /// runc's words, which Docker, Podman and containerd read to give exit
    /// codes 127 and 126.
    fn validate(&self, spec: &Spec) -> Result<(), ExecutorValidationError> {
        let process = spec.process().as_ref().ok_or_else(|| {
            ExecutorValidationError::ArgValidationError("spec did not contain process".into())
        })?;
        let Some(name) = process.args().as_ref().and_then(|a| a.first()) else {
            return Ok(());
        };
        let path = process
            .env()
            .as_ref()
            .and_then(|env| env.iter().find_map(|v| v.strip_prefix("PATH=")));
        look_path(name, path).map_err(ExecutorValidationError::ArgValidationError)
    }

    fn setup_envs(&self, envs: HashMap<String, String>) -> Result<(), ExecutorSetEnvsError> {
        DefaultExecutor {}.setup_envs(envs)
    }
}

/// Finds the workload's executable the way runc 1.1 does (Go's
/// `exec.LookPath`, run in the container after `chdir` to its cwd), with
/// its messages:
/// - a name with a `/` is taken as it is: `exec: "NAME": stat NAME: no such
///   file or directory` when it does not exist;
/// - any other name is searched in the process's `PATH` (an empty entry is
///   the cwd; no `PATH` searches nothing): `exec: "NAME": executable file
///   not found in $PATH`;
/// - a directory or a file with no execute bit: `exec: "NAME": permission
///   denied`.
///
/// libcontainer's own check differs from runc's: it refuses a name without
/// a `/` when the process has no `PATH`, and a file that only its owner or
/// group may execute (it tests the "other" bit alone), and its messages do
/// not have the words callers look for.
pub fn look_path(name: &str, path: Option<&str>) -> Result<(), String> {
    fn executable(file: &std::path::Path) -> std::io::Result<bool> {
        use std::os::unix::fs::PermissionsExt;
        let meta = std::fs::metadata(file)?;
        Ok(!meta.is_dir() && meta.permissions().mode() & 0o111 != 0)
    }
    let denied = || format!("exec: {name:?}: permission denied");
    if name.contains('/') {
        return match executable(std::path::Path::new(name)) {
            Ok(true) => Ok(()),
            Ok(false) => Err(denied()),
            Err(e) => Err(format!(
                "exec: {name:?}: stat {name}: {}",
                super::hooks::go_errno(e)
            )),
        };
    }
    let found = path
        .filter(|p| !p.is_empty())
        .into_iter()
        .flat_map(|p| p.split(':'))
        .map(|dir| std::path::Path::new(if dir.is_empty() { "." } else { dir }).join(name))
        .any(|file| executable(&file).unwrap_or(false));
    if found {
        Ok(())
    } else {
        Err(format!(
            "exec: {name:?}: executable file not found in $PATH"
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::look_path;

    #[test]
    fn the_executable_is_looked_up_with_runc_s_messages() {
        let dir = tempfile::tempdir().unwrap();
        let file = |name: &str, mode: u32| {
            let p = dir.path().join(name);
            std::fs::write(&p, "#!/bin/sh\n").unwrap();
            std::fs::set_permissions(&p, std::fs::Permissions::from_mode(mode)).unwrap();
            p.display().to_string()
        };
        let owner_only = file("owner-only", 0o700);
        let plain = file("plain", 0o644);
        let bin = dir.path().display().to_string();

        // By path: runs with any execute bit (libcontainer wanted the
        // "other" bit).
        assert_eq!(look_path(&owner_only, None), Ok(()));
        let missing = format!("{bin}/missing");
        assert_eq!(
            look_path(&missing, None),
            Err(format!(
                "exec: \"{missing}\": stat {missing}: no such file or directory"
            ))
        );
        let below_file = format!("{plain}/x");
        assert_eq!(
            look_path(&below_file, None),
            Err(format!(
                "exec: \"{below_file}\": stat {below_file}: not a directory"
            ))
        );
        assert_eq!(
            look_path(&plain, None),
            Err(format!("exec: \"{plain}\": permission denied"))
        );
        assert_eq!(
            look_path(&bin, None),
            Err(format!("exec: \"{bin}\": permission denied"))
        );

        // By name: searched in PATH, skipping what cannot run.
        let path = format!("/nonexistent:{bin}");
        assert_eq!(look_path("owner-only", Some(&path)), Ok(()));
        let not_found = |name: &str| {
            Err(format!(
                "exec: \"{name}\": executable file not found in $PATH"
            ))
        };
        assert_eq!(look_path("plain", Some(&path)), not_found("plain"));
        assert_eq!(look_path("missing", Some(&path)), not_found("missing"));
        // No PATH, or an empty one, searches nothing (runc, not
        // libcontainer's "PATH environment variable is not set").
        assert_eq!(look_path("owner-only", None), not_found("owner-only"));
        assert_eq!(look_path("owner-only", Some("")), not_found("owner-only"));
        assert_eq!(look_path("", Some(&path)), not_found(""));
    }
}
