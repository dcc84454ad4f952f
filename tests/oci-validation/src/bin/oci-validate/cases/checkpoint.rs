//! `checkpoint` and `restore` through CRIU, as runc 1.1 does them.
//!
//! What is checked depends on whether CRIU can run on this host (`criu
//! check`), a fact of the host, not of the runtime: where it can, a
//! checkpoint stops the workload and removes the container, and a restore
//! brings the same workload back running where it was (a counter it
//! writes to a bind mount goes on from its value, where a fresh start
//! would count from 1); the restored container is killed and deleted like
//! any other; a second restore of its id, and one from a directory with no
//! images, are refused and leave nothing. Where CRIU cannot run (CRIU 3.17
//! on a kernel whose vDSO layout it does not know), the checkpoint fails
//! with `criu failed: ...` and CRIU's log, and the container goes on
//! running. A created container is refused in runc's words either way.
//!
//! The container gets pipes for its stdio, as a shim gives it: CRIU saves
//! pipes, and cannot reopen a host file it did not see mounted.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::Result;

use super::{CaseFn, Ctx};
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[
    ("checkpoint", checkpoint),
    ("checkpoint-tty", checkpoint_tty),
    ("checkpoint-options", checkpoint_options),
];

const DUMP: &str = "checkpoint of a running container";
const RESTORE: &str = "restore from the images";
const GOES_ON: &str = "restore: the workload goes on from where it was";
const STOPPED: &str = "checkpoint: the workload stops with it";
const LIFECYCLE: &str = "restore: the restored container is killed and deleted as any other";
const TWICE: &str = "restore of an id in use is refused and the first goes on";
const NO_IMAGES: &str = "restore from a directory without images fails and leaves no container";
const FAILED: &str = "a failed restore leaves no container";

/// Whether CRIU runs here: `Err(why)` when it does not.
fn criu_works() -> Result<(), String> {
    match Command::new("criu")
        .arg("check")
        .stdin(Stdio::null())
        .output()
    {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => {
            let err = String::from_utf8_lossy(&o.stderr);
            let last = err.lines().rev().find(|l| !l.trim().is_empty());
            Err(format!("criu check: {}", last.unwrap_or("failed")))
        }
        Err(e) => Err(format!("no criu: {e}")),
    }
}

