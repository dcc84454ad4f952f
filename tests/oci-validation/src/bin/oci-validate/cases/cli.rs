//! The command line as runc's users see it: version and usage output, exit
//! codes of wrong command lines, the log (`--log`, `--log-format json`,
//! `--debug`), signals `kill` takes, `exec` into a container in each state,
//! and a process file with the least in it.
//!
//! What is compared is runc's shape, not its words where they name runc:
//! the first version line is `NAME version X`, help has urfave/cli's
//! sections, a refusal's message holds runc's phrase.

use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use serde_json::{json, Value};

use super::{CaseFn, Ctx};
use crate::runtime::Output;

pub const CASES: &[(&str, CaseFn)] = &[
    ("cli-usage", usage),
    ("cli-log", log),
    ("cli-kill-signals", kill_signals),
    ("cli-exec-states", exec_states),
    ("cli-process-file", process_file),
];

/// A refusal whose output (stderr, where runc logs) holds `phrase`.
fn refused_saying(ctx: &mut Ctx, check: &str, out: &Output, code: i32, phrase: &str) {
    ctx.check(
        check,
        out.code == Some(code) && out.stderr.contains(phrase),
        || {
            format!(
                "want exit {code} and {phrase:?} on stderr, got {}",
                out.describe()
            )
        },
    );
}

fn usage(ctx: &mut Ctx) -> Result<()> {
    let out = ctx.rt.run(&["--version"])?;
    let lines: Vec<&str> = out.stdout.lines().collect();
    let first = lines.first().copied().unwrap_or_default();
    let words: Vec<&str> = first.split(' ').collect();
    ctx.check(
        "--version: NAME version X first",
        out.success() && words.len() == 3 && words[1] == "version",
        || format!("{}: {:?}", out.describe(), out.stdout),
    );
    for key in ["commit: ", "spec: ", "libseccomp: "] {
        ctx.check(
            format!("--version has a {}line", key),
            lines.iter().any(|l| l.starts_with(key)),
            || format!("{:?}", out.stdout),
        );
    }

    let sections = |text: &str, names: &[&str]| names.iter().all(|s| text.contains(s));
    let out = ctx.rt.run(&["-h"])?;
    ctx.check(
        "-h: help on stdout in runc's sections, exit 0",
        out.success()
            && out.stdout.starts_with("NAME:\n")
            && sections(&out.stdout, &["USAGE:", "COMMANDS:", "GLOBAL OPTIONS:"]),
        || format!("{}: {:?}", out.describe(), runtime_tail(&out.stdout)),
    );
    let out = ctx.rt.run(&[])?;
    ctx.check(
        "no command: help on stdout, exit 0",
        out.success() && out.stdout.starts_with("NAME:\n"),
        || format!("{}: {:?}", out.describe(), runtime_tail(&out.stdout)),
    );
    let out = ctx.rt.run(&["kill", "--help"])?;
    ctx.check(
        "kill --help: the command's NAME, USAGE and OPTIONS, exit 0",
        out.success()
            && out.stdout.starts_with("NAME:\n")
            && out.stdout.contains(" kill - ")
            && sections(&out.stdout, &["USAGE:", "OPTIONS:"]),
        || format!("{}: {:?}", out.describe(), runtime_tail(&out.stdout)),
    );

    let out = ctx.rt.run(&["no-such-command"])?;
    ctx.check(
        "unknown command: exit 3, nothing on stdout, no help topic logged",
        out.code == Some(3)
            && out.stdout.is_empty()
            && out.stderr.contains("No help topic for 'no-such-command'"),
        || format!("{}; stdout {:?}", out.describe(), out.stdout),
    );
    let out = ctx.rt.run(&["--no-such-flag", "list"])?;
    ctx.check(
        "unknown global flag: Incorrect Usage. and the help on stdout, exit 1",
        out.code == Some(1)
            && out
                .stdout
                .starts_with("Incorrect Usage. flag provided but not defined: -no-such-flag\n\n")
            && out.stdout.contains("GLOBAL OPTIONS:")
            && out
                .stderr
                .contains("flag provided but not defined: -no-such-flag"),
        || format!("{}; stdout {:?}", out.describe(), runtime_tail(&out.stdout)),
    );
    let out = ctx.rt.run(&["kill", "--no-such-flag", "x"])?;
    ctx.check(
        "unknown command flag: Incorrect Usage: and the command's help, exit 1",
        out.code == Some(1)
            && out
                .stdout
                .starts_with("Incorrect Usage: flag provided but not defined: -no-such-flag\n\n")
            && out.stdout.contains(" kill - "),
        || format!("{}; stdout {:?}", out.describe(), runtime_tail(&out.stdout)),
    );
    let out = ctx.rt.run(&["kill"])?;
    ctx.check(
        "missing argument: Incorrect Usage. and the command's help, exit 1",
        out.code == Some(1)
            && out.stdout.starts_with("Incorrect Usage.\n\n")
            && out.stdout.contains(" kill - ")
            && out.stderr.contains("requires a minimum of 1 argument(s)"),
        || format!("{}; stdout {:?}", out.describe(), runtime_tail(&out.stdout)),
    );
    Ok(())
}

