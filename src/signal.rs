//! Signals as runc takes them: a name with or without `SIG` in any case
//! (`TERM`, `SIGTERM`, `sigterm`), or a number, passed on as it is —
//! `0` (is the process there?) and the real-time signals included. As in
//! runc, a number the kernel does not know is refused by `kill(2)` itself
//! (EINVAL), not here.

use nix::errno::Errno;
use nix::sys::signal::Signal;
use nix::unistd::Pid;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignalError {
    #[error("unknown signal {0:?}")]
    Unknown(String),
}

/// The signal number `s` names.
pub fn parse(s: &str) -> Result<i32, SignalError> {
    if let Ok(n) = s.parse::<i32>() {
        return Ok(n);
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>()
        .map(|sig| sig as i32)
        .map_err(|_| SignalError::Unknown(s.to_string()))
}

/// `kill(2)` with a raw signal number, which `nix::sys::signal::Signal`
/// cannot hold for 0 or the real-time signals.
pub fn send(pid: Pid, signal: i32) -> Result<(), Errno> {
    // SAFETY: kill(2) takes no pointers; any pid and number is safe to pass
    // (the kernel refuses what it does not accept).
    let rc = unsafe { libc::kill(pid.as_raw(), signal) };
    Errno::result(rc).map(drop)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_runc_spellings() {
        assert_eq!(parse("TERM"), Ok(libc::SIGTERM));
        assert_eq!(parse("SIGKILL"), Ok(libc::SIGKILL));
        assert_eq!(parse("9"), Ok(libc::SIGKILL));
        assert_eq!(parse("hup"), Ok(libc::SIGHUP));
        assert_eq!(parse("sigusr1"), Ok(libc::SIGUSR1));
        assert_eq!(parse("0"), Ok(0));
        assert_eq!(parse("34"), Ok(34));
    }

    #[test]
    fn numbers_go_to_the_kernel() {
        // runc passes any number on; kill(2) says EINVAL.
        assert_eq!(parse("99"), Ok(99));
        assert_eq!(parse("-9"), Ok(-9));
        let me = Pid::this();
        assert_eq!(send(me, 99), Err(Errno::EINVAL));
        assert_eq!(send(me, 0), Ok(()));
    }

    #[test]
    fn rejects_unknown_names() {
        assert_eq!(parse("FOO"), Err(SignalError::Unknown("FOO".into())));
        // As runc 1.1: real-time signals by number only.
        assert!(parse("SIGRTMIN").is_err());
        assert!(parse("").is_err());
    }
}
