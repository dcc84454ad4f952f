//! The egress policy in the container tier: the workload's network
//! namespace is put behind a router namespace of ours, where the rules and
//! the egress daemon live, out of the workload's reach.
//!
//! Docker and CNI configure the container's namespace (N) through the
//! init's pid during `create`'s hooks, so the workload stays in N. Once the
//! hooks ran, each of N's interfaces (Docker's veth) moves into a new
//! namespace R with its addresses and routes, and N gets in its place one
//! end of a veth pair with the same name, MAC, MTU, addresses and routes;
//! R routes the container's address to the pair's other end exactly as the
//! microvm tier routes it to a tap ([`crate::router`]), so everything from
//! the workload crosses R's IP stack, its nftables rules and, for TCP, the
//! egress proxy. Published ports, the bridge and the peers see the same
//! address and MAC as before.
//!
//! What the workload can do in N (with `CAP_NET_ADMIN`) changes only N:
//! its packets still leave through the pair, where R's reverse-path filter
//! and anti-spoofing rules drop any source that is not the container's.
//! R is reachable only through the bind mount in the container's state
//! directory and the daemon's `/proc/<pid>/ns/net`.
//!
//! R lives until `delete`, which moves Docker's interfaces back into N as
//! they were, so Docker or CNI tear them down as usual. The daemon ends
//! with the container's init; if it is killed, the rules (which send every
//! connection to it) keep denying.

use std::fs::File;
use std::net::{IpAddr, SocketAddr, UdpSocket};
use std::os::fd::{AsFd, AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::fs::MetadataExt;
use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sched::{setns, unshare, CloneFlags};
use oci_spec::runtime::{LinuxNamespaceType, Spec};

use crate::egress::Policy;
use crate::netlink::{self, Link, Netlink, NetlinkError, RouteKind, TABLE_MAIN};
use crate::protocol::{Interface, IpNet, Route as SavedRoute};
use crate::router::{self, DaemonLife, DnsMode, HostDnsRelay, Sandbox, DNS_RELAY};

/// What was moved, and the daemon, in the container's state directory.
const RECORD: &str = "egress.json";
/// The router namespace's bind mount.
const ROUTER_PIN: &str = "egress-router.netns";
/// The workload's namespace's bind mount (Docker's goes with the init).
const WORKLOAD_PIN: &str = "egress-workload.netns";
/// The alias of the pair's end in the workload's namespace.
const PEER_ALIAS: &str = "agentvm-egress";

#[derive(Debug, thiserror::Error)]
pub enum EgressError {
    #[error(
        "an egress policy needs the container's own network namespace; this container \
         shares the host's"
    )]
    HostNetwork,
    #[error(
        "egress policy: the container's network namespace is behind another container's \
         egress router already (a shared namespace takes one policy, set on its first container)"
    )]
    AlreadyRouted,
    #[error("egress policy: interface {link} cannot leave the container's namespace: {source}")]
    Move { link: String, source: NetlinkError },
    #[error("egress policy: {0}")]
    Router(#[from] router::NetError),
    #[error("egress policy: {0}")]
    Netlink(#[from] NetlinkError),
    #[error("egress policy: {what}: {source}")]
    Io {
        what: String,
        source: std::io::Error,
    },
    #[error("egress policy: {what}: {source}")]
    Sys {
        what: String,
        source: nix::errno::Errno,
    },
    #[error("egress policy: {0} has no interface named {1} any more")]
    Lost(&'static str, String),
    #[error("egress policy: a namespace thread panicked")]
    Thread,
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> EgressError {
    let what = what.into();
    move |source| EgressError::Io { what, source }
}

fn sys(what: impl Into<String>) -> impl FnOnce(nix::errno::Errno) -> EgressError {
    let what = what.into();
    move |source| EgressError::Sys { what, source }
}

/// The interfaces taken from the workload's namespace, as they were there
/// (every global address and main-table route, both families), and the
/// daemon serving the policy.
#[derive(Debug, Default, serde::Serialize, serde::Deserialize)]
struct Record {
    moved: Vec<Interface>,
    /// Those of them that were down (given back down).
    #[serde(default)]
    down: Vec<String>,
    daemon_pid: Option<i32>,
    daemon_start_time: Option<u64>,
    /// Whether the resolver redirect went into the workload's namespace
    /// (`None` in records written before this was kept: assume it did).
    /// Removing it runs `nft`, some 20 ms of every `delete`.
    #[serde(default)]
    workload_rules: Option<bool>,
}

impl Record {
    fn save(&self, dir: &Path) -> Result<(), EgressError> {
        let path = dir.join(RECORD);
        let text = serde_json::to_vec(self).map_err(|e| EgressError::Io {
            what: format!("write {}", path.display()),
            source: e.into(),
        })?;
        std::fs::write(&path, text).map_err(io(format!("write {}", path.display())))
    }

    fn load(dir: &Path) -> Option<Record> {
        let text = std::fs::read(dir.join(RECORD)).ok()?;
        serde_json::from_slice(&text).ok()
    }
}

/// Whether the spec gives the container a network namespace of its own
/// (new, or joined by path).
fn has_network_namespace(spec: &Spec) -> bool {
    spec.linux()
        .as_ref()
        .and_then(|l| l.namespaces().as_ref())
        .is_some_and(|ns| ns.iter().any(|n| n.typ() == LinuxNamespaceType::Network))
}

/// Runs `f` on a thread of its own in the namespace open as `ns`.
fn in_ns<T: Send>(
    ns: &File,
    f: impl FnOnce() -> Result<T, EgressError> + Send,
) -> Result<T, EgressError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            setns(ns, CloneFlags::CLONE_NEWNET).map_err(sys("enter a network namespace"))?;
            f()
        })
        .join()
        .map_err(|_| EgressError::Thread)?
    })
}

