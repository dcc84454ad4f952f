//! A sandbox's network in a namespace that outlives the container, as CNI
//! plugins and `ip netns` leave it: the test builds one (a veth pair
//! between a "host" namespace and the container's, both its own, on a
//! private /24) and runs containers in it with agentvm's command line.
//!
//! It checks what a microVM gets and what it can do, then attacks the
//! plumbing from inside the sandbox as root with CAP_NET_ADMIN and
//! CAP_NET_RAW: another source address, another MAC, a second address
//! taken from the subnet. Each attempt must stay cut off from the peer.
//! The egress policy is attacked the same way in both tiers: the container
//! tier's workload sits behind a router namespace of agentvm's, the
//! microVM behind its tap, and each attempt around the rules, the resolver
//! or the proxy fails and is audited. Afterwards the namespace is as it
//! was before the container: the address is local again, the interfaces
//! are Docker's or CNI's again, no proxy entry, no tap, no rules.
//!
//! Needs root, `ip`, `nft` and, for the microVM column, what the microvm
//! tier needs; a tier that cannot run says `skipped: <why>`.

use agentvm_test_support as common;
use common::require;

use std::process::Command;

use common::bundle::{assert_nothing_left, Fixture};

use common::netns::{ip, ip_out, Netns, PeerServer, GUEST, GUEST6, PEER, PEER6};

/// What a script's `echo "WHAT RESULT"` line said for WHAT.
fn said(out: &common::cmd::Output, what: &str) -> String {
    out.stdout
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{what} ")))
        .unwrap_or("missing")
        .to_string()
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
            "[microvm]\nkernel = {:?}\nvirtiofsd = {:?}\n{}[audit]\npath = {:?}\n",
            kernel.display().to_string(),
            common::guest::VIRTIOFSD,
            common::guest::vmm_config_line(),
            f.dir.path().join("audit.jsonl").display().to_string(),
        ),
    )
    .expect("write config.toml");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    Ok(f)
}

/// Adds `mounts` to the fixture's bundle.
fn add_mounts<const N: usize>(f: &Fixture, mounts: [serde_json::Value; N]) {
    f.edit_config(|c| c["mounts"].as_array_mut().expect("mounts").extend(mounts));
}

/// The container tier, writing its audit trail in the fixture.
fn container_in() -> Result<Fixture, String> {
    if let Some(why) = common::host_unsuitable(&["ip", "nft"]) {
        return Err(why);
    }
    let mut f = Fixture::with_flags(&["--isolation=container"]);
    let config = f.dir.path().join("config.toml");
    std::fs::write(
        &config,
        format!(
            "[audit]\npath = {:?}\n",
            f.dir.path().join("audit.jsonl").display().to_string(),
        ),
    )
    .expect("write config.toml");
    f.add_flags(&["--config", config.to_str().expect("utf-8")]);
    Ok(f)
}

/// Each tier under the egress policy, with a prefix for its containers'
/// ids; a tier that cannot run here says `skipped: <why>`.
fn each_tier(mut check: impl FnMut(&str, &Fixture)) {
    for (prefix, fixture) in [("ct", container_in()), ("mvn", microvm_in())] {
        match fixture {
            Ok(f) => {
                eprintln!("-- {prefix}");
                check(prefix, &f);
            }
            Err(why) => eprintln!("skipped: {prefix}: {why}"),
        }
    }
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
    // The builtin VMM counts the NIC's traffic, reported as runc's
    // network_interfaces under the guest's name; QEMU's are not read.
    let events = f.agentvm(&["events", "--stats", "mvn-srv"]);
    assert_eq!(events.code, 0, "{events}");
    let event: serde_json::Value = serde_json::from_str(events.out()).expect("event JSON");
    let nics = &event["data"]["network_interfaces"];
    if common::guest::builtin() {
        let nic = &nics[0];
        assert_eq!(nic["name"], "eth0", "{events}");
        for k in ["rx_packets", "tx_packets", "rx_bytes", "tx_bytes"] {
            assert!(nic[k].as_u64().unwrap_or(0) > 0, "{k}: {events}");
        }
    } else {
        assert!(nics.is_null(), "{events}");
    }
    f.agentvm(&["delete", "--force", "mvn-srv"]);
    assert_nothing_left(&f, "mvn-srv");
}

