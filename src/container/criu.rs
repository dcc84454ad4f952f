//! A client of CRIU's RPC (`criu swrk FD`), for `restore`.
//!
//! rust-criu's own client sends its request the moment CRIU starts. runc's
//! restore needs a step in between: the CRIU process is put into the
//! container's cgroup first, and the request then names that cgroup as the
//! root of the checkpoint's cgroups (`cg_root`, read from
//! `/proc/CRIU/cgroup`). It also needs the restored pid and CRIU's
//! notifications (`orphan-pts-master` carries a terminal's master). So this
//! is a small client of its own on rust-criu's protobuf types.
//!
//! CRIU speaks over a SOCK_SEQPACKET pair: one request, then responses
//! until the one of the request's type; each `NOTIFY` response is answered
//! with a `NOTIFY` request saying whether it went well.

use std::io::{IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Child, Command};

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessageOwned, MsgFlags, SockFlag, SockType,
};
use protobuf::Message;
use rust_criu::rust_criu_protobuf::rpc;

/// runc's `--manage-cgroups-mode` as CRIU's.
pub fn cg_mode(mode: crate::tier::CgroupsMode) -> rpc::Criu_cg_mode {
    use crate::tier::CgroupsMode;
    match mode {
        CgroupsMode::Soft => rpc::Criu_cg_mode::SOFT,
        CgroupsMode::Full => rpc::Criu_cg_mode::FULL,
        CgroupsMode::Strict => rpc::Criu_cg_mode::STRICT,
        CgroupsMode::Ignore => rpc::Criu_cg_mode::IGNORE,
    }
}

/// The largest response taken: CRIU's messages are a few hundred bytes.
const MAX_MESSAGE: usize = 64 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum CriuError {
    #[error("cannot start {criu}: {source}")]
    Spawn {
        criu: String,
        source: std::io::Error,
    },
    #[error("cannot talk to criu: {0}")]
    Socket(nix::errno::Errno),
    #[error("cannot encode or decode a criu message: {0}")]
    Protobuf(#[from] protobuf::Error),
    /// runc's words for a request CRIU refused (`criu failed: type
    /// RESTORE errno 0`).
    #[error("criu failed: type {kind} errno {errno}")]
    Failed { kind: String, errno: i32 },
    #[error("criu failed: a notification ({script}) failed: {message}")]
    Notify { script: String, message: String },
    #[error("criu failed: it exited without answering")]
    Eof,
    #[error("criu failed: a message larger than {MAX_MESSAGE} bytes")]
    TooLarge,
    #[error("criu failed: unexpected response {0}")]
    Unexpected(String),
}

/// A running `criu swrk`.
pub struct Swrk {
    child: Child,
    sock: OwnedFd,
}

/// Clears close-on-exec on `fd` in a forked child before exec.
fn inherit(fd: RawFd) -> std::io::Result<()> {
    // SAFETY: fcntl on a descriptor number only changes its flags; it is
    // async-signal-safe, as code between fork and exec must be.
    match unsafe { libc::fcntl(fd, libc::F_SETFD, 0) } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    }
}

impl Swrk {
    /// Starts `criu swrk` with our stdin, stdout and stderr (the restored
    /// process's stdio are inherited from it) and the descriptors in
    /// `keep` at the same numbers.
    pub fn start(criu: &Path, keep: &[RawFd]) -> Result<Swrk, CriuError> {
        let (ours, theirs) = socketpair(
            AddressFamily::Unix,
            SockType::SeqPacket,
            None,
            SockFlag::SOCK_CLOEXEC,
        )
        .map_err(CriuError::Socket)?;
        let theirs_fd = theirs.as_raw_fd();
        let mut fds = keep.to_vec();
        fds.push(theirs_fd);
        let mut cmd = Command::new(criu);
        cmd.arg("swrk").arg(theirs_fd.to_string());
        // SAFETY: the closure only calls fcntl (async-signal-safe) on
        // descriptor numbers copied in before the fork.
        unsafe {
            cmd.pre_exec(move || fds.iter().try_for_each(|&fd| inherit(fd)));
        }
        let child = cmd.spawn().map_err(|source| CriuError::Spawn {
            criu: criu.display().to_string(),
            source,
        })?;
        drop(theirs);
        Ok(Swrk { child, sock: ours })
    }

