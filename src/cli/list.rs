//! `agentvm list`

use std::io::Write;

use clap::Args;

use crate::context::Context;
use crate::state::{lock_container, LockMode};
use crate::tier::RuncState;

#[derive(Args, Debug)]
pub struct ListArgs {
    /// Output format: table or json
    #[arg(short, long, default_value = "table")]
    pub format: String,
    /// Print only the container ids
    #[arg(short, long)]
    pub quiet: bool,
}

pub fn run(ctx: &Context, args: ListArgs) -> anyhow::Result<()> {
    let mut states: Vec<RuncState> = Vec::new();
    let mut ids: Vec<String> = std::fs::read_dir(&ctx.root)?
        .filter_map(|e| e.ok())
        .filter(|e| e.file_type().map(|t| t.is_dir()).unwrap_or(false))
        .filter_map(|e| e.file_name().into_string().ok())
        .filter(|id| !id.starts_with('.'))
        .collect();
    ids.sort();
    for id in ids {
        // A container deleted meanwhile is simply not listed.
        let Ok(_lock) = lock_container(&ctx.root, &id, LockMode::Shared) else {
            continue;
        };
        let state = super::open(ctx, &id, None)
            .and_then(|(tier, _)| Ok(tier.state(ctx, &id)?))
            .map_err(|e| format!("{e:#}"));
        match state {
            Ok(mut s) => {
                s.owner = owner(&ctx.root.join(&id));
                states.push(s)
            }
            Err(e) => tracing::warn!("skipping container {id}: {e}"),
        }
    }
    let mut out = Vec::new();
    if args.quiet {
        for s in &states {
            writeln!(out, "{}", s.id)?;
        }
    } else {
        match args.format.as_str() {
            "json" => writeln!(out, "{}", super::json_list(&states)?)?,
            "table" => write_table(&mut out, &states)?,
            other => anyhow::bail!("invalid format option {other:?}: expected table or json"),
        }
    }
    super::emit(&String::from_utf8_lossy(&out))
}

/// Who owns a container, as runc's `list` names it: the user owning its
/// state directory, by name, or `#UID` when no user has that id (`state`
/// leaves the field empty, as runc's does).
fn owner(dir: &std::path::Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata(dir) else {
        return String::new();
    };
    match nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(meta.uid())) {
        Ok(Some(user)) => user.name,
        _ => format!("#{}", meta.uid()),
    }
}

fn write_table(out: &mut impl Write, states: &[RuncState]) -> std::io::Result<()> {
    let rows: Vec<[String; 6]> =
        std::iter::once(["ID", "PID", "STATUS", "BUNDLE", "CREATED", "OWNER"].map(String::from))
            .chain(states.iter().map(|s| {
                [
                    s.id.clone(),
                    s.pid.to_string(),
                    s.status.to_string(),
                    s.bundle.display().to_string(),
                    s.created.clone(),
                    s.owner.clone(),
                ]
            }))
            .collect();
    let mut widths = [0usize; 6];
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    for row in &rows {
        let mut line = String::new();
        for (i, cell) in row.iter().enumerate() {
            if i + 1 == row.len() {
                line.push_str(cell);
            } else {
                line.push_str(&format!("{cell:<w$}", w = (widths[i] + 3).max(12)));
            }
        }
        writeln!(out, "{line}")?;
    }
    Ok(())
}
