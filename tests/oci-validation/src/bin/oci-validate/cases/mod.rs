//! The cases, and the context each one runs in for one runtime.

mod caps;
mod cgroups;
mod checkpoint;
mod cli;
mod console;
mod devices;
mod events;
mod exec;
mod hooks;
mod lifecycle;
mod mounts;
mod namespaces;
mod process;
mod seccomp_notify;
mod security;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use oci_validation::expect::{Check, Expectations};
use oci_validation::{Line, CHECKER_PATH};
use serde_json::Value;

use crate::bundle::{self, Bundle};
use crate::report::Outcome;
use crate::runtime::{Output, Runtime};

pub use process::HOST_ONLY_VAR;

/// A case: builds its bundles, drives the runtime and records checks.
pub type CaseFn = fn(&mut Ctx) -> Result<()>;

/// Every case, in the order they run.
pub fn all() -> Vec<(&'static str, CaseFn)> {
    let mut v: Vec<(&'static str, CaseFn)> = Vec::new();
    v.extend_from_slice(process::CASES);
    v.extend_from_slice(caps::CASES);
    v.extend_from_slice(namespaces::CASES);
    v.extend_from_slice(mounts::CASES);
    v.extend_from_slice(devices::CASES);
    v.extend_from_slice(security::CASES);
    v.extend_from_slice(seccomp_notify::CASES);
    v.extend_from_slice(cgroups::CASES);
    v.extend_from_slice(lifecycle::CASES);
    v.extend_from_slice(hooks::CASES);
    v.extend_from_slice(console::CASES);
    v.extend_from_slice(exec::CASES);
    v.extend_from_slice(cli::CASES);
    v.extend_from_slice(checkpoint::CASES);
    v.extend_from_slice(events::CASES);
    v
}

/// What all runtimes share: the work directory, the template rootfs and
/// facts about the host.
#[derive(Debug)]
pub struct Env {
    pub work: PathBuf,
    pub template: PathBuf,
    /// `readlink /proc/self/ns/NAME` of the harness, by NAME.
    pub host_ns: HashMap<String, String>,
    /// A prefix unique to this run for container ids and cgroup paths.
    pub tag: String,
}

impl Env {
    pub fn new(work: PathBuf, template: PathBuf) -> Env {
        let host_ns = ["pid", "net", "ipc", "uts", "mnt", "cgroup", "user", "time"]
            .iter()
            .filter_map(|n| {
                std::fs::read_link(format!("/proc/self/ns/{n}"))
                    .ok()
                    .map(|l| ((*n).to_string(), l.to_string_lossy().into_owned()))
            })
            .collect();
        Env {
            work,
            template,
            host_ns,
            tag: format!("ov{}", std::process::id()),
        }
    }
}

/// One case running against one runtime.
pub struct Ctx<'a> {
    pub rt: &'a Runtime,
    pub env: &'a Env,
    rt_index: usize,
    case: &'static str,
    seq: usize,
    pub results: Vec<(String, Outcome)>,
    dirs: Vec<PathBuf>,
    ids: Vec<String>,
}