/// The first 200 characters, for a failure detail.
fn runtime_tail(s: &str) -> String {
    s.chars().take(200).collect()
}

/// The log file's lines as JSON objects (a line that is not one fails).
fn json_lines(path: &std::path::Path) -> Result<Vec<Value>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    text.lines()
        .map(|l| serde_json::from_str(l).map_err(|e| format!("{l:?}: {e}")))
        .collect()
}

/// `YYYY-MM-DDTHH:MM:SS[.frac](Z|±HH:MM)`: the time logrus writes.
fn rfc3339(t: &str) -> bool {
    let b = t.as_bytes();
    let digits =
        |r: std::ops::Range<usize>| b.get(r).is_some_and(|d| d.iter().all(u8::is_ascii_digit));
    let head = b.len() >= 20
        && digits(0..4)
        && b[4] == b'-'
        && digits(5..7)
        && b[7] == b'-'
        && digits(8..10)
        && b[10] == b'T'
        && digits(11..13)
        && b[13] == b':'
        && digits(14..16)
        && b[16] == b':'
        && digits(17..19);
    if !head {
        return false;
    }
    let mut rest = &t[19..];
    if let Some(frac) = rest.strip_prefix('.') {
        let n = frac.bytes().take_while(u8::is_ascii_digit).count();
        if n == 0 {
            return false;
        }
        rest = &frac[n..];
    }
    rest == "Z"
        || (rest.len() == 6
            && (rest.starts_with('+') || rest.starts_with('-'))
            && rest.as_bytes()[3] == b':')
}

