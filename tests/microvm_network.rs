//! The microVM's NIC in a network namespace that outlives the container, as
//! CNI plugins and `ip netns` leave it: the test builds one (a veth pair
//! between a "host" namespace and the container's, both its own, on a
//! private /24) and runs containers in it with agentvm's command line.
//!
//! It checks what the guest gets and what it can do, then attacks the
//! plumbing from inside the guest as root with CAP_NET_ADMIN and CAP_NET_RAW:
//! another source address, another MAC, a second address taken from the
//! subnet. Each attempt must stay cut off from the peer. Afterwards the
//! namespace is as it was before the container: the address is local again,
//! no proxy entry, no tap.
//!
//! Needs root, `ip` and what the microvm tier needs; else `skipped: <why>`.

use agentvm_test_support as common;
use common::require;

use std::path::PathBuf;
use std::process::Command;

use common::bundle::{assert_nothing_left, Fixture};

const PEER: &str = "10.231.0.1";
const GUEST: &str = "10.231.0.2";

/// Two namespaces joined by a veth pair; both removed on drop.
struct Netns {
    peer: String,
    container: String,
}

fn ip(args: &[&str]) {
    let out = Command::new("ip").args(args).output().expect("run ip");
    assert!(
        out.status.success(),
        "ip {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

fn ip_out(args: &[&str]) -> String {
    let out = Command::new("ip").args(args).output().expect("run ip");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

impl Netns {
    fn new(tag: &str) -> Netns {
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

    fn path(&self) -> PathBuf {
        PathBuf::from("/var/run/netns").join(&self.container)
    }

    /// What the container's namespace looks like, for before/after: its
    /// link names, IPv4 routes of every table and proxy neighbours (link
    /// state and IPv6 autoconfiguration change by themselves).
    fn snapshot(&self) -> String {
        let links: Vec<String> = ip_out(&["-n", &self.container, "-o", "link", "show"])
            .lines()
            .filter_map(|l| l.split(':').nth(1).map(|n| n.trim().to_string()))
            .collect();
        format!(
            "links {links:?}\n{}{}",
            ip_out(&["-n", &self.container, "-4", "route", "show", "table", "all"]),
            ip_out(&["-n", &self.container, "neigh", "show", "proxy"])
        )
    }

    /// Runs `cmd` in the peer namespace.
    fn in_peer(&self, cmd: &[&str]) -> std::process::Output {
        Command::new("ip")
            .args(["netns", "exec", &self.peer])
            .args(cmd)
            .output()
            .expect("ip netns exec")
    }
}

/// How many ICMP echo requests the peer namespace has received.
fn peer_echoes(ns: &Netns) -> u64 {
    let out = ns.in_peer(&["cat", "/proc/net/snmp"]);
    let text = String::from_utf8_lossy(&out.stdout);
    let mut icmp = text.lines().filter(|l| l.starts_with("Icmp:"));
    let (Some(names), Some(values)) = (icmp.next(), icmp.next()) else {
        panic!("no Icmp lines in the peer's /proc/net/snmp:\n{text}");
    };
    names
        .split_whitespace()
        .zip(values.split_whitespace())
        .find(|(n, _)| *n == "InEchos")
        .and_then(|(_, v)| v.parse().ok())
        .expect("InEchos")
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

fn microvm_in() -> Result<Fixture, String> {
    if let Some(why) = common::host_unsuitable(&["ip"]) {
        return Err(why);
    }
    if let Some(why) = common::guest::unavailable() {
        return Err(why);
    }
    let kernel = common::guest::kernel()?;
    let mut f = Fixture::with_flags(&["--isolation=microvm"]);
    let config = f.dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n",
            kernel.display().to_string(),
            common::guest::VIRTIOFSD
        ),
    )
    .expect("write config.toml");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    Ok(f)
}

/// A bundle running `script` as root with the network capabilities, in the
/// namespace `ns`.
fn write_script(f: &Fixture, ns: &Netns, script: &str) {
    let path = ns.path();
    f.write_config(&["sh", "-c", script], |c| {
        for ns in c["linux"]["namespaces"]
            .as_array_mut()
            .expect("namespaces")
            .iter_mut()
        {
            if ns["type"] == "network" {
                ns["path"] = serde_json::json!(path);
            }
        }
        let caps = serde_json::json!(["CAP_NET_ADMIN", "CAP_NET_RAW", "CAP_NET_BIND_SERVICE"]);
        c["process"]["capabilities"] = serde_json::json!({
            "bounding": caps, "effective": caps, "permitted": caps
        });
        c["mounts"].as_array_mut().expect("mounts").extend([
            serde_json::json!({
                "destination": "/sys", "type": "sysfs", "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"]
            }),
            serde_json::json!({
                "destination": "/www", "type": "tmpfs", "source": "tmpfs",
                "options": ["nosuid", "nodev", "size=1m"]
            }),
        ]);
    });
}

fn bundle_arg(f: &Fixture) -> String {
    f.bundle().to_str().expect("utf-8").to_string()
}

#[test]
fn the_guest_owns_the_address_and_gives_it_back() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("own");
    let before = ns.snapshot();
    write_script(
        &f,
        &ns,
        "ip -4 -o addr show eth0; cat /sys/class/net/eth0/mtu /sys/class/net/eth0/address; \
         ip route; ping -c 1 -W 5 10.231.0.1 >/dev/null && echo ping-ok",
    );
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), "mvn-own"]);
    assert_eq!(out.code, 0, "{out}");
    let ns_mac = ip_out(&["-n", &ns.container, "-o", "link", "show", "eth0"]);
    assert!(out.stdout.contains(&format!("inet {GUEST}/24")), "{out}");
    assert!(out.stdout.contains("\n1450\n"), "MTU: {out}");
    let guest_mac = out.stdout.lines().nth(2).unwrap_or_default().to_string();
    assert!(
        ns_mac.contains(&guest_mac),
        "the guest's MAC {guest_mac} is the namespace interface's: {ns_mac}"
    );
    assert!(
        out.stdout.contains(&format!("default via {PEER} dev eth0")),
        "{out}"
    );
    assert!(out.stdout.contains("ping-ok"), "{out}");
    assert_nothing_left(&f, "mvn-own");
    assert_eq!(ns.snapshot(), before, "the namespace is as it was");
}

