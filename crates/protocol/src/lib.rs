//! The control protocol between the host supervisor and the guest agent.
//!
//! It runs over one byte stream (a virtio-serial port named
//! [`PORT_NAME`] in the guest, a unix socket on the host) as frames:
//!
//! ```text
//!   u32 LE  payload length (at most MAX_PAYLOAD)
//!   u8      kind  (Control, Stdin, Stdout, Stderr, StdinClose)
//!   u32 LE  stream: 0 for the container's init, N for exec N
//!   [u8]    payload: JSON for Control, raw bytes for stdio
//! ```
//!
//! Control payloads are a [`HostMessage`] (host to guest) or a
//! [`GuestMessage`] (guest to host). Each host request gets exactly one
//! [`GuestMessage::Reply`], in order; everything else the guest sends is an
//! event. The guest is hostile: the host checks every length and field, and a
//! malformed frame is an error that ends the connection (and the container),
//! never a panic.

use std::io::{Read, Write};

use oci_spec::runtime::{Hook, LinuxResources, Process, Spec};
use serde::{Deserialize, Serialize};

/// Protocol version, exchanged in [`GuestMessage::Hello`]. Version 2
/// added the pod's member containers ([`HostMessage::CreateMember`],
/// [`HostMessage::Member`]).
pub const VERSION: u32 = 2;
/// Name of the virtio-serial port the guest finds under
/// `/sys/class/virtio-ports/*/name`.
pub const PORT_NAME: &str = "org.agentvm.control";
/// virtio-fs tag of the one share the host exports (the staging directory
/// holding the container's rootfs and bind-mount sources).
pub const SHARE_TAG: &str = "agentvm";
/// Where the guest mounts that share; the spec the host sends refers to
/// paths below it (root.path = SHARE_MOUNT/rootfs, bind sources =
/// SHARE_MOUNT/m<N>).
pub const SHARE_MOUNT: &str = "/run/agentvm/share";
/// The guest agent's directory in the share (relative to its root): the
/// guest kernel mounts the share as its root filesystem and runs
/// [`SHARE_INIT`], which mounts a tmpfs here and makes it the root.
pub const SHARE_BOOT_DIR: &str = ".agentvm";
/// The guest agent's binary in the share, read-only (a bind mount of the
/// host's file).
pub const SHARE_INIT: &str = ".agentvm/init";
/// Largest payload either side accepts.
pub const MAX_PAYLOAD: usize = 1 << 20;
/// Bytes before the payload.
pub const HEADER_LEN: usize = 9;
/// Stream of the container's init process.
pub const INIT_STREAM: u32 = 0;
/// Directory of the share (relative to its root) under which each member
/// container of a pod has its own directory, named by its host id, holding
/// its rootfs and bind-mount sources (`pod/<id>/rootfs`, `pod/<id>/m<N>`).
pub const SHARE_POD_DIR: &str = "pod";

#[derive(Debug, thiserror::Error)]
pub enum ProtocolError {
    #[error("frame payload of {0} bytes exceeds the {MAX_PAYLOAD}-byte limit")]
    TooLong(usize),
    #[error("unknown frame kind {0}")]
    UnknownKind(u8),
    #[error("malformed control message: {0}")]
    BadControl(String),
    #[error("control channel closed")]
    Closed,
    #[error("control channel: {0}")]
    Io(#[from] std::io::Error),
}

impl ProtocolError {
    /// Whether the peer broke the protocol (sent bytes that are not a valid
    /// frame or message), as opposed to the channel failing or closing.
    pub fn is_violation(&self) -> bool {
        matches!(
            self,
            ProtocolError::TooLong(_)
                | ProtocolError::UnknownKind(_)
                | ProtocolError::BadControl(_)
        )
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    Control = 1,
    Stdin = 2,
    Stdout = 3,
    Stderr = 4,
    StdinClose = 5,
}

impl TryFrom<u8> for Kind {
    type Error = ProtocolError;