fn log(ctx: &mut Ctx) -> Result<()> {
    let dir = ctx.scratch("log")?;
    let file = dir.join("error.json");
    let file_s = file.to_string_lossy().into_owned();
    let out = ctx.rt.run(&[
        "--log",
        &file_s,
        "--log-format",
        "json",
        "state",
        "no-such-container",
    ])?;
    let lines = json_lines(&file);
    let fields_ok = lines.as_ref().is_ok_and(|ls| {
        ls.len() == 1 && {
            let l = &ls[0];
            let keys: Vec<&String> = l
                .as_object()
                .map(|o| o.keys().collect())
                .unwrap_or_default();
            l["level"] == "error"
                && l["msg"]
                    .as_str()
                    .is_some_and(|m| m.contains("does not exist"))
                && l["time"].as_str().is_some_and(rfc3339)
                && keys
                    .iter()
                    .all(|k| ["level", "msg", "time"].contains(&k.as_str()))
        }
    });
    ctx.check(
        "--log-format json: one error line of level, msg, time (RFC 3339)",
        out.code == Some(1) && fields_ok,
        || format!("{}; log {lines:?}", out.describe()),
    );
    ctx.check(
        "--log FILE: stderr gets the bare message",
        out.stderr.trim().ends_with("does not exist")
            && out.stderr.lines().count() == 1
            && serde_json::from_str::<Value>(out.stderr.trim()).is_err(),
        || format!("stderr {:?}", out.stderr),
    );
    let out = ctx
        .rt
        .run(&["--log-format", "json", "state", "no-such-container"])?;
    let only_json = out.stderr.lines().count() == 1
        && serde_json::from_str::<Value>(out.stderr.trim()).is_ok_and(|v| v["level"] == "error");
    ctx.check(
        "--log-format json without --log: one JSON line on stderr",
        out.code == Some(1) && only_json,
        || format!("stderr {:?}", out.stderr),
    );

    // A lifecycle without --debug logs nothing; with --debug, debug lines,
    // none twice in one command and none a warning.
    let mut b = ctx.bundle()?;
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let id = ctx.id();
    let quiet = dir.join("quiet.json");
    let mut repeated = Vec::new();
    let mut warnings = Vec::new();
    let mut debug_lines = 0;
    let bundle = b.dir_str();
    let steps: [Vec<&str>; 4] = [
        vec!["create", "--bundle", &bundle, &id],
        vec!["start", &id],
        vec!["exec", &id, "/bin/true"],
        vec!["delete", "--force", &id],
    ];
    let mut failed = Vec::new();
    // create and exec with --debug, each in a log of its own; start and
    // delete without, into one log.
    for (i, step) in steps.iter().enumerate() {
        let debug = i % 2 == 0;
        let path = match debug {
            true => dir.join(format!("debug-{i}.json")),
            false => quiet.clone(),
        };
        let path_s = path.to_string_lossy().into_owned();
        let mut args = vec!["--log", path_s.as_str(), "--log-format", "json"];
        if debug {
            args.push("--debug");
        }
        args.extend(step.iter().copied());
        let out = ctx.rt.run(&args)?;
        if !out.success() {
            failed.push(format!("{}: {}", step[0], out.describe()));
        }
        if debug {
            let lines = json_lines(&path).unwrap_or_default();
            debug_lines += lines.iter().filter(|l| l["level"] == "debug").count();
            let mut seen = std::collections::HashSet::new();
            for l in &lines {
                let msg = l["msg"].as_str().unwrap_or_default().to_string();
                if l["level"] == "warning" {
                    warnings.push(msg.clone());
                }
                if !seen.insert(msg.clone()) {
                    repeated.push(msg);
                }
            }
        }
    }
    ctx.check(
        "lifecycle with and without --debug succeeds",
        failed.is_empty(),
        || failed.join("; "),
    );
    let quiet_lines = std::fs::read_to_string(&quiet).unwrap_or_default();
    ctx.check(
        "without --debug the log stays empty",
        quiet_lines.is_empty(),
        || format!("{quiet_lines:?}"),
    );
    ctx.check("--debug adds debug lines", debug_lines > 0, || {
        "no line of level debug".into()
    });
    ctx.check(
        "--debug: no warning about the host, no line twice in a command",
        warnings.is_empty() && repeated.is_empty(),
        || format!("warnings {warnings:?}; repeated {repeated:?}"),
    );
    Ok(())
}

/// Waits up to 5 s for `path` to hold `want` lines; returns what it holds.
fn wait_lines(path: &std::path::Path, want: usize) -> Vec<String> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let lines: Vec<String> = std::fs::read_to_string(path)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect();
        if lines.len() >= want || Instant::now() >= deadline {
            return lines;
        }
        crate::reaper::tick(Duration::from_millis(20));
    }
}