    /// Stops CRIU before any request (a step before it failed).
    pub fn abandon(mut self) {
        let _ = self.child.kill();
        drop(self.sock);
        let _ = self.child.wait();
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    /// Sends `req` and answers CRIU's notifications with `notify` (an
    /// error there makes CRIU fail the request); returns the response of
    /// the request's type. CRIU is waited for either way.
    pub fn call(
        mut self,
        req: &rpc::Criu_req,
        mut notify: impl FnMut(&rpc::Criu_notify, Option<OwnedFd>) -> Result<(), String>,
    ) -> Result<rpc::Criu_resp, CriuError> {
        let result = self.exchange(req, &mut notify);
        if result.is_err() {
            let _ = self.child.kill();
        }
        drop(self.sock);
        let _ = self.child.wait();
        result
    }

    fn exchange(
        &mut self,
        req: &rpc::Criu_req,
        notify: &mut impl FnMut(&rpc::Criu_notify, Option<OwnedFd>) -> Result<(), String>,
    ) -> Result<rpc::Criu_resp, CriuError> {
        self.send(req)?;
        loop {
            let (resp, fd) = self.receive()?;
            let kind = resp.type_();
            if !resp.success() {
                return Err(CriuError::Failed {
                    kind: format!("{kind:?}"),
                    errno: resp.cr_errno(),
                });
            }
            if kind == rpc::Criu_req_type::NOTIFY {
                let script = resp.notify.script().to_string();
                let outcome = notify(&resp.notify, fd);
                let mut ack = rpc::Criu_req::new();
                ack.set_type(rpc::Criu_req_type::NOTIFY);
                ack.set_notify_success(outcome.is_ok());
                self.send(&ack)?;
                if let Err(message) = outcome {
                    return Err(CriuError::Notify { script, message });
                }
                continue;
            }
            if kind != req.type_() {
                return Err(CriuError::Unexpected(format!("{kind:?}")));
            }
            return Ok(resp);
        }
    }

    fn send(&self, msg: &rpc::Criu_req) -> Result<(), CriuError> {
        let bytes = msg.write_to_bytes()?;
        sendmsg::<()>(
            self.sock.as_raw_fd(),
            &[IoSlice::new(&bytes)],
            &[],
            MsgFlags::empty(),
            None,
        )
        .map_err(CriuError::Socket)?;
        Ok(())
    }

    /// One response, and the descriptor it carries if any (only the first
    /// is kept; any other is closed).
    fn receive(&self) -> Result<(rpc::Criu_resp, Option<OwnedFd>), CriuError> {
        let mut buf = vec![0u8; MAX_MESSAGE];
        let mut cmsg = nix::cmsg_space!([RawFd; 4]);
        let mut iov = [IoSliceMut::new(&mut buf)];
        let msg = recvmsg::<()>(
            self.sock.as_raw_fd(),
            &mut iov,
            Some(&mut cmsg),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(CriuError::Socket)?;
        if msg.flags.contains(MsgFlags::MSG_TRUNC) {
            return Err(CriuError::TooLarge);
        }
        let mut fd = None;
        for c in msg.cmsgs().map_err(CriuError::Socket)? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: SCM_RIGHTS just installed `r` in our table;
                    // nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(r) };
                    if fd.is_none() {
                        fd = Some(owned);
                    }
                }
            }
        }
        let n = msg.bytes;
        if n == 0 {
            return Err(CriuError::Eof);
        }
        let resp = rpc::Criu_resp::parse_from_bytes(&buf[..n])?;
        Ok((resp, fd))
    }
}

/// The cgroup roots CRIU is to restore into: each controller of
/// `/proc/PID/cgroup` with its path, v2's unified line as controller "",
/// as runc reads them after moving CRIU into the container's cgroup.
pub fn cgroup_roots(proc_cgroup: &str) -> Vec<(String, String)> {
    let mut roots = Vec::new();
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(_), Some(ctrls), Some(path)) = (parts.next(), parts.next(), parts.next()) else {
            continue;
        };
        if ctrls.is_empty() {
            roots.push((String::new(), path.to_string()));
            continue;
        }
        for c in ctrls.split(',') {
            roots.push((c.to_string(), path.to_string()));
        }
    }
    roots
}