/// A dual-stack namespace: the guest owns the IPv6 address too, with the
/// routes the namespace had, reaches the peer over IPv6 and is reached by
/// it, and the namespace gets its address back.
#[test]
fn ipv6_is_routed_to_the_guest_and_given_back() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("v6");
    ns.add_ipv6();
    let before = ns.snapshot6();
    let _a = PeerServer::start_on(&ns, "[::]:8000", "over-six");
    write_script(
        &f,
        &ns,
        &"ip -6 -o addr show dev eth0 scope global; ip -6 route; \
          ping6 -c 1 -W 5 PEER6 >/dev/null && echo 'ping6 ok' || echo 'ping6 refused'; \
          timeout -s KILL 10 wget -q -O - 'http://[PEER6]:8000/' && echo || echo 'wget6 refused'; \
          echo served-over-six > /www/index.html; httpd -p [::]:80 -h /www; echo up; sleep 600"
            .replace("PEER6", PEER6),
    );
    let id = "mvn-v6";
    let out = f.agentvm(&["run", "--detach", "--bundle", &bundle_arg(&f), id]);
    assert_eq!(out.code, 0, "{out}");
    let url = format!("http://[{GUEST6}]/index.html");
    let got = common::wait_for(60, || {
        let o = ns.in_peer(&["busybox", "wget", "-q", "-O", "-", &url]);
        (o.status.success()).then(|| String::from_utf8_lossy(&o.stdout).into_owned())
    });
    assert_eq!(
        got.as_deref(),
        Some("served-over-six\n"),
        "the peer reaches the guest"
    );
    f.agentvm(&["delete", "--force", id]).ok();
    assert_nothing_left(&f, id);
    assert_eq!(ns.snapshot6(), before, "the namespace is as it was");

    // What the guest saw, in the foreground this time.
    write_script(
        &f,
        &ns,
        &"ip -6 -o addr show dev eth0 scope global; ip -6 route; \
          ping6 -c 1 -W 5 PEER6 >/dev/null && echo 'ping6 ok' || echo 'ping6 refused'; \
          timeout -s KILL 10 wget -q -O /dev/null 'http://[PEER6]:8000/' \
            && echo 'wget6 ok' || echo 'wget6 refused'"
            .replace("PEER6", PEER6),
    );
    let out = f.agentvm(&["run", "--bundle", &bundle_arg(&f), "mvn-v6-fg"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(out.stdout.contains(&format!("inet6 {GUEST6}/64")), "{out}");
    assert!(
        out.stdout
            .contains(&format!("default via {PEER6} dev eth0")),
        "{out}"
    );
    assert_eq!(said(&out, "ping6"), "ok", "{out}");
    assert_eq!(said(&out, "wget6"), "ok", "{out}");
    assert_eq!(ns.snapshot6(), before, "the namespace is as it was");
}

/// IPv6 under a policy, in both tiers, is judged as IPv4 is: an allowed
/// address and port is reached through the proxy (from the container's own
/// address), a name through its AAAA answer, whichever IPv6 server the
/// workload asks; another port, ICMPv6 out, a denied name, a moved source
/// address and a link-local source are refused (and audited); and the namespace is as it was
/// afterwards.
#[test]
fn ipv6_under_a_policy_is_judged_as_ipv4_is() {
    if common::bundle::skip_unless_root() {
        return;
    }
    each_tier(|tier, f| {
        let ns = Netns::new(&format!("{tier}v6p"));
        ns.add_ipv6();
        let before = ns.snapshot6();
        let _dns = require!(PeerDns::start_with(
            &ns,
            &[("allowed6.test", PEER6), ("denied6.test", PEER6)],
            &[PEER, PEER6],
        ));
        let _a = PeerServer::start_on(&ns, "[::]:8000", "a6");
        let _b = PeerServer::start_on(&ns, "[::]:8001", "b6");
        write_script(
            f,
            &ns,
            &"t() { timeout -s KILL 10 wget -q -O /dev/null \"$2\" && echo \"$1 ok\" || echo \"$1 refused\"; }; \
              t addr6 'http://[PEER6]:8000/'; \
              t port6 'http://[PEER6]:8001/'; \
              t name6 http://allowed6.test:8000/; \
              t denied-name6 http://denied6.test:8000/; \
              ping6 -c 1 -W 3 PEER6 >/dev/null 2>&1 && echo 'ping6 ok' || echo 'ping6 refused'; \
              ping6 -c 1 -W 2 -I eth0 PEER_LL >/dev/null 2>&1 && echo 'link-local ok' || echo 'link-local refused'; \
              nslookup -type=aaaa allowed6.test PEER6 >/dev/null 2>&1 && echo 'lookup6 ok' || echo 'lookup6 refused'; \
              nslookup -type=aaaa denied6.test PEER6 >/dev/null 2>&1 && echo 'denied-lookup6 ok' || echo 'denied-lookup6 refused'; \
              ip -6 addr add fd00:231::99/64 dev eth0; \
              for i in $(seq 50); do ip -6 addr show dev eth0 | grep -q tentative || break; sleep 0.2; done; \
              ip -6 addr del GUEST6/64 dev eth0; \
              t moved6 'http://[PEER6]:8000/'; \
              ip -6 addr del fd00:231::99/64 dev eth0; \
              t link-local-source 'http://[PEER6]:8000/'"
                .replace("PEER6", PEER6)
                .replace("GUEST6", GUEST6)
                .replace("PEER_LL", &peer_link_local(&ns)),
        );
        let resolv = f.dir.path().join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {PEER}\n")).expect("resolv.conf");
        // After the script: writing the config replaces the mounts.
        add_mounts(
            f,
            [serde_json::json!({
                "destination": "/etc/resolv.conf", "type": "bind",
                "source": resolv, "options": ["rbind", "ro"]
            })],
        );
        let id = &format!("{tier}-v6-policy");
        let out = f.agentvm(&[
            "--egress",
            &format!("[{PEER6}]:8000,allowed6.test:8000"),
            "run",
            "--bundle",
            &bundle_arg(f),
            id,
        ]);
        assert_eq!(out.code, 0, "{out}");
        for (what, want) in [
            ("addr6", "ok"),
            ("port6", "refused"),
            ("name6", "ok"),
            ("denied-name6", "refused"),
            ("ping6", "refused"),
            ("link-local", "refused"),
            ("lookup6", "ok"),
            ("denied-lookup6", "refused"),
            ("moved6", "refused"),
            // Left with its link-local address only, it sends from that.
            ("link-local-source", "refused"),
        ] {
            assert_eq!(said(&out, what), want, "{what}: {out}");
        }
        let audit = audit_of(f, id);
        let shown = serde_json::to_string_pretty(&audit).unwrap_or_default();
        for want in [
            serde_json::json!({"event": "connection", "verdict": "allowed", "dst": PEER6, "port": 8000}),
            serde_json::json!({"event": "connection", "verdict": "denied", "dst": PEER6, "port": 8001}),
            serde_json::json!({"event": "dns", "verdict": "denied", "name": "denied6.test"}),
        ] {
            assert!(has_record(&audit, want.clone()), "no {want} in\n{shown}");
        }
        assert!(
            audit.iter().any(|r| r["verdict"] == "denied"
                && r["reason"]
                    .as_str()
                    .is_some_and(|why| why.starts_with("source fd00:231::99 "))),
            "the moved address: {shown}"
        );
        assert_nothing_left(f, id);
        assert_eq!(ns.snapshot6(), before, "the namespace is as it was");
    });
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
    let said = |what: &str| said(&out, what);
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

    // Under a policy, in either tier, each attempt that sends an IP packet
    // is also dropped before routing, and is in the audit trail with the
    // source it claimed.
    drop(f);
    each_tier(|tier, f| {
        write_script(f, &ns, script);
        let echoes_before = peer_echoes(&ns);
        let id = &format!("{tier}-spoof-policy");
        let out = f.agentvm(&[
            "--egress",
            "10.231.0.0/24",
            "run",
            "--bundle",
            &bundle_arg(f),
            id,
        ]);
        assert_eq!(out.code, 0, "{out}");
        assert_eq!(
            peer_echoes(&ns) - echoes_before,
            0,
            "ICMP is not in the policy"
        );
        let audit = audit_of(f, id);
        let spoofed = |src: &str| {
            audit.iter().any(|r| {
                r["verdict"] == "denied"
                    && r["reason"]
                        .as_str()
                        .is_some_and(|why| why.starts_with(&format!("source {src} ")))
            })
        };
        let shown = serde_json::to_string_pretty(&audit).unwrap_or_default();
        assert!(spoofed("10.231.0.77"), "a second address: {shown}");
        // (A changed address gets no further than ARP: the namespace does not
        // answer for a sender that is not routed to the tap.)
        assert!(
            spoofed("10.231.0.2"),
            "its own address from another MAC: {shown}"
        );
        assert_nothing_left(f, id);
    });
}

/// What the guest reaches under `policy`: `port:ok|refused` for each
/// port, and `ping:…`, as one line.
fn reach_under(f: &Fixture, ns: &Netns, id: &str, policy: &str) -> String {
    write_script(
        f,
        ns,
        "for p in 8000 8001; do \
           wget -q -O /dev/null http://10.231.0.1:$p/ && printf \"$p:ok \" || printf \"$p:refused \"; \
         done; \
         ping -c 1 -W 2 10.231.0.1 >/dev/null 2>&1 && echo ping:ok || echo ping:refused",
    );
    let out = f.agentvm(&["--egress", policy, "run", "--bundle", &bundle_arg(f), id]);
    assert_eq!(out.code, 0, "{out}");
    assert_nothing_left(f, id);
    out.stdout.trim().to_string()
}

#[test]
fn the_egress_policy_is_enforced_outside_the_guest() {
    if common::bundle::skip_unless_root() {
        return;
    }
    each_tier(|tier, f| {
        let ns = Netns::new(&format!("{tier}egress"));
        let before = ns.snapshot();
        let _a = PeerServer::start(&ns, 8000, "a");
        let _b = PeerServer::start(&ns, 8001, "b");
        std::thread::sleep(std::time::Duration::from_millis(300));
        let reach =
            |what: &str, policy: &str| reach_under(f, &ns, &format!("{tier}-eg-{what}"), policy);
        assert_eq!(reach("allow", "allow"), "8000:ok 8001:ok ping:ok");
        assert_eq!(
            reach("port", "10.231.0.1:8000"),
            "8000:ok 8001:refused ping:refused"
        );
        assert_eq!(
            reach("net", "10.231.0.0/24"),
            "8000:ok 8001:ok ping:refused"
        );
        assert_eq!(
            reach("udp", "10.231.0.0/24/udp"),
            "8000:refused 8001:refused ping:refused"
        );
        assert_eq!(
            reach("deny", "deny"),
            "8000:refused 8001:refused ping:refused"
        );
        // Root in the sandbox moving to another address gains nothing
        // either.
        write_script(
            f,
            &ns,
            "ip addr del 10.231.0.2/24 dev eth0; ip addr add 10.231.0.9/24 dev eth0; \
             ip route add default via 10.231.0.1; \
             timeout -s KILL 10 wget -q -O /dev/null http://10.231.0.1:8001/ \
               && echo escaped || echo refused",
        );
        let out = f.agentvm(&[
            "--egress",
            "10.231.0.1:8000",
            "run",
            "--bundle",
            &bundle_arg(f),
            &format!("{tier}-eg-move"),
        ]);
        assert_eq!(out.out(), "refused", "{out}");
        assert_eq!(
            ns.snapshot(),
            before,
            "rules and routes are gone after delete"
        );
        assert_eq!(ns.nft_tables(), "", "nft tables left");
    });
}

#[test]
fn a_bad_or_unsupported_policy_is_refused_and_leaves_nothing() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("bad");
    write_script(&f, &ns, "true");
    for (policy, needle) in [
        ("10.0.0.1/8", "bits set beyond /8"),
        ("10.0.0.1:99999", "port"),
        ("foo*.example.com:443", "'*'"),
        ("", "empty"),
    ] {
        let out = f.agentvm(&[
            "--egress",
            policy,
            "run",
            "--bundle",
            &bundle_arg(&f),
            "mvn-bad",
        ]);
        common::bundle::assert_one_clear_error(&f, &out, needle);
        assert_nothing_left(&f, "mvn-bad");
    }
    // The container tier enforces a policy from a namespace of its own,
    // which a container on the host's network does not have.
    let c = require!(container_in());
    c.write_config(&["true"], |c| {
        c["linux"]["namespaces"]
            .as_array_mut()
            .expect("namespaces")
            .retain(|n| n["type"] != "network");
    });
    let out = c.agentvm(&[
        "--egress",
        "deny",
        "run",
        "--bundle",
        &bundle_arg(&c),
        "ct-bad",
    ]);
    common::bundle::assert_one_clear_error(&c, &out, "shares the host's");
    assert_nothing_left(&c, "ct-bad");
}

