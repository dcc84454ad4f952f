//! Network namespaces for the network tests: a "peer" and a "container"
//! namespace joined by a veth pair on a private /24 (as CNI or `ip netns`
//! leave a container's), the peer serving HTTP with busybox. Nothing
//! outside the two namespaces is touched; both go on drop.

use std::path::PathBuf;
use std::process::Command;

/// The peer's address, the container namespace's gateway.
pub const PEER: &str = "10.231.0.1";
/// The container namespace's address (the guest's, once it owns it).
pub const GUEST: &str = "10.231.0.2";
/// The same two on IPv6 (see [`Netns::add_ipv6`]).
pub const PEER6: &str = "fd00:231::1";
pub const GUEST6: &str = "fd00:231::2";

/// Runs `ip ARGS`; a failure fails the test.
pub fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// What `ip ARGS` prints.
pub fn ip_out(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Two namespaces joined by a veth pair; both removed on drop.
pub struct Netns {
    pub peer: String,
    pub container: String,
}

impl Netns {
    pub fn new(tag: &str) -> Netns {
        let n = Netns {
            peer: format!("avp-{tag}-{}", std::process::id()),
            container: format!("avc-{tag}-{}", std::process::id()),
        };
        ip(&["netns", "add", &n.peer]);
        ip(&["netns", "add", &n.container]);
        ip(&[
            "-n",
            &n.peer,
            "link",
            "add",
            "veth0",
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &n.container,
        ]);
        ip(&[
            "-n",
            &n.peer,
            "addr",
            "add",
            &format!("{PEER}/24"),
            "dev",
            "veth0",
        ]);
        ip(&["-n", &n.peer, "link", "set", "veth0", "up"]);
        ip(&["-n", &n.peer, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &n.container,
            "addr",
            "add",
            &format!("{GUEST}/24"),
            "dev",
            "eth0",
        ]);
        ip(&[
            "-n",
            &n.container,
            "link",
            "set",
            "eth0",
            "mtu",
            "1450",
            "up",
        ]);
        ip(&["-n", &n.container, "route", "add", "default", "via", PEER]);
        n
    }

    /// Adds IPv6 as a dual-stack Docker network has it: [`PEER6`] on the
    /// peer, [`GUEST6`]/64 on the container's side, a default route via
    /// the peer. Addresses without duplicate address detection, as Docker
    /// adds them.
    pub fn add_ipv6(&self) {
        ip(&[
            "-n",
            &self.peer,
            "addr",
            "add",
            &format!("{PEER6}/64"),
            "dev",
            "veth0",
            "nodad",
        ]);
        ip(&[
            "-n",
            &self.container,
            "addr",
            "add",
            &format!("{GUEST6}/64"),
            "dev",
            "eth0",
            "nodad",
        ]);
        ip(&[
            "-n",
            &self.container,
            "-6",
            "route",
            "add",
            "default",
            "via",
            PEER6,
        ]);
    }

    /// [`Netns::snapshot`] with the IPv6 addresses and routes too.
    pub fn snapshot6(&self) -> String {
        format!(
            "{}{}{}",
            self.snapshot(),
            ip_out(&[
                "-n",
                &self.container,
                "-6",
                "-o",
                "addr",
                "show",
                "scope",
                "global"
            ])
            .lines()
            .map(|l| l.split("valid_lft").next().unwrap_or(l).trim().to_string() + "\n")
            .collect::<String>(),
            ip_out(&["-n", &self.container, "-6", "route", "show"])
        )
    }

    pub fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.container)
    }

    /// What the container's namespace looks like, for before/after: its
    /// link names, IPv4 routes of every table and proxy neighbours (link
    /// state and IPv6 autoconfiguration change by themselves).
    pub fn snapshot(&self) -> String {
        let links: Vec<String> = ip_out(&["-n", &self.container, "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_string()))
            .collect();
        format!(
            "links {links:?}\n{}{}{}",
            ip_out(&["-n", &self.container, "-4", "route", "show", "table", "all"]),
            ip_out(&["-n", &self.container, "neigh", "show", "proxy"]),
            ip_out(&["-n", &self.container, "-4", "rule", "show"])
        )
    }

    /// The nft tables of the container's namespace, one per line.
    pub fn nft_tables(&self) -> String {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.container, "nft", "list", "tables"])
            .output()
            .expect("nft");
        String::from_utf8_lossy(&out.stdout).trim().to_string()
    }

    /// Runs `cmd` in the peer namespace.
    /// A prestart hook that does what Docker's `libnetwork-setkey` does,
    /// and is called by its name (`args[0]`): moves this namespace pair's
    /// `eth0` into the container's network namespace (of the pid in the
    /// state on its stdin) and configures it there as [`Netns::new`] did;
    /// with `second`, also gives the container a second veth (`eth1`,
    /// 10.232.0.2/24, its peer 10.232.0.1); with `fail`, fails after that.
    /// The script is written in `dir`.
    pub fn docker_like_hook(
        &self,
        dir: &std::path::Path,
        second: bool,
        fail: bool,
    ) -> serde_json::Value {
        let path = dir.join(format!("setkey-{}.sh", self.container));
        let mut script = format!(
            "#!/bin/sh\nset -e\nPATH=/usr/sbin:/usr/bin:/sbin:/bin\n\
             pid=$(sed -n 's/.*\"pid\": *\\([0-9]*\\).*/\\1/p')\n\
             ip -n {c} link set eth0 netns \"$pid\"\n\
             nsenter -t \"$pid\" -n ip addr add {GUEST}/24 dev eth0\n\
             nsenter -t \"$pid\" -n ip link set eth0 mtu 1450 up\n\
             nsenter -t \"$pid\" -n ip route add default via {PEER}\n",
            c = self.container
        );
        if second {
            script.push_str(&format!(
                "ip -n {p} link add veth1 type veth peer name eth1 netns \"$pid\"\n\
                 ip -n {p} addr add 10.232.0.1/24 dev veth1\n\
                 ip -n {p} link set veth1 up\n\
                 nsenter -t \"$pid\" -n ip addr add 10.232.0.2/24 dev eth1\n\
                 nsenter -t \"$pid\" -n ip link set eth1 up\n",
                p = self.peer
            ));
        }
        if fail {
            script.push_str("echo 'no network for you' >&2\nexit 3\n");
        }
        std::fs::write(&path, script).expect("write hook");
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .expect("chmod hook");
        serde_json::json!({
            "path": path,
            "args": ["libnetwork-setkey", "-exec-root=/nonexistent", "test"]
        })
    }

    pub fn in_peer(&self, cmd: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.peer])
            .args(cmd)
            .output()
            .expect("ip netns exec")
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip")
            .args(["netns", "del", &self.container])
            .status();
        let _ = Command::new("ip")
            .args(["netns", "del", &self.peer])
            .status();
    }
}

/// busybox httpd in the peer namespace on `port`, serving `body`; killed on
/// drop.
pub struct PeerServer {
    child: std::process::Child,
    _root: tempfile::TempDir,
}

impl PeerServer {
    pub fn start(ns: &Netns, port: u16, body: &str) -> PeerServer {
        PeerServer::start_on(ns, &format!("{PEER}:{port}"), body)
    }

    /// Listening on `listen` (`[ADDR:]PORT`, busybox httpd's `-p`).
    pub fn start_on(ns: &Netns, listen: &str, body: &str) -> PeerServer {
        let dir = tempfile::tempdir().expect("tempdir");
        std::fs::write(dir.path().join("index.html"), body).expect("index.html");
        let child = Command::new("ip")
            .args(["netns", "exec", &ns.peer, "busybox", "httpd", "-f"])
            .arg("-p")
            .arg(listen)
            .arg("-h")
            .arg(dir.path())
            .spawn()
            .expect("start httpd in the peer namespace");
        PeerServer { child, _root: dir }
    }
}

impl Drop for PeerServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
