//! The last step before a container process's exec, run inside the
//! container by libcontainer's init (the `Executor` seam).

use std::collections::HashMap;

use caps::{CapSet, CapsHashSet};
use libcontainer::capabilities::CapabilityExt;
use libcontainer::workload::default::DefaultExecutor;
use libcontainer::workload::{
    Executor, ExecutorError, ExecutorSetEnvsError, ExecutorValidationError,
};
use oci_spec::runtime::{Capability, LinuxSeccomp, Process, Spec};

use super::cgroups::JoinCgroups;
use super::notify::NotifyFdSender;

/// Starts the workload:
/// - gives it every signal at its default disposition and none blocked
///   (see [`reset_signals`]);
/// - for `exec`, installs the container's seccomp profile, which
///   libcontainer leaves out of an exec'd process's spec, so that `exec`
///   never runs with fewer restrictions than the container's init.
///   Installing a filter needs CAP_SYS_ADMIN or no_new_privs. As runc
///   without no_new_privs, the filter goes on while the process still
///   holds CAP_SYS_ADMIN and its own capabilities are set after it (see
///   [`CapsAfterSeccomp`]); a process that has neither even so gets
///   no_new_privs (stricter than runc, never weaker);
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
    /// The process's own capabilities, set once its seccomp filter is on.
    pub caps_after_seccomp: Option<CapsAfterSeccomp>,
}

/// runc's order for an `exec` without no_new_privs under a seccomp profile:
/// the filter goes on while the process still holds CAP_SYS_ADMIN, and its
/// capabilities are set after it.
///
/// libcontainer's tenant sets the process's capabilities before the
/// executor runs, and installing a filter needs CAP_SYS_ADMIN or
/// no_new_privs. Setting no_new_privs instead (what this tier did) kept the
/// filter but broke every set-uid program in `docker exec`, whose
/// processes never ask for no_new_privs: `sudo` in `docker exec -u 1000`
/// failed where runc runs it. So [`CapsAfterSeccomp::plan`] hands
/// libcontainer the process with CAP_SYS_ADMIN added to its effective and
/// permitted sets (never to the bounding, inheritable or ambient sets), and
/// [`Workload`] sets the process's own sets right after the filter, before
/// the exec.
#[derive(Clone, Debug, PartialEq)]
pub struct CapsAfterSeccomp {
    effective: CapsHashSet,
    /// `None`: libcontainer leaves the permitted set as it is, or the
    /// process's own already holds CAP_SYS_ADMIN.
    permitted: Option<CapsHashSet>,
}

impl CapsAfterSeccomp {
    /// For a process about to get a seccomp filter: when it would have
    /// neither CAP_SYS_ADMIN nor no_new_privs, adds CAP_SYS_ADMIN to its
    /// effective and permitted sets and returns the sets to restore.
    pub fn plan(process: &mut Process) -> Option<CapsAfterSeccomp> {
        if process.no_new_privileges() == Some(true) {
            return None;
        }
        let mut caps = process.capabilities().clone()?;
        // Without an effective set libcontainer leaves the process every
        // permitted capability, CAP_SYS_ADMIN included.
        let mut effective = caps.effective().clone()?;
        if effective.contains(&Capability::SysAdmin) {
            return None;
        }
        let restore = CapsAfterSeccomp {
            effective: to_set(&effective),
            permitted: caps
                .permitted()
                .as_ref()
                .filter(|p| !p.contains(&Capability::SysAdmin))
                .map(to_set),
        };
        effective.insert(Capability::SysAdmin);
        caps.set_effective(Some(effective));
        if let Some(mut permitted) = caps.permitted().clone() {
            permitted.insert(Capability::SysAdmin);
            caps.set_permitted(Some(permitted));
        }
        process.set_capabilities(Some(caps));
        Some(restore)
    }

    /// Sets the process's own sets: effective first, as libcontainer does,
    /// since it must stay within the permitted one.
    fn apply(&self) -> Result<(), caps::errors::CapsError> {
        caps::set(None, CapSet::Effective, &self.effective)?;
        if let Some(permitted) = &self.permitted {
            caps::set(None, CapSet::Permitted, permitted)?;
        }
        Ok(())
    }
}

