//! `agentvm checkpoint`: runc's flags, answered by the container's tier
//! (CRIU in the container tier; the microvm tier says it cannot yet).
//! Flag values are checked here, in runc's words.

use std::path::PathBuf;

use clap::Args;

use crate::context::{absolute, Context};
use crate::state::LockMode;
use crate::tier::{CgroupsMode, CheckpointRequest};

#[derive(Args, Debug)]
pub struct CheckpointArgs {
    /// Path for saving criu image files
    #[arg(long = "image-path")]
    pub image_path: Option<PathBuf>,
    /// Path for saving work files and logs
    #[arg(long = "work-path")]
    pub work_path: Option<PathBuf>,
    /// Path for previous criu image files in pre-dump
    #[arg(long = "parent-path")]
    pub parent_path: Option<PathBuf>,
    /// Leave the process running after checkpointing
    #[arg(long = "leave-running")]
    pub leave_running: bool,
    /// Allow open tcp connections
    #[arg(long = "tcp-established")]
    pub tcp_established: bool,
    /// Allow external unix sockets
    #[arg(long = "ext-unix-sk")]
    pub ext_unix_sk: bool,
    /// Allow shell jobs
    #[arg(long = "shell-job")]
    pub shell_job: bool,
    /// Use userfaultfd to lazily restore memory pages
    #[arg(long = "lazy-pages")]
    pub lazy_pages: bool,
    /// Handle file locks
    #[arg(long = "file-locks")]
    pub file_locks: bool,
    /// Dump the container's memory while it keeps running
    #[arg(long = "pre-dump")]
    pub pre_dump: bool,
    /// cgroups mode: soft (default), full, strict or ignore
    #[arg(long = "manage-cgroups-mode")]
    pub manage_cgroups_mode: Option<String>,
    /// Create a namespace, but don't restore its properties
    #[arg(long = "empty-ns")]
    pub empty_ns: Vec<String>,
    /// Enable auto deduplication of memory images
    #[arg(long = "auto-dedup")]
    pub auto_dedup: bool,
    /// ADDRESS:PORT of the page server
    #[arg(long = "page-server")]
    pub page_server: Option<String>,
    /// Criu writes \0 to this FD once lazy-pages is ready
    #[arg(long = "status-fd")]
    pub status_fd: Option<i32>,
    pub id: String,
}

pub fn run(ctx: &Context, args: CheckpointArgs) -> anyhow::Result<()> {
    let cgroups_mode = match args.manage_cgroups_mode.as_deref() {
        None => CgroupsMode::Soft,
        Some(m) => m.parse().map_err(anyhow::Error::msg)?,
    };
    let page_server = args
        .page_server
        .as_deref()
        .map(page_server)
        .transpose()
        .map_err(anyhow::Error::msg)?;
    let empty_ns = empty_namespaces(&args.empty_ns).map_err(anyhow::Error::msg)?;
    // runc's default image path: `checkpoint` in the current directory.
    let image_path = absolute(
        args.image_path
            .as_deref()
            .unwrap_or(std::path::Path::new("checkpoint")),
    )?;
    let work_path = args.work_path.as_deref().map(absolute).transpose()?;
    let req = CheckpointRequest {
        image_path,
        work_path,
        leave_running: args.leave_running,
        tcp_established: args.tcp_established,
        ext_unix_sk: args.ext_unix_sk,
        shell_job: args.shell_job,
        file_locks: args.file_locks,
        cgroups_mode,
        pre_dump: args.pre_dump,
        parent_path: args.parent_path,
        lazy_pages: args.lazy_pages,
        auto_dedup: args.auto_dedup,
        empty_ns,
        page_server,
        status_fd: args.status_fd,
    };
    let (tier, _lock) = super::open(ctx, &args.id, Some(LockMode::Exclusive))?;
    Ok(tier.checkpoint(ctx, &args.id, &req)?)
}

/// `--page-server ADDRESS:PORT`, refused in runc's words.
fn page_server(arg: &str) -> Result<(String, i32), &'static str> {
    const USAGE: &str = "Use --page-server ADDRESS:PORT to specify page server";
    let (address, port) = arg.rsplit_once(':').ok_or(USAGE)?;
    // An IPv6 address comes in brackets, as Go's SplitHostPort wants it.
    let address = match address.strip_prefix('[') {
        Some(inner) => inner.strip_suffix(']').ok_or(USAGE)?,
        None if address.contains(':') => return Err(USAGE),
        None => address,
    };
    if address.is_empty() || port.is_empty() {
        return Err(USAGE);
    }
    let port = port.parse::<i32>().map_err(|_| "Invalid port number")?;
    Ok((address.to_string(), port))
}

/// `--empty-ns TYPE...` as CLONE_NEW* flags; runc's names and message.
fn empty_namespaces(names: &[String]) -> Result<u32, String> {
    names.iter().try_fold(0u32, |mask, name| {
        let flag = match name.as_str() {
            "pid" => libc::CLONE_NEWPID,
            "network" => libc::CLONE_NEWNET,
            "mount" => libc::CLONE_NEWNS,
            "user" => libc::CLONE_NEWUSER,
            "ipc" => libc::CLONE_NEWIPC,
            "uts" => libc::CLONE_NEWUTS,
            _ => return Err(format!("namespace {name:?} is not supported")),
        };
        Ok(mask | flag as u32)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn page_server_as_runc_parses_it() {
        assert_eq!(
            page_server("127.0.0.1:27277"),
            Ok(("127.0.0.1".into(), 27277))
        );
        assert_eq!(page_server("[::1]:80"), Ok(("::1".into(), 80)));
        assert_eq!(page_server("host:x"), Err("Invalid port number"));
        for bad in ["27277", ":27277", "host:", "::1:80", "[::1:80"] {
            assert_eq!(
                page_server(bad),
                Err("Use --page-server ADDRESS:PORT to specify page server"),
                "{bad}"
            );
        }
    }

    #[test]
    fn empty_namespaces_by_runc_names() {
        let mask = empty_namespaces(&["network".into(), "uts".into()]).unwrap();
        assert_eq!(mask, (libc::CLONE_NEWNET | libc::CLONE_NEWUTS) as u32);
        assert_eq!(
            empty_namespaces(&["time".into()]),
            Err("namespace \"time\" is not supported".into())
        );
    }
}
