//! The command line's usage in runc's shape (runc is built on urfave/cli):
//! help in `NAME:` / `USAGE:` / `COMMANDS:` / `OPTIONS:` sections on
//! stdout; a wrong flag or argument count prints `Incorrect Usage` and the
//! command's help on stdout, logs the error and exits 1; an unknown command
//! logs `No help topic for 'NAME'` and exits 3; `-h` exits 0.

use std::ffi::OsString;
use std::process::ExitCode;

use clap::error::{ContextKind, ContextValue, ErrorKind};
use clap::{CommandFactory, FromArgMatches};

use super::{version_text, Cli, LogFormat};

/// Exit status of an unknown command, as urfave/cli's.
const UNKNOWN_COMMAND: u8 = 3;

/// The global flags that take a value as the next argument.
const GLOBAL_WITH_VALUE: &[&str] = &[
    "--root",
    "--log",
    "--log-format",
    "--criu",
    "--isolation",
    "--egress",
    "--config",
];

/// The command line, with help in runc's sections.
pub fn command() -> clap::Command {
    let version: String = version_text()
        .lines()
        .map(|l| format!("   {l}\n"))
        .collect();
    let root = format!(
        "NAME:\n   {{name}} - {{about}}\n\n\
         USAGE:\n   {{bin}} [global options] command [command options] [arguments...]\n\n\
         VERSION:\n{version}\n\
         COMMANDS:\n{{subcommands}}\n\n\
         GLOBAL OPTIONS:\n{{options}}\n"
    );
    let mut cmd = Cli::command().help_template(root);
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    for name in names {
        let sub = format!(
            "NAME:\n   agentvm {name} - {{about}}\n\nUSAGE:\n   {{usage}}\n\nOPTIONS:\n{{options}}\n"
        );
        let bin = format!("agentvm {name}");
        cmd = cmd.mut_subcommand(name, |s| s.help_template(sub).bin_name(bin));
    }
    cmd
}

/// Parses the process's arguments; on a usage error, says so as runc does
/// and returns the exit status.
pub fn parse() -> Result<Cli, ExitCode> {
    let args: Vec<OsString> = std::env::args_os().collect();
    let mut cmd = command();
    let result = cmd
        .try_get_matches_from_mut(&args)
        .and_then(|m| Cli::from_arg_matches(&m));
    result.map_err(|e| refuse(&args, &mut cmd, &e))
}

/// Prints the help of the whole command line on stdout.
pub fn print_help() {
    let text = command().render_help().to_string();
    // A closed stdout is not worth an error here.
    let _ = super::emit(&text);
}

fn refuse(args: &[OsString], cmd: &mut clap::Command, e: &clap::Error) -> ExitCode {
    if matches!(
        e.kind(),
        ErrorKind::DisplayHelp | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    ) {
        let _ = super::emit(&e.render().to_string());
        return ExitCode::SUCCESS;
    }
    let mut sub = subcommand_of(args, cmd);
    if e.kind() == ErrorKind::UnknownArgument && before_command(args, e, sub.as_deref()) {
        // A flag before the command is the application's, as urfave/cli
        // sees it: `agentvm --bogus list` is not list's error.
        sub = None;
    }
    if e.kind() == ErrorKind::InvalidSubcommand {
        let name = context(e, ContextKind::InvalidSubcommand).unwrap_or_default();
        log_error(args, &format!("No help topic for '{name}'"));
        return ExitCode::from(UNKNOWN_COMMAND);
    }
    let (head, msg) = explain(e, sub.as_deref(), cmd);
    let help = match &sub {
        Some(name) => cmd
            .find_subcommand_mut(name)
            .map(|s| s.render_help().to_string())
            .unwrap_or_default(),
        None => cmd.render_help().to_string(),
    };
    let _ = super::emit(&format!("{head}\n\n{help}"));
    log_error(args, &msg);
    ExitCode::from(1)
}

