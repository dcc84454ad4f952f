//! `agentvm ps`

use std::process::Command;

use clap::Args;

use crate::context::Context;
use crate::state::LockMode;
use crate::tier::ProcessTable;

#[derive(Args, Debug)]
pub struct PsArgs {
    /// Output format: table or json
    #[arg(short, long, default_value = "table")]
    pub format: String,
    pub id: String,
    /// Arguments for ps(1) (default -ef)
    #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
    pub ps_args: Vec<String>,
}

pub fn run(ctx: &Context, args: PsArgs) -> anyhow::Result<()> {
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Shared))?;
    match args.format.as_str() {
        "json" => {
            let pids = tier.host_pids(ctx, &args.id)?;
            super::emit(&format!("{}\n", super::json_list(&pids)?))
        }
        "table" => match tier.process_table(ctx, &args.id, &args.ps_args)? {
            ProcessTable::Host(pids) => table(&pids, &args.ps_args),
            ProcessTable::Guest(processes) => guest_table(&processes),
        },
        other => anyhow::bail!("invalid format option {other:?}: expected table or json"),
    }
}

/// The guest's processes of a microVM container, ps-style.
fn guest_table(processes: &[crate::protocol::GuestProcess]) -> anyhow::Result<()> {
    let mut text = format!("{:>7} {:>7} {:>6} CMD\n", "PID", "PPID", "UID");
    for p in processes {
        text.push_str(&format!(
            "{:>7} {:>7} {:>6} {}\n",
            p.pid, p.ppid, p.uid, p.cmd
        ));
    }
    super::emit(&text)
}

/// Runs the host's ps and keeps the header and the container's processes,
/// as runc does.
fn table(pids: &[i32], ps_args: &[String]) -> anyhow::Result<()> {
    let ps_args: Vec<String> = if ps_args.is_empty() {
        vec!["-ef".into()]
    } else {
        ps_args.to_vec()
    };
    let output = Command::new("ps")
        .args(&ps_args)
        .output()
        .map_err(|e| anyhow::anyhow!("cannot run ps: {e}"))?;
    if !output.status.success() {
        anyhow::bail!(
            "ps {} failed: {}",
            ps_args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&output.stdout);
    let mut lines = text.lines();
    let header = lines.next().unwrap_or_default();
    let pid_col = header
        .split_whitespace()
        .position(|h| h == "PID")
        .ok_or_else(|| anyhow::anyhow!("ps output has no PID column"))?;
    let mut text = format!("{header}\n");
    for line in lines {
        let pid = line
            .split_whitespace()
            .nth(pid_col)
            .and_then(|p| p.parse::<i32>().ok());
        if pid.is_some_and(|p| pids.contains(&p)) {
            text.push_str(line);
            text.push('\n');
        }
    }
    super::emit(&text)
}