/// Under a policy in the container tier, every interface leaves the
/// workload's namespace, not only the one the router routes: a second veth
/// to the peer, down and without an address (as a CNI chain could leave
/// one), is a way out that root in the workload could bring up. It gets
/// no pair (the policy could not judge it), so the workload cannot use
/// it, and `delete` gives it back down.
#[test]
fn every_interface_leaves_the_workloads_namespace_under_a_policy() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(container_in());
    let ns = Netns::new("ct2nd");
    ip(&[
        "-n",
        &ns.peer,
        "link",
        "add",
        "veth1",
        "type",
        "veth",
        "peer",
        "name",
        "eth1",
        "netns",
        &ns.container,
    ]);
    ip(&[
        "-n",
        &ns.peer,
        "addr",
        "add",
        "10.232.0.1/24",
        "dev",
        "veth1",
    ]);
    ip(&["-n", &ns.peer, "link", "set", "veth1", "up"]);
    let before = ns.snapshot();
    write_script(
        &f,
        &ns,
        "ip link set eth1 up && ip addr add 10.232.0.2/24 dev eth1 \
           && echo 'second-interface up' || echo 'second-interface absent'; \
         ping -c 1 -W 2 10.232.0.1 >/dev/null 2>&1 && echo 'side-door ok' || echo 'side-door refused'",
    );
    let id = "ct-2nd";
    let out = f.agentvm(&[
        "--egress",
        "10.231.0.1:8000",
        "run",
        "--bundle",
        &bundle_arg(&f),
        id,
    ]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(said(&out, "second-interface"), "absent", "{out}");
    assert_eq!(said(&out, "side-door"), "refused", "{out}");
    assert_nothing_left(&f, id);
    assert_eq!(ns.snapshot(), before, "the namespace is as it was");
    let eth1 = ip_out(&["-n", &ns.container, "-o", "link", "show", "eth1"]);
    assert!(!eth1.contains(",UP"), "eth1 given back down: {eth1}");
}

/// A namespace shared by two containers of the container tier (a pod's,
/// or `--network container:`) takes the policy of the first: a second one
/// with a policy of its own is refused with an error saying so and leaves
/// nothing, while the first keeps its policy.
#[test]
fn a_second_policy_on_a_shared_namespace_is_refused() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(container_in());
    let ns = Netns::new("ctshared");
    let before = ns.snapshot();
    let _a = PeerServer::start(&ns, 8000, "a");
    write_script(&f, &ns, "sleep 600");
    let first = "ct-shared-1";
    let out = f.agentvm(&[
        "--egress",
        "10.231.0.1:8000",
        "run",
        "--detach",
        "--bundle",
        &bundle_arg(&f),
        first,
    ]);
    assert!(out.success(), "{out}");
    let out = f.agentvm(&[
        "--egress",
        "10.231.0.0/24",
        "run",
        "--bundle",
        &bundle_arg(&f),
        "ct-shared-2",
    ]);
    common::bundle::assert_one_clear_error(&f, &out, "egress router already");
    assert!(
        f.leftovers().iter().all(|l| !l.contains("ct-shared-2")),
        "{:?}",
        f.leftovers()
    );
    assert_eq!(
        common::bundle::processes_with("ct-shared-2"),
        Vec::<String>::new()
    );
    let out = f.agentvm(&[
        "exec",
        first,
        "timeout",
        "-s",
        "KILL",
        "10",
        "wget",
        "-q",
        "-O",
        "-",
        "http://10.231.0.1:8000/",
    ]);
    assert_eq!(out.out(), "a", "the first keeps its policy: {out}");
    f.agentvm(&["delete", "--force", first]).ok();
    assert_nothing_left(&f, first);
    assert_eq!(ns.snapshot(), before, "the namespace is as it was");
}

