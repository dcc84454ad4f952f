//! Signal names as runc accepts them: `TERM`, `SIGTERM`, `15`, `sigterm`.

use nix::sys::signal::Signal;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum SignalError {
    #[error("unknown signal {0:?}")]
    Unknown(String),
}

pub fn parse(s: &str) -> Result<Signal, SignalError> {
    let unknown = || SignalError::Unknown(s.to_string());
    if let Ok(n) = s.parse::<i32>() {
        return Signal::try_from(n).map_err(|_| unknown());
    }
    let upper = s.to_ascii_uppercase();
    let name = if upper.starts_with("SIG") {
        upper
    } else {
        format!("SIG{upper}")
    };
    name.parse::<Signal>().map_err(|_| unknown())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_runc_spellings() {
        assert_eq!(parse("TERM"), Ok(Signal::SIGTERM));
        assert_eq!(parse("SIGKILL"), Ok(Signal::SIGKILL));
        assert_eq!(parse("9"), Ok(Signal::SIGKILL));
        assert_eq!(parse("hup"), Ok(Signal::SIGHUP));
        assert_eq!(parse("sigusr1"), Ok(Signal::SIGUSR1));
    }

    #[test]
    fn rejects_unknown() {
        assert_eq!(parse("FOO"), Err(SignalError::Unknown("FOO".into())));
        assert!(parse("0").is_err());
        assert!(parse("99").is_err());
        assert!(parse("").is_err());
    }
}
