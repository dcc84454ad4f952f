//! The audit trail end to end, with real containers: every `exec` becomes
//! one JSON line in the audit file the config names (the container tier's
//! foreground exec and the microvm tier's relay see the exit, a detached
//! container-tier exec does not, a failed exec says why); `agentvm audit
//! ID` prints exactly that container's lines and `--follow` the new ones;
//! `events --stats` adds up the connection lines; and the lines reach an
//! OTLP/HTTP receiver that the test runs, through the exporter that
//! `create` starts.
//!
//! Needs root; the microvm test also QEMU, virtiofsd and the guest kernel
//! (`make kernel virtiofsd`). Without them a test prints `skipped: <why>`.

use agentvm_test_support as common;
use common::require;

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use common::bundle::{skip_unless_root, Fixture};
use common::netns::{Netns, PeerServer};
use common::otlp::Receiver;

/// `[audit]` lines of a config with the fixture's own audit file and, when
/// given, the receiver as the OTLP endpoint.
fn audit_config(dir: &Path, receiver: Option<&Receiver>) -> String {
    let mut text = format!(
        "[audit]\npath = {:?}\n",
        audit_path(dir).display().to_string()
    );
    if let Some(r) = receiver {
        text.push_str(&format!("otlp_endpoint = {:?}\n", r.endpoint()));
    }
    text
}

fn audit_path(dir: &Path) -> PathBuf {
    dir.join("audit").join("audit.jsonl")
}

/// The audit file's lines, parsed.
fn lines(f: &Fixture) -> Vec<serde_json::Value> {
    std::fs::read_to_string(audit_path(f.dir.path()))
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect()
}

/// The exec lines of container `id` whose argv is `argv`.
fn execs(f: &Fixture, id: &str, argv: &[&str]) -> Vec<serde_json::Value> {
    lines(f)
        .into_iter()
        .filter(|l| {
            l["container"] == id && l["event"] == "exec" && l["argv"] == serde_json::json!(argv)
        })
        .collect()
}

#[track_caller]
fn wait_for_exec(f: &Fixture, id: &str, argv: &[&str]) -> serde_json::Value {
    common::wait_for(60, || execs(f, id, argv).into_iter().next()).unwrap_or_else(|| {
        panic!(
            "no exec line for {argv:?} of {id} in:\n{}",
            std::fs::read_to_string(audit_path(f.dir.path())).unwrap_or_default()
        )
    })
}

/// Stops the exporter that `create` started for this fixture's audit file
/// (its pid is in the lock file) and checks that it was running.
fn stop_exporter(f: &Fixture) {
    let lock = PathBuf::from(format!(
        "{}.export.lock",
        audit_path(f.dir.path()).display()
    ));
    let pid: i32 = std::fs::read_to_string(&lock)
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or_else(|| panic!("no exporter pid in {}", lock.display()));
    // SAFETY: kill(2) on the pid the exporter wrote; no pointers.
    let rc = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(rc, 0, "exporter {pid}");
    assert!(
        common::wait_for(10, || common::process_gone(pid).then_some(())).is_some(),
        "exporter {pid} did not stop on SIGTERM"
    );
}

/// A line written by hand, as another writer's.
fn append(f: &Fixture, text: &str) {
    use std::io::Write;
    std::fs::create_dir_all(f.dir.path().join("audit")).expect("audit dir");
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .open(audit_path(f.dir.path()))
        .expect("open audit file");
    file.write_all(text.as_bytes()).expect("append");
}

fn connection(id: &str, verdict: &str, bytes_out: u64, bytes_in: u64, suppressed: u64) -> String {
    format!(
        "{{\"time\":\"2025-01-01T00:00:00.000Z\",\"container\":\"{id}\",\"event\":\"connection\",\
         \"verdict\":\"{verdict}\",\"proto\":\"tcp\",\"dst\":\"192.0.2.1\",\"port\":443,\
         \"bytes_out\":{bytes_out},\"bytes_in\":{bytes_in},\"duration_ms\":1,\"suppressed\":{suppressed}}}\n"
    )
}

/// `agentvm audit ID --follow`, its lines arriving on a channel.
struct Follow {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Follow {
    fn start(f: &Fixture, id: &str) -> Follow {
        let mut child = f
            .command(&["audit", "--follow", id])
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn audit --follow");
        let out = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Follow { child, lines }
    }

    /// The next line printed within `secs`.
    fn next(&self, secs: u64) -> Option<String> {
        self.lines.recv_timeout(Duration::from_secs(secs)).ok()
    }

