//! `SCMP_ACT_NOTIFY` for `exec`: hand the exec'd process's seccomp notify
//! fd to the profile's `listenerPath`, as runc does for every process it
//! starts with such a profile.
//!
//! libcontainer 0.7 does this for a container's init only; for an exec the
//! filter is installed by agentvm's executor ([`super::workload`]), inside
//! the container, where the listener's socket (a host path) cannot be
//! reached and the process's host pid is unknown. So the executor sends the
//! notify fd back over a socket pair made before the process was started,
//! and `agentvm exec` forwards it to the listener with the container process
//! state runc sends (`fds: ["seccompFd"]`, the process's host pid, the
//! profile's `listenerMetadata` and the container's state). Until then a
//! notified syscall of the process waits, as it would for a busy listener.

use std::io::{self, IoSlice, IoSliceMut};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::net::UnixStream;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use nix::sys::socket::{
    recvmsg, sendmsg, socketpair, AddressFamily, ControlMessage, ControlMessageOwned, MsgFlags,
    SockFlag, SockType,
};
use oci_spec::runtime::LinuxSeccomp;
use serde_json::json;

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("seccomp profile uses SCMP_ACT_NOTIFY without a listenerPath")]
    NoListener,
    #[error("cannot make the socket pair for the seccomp notify fd: {0}")]
    Pair(nix::Error),
    #[error("cannot receive the seccomp notify fd of the exec'd process: {0}")]
    Receive(io::Error),
    #[error("the exec'd process sent no seccomp notify fd")]
    NoFd,
    #[error("cannot send the seccomp notify fd to the listener at {path}: {source}")]
    Send { path: PathBuf, source: io::Error },
}

/// How long `exec` waits for the process to install its filter.
const RECEIVE_WAIT: Duration = Duration::from_secs(30);

/// The executor's end: the process sends its notify fd here.
#[derive(Clone, Default)]
pub struct NotifyFdSender(Option<Arc<OwnedFd>>);

impl NotifyFdSender {
    /// Sends `fd` (then closes it, as the process must not keep it); a
    /// sender made for no listener does nothing.
    pub fn send(&self, fd: Option<RawFd>) -> io::Result<()> {
        let Some(fd) = fd else {
            return Ok(());
        };
        // SAFETY: libcontainer's initialize_seccomp returned this fd to us
        // and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        let Some(sock) = &self.0 else {
            return Ok(());
        };
        let fds = [fd.as_raw_fd()];
        let iov = [IoSlice::new(b"1")];
        sendmsg::<()>(
            sock.as_raw_fd(),
            &iov,
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(io::Error::from)?;
        Ok(())
    }
}

/// `agentvm exec`'s end, with what it forwards to the listener.
pub struct NotifyForward {
    own: UnixStream,
    listener: PathBuf,
    metadata: String,
}

/// For a profile that notifies: the pair of ends; `None` otherwise.
pub fn prepare(
    seccomp: Option<&LinuxSeccomp>,
) -> Result<(NotifyFdSender, Option<NotifyForward>), NotifyError> {
    let Some(seccomp) = seccomp.filter(|s| libcontainer::seccomp::is_notify(s)) else {
        return Ok((NotifyFdSender::default(), None));
    };
    let listener = seccomp
        .listener_path()
        .clone()
        .ok_or(NotifyError::NoListener)?;
    let (own, theirs) = socketpair(
        AddressFamily::Unix,
        SockType::Stream,
        None,
        SockFlag::SOCK_CLOEXEC,
    )
    .map_err(NotifyError::Pair)?;
    Ok((
        NotifyFdSender(Some(Arc::new(theirs))),
        Some(NotifyForward {
            own: UnixStream::from(own),
            listener,
            metadata: seccomp.listener_metadata().clone().unwrap_or_default(),
        }),
    ))
}