/// dnsmasq in the peer namespace answering `names` with the peer's
/// address; killed on drop.
struct PeerDns(std::process::Child);

impl PeerDns {
    fn start(ns: &Netns, names: &[&str]) -> Result<PeerDns, String> {
        let answers: Vec<(&str, &str)> = names.iter().map(|n| (*n, PEER)).collect();
        PeerDns::start_with(ns, &answers, &[PEER])
    }

    /// Answering each `(name, address)` (A or AAAA by the address),
    /// listening on `listen`.
    fn start_with(
        ns: &Netns,
        answers: &[(&str, &str)],
        listen: &[&str],
    ) -> Result<PeerDns, String> {
        let dnsmasq = ["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
            .into_iter()
            .find(|p| std::path::Path::new(p).exists())
            .ok_or("no dnsmasq (apt-get install dnsmasq-base)")?;
        let mut cmd = Command::new("ip");
        cmd.args([
            "netns",
            "exec",
            &ns.peer,
            dnsmasq,
            "--no-daemon",
            "--no-resolv",
        ])
        .args(["--no-hosts", "--bind-interfaces", "--pid-file="])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
        for l in listen {
            cmd.arg(format!("--listen-address={l}"));
        }
        for (n, a) in answers {
            // A name with an IPv6 address only has no IPv4 one (not a
            // refusal, which fails the whole lookup).
            if a.contains(':') {
                cmd.arg(format!("--host-record={n},{a}"));
            } else {
                cmd.arg(format!("--address=/{n}/{a}"));
            }
        }
        let child = cmd.spawn().map_err(|e| format!("start dnsmasq: {e}"))?;
        std::thread::sleep(std::time::Duration::from_millis(300));
        Ok(PeerDns(child))
    }
}

impl Drop for PeerDns {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Names in the policy are enforced by agentvm's resolver: only allowed
/// names resolve, whichever server the guest asks, and only the addresses
/// they resolved to are reachable, on the allowed port.
#[test]
fn allowed_names_resolve_and_connect_and_nothing_else_does() {
    if common::bundle::skip_unless_root() {
        return;
    }
    each_tier(|tier, f| {
        let ns = Netns::new(&format!("{tier}names"));
        let _dns = require!(PeerDns::start(&ns, &["allowed.test", "denied.test"]));
        let _a = PeerServer::start(&ns, 8000, "a");
        let _b = PeerServer::start(&ns, 8001, "b");
        let before = ns.snapshot();
        let resolv = f.dir.path().join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {PEER}\n")).expect("resolv.conf");
        write_script(
            f,
            &ns,
            "t() { wget -q -O /dev/null \"$2\" && echo \"$1 ok\" || echo \"$1 refused\"; }; \
             t name http://allowed.test:8000/; \
             t other-port http://allowed.test:8001/; \
             t denied-name http://denied.test:8000/; \
             nslookup -type=a denied.test 10.231.0.1 >/dev/null 2>&1 && echo 'other-resolver ok' || echo 'other-resolver refused'; \
             nslookup -type=a allowed.test 10.231.0.1 >/dev/null 2>&1 && echo 'allowed-lookup ok' || echo 'allowed-lookup refused'",
        );
        // The container's resolver, as Docker and Podman bind-mount it.
        add_mounts(
            f,
            [serde_json::json!({
                "destination": "/etc/resolv.conf", "type": "bind",
                "source": resolv, "options": ["rbind", "ro"]
            })],
        );
        let out = f.agentvm(&[
            "--egress",
            "allowed.test:8000",
            "run",
            "--bundle",
            &bundle_arg(f),
            &format!("{tier}-names"),
        ]);
        assert_eq!(out.code, 0, "{out}");
        let said = |what: &str| said(&out, what);
        assert_eq!(said("name"), "ok", "{out}");
        assert_eq!(said("other-port"), "refused", "{out}");
        assert_eq!(said("denied-name"), "refused", "{out}");
        assert_eq!(said("other-resolver"), "refused", "{out}");
        assert_eq!(said("allowed-lookup"), "ok", "{out}");
        assert_nothing_left(f, &format!("{tier}-names"));
        assert_eq!(ns.snapshot(), before, "rules, routes and marks are gone");
    });
}

/// The container tier under a policy with names, its resolver on the
/// workload's loopback as Docker's embedded DNS is: root in the workload,
/// with `CAP_NET_ADMIN`, runs the host's `nft` and busybox's `ip` on its
/// own namespace. It sees only that namespace's resolver redirect, not the
/// router's rules; flushing it lets it *resolve* a denied name through
/// the loopback resolver, but not connect to it; renaming its interface
/// only cuts it off; and `delete` still leaves the namespace as it was.
#[test]
fn root_with_net_admin_in_the_container_tier_changes_only_its_own_namespace() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(container_in());
    let ns = Netns::new("ctadmin");
    ip(&["-n", &ns.container, "link", "set", "lo", "up"]);
    ip(&[
        "-n",
        &ns.peer,
        "addr",
        "add",
        "10.231.0.3/24",
        "dev",
        "veth0",
    ]);
    let before = ns.snapshot();
    let _a = PeerServer::start_on(&ns, "8000", "served");
    // "Docker's embedded DNS": a resolver on 127.0.0.11 in the container's
    // namespace, answering both names.
    let dnsmasq = require!(["/usr/sbin/dnsmasq", "/usr/bin/dnsmasq"]
        .into_iter()
        .find(|p| std::path::Path::new(p).exists())
        .ok_or("no dnsmasq (apt-get install dnsmasq-base)"));
    let mut dns = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.container,
            dnsmasq,
            "--no-daemon",
            "--no-resolv",
        ])
        .args(["--no-hosts", "--bind-interfaces", "--pid-file="])
        .args(["--listen-address=127.0.0.11", "--interface=lo"])
        .args([
            "--address=/allowed.test/10.231.0.1",
            "--address=/denied.test/10.231.0.3",
        ])
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("start dnsmasq");
    std::thread::sleep(std::time::Duration::from_millis(300));
    let resolv = f.dir.path().join("resolv.conf");
    std::fs::write(&resolv, "nameserver 127.0.0.11\n").expect("resolv.conf");
    write_script(
        &f,
        &ns,
        "NFT='/host/usr/lib/x86_64-linux-gnu/ld-linux-x86-64.so.2 \
              --library-path /host/usr/lib/x86_64-linux-gnu /host/usr/sbin/nft'; \
         r() { nslookup -type=a $1 >/dev/null 2>&1 && echo \"$2 resolved\" || echo \"$2 unresolved\"; }; \
         c() { timeout -s KILL 10 wget -q -O /dev/null http://$1:8000/ \
               && echo \"$2 ok\" || echo \"$2 refused\"; }; \
         r allowed.test allowed-name; c allowed.test allowed-connect; \
         r denied.test denied-name; \
         $NFT list ruleset > /tmp/rules 2>&1; \
         grep -q avveth /tmp/rules && echo 'router-rules seen' || echo 'router-rules unseen'; \
         grep -q 'dnat ip to 127.0.0.11' /tmp/rules && echo 'redirect seen' || echo 'redirect unseen'; \
         $NFT flush ruleset && echo 'flush done' || echo 'flush failed'; \
         r denied.test denied-name-after-flush; c denied.test denied-connect-after-flush; \
         c 10.231.0.3 denied-address-after-flush; c allowed.test allowed-after-flush; \
         ip link set eth0 down; ip link set eth0 name eth9; ip link set eth9 up; \
         ip route add default via 10.231.0.1 dev eth9; c 10.231.0.1 renamed",
    );
    add_mounts(
        &f,
        [
            serde_json::json!({
                "destination": "/etc/resolv.conf", "type": "bind",
                "source": resolv, "options": ["rbind", "ro"]
            }),
            serde_json::json!({
                "destination": "/host/usr", "type": "bind",
                "source": "/usr", "options": ["rbind", "ro"]
            }),
            serde_json::json!({
                "destination": "/tmp", "type": "tmpfs", "source": "tmpfs",
                "options": ["nosuid", "nodev", "size=1m"]
            }),
        ],
    );
    let id = "ct-admin";
    let out = f.agentvm(&[
        "--egress",
        "allowed.test:8000",
        "run",
        "--bundle",
        &bundle_arg(&f),
        id,
    ]);
    let _ = dns.kill();
    let _ = dns.wait();
    assert_eq!(out.code, 0, "{out}");
    let said = |what: &str| said(&out, what);
    for (what, want) in [
        ("allowed-name", "resolved"),
        ("allowed-connect", "ok"),
        ("denied-name", "unresolved"),
        ("router-rules", "unseen"),
        ("redirect", "seen"),
        ("flush", "done"),
        // What the flush gains: Docker's resolver answers directly...
        ("denied-name-after-flush", "resolved"),
        // ...but the proxy, out of reach, allows only what the policy's
        // resolvers answered for allowed names.
        ("denied-connect-after-flush", "refused"),
        ("denied-address-after-flush", "refused"),
        ("allowed-after-flush", "ok"),
        ("renamed", "refused"),
    ] {
        assert_eq!(said(what), want, "{what}: {out}");
    }
    assert_nothing_left(&f, id);
    assert_eq!(ns.snapshot(), before, "the namespace is as it was");
    assert_eq!(ns.nft_tables(), "", "nft tables left");
    let audit = audit_of(&f, id);
    let shown = serde_json::to_string_pretty(&audit).unwrap_or_default();
    for want in [
        serde_json::json!({"event": "dns", "verdict": "denied", "name": "denied.test"}),
        serde_json::json!({"event": "connection", "verdict": "denied", "dst": "10.231.0.3", "port": 8000}),
    ] {
        assert!(has_record(&audit, want.clone()), "no {want} in\n{shown}");
    }
}