/// A new, empty network namespace, open.
fn new_netns() -> Result<File, EgressError> {
    std::thread::scope(|s| {
        s.spawn(|| {
            unshare(CloneFlags::CLONE_NEWNET).map_err(sys("create the router namespace"))?;
            File::open("/proc/thread-self/ns/net").map_err(io("open the router namespace"))
        })
        .join()
        .map_err(|_| EgressError::Thread)?
    })
}

/// Keeps the namespace open as `ns` alive at `path` (a bind mount).
fn pin(ns: &File, path: &Path) -> Result<(), EgressError> {
    File::create(path).map_err(io(format!("create {}", path.display())))?;
    let source = format!("/proc/self/fd/{}", ns.as_raw_fd());
    mount(
        Some(source.as_str()),
        path,
        None::<&str>,
        MsFlags::MS_BIND,
        None::<&str>,
    )
    .map_err(sys(format!("bind {}", path.display())))
}

fn unpin(path: &Path) {
    let _ = umount2(path, MntFlags::MNT_DETACH);
    let _ = std::fs::remove_file(path);
}

/// Every interface of the calling thread's namespace but loopback, as it
/// is. All of them leave the workload's namespace: one left behind (a
/// second veth, down, IPv6-only or not Ethernet) would be a way out that
/// root in the workload could bring up. Those the router cannot route
/// (down, without IPv4, not Ethernet) get no pair: cut off, as the policy
/// cannot judge their traffic.
fn interfaces(nl: &mut Netlink) -> Result<Vec<(Link, Interface)>, EgressError> {
    let links = nl.links()?;
    let addrs = nl.addresses()?;
    let routes = nl.routes()?;
    if links.iter().any(|l| l.alias.as_deref() == Some(PEER_ALIAS)) {
        return Err(EgressError::AlreadyRouted);
    }
    let mut out = Vec::new();
    for link in links {
        if link.loopback {
            continue;
        }
        let mine: Vec<IpNet> = addrs
            .iter()
            .filter(|a| a.index == link.index && a.global)
            .map(|a| IpNet {
                addr: a.addr,
                prefix: a.prefix,
            })
            .collect();
        let mut own: Vec<_> = routes
            .iter()
            .filter(|r| {
                r.table == TABLE_MAIN
                    && r.kind == RouteKind::Unicast
                    && r.oif == Some(link.index)
                    // The kernel's own, back with the link.
                    && !matches!(r.dst, IpAddr::V6(a) if a.segments()[0] & 0xffc0 == 0xfe80)
            })
            .collect();
        // On-link routes first: a gateway must be reachable when its route
        // is added back.
        own.sort_by_key(|r| r.gateway.is_some());
        let iface = Interface {
            name: link.name.clone(),
            mac: link
                .mac
                .as_ref()
                .map(netlink::format_mac)
                .unwrap_or_default(),
            boot_mac: None,
            mtu: link.mtu,
            addresses: mine,
            routes: own
                .into_iter()
                .map(|r| SavedRoute {
                    dst: IpNet {
                        addr: r.dst,
                        prefix: r.prefix,
                    },
                    gateway: r.gateway,
                })
                .collect(),
        };
        out.push((link, iface));
    }
    Ok(out)
}