/// The `Incorrect Usage` line and the logged message, in urfave/cli's words.
fn explain(e: &clap::Error, sub: Option<&str>, cmd: &clap::Command) -> (String, String) {
    let arg = context(e, ContextKind::InvalidArg).unwrap_or_default();
    let positionals = |required: bool| {
        sub.and_then(|s| cmd.find_subcommand(s))
            .map(|s| {
                s.get_positionals()
                    .filter(|a| !required || a.is_required_set())
                    .count()
            })
            .unwrap_or(0)
    };
    let name = sub.unwrap_or_default();
    match e.kind() {
        ErrorKind::UnknownArgument if arg.starts_with('-') => {
            let msg = format!(
                "flag provided but not defined: -{}",
                arg.trim_start_matches('-')
            );
            // urfave/cli writes "Incorrect Usage." for the application's
            // own flags, "Incorrect Usage:" for a command's.
            let sep = if sub.is_some() { ':' } else { '.' };
            (format!("Incorrect Usage{sep} {msg}"), msg)
        }
        ErrorKind::UnknownArgument => (
            "Incorrect Usage.".to_string(),
            format!(
                "agentvm: \"{name}\" requires a maximum of {} argument(s)",
                positionals(false)
            ),
        ),
        ErrorKind::MissingRequiredArgument => (
            "Incorrect Usage.".to_string(),
            format!(
                "agentvm: \"{name}\" requires a minimum of {} argument(s)",
                positionals(true)
            ),
        ),
        _ => {
            let text = e.kind().as_str().map(str::to_string).unwrap_or_else(|| {
                e.to_string()
                    .lines()
                    .next()
                    .unwrap_or_default()
                    .trim_start_matches("error: ")
                    .to_string()
            });
            let msg = match (arg.is_empty(), context(e, ContextKind::InvalidValue)) {
                (false, Some(value)) => format!("invalid value {value:?} for flag {arg}: {text}"),
                _ => text,
            };
            (format!("Incorrect Usage: {msg}"), msg)
        }
    }
}

fn context(e: &clap::Error, kind: ContextKind) -> Option<String> {
    match e.get(kind)? {
        ContextValue::String(s) => Some(s.clone()),
        ContextValue::Strings(v) => v.first().cloned(),
        other => Some(other.to_string()),
    }
}

/// Whether the argument clap refused comes before the command's name.
fn before_command(args: &[OsString], e: &clap::Error, sub: Option<&str>) -> bool {
    let (Some(sub), Some(arg)) = (sub, context(e, ContextKind::InvalidArg)) else {
        return false;
    };
    let flag = arg.split('=').next().unwrap_or_default().to_string();
    let at =
        |want: &dyn Fn(&str) -> bool| args.iter().skip(1).position(|a| want(&a.to_string_lossy()));
    match (
        at(&|a| a == flag || a.starts_with(&format!("{flag}="))),
        at(&|a| a == sub),
    ) {
        (Some(flag_at), Some(sub_at)) => flag_at < sub_at,
        _ => false,
    }
}

/// The command named on the line: the first word that is not a global
/// flag or its value.
fn subcommand_of(args: &[OsString], cmd: &clap::Command) -> Option<String> {
    let mut words = args.iter().skip(1).map(|a| a.to_string_lossy());
    while let Some(w) = words.next() {
        if w == "--" {
            return None;
        }
        if w.starts_with('-') {
            if GLOBAL_WITH_VALUE.contains(&w.as_ref()) {
                words.next();
            }
            continue;
        }
        return cmd
            .find_subcommand(w.as_ref())
            .map(|s| s.get_name().to_string());
    }
    None
}