/// The peer's IPv6 link-local address.
fn peer_link_local(ns: &Netns) -> String {
    ip_out(&[
        "-n", &ns.peer, "-6", "-o", "addr", "show", "dev", "veth0", "scope", "link",
    ])
    .split_whitespace()
    .skip_while(|w| *w != "inet6")
    .nth(1)
    .and_then(|a| a.split('/').next())
    .unwrap_or("fe80::1")
    .to_string()
}

/// The audit records of container `id`, from the fixture's audit file.
fn audit_of(f: &Fixture, id: &str) -> Vec<serde_json::Value> {
    let text = std::fs::read_to_string(f.dir.path().join("audit.jsonl")).unwrap_or_default();
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(|r| r["container"] == id)
        .collect()
}

/// Whether some record of `records` has every field of `want`.
fn has_record(records: &[serde_json::Value], want: serde_json::Value) -> bool {
    let want = want.as_object().expect("an object").clone();
    records.iter().any(|r| want.iter().all(|(k, v)| &r[k] == v))
}

/// A TLS ClientHello naming `sni`, its handshake cut into records of
/// `per_record` bytes (a name in a later record must still be seen).
fn tls_hello(sni: &str, per_record: usize) -> Vec<u8> {
    let name = sni.as_bytes();
    let entry_len = name.len() + 3;
    let mut server_name = vec![0u8, 0];
    server_name.extend(((entry_len + 2) as u16).to_be_bytes());
    server_name.extend((entry_len as u16).to_be_bytes());
    server_name.push(0);
    server_name.extend((name.len() as u16).to_be_bytes());
    server_name.extend(name);
    let mut hello = vec![3, 3];
    hello.extend([0x42; 32]);
    hello.extend([0, 0, 2, 0x13, 0x02, 1, 0]);
    hello.extend((server_name.len() as u16).to_be_bytes());
    hello.extend(server_name);
    let len = hello.len() as u32;
    let mut handshake = vec![1, (len >> 16) as u8, (len >> 8) as u8, len as u8];
    handshake.extend(hello);
    handshake
        .chunks(per_record)
        .flat_map(|c| {
            let mut r = vec![22, 3, 1];
            r.extend((c.len() as u16).to_be_bytes());
            r.extend(c);
            r
        })
        .collect()
}

/// A DNS query for `name` as DNS over TCP sends it (length-prefixed).
fn dns_over_tcp(name: &str) -> Vec<u8> {
    let mut q = vec![0x12, 0x34, 1, 0, 0, 1, 0, 0, 0, 0, 0, 0];
    for label in name.split('.') {
        q.push(label.len() as u8);
        q.extend(label.as_bytes());
    }
    q.extend([0, 0, 1, 0, 1]);
    let mut out = (q.len() as u16).to_be_bytes().to_vec();
    out.extend(q);
    out
}