/// A runtime command run with pipes for its stdio, which a container it
/// starts keeps (the harness never reads them to their end). Its exit code
/// (`None` on a timeout, after which it is killed), and its stderr when it
/// failed (then no container holds the pipe). The child is kept so that
/// the pipes stay open while the container runs.
fn with_pipes(ctx: &Ctx, args: &[&str]) -> Result<(Option<i32>, String, Child)> {
    use std::io::Read;
    let mut child = ctx
        .rt
        .command(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()?;
    crate::reaper::register(child.id());
    let status = crate::runtime::wait_timeout(&mut child, Duration::from_secs(60))?;
    crate::reaper::unregister(child.id());
    let Some(status) = status else {
        let _ = child.kill();
        let _ = child.wait();
        return Ok((None, "timed out".into(), child));
    };
    let mut err = String::new();
    if !status.success() {
        if let Some(mut e) = child.stderr.take() {
            let _ = e.read_to_string(&mut err);
        }
    }
    Ok((status.code(), err, child))
}

/// A bundle whose workload counts into `n` of a bind-mounted scratch
/// directory (written to a new file and renamed, never read half-written),
/// and that directory.
fn counter_bundle(ctx: &mut Ctx) -> Result<(std::path::PathBuf, crate::bundle::Bundle)> {
    let shared = ctx.scratch("counter")?;
    let mut b = ctx.bundle()?;
    b.args(&[
        "/bin/sh",
        "-c",
        "i=0; while :; do i=$((i+1)); echo $i > /counter/n.new; mv /counter/n.new /counter/n; sleep 0.05; done",
    ]);
    b.push(
        "/mounts",
        serde_json::json!({
            "destination": "/counter", "type": "bind",
            "source": shared, "options": ["rbind", "rw"]
        }),
    );
    b.write()?;
    Ok((shared, b))
}

fn counter(dir: &Path) -> u64 {
    std::fs::read_to_string(dir.join("n"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(0)
}

/// Polls `f` for up to `secs` seconds.
fn poll<T>(secs: u64, mut f: impl FnMut() -> Option<T>) -> Option<T> {
    let deadline = std::time::Instant::now() + Duration::from_secs(secs);
    loop {
        if let Some(v) = f() {
            return Some(v);
        }
        if std::time::Instant::now() >= deadline {
            return None;
        }
        crate::reaper::tick(Duration::from_millis(20));
    }
}

fn checkpoint(ctx: &mut Ctx) -> Result<()> {
    let criu = match Command::new("criu").arg("--version").output() {
        Ok(o) if o.status.success() => criu_works(),
        _ => {
            ctx.skip_all(
                &[
                    "checkpoint of a created container: refused as runc",
                    &format!("{DUMP}: CRIU ran"),
                    &format!("{DUMP}: the container's state after it"),
                    &format!("{RESTORE}: runs, or fails as CRIU did"),
                    STOPPED,
                    GOES_ON,
                    LIFECYCLE,
                    TWICE,
                    NO_IMAGES,
                    FAILED,
                ],
                "criu is not installed",
            );
            return Ok(());
        }
    };

    let (shared, b) = counter_bundle(ctx)?;
    let id = ctx.id();
    let (code, err, _created) = with_pipes(ctx, &["create", "--bundle", &b.dir_str(), &id])?;
    anyhow::ensure!(code == Some(0), "create: {code:?}: {err}");
    let dir = ctx.scratch("checkpoint")?;
    let created_images = dir.join("created");
    let out = ctx.rt.run(&[
        "checkpoint",
        "--image-path",
        &created_images.to_string_lossy(),
        &id,
    ])?;
    ctx.check(
        "checkpoint of a created container: refused as runc",
        out.code == Some(1)
            && out
                .stderr
                .contains("Container cannot be checkpointed in created state")
            && !created_images.exists(),
        || {
            format!(
                "{}; images dir made: {}",
                out.describe(),
                created_images.exists()
            )
        },
    );
    let out = ctx.rt.run(&["start", &id])?;
    anyhow::ensure!(out.success(), "start: {}", out.describe());
    anyhow::ensure!(
        poll(20, || (counter(&shared) >= 10).then_some(())).is_some(),
        "the workload did not count to 10 in 20 s"
    );

    let images = dir.join("images");
    let out = ctx
        .rt
        .run(&["checkpoint", "--image-path", &images.to_string_lossy(), &id])?;
    let log = images.join("dump.log");
    let st = ctx.state(&id);
    let saved = counter(&shared);
    match &criu {
        Ok(()) => {
            ctx.check(
                format!("{DUMP}: CRIU ran"),
                out.success() && images.join("inventory.img").exists(),
                || format!("{}; inventory.img: {}", out.describe(), show_dir(&images)),
            );
            ctx.check(
                format!("{DUMP}: the container's state after it"),
                st.is_err(),
                || format!("want the container gone, got {}", super::show(&st)),
            );
            crate::reaper::tick(Duration::from_millis(300));
            let later = counter(&shared);
            ctx.check(STOPPED, later == saved, || {
                format!("the counter went from {saved} to {later} after the checkpoint")
            });
        }
        Err(why) => {
            ctx.check(
                format!("{DUMP}: CRIU ran"),
                out.code == Some(1) && out.stderr.contains("criu failed: ") && log.exists(),
                || {
                    format!(
                        "CRIU cannot run here ({why}): want exit 1, \"criu failed: \" and {}, got {}; {}",
                        log.display(),
                        out.describe(),
                        show_dir(&images)
                    )
                },
            );
            ctx.check(
                format!("{DUMP}: the container's state after it"),
                st.as_ref().is_ok_and(|s| s["status"] == "running"),
                || format!("want it running on, got {}", super::show(&st)),
            );
        }
    }

    // Restore under another id when the first still runs.
    let rid = match st.is_ok() {
        true => ctx.id(),
        false => id.clone(),
    };
    let restore_args = |rid: &str, images: &Path| -> Vec<String> {
        [
            "restore",
            "--detach",
            "--bundle",
            &b.dir_str(),
            "--image-path",
            &images.to_string_lossy(),
            rid,
        ]
        .map(String::from)
        .to_vec()
    };
    let args = restore_args(&rid, &images);
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let (code, err, _restored) = with_pipes(ctx, &args)?;
    let rst = ctx.state(&rid);
    let Ok(()) = criu else {
        ctx.check(
            format!("{RESTORE}: runs, or fails as CRIU did"),
            code == Some(1) && err.contains("criu failed: ") && images.join("restore.log").exists(),
            || format!("want exit 1 and \"criu failed: \", got {code:?}: {err}"),
        );
        ctx.check(FAILED, rst.is_err(), || super::show(&rst));
        let why = "CRIU cannot run on this host, so nothing was restored";
        ctx.skip_all(&[STOPPED, GOES_ON, LIFECYCLE, TWICE, NO_IMAGES], why);
        return Ok(());
    };
    ctx.record(
        FAILED,
        Outcome::Skip("CRIU runs on this host: the restore is expected to succeed".into()),
    );
    let running = code == Some(0) && rst.as_ref().is_ok_and(|s| s["status"] == "running");
    ctx.check(
        format!("{RESTORE}: runs, or fails as CRIU did"),
        running,
        || format!("exit {code:?}: {err}; {}", super::show(&rst)),
    );
    if !running {
        let why = "the restore failed";
        ctx.skip_all(&[GOES_ON, LIFECYCLE, TWICE, NO_IMAGES], why);
        return Ok(());
    }
    let first = poll(10, || {
        let n = counter(&shared);
        (n != saved).then_some(n)
    });
    ctx.check(GOES_ON, first.is_some_and(|n| n > saved), || match first {
        Some(n) => format!("the counter was {saved} at the checkpoint, {n} after the restore"),
        None => format!("the counter stays at {saved} after the restore"),
    });

    let again = ctx.rt.run(&args)?;
    let still = ctx.state(&rid);
    ctx.check(
        TWICE,
        again.code.is_some_and(|c| c != 0)
            && still.as_ref().is_ok_and(|s| s["status"] == "running"),
        || format!("{}; the first: {}", again.describe(), super::show(&still)),
    );

    let nothing = ctx.scratch("no-images")?;
    let nid = ctx.id();
    let none_args = restore_args(&nid, &nothing);
    let none_args: Vec<&str> = none_args.iter().map(String::as_str).collect();
    let out = ctx.rt.run(&none_args)?;
    let nst = ctx.state(&nid);
    ctx.check(
        NO_IMAGES,
        out.code.is_some_and(|c| c != 0) && nst.is_err(),
        || format!("{}; {}", out.describe(), super::show(&nst)),
    );

    let killed = ctx.rt.run(&["kill", &rid, "KILL"])?;
    let stopped = ctx.wait_status(&rid, "stopped");
    let deleted = ctx.rt.run(&["delete", &rid])?;
    let gone = ctx.state(&rid);
    ctx.check(
        LIFECYCLE,
        killed.success() && stopped.is_ok() && deleted.success() && gone.is_err(),
        || {
            format!(
                "kill: {}; stopped: {}; delete: {}; after: {}",
                killed.describe(),
                super::show(&stopped),
                deleted.describe(),
                super::show(&gone)
            )
        },
    );
    Ok(())
}

const TTY_DUMP: &str = "checkpoint of a container with a terminal";
const TTY_SOCKET: &str = "restore hands the terminal's master to the console socket";
const TTY_GOES_ON: &str = "the restored workload goes on writing to its terminal";

/// A container with a terminal: CRIU keeps the pty's slave side in the
/// images (orphan-pts-master) and the restore hands a new master to the
/// console socket, on which the workload's output goes on (its counter
/// from where it stopped).
fn checkpoint_tty(ctx: &mut Ctx) -> Result<()> {
    use super::console::{read_pty_for, recv_pty};
    let checks = [TTY_DUMP, TTY_SOCKET, TTY_GOES_ON];
    match Command::new("criu").arg("--version").output() {
        Ok(o) if o.status.success() => {}
        _ => {
            ctx.skip_all(&checks, "criu is not installed");
            return Ok(());
        }
    }
    if let Err(why) = criu_works() {
        ctx.skip_all(&checks, &format!("CRIU cannot run on this host ({why})"));
        return Ok(());
    }
    let dir = ctx.scratch("tty")?;
    let mut b = ctx.bundle()?;
    b.args(&[
        "/bin/sh",
        "-c",
        "i=0; while :; do i=$((i+1)); echo $i > /counter/n.new; mv /counter/n.new /counter/n; echo n=$i; sleep 0.05; done",
    ]);
    b.set("/process/terminal", serde_json::json!(true));
    b.push(
        "/mounts",
        serde_json::json!({
            "destination": "/counter", "type": "bind",
            "source": dir, "options": ["rbind", "rw"]
        }),
    );
    b.write()?;
    let id = ctx.id();
    let socket = dir.join("console-1.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    let mut pending = ctx.rt.spawn(&[
        "run",
        "--detach",
        "--console-socket",
        &socket.to_string_lossy(),
        "--bundle",
        &b.dir_str(),
        &id,
    ])?;
    let master = recv_pty(&listener, &mut pending)?;
    let out = pending.wait(crate::runtime::TIMEOUT)?;
    anyhow::ensure!(out.success(), "run: {}", out.describe());
    anyhow::ensure!(
        poll(20, || (counter(&dir) >= 10).then_some(())).is_some(),
        "the workload did not count to 10 in 20 s"
    );
    let images = dir.join("images");
    let out = ctx
        .rt
        .run(&["checkpoint", "--image-path", &images.to_string_lossy(), &id])?;
    let saved = counter(&dir);
    drop(master);
    let gone = ctx.state(&id);
    let dumped = ctx.check(TTY_DUMP, out.success() && gone.is_err(), || {
        format!("{}; after: {}", out.describe(), super::show(&gone))
    });
    if !dumped {
        ctx.skip_all(&[TTY_SOCKET, TTY_GOES_ON], "the checkpoint failed");
        return Ok(());
    }
    let socket = dir.join("console-2.sock");
    let listener = std::os::unix::net::UnixListener::bind(&socket)?;
    let mut pending = ctx.rt.spawn(&[
        "restore",
        "--detach",
        "--console-socket",
        &socket.to_string_lossy(),
        "--bundle",
        &b.dir_str(),
        "--image-path",
        &images.to_string_lossy(),
        &id,
    ])?;
    let master = recv_pty(&listener, &mut pending);
    let out = pending.wait(crate::runtime::TIMEOUT)?;
    let st = ctx.state(&id);
    let master = match master {
        Ok(m) if out.success() && st.is_ok() => {
            ctx.record(TTY_SOCKET, Outcome::Ok);
            m
        }
        other => {
            let why = other.err().map(|e| format!("{e:#}")).unwrap_or_default();
            ctx.record(
                TTY_SOCKET,
                Outcome::Fail(format!("{why}; {}; {}", out.describe(), super::show(&st))),
            );
            ctx.skip_all(&[TTY_GOES_ON], "the restore failed");
            return Ok(());
        }
    };
    let text = read_pty_for(master, Duration::from_secs(2));
    let counts: Vec<u64> = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("n=")?.parse::<u64>().ok())
        .collect();
    // The workload writes the counter file before it prints the line: a
    // dump between the two prints the saved value's line after the
    // restore. A fresh start would print from 1.
    let goes_on = counts.first().is_some_and(|&n| n >= saved) && counts.iter().any(|&n| n > saved);
    ctx.check(TTY_GOES_ON, goes_on, || {
        format!("the counter was {saved} at the checkpoint; the terminal then read {text:?}")
    });
    Ok(())
}

/// A directory's entries, for a failure detail.
fn show_dir(dir: &Path) -> String {
    match std::fs::read_dir(dir) {
        Ok(rd) => {
            let names: Vec<String> = rd
                .filter_map(|e| e.ok())
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect();
            format!("{} holds {names:?}", dir.display())
        }
        Err(e) => format!("{}: {e}", dir.display()),
    }
}

/// Whether `criu check --feature NAME` passes here.
fn criu_feature(name: &str) -> bool {
    Command::new("criu")
        .args(["check", "--feature", name])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Whether a socket listens on TCP `port` (`/proc/net/tcp` and `tcp6`,
/// state 0A).
fn listens(port: &str) -> bool {
    let Ok(port) = port.parse::<u16>() else {
        return false;
    };
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let mut it = l.split_whitespace();
                let local = it.nth(1).unwrap_or("");
                let state = it.nth(1).unwrap_or("");
                local.ends_with(&want) && state == "0A"
            })
        })
    })
}

