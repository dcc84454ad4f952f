//! The daemon's sockets towards the outside, from the container's address.
//!
//! The namespace keeps the container's IPv4 address on its veth (its
//! source for its own traffic), so IPv4 sockets need nothing. Its IPv6
//! addresses left the veth for the sandbox (`router.rs`): the namespace
//! would otherwise solicit its neighbours from them and the answers would
//! be routed to the sandbox. The daemon's IPv6 sockets therefore bind to
//! the container's address explicitly, with `IPV6_FREEBIND` (the address
//! is not local to the namespace); their replies are delivered locally by
//! the `LOCAL_MARK` rule, as IPv4's are.

use std::io;
use std::net::{IpAddr, Ipv6Addr, SocketAddr, TcpStream, UdpSocket};
use std::os::fd::{AsRawFd, OwnedFd};
use std::sync::OnceLock;
use std::time::Duration;

use nix::sys::socket::{self as nsock, AddressFamily, SockFlag, SockType, SockaddrStorage};

/// The container's IPv6 address, the source of the daemon's IPv6 sockets
/// (`--source6`); without it they leave from whatever the namespace picks.
static SOURCE6: OnceLock<Ipv6Addr> = OnceLock::new();

/// Sets the IPv6 source once, at the daemon's start.
pub fn set_source6(addr: Ipv6Addr) {
    let _ = SOURCE6.set(addr);
}

/// A socket of `ty` for talking to `dst`, bound to `src` when `dst` is
/// IPv6 and there is one.
fn socket_for(dst: &SocketAddr, src: Option<Ipv6Addr>, ty: SockType) -> io::Result<OwnedFd> {
    let family = match dst {
        SocketAddr::V4(_) => AddressFamily::Inet,
        SocketAddr::V6(_) => AddressFamily::Inet6,
    };
    let fd = nsock::socket(family, ty, SockFlag::SOCK_CLOEXEC, None)?;
    if let (SocketAddr::V6(_), Some(src)) = (dst, src) {
        let on: libc::c_int = 1;
        // SAFETY: setsockopt reads one c_int from a live local of that size.
        let rc = unsafe {
            libc::setsockopt(
                fd.as_raw_fd(),
                libc::IPPROTO_IPV6,
                libc::IPV6_FREEBIND,
                (&on as *const libc::c_int).cast(),
                std::mem::size_of::<libc::c_int>() as libc::socklen_t,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        let at = SockaddrStorage::from(SocketAddr::new(IpAddr::V6(src), 0));
        nsock::bind(fd.as_raw_fd(), &at)?;
    }
    Ok(fd)
}

/// Connects to `dst` within `timeout`.
pub fn connect_tcp(dst: &SocketAddr, timeout: Duration) -> io::Result<TcpStream> {
    connect_tcp_from(dst, SOURCE6.get().copied(), timeout)
}

fn connect_tcp_from(
    dst: &SocketAddr,
    src: Option<Ipv6Addr>,
    timeout: Duration,
) -> io::Result<TcpStream> {
    if !matches!(dst, SocketAddr::V6(_)) || src.is_none() {
        return TcpStream::connect_timeout(dst, timeout);
    }
    let fd = socket_for(dst, src, SockType::Stream)?;
    let stream = TcpStream::from(fd);
    stream.set_nonblocking(true)?;
    match nsock::connect(stream.as_raw_fd(), &SockaddrStorage::from(*dst)) {
        Ok(()) => {}
        Err(nix::errno::Errno::EINPROGRESS) => {
            let mut p = libc::pollfd {
                fd: stream.as_raw_fd(),
                events: libc::POLLOUT,
                revents: 0,
            };
            let ms = i32::try_from(timeout.as_millis()).unwrap_or(i32::MAX);
            // SAFETY: one valid pollfd, for the duration of the call.
            let rc = unsafe { libc::poll(&mut p, 1, ms) };
            if rc < 0 {
                return Err(io::Error::last_os_error());
            }
            if rc == 0 {
                return Err(io::Error::from(io::ErrorKind::TimedOut));
            }
            if let Some(e) = stream.take_error()? {
                return Err(e);
            }
        }
        Err(e) => return Err(e.into()),
    }
    stream.set_nonblocking(false)?;
    Ok(stream)
}

/// A UDP socket connected to `dst`.
pub fn connect_udp(dst: &SocketAddr) -> io::Result<UdpSocket> {
    connect_udp_from(dst, SOURCE6.get().copied())
}

fn connect_udp_from(dst: &SocketAddr, src: Option<Ipv6Addr>) -> io::Result<UdpSocket> {
    let sock = if matches!(dst, SocketAddr::V6(_)) && src.is_some() {
        UdpSocket::from(socket_for(dst, src, SockType::Datagram)?)
    } else {
        let any: SocketAddr = match dst {
            SocketAddr::V4(_) => ([0, 0, 0, 0], 0).into(),
            SocketAddr::V6(_) => (Ipv6Addr::UNSPECIFIED, 0).into(),
        };
        UdpSocket::bind(any)?
    };
    sock.connect(dst)?;
    Ok(sock)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Write};

    #[test]
    fn connects_over_both_families_within_the_timeout() {
        let l4 = std::net::TcpListener::bind("127.0.0.1:0").expect("bind v4");
        let a4 = l4.local_addr().expect("addr");
        let mut s = connect_tcp(&a4, Duration::from_secs(5)).expect("connect v4");
        s.write_all(b"x").expect("write");
        let (mut c, _) = l4.accept().expect("accept");
        let mut b = [0u8; 1];
        c.read_exact(&mut b).expect("read");
        assert_eq!(&b, b"x");
        let u = std::net::UdpSocket::bind("127.0.0.1:0").expect("udp");
        let cu = connect_udp(&u.local_addr().expect("addr")).expect("connect udp");
        cu.send(b"q").expect("send");
        let mut buf = [0u8; 4];
        assert_eq!(u.recv(&mut buf).expect("recv"), 1);
    }

    /// An IPv6 socket leaves from the address it is given, even one that
    /// is not local (`IPV6_FREEBIND`): here, on loopback, what the
    /// listener sees is that address.
    #[test]
    fn ipv6_sockets_leave_from_the_given_address() {
        let Ok(l) = std::net::TcpListener::bind("[::1]:0") else {
            eprintln!("skipped: no IPv6 loopback here");
            return;
        };
        let at = l.local_addr().expect("addr");
        let src: Ipv6Addr = "::1".parse().expect("addr");
        let _s = connect_tcp_from(&at, Some(src), Duration::from_secs(5)).expect("connect");
        let (_c, peer) = l.accept().expect("accept");
        assert_eq!(peer.ip(), IpAddr::V6(src));
        let u = std::net::UdpSocket::bind("[::1]:0").expect("udp");
        let cu = connect_udp_from(&u.local_addr().expect("addr"), Some(src)).expect("udp");
        cu.send(b"q").expect("send");
        let mut buf = [0u8; 4];
        let (_, from) = u.recv_from(&mut buf).expect("recv");
        assert_eq!(from.ip(), IpAddr::V6(src));
        // Nothing listens on port 1: refused, not a hang.
        let closed = SocketAddr::new(IpAddr::V6(src), 1);
        assert!(connect_tcp_from(&closed, Some(src), Duration::from_secs(5)).is_err());
    }
}