    fn try_from(v: u8) -> Result<Kind, ProtocolError> {
        Ok(match v {
            1 => Kind::Control,
            2 => Kind::Stdin,
            3 => Kind::Stdout,
            4 => Kind::Stderr,
            5 => Kind::StdinClose,
            other => return Err(ProtocolError::UnknownKind(other)),
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub kind: Kind,
    pub stream: u32,
    pub payload: Vec<u8>,
}

impl Frame {
    pub fn control<T: Serialize>(msg: &T) -> Frame {
        Frame {
            kind: Kind::Control,
            stream: 0,
            // Serializing our own enums to JSON cannot fail.
            payload: serde_json::to_vec(msg).unwrap_or_default(),
        }
    }

    pub fn data(kind: Kind, stream: u32, payload: &[u8]) -> Frame {
        Frame {
            kind,
            stream,
            payload: payload.to_vec(),
        }
    }

    /// Parses a control payload; anything else is an error.
    pub fn parse_control<T: for<'de> Deserialize<'de>>(&self) -> Result<T, ProtocolError> {
        if self.kind != Kind::Control {
            return Err(ProtocolError::BadControl(format!(
                "expected a control frame, got {:?}",
                self.kind
            )));
        }
        serde_json::from_slice(&self.payload).map_err(|e| ProtocolError::BadControl(e.to_string()))
    }

    /// The frame as bytes on the wire. Payloads over the limit are a bug of
    /// the sender: callers split stdio into chunks of at most MAX_PAYLOAD.
    pub fn encode(&self) -> Result<Vec<u8>, ProtocolError> {
        if self.payload.len() > MAX_PAYLOAD {
            return Err(ProtocolError::TooLong(self.payload.len()));
        }
        let mut out = Vec::with_capacity(HEADER_LEN + self.payload.len());
        out.extend_from_slice(&(self.payload.len() as u32).to_le_bytes());
        out.push(self.kind as u8);
        out.extend_from_slice(&self.stream.to_le_bytes());
        out.extend_from_slice(&self.payload);
        Ok(out)
    }

    pub fn write_to(&self, w: &mut impl Write) -> Result<(), ProtocolError> {
        w.write_all(&self.encode()?)?;
        Ok(())
    }

    /// Reads one whole frame (blocking). EOF before a header is `Closed`.
    pub fn read_from(r: &mut impl Read) -> Result<Frame, ProtocolError> {
        let mut header = [0u8; HEADER_LEN];
        let mut got = 0;
        while got < HEADER_LEN {
            match r.read(&mut header[got..]) {
                Ok(0) if got == 0 => return Err(ProtocolError::Closed),
                Ok(0) => return Err(ProtocolError::Io(std::io::ErrorKind::UnexpectedEof.into())),
                Ok(n) => got += n,
                Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e.into()),
            }
        }
        let (len, kind, stream) = parse_header(&header)?;
        let mut payload = vec![0u8; len];
        r.read_exact(&mut payload)?;
        Ok(Frame {
            kind,
            stream,
            payload,
        })
    }
}

fn parse_header(h: &[u8; HEADER_LEN]) -> Result<(usize, Kind, u32), ProtocolError> {
    let len = u32::from_le_bytes([h[0], h[1], h[2], h[3]]) as usize;
    if len > MAX_PAYLOAD {
        return Err(ProtocolError::TooLong(len));
    }
    let kind = Kind::try_from(h[4])?;
    let stream = u32::from_le_bytes([h[5], h[6], h[7], h[8]]);
    Ok((len, kind, stream))
}

/// Incremental decoder for event loops that read whatever is available
/// (the guest agent's poll loop).
#[derive(Default)]
pub struct Decoder {
    buf: Vec<u8>,
}

#[allow(dead_code)] // used by the guest agent, which lands separately
impl Decoder {
    pub fn push(&mut self, bytes: &[u8]) {
        self.buf.extend_from_slice(bytes);
    }

    /// The next complete frame, `None` if more bytes are needed. An error
    /// is final: the stream cannot be resynchronised.
    pub fn next_frame(&mut self) -> Result<Option<Frame>, ProtocolError> {
        let Some(header) = self.buf.get(..HEADER_LEN) else {
            return Ok(None);
        };
        let mut h = [0u8; HEADER_LEN];
        h.copy_from_slice(header);
        let (len, kind, stream) = parse_header(&h)?;
        let Some(total) = HEADER_LEN.checked_add(len) else {
            return Err(ProtocolError::TooLong(len));
        };
        if self.buf.len() < total {
            return Ok(None);
        }
        let payload = self.buf[HEADER_LEN..total].to_vec();
        self.buf.drain(..total);
        Ok(Some(Frame {
            kind,
            stream,
            payload,
        }))
    }
}

/// Requests from the host. Each gets one [`GuestMessage::Reply`].
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum HostMessage {
    /// Configure the guest's network before `Create`: one interface per
    /// interface of the container's network namespace, found by MAC.
    /// Reply: `Ok`.
    Network { network: Network },
    /// Create the container from a complete OCI spec whose paths are guest
    /// paths (the host rewrote root and bind mounts onto the shares).
    /// Reply: `Created { pid }`.
    Create { spec: Box<Spec> },
    /// Start the created container's process. Reply: `Ok`.
    Start,
    /// Run OCI hooks in order in the created container's namespaces, each
    /// with `state` (the OCI state as the host shows it) on its stdin: the
    /// startContainer hooks, sent just before `Start`. Reply: `Ok`, or
    /// `Error` naming the hook that failed.
    RunHooks { hooks: Vec<Hook>, state: OciState },
    /// Run a process in the container as stream `id` (> 0), in the
    /// sub-cgroups `cgroup` names (`exec --cgroup` values as runc reads
    /// them; empty: the container's own cgroup).
    /// Reply: `Started { pid }`.
    Exec {
        id: u32,
        process: Box<Process>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cgroup: Vec<String>,
    },
    /// Send `signal` to the process of stream `id`, or to every process of
    /// the container with `all`. Reply: `Ok`.
    Signal { id: u32, signal: i32, all: bool },
    /// Set the terminal size of stream `id`. Reply: `Ok`.
    Resize { id: u32, rows: u16, cols: u16 },
    /// List the container's processes (guest pids). Reply: `Pids`.
    Ps,
    /// Guest memory and CPU use. Reply: `Stats`.
    Stats,
    /// Change the container's cgroup limits in the guest. Reply: `Ok`.
    Update { resources: Box<LinuxResources> },
    /// Freeze the container's cgroup in the guest, as runc's `pause`
    /// freezes it on a host: its processes stop (a signal stays pending,
    /// SIGKILL still kills), the agent goes on answering. Reply: `Ok`.
    Pause,
    /// Thaw what `Pause` froze. Reply: `Ok`.
    Resume,
    /// Kill everything, sync and power off. Reply: `Ok`, then the VM ends.
    Shutdown,
    /// Create a further container of the pod, whose init is stream `id`
    /// (> 0, unused, handed out by the host like an exec's): `spec`'s paths
    /// are guest paths (below [`SHARE_MOUNT`]/[`SHARE_POD_DIR`]), and it
    /// joins the namespaces `join` names of the VM's own (sandbox)
    /// container, which must have been created. Its processes and stdio
    /// are reported on stream `id` as an exec's are (`Exit { id }` when its
    /// init ends). Reply: `Created { pid }`.
    CreateMember {
        id: u32,
        spec: Box<Spec>,
        #[serde(default)]
        join: Vec<PodNamespace>,
    },
    /// A request about the member container whose init is stream `id`.
    /// `Signal` and `Resize` name the member's init by its stream id and
    /// need no wrapper. Reply: as the inner request's.
    Member { id: u32, request: MemberRequest },
    /// Before any container: run a throwaway container in the guest
    /// (create, start, its exit, delete), so that the code a container's
    /// creation and start run is read and translated before the
    /// container comes (a pool VM's keeper sends it while the VM waits).
    /// Nothing of it is left. Reply: `Ok`, or `Error` (the VM serves a
    /// container all the same).
    Warm,
}

/// The namespaces of the pod's sandbox container a member joins: CRI names
/// them by the host path of the pause process, which in a pod VM is the
/// sandbox container in the guest.
#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum PodNamespace {
    Network,
    Ipc,
    Uts,
    Pid,
}

/// What the host asks of one member container ([`HostMessage::Member`]).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum MemberRequest {
    /// Start its created init. Reply: `Ok`.
    Start,
    /// Its startContainer hooks, as [`HostMessage::RunHooks`]. Reply: `Ok`.
    RunHooks { hooks: Vec<Hook>, state: OciState },
    /// Run a process in it as stream `stream` (> 0, unused), in the
    /// sub-cgroups `cgroup` names (as [`HostMessage::Exec`]).
    /// Reply: `Started { pid }`.
    Exec {
        stream: u32,
        process: Box<Process>,
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        cgroup: Vec<String>,
    },
    /// Its processes. Reply: `Pids`.
    Ps,
    /// Its cgroup's use (and the guest's memory). Reply: `Stats`.
    Stats,
    /// New cgroup limits for it. Reply: `Ok`.
    Update { resources: Box<LinuxResources> },
    /// Freeze it, as [`HostMessage::Pause`]. Reply: `Ok`.
    Pause,
    /// Thaw it, as [`HostMessage::Resume`]. Reply: `Ok`.
    Resume,
    /// Kill whatever of it still runs and remove it from the guest; its
    /// init's exit is reported (if it had not been) before the reply.
    /// Reply: `Ok`.
    Delete,
}

/// The guest's network, as the host read it from the container's network
/// namespace.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct Network {
    pub interfaces: Vec<Interface>,
    /// A DNS relay in the guest for a resolver the container's
    /// `resolv.conf` names on a loopback address (Docker's embedded DNS at
    /// 127.0.0.11 is an address inside the container's network namespace,
    /// which the guest's own loopback cannot reach).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dns: Option<DnsRelay>,
}

/// One NIC of the guest.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Interface {
    /// The name it has in the container's namespace (`eth0`).
    pub name: String,
    /// `aa:bb:cc:dd:ee:ff`: the namespace interface's MAC, which the VMM
    /// gives the virtio NIC.
    pub mac: String,
    /// The MAC the NIC booted with, when that is not `mac`: a VM booted
    /// before its container (`microvm::pool`). The guest finds the NIC by
    /// it and gives it `mac`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub boot_mac: Option<String>,
    pub mtu: u32,
    pub addresses: Vec<IpNet>,
    /// In the order to add them (on-link routes before the routes through
    /// a gateway on them).
    pub routes: Vec<Route>,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct IpNet {
    pub addr: std::net::IpAddr,
    pub prefix: u8,
}

#[derive(Debug, Clone, Copy, Serialize, Deserialize, PartialEq, Eq)]
pub struct Route {
    pub dst: IpNet,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gateway: Option<std::net::IpAddr>,
}

/// UDP DNS relay: the guest listens on port 53 of each `listen` address
/// (loopback addresses of the guest) and forwards to `upstream`, the
/// host-side relay in the container's network namespace.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct DnsRelay {
    pub listen: Vec<std::net::IpAddr>,
    pub upstream: std::net::SocketAddr,
}