/// Logs a usage error where the line asked for the log, as runc does,
/// although the line itself did not parse.
fn log_error(args: &[OsString], msg: &str) {
    let mut log = None;
    let mut format = LogFormat::Text;
    let mut words = args
        .iter()
        .skip(1)
        .map(|a| a.to_string_lossy().into_owned());
    while let Some(w) = words.next() {
        let (flag, inline) = match w.split_once('=') {
            Some((f, v)) => (f.to_string(), Some(v.to_string())),
            None => (w.clone(), None),
        };
        let mut value = || inline.clone().or_else(|| words.next());
        match flag.as_str() {
            "--log" => log = value(),
            "--log-format" if value().as_deref() == Some("json") => format = LogFormat::Json,
            _ => {}
        }
    }
    let path = log.map(std::path::PathBuf::from);
    match crate::logging::init(path.as_deref(), format, false) {
        Ok(guard) => {
            tracing::error!("{msg}");
            if guard.to_file {
                eprintln!("{msg}");
            }
        }
        Err(_) => eprintln!("{msg}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(words: &[&str]) -> Vec<OsString> {
        std::iter::once("agentvm")
            .chain(words.iter().copied())
            .map(OsString::from)
            .collect()
    }

    fn refused(words: &[&str]) -> (clap::Error, Option<String>, clap::Command) {
        let mut cmd = command();
        let e = cmd
            .try_get_matches_from_mut(args(words))
            .expect_err("refused");
        let sub = subcommand_of(&args(words), &cmd);
        (e, sub, cmd)
    }

    #[test]
    fn finds_the_command_past_global_flags() {
        let cmd = command();
        let a = args(&["--root", "/r", "--debug", "--log=/l", "kill", "x"]);
        assert_eq!(subcommand_of(&a, &cmd).as_deref(), Some("kill"));
        assert_eq!(subcommand_of(&args(&["--foo"]), &cmd), None);
    }

    #[test]
    fn a_flag_before_the_command_is_the_applications() {
        let (e, sub, _) = refused(&["--bogus", "list"]);
        assert_eq!(sub.as_deref(), Some("list"));
        assert!(before_command(
            &args(&["--bogus", "list"]),
            &e,
            sub.as_deref()
        ));
        let (e, sub, _) = refused(&["list", "--bogus"]);
        assert!(!before_command(
            &args(&["list", "--bogus"]),
            &e,
            sub.as_deref()
        ));
    }

    #[test]
    fn words_as_urfave_cli_says_them() {
        let (e, sub, cmd) = refused(&["--foo"]);
        let (head, msg) = explain(&e, sub.as_deref(), &cmd);
        assert_eq!(head, "Incorrect Usage. flag provided but not defined: -foo");
        assert_eq!(msg, "flag provided but not defined: -foo");

        let (e, sub, cmd) = refused(&["kill", "--foo", "x"]);
        let (head, _) = explain(&e, sub.as_deref(), &cmd);
        assert_eq!(head, "Incorrect Usage: flag provided but not defined: -foo");

        let (e, sub, cmd) = refused(&["kill"]);
        let (head, msg) = explain(&e, sub.as_deref(), &cmd);
        assert_eq!(head, "Incorrect Usage.");
        assert_eq!(msg, "agentvm: \"kill\" requires a minimum of 1 argument(s)");

        let (e, sub, cmd) = refused(&["kill", "a", "b", "c"]);
        let (_, msg) = explain(&e, sub.as_deref(), &cmd);
        assert_eq!(msg, "agentvm: \"kill\" requires a maximum of 2 argument(s)");
    }

    #[test]
    fn help_has_runc_sections() {
        let help = command().render_help().to_string();
        for section in [
            "NAME:",
            "USAGE:",
            "VERSION:",
            "COMMANDS:",
            "GLOBAL OPTIONS:",
        ] {
            assert!(help.contains(section), "{section} missing:\n{help}");
        }
        let mut cmd = command();
        cmd.build();
        let kill = cmd
            .find_subcommand_mut("kill")
            .expect("kill")
            .render_help()
            .to_string();
        assert!(kill.starts_with("NAME:\n   agentvm kill - "), "{kill}");
        assert!(kill.contains("OPTIONS:"), "{kill}");
    }
}
