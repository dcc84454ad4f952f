//! `agentvm exec`

use std::path::{Path, PathBuf};

use anyhow::Context as _;
use clap::Args;
use oci_spec::runtime::Process;

use crate::context::{absolute, Context};
use crate::tier::ExecRequest;

#[derive(Args, Debug)]
pub struct ExecArgs {
    #[arg(long = "console-socket")]
    pub console_socket: Option<PathBuf>,
    /// Current working directory in the container
    #[arg(long)]
    pub cwd: Option<PathBuf>,
    /// Set environment variables (KEY=VALUE)
    #[arg(short, long)]
    pub env: Vec<String>,
    /// Allocate a pseudo-TTY
    #[arg(short, long)]
    pub tty: bool,
    /// UID[:GID] to run as
    #[arg(short, long)]
    pub user: Option<String>,
    /// Additional group ids
    #[arg(short = 'g', long = "additional-gids")]
    pub additional_gids: Vec<u32>,
    /// Path to a process.json
    #[arg(short, long)]
    pub process: Option<PathBuf>,
    /// Detach from the process
    #[arg(short, long)]
    pub detach: bool,
    #[arg(long = "pid-file")]
    pub pid_file: Option<PathBuf>,
    /// SELinux label of the process (refused: not supported)
    #[arg(long = "process-label")]
    pub process_label: Option<String>,
    /// AppArmor profile of the process (refused where AppArmor is off)
    #[arg(long)]
    pub apparmor: Option<String>,
    #[arg(long = "no-new-privs")]
    pub no_new_privs: bool,
    /// Add a capability
    #[arg(short, long)]
    pub cap: Vec<String>,
    #[arg(long = "preserve-fds", default_value_t = 0)]
    pub preserve_fds: i32,
    /// Run the process in an (existing) sub-cgroup(s). Format is
    /// [<controller>:]<cgroup>; may be repeated, one per controller
    #[arg(long)]
    pub cgroup: Vec<String>,
    /// Allow exec into a paused container
    #[arg(long = "ignore-paused")]
    pub ignore_paused: bool,
    pub id: String,
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub command: Vec<String>,
}

/// Builds the process for a flag-style exec the way runc does: the
/// container's own process settings, overridden by the flags.
fn process_from_flags(config: &Path, args: &ExecArgs) -> anyhow::Result<Process> {
    if args.command.is_empty() {
        anyhow::bail!("exec needs a command to run, or --process");
    }
    // runc warns once about the names it ignores, the config's and the
    // flags' together.
    let (spec, mut unknown_caps) = crate::bundle::Bundle::read_spec(config)?;
    let mut p = spec.process().clone().unwrap_or_default();
    p.set_args(Some(args.command.clone()));
    p.set_terminal(Some(args.tty));
    if let Some(cwd) = &args.cwd {
        p.set_cwd(cwd.clone());
    }
    let mut env = p.env().clone().unwrap_or_default();
    for kv in &args.env {
        let key = kv.split('=').next().unwrap_or_default();
        env.retain(|e| e.split('=').next() != Some(key));
        env.push(kv.clone());
    }
    p.set_env(Some(env));
    let mut user = p.user().clone();
    if let Some(u) = &args.user {
        let (uid, gid) = match u.split_once(':') {
            Some((uid, gid)) => (uid, Some(gid)),
            None => (u.as_str(), None),
        };
        user.set_uid(
            uid.parse()
                .map_err(|_| anyhow::anyhow!("invalid --user {u:?}: expected numeric UID[:GID]"))?,
        );
        if let Some(gid) = gid {
            user.set_gid(gid.parse().map_err(|_| {
                anyhow::anyhow!("invalid --user {u:?}: expected numeric UID[:GID]")
            })?);
        }
    }
    if !args.additional_gids.is_empty() {
        user.set_additional_gids(Some(args.additional_gids.clone()));
    }
    p.set_user(user);
    if args.no_new_privs {
        p.set_no_new_privileges(Some(true));
    }
    // As runc: the flags set the process's label and profile, which the
    // tier then applies or refuses (never silently drops).
    if let Some(label) = &args.process_label {
        p.set_selinux_label(Some(label.clone()));
    }
    if let Some(profile) = &args.apparmor {
        p.set_apparmor_profile(Some(profile.clone()));
    }
    if !args.cap.is_empty() {
        let mut caps = p.capabilities().clone().unwrap_or_default();
        // runc: ambient capabilities need inheritable ones, which `--cap`
        // does not add, so it adds to the ambient set only when the
        // process already has an inheritable set.
        let ambient = caps.inheritable().is_some();
        for cap in known_caps(&args.cap, &mut unknown_caps) {
            let add = |s: Option<oci_spec::runtime::Capabilities>| {
                let mut s = s.unwrap_or_default();
                s.insert(cap);
                Some(s)
            };
            caps.set_bounding(add(caps.bounding().clone()));
            caps.set_effective(add(caps.effective().clone()));
            caps.set_permitted(add(caps.permitted().clone()));
            if ambient {
                caps.set_ambient(add(caps.ambient().clone()));
            }
        }
        p.set_capabilities(Some(caps));
    }
    crate::bundle::warn_unknown_capabilities(unknown_caps);
    Ok(p)
}

