//! `checkpoint` and `restore` through CRIU, as runc 1.1 does them.
//!
//! What is checked depends on whether CRIU can run on this host (`criu
//! check`), a fact of the host, not of the runtime: where it can, a
//! checkpoint removes the container and a restore brings it back running;
//! where it cannot (CRIU 3.17 on a kernel whose vDSO layout it does not
//! know), the checkpoint fails with `criu failed: ...` and CRIU's log,
//! and the container goes on running. A created container is refused in
//! runc's words either way.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Result;

use super::{CaseFn, Ctx};
use crate::report::Outcome;

pub const CASES: &[(&str, CaseFn)] = &[("checkpoint", checkpoint)];

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

fn checkpoint(ctx: &mut Ctx) -> Result<()> {
    const DUMP: &str = "checkpoint of a running container";
    const RESTORE: &str = "restore from the images";
    let criu = match Command::new("criu").arg("--version").output() {
        Ok(o) if o.status.success() => criu_works(),
        _ => {
            ctx.skip_all(
                &[
                    "checkpoint of a created container: refused as runc",
                    &format!("{DUMP}: CRIU ran"),
                    &format!("{DUMP}: the container's state after it"),
                    &format!("{RESTORE}: runs, or fails as CRIU did"),
                    "a failed restore leaves no container",
                ],
                "criu is not installed",
            );
            return Ok(());
        }
    };

    let mut b = ctx.bundle()?;
    b.args(&["/bin/sleep", "600"]);
    b.write()?;
    let id = ctx.id();
    let out = ctx.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
    anyhow::ensure!(out.success(), "create: {}", out.describe());
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

    let images = dir.join("images");
    let out = ctx
        .rt
        .run(&["checkpoint", "--image-path", &images.to_string_lossy(), &id])?;
    let log = images.join("dump.log");
    let st = ctx.state(&id);
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
    let out = ctx.rt.run(&[
        "restore",
        "--detach",
        "--bundle",
        &b.dir_str(),
        "--image-path",
        &images.to_string_lossy(),
        &rid,
    ])?;
    let rst = ctx.state(&rid);
    match &criu {
        Ok(()) => {
            ctx.check(
                format!("{RESTORE}: runs, or fails as CRIU did"),
                out.success() && rst.as_ref().is_ok_and(|s| s["status"] == "running"),
                || format!("{}; {}", out.describe(), super::show(&rst)),
            );
        }
        Err(_) => {
            ctx.check(
                format!("{RESTORE}: runs, or fails as CRIU did"),
                out.code == Some(1)
                    && out.stderr.contains("criu failed: ")
                    && images.join("restore.log").exists(),
                || format!("want exit 1 and \"criu failed: \", got {}", out.describe()),
            );
            ctx.check("a failed restore leaves no container", rst.is_err(), || {
                super::show(&rst)
            });
        }
    }
    if criu.is_ok() {
        ctx.record(
            "a failed restore leaves no container",
            Outcome::Skip("CRIU runs on this host: the restore is expected to succeed".into()),
        );
    }
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
