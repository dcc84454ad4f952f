//! A hostile guest: the microVM's /init is not agentvm's guest agent but a
//! program that breaks the control protocol on purpose (tests/hostile-guest,
//! booted through the `guest_agent` setting under `[microvm]`). A workload
//! cannot do this (the agent holds the port), but a guest kernel or agent
//! compromised from inside can, and the host must survive it: the container
//! is killed with one clear log line naming the violation, the supervisor
//! ends through its own exit path (never a panic or a hang), and nothing is
//! left behind.
//!
//! The hostile programs never power the VM off, so a host that waits for
//! the guest instead of killing it fails here by timeout.
//!
//! Needs root, qemu-system-x86_64, virtiofsd (`make virtiofsd`) and the
//! kernel `kernels/build.sh` builds (`make kernel`); without them each test
//! prints `skipped: <why>`. The hostile programs are built with cargo by the
//! first test that needs them.

use agentvm_test_support as common;
use common::require;

use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::bundle::{assert_nothing_left, assert_one_clear_error, Fixture};
use common::cmd::Output;

/// The supervisor's exit status when the VM ends without the workload's
/// status (src/microvm/supervisor/mod.rs).
const VM_LOST_STATUS: i32 = 255;

/// Longest the host may take, from logging the violation to `run` having
/// returned and deleted the container: no waiting for answers from a guest
/// it no longer trusts (a request times out after 30 s).
const TEARDOWN: Duration = Duration::from_secs(15);

/// The directory holding the hostile-guest binaries, built once per test
/// run in the same profile as this test (they are workspace members, so
/// cargo does not build them for agentvm's tests by itself).
fn hostile_bin_dir() -> PathBuf {
    static BUILT: OnceLock<PathBuf> = OnceLock::new();
    BUILT
        .get_or_init(|| {
            let agentvm = common::agentvm_bin();
            let dir = agentvm.parent().expect("target dir").to_path_buf();
            let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
            let mut cmd = Command::new(cargo);
            cmd.args(["build", "-p", "hostile-guest", "--bins"])
                .current_dir(env!("CARGO_MANIFEST_DIR"));
            if !cfg!(debug_assertions) {
                cmd.arg("--release");
            }
            let status = cmd.status().expect("run cargo build -p hostile-guest");
            assert!(status.success(), "cargo build -p hostile-guest failed");
            dir
        })
        .clone()
}

/// A microvm fixture whose guest /init is `hostile-<mode>`, with a bundle
/// that would run `true` (nothing runs: the hostile guest only pretends).
fn hostile(mode: &str) -> Result<Fixture, String> {
    // Checked first so that a machine that cannot boot a VM skips without
    // building anything.
    if let Some(why) = common::host_unsuitable(&[]).or_else(common::guest::unavailable) {
        return Err(why);
    }
    let bin = hostile_bin_dir().join(format!("hostile-{mode}"));
    assert!(bin.is_file(), "{} was not built", bin.display());
    common::guest::microvm_fixture(&format!(
        "guest_agent = {:?}\nboot_timeout_secs = 60\n",
        bin.display().to_string()
    ))
}

fn bundle_arg(f: &Fixture) -> String {
    f.bundle().to_str().expect("utf-8").to_string()
}

fn log_lines(f: &Fixture) -> Vec<serde_json::Value> {
    std::fs::read_to_string(f.log())
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("log line {l:?}: {e}")))
        .collect()
}

/// No panic anywhere: not in agentvm's output (the supervisor inherits the
/// command's stderr) nor in the log.
#[track_caller]
fn assert_no_panic(f: &Fixture, out: &Output) {
    let log = std::fs::read_to_string(f.log()).unwrap_or_default();
    for text in [&out.stderr, &out.stdout, &log] {
        assert!(
            !text.contains("panicked"),
            "a panic:\n{out}\n--- log ---\n{log}"
        );
    }
}

/// The guest breaks the protocol before the container exists: `create`
/// fails with one line naming the violation, which came from the
/// supervisor's own error report (not "the supervisor died").
#[track_caller]
fn assert_create_refused(mode: &str, id: &str, violation: &str) {
    let f = require!(hostile(mode));
    let out = f.create(id);
    assert_one_clear_error(&f, &out, &format!("guest protocol violation: {violation}"));
    assert!(!out.stderr.contains("supervisor died"), "{out}");
    assert_no_panic(&f, &out);
    assert_nothing_left(&f, id);
}