/// A free TCP port on the loopback address.
fn free_port() -> Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// A running container counting into a bind-mounted directory, with pipes
/// for its stdio; the child keeps them open.
fn counting(ctx: &mut Ctx) -> Result<(String, std::path::PathBuf, crate::bundle::Bundle, Child)> {
    let (shared, b) = counter_bundle(ctx)?;
    let id = ctx.id();
    let (code, err, child) = with_pipes(ctx, &["run", "-d", "--bundle", &b.dir_str(), &id])?;
    anyhow::ensure!(code == Some(0), "run -d: {code:?}: {err}");
    anyhow::ensure!(
        poll(20, || (counter(&shared) >= 5).then_some(())).is_some(),
        "the workload did not count to 5 in 20 s"
    );
    Ok((id, shared, b, child))
}

/// Whether the counter moves on from `from` within a few seconds.
fn goes_on(shared: &Path, from: u64) -> bool {
    poll(10, || (counter(shared) > from).then_some(())).is_some()
}

/// runc's checkpoint options beyond the plain dump, each as runc 1.1 on
/// this host does it: the pages to a CRIU page server and a restore from
/// them; `--pre-dump` and `--parent-path` (or runc's refusal when CRIU
/// cannot track memory here); a paused container dumped from its frozen
/// cgroup; bad `--page-server` and `--empty-ns` values refused in runc's
/// words, the container untouched.
fn checkpoint_options(ctx: &mut Ctx) -> Result<()> {
    const PS_DUMP: &str = "checkpoint --page-server: the pages go to the page server";
    const PS_RESTORE: &str = "checkpoint --page-server: restore from its images goes on";
    const PRE: &str = "checkpoint --pre-dump: as runc (or refused: CRIU is missing features)";
    const PRE_RUNS: &str = "checkpoint --pre-dump: the container runs on";
    const PARENT: &str = "checkpoint --parent-path after a pre-dump: restore goes on";
    const PAUSED: &str = "checkpoint of a paused container: dumped and gone";
    const PAUSED_RESTORE: &str = "restore of a paused container's images: running, goes on";
    const BAD_PS: &str = "checkpoint --page-server without a port: refused in runc's words";
    const BAD_NS: &str = "checkpoint --empty-ns time: refused in runc's words";
    const UNTOUCHED: &str = "after the refusals the container runs on";
    const ALL: &[&str] = &[
        PS_DUMP,
        PS_RESTORE,
        PRE,
        PRE_RUNS,
        PARENT,
        PAUSED,
        PAUSED_RESTORE,
        BAD_PS,
        BAD_NS,
        UNTOUCHED,
    ];
    if let Err(why) = criu_works() {
        ctx.skip_all(ALL, &format!("CRIU cannot run on this host ({why})"));
        return Ok(());
    }
    let dir = ctx.scratch("options")?;

    // Refusals first, on a running container.
    let (id, shared, b, _child) = counting(ctx)?;
    let out = ctx.rt.run(&[
        "checkpoint",
        "--page-server",
        "127.0.0.1",
        "--image-path",
        &dir.join("bad").to_string_lossy(),
        &id,
    ])?;
    ctx.check(
        BAD_PS,
        out.code == Some(1)
            && out
                .stderr
                .contains("Use --page-server ADDRESS:PORT to specify page server"),
        || out.describe(),
    );
    let out = ctx.rt.run(&[
        "checkpoint",
        "--empty-ns",
        "time",
        "--image-path",
        &dir.join("bad").to_string_lossy(),
        &id,
    ])?;
    ctx.check(
        BAD_NS,
        // (logrus escapes the quotes around the name)
        out.code == Some(1)
            && out.stderr.contains("namespace")
            && out.stderr.contains("time")
            && out.stderr.contains("is not supported"),
        || out.describe(),
    );
    let now = counter(&shared);
    let st = ctx.state(&id);
    ctx.check(
        UNTOUCHED,
        st.as_ref().is_ok_and(|s| s["status"] == "running") && goes_on(&shared, now),
        || super::show(&st),
    );

    // Pre-dump, then a dump on top of it.
    let pre = dir.join("pre");
    let out = ctx.rt.run(&[
        "checkpoint",
        "--pre-dump",
        "--image-path",
        &pre.to_string_lossy(),
        &id,
    ])?;
    let tracking = criu_feature("mem_dirty_track");
    let _ = match tracking {
        true => ctx.check(PRE, out.success(), || out.describe()),
        false => ctx.check(
            PRE,
            out.code == Some(1) && out.stderr.contains("CRIU is missing features"),
            || format!("CRIU cannot track memory here: {}", out.describe()),
        ),
    };
    let now = counter(&shared);
    let st = ctx.state(&id);
    ctx.check(
        PRE_RUNS,
        st.as_ref().is_ok_and(|s| s["status"] == "running") && goes_on(&shared, now),
        || super::show(&st),
    );
    if tracking && out.success() {
        let full = dir.join("full");
        let out = ctx.rt.run(&[
            "checkpoint",
            "--parent-path",
            "../pre",
            "--image-path",
            &full.to_string_lossy(),
            &id,
        ])?;
        let saved = counter(&shared);
        let (code, err, _restored) = with_pipes(
            ctx,
            &[
                "restore",
                "-d",
                "--bundle",
                &b.dir_str(),
                "--image-path",
                &full.to_string_lossy(),
                &id,
            ],
        )?;
        ctx.check(
            PARENT,
            out.success() && code == Some(0) && goes_on(&shared, saved),
            || format!("checkpoint: {}; restore: {code:?} {err}", out.describe()),
        );
    } else {
        ctx.record(
            PARENT,
            Outcome::Skip("CRIU cannot track memory changes on this host (criu check --feature mem_dirty_track)".into()),
        );
    }
    ctx.rt.quiet(&["delete", "--force", &id]);

    // The pages to a page server.
    let (id, shared, b, _child) = counting(ctx)?;
    let images = dir.join("page-server");
    std::fs::create_dir_all(&images)?;
    let port = free_port()?.to_string();
    let mut server = Command::new("criu")
        .args(["page-server", "--images-dir"])
        .arg(&images)
        .args(["--port", &port])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()?;
    crate::reaper::register(server.id());
    // Until it listens (a connection would be its one client).
    let listening = poll(10, || listens(&port).then_some(()));
    anyhow::ensure!(
        listening.is_some(),
        "criu page-server did not listen on {port}"
    );
    let out = ctx.rt.run(&[
        "checkpoint",
        "--page-server",
        &format!("127.0.0.1:{port}"),
        "--image-path",
        &images.to_string_lossy(),
        &id,
    ])?;
    let served = crate::runtime::wait_timeout(&mut server, Duration::from_secs(20))?;
    if served.is_none() {
        let _ = server.kill();
        let _ = server.wait();
    }
    crate::reaper::unregister(server.id());
    let pages = std::fs::read_dir(&images)
        .map(|rd| {
            rd.flatten()
                .any(|e| e.file_name().to_string_lossy().starts_with("pages-"))
        })
        .unwrap_or(false);
    ctx.check(
        PS_DUMP,
        out.success() && pages && ctx.state(&id).is_err(),
        || {
            format!(
                "{}; page server exited: {served:?}; {}",
                out.describe(),
                show_dir(&images)
            )
        },
    );
    let saved = counter(&shared);
    let (code, err, _restored) = with_pipes(
        ctx,
        &[
            "restore",
            "-d",
            "--bundle",
            &b.dir_str(),
            "--image-path",
            &images.to_string_lossy(),
            &id,
        ],
    )?;
    ctx.check(
        PS_RESTORE,
        code == Some(0) && goes_on(&shared, saved),
        || format!("restore: {code:?} {err}"),
    );
    ctx.rt.quiet(&["delete", "--force", &id]);

    // A paused container.
    let (id, shared, b, _child) = counting(ctx)?;
    let out = ctx.rt.run(&["pause", &id])?;
    anyhow::ensure!(out.success(), "pause: {}", out.describe());
    let paused = dir.join("paused");
    let out = ctx
        .rt
        .run(&["checkpoint", "--image-path", &paused.to_string_lossy(), &id])?;
    let st = ctx.state(&id);
    ctx.check(PAUSED, out.success() && st.is_err(), || {
        format!("{}; {}", out.describe(), super::show(&st))
    });
    let saved = counter(&shared);
    let (code, err, _restored) = with_pipes(
        ctx,
        &[
            "restore",
            "-d",
            "--bundle",
            &b.dir_str(),
            "--image-path",
            &paused.to_string_lossy(),
            &id,
        ],
    )?;
    let st = ctx.state(&id);
    ctx.check(
        PAUSED_RESTORE,
        code == Some(0)
            && st.as_ref().is_ok_and(|s| s["status"] == "running")
            && goes_on(&shared, saved),
        || format!("restore: {code:?} {err}; {}", super::show(&st)),
    );
    ctx.rt.quiet(&["delete", "--force", &id]);
    Ok(())
}