/// Puts the workload of the created container `id` (its init is `pid`)
/// behind a router namespace enforcing `policy`. `dir` is the container's
/// state directory; `audit` the audit trail. On failure, what was done is
/// undone.
pub fn enforce(
    dir: &Path,
    id: &str,
    pid: i32,
    spec: &Spec,
    rootfs: &Path,
    policy: &Policy,
    audit: &Path,
) -> Result<(), EgressError> {
    if !has_network_namespace(spec) {
        return Err(EgressError::HostNetwork);
    }
    let workload =
        File::open(format!("/proc/{pid}/ns/net")).map_err(io("open the container's namespace"))?;
    let host = std::fs::metadata("/proc/self/ns/net").map_err(io("read this namespace"))?;
    let theirs = workload
        .metadata()
        .map_err(io("read the container's namespace"))?;
    if (host.dev(), host.ino()) == (theirs.dev(), theirs.ino()) {
        return Err(EgressError::HostNetwork);
    }
    let found = in_ns(&workload, || interfaces(&mut Netlink::open()?))?;
    if found.is_empty() {
        // Loopback only (`--network none`): nothing leaves.
        return Ok(());
    }
    let result = route(
        dir,
        id,
        pid,
        (spec, rootfs),
        policy,
        audit,
        &workload,
        found,
    );
    if result.is_err() {
        teardown(dir);
    }
    result
}