/// The guest breaks the protocol once the container runs: `run` ends with
/// the supervisor's VM-lost status, the log has exactly one error line and
/// it names the violation, the host did not wait on the guest, and
/// nothing is left (the VM, which would never stop by itself, is killed).
#[track_caller]
fn assert_run_killed(mode: &str, id: &str, violation: &str) {
    let f = require!(hostile(mode));
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), id]);
    let ended = chrono::Utc::now();
    assert_eq!(out.code, VM_LOST_STATUS, "{out}");
    assert_no_panic(&f, &out);
    let log = log_lines(&f);
    let errors: Vec<&serde_json::Value> = log.iter().filter(|l| l["level"] == "error").collect();
    assert_eq!(errors.len(), 1, "expected one error line: {log:#?}");
    let msg = errors[0]["msg"].as_str().unwrap_or("");
    let want = format!("container stopped: guest protocol violation: {violation}");
    assert!(
        msg.contains(&want),
        "error line {msg:?} should name {want:?}"
    );
    let logged = chrono::DateTime::parse_from_rfc3339(errors[0]["time"].as_str().unwrap_or(""))
        .expect("log time");
    let teardown = (ended - logged.with_timezone(&chrono::Utc))
        .to_std()
        .unwrap_or_default();
    assert!(
        teardown < TEARDOWN,
        "the host took {teardown:?} after the violation to end the container"
    );
    assert_nothing_left(&f, id);
}

#[test]
fn text_instead_of_a_frame_before_hello_fails_create() {
    // "GET " read as a little-endian frame length.
    assert_create_refused(
        "not-a-frame",
        "hg-text",
        "frame payload of 542393671 bytes exceeds",
    );
}

#[test]
fn unknown_frame_kind_in_answer_to_create_fails_create() {
    assert_create_refused("bad-kind-at-create", "hg-kind", "unknown frame kind 127");
}

#[test]
fn oversized_frame_while_running_kills_the_container() {
    assert_run_killed(
        "oversized-while-running",
        "hg-oversized",
        "frame payload of 4294967295 bytes exceeds",
    );
}

#[test]
fn unasked_reply_kills_the_container() {
    assert_run_killed("unasked-reply", "hg-reply", "a reply nobody asked for");
}

#[test]
fn exit_of_a_stream_never_started_kills_the_container() {
    assert_run_killed(
        "unknown-exit",
        "hg-exit",
        "an exit for stream 4242, which the host never started",
    );
}

#[test]
fn control_frame_that_is_not_json_kills_the_container() {
    assert_run_killed("bad-json", "hg-json", "malformed control message: EOF");
}

/// The setting itself: a `guest_agent` that is missing or not a file is
/// refused by `create` before anything exists, naming the option and path.
/// Needs no kernel: the check comes first.
#[test]
fn guest_agent_that_is_not_a_file_is_a_clear_error() {
    let mut f = Fixture::with_flags(&["--isolation=microvm"]);
    let missing = f.dir.path().join("no-such-agent");
    let config = f.dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[microvm]\nguest_agent = {:?}\n",
            missing.display().to_string()
        ),
    )
    .expect("config");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    let out = f.create("hg-noagent");
    assert_one_clear_error(&f, &out, "guest_agent");
    assert!(out.stderr.contains(&missing.display().to_string()), "{out}");
    assert!(out.stderr.contains("does not exist"), "{out}");
    assert_nothing_left(&f, "hg-noagent");

    let dir = f.dir.path().join("agent-dir");
    std::fs::create_dir(&dir).expect("dir");
    std::fs::write(
        &config,
        format!("[microvm]\nguest_agent = {:?}\n", dir.display().to_string()),
    )
    .expect("config");
    let out = f.create("hg-diragent");
    assert_one_clear_error(&f, &out, "is not a regular file");
    assert!(out.stderr.contains("guest_agent"), "{out}");
    assert_nothing_left(&f, "hg-diragent");
}

/// Not hostile, only slow: a guest that sends its Hello in pieces, with
/// pauses longer than the host's polling interval in the middle of the
/// frame, is still understood (no byte of a begun frame is dropped).
#[test]
fn hello_sent_in_slow_pieces_is_understood() {
    let f = require!(hostile("slow-hello"));
    let id = "hg-slow";
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), id]);
    assert_eq!(out.code, 7, "the guest reports status 7:\n{out}");
    assert_no_panic(&f, &out);
    assert_nothing_left(&f, id);
}

/// The guest boots from its share, where its init is the host's own file
/// (here the hostile binary; agentvm's binary otherwise), bound read-only.
/// Root in the guest, as PID 1, tries to write it, truncate it, chmod it
/// setuid, rename it, unlink it and hard-link it into the writable share:
/// every attempt is refused (the exit status has a bit per attempt that
/// worked), and the host's file is byte for byte and mode for mode as it
/// was.
#[test]
fn the_guest_cannot_change_its_init_which_is_the_hosts_file() {
    use std::os::unix::fs::PermissionsExt;
    let f = require!(hostile("tamper-init"));
    let bin = hostile_bin_dir().join("hostile-tamper-init");
    let before = std::fs::read(&bin).expect("read the hostile binary");
    let mode_before = std::fs::metadata(&bin).expect("stat").permissions().mode();
    let id = "hg-tamper";
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), id]);
    assert_eq!(
        out.code, 0,
        "bits of attempts that worked (write, truncate, chmod, rename, unlink, link; \
         64: no init in the share to attack):\n{out}"
    );
    assert!(
        std::fs::read(&bin).expect("read the hostile binary") == before,
        "the host's file changed"
    );
    assert_eq!(
        std::fs::metadata(&bin).expect("stat").permissions().mode(),
        mode_before
    );
    assert_no_panic(&f, &out);
    assert_nothing_left(&f, id);
}