fn kill_signals(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let id = ctx.id();
    // The init writes the name of each signal it traps to /signals.
    b.args(&[
        "/bin/sh",
        "-c",
        "for s in HUP USR1 USR2 34; do trap \"echo $s >> /signals\" $s; done; \
         echo ready > /ready; while :; do sleep 0.1; done",
    ]);
    b.write()?;
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    anyhow::ensure!(out.success(), "create: {}", out.describe());
    let out = ctx.rt.run(&["start", &id])?;
    anyhow::ensure!(out.success(), "start: {}", out.describe());
    let signals = b.rootfs().join("signals");
    let ready = wait_lines(&b.rootfs().join("ready"), 1);
    anyhow::ensure!(!ready.is_empty(), "the init never trapped its signals");

    let out = ctx.rt.run(&["kill", &id, "0"])?;
    let st = ctx.state(&id);
    ctx.check(
        "kill 0: succeeds and changes nothing",
        out.success() && st.as_ref().is_ok_and(|s| s["status"] == "running"),
        || format!("{}; {}", out.describe(), super::show(&st)),
    );
    let spellings = [
        ("HUP", "HUP"),
        ("SIGUSR1", "USR1"),
        ("usr2", "USR2"),
        ("10", "USR1"),
    ];
    let mut want = Vec::new();
    for (n, (spelling, name)) in spellings.iter().enumerate() {
        let out = ctx.rt.run(&["kill", &id, spelling])?;
        want.push(name.to_string());
        let got = wait_lines(&signals, n + 1);
        ctx.check(
            format!("kill {spelling}: delivered"),
            out.success() && got == want,
            || format!("{}; the init trapped {got:?}", out.describe()),
        );
    }
    for bad in ["NOSUCHSIG", "SIGRTMIN", "99", "-9"] {
        let out = ctx.rt.run(&["kill", &id, bad])?;
        ctx.check(
            format!("kill {bad}: refused with exit 1"),
            out.code == Some(1),
            || out.describe(),
        );
    }
    // runc's words for a number the kernel refuses (Go's errno text).
    let out = ctx.rt.run(&["--log-format", "json", "kill", &id, "99"])?;
    let msg = json_msg(&out.stderr);
    ctx.check(
        "kill 99: \"unable to signal init: invalid argument\"",
        msg.as_deref() == Some("unable to signal init: invalid argument"),
        || format!("message {msg:?}; {}", out.describe()),
    );
    let st = ctx.state(&id);
    ctx.check(
        "refused signals change nothing",
        st.as_ref().is_ok_and(|s| s["status"] == "running"),
        || super::show(&st),
    );
    let out = ctx.rt.run(&["kill", &id, "34"])?;
    want.push("34".to_string());
    let got = wait_lines(&signals, want.len());
    ctx.check(
        "kill 34: a real-time signal by number is delivered",
        out.success() && got == want,
        || format!("{}; the init trapped {got:?}", out.describe()),
    );
    let out = ctx.rt.run(&["kill", &id, "KILL"])?;
    anyhow::ensure!(out.success(), "kill KILL: {}", out.describe());
    let st = ctx.wait_status(&id, "stopped");
    anyhow::ensure!(st.is_ok(), "never stopped: {}", super::show(&st));
    let out = ctx.rt.run(&["kill", &id, "0"])?;
    ctx.check(
        "kill 0 of a stopped container: refused",
        out.code == Some(1),
        || out.describe(),
    );
    // containerd's runc shim matches these words (checkKillError) to take
    // the kill of a stopped container for "already finished".
    let out = ctx.rt.run(&["--log-format", "json", "kill", &id, "TERM"])?;
    let msg = json_msg(&out.stderr);
    ctx.check(
        "kill of a stopped container: \"container not running\"",
        out.code == Some(1) && msg.as_deref() == Some("container not running"),
        || format!("message {msg:?}; {}", out.describe()),
    );
    Ok(())
}

/// The `msg` of the last JSON line of `stderr` (`--log-format json`).
fn json_msg(stderr: &str) -> Option<String> {
    stderr
        .lines()
        .rev()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find_map(|v| v["msg"].as_str().map(str::to_string))
}