impl<'a> Ctx<'a> {
    pub fn new(rt: &'a Runtime, env: &'a Env, rt_index: usize, case: &'static str) -> Ctx<'a> {
        Ctx {
            rt,
            env,
            rt_index,
            case,
            seq: 0,
            results: Vec::new(),
            dirs: Vec::new(),
            ids: Vec::new(),
        }
    }

    /// A container id unique to this run, runtime and case; deleted (forced)
    /// when the case ends.
    pub fn id(&mut self) -> String {
        self.seq += 1;
        let id = format!(
            "{}-{}-{}-{}",
            self.env.tag, self.rt_index, self.case, self.seq
        );
        self.ids.push(id.clone());
        id
    }

    /// A cgroup path unique to this container.
    pub fn cgroup_path(&self, id: &str) -> String {
        format!("/{}/{id}", self.env.tag)
    }

    /// A fresh directory on the host, removed when the case ends.
    pub fn scratch(&mut self, name: &str) -> Result<PathBuf> {
        self.seq += 1;
        let d = self.env.work.join("scratch").join(format!(
            "{}-{}-{}-{name}",
            self.rt.name, self.case, self.seq
        ));
        std::fs::create_dir_all(&d).with_context(|| format!("create {}", d.display()))?;
        bundle::set_mode(&d, 0o777)?;
        self.dirs.push(d.clone());
        Ok(d)
    }

    /// A fresh bundle with the base config.
    pub fn bundle(&mut self) -> Result<Bundle> {
        self.seq += 1;
        let d = self
            .env
            .work
            .join("bundles")
            .join(format!("{}-{}-{}", self.rt.name, self.case, self.seq));
        self.dirs.push(d.clone());
        Bundle::create(d, &self.env.template)
    }

    pub fn record(&mut self, check: impl AsRef<str>, outcome: Outcome) {
        self.results
            .push((format!("{}/{}", self.case, check.as_ref()), outcome));
    }

    /// Records each of `checks` as skipped for the same reason (a case
    /// that cannot run on this host still names what it would check).
    pub fn skip_all(&mut self, checks: &[&str], why: &str) {
        for check in checks {
            self.record(check, Outcome::Skip(why.to_string()));
        }
    }

    /// Records ok when `cond` holds, otherwise a failure with `detail()`.
    pub fn check(
        &mut self,
        check: impl AsRef<str>,
        cond: bool,
        detail: impl FnOnce() -> String,
    ) -> bool {
        let o = if cond {
            Outcome::Ok
        } else {
            Outcome::Fail(detail())
        };
        self.record(check, o);
        cond
    }

    /// Records that a runtime command succeeded; returns whether it did.
    pub fn check_ok(&mut self, check: &str, out: &Output) -> bool {
        self.check(check, out.success(), || out.describe())
    }

    /// Records that a runtime command was refused (non-zero exit).
    pub fn check_refused(&mut self, check: &str, out: &Output) -> bool {
        let refused = !out.timed_out && out.code.is_some_and(|c| c != 0);
        self.check(check, refused, || {
            format!("expected an error, got {}", out.describe())
        })
    }

    /// Writes the bundle and records that `run` is refused with exit 1 and
    /// `phrase` in its error (runc's logrus escapes the quotes; they are
    /// compared unescaped), and that no container is left behind.
    pub fn check_run_refused(&mut self, b: &Bundle, check: &str, phrase: &str) -> Result<()> {
        b.write()?;
        let id = self.id();
        let out = self.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
        self.check(
            check,
            out.code == Some(1) && out.stderr.replace("\\\"", "\"").contains(phrase),
            || {
                format!(
                    "want exit 1 and {phrase:?} on stderr, got {}",
                    out.describe()
                )
            },
        );
        let left = self.rt.run(&["state", &id])?;
        self.check(
            format!("{check}: no container left"),
            !left.success(),
            || format!("state after the refused run: {}", left.describe()),
        );
        Ok(())
    }

    /// Records one result per expectation from checker output; expectations
    /// with no line fail with `why`.
    pub fn record_lines(&mut self, exp: &Expectations, output: &str, why: &str) {
        let mut seen: HashMap<String, Outcome> = HashMap::new();
        let names: Vec<&str> = exp.checks.iter().map(|e| e.name.as_str()).collect();
        for l in output.lines().filter_map(|l| Line::parse_known(l, &names)) {
            let (n, o) = match l {
                Line::Ok(n) => (n, Outcome::Ok),
                Line::NotOk(n, d) => (n, Outcome::Fail(d)),
                Line::Skip(n, d) => (n, Outcome::Skip(d)),
            };
            seen.entry(n).or_insert(o);
        }
        for e in &exp.checks {
            let o = seen
                .remove(e.name.trim())
                .unwrap_or_else(|| Outcome::Fail(format!("no result from the checker ({why})")));
            self.record(&e.name, o);
        }
    }

    /// Writes the bundle and the expectations, runs the container in the
    /// foreground (`run`) and records the checker's results.
    pub fn run_checker(&mut self, b: &Bundle, exp: &Expectations) -> Result<Output> {
        let id = self.id();
        self.run_checker_as(b, exp, &id)
    }

    /// As [`Ctx::run_checker`], with a container id from [`Ctx::id`].
    pub fn run_checker_as(&mut self, b: &Bundle, exp: &Expectations, id: &str) -> Result<Output> {
        b.write_expect(exp)?;
        b.write()?;
        let id = id.to_string();
        let out = self.rt.run(&["run", "--bundle", &b.dir_str(), &id])?;
        self.record_lines(exp, &out.stdout, &out.describe());
        self.rt.quiet(&["delete", "--force", &id]);
        Ok(out)
    }

    /// Creates and starts a container from `b` whose init sleeps; returns
    /// its id and host pid.
    pub fn start_sleeper(&mut self, b: &mut Bundle) -> Result<(String, i32)> {
        let id = self.id();
        let pid = self.start_sleeper_as(b, &id)?;
        Ok((id, pid))
    }

    /// As [`Ctx::start_sleeper`], with a container id from [`Ctx::id`];
    /// returns the host pid.
    pub fn start_sleeper_as(&mut self, b: &mut Bundle, id: &str) -> Result<i32> {
        b.args(&["/bin/sleep", "600"]);
        b.write()?;
        let id = id.to_string();
        let out = self.rt.run(&["create", "--bundle", &b.dir_str(), &id])?;
        if !out.success() {
            bail!("create: {}", out.describe());
        }
        let out = self.rt.run(&["start", &id])?;
        if !out.success() {
            bail!("start: {}", out.describe());
        }
        let st = self.state(&id).map_err(|e| anyhow!("state: {e}"))?;
        let pid = st["pid"]
            .as_i64()
            .and_then(|p| i32::try_from(p).ok())
            .filter(|p| *p > 0)
            .ok_or_else(|| anyhow!("state has no pid: {st}"))?;
        Ok(pid)
    }

    /// Runs the checker in container `id` with `exec` (plus `opts`), with
    /// its expectations in a file of its own, and records the results.
    pub fn exec_checker(
        &mut self,
        b: &Bundle,
        id: &str,
        exp: &Expectations,
        opts: &[&str],
    ) -> Result<Output> {
        self.exec_checker_at(b, id, exp, opts, CHECKER_PATH)
    }

    /// As [`Ctx::exec_checker`], with the checker at `checker` in the
    /// container (a copy with other modes).
    pub fn exec_checker_at(
        &mut self,
        b: &Bundle,
        id: &str,
        exp: &Expectations,
        opts: &[&str],
        checker: &str,
    ) -> Result<Output> {
        self.seq += 1;
        let path = format!("/oci-expect-exec-{}.json", self.seq);
        b.write_expect_at(&path, exp)?;
        let mut args = vec!["exec"];
        args.extend_from_slice(opts);
        args.extend_from_slice(&[id, checker, path.as_str()]);
        let out = self.rt.run(&args)?;
        self.record_lines(exp, &out.stdout, &out.describe());
        Ok(out)
    }

    /// `state ID` parsed as JSON.
    pub fn state(&self, id: &str) -> Result<Value, String> {
        let out = self.rt.run(&["state", id]).map_err(|e| format!("{e:#}"))?;
        if !out.success() {
            return Err(out.describe());
        }
        serde_json::from_str(&out.stdout)
            .map_err(|e| format!("state is not JSON ({e}): {}", out.stdout))
    }

    /// Polls `state ID` until its status is `want` (up to 10 s).
    pub fn wait_status(&self, id: &str, want: &str) -> Result<Value, String> {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let st = self.state(id);
            let last = match &st {
                Ok(v) if v["status"] == want => return st,
                Ok(v) => format!("status {}", v["status"]),
                Err(e) => e.clone(),
            };
            if Instant::now() >= deadline {
                return Err(format!("never reached {want:?}; last: {last}"));
            }
            crate::reaper::tick(Duration::from_millis(20));
        }
    }