#[allow(clippy::too_many_arguments)]
fn route(
    dir: &Path,
    id: &str,
    pid: i32,
    (spec, rootfs): (&Spec, &Path),
    policy: &Policy,
    audit: &Path,
    workload: &File,
    found: Vec<(Link, Interface)>,
) -> Result<(), EgressError> {
    let router = new_netns()?;
    let mut record = Record {
        moved: found.iter().map(|(_, i)| i.clone()).collect(),
        down: found
            .iter()
            .filter(|(l, _)| !l.up)
            .map(|(l, _)| l.name.clone())
            .collect(),
        ..Default::default()
    };
    // Written before anything moves, so that teardown knows what to undo.
    record.save(dir)?;
    pin(workload, &dir.join(WORKLOAD_PIN))?;
    pin(&router, &dir.join(ROUTER_PIN))?;
    in_ns(workload, || {
        let mut nl = Netlink::open()?;
        for (link, _) in &found {
            nl.move_link(link.index, router.as_raw_fd())
                .map_err(|source| EgressError::Move {
                    link: link.name.clone(),
                    source,
                })?;
        }
        Ok(())
    })?;

    let resolv = router::resolv_conf(spec, rootfs)
        .map(|t| router::nameservers(&t))
        .unwrap_or_default();
    let pidfd = pidfd_open(pid)?;
    // Docker's embedded DNS, on the workload's loopback: a resolver of
    // the policy's beside it answers the workload.
    let loopback = resolv.iter().find_map(|ip| match ip {
        IpAddr::V4(v4) if v4.is_loopback() => Some(*v4),
        _ => None,
    });
    let (workload_dns, workload_dns_port) = match loopback.filter(|_| policy.has_names()) {
        Some(resolver) => {
            let (listener, pool) = in_ns(workload, || workload_sockets(resolver))?;
            let port = listener
                .local_addr()
                .map_err(io("read the resolver's port"))?
                .port();
            (Some((listener, pool)), Some((resolver, port)))
        }
        None => (None, None),
    };
    let (guest, daemon) = in_ns(&router, || {
        let mut nl = Netlink::open()?;
        let links = nl.links()?;
        if let Some(lo) = links.iter().find(|l| l.loopback) {
            nl.set_link(lo.index, None, None, None, true)?;
        }
        for iface in record
            .moved
            .iter()
            .filter(|i| !record.down.contains(&i.name))
        {
            let link = links
                .iter()
                .find(|l| l.name == iface.name)
                .ok_or_else(|| EgressError::Lost("the router", iface.name.clone()))?;
            netlink::configure_interface(&mut nl, link, iface)?;
        }
        let sandbox = Sandbox::Veths(workload.as_fd());
        let mut plumbed = router::plumb(None, DnsMode::None, true, sandbox)?;
        for w in &plumbed.warnings {
            tracing::warn!("container {id}: {w}");
        }
        if let Some(rules) = crate::egress::ruleset(
            policy,
            sandbox.prefix(),
            DNS_RELAY,
            plumbed.proxy6.as_ref().map(|_| router::SERVICE6),
            &plumbed.sources(sandbox),
        ) {
            plumbed.install_egress(&rules)?;
        }
        if plumbed.guest.interfaces.is_empty() {
            // Nothing the router can route: the workload is cut off, and
            // no daemon is needed.
            return Ok((plumbed.guest.clone(), None));
        }
        let dns = if policy.has_names() {
            let listener = UdpSocket::bind(SocketAddr::new(IpAddr::V4(DNS_RELAY), 53))
                .map_err(io(format!("bind {DNS_RELAY}:53")))?;
            Some(HostDnsRelay {
                listener,
                upstream_socket: None,
                upstream: upstream(&resolv),
            })
        } else {
            None
        };
        let proxy = plumbed
            .proxy
            .take()
            .ok_or_else(|| EgressError::Lost("the router", "the proxy's listener".into()))?;
        let dns6 = match &plumbed.proxy6 {
            Some(_) if policy.has_names() => {
                let at = SocketAddr::new(IpAddr::V6(router::SERVICE6), 53);
                Some(UdpSocket::bind(at).map_err(io(format!("bind {at}")))?)
            }
            _ => None,
        };
        let daemon = router::EgressDaemon {
            policy: &policy.to_string(),
            id,
            audit,
            dns,
            proxy,
            proxy6: plumbed.proxy6.take(),
            dns6,
            source6: plumbed.source6,
            // The workload's namespace asks the router for its IPv6
            // neighbours as a guest does: the daemon answers.
            ndp: std::mem::take(&mut plumbed.ndp),
            run_dir: dir,
            life: DaemonLife::While(pidfd.as_fd()),
            workload_dns,
        }
        .spawn()?;
        let guest = plumbed.guest.clone();
        plumbed.keep();
        Ok((guest, Some(daemon)))
    })?;
    let workload_dns_port = workload_dns_port.filter(|_| daemon.is_some());
    record.workload_rules = Some(workload_dns_port.is_some());
    if let Some(daemon) = daemon {
        record.daemon_pid = Some(daemon.id() as i32);
        record.daemon_start_time = crate::state::process_start_time(daemon.id() as i32);
    }
    record.save(dir)?;

    in_ns(workload, || {
        let mut nl = Netlink::open()?;
        let links = nl.links()?;
        for iface in &guest.interfaces {
            let link = links
                .iter()
                .find(|l| l.name == iface.name)
                .ok_or_else(|| EgressError::Lost("the container", iface.name.clone()))?;
            netlink::configure_interface(&mut nl, link, iface)?;
            nl.set_alias(link.index, PEER_ALIAS)?;
        }
        if let Some((resolver, port)) = workload_dns_port {
            crate::egress::nft::apply(&crate::egress::workload_dns_ruleset(resolver, port))
                .map_err(router::NetError::Nft)?;
        }
        Ok(())
    })
}

/// In the workload's namespace: the policy's resolver socket beside the
/// one on `resolver`, and sockets connected to that one, marked to pass
/// the redirect.
fn workload_sockets(
    resolver: std::net::Ipv4Addr,
) -> Result<(UdpSocket, Vec<UdpSocket>), EgressError> {
    let listener = UdpSocket::bind((resolver, 0)).map_err(io(format!("bind {resolver}")))?;
    let mut pool = Vec::new();
    for _ in 0..crate::egress::daemon::POOL_SIZE {
        let sock = UdpSocket::bind(("0.0.0.0", 0)).map_err(io("bind a resolver socket"))?;
        let mark = crate::egress::WORKLOAD_DNS_MARK;
        // SAFETY: SO_MARK reads a c_uint of the given size from `mark`.
        let rc = unsafe {
            libc::setsockopt(
                sock.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_MARK,
                (&mark as *const u32).cast(),
                std::mem::size_of::<u32>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io("mark a resolver socket")(std::io::Error::last_os_error()));
        }
        sock.connect((resolver, 53))
            .map_err(io(format!("connect to {resolver}:53")))?;
        pool.push(sock);
    }
    Ok((listener, pool))
}