fn to_set(caps: &oci_spec::runtime::Capabilities) -> CapsHashSet {
    caps.iter().map(CapabilityExt::to_cap).collect()
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
            if let Some(caps) = &self.caps_after_seccomp {
                caps.apply()
                    .map_err(|e| ExecutorError::Other(format!("unable to apply caps: {e}")))?;
            }
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

    use caps::{Capability as Cap, CapsHashSet};
    use oci_spec::runtime::{Capability, LinuxCapabilitiesBuilder, Process};

    use super::{look_path, CapsAfterSeccomp};

    fn process(effective: &[Capability], permitted: Option<&[Capability]>) -> Process {
        let default = [Capability::Chown, Capability::Kill];
        let mut caps = LinuxCapabilitiesBuilder::default()
            .bounding(
                default
                    .into_iter()
                    .collect::<oci_spec::runtime::Capabilities>(),
            )
            .effective(
                effective
                    .iter()
                    .copied()
                    .collect::<oci_spec::runtime::Capabilities>(),
            )
            .build()
            .unwrap();
        caps.set_permitted(permitted.map(|p| p.iter().copied().collect()));
        let mut p = Process::default();
        p.set_no_new_privileges(None);
        p.set_capabilities(Some(caps));
        p
    }

    #[test]
    fn the_filter_goes_on_before_the_capabilities_without_no_new_privs() {
        let default = [Capability::Chown, Capability::Kill];
        let mut p = process(&default, Some(&default));
        let before = p.capabilities().clone().unwrap();
        let plan = CapsAfterSeccomp::plan(&mut p).expect("a plan");
        let caps = p.capabilities().clone().unwrap();
        // libcontainer leaves CAP_SYS_ADMIN in the effective and permitted
        // sets, never in the bounding one (nor inheritable or ambient).
        for set in [caps.effective(), caps.permitted()] {
            let set = set.clone().unwrap();
            assert!(set.contains(&Capability::SysAdmin));
            assert_eq!(set.len(), 3);
        }
        assert_eq!(caps.bounding(), before.bounding());
        assert_eq!(caps.inheritable(), before.inheritable());
        assert_eq!(caps.ambient(), before.ambient());
        // What is set after the filter is the process's own.
        let own: CapsHashSet = [Cap::CAP_CHOWN, Cap::CAP_KILL].into_iter().collect();
        assert_eq!(
            plan,
            CapsAfterSeccomp {
                effective: own.clone(),
                permitted: Some(own),
            }
        );
    }

    #[test]
    fn no_plan_when_the_filter_can_go_on_anyway() {
        // no_new_privs: the filter needs no CAP_SYS_ADMIN.
        let mut p = process(&[Capability::Chown], None);
        p.set_no_new_privileges(Some(true));
        let before = p.clone();
        assert_eq!(CapsAfterSeccomp::plan(&mut p), None);
        assert_eq!(p, before);
        // The process keeps CAP_SYS_ADMIN itself.
        let mut p = process(&[Capability::SysAdmin], None);
        assert_eq!(CapsAfterSeccomp::plan(&mut p), None);
        // No effective set: libcontainer leaves it as it is, full.
        let mut p = Process::default();
        p.set_capabilities(Some(LinuxCapabilitiesBuilder::default().build().unwrap()));
        assert_eq!(CapsAfterSeccomp::plan(&mut p), None);
        // `false` is no field at all (runc).
        let mut p = process(&[Capability::Chown], None);
        p.set_no_new_privileges(Some(false));
        assert!(CapsAfterSeccomp::plan(&mut p).is_some());
    }

    #[test]
    fn a_permitted_set_with_sys_admin_or_none_is_left_alone() {
        let mut p = process(&[Capability::Chown], None);
        let plan = CapsAfterSeccomp::plan(&mut p).unwrap();
        assert_eq!(plan.permitted, None);
        assert!(p.capabilities().clone().unwrap().permitted().is_none());
        let mut p = process(
            &[Capability::Chown],
            Some(&[Capability::Chown, Capability::SysAdmin]),
        );
        let plan = CapsAfterSeccomp::plan(&mut p).unwrap();
        assert_eq!(plan.permitted, None);
    }

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