    /// Ends the case: force-deletes its containers, removes its directories.
    pub fn cleanup(&mut self) {
        for id in std::mem::take(&mut self.ids) {
            if self.state(&id).is_ok() {
                self.rt.quiet(&["delete", "--force", &id]);
            }
        }
        for d in std::mem::take(&mut self.dirs) {
            remove_unless_mounted(&d);
        }
    }
}

/// Removes a directory unless something is still mounted under it (a
/// runtime that leaked a mount into the host): then it is left for a look.
pub fn remove_unless_mounted(d: &Path) {
    let mounted = std::fs::read_to_string("/proc/self/mountinfo")
        .map(|t| {
            t.lines().any(|l| {
                l.split(' ')
                    .nth(4)
                    .is_some_and(|m| Path::new(m).starts_with(d))
            })
        })
        .unwrap_or(true);
    if mounted {
        eprintln!("warning: {} still has mounts; left in place", d.display());
    } else if d.exists() {
        // Removal is best-effort; the whole work dir goes at the end.
        let _ = std::fs::remove_dir_all(d);
    }
}

/// A state result for a failure detail: compact JSON or the error.
pub fn show(st: &Result<Value, String>) -> String {
    match st {
        Ok(v) => format!("state {v}"),
        Err(e) => format!("state failed: {e}"),
    }
}