#[test]
fn the_peer_reaches_a_server_in_the_guest() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("srv");
    write_script(
        &f,
        &ns,
        "echo served-by-the-guest > /www/index.html && httpd -p 80 -h /www && \
         echo up && sleep 600",
    );
    let out = f.agentvm(&["run", "--detach", "--bundle", &bundle_arg(&f), "mvn-srv"]);
    assert_eq!(out.code, 0, "{out}");
    let url = format!("http://{GUEST}/index.html");
    let got = common::wait_for(60, || {
        let o = ns.in_peer(&["busybox", "wget", "-q", "-O", "-", &url]);
        (o.status.success()).then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    });
    assert_eq!(got.as_deref(), Some("served-by-the-guest\n"));
    f.agentvm(&["delete", "--force", "mvn-srv"]);
    assert_nothing_left(&f, "mvn-srv");
}

/// Root in the guest tries to leave its address: each attempt is cut off
/// from the peer — nothing it sends from another address arrives there —
/// while the real address keeps working afterwards.
#[test]
fn the_guest_cannot_use_another_address_or_mac() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("spoof");
    let echoes_before = peer_echoes(&ns);
    let script = "\
        p() { ping -c 1 -W 3 \"$@\" 10.231.0.1 >/dev/null 2>&1 && echo reached || echo cut-off; }; \
        echo \"own $(p)\"; \
        ip addr add 10.231.0.77/24 dev eth0; echo \"second-address $(p -I 10.231.0.77)\"; \
        ip addr del 10.231.0.77/24 dev eth0; \
        ip addr del 10.231.0.2/24 dev eth0; ip addr add 10.231.0.66/24 dev eth0; \
        ip route add default via 10.231.0.1; echo \"changed-address $(p)\"; \
        ip addr del 10.231.0.66/24 dev eth0; ip addr add 10.231.0.2/24 dev eth0; \
        ip route add default via 10.231.0.1; \
        ip link set eth0 down; ip link set eth0 address 02:00:00:00:00:99; ip link set eth0 up; \
        ip route add default via 10.231.0.1; echo \"changed-mac $(p)\"";
    write_script(&f, &ns, script);
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), "mvn-spoof"]);
    assert_eq!(out.code, 0, "{out}");
    let said = |what: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{what} ")))
            .unwrap_or("missing")
            .to_string()
    };
    assert_eq!(said("own"), "reached", "{out}");
    assert_eq!(said("second-address"), "cut-off", "{out}");
    assert_eq!(said("changed-address"), "cut-off", "{out}");
    assert_eq!(said("changed-mac"), "cut-off", "{out}");
    // The two changed-MAC pings leave from the guest's own address and
    // may arrive (their replies cannot come back); the spoofed ones must not.
    let echoes = peer_echoes(&ns) - echoes_before;
    assert!(
        (1..=2).contains(&echoes),
        "the peer got {echoes} echo requests: only the guest's own address may reach it"
    );
    assert_nothing_left(&f, "mvn-spoof");
}