fn exec_states(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let id = ctx.id();
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    anyhow::ensure!(out.success(), "create: {}", out.describe());
    let out = ctx.rt.run(&["exec", &id, "/bin/echo", "in created"])?;
    let st = ctx.state(&id);
    ctx.check(
        "exec into a created container runs (runc 1.1)",
        out.success()
            && out.stdout == "in created\n"
            && st.as_ref().is_ok_and(|s| s["status"] == "created"),
        || {
            format!(
                "{}; stdout {:?}; {}",
                out.describe(),
                out.stdout,
                super::show(&st)
            )
        },
    );
    let out = ctx.rt.run(&["start", &id])?;
    anyhow::ensure!(out.success(), "start: {}", out.describe());
    let out = ctx.rt.run(&["start", &id])?;
    refused_saying(
        ctx,
        "start of a running container: refused as runc",
        &out,
        1,
        "cannot start an already running container",
    );
    let out = ctx.rt.run(&["resume", &id])?;
    refused_saying(
        ctx,
        "resume of a running container: refused as runc",
        &out,
        1,
        "container not paused",
    );

    let dir = ctx.scratch("exec-states")?;
    let pid_file = dir.join("no-such-dir").join("exec.pid");
    let out = ctx.rt.run(&[
        "exec",
        "--detach",
        "--pid-file",
        &pid_file.to_string_lossy(),
        &id,
        "/bin/sleep",
        "600",
    ])?;
    ctx.check(
        "exec --pid-file in a missing directory: refused with exit 255",
        out.code == Some(255),
        || out.describe(),
    );

    let out = ctx.rt.run(&["pause", &id])?;
    anyhow::ensure!(out.success(), "pause: {}", out.describe());
    let out = ctx.rt.run(&["pause", &id])?;
    refused_saying(
        ctx,
        "pause of a paused container: refused as runc",
        &out,
        1,
        "container not running",
    );
    let out = ctx.rt.run(&["start", &id])?;
    refused_saying(
        ctx,
        "start of a paused container: refused as runc",
        &out,
        1,
        "cannot start a container in the paused state",
    );
    let out = ctx.rt.run(&["exec", &id, "/bin/true"])?;
    refused_saying(
        ctx,
        "exec into a paused container: refused as runc",
        &out,
        255,
        "cannot exec in a paused container (use --ignore-paused to override)",
    );
    // runc's --ignore-paused process waits, frozen, in the container's
    // cgroup: exec returns only after resume, with the process's output.
    let mut waiting =
        ctx.rt
            .spawn(&["exec", "--ignore-paused", &id, "/bin/echo", "after resume"])?;
    let early = crate::runtime::wait_timeout(&mut waiting.child, Duration::from_secs(2))?;
    ctx.check(
        "exec --ignore-paused into a paused container waits for resume",
        early.is_none(),
        || format!("exec ended while paused: {early:?}"),
    );
    let out = ctx.rt.run(&["resume", &id])?;
    anyhow::ensure!(out.success(), "resume: {}", out.describe());
    let out = waiting.wait(Duration::from_secs(30))?;
    ctx.check(
        "exec --ignore-paused: the process runs after resume",
        out.success() && out.stdout == "after resume\n",
        || format!("{}; stdout {:?}", out.describe(), out.stdout),
    );

    let out = ctx.rt.run(&["kill", &id, "KILL"])?;
    anyhow::ensure!(out.success(), "kill: {}", out.describe());
    let st = ctx.wait_status(&id, "stopped");
    anyhow::ensure!(st.is_ok(), "never stopped: {}", super::show(&st));
    let out = ctx.rt.run(&["exec", &id, "/bin/true"])?;
    refused_saying(
        ctx,
        "exec into a stopped container: refused as runc",
        &out,
        255,
        "cannot exec in a stopped container",
    );
    let out = ctx.rt.run(&["exec", "no-such-container", "/bin/true"])?;
    refused_saying(
        ctx,
        "exec into no container: refused as runc",
        &out,
        255,
        "exec failed: ",
    );
    Ok(())
}

fn process_file(ctx: &mut Ctx) -> Result<()> {
    let mut b = ctx.bundle()?;
    let (id, _pid) = ctx.start_sleeper(&mut b)?;
    let dir = ctx.scratch("process-file")?;
    let write = |name: &str, v: &Value| -> Result<String> {
        let p = dir.join(name);
        std::fs::write(&p, serde_json::to_vec(v)?).with_context(|| format!("write {name}"))?;
        Ok(p.to_string_lossy().into_owned())
    };
    let id_args = json!(["/bin/sh", "-c", "/bin/id -u; /bin/id -g"]);
    let least = write("least.json", &json!({"args": id_args, "cwd": "/"}))?;
    let out = ctx.rt.run(&["exec", "--process", &least, &id])?;
    ctx.check(
        "a process file without user or env runs as uid 0",
        out.success() && out.stdout == "0\n0\n",
        || format!("{}; stdout {:?}", out.describe(), out.stdout),
    );
    let uid_only = write(
        "uid.json",
        &json!({"args": id_args, "cwd": "/", "user": {"uid": 1000}}),
    )?;
    let out = ctx.rt.run(&["exec", "--process", &uid_only, &id])?;
    ctx.check(
        "a user without gid runs as gid 0",
        out.success() && out.stdout == "1000\n0\n",
        || format!("{}; stdout {:?}", out.describe(), out.stdout),
    );
    let no_cwd = write("nocwd.json", &json!({"args": ["/bin/id"]}))?;
    let out = ctx.rt.run(&["exec", "--process", &no_cwd, &id])?;
    ctx.check(
        "a process file without cwd: refused with exit 255",
        out.code == Some(255),
        || out.describe(),
    );
    Ok(())
}