/// Where the policy's resolver sends allowed names: the container's first
/// resolver that is not on loopback, else the host's (Docker's embedded
/// DNS forwards to the host's resolvers, from inside the container's
/// namespace, through the router).
fn upstream(container: &[IpAddr]) -> Option<SocketAddr> {
    let host = std::fs::read_to_string("/etc/resolv.conf")
        .map(|t| router::nameservers(&t))
        .unwrap_or_default();
    container
        .iter()
        .chain(host.iter())
        .find(|ip| !ip.is_loopback() && !ip.is_unspecified())
        .map(|ip| SocketAddr::new(*ip, 53))
}

fn pidfd_open(pid: i32) -> Result<OwnedFd, EgressError> {
    // SAFETY: pidfd_open takes a pid and flags and returns a new
    // descriptor or -1; nothing is borrowed.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(io("open the init's pidfd")(std::io::Error::last_os_error()));
    }
    // SAFETY: a descriptor the kernel just returned, owned by nothing else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as i32) })
}

/// Undoes [`enforce`] (`delete`, or a failed `create`): the daemon is
/// killed, the veth pairs deleted, Docker's interfaces go back into the
/// workload's namespace as they were, the router namespace goes. Best
/// effort: the namespaces or links may be gone already.
/// Whether the container whose state directory is `dir` runs under an
/// egress policy (its router's record is there).
pub fn in_force(dir: &Path) -> bool {
    Record::load(dir).is_some()
}

pub fn teardown(dir: &Path) {
    let Some(record) = Record::load(dir) else {
        return;
    };
    if let (Some(pid), start) = (record.daemon_pid, record.daemon_start_time) {
        kill_daemon(pid, start);
    }
    let workload = File::open(dir.join(WORKLOAD_PIN)).ok();
    let router = File::open(dir.join(ROUTER_PIN)).ok();
    if let (Some(workload), Some(router)) = (&workload, &router) {
        let rules = record.workload_rules != Some(false);
        if let Err(e) = give_back(workload, router, &record.moved, &record.down, rules) {
            tracing::warn!("egress policy: cannot give the container's interfaces back: {e}");
        }
    }
    unpin(&dir.join(ROUTER_PIN));
    unpin(&dir.join(WORKLOAD_PIN));
    let _ = std::fs::remove_file(dir.join(RECORD));
}

fn give_back(
    workload: &File,
    router: &File,
    moved: &[Interface],
    down: &[String],
    workload_rules: bool,
) -> Result<(), EgressError> {
    in_ns(router, || {
        let mut nl = Netlink::open()?;
        // Our pairs first, by their ends here, which the workload cannot
        // rename: their ends in its namespace go with them, whatever they
        // are called now.
        for link in nl.links()? {
            if link.name.starts_with(router::VETH_PREFIX) {
                nl.del_link(link.index)?;
            }
        }
        for link in nl.links()? {
            if moved.iter().any(|m| m.name == link.name) {
                nl.move_link(link.index, workload.as_raw_fd())?;
            }
        }
        Ok(())
    })?;
    in_ns(workload, || {
        // The resolver redirect.
        if workload_rules {
            let _ = crate::egress::nft::remove();
        }
        let mut nl = Netlink::open()?;
        let links = nl.links()?;
        for iface in moved.iter().filter(|i| !down.contains(&i.name)) {
            if let Some(link) = links.iter().find(|l| l.name == iface.name) {
                netlink::configure_interface(&mut nl, link, iface)?;
            }
        }
        Ok(())
    })
}

/// Ends the daemon if `pid` is still it: it ends by itself once the init
/// is gone, after writing the flows still open, so it gets a moment for
/// that before SIGKILL; then waits (briefly) for it to be gone.
fn kill_daemon(pid: i32, start: Option<u64>) {
    use nix::sys::signal::{kill, Signal};
    use nix::unistd::Pid;
    if start.is_none() || crate::state::process_start_time(pid) != start {
        return;
    }
    let grace = std::time::Instant::now() + std::time::Duration::from_secs(2);
    while !crate::state::process_gone(pid) && std::time::Instant::now() < grace {
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
    let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(5);
    while !crate::state::process_gone(pid) && std::time::Instant::now() < deadline {
        // Our own child after a failed create: reap it.
        let _ = nix::sys::wait::waitpid(
            Pid::from_raw(pid),
            Some(nix::sys::wait::WaitPidFlag::WNOHANG),
        );
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}