/// Waits up to 10 s for a file to exist with non-empty content.
pub fn wait_file(path: &Path) -> Option<String> {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        if let Ok(s) = std::fs::read_to_string(path) {
            if !s.is_empty() {
                return Some(s);
            }
        }
        if Instant::now() >= deadline {
            return None;
        }
        crate::reaper::tick(Duration::from_millis(10));
    }
}

/// Force-deletes whatever containers of this run a runtime still lists
/// (a runtime whose delete failed during a case).
pub fn sweep(rt: &Runtime, env: &Env) {
    let Ok(out) = rt.run(&["list", "--format", "json"]) else {
        return;
    };
    let list: Vec<Value> = serde_json::from_str(&out.stdout).unwrap_or_default();
    for c in list {
        if let Some(id) = c["id"].as_str().filter(|id| id.starts_with(&env.tag)) {
            eprintln!(
                "warning: [{}] container {id} left behind; deleting",
                rt.name
            );
            rt.quiet(&["delete", "--force", id]);
        }
    }
}

/// A new user namespace with root mapped to host uid 100000 and gid
/// 200000, 65536 ids each.
pub fn user_namespace(b: &mut Bundle) {
    b.push("/linux/namespaces", serde_json::json!({"type": "user"}));
    b.set(
        "/linux/uidMappings",
        serde_json::json!([{"containerID": 0, "hostID": 100000, "size": 65536}]),
    );
    b.set(
        "/linux/gidMappings",
        serde_json::json!([{"containerID": 0, "hostID": 200000, "size": 65536}]),
    );
}

/// Removes the per-run cgroup parents (`/<tag>`) that cases with an explicit
/// cgroupsPath leave in each hierarchy once their containers are gone.
pub fn cleanup_cgroups(env: &Env) {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return;
    };
    for e in entries.flatten() {
        let d = e.path().join(&env.tag);
        if d.is_dir() {
            // Only empty cgroups can go; a leaked one stays for a look.
            if let Err(err) = std::fs::remove_dir(&d) {
                eprintln!("warning: cannot remove cgroup {}: {err}", d.display());
            }
        }
    }
}

/// The expected value of a namespace link of the host (the harness).
pub fn host_ns(env: &Env, ns: &str) -> String {
    env.host_ns.get(ns).cloned().unwrap_or_default()
}

/// Builds `Check::Namespace`.
pub fn ns_check(ns: &str, relation: oci_validation::expect::Relation, reference: String) -> Check {
    Check::Namespace {
        ns: ns.to_string(),
        relation,
        reference,
    }
}
