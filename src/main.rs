//! agentvm: an OCI runtime, command-line compatible with runc, that runs each
//! container at the isolation tier its operator picks.

use std::process::ExitCode;

use clap::Parser;

mod bundle;
mod cli;
mod config;
mod container;
mod context;
mod guest;
mod logging;
mod microvm;
mod signal;
mod state;

use cli::{Cli, Command};
use context::Context;

fn main() -> ExitCode {
    // Booted as /init of a microVM: the guest agent (never returns).
    if std::process::id() == 1 {
        guest::main();
    }
    // SIGPIPE stays ignored (Rust's default) so that a hook that exits
    // without reading its state, or a closed stdout, is an error we handle
    // rather than our death; workloads get the default back right before
    // their exec (see container::exec::Workload).
    let cli = Cli::parse();
    if cli.global.version {
        print!("{}", cli::version_text());
        return ExitCode::SUCCESS;
    }
    let Some(command) = cli.command else {
        eprintln!("agentvm: no command given; see 'agentvm --help'");
        return ExitCode::from(1);
    };
    let guard = match logging::init(
        cli.global.log.as_deref(),
        cli.global.log_format,
        cli.global.debug,
    ) {
        Ok(g) => g,
        Err(e) => {
            eprintln!("agentvm: cannot open log file: {e}");
            return ExitCode::from(1);
        }
    };
    match dispatch(&cli.global, command) {
        Ok(code) => ExitCode::from(code),
        Err(err) => {
            let msg = format!("{err:#}");
            tracing::error!("{msg}");
            if guard.to_file || cli.global.log_format == cli::LogFormat::Json {
                eprintln!("agentvm: {msg}");
            }
            ExitCode::from(1)
        }
    }
}

/// Runs one command; the result is the process exit code.
fn dispatch(global: &cli::GlobalOpts, command: Command) -> anyhow::Result<u8> {
    // Commands that need no state directory.
    match &command {
        Command::Spec(args) => return cli::spec::run(args, global.rootless.as_deref()).map(|_| 0),
        Command::Features(args) => return cli::features::run(global, args).map(|_| 0),
        Command::Check(args) => return cli::check::run(global, args),
        _ => {}
    }
    let ctx = Context::new(global)?;
    match command {
        Command::Create(args) => cli::create::run(&ctx, args).map(|_| 0),
        Command::Start(args) => cli::start::run(&ctx, args).map(|_| 0),
        Command::Run(args) => cli::run::run(&ctx, args),
        Command::State(args) => cli::state::run(&ctx, args).map(|_| 0),
        Command::Kill(args) => cli::kill::run(&ctx, args).map(|_| 0),
        Command::Delete(args) => cli::delete::run(&ctx, args).map(|_| 0),
        Command::List(args) => cli::list::run(&ctx, args).map(|_| 0),
        Command::Ps(args) => cli::ps::run(&ctx, args).map(|_| 0),
        Command::Exec(args) => cli::exec::run(&ctx, args),
        Command::Pause(args) => cli::pause::pause(&ctx, args).map(|_| 0),
        Command::Resume(args) => cli::pause::resume(&ctx, args).map(|_| 0),
        Command::Events(args) => cli::events::run(&ctx, args).map(|_| 0),
        Command::Update(args) => cli::update::run(&ctx, args).map(|_| 0),
        Command::Supervise(args) => {
            crate::microvm::supervisor::run(crate::microvm::supervisor::Args {
                dir: ctx.container_dir(&args.id),
                console_socket: args.console_socket,
                config: ctx.config,
            })
        }
        Command::Spec(_) | Command::Features(_) | Command::Check(_) => {
            unreachable!("handled above")
        }
    }
}
