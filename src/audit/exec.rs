//! Exec lines: what `agentvm exec` writes, in both tiers.
//!
//! Whoever sees the end of an exec writes its line: the container tier's
//! foreground `exec` (the parent of the process), the microvm tier's relay
//! (told the status by the supervisor), or, for a container-tier `exec
//! --detach`, the command itself right after the start with no exit (the
//! process is handed to the caller, which alone sees its end). An exec
//! that fails to start is written by the command line with its error.
//!
//! Writing is best effort: a full disk or a bad `[audit] path` is a warning
//! in the runtime log, never the failure of the exec.

use std::path::Path;
use std::time::Duration;

use oci_spec::runtime::Process;

use super::{bounded, bounded_argv, Event, Log};

/// The line for an exec of `process`: its argv (bounded), `uid:gid` as the
/// process gives them, its cwd, and how it ended.
pub fn event(
    process: &Process,
    exit: Option<i32>,
    error: Option<&str>,
    duration: Option<Duration>,
) -> Event {
    let user = process.user();
    Event::Exec {
        argv: bounded_argv(process.args().as_deref().unwrap_or_default()),
        user: format!("{}:{}", user.uid(), user.gid()),
        cwd: bounded(&process.cwd().to_string_lossy()),
        exit,
        error: error.map(bounded),
        duration_ms: duration.map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX)),
    }
}

/// Appends `event` of `container` to the audit file at `path`; a failure
/// is logged as a warning and otherwise ignored.
pub fn append_or_warn(path: &Path, container: &str, event: Event) {
    let written = Log::open(path).and_then(|log| log.append(container, event));
    if let Err(e) = written {
        tracing::warn!("container {container}: exec not audited: {e}");
    }
}

/// The message of an error and its causes, as one line.
pub fn error_chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let more = cause.to_string();
        if !text.contains(&more) {
            text.push_str(": ");
            text.push_str(&more);
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::audit::{Record, MAX_ARGS};

    fn process(args: &[&str]) -> Process {
        let mut p = Process::default();
        p.set_args(Some(args.iter().map(|s| s.to_string()).collect()));
        p.set_cwd("/work".into());
        let mut user = p.user().clone();
        user.set_uid(1000);
        user.set_gid(100);
        p.set_user(user);
        p
    }

    #[test]
    fn an_exec_line_has_argv_user_cwd_and_exit() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("audit.jsonl");
        let p = process(&["sh", "-c", "exit 7"]);
        append_or_warn(
            &path,
            "c1",
            event(&p, Some(7), None, Some(Duration::from_millis(1500))),
        );
        let text = std::fs::read_to_string(&path).expect("audit file");
        let r: Record = serde_json::from_str(text.trim_end()).expect("one record");
        assert_eq!(r.container, "c1");
        assert_eq!(
            r.event,
            Event::Exec {
                argv: vec!["sh".into(), "-c".into(), "exit 7".into()],
                user: "1000:100".into(),
                cwd: "/work".into(),
                exit: Some(7),
                error: None,
                duration_ms: Some(1500),
            }
        );
        let v: serde_json::Value = serde_json::from_str(text.trim_end()).expect("json");
        assert!(v.get("error").is_none(), "{text}");
    }

    #[test]
    fn a_failed_or_detached_exec_has_no_exit() {
        let long: Vec<String> = (0..200).map(|i| format!("arg{i}")).collect();
        let mut p = process(&[]);
        p.set_args(Some(long));
        match event(&p, None, Some("no such file"), None) {
            Event::Exec {
                argv,
                exit,
                error,
                duration_ms,
                ..
            } => {
                assert_eq!(argv.len(), MAX_ARGS + 1);
                assert_eq!(exit, None);
                assert_eq!(error.as_deref(), Some("no such file"));
                assert_eq!(duration_ms, None);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn an_unwritable_audit_file_is_only_a_warning() {
        let dir = tempfile::tempdir().expect("tempdir");
        // A directory where the file should be: the open fails.
        let path = dir.path().join("audit.jsonl");
        std::fs::create_dir(&path).expect("dir");
        append_or_warn(&path, "c1", event(&process(&["true"]), Some(0), None, None));
    }

    #[test]
    fn error_chains_are_one_line_without_repeats() {
        #[derive(Debug, thiserror::Error)]
        #[error("cannot exec")]
        struct Outer(#[source] std::io::Error);
        let e = Outer(std::io::Error::other("no such file"));
        assert_eq!(error_chain(&e), "cannot exec: no such file");
    }
}