/// With names in the policy, every TCP connection goes through agentvm's
/// proxy, which connects only when the name the client gives (SNI, Host)
/// is allowed *and* is a name the destination resolved from. Root in the
/// guest tries to get around it — forged names towards other addresses,
/// a ClientHello split to hide its name, DNS over TCP (answered by the
/// policy's resolver: a denied name REFUSED), another resolver, ARP
/// claims, IPv6 link-local — and each attempt fails and is in the audit
/// trail.
#[test]
fn forged_names_and_other_ways_around_the_proxy_fail_and_are_audited() {
    if common::bundle::skip_unless_root() {
        return;
    }
    each_tier(|tier, f| {
        let ns = Netns::new(&format!("{tier}forge"));
        // A second address on the peer that no allowed name resolves to.
        ip(&[
            "-n",
            &ns.peer,
            "addr",
            "add",
            "10.231.0.3/24",
            "dev",
            "veth0",
        ]);
        let _dns = require!(PeerDns::start(&ns, &["allowed.test", "denied.test"]));
        let _httpd = PeerServer::start_on(&ns, "8000", "served");
        let data = f.dir.path().join("data");
        std::fs::create_dir_all(&data).expect("data");
        for (file, bytes) in [
            ("sni-allowed", tls_hello("allowed.test", 1 << 14)),
            ("sni-denied", tls_hello("denied.test", 1 << 14)),
            ("sni-denied-split", tls_hello("denied.test", 9)),
            ("dns-tcp", dns_over_tcp("denied.test")),
            ("dns-tcp-allowed", dns_over_tcp("allowed.test")),
            (
                "host-denied",
                b"GET / HTTP/1.0\r\nHost: denied.test\r\n\r\n".to_vec(),
            ),
            (
                "host-allowed",
                b"GET / HTTP/1.0\r\nHost: allowed.test:8000\r\n\r\n".to_vec(),
            ),
            (
                "absolute-denied",
                b"GET http://denied.test:8000/ HTTP/1.0\r\nHost: allowed.test\r\n\r\n".to_vec(),
            ),
        ] {
            std::fs::write(data.join(file), bytes).expect("write");
        }
        let resolv = f.dir.path().join("resolv.conf");
        std::fs::write(&resolv, format!("nameserver {PEER}\n")).expect("resolv.conf");
        // The peer's IPv6 link-local address, which the guest may try to
        // reach past the IPv4-only plumbing. (The namespace's own is the
        // guest's too: the guest has the container's MAC.)
        let ns_ll = peer_link_local(&ns);
        // `t NAME ADDR FILE`: sends FILE to ADDR:8000 (or :53); "ok" when an
        // answer came back through the proxy.
        write_script(
            f,
            &ns,
            &"q() { c=$(nc -w 3 $2 53 < /data/$3 2>/dev/null | od -An -tu1 -j5 -N1 | tr -d ' '); \
               [ -n \"$c\" ] && echo \"$1 rcode-$((c & 15))\" || echo \"$1 no-answer\"; }; \
         t() { n=$(nc -w 3 $2 $4 < /data/$3 2>/dev/null | wc -c); \
                   [ \"$n\" -gt 0 ] && echo \"$1 ok\" || echo \"$1 refused\"; }; \
             nslookup -type=a allowed.test >/dev/null 2>&1 && echo 'lookup ok' || echo 'lookup refused'; \
             for a in 10.231.0.1 10.231.0.3; do timeout -s KILL 2 tftp -g -r x -l /dev/null $a 9999 2>/dev/null; done; \
             t host-allowed 10.231.0.1 host-allowed 8000; \
             t sni-allowed 10.231.0.1 sni-allowed 8000; \
             t host-denied 10.231.0.1 host-denied 8000; \
             t absolute-denied 10.231.0.1 absolute-denied 8000; \
             t sni-denied 10.231.0.1 sni-denied 8000; \
             t sni-denied-split 10.231.0.1 sni-denied-split 8000; \
             t other-address 10.231.0.3 host-allowed 8000; \
             q dns-over-tcp 10.231.0.1 dns-tcp; q dns-over-tcp-allowed 10.231.0.1 dns-tcp-allowed; \
             q dns-over-tcp-elsewhere 10.231.0.3 dns-tcp-allowed; \
             nslookup denied.test 10.231.0.3 >/dev/null 2>&1 && echo 'other-resolver ok' || echo 'other-resolver refused'; \
             arping -c 2 -U -s 10.231.0.3 -I eth0 10.231.0.1 >/dev/null 2>&1; \
             arping -c 2 -U -s 10.231.0.99 -I eth0 10.231.0.99 >/dev/null 2>&1; \
             ping6 -c 1 -W 2 -I eth0 ff02::2 >/dev/null 2>&1 && echo 'all-routers ok' || echo 'all-routers refused'; \
             ping6 -c 1 -W 2 -I eth0 NS_LINK_LOCAL >/dev/null 2>&1 && echo 'link-local ok' || echo 'link-local refused'; \
             t after-arp 10.231.0.3 host-allowed 8000"
                .replace("NS_LINK_LOCAL", &ns_ll),
        );
        add_mounts(
            f,
            [
                serde_json::json!({
                    "destination": "/etc/resolv.conf", "type": "bind",
                    "source": resolv, "options": ["rbind", "ro"]
                }),
                serde_json::json!({
                    "destination": "/data", "type": "bind",
                    "source": data, "options": ["rbind", "ro"]
                }),
            ],
        );
        let id = &format!("{tier}-forge");
        let out = f.agentvm(&[
            "--egress",
            "allowed.test:8000,allowed.test:9999/udp",
            "run",
            "--bundle",
            &bundle_arg(f),
            id,
        ]);
        assert_eq!(out.code, 0, "{out}");
        let said = |what: &str| said(&out, what);
        for (what, want) in [
            ("lookup", "ok"),
            ("host-allowed", "ok"),
            ("sni-allowed", "ok"),
            ("host-denied", "refused"),
            ("absolute-denied", "refused"),
            ("sni-denied", "refused"),
            ("sni-denied-split", "refused"),
            ("other-address", "refused"),
            // DNS over TCP is the policy's resolver's, whatever server
            // it names: a denied name REFUSED (5), an allowed one answered.
            ("dns-over-tcp", "rcode-5"),
            ("dns-over-tcp-allowed", "rcode-0"),
            ("dns-over-tcp-elsewhere", "rcode-0"),
            ("other-resolver", "refused"),
            ("all-routers", "refused"),
            ("link-local", "refused"),
            ("after-arp", "refused"),
        ] {
            assert_eq!(
                said(what),
                want,
                "{what} (peer's link-local {ns_ll}): {out}"
            );
        }
        // The ARP claims changed nothing outside the guest: the peer never
        // heard of the made-up address.
        let peer_neigh =
            String::from_utf8_lossy(&ns.in_peer(&["ip", "neigh", "show"]).stdout).into_owned();
        assert!(!peer_neigh.contains("10.231.0.99"), "{peer_neigh}");
        assert_nothing_left(f, id);

        let audit = audit_of(f, id);
        let shown = serde_json::to_string_pretty(&audit).unwrap_or_default();
        for want in [
            serde_json::json!({"event": "dns", "verdict": "allowed", "name": "allowed.test"}),
            serde_json::json!({"event": "dns", "verdict": "denied", "name": "denied.test"}),
            serde_json::json!({"event": "connection", "verdict": "allowed", "dst": PEER, "port": 8000,
                               "name": "allowed.test", "name_from": "host"}),
            serde_json::json!({"event": "connection", "verdict": "allowed", "name": "allowed.test", "name_from": "sni"}),
            serde_json::json!({"event": "connection", "verdict": "denied", "name": "denied.test", "name_from": "host"}),
            serde_json::json!({"event": "connection", "verdict": "denied", "name": "denied.test", "name_from": "sni"}),
            serde_json::json!({"event": "connection", "verdict": "denied", "dst": "10.231.0.3", "port": 8000}),
            // A UDP rule naming a host: the jailed daemon added the address
            // the name resolved to, and only that one, to the rule's set.
            serde_json::json!({"event": "connection", "verdict": "allowed", "proto": "udp", "dst": PEER,
                               "port": 9999, "rule": "allowed.test:9999/udp"}),
            serde_json::json!({"event": "connection", "verdict": "denied", "proto": "udp", "dst": "10.231.0.3", "port": 9999}),
        ] {
            assert!(has_record(&audit, want.clone()), "no {want} in\n{shown}");
        }
        // A UDP flow is written at its end with what it sent (tftp's
        // requests, unanswered) and how long it lasted.
        assert!(
            audit.iter().any(|r| r["proto"] == "udp"
                && r["verdict"] == "allowed"
                && r["port"] == 9999
                && r["bytes_out"].as_u64().unwrap_or(0) > 0),
            "{shown}"
        );
        // Bytes were counted both ways for the connection that went through.
        assert!(
            audit.iter().any(|r| r["name_from"] == "host"
                && r["verdict"] == "allowed"
                && r["bytes_out"].as_u64().unwrap_or(0) > 0
                && r["bytes_in"].as_u64().unwrap_or(0) > 0),
            "{shown}"
        );
    });
}

