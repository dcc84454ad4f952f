//! runc's answer to a system call newer than the seccomp profile.
//!
//! A profile lists the system calls its author knew. A program that tries
//! a newer one (glibc's `clone3`, `faccessat2`, `close_range`, ...) expects
//! ENOSYS, "this kernel has no such call", and falls back to an older one;
//! the profile's default action (EPERM, most often) makes it fail instead.
//! runc therefore answers ENOSYS for every system call whose number is
//! above the highest the profile names, unless the default action lets
//! calls through (allow, log, trace) or already is ENOSYS.
//!
//! runc prepends a comparison to the compiled filter. libcontainer builds
//! and loads the filter itself, so the same answer is given here in the
//! profile: an ENOSYS rule naming each system call above the profile's
//! highest that libseccomp knows by name. A number libseccomp has no name
//! for (a kernel newer than libseccomp) still gets the default action.

use libseccomp::ScmpSyscall;
use oci_spec::runtime::{LinuxSeccomp, LinuxSeccompAction, LinuxSyscall};

/// Above any x86-64 system call number libseccomp names (about 460 in
/// 2026), and still cheap to scan.
const SCAN_LIMIT: i32 = 1024;

/// Adds runc's ENOSYS answer to `seccomp` (see the module text); leaves a
/// profile it does not apply to as it is.
pub fn add_rule(seccomp: &mut LinuxSeccomp) {
    if matches!(
        seccomp.default_action(),
        LinuxSeccompAction::ScmpActAllow
            | LinuxSeccompAction::ScmpActLog
            | LinuxSeccompAction::ScmpActTrace
    ) || seccomp.default_errno_ret() == Some(libc::ENOSYS as u32)
    {
        return;
    }
    let rules = seccomp.syscalls().clone().unwrap_or_default();
    let highest = rules
        .iter()
        .flat_map(|r| r.names())
        .filter_map(|n| ScmpSyscall::from_name(n).ok())
        .map(i32::from)
        .filter(|nr| *nr >= 0)
        .max();
    let Some(highest) = highest else {
        return;
    };
    let names: Vec<String> = (highest + 1..SCAN_LIMIT)
        .filter_map(|nr| ScmpSyscall::from(nr).get_name().ok())
        .collect();
    if names.is_empty() {
        return;
    }
    let mut rule = LinuxSyscall::default();
    rule.set_names(names);
    rule.set_action(LinuxSeccompAction::ScmpActErrno);
    rule.set_errno_ret(Some(libc::ENOSYS as u32));
    let mut all = rules;
    all.push(rule);
    seccomp.set_syscalls(Some(all));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn profile(default: &str, errno: Option<u32>, names: &[&str]) -> LinuxSeccomp {
        serde_json::from_value(serde_json::json!({
            "defaultAction": default,
            "defaultErrnoRet": errno,
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": names, "action": "SCMP_ACT_ALLOW"}]
        }))
        .expect("profile")
    }

    fn enosys_names(s: &LinuxSeccomp) -> Vec<String> {
        s.syscalls()
            .iter()
            .flatten()
            .filter(|r| r.errno_ret() == Some(libc::ENOSYS as u32))
            .flat_map(|r| r.names().clone())
            .collect()
    }

    #[test]
    fn calls_above_the_highest_named_get_enosys() {
        // openat2 (437) is the highest named: faccessat2 (439) is newer,
        // clone3 (435) and read (0) are not.
        let mut s = profile("SCMP_ACT_ERRNO", None, &["read", "openat2", "clone3"]);
        add_rule(&mut s);
        let names = enosys_names(&s);
        assert!(names.contains(&"faccessat2".to_string()), "{names:?}");
        assert!(names.contains(&"epoll_pwait2".to_string()), "{names:?}");
        for older in ["openat2", "clone3", "read", "close_range"] {
            assert!(!names.contains(&older.to_string()), "{older}: {names:?}");
        }
        // The profile's own rules are kept, first.
        assert_eq!(s.syscalls().as_ref().map(Vec::len), Some(2));
    }

    #[test]
    fn permissive_or_enosys_defaults_and_empty_profiles_are_left_alone() {
        for (default, errno) in [
            ("SCMP_ACT_ALLOW", None),
            ("SCMP_ACT_LOG", None),
            ("SCMP_ACT_TRACE", None),
            ("SCMP_ACT_ERRNO", Some(libc::ENOSYS as u32)),
        ] {
            let mut s = profile(default, errno, &["read"]);
            let before = s.clone();
            add_rule(&mut s);
            assert_eq!(s, before, "{default} {errno:?}");
        }
        let mut s = profile("SCMP_ACT_KILL", None, &["no_such_call"]);
        let before = s.clone();
        add_rule(&mut s);
        assert_eq!(s, before);
        // A killing default gets the rule too, as in runc.
        let mut s = profile("SCMP_ACT_KILL", None, &["read"]);
        add_rule(&mut s);
        assert!(enosys_names(&s).contains(&"write".to_string()));
    }
}
