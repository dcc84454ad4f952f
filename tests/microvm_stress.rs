//! The microvm tier under pressure, and how a guest's death looks from the
//! host.
//!
//! - 500 execs, 8 at a time, into one container on a loaded machine: every
//!   one ends with exactly its own status and output. This guards the race
//!   between a process that exits at once and the supervisor's `Started`
//!   reply (src/microvm/supervisor/relays.rs): an exit that overtakes the
//!   reply, or goes to another exec's relay, shows up here as a wrong code,
//!   an error or a hang.
//! - A workload killed by SIGSEGV in the guest ends its supervisor on the
//!   host with status 139 by `exit`, never by the signal: the guest's word
//!   must not make a host process dump core. The test process becomes a
//!   child subreaper to adopt the supervisor and see its wait status
//!   itself, so it lives in a test binary of its own, and its two tests
//!   never run at the same time (the subreaper adopts every orphan of the
//!   process, and reaps them).
//!
//! Needs root, qemu-system-x86_64, virtiofsd (`make virtiofsd`) and the
//! kernel `kernels/build.sh` builds (`make kernel`); without them each test
//! prints `skipped: <why>`.

use agentvm_test_support as common;
use common::require;

use std::os::unix::process::ExitStatusExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use common::bundle::{assert_nothing_left, Fixture};
use common::wait_for;

/// The tests of this binary run one at a time: one of them adopts and
/// reaps every orphan of the process.
fn one_at_a_time() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: Mutex<()> = Mutex::new(());
    LOCK.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// A microvm fixture with a host directory mounted at /out in the guest.
fn microvm() -> Result<Fixture, String> {
    let f = common::guest::microvm_fixture("")?;
    std::fs::create_dir(out_dir(&f)).map_err(|e| format!("out dir: {e}"))?;
    Ok(f)
}

fn out_dir(f: &Fixture) -> PathBuf {
    f.dir.path().join("out")
}

fn bundle_arg(f: &Fixture) -> String {
    f.bundle().to_str().expect("utf-8").to_string()
}

/// Writes a bundle running `script` with `sh -c` and the out directory
/// at /out; `pid_namespace` false leaves the workload in the guest's
/// own pid namespace, where it is not an init that ignores signals.
fn write_script(f: &Fixture, script: &str, pid_namespace: bool) {
    let out = out_dir(f);
    f.write_config(&["sh", "-c", script], |c| {
        c["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(serde_json::json!({
                "destination": "/out", "type": "bind",
                "source": out, "options": ["rbind", "rw"]
            }));
        if !pid_namespace {
            c["linux"]["namespaces"]
                .as_array_mut()
                .expect("namespaces")
                .retain(|ns| ns["type"] != "pid");
        }
    });
}

/// Host processes that keep both cores busy while a test runs; killed
/// (they are ours) when dropped.
struct Load(Vec<Child>);