/// The OCI state a hook reads on its stdin, as `agentvm state` shows it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct OciState {
    #[serde(rename = "ociVersion")]
    pub oci_version: String,
    pub id: String,
    pub status: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<i32>,
    pub bundle: std::path::PathBuf,
    #[serde(default, skip_serializing_if = "std::collections::HashMap::is_empty")]
    pub annotations: std::collections::HashMap<String, String>,
}

/// Results of a host request.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "result", rename_all = "snake_case")]
pub enum Reply {
    Ok,
    Created {
        pid: i32,
    },
    Started {
        pid: i32,
    },
    Pids {
        pids: Vec<i32>,
        /// The same processes with what `ps` shows of them.
        #[serde(default)]
        processes: Vec<GuestProcess>,
    },
    Stats {
        stats: GuestStats,
        /// What the VMM itself counts for the VM: added by the supervisor
        /// (which drops whatever a guest put here), `None` from a VMM that
        /// counts nothing of its own (QEMU).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        vmm: Option<VmmCounters>,
    },
    /// The request failed; `message` is what runc would have printed.
    Error {
        message: String,
    },
}

/// One process of the container, as the guest sees it.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GuestProcess {
    pub pid: i32,
    pub ppid: i32,
    pub uid: u32,
    /// The command line (arguments joined by spaces), or `[comm]`.
    pub cmd: String,
}

