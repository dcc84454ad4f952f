//! Checks of the process itself: argv, environment, identity, capabilities,
//! limits and terminal.

use oci_validation::caps;
use oci_validation::expect::Check;

use crate::{expect_eq, mismatch, Failure, Verdict};

pub fn run(check: &Check) -> Verdict {
    match check {
        Check::Args { args } => {
            let got: Vec<String> = std::env::args_os()
                .map(|a| a.to_string_lossy().into_owned())
                .collect();
            expect_eq("argv", &got, args)
        }
        Check::Env { var, value } => {
            let got = std::env::var_os(var).map(|v| v.to_string_lossy().into_owned());
            expect_eq(var, got.as_ref(), value.as_ref())
        }
        Check::Cwd { path } => {
            let got = std::env::current_dir().map_err(|e| Failure::Mismatch(e.to_string()))?;
            expect_eq("cwd", got.to_string_lossy().as_ref(), path.as_str())
        }
        Check::Uid { uid } => {
            expect_eq("uid", nix::unistd::getuid().as_raw(), *uid)?;
            expect_eq("euid", nix::unistd::geteuid().as_raw(), *uid)
        }
        Check::Gid { gid } => {
            expect_eq("gid", nix::unistd::getgid().as_raw(), *gid)?;
            expect_eq("egid", nix::unistd::getegid().as_raw(), *gid)
        }
        Check::Groups { gids } => groups(gids),
        Check::Umask { mask } => {
            let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
            nix::sys::stat::umask(old);
            expect_eq(
                "umask",
                format!("{:04o}", old.bits()),
                format!("{mask:04o}"),
            )
        }
        Check::CapSet { field, mask } => {
            let got = status_field(field)?;
            let got = u64::from_str_radix(got.trim(), 16)
                .map_err(|e| Failure::Mismatch(format!("{field} {got:?}: {e}")))?;
            if got == *mask {
                Ok(())
            } else {
                mismatch!(
                    "{field}: extra {:?}, missing {:?}",
                    caps::names(got & !mask),
                    caps::names(mask & !got)
                )
            }
        }
        Check::Rlimit {
            resource,
            soft,
            hard,
        } => rlimit(resource, *soft, *hard),
        Check::Status { field, value } => {
            let got = status_field(field)?;
            expect_eq(field, got.trim(), value.as_str())
        }
        Check::Tty { fd, tty } => {
            // SAFETY: isatty only inspects the descriptor number.
            let got = unsafe { libc::isatty(*fd) } == 1;
            expect_eq(&format!("isatty({fd})"), got, *tty)
        }
        Check::WinSize { rows, cols } => winsize(*rows, *cols),
        Check::Pid { pid } => expect_eq("pid", nix::unistd::getpid().as_raw(), *pid),
        _ => mismatch!("check routed to the wrong module"),
    }
}

fn groups(want: &[u32]) -> Verdict {
    let mut got: Vec<u32> = nix::unistd::getgroups()
        .map_err(|e| Failure::Mismatch(format!("getgroups: {e}")))?
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    got.sort_unstable();
    got.dedup();
    let mut want = want.to_vec();
    want.sort_unstable();
    want.dedup();
    expect_eq("groups", got, want)
}

/// A `Name:` line of /proc/self/status, value only.
pub fn status_field(field: &str) -> Result<String, Failure> {
    let text = std::fs::read_to_string("/proc/self/status")
        .map_err(|e| Failure::Mismatch(format!("/proc/self/status: {e}")))?;
    text.lines()
        .find_map(|l| {
            l.strip_prefix(field)
                .and_then(|r| r.strip_prefix(':'))
                .map(|v| v.trim().to_string())
        })
        .ok_or_else(|| Failure::Skip(format!("no {field} line in /proc/self/status")))
}

fn rlimit(resource: &str, soft: u64, hard: u64) -> Verdict {
    let res = match resource {
        "RLIMIT_AS" => libc::RLIMIT_AS,
        "RLIMIT_CORE" => libc::RLIMIT_CORE,
        "RLIMIT_CPU" => libc::RLIMIT_CPU,
        "RLIMIT_DATA" => libc::RLIMIT_DATA,
        "RLIMIT_FSIZE" => libc::RLIMIT_FSIZE,
        "RLIMIT_LOCKS" => libc::RLIMIT_LOCKS,
        "RLIMIT_MEMLOCK" => libc::RLIMIT_MEMLOCK,
        "RLIMIT_MSGQUEUE" => libc::RLIMIT_MSGQUEUE,
        "RLIMIT_NICE" => libc::RLIMIT_NICE,
        "RLIMIT_NOFILE" => libc::RLIMIT_NOFILE,
        "RLIMIT_NPROC" => libc::RLIMIT_NPROC,
        "RLIMIT_RSS" => libc::RLIMIT_RSS,
        "RLIMIT_RTPRIO" => libc::RLIMIT_RTPRIO,
        "RLIMIT_RTTIME" => libc::RLIMIT_RTTIME,
        "RLIMIT_SIGPENDING" => libc::RLIMIT_SIGPENDING,
        "RLIMIT_STACK" => libc::RLIMIT_STACK,
        other => return mismatch!("unknown resource {other}"),
    };
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `lim` is a valid, writable rlimit for the duration of the call.
    if unsafe { libc::getrlimit(res, &mut lim) } != 0 {
        return mismatch!("getrlimit: {}", std::io::Error::last_os_error());
    }
    expect_eq("soft,hard", (lim.rlim_cur, lim.rlim_max), (soft, hard))
}

fn winsize(rows: u16, cols: u16) -> Verdict {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one winsize into `ws`, which outlives the call.
    if unsafe { libc::ioctl(0, libc::TIOCGWINSZ, &mut ws) } != 0 {
        return mismatch!("TIOCGWINSZ: {}", std::io::Error::last_os_error());
    }
    expect_eq("rows x cols", (ws.ws_row, ws.ws_col), (rows, cols))
}