/// The v1 cgroup hierarchies a container without a cgroup namespace has
/// bound at `/sys/fs/cgroup/NAME`, as external mounts for CRIU: the host's
/// mount point (libcontainer's dump names each by it) to the directory
/// of `proc_cgroup`'s cgroup in that hierarchy.
pub fn cgroup_v1_mounts(mountinfo: &str, proc_cgroup: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for line in mountinfo.lines() {
        let Some((mount, sb)) = line.split_once(" - ") else {
            continue;
        };
        let mut fields = sb.split_whitespace();
        if fields.next() != Some("cgroup") {
            continue;
        }
        let super_opts: Vec<&str> = fields.nth(1).unwrap_or("").split(',').collect();
        let Some(point) = mount.split_whitespace().nth(4) else {
            continue;
        };
        if !point.starts_with("/sys/fs/cgroup/") {
            continue;
        }
        let path = proc_cgroup.lines().find_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_, ctrls, path) = (parts.next()?, parts.next()?, parts.next()?);
            (!ctrls.is_empty() && ctrls.split(',').all(|c| super_opts.contains(&c))).then_some(path)
        });
        if let Some(path) = path {
            let dir = format!("{point}/{}", path.trim_start_matches('/'));
            out.push((point.to_string(), dir.trim_end_matches('/').to_string()));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cgroup_roots_per_controller_as_runc_reads_them() {
        let file = "12:cpu,cpuacct:/a/b\n4:memory:/a/b\n1:name=systemd:/x\n0::/u\nbad line\n";
        assert_eq!(
            cgroup_roots(file),
            vec![
                ("cpu".to_string(), "/a/b".to_string()),
                ("cpuacct".to_string(), "/a/b".to_string()),
                ("memory".to_string(), "/a/b".to_string()),
                ("name=systemd".to_string(), "/x".to_string()),
                (String::new(), "/u".to_string()),
            ]
        );
    }

    #[test]
    fn v1_hierarchies_map_to_the_container_cgroup() {
        let mountinfo = "\
30 25 0:26 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
31 25 0:27 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,name=systemd
32 25 0:28 / /sys/fs/cgroup/unified rw - cgroup2 cgroup2 rw
33 25 0:29 / /elsewhere rw - cgroup cgroup rw,memory
34 25 0:30 / /sys/fs/cgroup/net_cls,net_prio rw - cgroup cgroup rw,net_cls,net_prio
";
        let proc_cgroup =
            "5:net_cls,net_prio:/c\n4:memory:/c\n2:name=systemd:/\n1:cpu:/a/c\n0::/\n";
        assert_eq!(
            cgroup_v1_mounts(mountinfo, proc_cgroup),
            vec![
                (
                    "/sys/fs/cgroup/cpu".to_string(),
                    "/sys/fs/cgroup/cpu/a/c".to_string()
                ),
                (
                    "/sys/fs/cgroup/systemd".to_string(),
                    "/sys/fs/cgroup/systemd".to_string()
                ),
                (
                    "/sys/fs/cgroup/net_cls,net_prio".to_string(),
                    "/sys/fs/cgroup/net_cls,net_prio/c".to_string()
                ),
            ]
        );
    }

    #[test]
    fn a_missing_criu_is_named() {
        let e = Swrk::start(Path::new("/nonexistent/criu"), &[])
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(e.starts_with("cannot start /nonexistent/criu: "), "{e}");
    }

    /// A fake CRIU that answers with a notification, then a failed
    /// RESTORE: the client acks the notification and reports the failure
    /// in runc's words.
    #[test]
    fn notifications_are_acked_and_failures_reported() {
        let dir = std::env::temp_dir().join(format!("agentvm-criu-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let script = dir.join("criu");
        // Responses prepared as files: a NOTIFY, then a failed RESTORE.
        let mut notify = rpc::Criu_resp::new();
        notify.set_type(rpc::Criu_req_type::NOTIFY);
        notify.set_success(true);
        let mut n = rpc::Criu_notify::new();
        n.set_script("post-restore".into());
        n.set_pid(42);
        notify.notify = protobuf::MessageField::some(n);
        let mut fail = rpc::Criu_resp::new();
        fail.set_type(rpc::Criu_req_type::RESTORE);
        fail.set_success(false);
        fail.set_cr_errno(17);
        std::fs::write(dir.join("1"), notify.write_to_bytes().unwrap()).unwrap();
        std::fs::write(dir.join("2"), fail.write_to_bytes().unwrap()).unwrap();
        // python3 speaks SOCK_SEQPACKET on the inherited descriptor.
        let py = format!(
            "import socket,sys\ns=socket.socket(fileno=int(sys.argv[2]))\ns.recv(65536)\n\
             s.send(open('{d}/1','rb').read())\nack=s.recv(65536)\nopen('{d}/ack','wb').write(ack)\n\
             s.send(open('{d}/2','rb').read())\n",
            d = dir.display()
        );
        std::fs::write(dir.join("fake.py"), py).unwrap();
        std::fs::write(
            &script,
            format!("#!/bin/sh\nexec python3 {}/fake.py \"$@\"\n", dir.display()),
        )
        .unwrap();
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
        let swrk = Swrk::start(&script, &[]).unwrap();
        let mut req = rpc::Criu_req::new();
        req.set_type(rpc::Criu_req_type::RESTORE);
        let mut seen = Vec::new();
        let err = swrk
            .call(&req, |n, fd| {
                seen.push((n.script().to_string(), n.pid(), fd.is_some()));
                Ok(())
            })
            .err()
            .map(|e| e.to_string());
        assert_eq!(seen, vec![("post-restore".to_string(), 42, false)]);
        assert_eq!(err.as_deref(), Some("criu failed: type RESTORE errno 17"));
        let ack =
            rpc::Criu_req::parse_from_bytes(&std::fs::read(dir.join("ack")).unwrap()).unwrap();
        assert_eq!(ack.type_(), rpc::Criu_req_type::NOTIFY);
        assert!(ack.notify_success());
        let _ = std::fs::remove_dir_all(&dir);
    }
}