    /// Waits for the command to exit by itself within `secs`.
    fn exited(&mut self, secs: u64) -> Option<std::process::ExitStatus> {
        let deadline = Instant::now() + Duration::from_secs(secs);
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Some(st);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn container_tier_execs_are_audited_printed_counted_and_exported() {
    if skip_unless_root() {
        return;
    }
    let receiver = require!(Receiver::start());
    let mut f = Fixture::new();
    let config = f.dir.path().join("config.toml");
    std::fs::write(&config, audit_config(f.dir.path(), Some(&receiver))).expect("config");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    f.write_config(&["sleep", "1000"], |_| {});
    let id = common::unique_name("audit-ct");

    assert!(f.create(&id).success(), "create");
    // A refused exec (as runc, a created container takes execs; this
    // program does not exist): the line says why, in runc's words.
    let out = f.agentvm(&["exec", &id, "/no/such/program"]);
    assert_ne!(out.code, 0, "{out}");
    let refused = wait_for_exec(&f, &id, &["/no/such/program"]);
    assert!(refused.get("exit").is_none(), "{refused}");
    assert!(
        refused["error"]
            .as_str()
            .unwrap_or("")
            .contains("stat /no/such/program: no such file or directory"),
        "{refused}"
    );
    f.agentvm(&["start", &id]).ok();

    // A foreground exec: the exit, user, cwd.
    f.agentvm(&[
        "exec",
        "--cwd",
        "/tmp",
        "--user",
        "1000:1000",
        &id,
        "sh",
        "-c",
        "exit 7",
    ])
    .code(7);
    let line = wait_for_exec(&f, &id, &["sh", "-c", "exit 7"]);
    assert_eq!(line["exit"], 7, "{line}");
    assert_eq!(line["user"], "1000:1000", "{line}");
    assert_eq!(line["cwd"], "/tmp", "{line}");
    assert!(
        line["time"].is_string() && line["duration_ms"].is_u64(),
        "{line}"
    );

    // Detached, as containerd's shim calls it (a process file, a pid
    // file): no exit, the caller waits for it; the pid is the process
    // itself, no helper of ours.
    let process = f.dir.path().join("process.json");
    std::fs::write(
        &process,
        serde_json::json!({
            "terminal": false, "user": {"uid": 0, "gid": 0},
            "args": ["sh", "-c", "sleep 2; exit 3"], "env": ["PATH=/bin"], "cwd": "/"
        })
        .to_string(),
    )
    .expect("process.json");
    let pid_file = f.dir.path().join("exec.pid");
    f.agentvm(&[
        "exec",
        "--process",
        process.to_str().expect("utf-8"),
        "--detach",
        "--pid-file",
        pid_file.to_str().expect("utf-8"),
        &id,
    ])
    .ok();
    let detached = wait_for_exec(&f, &id, &["sh", "-c", "sleep 2; exit 3"]);
    assert!(detached.get("exit").is_none(), "{detached}");
    assert!(detached.get("error").is_none(), "{detached}");
    let pid = std::fs::read_to_string(&pid_file).expect("pid file");
    let cmdline = std::fs::read(format!("/proc/{}/cmdline", pid.trim())).unwrap_or_default();
    assert!(
        cmdline.starts_with(b"sh\0-c\0sleep 2"),
        "the exec pid is not the process: {:?}",
        String::from_utf8_lossy(&cmdline)
    );

    // Other writers' lines: another container whose id starts with this
    // one's, a malformed line, and connection lines of this container.
    let other = format!("{id}x");
    append(&f, &connection(&other, "allowed", 5, 5, 0));
    append(&f, "{\"container\": broken\n");
    append(&f, &connection(&id, "allowed", 100, 2000, 0));
    append(&f, &connection(&id, "denied", 0, 0, 9));

    let out = f.agentvm(&["audit", &id]).ok();
    let printed: Vec<serde_json::Value> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{l:?}: {e}")))
        .collect();
    assert_eq!(printed.len(), 5, "{out}");
    assert!(
        printed.iter().all(|l| l["container"] == id.as_str()),
        "{out}"
    );
    // Exactly the lines of the file, byte for byte.
    let file = std::fs::read_to_string(audit_path(f.dir.path())).expect("audit file");
    for l in out.stdout.lines() {
        assert!(
            file.lines().any(|fl| fl == l),
            "{l} is not a line of the file"
        );
    }

    // events --stats: the connection lines added up.
    let out = f.agentvm(&["events", "--stats", &id]).ok();
    let stats: serde_json::Value = serde_json::from_str(out.out()).expect("stats JSON");
    assert_eq!(stats["type"], "stats", "{out}");
    assert_eq!(
        stats["data"]["egress"],
        serde_json::json!({"allowed": 1, "denied": 10, "bytes_out": 100, "bytes_in": 2000}),
        "{out}"
    );

    // --follow prints what is there, then what comes.
    let mut follow = Follow::start(&f, &id);
    for _ in 0..5 {
        assert!(follow.next(20).is_some(), "the existing lines");
    }
    f.agentvm(&["exec", &id, "echo", "later"]).ok();
    let later = follow.next(20).expect("the new line");
    let later: serde_json::Value = serde_json::from_str(&later).expect("JSON");
    assert_eq!(
        later["argv"],
        serde_json::json!(["echo", "later"]),
        "{later}"
    );
    assert_eq!(later["exit"], 0, "{later}");

    // The receiver got the exec lines, as log records.
    let got = receiver.wait_until(Duration::from_secs(30), |r| {
        r.iter()
            .any(|r| r.container == id && r.body.contains("\"exit 7\""))
    });
    let rec = got
        .iter()
        .find(|r| r.container == id && r.body.contains("\"exit 7\""))
        .unwrap_or_else(|| panic!("the exec of exit 7 was not exported: {got:?}"));
    assert_eq!(rec.event_name, "agentvm.audit.exec");
    assert_eq!(rec.attribute("agentvm.audit.exit"), Some("7"));
    assert_eq!(rec.service, "agentvm");
    assert!(rec.time_unix_nano > 0);
    assert_eq!(
        got.iter().filter(|r| r.body.contains("\"exit 7\"")).count(),
        1,
        "exported once"
    );

    // Deleted: --follow ends by itself; the audit outlives the container.
    f.agentvm(&["delete", "--force", &id]).ok();
    assert!(follow.exited(15).is_some(), "audit --follow did not end");
    let out = f.agentvm(&["audit", &id]).ok();
    assert_eq!(out.stdout.lines().count(), 6, "{out}");
    stop_exporter(&f);
}

#[test]
fn an_id_never_seen_is_an_error_and_bad_ids_are_refused() {
    if skip_unless_root() {
        return;
    }
    let mut f = Fixture::new();
    let config = f.dir.path().join("config.toml");
    std::fs::write(&config, audit_config(f.dir.path(), None)).expect("config");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    append(&f, &connection("someone-else", "allowed", 1, 1, 0));
    let out = f.agentvm(&["audit", "never-was"]);
    assert_eq!(out.code, 1, "{out}");
    assert_eq!(out.stderr.lines().count(), 1, "{out}");
    assert!(
        out.stderr
            .contains("no audit lines for container never-was"),
        "{out}"
    );
    assert!(out.stdout.is_empty(), "{out}");
    let out = f.agentvm(&["audit", "../etc"]);
    assert_eq!(out.code, 1, "{out}");
    // No exporter without an endpoint.
    assert!(!Path::new(&format!(
        "{}.export.lock",
        audit_path(f.dir.path()).display()
    ))
    .exists());
}

#[test]
fn a_bad_otlp_endpoint_is_refused_naming_the_key() {
    if skip_unless_root() {
        return;
    }
    let mut f = Fixture::new();
    let config = f.dir.path().join("config.toml");
    std::fs::write(
        &config,
        "[audit]\notlp_endpoint = \"https://collector:4318\"\n",
    )
    .expect("config");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    let out = f.agentvm(&["list"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("audit.otlp_endpoint"), "{out}");
}

#[test]
fn microvm_execs_are_audited_by_the_relay_and_exported() {
    let receiver = require!(Receiver::start());
    let f = require!(common::guest::microvm_fixture(""));
    // The fixture's config has [microvm] last: [audit] follows it.
    let config = f.dir.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(&audit_config(f.dir.path(), Some(&receiver)));
    std::fs::write(&config, text).expect("config");
    f.write_config(&["sleep", "1000"], |_| {});
    let id = common::unique_name("audit-mv");
    let out = f.create(&id);
    assert!(out.success(), "{out}");
    f.agentvm(&["start", &id]).ok();

    f.agentvm(&["exec", &id, "sh", "-c", "exit 7"]).code(7);
    let line = wait_for_exec(&f, &id, &["sh", "-c", "exit 7"]);
    assert_eq!(line["exit"], 7, "{line}");
    assert_eq!(line["user"], "0:0", "{line}");
    assert_eq!(line["cwd"], "/", "{line}");

    // Detached: the relay in the background writes the exit when it comes.
    f.agentvm(&["exec", "--detach", &id, "sh", "-c", "sleep 1; exit 5"])
        .ok();
    let detached = wait_for_exec(&f, &id, &["sh", "-c", "sleep 1; exit 5"]);
    assert_eq!(detached["exit"], 5, "{detached}");

    let got = receiver.wait_until(Duration::from_secs(30), |r| {
        r.iter().filter(|r| r.container == id).count() >= 2
    });
    assert!(
        got.iter()
            .any(|r| r.container == id && r.attribute("agentvm.audit.exit") == Some("5")),
        "{got:?}"
    );
    f.agentvm(&["delete", "--force", &id]).ok();
    stop_exporter(&f);
}

/// The egress daemon's own lines, from a real microVM behind a policy:
/// printed by `audit ID`, added up by `events --stats` and exported.
#[test]
fn real_connection_lines_are_counted_and_exported() {
    if let Some(why) = common::host_unsuitable(&["ip", "busybox"]) {
        eprintln!("skipped: {why}");
        return;
    }
    let receiver = require!(Receiver::start());
    let f = require!(common::guest::microvm_fixture(""));
    let config = f.dir.path().join("config.toml");
    let mut text = std::fs::read_to_string(&config).expect("config");
    text.push_str(&audit_config(f.dir.path(), Some(&receiver)));
    std::fs::write(&config, text).expect("config");
    let net = Netns::new("audit");
    let _www = PeerServer::start(&net, 8000, &"x".repeat(1000));
    let netns = net.path();
    // One allowed fetch (1000 bytes back), one denied destination tried
    // three times (the proxy refuses it before any packet leaves). No
    // `wget -T`: busybox 1.35's wget crashes with it.
    f.write_config(
        &[
            "sh",
            "-c",
            "wget -q -O /dev/null http://10.231.0.1:8000/; \
             for i in 1 2 3; do wget -q -O /dev/null http://10.231.0.1:8001/; done; \
             sleep 1000",
        ],
        |c| {
            for ns in c["linux"]["namespaces"].as_array_mut().expect("namespaces") {
                if ns["type"] == "network" {
                    ns["path"] = serde_json::json!(netns);
                }
            }
        },
    );
    let id = common::unique_name("audit-net");
    let out = f.agentvm(&[
        "--egress",
        "10.231.0.1:8000",
        "create",
        "--bundle",
        f.bundle().to_str().expect("utf-8"),
        &id,
    ]);
    assert!(out.success(), "{out}");
    f.agentvm(&["start", &id]).ok();
    let conns = |verdict: &str| {
        lines(&f)
            .into_iter()
            .filter(|l| {
                l["container"] == id.as_str()
                    && l["event"] == "connection"
                    && l["verdict"] == verdict
            })
            .collect::<Vec<_>>()
    };
    let seen = common::wait_for(60, || {
        (!conns("allowed").is_empty() && !conns("denied").is_empty()).then_some(())
    });
    assert!(
        seen.is_some(),
        "no allowed and denied connection lines:\n{}\n{}\n{}",
        std::fs::read_to_string(audit_path(f.dir.path())).unwrap_or_default(),
        common::log_tail(&f.log(), 40),
        common::log_tail(&f.root().join(&id).join("console.log"), 40),
    );
    let allowed = &conns("allowed")[0];
    assert_eq!(allowed["port"], 8000, "{allowed}");
    assert_eq!(allowed["rule"], "10.231.0.1:8000", "{allowed}");
    assert!(
        allowed["bytes_in"].as_u64().unwrap_or(0) >= 1000,
        "{allowed}"
    );
    let out = f.agentvm(&["audit", &id]).ok();
    assert!(out.stdout.lines().count() >= 2, "{out}");

    let out = f.agentvm(&["events", "--stats", &id]).ok();
    let stats: serde_json::Value = serde_json::from_str(out.out()).expect("stats JSON");
    let egress = &stats["data"]["egress"];
    assert_eq!(egress["allowed"], 1, "{out}");
    // Three attempts: one line, or one line standing for the others.
    let denied = egress["denied"].as_u64().unwrap_or(0);
    assert!((1..=3).contains(&denied), "{out}");
    assert!(egress["bytes_in"].as_u64().unwrap_or(0) >= 1000, "{out}");

    let got = receiver.wait_until(Duration::from_secs(30), |r| {
        r.iter().any(|r| {
            r.container == id
                && r.event_name == "agentvm.audit.connection"
                && r.severity_text == "WARN"
        })
    });
    assert!(
        got.iter().any(|r| r.container == id
            && r.event_name == "agentvm.audit.connection"
            && r.severity_text == "WARN"
            && r.attribute("agentvm.audit.port") == Some("8001")),
        "the denied connection was not exported: {got:?}"
    );
    f.agentvm(&["delete", "--force", &id]).ok();
    stop_exporter(&f);
}