#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq)]
pub struct GuestStats {
    pub memory_total_bytes: u64,
    pub memory_available_bytes: u64,
    /// Bytes charged to the container's cgroup in the guest.
    pub memory_usage_bytes: u64,
    /// The container's memory limit in the guest; 0 when it has none.
    #[serde(default)]
    pub memory_limit_bytes: u64,
    /// CPU time of the container's cgroup, nanoseconds.
    pub cpu_usage_ns: u64,
    pub pids: u64,
    /// Processes of the container the guest kernel's OOM killer killed
    /// (`oom_kill` of the container cgroup's `memory.events`).
    #[serde(default)]
    pub oom_kills: u64,
}

/// What the builtin VMM counts for one VM, as `events --stats` reports
/// it. The host measures all of it; none of it comes from the guest.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VmmCounters {
    /// From the VM's creation (before `/dev/kvm` is opened) to the first
    /// `KVM_RUN` of vCPU 0, the guest's first instruction; `None` before it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub first_instruction_us: Option<u64>,
    /// That span step by step (name, microseconds), in order.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub first_instruction_steps: Vec<(String, u64)>,
    /// Exits from `KVM_RUN` on every vCPU, and those that were port or
    /// MMIO accesses a device served.
    pub vcpu_exits: u64,
    pub pio_exits: u64,
    pub mmio_exits: u64,
    /// Descriptor chains the devices refused as malformed (each completed
    /// with length 0).
    pub bad_chains: u64,
    /// Requests the virtio-fs device served.
    #[serde(default)]
    pub fs_requests: u64,
    /// One per virtio NIC, in the order of the guest's interfaces; the
    /// guest's view (`rx`: frames the guest received).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub nics: Vec<NicCounters>,
}