impl Load {
    fn start(n: usize) -> Load {
        Load(
            (0..n)
                .map(|_| {
                    Command::new("sh")
                        .args(["-c", "while :; do :; done"])
                        .stdin(Stdio::null())
                        .stdout(Stdio::null())
                        .spawn()
                        .expect("start a busy loop")
                })
                .collect(),
        )
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// One exec of the stress test: its script, and the status and output it
/// must end with.
struct Case {
    script: String,
    code: i32,
    stdout: String,
    stderr: String,
}

/// Exec `i`: exits with `i % 256` (so 0, 7, 126 and 255 among them); every
/// tenth also writes a line to stdout and one to stderr, and every fiftieth
/// a few kilobytes, right before it exits.
fn case(i: usize) -> Case {
    let code = (i % 256) as i32;
    if i % 50 == 25 {
        let stdout: String = (1..=2000).map(|n| format!("{n}\n")).collect();
        return Case {
            script: format!("seq 1 2000; exit {code}"),
            code,
            stdout,
            stderr: String::new(),
        };
    }
    if i % 10 == 3 {
        return Case {
            script: format!("echo out-{i}; echo err-{i} >&2; exit {code}"),
            code,
            stdout: format!("out-{i}\n"),
            stderr: format!("err-{i}\n"),
        };
    }
    Case {
        script: format!("exit {code}"),
        code,
        stdout: String::new(),
        stderr: String::new(),
    }
}

const EXECS: usize = 500;
const AT_A_TIME: usize = 8;

#[test]
fn five_hundred_execs_eight_at_a_time_on_a_loaded_machine() {
    let _one = one_at_a_time();
    let f = require!(microvm());
    let id = "mv-stress";
    write_script(&f, "echo up > /out/up; exec sleep 600", true);
    f.create(id).ok();
    f.agentvm(&["start", id]).ok();
    wait_for(60, || std::fs::read_to_string(out_dir(&f).join("up")).ok())
        .expect("the workload never started");

    // Eight threads take the next exec until all are done. A wrong one is
    // recorded, not fatal: all of them are counted, and the container is
    // deleted before the verdict. What the log says from here on is about
    // the execs.
    let log_before = std::fs::read_to_string(f.log()).unwrap_or_default().len();
    let load = Load::start(2);
    let next = AtomicUsize::new(0);
    let failures = Mutex::new(Vec::new());
    let latencies = Mutex::new(Vec::with_capacity(EXECS));
    let began = Instant::now();
    std::thread::scope(|s| {
        for _ in 0..AT_A_TIME {
            s.spawn(|| loop {
                let i = next.fetch_add(1, Ordering::SeqCst);
                if i >= EXECS {
                    return;
                }
                let want = case(i);
                let t = Instant::now();
                let out = f.agentvm(&["exec", id, "sh", "-c", &want.script]);
                latencies.lock().expect("latencies").push(t.elapsed());
                if out.code != want.code || out.stdout != want.stdout || out.stderr != want.stderr {
                    failures
                        .lock()
                        .expect("failures")
                        .push(format!("exec {i} (expected {}):\n{out}", want.code));
                }
            });
        }
    });
    let took = began.elapsed();
    drop(load);

    let mut latencies = latencies.into_inner().expect("latencies");
    latencies.sort();
    eprintln!(
        "{EXECS} execs, {AT_A_TIME} at a time, on a loaded machine: {:.1} s \
         (per exec: median {:.2} s, slowest {:.2} s)",
        took.as_secs_f64(),
        latencies[latencies.len() / 2].as_secs_f64(),
        latencies.last().expect("latencies").as_secs_f64(),
    );
    // The container outlived them all, and still answers.
    assert_eq!(f.state(id)["status"], "running", "{}", f.state(id));
    let out = f.agentvm(&["exec", id, "sh", "-c", "echo still-here"]).ok();
    assert_eq!(out.stdout, "still-here\n", "{out}");
    let log = std::fs::read_to_string(f.log()).unwrap_or_default();
    let errors: Vec<&str> = log
        .get(log_before..)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"level\":\"error\"") || l.contains("\"level\":\"warn\""))
        .collect();
    f.agentvm(&["delete", "--force", id]).ok();

    let failures = failures.into_inner().expect("failures");
    assert!(
        failures.is_empty(),
        "{} of {EXECS} execs ended wrong; the first ones:\n{}",
        failures.len(),
        failures[..failures.len().min(5)].join("\n")
    );
    assert!(
        errors.is_empty(),
        "errors or warnings in the log:\n{}",
        errors.join("\n")
    );
    assert_nothing_left(&f, id);
}

/// While alive, this process is a child subreaper: orphans among its
/// descendants (an `agentvm run --detach`'s supervisor, a dead
/// supervisor's VMM) become its children. Dropping it reaps them and
/// gives the role up.
struct Subreaper;

impl Subreaper {
    fn become_one() -> Subreaper {
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 1) takes no pointers.
        let rc = unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
        assert_eq!(rc, 0, "PR_SET_CHILD_SUBREAPER");
        Subreaper
    }
}

impl Drop for Subreaper {
    fn drop(&mut self) {
        reap_orphans(Duration::from_secs(10));
        // SAFETY: prctl(PR_SET_CHILD_SUBREAPER, 0) takes no pointers.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 0, 0, 0, 0) };
    }
}

