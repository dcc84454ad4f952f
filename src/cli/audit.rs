//! `agentvm audit ID [--follow]`: one container's lines of the host-wide
//! audit file, exactly as written (so `jq` reads them), and the hidden
//! `agentvm audit-export`, the OTLP exporter (see `audit::export`).
//!
//! As `docker logs`: a container with no lines prints nothing and exits 0;
//! an id that has no line and no container under `--root` is an error. The
//! audit outlives the container: a deleted container's lines are printed.
//!
//! `--follow` prints what is there, then the lines appended after, until
//! SIGINT or SIGTERM (exit 0), or until the container is gone (its state
//! directory under `--root` removed, i.e. deleted) and nothing was written
//! for it for [`FOLLOW_GRACE`]. A rotation by `copytruncate` is followed
//! (reading starts again at the top of the emptied file).

use std::io::{BufWriter, StdoutLock, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use clap::Args;

use crate::audit::read::{is_of, Follower};
use crate::context::Context;

/// How long `--follow` waits for late lines of a container that is gone.
pub const FOLLOW_GRACE: Duration = Duration::from_secs(2);
/// How often `--follow` looks for new lines.
const FOLLOW_POLL: Duration = Duration::from_millis(200);

#[derive(Args, Debug)]
pub struct AuditArgs {
    /// Keep printing lines as they are written
    #[arg(short, long)]
    pub follow: bool,
    pub id: String,
}

/// Where the output stands after a write.
enum Out {
    Open,
    /// The reader went away (`| head`): stop quietly.
    Closed,
}

struct Printer<'a> {
    id: &'a str,
    out: BufWriter<StdoutLock<'static>>,
    printed: u64,
}

impl Printer<'_> {
    fn line(&mut self, line: &[u8]) -> anyhow::Result<Out> {
        if !is_of(line, self.id) {
            return Ok(Out::Open);
        }
        self.printed += 1;
        match self
            .out
            .write_all(line)
            .and_then(|_| self.out.write_all(b"\n"))
        {
            Ok(()) => Ok(Out::Open),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Out::Closed),
            Err(e) => Err(e.into()),
        }
    }

    fn flush(&mut self) -> anyhow::Result<Out> {
        match self.out.flush() {
            Ok(()) => Ok(Out::Open),
            Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(Out::Closed),
            Err(e) => Err(e.into()),
        }
    }

    /// Prints the matching complete lines there are now; how many.
    fn drain(
        &mut self,
        follower: &mut Follower,
        path: &std::path::Path,
    ) -> anyhow::Result<(u64, Out)> {
        let before = self.printed;
        while let Some(line) = follower
            .next_line()
            .with_context(|| format!("cannot read audit log {}", path.display()))?
        {
            if let Out::Closed = self.line(&line)? {
                return Ok((self.printed - before, Out::Closed));
            }
        }
        let out = self.flush()?;
        Ok((self.printed - before, out))
    }
}

pub fn run(ctx: &Context, args: AuditArgs) -> anyhow::Result<()> {
    crate::bundle::validate_id(&args.id)?;
    let path = ctx.config.audit.path();
    let exists = || ctx.container_dir(&args.id).exists();
    let mut follower = Follower::new(&path);
    let mut p = Printer {
        id: &args.id,
        out: BufWriter::new(std::io::stdout().lock()),
        printed: 0,
    };
    if let (_, Out::Closed) = p.drain(&mut follower, &path)? {
        return Ok(());
    }
    if !args.follow {
        if let Some(rest) = follower.take_rest() {
            p.line(&rest)?;
            p.flush()?;
        }
    }
    if p.printed == 0 && !exists() {
        anyhow::bail!(
            "no audit lines for container {} in {}, and no such container under {}",
            args.id,
            path.display(),
            ctx.root.display()
        );
    }
    if !args.follow {
        return Ok(());
    }
    // From here SIGINT and SIGTERM end the command with status 0 (before,
    // while the file is read, they end it as they would `cat`).
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let mut last = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        let (n, out) = p.drain(&mut follower, &path)?;
        if let Out::Closed = out {
            break;
        }
        if n > 0 {
            last = Instant::now();
        } else if last.elapsed() >= FOLLOW_GRACE && !exists() {
            break;
        }
        std::thread::sleep(FOLLOW_POLL);
    }
    Ok(())
}

/// `agentvm audit-export`: runs the exporter of the config's audit file
/// until SIGTERM or SIGINT.
pub fn export(ctx: &Context) -> anyhow::Result<()> {
    let endpoint = ctx
        .config
        .audit
        .endpoint()
        .context("no [audit] otlp_endpoint in the config: nothing to export to")?;
    let stop = Arc::new(AtomicBool::new(false));
    for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
        signal_hook::flag::register(sig, stop.clone()).context("cannot install signal handlers")?;
    }
    let opts = crate::audit::export::Options::new(ctx.config.audit.path(), endpoint);
    if !crate::audit::export::run(&opts, &stop)? {
        tracing::debug!("an audit exporter of {} runs already", opts.audit.display());
    }
    Ok(())
}