impl NotifyForward {
    /// Receives the process's notify fd (once the builder, and with it the
    /// executor's end, is gone) and sends it to the listener with the
    /// container process state: `pid` is the exec'd process, `state` the
    /// container's OCI state.
    pub fn forward(self, pid: i32, state: serde_json::Value) -> Result<(), NotifyError> {
        self.own
            .set_read_timeout(Some(RECEIVE_WAIT))
            .map_err(NotifyError::Receive)?;
        let mut buf = [0u8; 16];
        let mut iov = [IoSliceMut::new(&mut buf)];
        let mut space = nix::cmsg_space!([RawFd; 1]);
        let msg = recvmsg::<()>(
            self.own.as_raw_fd(),
            &mut iov,
            Some(&mut space),
            MsgFlags::MSG_CMSG_CLOEXEC,
        )
        .map_err(|e| NotifyError::Receive(e.into()))?;
        let mut fd = None;
        for c in msg.cmsgs().map_err(|e| NotifyError::Receive(e.into()))? {
            if let ControlMessageOwned::ScmRights(raw) = c {
                for r in raw {
                    // SAFETY: SCM_RIGHTS just installed this fd in our table
                    // and nothing else owns it.
                    let owned = unsafe { OwnedFd::from_raw_fd(r) };
                    fd.get_or_insert(owned);
                }
            }
        }
        let fd = fd.ok_or(NotifyError::NoFd)?;
        let message = json!({
            "ociVersion": oci_spec::runtime::VERSION,
            "fds": ["seccompFd"],
            "pid": pid,
            "metadata": self.metadata,
            "state": state,
        });
        let send_err = |source: io::Error| NotifyError::Send {
            path: self.listener.clone(),
            source,
        };
        let data = serde_json::to_vec(&message).map_err(|e| send_err(e.into()))?;
        let stream = UnixStream::connect(&self.listener).map_err(send_err)?;
        let fds = [fd.as_raw_fd()];
        sendmsg::<()>(
            stream.as_raw_fd(),
            &[IoSlice::new(&data)],
            &[ControlMessage::ScmRights(&fds)],
            MsgFlags::empty(),
            None,
        )
        .map_err(|e| send_err(e.into()))?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::os::unix::net::UnixListener;

    #[test]
    fn the_fd_reaches_the_listener_with_the_state() {
        let dir = std::env::temp_dir().join(format!("agentvm-notify-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("l.sock");
        let listener = UnixListener::bind(&path).unwrap();
        let seccomp: LinuxSeccomp = serde_json::from_value(json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "listenerPath": path,
            "listenerMetadata": "meta",
            "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]
        }))
        .unwrap();
        let (sender, forward) = prepare(Some(&seccomp)).unwrap();
        let forward = forward.unwrap();
        // Any fd stands in for the notify fd.
        let file = std::fs::File::open("/dev/null").unwrap();
        let raw = OwnedFd::from(file);
        sender
            .send(Some(std::os::fd::IntoRawFd::into_raw_fd(raw)))
            .unwrap();
        drop(sender);
        let receiving = std::thread::spawn(move || {
            let (mut s, _) = listener.accept().unwrap();
            let mut buf = [0u8; 4096];
            let mut iov = [IoSliceMut::new(&mut buf)];
            let mut space = nix::cmsg_space!([RawFd; 1]);
            let msg = recvmsg::<()>(s.as_raw_fd(), &mut iov, Some(&mut space), MsgFlags::empty())
                .unwrap();
            let nfds = msg
                .cmsgs()
                .unwrap()
                .filter(|c| matches!(c, ControlMessageOwned::ScmRights(_)))
                .count();
            let n = msg.bytes;
            let mut data = buf[..n].to_vec();
            let _ = s.read_to_end(&mut data);
            (nfds, data)
        });
        forward.forward(42, json!({"id": "c"})).unwrap();
        let (nfds, data) = receiving.join().unwrap();
        let v: serde_json::Value = serde_json::from_slice(&data).unwrap();
        assert_eq!(nfds, 1);
        assert_eq!(v["pid"], 42);
        assert_eq!(v["fds"], json!(["seccompFd"]));
        assert_eq!(v["metadata"], "meta");
        assert_eq!(v["state"]["id"], "c");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_profile_without_notify_needs_nothing() {
        let seccomp: LinuxSeccomp = serde_json::from_value(json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_ERRNO"}]
        }))
        .unwrap();
        assert!(prepare(Some(&seccomp)).unwrap().1.is_none());
        let notify_without_path: LinuxSeccomp = serde_json::from_value(json!({
            "defaultAction": "SCMP_ACT_ALLOW",
            "syscalls": [{"names": ["mkdir"], "action": "SCMP_ACT_NOTIFY"}]
        }))
        .unwrap();
        assert!(matches!(
            prepare(Some(&notify_without_path)),
            Err(NotifyError::NoListener)
        ));
    }
}