/// What the containers of `lanes` could leave on the host: processes
/// naming their state roots (agentvm, QEMU, virtiofsd, egress daemons),
/// the links, routes, rules and nft tables of their namespaces, and
/// namespaces named after them. Counted per lane, not host-wide: other
/// tests run beside this one.
fn lane_counts(lanes: &[(Fixture, Netns)]) -> String {
    let mut out = String::new();
    for (f, ns) in lanes {
        let root = f.dir.path().to_str().expect("utf-8").to_string();
        let procs = common::bundle::processes_with(&root).len();
        let nft = ns.nft_tables().lines().count();
        let netns = ip_out(&["netns", "list"])
            .lines()
            .filter(|l| l.contains(&ns.container) || l.contains(&ns.peer))
            .count();
        out += &format!(
            "{}: processes {procs} nft tables {nft} namespaces {netns}\n{}\n",
            ns.container,
            ns.snapshot()
        );
    }
    out
}

/// The egress daemon of container `id`, as `pid: cmdline` lines.
fn daemon_of(id: &str) -> Vec<String> {
    common::bundle::processes_with("egress-daemon")
        .into_iter()
        .filter(|p| p.contains(&format!("--id {id} ")))
        .collect()
}

/// Faults: the egress daemon killed leaves the sandbox cut off, not open
/// (its rules send everything to it); the sandbox killed (the VM, or the
/// container tier's init) is the container's exit, and `delete` leaves
/// the namespace, the host and its processes as they were.
#[test]
fn a_killed_egress_daemon_fails_closed_and_a_killed_sandbox_leaves_nothing() {
    if common::bundle::skip_unless_root() {
        return;
    }
    each_tier(|tier, f| {
        let ns = Netns::new(&format!("{tier}kill"));
        let before = ns.snapshot();
        let _a = PeerServer::start(&ns, 8000, "a");
        write_script(f, &ns, "sleep 600");
        let id = &format!("{tier}-kill");
        let out = f.agentvm(&[
            "--egress",
            "10.231.0.1:8000",
            "create",
            "--bundle",
            &bundle_arg(f),
            id,
        ]);
        assert!(out.success(), "{out}");
        f.agentvm(&["start", id]).ok();
        let fetch = [
            "exec",
            id,
            "timeout",
            "-s",
            "KILL",
            "10",
            "wget",
            "-q",
            "-O",
            "/dev/null",
            "http://10.231.0.1:8000/",
        ];
        let out = f.agentvm(&fetch);
        assert_eq!(out.code, 0, "allowed before: {out}");
        let daemon = daemon_of(id);
        assert_eq!(daemon.len(), 1, "one egress daemon: {daemon:?}");
        kill_9(&daemon[0]);
        let out = f.agentvm(&fetch);
        assert_ne!(
            out.code, 0,
            "the daemon gone, the sandbox must be cut off: {out}"
        );
        // The sandbox killed: the container stops, delete cleans up.
        let victim = if tier == "mvn" {
            // QEMU is the supervisor's child (its command line names no
            // state directory: it gets its sockets and files as fds).
            let supervisor = f.state(id)["pid"].as_i64().expect("pid") as i32;
            let qemu: Vec<String> = common::bundle::children_of(supervisor)
                .into_iter()
                .filter(|p| p.contains("qemu-system"))
                .collect();
            assert_eq!(qemu.len(), 1, "one QEMU: {qemu:?}");
            qemu[0].clone()
        } else {
            format!("{}: init", f.state(id)["pid"])
        };
        kill_9(&victim);
        let stopped = common::wait_for(30, || (f.state(id)["status"] == "stopped").then_some(()));
        assert!(stopped.is_some(), "{}", f.state(id));
        f.agentvm(&["delete", id]).ok();
        assert_nothing_left(f, id);
        assert_eq!(
            ns.snapshot(),
            before,
            "routes, proxy entries and sandbox interfaces are gone"
        );
        assert_eq!(ns.nft_tables(), "", "nft tables left");
        assert!(daemon_of(id).is_empty(), "{:?}", daemon_of(id));
    });
}

/// SIGKILLs the process of a `pid: cmdline` line.
fn kill_9(line: &str) {
    // "pid: …" or "pid (comm) state ppid: …".
    let pid = line.split([':', ' ']).next().unwrap_or_default().trim();
    assert!(
        Command::new("kill")
            .args(["-9", pid])
            .status()
            .expect("kill")
            .success(),
        "kill {line}"
    );
}