/// Reaps every child of this process until it has none left, or `within`
/// has passed (a child still running then is for `assert_nothing_left`
/// to report). Only when no test command of ours runs: it would steal
/// their statuses.
fn reap_orphans(within: Duration) -> Vec<(i32, i32)> {
    let deadline = Instant::now() + within;
    let mut reaped = Vec::new();
    loop {
        let mut status = 0;
        // SAFETY: waitpid with a valid out-pointer; the tests of this
        // binary run one at a time, so every child is an adopted orphan.
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid > 0 {
            reaped.push((pid, status));
            continue;
        }
        if pid < 0 || Instant::now() > deadline {
            return reaped;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The parent pid of `pid`, from /proc.
fn parent_of(pid: i32) -> Option<i32> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(1)?
        .parse()
        .ok()
}

/// Waits for our child `pid` and returns its raw wait status.
#[track_caller]
fn wait_status(pid: i32, within: Duration) -> i32 {
    let deadline = Instant::now() + within;
    loop {
        let mut status = 0;
        // SAFETY: waitpid on one pid with a valid out-pointer.
        let rc = unsafe { libc::waitpid(pid, &mut status, libc::WNOHANG) };
        assert!(
            rc >= 0,
            "waitpid({pid}): {}",
            std::io::Error::last_os_error()
        );
        if rc == pid {
            return status;
        }
        assert!(Instant::now() < deadline, "{pid} did not end in {within:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// How a raw wait status reads, for messages.
fn describe_status(status: i32) -> String {
    if libc::WIFEXITED(status) {
        format!("exited with {}", libc::WEXITSTATUS(status))
    } else if libc::WIFSIGNALED(status) {
        format!(
            "was killed by signal {}{}",
            libc::WTERMSIG(status),
            if libc::WCOREDUMP(status) {
                " (core dumped)"
            } else {
                ""
            }
        )
    } else {
        format!("wait status {status:#x}")
    }
}

#[test]
fn a_guest_death_by_sigsegv_is_exit_139_and_no_core_on_the_host() {
    let _one = one_at_a_time();
    let f = require!(microvm());
    // The workload is not the init of a pid namespace (which ignores a
    // signal it sends itself): it dies of SIGSEGV as a crashing program
    // does, once the test knows the supervisor and lets it go.
    write_script(
        &f,
        "while [ ! -e /out/go ]; do sleep 0.1; done; kill -SEGV $$; echo survived",
        false,
    );
    let reaper = Subreaper::become_one();

    // Detached: the supervisor is orphaned when `run` returns, and ours.
    let id = "mv-segv";
    f.agentvm(&["run", "--detach", "--bundle", &bundle_arg(&f), id])
        .ok();
    let state = f.state(id);
    assert_eq!(state["status"], "running", "{state}");
    let supervisor = state["pid"].as_i64().expect("pid") as i32;
    assert_eq!(
        parent_of(supervisor),
        Some(std::process::id() as i32),
        "the supervisor {supervisor} was not adopted by the test"
    );
    std::fs::write(out_dir(&f).join("go"), "").expect("go");
    let status = wait_status(supervisor, Duration::from_secs(120));
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 139,
        "the supervisor must exit with 139 (by exit, not by the signal), but it {}",
        describe_status(status)
    );
    assert!(!libc::WCOREDUMP(status), "{}", describe_status(status));
    reap_orphans(Duration::from_secs(10));
    let state = f.state(id);
    assert_eq!(state["status"], "stopped", "{state}");
    f.agentvm(&["delete", id]).ok();
    assert_nothing_left(&f, id);

    // In the foreground `run` waits for the supervisor and exits as it did.
    let id = "mv-segv-fg";
    // Output to files, not pipes: the supervisor inherits them.
    let out_path = f.dir.path().join("run.out");
    let err_path = f.dir.path().join("run.err");
    let mut run = f
        .command(&["run", "--bundle", &bundle_arg(&f), id])
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn agentvm run");
    let deadline = Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(status) = run.try_wait().expect("wait for agentvm run") {
            break status.into_raw();
        }
        assert!(Instant::now() < deadline, "`agentvm run` did not end");
        std::thread::sleep(Duration::from_millis(20));
    };
    let stdout = std::fs::read_to_string(&out_path).unwrap_or_default();
    let stderr = std::fs::read_to_string(&err_path).unwrap_or_default();
    assert!(
        libc::WIFEXITED(status) && libc::WEXITSTATUS(status) == 139,
        "`agentvm run` must exit with 139, but it {}\n--- stdout ---\n{stdout}\n--- stderr ---\n{stderr}",
        describe_status(status)
    );
    assert!(!stdout.contains("survived"), "{stdout}");
    drop(reaper);
    assert_nothing_left(&f, id);
}
