//! The egress daemon: one process per sandbox that has a policy, in the
//! container's network namespace, started before the workload can send a
//! packet. It is where the policy's user-space parts run:
//! - the resolver (names: `resolver.rs`), on the service address's UDP/53;
//! - the transparent TCP proxy (`proxy.rs`), on the service address's
//!   [`proxy::PROXY_PORT`];
//! - the reader of what nftables logs of other traffic (`nflog.rs`);
//!
//! and all of them write the audit trail (`trail.rs`). The rules in
//! nftables send the sandbox's traffic here; the daemon adds to them only
//! the addresses of UDP rules' names.
//!
//! The daemon gets its listening sockets from its parent, bound already
//! (descriptors [`DNS_FD`] and [`PROXY_FD`]); if any part of it stops, the
//! daemon exits, and the policy's rules — which send everything to it —
//! keep denying.

use std::net::{IpAddr, SocketAddr, TcpListener, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::PathBuf;
use std::sync::Arc;

use super::proxy::{Proxy, Resolved};
use super::resolver::{AddElements, Shared, SocketPool, Upstream};
use super::trail::Trail;
use super::{Policy, PolicyError};

/// The resolver's UDP socket, when the policy has names.
pub const DNS_FD: i32 = 3;
/// The proxy's TCP listener.
pub const PROXY_FD: i32 = 4;
/// A pidfd of the process whose life the daemon's is, or the read end of
/// a pipe its parent closes to end it (`--watch`).
pub const WATCH_FD: i32 = 5;
/// The workload namespace's resolver socket (`--workload-dns`), followed
/// by [`POOL_SIZE`] sockets connected to the resolver there.
pub const WORKLOAD_DNS_FD: i32 = 6;
/// Queries to the workload namespace's resolver at once.
pub const POOL_SIZE: i32 = 8;
/// The proxy's IPv6 listener (`--proxy6`) and the resolver's IPv6 socket
/// (`--dns6`), on the service address's IPv6 twin.
pub const PROXY6_FD: i32 = WORKLOAD_DNS_FD + 1 + POOL_SIZE;
pub const DNS6_FD: i32 = PROXY6_FD + 1;
/// Packet sockets on the sandbox's interfaces with IPv6, one per `--ndp`,
/// on which the daemon answers neighbour solicitations (container tier).
pub const NDP_FD: i32 = DNS6_FD + 1;
pub const MAX_NDP: i32 = 8;
/// The first descriptor the daemon does not inherit.
pub const FIRST_UNUSED_FD: i32 = NDP_FD + MAX_NDP;

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("egress daemon: {0}")]
    Policy(#[from] PolicyError),
    #[error("egress daemon: {0}")]
    Log(#[from] super::nflog::NflogError),
    #[error("egress daemon: {0}")]
    Resolver(#[from] super::resolver::ResolverError),
    #[error("egress daemon: the proxy stopped: {0}")]
    Proxy(std::io::Error),
    #[error("egress daemon: {0}")]
    Jail(#[from] crate::jail::JailError),
    #[error("egress daemon: {0}")]
    Flows(#[from] super::conntrack::ConntrackError),
    #[error("egress daemon: cannot start a thread: {0}")]
    Thread(std::io::Error),
}

pub struct Options {
    pub policy: Policy,
    pub id: String,
    pub audit: Option<PathBuf>,
    /// The container's own resolver, for allowed names.
    pub upstream: Option<SocketAddr>,
    pub dns: Option<UdpSocket>,
    pub proxy: TcpListener,
    /// The IPv6 twins of `proxy` and `dns`.
    pub proxy6: Option<TcpListener>,
    pub dns6: Option<UdpSocket>,
    /// Neighbour answers to serve on the sandbox's interfaces.
    pub ndp: Vec<crate::ndp::NdpProxy>,
    /// The namespace's service addresses (never a destination).
    pub own: Vec<IpAddr>,
    pub add: AddElements,
    /// The daemon ends, without an error, when this descriptor becomes
    /// readable: a pidfd whose process exited, or a pipe whose writer
    /// closed it (the supervisor's way of saying "end now").
    pub watch: Option<OwnedFd>,
    /// Not tied to its parent's life (the container tier's, which
    /// outlives `create`): no parent-death signal.
    pub detached: bool,
    /// A second resolver, in the container tier's workload namespace, for
    /// the queries to a resolver on its loopback (Docker's embedded DNS),
    /// which it reaches through the pool's sockets.
    pub workload_dns: Option<(UdpSocket, Arc<SocketPool>)>,
}

/// Runs until a part stops (which is an error: they serve forever).
pub fn run(opts: Options) -> Result<(), DaemonError> {
    let rules = Arc::new(match &opts.policy {
        Policy::List(r) => r.clone(),
        _ => Vec::new(),
    });
    let trail = Arc::new(Trail::open(opts.audit.as_deref(), &opts.id));
    let resolved = Arc::new(Resolved::default());
    // Bind the log group before anything is served, so the first denial
    // is seen.
    let log = super::nflog::open()?;
    // The ends of the flows UDP rules allow, each with its bytes.
    let flows = if rules.iter().any(|r| r.proto == super::Proto::Udp) {
        Some(Arc::new(super::conntrack::open()?))
    } else {
        None
    };
    // Everything it opens with privilege is open: jail it.
    super::jail::enter(
        rules.iter().any(super::resolver::has_sets),
        flows.is_some(),
        !opts.detached,
    )?;
    let (done_tx, done_rx) = std::sync::mpsc::channel::<Option<DaemonError>>();
    if let Some(flows) = flows.clone() {
        let (rules, trail, done) = (rules.clone(), trail.clone(), done_tx.clone());
        std::thread::Builder::new()
            .name("egress-flows".into())
            .spawn(move || {
                if let Err(e) = super::conntrack::serve(&flows, &rules, &trail) {
                    let _ = done.send(Some(e.into()));
                }
            })
            .map_err(DaemonError::Thread)?;
    }
    if let Some(pidfd) = opts.watch {
        let done = done_tx.clone();
        std::thread::Builder::new()
            .name("egress-watch".into())
            .spawn(move || {
                wait_readable(&pidfd);
                let _ = done.send(None);
            })
            .map_err(DaemonError::Thread)?;
    }

    {
        let (trail, done) = (trail.clone(), done_tx.clone());
        std::thread::Builder::new()
            .name("egress-log".into())
            .spawn(move || {
                if let Err(e) = super::nflog::serve(log, &trail) {
                    let _ = done.send(Some(e.into()));
                }
            })
            .map_err(DaemonError::Thread)?;
    }
    for n in opts.ndp {
        n.spawn();
    }
    let has_dns = opts.dns.is_some();
    let resolvers = [
        opts.dns
            .map(|d| (d, opts.upstream.map(Upstream::At), "egress-dns")),
        opts.dns6
            .map(|d| (d, opts.upstream.map(Upstream::At), "egress-dns6")),
        opts.workload_dns
            .map(|(d, pool)| (d, Some(Upstream::Pool(pool)), "egress-dns-in")),
    ];
    for (dns, upstream, name) in resolvers.into_iter().flatten() {
        let shared = Shared {
            rules: rules.clone(),
            resolved: resolved.clone(),
            trail: trail.clone(),
            add: opts.add.clone(),
        };
        let done = done_tx.clone();
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(e) = super::resolver::serve(shared, dns, upstream) {
                    let _ = done.send(Some(e.into()));
                }
            })
            .map_err(DaemonError::Thread)?;
    }
    let dns_over_tcp = has_dns.then(|| {
        (
            Shared {
                rules: rules.clone(),
                resolved: resolved.clone(),
                trail: trail.clone(),
                add: opts.add.clone(),
            },
            opts.upstream,
        )
    });
    let proxy = Arc::new(Proxy {
        rules: rules.clone(),
        resolved,
        trail: trail.clone(),
        own: opts.own,
        dns: dns_over_tcp,
        active: Default::default(),
    });
    for (listener, name) in [
        (Some(opts.proxy), "egress-proxy"),
        (opts.proxy6, "egress-proxy6"),
    ] {
        let Some(listener) = listener else { continue };
        let (proxy, done) = (proxy.clone(), done_tx.clone());
        std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                if let Err(e) = proxy.serve(listener) {
                    let _ = done.send(Some(DaemonError::Proxy(e)));
                }
            })
            .map_err(DaemonError::Thread)?;
    }
    drop(done_tx);
    match done_rx.recv() {
        Ok(Some(e)) => Err(e),
        // Told to end: the flows still open are written first.
        Ok(None) => {
            if let Some(flows) = &flows {
                super::conntrack::flush(flows, &rules, &trail);
            }
            Ok(())
        }
        // Every sender gone without a word: cannot happen while the proxy
        // thread lives, as it holds one.
        Err(_) => Ok(()),
    }
}

/// Blocks until `fd` is readable (a pidfd: its process exited; a pipe:
/// its writer closed it).
fn wait_readable(fd: &OwnedFd) {
    let mut p = libc::pollfd {
        fd: fd.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    loop {
        // SAFETY: one valid pollfd, for the duration of the call.
        let rc = unsafe { libc::poll(&mut p, 1, -1) };
        if rc > 0 || (rc < 0 && std::io::Error::last_os_error().raw_os_error() != Some(libc::EINTR))
        {
            return;
        }
    }
}