/// A virtio NIC's traffic, in the fields of runc's `NetworkInterface`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NicCounters {
    /// The interface's name in the guest (`eth0`).
    pub name: String,
    pub rx_bytes: u64,
    pub rx_packets: u64,
    pub rx_errors: u64,
    pub rx_dropped: u64,
    pub tx_bytes: u64,
    pub tx_packets: u64,
    pub tx_errors: u64,
    pub tx_dropped: u64,
}

/// The guest's boot milestones, in microseconds of the guest's
/// `CLOCK_BOOTTIME` (which starts with its kernel): the host only reports
/// them, and clamps them to what it measured itself.
#[derive(Debug, Clone, Copy, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct GuestBoot {
    /// The kernel ran /init.
    pub init_us: u64,
    /// The agent set up its mounts, cgroups and port and is about to say
    /// Hello.
    pub ready_us: u64,
}

/// What the guest sends.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum GuestMessage {
    /// First message after boot.
    Hello {
        version: u32,
        kernel: String,
        /// When the guest's boot reached its milestones, for the boot
        /// trace (a guest that does not say is not an error).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        boot: Option<GuestBoot>,
    },
    /// The answer to the oldest unanswered host request.
    Reply(Reply),
    /// The process of stream `id` ended: exit code, or 128+signal. For the
    /// container's init, `oom_kills` is its cgroup's OOM-kill count then
    /// (kept for `events`, as the count goes with the VM).
    Exit {
        id: u32,
        status: i32,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        oom_kills: Option<u64>,
    },
    /// A diagnostic from the guest agent, for the runtime log.
    Log { level: String, message: String },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_through_both_readers() {
        let frames = vec![
            Frame::control(&HostMessage::Start),
            Frame::data(Kind::Stdout, 3, b"hello"),
            Frame::data(Kind::StdinClose, 0, b""),
            Frame::control(&GuestMessage::Exit {
                id: 2,
                status: 137,
                oom_kills: None,
            }),
        ];
        let mut wire = Vec::new();
        for f in &frames {
            f.write_to(&mut wire).unwrap();
        }
        let mut r = &wire[..];
        for f in &frames {
            assert_eq!(&Frame::read_from(&mut r).unwrap(), f);
        }
        assert!(matches!(
            Frame::read_from(&mut r),
            Err(ProtocolError::Closed)
        ));

        // Byte by byte through the decoder.
        let mut d = Decoder::default();
        let mut out = Vec::new();
        for b in &wire {
            d.push(std::slice::from_ref(b));
            while let Some(f) = d.next_frame().unwrap() {
                out.push(f);
            }
        }
        assert_eq!(out, frames);
    }

    #[test]
    fn control_messages_serialize_as_tagged_json() {
        let m = HostMessage::Signal {
            id: 0,
            signal: 15,
            all: false,
        };
        let f = Frame::control(&m);
        assert_eq!(
            std::str::from_utf8(&f.payload).unwrap(),
            r#"{"type":"signal","id":0,"signal":15,"all":false}"#
        );
        assert_eq!(f.parse_control::<HostMessage>().unwrap(), m);
        let r = GuestMessage::Reply(Reply::Created { pid: 7 });
        let back: GuestMessage = Frame::control(&r).parse_control().unwrap();
        assert_eq!(back, r);
    }

    #[test]
    fn hostile_input_is_an_error_not_a_panic() {
        // Oversized length.
        let mut bad = (MAX_PAYLOAD as u32 + 1).to_le_bytes().to_vec();
        bad.extend_from_slice(&[1, 0, 0, 0, 0]);
        assert!(matches!(
            Frame::read_from(&mut &bad[..]),
            Err(ProtocolError::TooLong(_))
        ));
        let mut d = Decoder::default();
        d.push(&bad);
        assert!(d.next_frame().is_err());
        // u32::MAX length must not overflow.
        let mut huge = u32::MAX.to_le_bytes().to_vec();
        huge.extend_from_slice(&[1, 0, 0, 0, 0]);
        let mut d = Decoder::default();
        d.push(&huge);
        assert!(d.next_frame().is_err());
        // Unknown kind.
        let unknown = [0, 0, 0, 0, 99, 0, 0, 0, 0];
        assert!(matches!(
            Frame::read_from(&mut &unknown[..]),
            Err(ProtocolError::UnknownKind(99))
        ));
        // Truncated payload.
        let trunc = [5, 0, 0, 0, 3, 0, 0, 0, 0, b'a'];
        assert!(Frame::read_from(&mut &trunc[..]).is_err());
        // Garbage JSON, wrong type, data frame where control expected.
        for payload in [&b"{"[..], b"[]", br#"{"type":"nope"}"#, b"\xff\xfe"] {
            let f = Frame {
                kind: Kind::Control,
                stream: 0,
                payload: payload.to_vec(),
            };
            assert!(f.parse_control::<GuestMessage>().is_err());
        }
        assert!(Frame::data(Kind::Stdout, 0, b"{}")
            .parse_control::<GuestMessage>()
            .is_err());
    }

    #[test]
    fn member_requests_round_trip() {
        let m = HostMessage::Member {
            id: 3,
            request: MemberRequest::Exec {
                stream: 4,
                process: Box::default(),
                cgroup: vec!["pids:sub".into()],
            },
        };
        let back: HostMessage = Frame::control(&m).parse_control().unwrap();
        assert_eq!(back, m);
        let c = HostMessage::CreateMember {
            id: 3,
            spec: Box::default(),
            join: vec![PodNamespace::Network, PodNamespace::Uts],
        };
        let text = String::from_utf8(Frame::control(&c).payload).unwrap();
        assert!(text.contains(r#""join":["network","uts"]"#), "{text}");
        let back: HostMessage = Frame::control(&c).parse_control().unwrap();
        assert_eq!(back, c);
        let delete = Frame::control(&HostMessage::Member {
            id: 1,
            request: MemberRequest::Delete,
        });
        assert_eq!(
            std::str::from_utf8(&delete.payload).unwrap(),
            r#"{"type":"member","id":1,"request":{"type":"delete"}}"#
        );
    }

    #[test]
    fn violations_are_told_apart_from_a_broken_channel() {
        assert!(ProtocolError::TooLong(MAX_PAYLOAD + 1).is_violation());
        assert!(ProtocolError::UnknownKind(99).is_violation());
        assert!(ProtocolError::BadControl("x".into()).is_violation());
        assert!(!ProtocolError::Closed.is_violation());
        let eof = std::io::Error::from(std::io::ErrorKind::UnexpectedEof);
        assert!(!ProtocolError::Io(eof).is_violation());
    }

    #[test]
    fn random_bytes_never_panic() {
        // A small deterministic xorshift stream of garbage.
        let mut x: u64 = 0x9e3779b97f4a7c15;
        for _ in 0..2000 {
            let mut d = Decoder::default();
            let mut bytes = Vec::new();
            for _ in 0..64 {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                bytes.push(x as u8);
            }
            d.push(&bytes);
            while let Ok(Some(f)) = d.next_frame() {
                let _ = f.parse_control::<GuestMessage>();
                let _ = f.parse_control::<HostMessage>();
            }
            let _ = Frame::read_from(&mut &bytes[..]);
        }
    }
}