/// 200 networked containers, three namespaces at a time (one in the
/// container tier), half of them under a policy (taps, veth pairs, router
/// namespaces, nft tables, routing rules, egress daemons): the
/// counts of their processes, links, routes, rules, nft tables and
/// namespaces end where they started.
#[test]
fn two_hundred_networked_create_delete_cycles_leave_the_host_as_it_was() {
    if common::bundle::skip_unless_root() {
        return;
    }
    const LANES: usize = 3;
    const CYCLES: usize = 200;
    let mut lanes = Vec::new();
    for lane in 0..LANES {
        // One lane of the container tier, two of microVMs.
        let f = require!(if lane == 0 {
            container_in()
        } else {
            microvm_in()
        });
        let ns = Netns::new(&format!("cyc{lane}"));
        write_script(&f, &ns, "ip -o addr show eth0 | grep -q 10.231.0.2");
        lanes.push((f, ns));
    }
    let counts = lane_counts(&lanes);
    std::thread::scope(|s| {
        for (lane, (f, _)) in lanes.iter().enumerate() {
            s.spawn(move || {
                for i in (lane..CYCLES).step_by(LANES) {
                    let id = format!("mvn-cyc-{i}");
                    let policy = if i % 2 == 0 {
                        "allow"
                    } else {
                        "10.231.0.1:8000"
                    };
                    let out =
                        f.agentvm(&["--egress", policy, "run", "--bundle", &bundle_arg(f), &id]);
                    assert_eq!(out.code, 0, "cycle {i}: {out}");
                    assert!(f.leftovers().is_empty(), "cycle {i}: {:?}", f.leftovers());
                }
            });
        }
    });
    // Processes end a moment after the container's own exit.
    let settled = common::wait_for(10, || (lane_counts(&lanes) == counts).then_some(()));
    assert!(
        settled.is_some(),
        "before:\n{counts}\nafter:\n{}",
        lane_counts(&lanes)
    );
}

/// A bundle running `script` in a network namespace of its own that the
/// Docker-like hook fills, with the host directory `out` at /out.
fn write_hooked_script(f: &Fixture, hook: serde_json::Value, out: &std::path::Path, script: &str) {
    f.write_config(&["sh", "-c", script], |c| {
        c["hooks"] = serde_json::json!({"prestart": [hook]});
        c["mounts"].as_array_mut().expect("mounts").extend([
            serde_json::json!({
                "destination": "/sys", "type": "sysfs", "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"]
            }),
            serde_json::json!({
                "destination": "/out", "type": "bind", "source": out,
                "options": ["rbind", "rw"]
            }),
        ]);
    });
}

/// Runs `id` with create/start to its end; returns its boot trace and
/// what it wrote to /out/result.
fn create_start_wait(f: &Fixture, id: &str, out: &std::path::Path) -> (Vec<String>, String) {
    let created = f.create(id);
    assert_eq!(created.code, 0, "{created}");
    let parts = f.boot_parts(id);
    let started = f.agentvm(&["start", id]);
    assert_eq!(started.code, 0, "{started}");
    let stopped = common::wait_for(60, || (f.state(id)["status"] == "stopped").then_some(()));
    assert!(stopped.is_some(), "{id} never stopped: {}", f.state(id));
    let deleted = f.agentvm(&["delete", id]);
    assert_eq!(deleted.code, 0, "{deleted}");
    let result = std::fs::read_to_string(out.join("result")).unwrap_or_default();
    (parts, result)
}

/// Docker's network hook fills the namespace while the VM boots: the VM is
/// launched before the hook runs, and its NIC still becomes the
/// container's interface (address, MAC, MTU, route), as after the hook.
#[test]
fn the_vm_boots_while_docker_s_network_hook_runs() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("hook");
    let mac = ip_out(&["-n", &ns.container, "-o", "link", "show", "eth0"]);
    let out = f.dir.path().join("out");
    std::fs::create_dir(&out).expect("out dir");
    let hook = ns.docker_like_hook(f.dir.path(), false, false);
    write_hooked_script(
        &f,
        hook,
        &out,
        "{ ip -4 -o addr show; cat /sys/class/net/eth0/mtu /sys/class/net/eth0/address; \
         ip route; ping -c 1 -W 5 10.231.0.1 >/dev/null && echo ping-ok; } > /out/result 2>&1",
    );
    let (parts, result) = create_start_wait(&f, "mvn-hook", &out);
    let at = |p: &str| parts.iter().position(|x| x == p);
    assert!(
        at("vmm launch").is_some() && at("vmm launch") < at("hooks"),
        "the VM was not launched before the hook: {parts:?}"
    );
    assert!(result.contains(&format!("inet {GUEST}/24")), "{result}");
    assert!(result.contains("\n1450\n"), "MTU: {result}");
    let guest_mac = result
        .lines()
        .find(|l| l.len() == 17 && l.matches(':').count() == 5);
    assert!(
        guest_mac.is_some_and(|m| mac.contains(m)),
        "the guest's MAC is not the veth's ({mac}): {result}"
    );
    assert!(
        result.contains(&format!("default via {PEER} dev eth0")),
        "{result}"
    );
    assert!(result.contains("ping-ok"), "{result}");
    assert!(!result.contains("eth1"), "an interface too many: {result}");
    assert_nothing_left(&f, "mvn-hook");
}

/// A hook that gives the container more NICs than the VM booted beside it
/// has: that VM is given up and one booted with them all, so the guest has
/// both interfaces. A hook that fails takes the VM booted beside it along.
#[test]
fn more_nics_than_booted_with_boot_again_and_a_failed_hook_leaves_nothing() {
    if common::bundle::skip_unless_root() {
        return;
    }
    let f = require!(microvm_in());
    let ns = Netns::new("hk2");
    let out = f.dir.path().join("out");
    std::fs::create_dir(&out).expect("out dir");
    let hook = ns.docker_like_hook(f.dir.path(), true, false);
    write_hooked_script(
        &f,
        hook,
        &out,
        "{ ip -4 -o addr show; ping -c 1 -W 5 10.232.0.1 >/dev/null && echo ping1-ok; } \
         > /out/result 2>&1",
    );
    let (parts, result) = create_start_wait(&f, "mvn-hk2", &out);
    assert!(result.contains(&format!("inet {GUEST}/24")), "{result}");
    assert!(
        result.contains("eth1") && result.contains("inet 10.232.0.2/24"),
        "{result}"
    );
    assert!(result.contains("ping1-ok"), "{result}");
    assert_eq!(
        parts.iter().filter(|p| *p == "vmm launch").count(),
        2,
        "booted beside the hook, then again after it: {parts:?}"
    );
    assert_nothing_left(&f, "mvn-hk2");

    // The namespace's eth0 went with the container's namespace: a new
    // pair for the failing hook.
    let ns = Netns::new("hkf");
    let hook = ns.docker_like_hook(f.dir.path(), false, true);
    write_hooked_script(&f, hook, &out, "true");
    let created = f.create("mvn-hkf");
    assert_ne!(created.code, 0, "{created}");
    assert!(
        created.stderr.contains("no network for you"),
        "the hook's error is not reported: {created}"
    );
    assert_nothing_left(&f, "mvn-hkf");
}