/// The capabilities `--cap` names, spelled as runc spells them
/// (`CAP_SYS_ADMIN`); a name that is not one goes into `unknown`, for
/// runc's warning (runc ignores it).
fn known_caps(names: &[String], unknown: &mut Vec<String>) -> Vec<oci_spec::runtime::Capability> {
    let mut known = Vec::new();
    for name in names {
        match crate::bundle::known_capability(name) {
            Some(cap) => known.push(cap),
            None => unknown.push(name.clone()),
        }
    }
    known
}

/// `agentvm exec`; every failure reads `exec failed: ...`, as runc's.
pub fn run(ctx: &Context, args: ExecArgs) -> anyhow::Result<u8> {
    exec(ctx, args).context("exec failed")
}

fn exec(ctx: &Context, args: ExecArgs) -> anyhow::Result<u8> {
    let (tier, _) = super::open(ctx, &args.id, None)?;
    let process = match &args.process {
        Some(p) => process_from_file(p)?,
        None => {
            let bundle = tier.state(ctx, &args.id)?.bundle;
            process_from_flags(&bundle.join("config.json"), &args)?
        }
    };
    let console_socket = args.console_socket.as_deref().map(absolute).transpose()?;
    let pid_file = super::pid_file(args.pid_file.as_deref())?;
    super::create::ensure_audit_exporter(ctx);
    let result = tier.exec(
        ctx,
        &ExecRequest {
            id: &args.id,
            process: &process,
            console_socket: console_socket.as_deref(),
            pid_file: pid_file.as_deref(),
            detach: args.detach,
            preserve_fds: args.preserve_fds,
            ignore_paused: args.ignore_paused,
            cgroup: &args.cgroup,
        },
    );
    // The tiers write the line of an exec that started (they see its
    // end); one that failed is written here.
    if let Err(e) = &result {
        let why = crate::audit::exec::error_chain(e);
        crate::audit::exec::append_or_warn(
            &ctx.config.audit.path(),
            &args.id,
            crate::audit::exec::event(&process, None, Some(&why), None),
        );
    }
    Ok(result?)
}

/// Reads and checks a `--process` file. As in runc, a process without
/// `user` runs as uid 0, gid 0 (the zero value of runc's `User`); `cwd` and
/// `args` must be given.
fn process_from_file(p: &Path) -> anyhow::Result<Process> {
    let path = absolute(p)?;
    let text = std::fs::read(&path)
        .with_context(|| format!("cannot read process file {}", path.display()))?;
    let invalid = || format!("invalid process file {}", path.display());
    let mut value: serde_json::Value = serde_json::from_slice(&text).with_context(invalid)?;
    let Some(fields) = value.as_object_mut() else {
        anyhow::bail!("{}: not a JSON object", invalid());
    };
    let user = fields
        .entry("user")
        .or_insert_with(|| serde_json::json!({}));
    if let Some(user) = user.as_object_mut() {
        user.entry("uid").or_insert(0.into());
        user.entry("gid").or_insert(0.into());
    }
    if fields
        .get("cwd")
        .and_then(|c| c.as_str())
        .is_none_or(str::is_empty)
    {
        anyhow::bail!("process file {}: cwd must not be empty", path.display());
    }
    crate::bundle::warn_unknown_capabilities(crate::bundle::drop_unknown_capabilities(&mut value));
    let process: Process = serde_json::from_value(value).with_context(invalid)?;
    if process.args().as_ref().is_none_or(|a| a.is_empty()) {
        anyhow::bail!("process file {}: args must not be empty", path.display());
    }
    Ok(process)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(text: &str) -> anyhow::Result<Process> {
        let dir = tempfile::tempdir().expect("tempdir");
        let p = dir.path().join("process.json");
        std::fs::write(&p, text).expect("write");
        process_from_file(&p)
    }

    #[test]
    fn a_process_without_user_is_root() {
        let p = file(r#"{"args":["/bin/id"],"cwd":"/"}"#).expect("accepted");
        assert_eq!((p.user().uid(), p.user().gid()), (0, 0));
        let p = file(r#"{"args":["/bin/id"],"cwd":"/","user":{"uid":7}}"#).expect("accepted");
        assert_eq!((p.user().uid(), p.user().gid()), (7, 0));
    }

    #[test]
    fn cwd_and_args_are_required() {
        let e = file(r#"{"args":["/bin/id"]}"#).expect_err("no cwd");
        assert!(format!("{e:#}").contains("cwd must not be empty"), "{e:#}");
        let e = file(r#"{"args":[],"cwd":"/"}"#).expect_err("no args");
        assert!(format!("{e:#}").contains("args must not be empty"), "{e:#}");
        assert!(file("[]").is_err());
    }

    #[test]
    fn cap_flags_take_runc_s_spelling_and_skip_the_rest() {
        use oci_spec::runtime::Capability;
        let names: Vec<String> = [
            "CAP_SYS_ADMIN",
            "SYS_ADMIN",
            "cap_net_raw",
            "CAP_BOGUS",
            "CAP_KILL",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        let mut unknown = Vec::new();
        assert_eq!(
            known_caps(&names, &mut unknown),
            vec![Capability::SysAdmin, Capability::Kill]
        );
        assert_eq!(unknown, ["SYS_ADMIN", "cap_net_raw", "CAP_BOGUS"]);
    }
}
