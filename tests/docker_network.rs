//! Docker networking, side by side: runc (the reference), agentvm's
//! container tier and its microvm tier on the same daemon and the same
//! networks. What a Docker user relies on — the address, MAC, routes and
//! MTU `docker inspect` reports, a published port, a server on the host's
//! bridge address, containers finding each other by name through Docker's
//! embedded DNS, `--network none` — holds in every tier; `--network host`
//! is refused by the microvm tier with an error naming why.
//!
//! Needs root and Docker; the microvm column also needs QEMU, virtiofsd and
//! the guest kernel, else it prints `skipped: <why>`. No address outside
//! this machine is used.
//!
//!     cargo test --release --test docker_network -- --nocapture

use agentvm_test_support as common;
use common::require;

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::time::Duration;

use common::docker::{docker, docker_with, Docker};
use common::{unique_name, wait_for, Runtime};

/// The runtimes under test, each with why it cannot run here.
fn runtimes() -> Vec<Result<Docker, String>> {
    let microvm = match common::guest::unavailable() {
        Some(why) => Err(format!("microvm: {why}")),
        None => docker_with(Runtime::AgentvmDefault),
    };
    vec![
        docker_with(Runtime::Peer("runc".into())),
        docker_with(Runtime::AgentvmContainer),
        microvm,
    ]
}

/// Runs `check` for each runtime that can run here, saying which cannot.
fn each_runtime(check: impl Fn(&Docker)) {
    for d in runtimes() {
        match d {
            Ok(d) => {
                eprintln!("-- {}", d.runtime.docker_name());
                check(&d);
            }
            Err(why) => eprintln!("skipped: {why}"),
        }
    }
}

/// A user-defined network, removed on drop.
struct Network<'a> {
    docker: &'a Docker,
    name: String,
}

impl<'a> Network<'a> {
    fn create(docker: &'a Docker, test: &str, opts: &[&str]) -> Network<'a> {
        let name = unique_name(test);
        let mut args = vec!["network", "create"];
        args.extend_from_slice(opts);
        args.push(&name);
        docker.run(&args).ok();
        Network { docker, name }
    }
}

impl Drop for Network<'_> {
    fn drop(&mut self) {
        let _ = self.docker.run(&["network", "rm", &self.name]);
    }
}

/// A shell line serving /www over HTTP on port 80 in the foreground.
const HTTPD: &str =
    "mkdir -p /www && echo hello-from-the-container > /www/index.html && echo serving && exec httpd -f -p 80 -h /www";

fn http_get(addr: &str, path: &str) -> std::io::Result<Vec<u8>> {
    let mut s = TcpStream::connect_timeout(
        &addr
            .parse()
            .map_err(|e| std::io::Error::other(format!("{addr}: {e}")))?,
        Duration::from_secs(10),
    )?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: test\r\n\r\n")?;
    let mut all = Vec::new();
    s.read_to_end(&mut all)?;
    let body = all
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .map(|i| all[i + 4..].to_vec())
        .unwrap_or_default();
    Ok(body)
}

#[test]
fn address_mac_routes_and_mtu_are_what_docker_inspect_reports() {
    let base = require!(docker());
    let net = Network::create(
        base,
        "mtu",
        &["--opt", "com.docker.network.driver.mtu=1400"],
    );
    each_runtime(|d| {
        let c = d.start("inspect", &["--network", &net.name], &["sleep", "600"]);
        let want_ip = c.inspect(&format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPAddress}}}}",
            net.name
        ));
        let want_mac = c.inspect(&format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").MacAddress}}}}",
            net.name
        ));
        let want_gw = c.inspect(&format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").Gateway}}}}",
            net.name
        ));
        let got = c
            .exec(
                &[],
                &[
                    "sh",
                    "-c",
                    "ip -4 -o addr show eth0; cat /sys/class/net/eth0/address /sys/class/net/eth0/mtu; ip route",
                ],
            )
            .ok();
        let text = got.out();
        assert!(
            text.contains(&format!("inet {want_ip}/")),
            "{}: address {want_ip} not in\n{text}",
            d.runtime.docker_name()
        );
        let lines: Vec<&str> = text.lines().collect();
        assert!(
            lines.contains(&want_mac.as_str()),
            "MAC {want_mac} in\n{text}"
        );
        assert!(lines.contains(&"1400"), "MTU 1400 in\n{text}");
        assert!(
            text.contains(&format!("default via {want_gw} dev eth0")),
            "default route via {want_gw} in\n{text}"
        );
        // The gateway answers.
        c.exec(&[], &["ping", "-c", "1", "-W", "5", &want_gw]).ok();
    });
}

#[test]
fn a_published_port_serves_and_a_big_transfer_arrives_intact() {
    let base = require!(docker());
    let _ = base;
    each_runtime(|d| {
        let mib = 200;
        let script = format!(
            "mkdir -p /www && dd if=/dev/urandom of=/www/blob bs=1M count={mib} 2>/dev/null && \
             sha256sum /www/blob > /www/sum && {HTTPD}"
        );
        let c = d.start("publish", &["-p", "127.0.0.1::80"], &["sh", "-c", &script]);
        c.wait_for_log("serving");
        let port = c.inspect("{{(index (index .NetworkSettings.Ports \"80/tcp\") 0).HostPort}}");
        let addr = format!("127.0.0.1:{port}");
        let body = wait_for(30, || {
            http_get(&addr, "/index.html")
                .ok()
                .filter(|b| !b.is_empty())
        })
        .unwrap_or_else(|| panic!("{}: nothing served on {addr}", d.runtime.docker_name()));
        assert_eq!(String::from_utf8_lossy(&body), "hello-from-the-container\n");
        let blob = http_get(&addr, "/blob").expect("download the blob");
        assert_eq!(
            blob.len(),
            mib << 20,
            "{}: blob length",
            d.runtime.docker_name()
        );
        let sum = String::from_utf8_lossy(&http_get(&addr, "/sum").expect("sum")).to_string();
        let want = sum
            .split_whitespace()
            .next()
            .unwrap_or_default()
            .to_string();
        let got = sha256_hex(&blob);
        assert_eq!(got, want, "{}: checksum", d.runtime.docker_name());
    });
}

/// sha256 of `data` by the host's `sha256sum`.
fn sha256_hex(data: &[u8]) -> String {
    let mut child = std::process::Command::new("sha256sum")
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("sha256sum");
    let mut stdin = child.stdin.take().expect("stdin");
    let data = data.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&data));
    let out = child.wait_with_output().expect("sha256sum output");
    writer.join().expect("writer").expect("write to sha256sum");
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap_or_default()
        .to_string()
}

#[test]
fn containers_on_a_user_network_reach_each_other_by_name() {
    let base = require!(docker());
    let net = Network::create(base, "names", &[]);
    each_runtime(|d| {
        let server = d.start(
            "srv",
            &["--network", &net.name, "--network-alias", "web"],
            &["sh", "-c", HTTPD],
        );
        server.wait_for_log("serving");
        for name in [server.name.as_str(), "web"] {
            let out = d.run_rm(
                &["--network", &net.name],
                &[
                    "wget",
                    "-q",
                    "-O",
                    "-",
                    &format!("http://{name}/index.html"),
                ],
            );
            assert!(
                out.success() && out.out() == "hello-from-the-container",
                "{}: by name {name}:\n{out}",
                d.runtime.docker_name()
            );
        }
        // A name nobody registered does not resolve.
        let out = d.run_rm(
            &["--network", &net.name],
            &["nslookup", "no-such-container.invalid"],
        );
        assert!(!out.success(), "{}: {out}", d.runtime.docker_name());
    });
}

#[test]
fn a_server_on_the_host_bridge_address_is_reachable() {
    let base = require!(docker());
    let gateway = base.bridge_gateway();
    let listener = TcpListener::bind((gateway.as_str(), 0)).expect("listen on the bridge");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nfrom-the-host\n");
        }
    });
    each_runtime(|d| {
        let out = d
            .run_rm(
                &[],
                &[
                    "wget",
                    "-q",
                    "-O",
                    "-",
                    &format!("http://{gateway}:{port}/"),
                ],
            )
            .ok();
        assert_eq!(out.out(), "from-the-host", "{}", d.runtime.docker_name());
    });
}

/// A dual-stack network: each runtime's container has the IPv6 address
/// and gateway `docker inspect` reports, and reaches a runc container on
/// the network over IPv6, as runc's does.
#[test]
fn ipv6_on_a_dual_stack_network_is_what_docker_inspect_reports() {
    let base = require!(docker());
    let net = Network::create(
        base,
        "ipv6",
        &[
            "--ipv6",
            "--subnet",
            "172.31.231.0/24",
            "--subnet",
            "fd00:db8:231::/64",
        ],
    );
    let runc = docker_with(Runtime::Peer("runc".into())).expect("docker");
    let web = runc.start("web6", &["--network", &net.name], &["sh", "-c", HTTPD]);
    web.wait_for_log("serving");
    let web6 = web.inspect(&format!(
        "{{{{(index .NetworkSettings.Networks \"{}\").GlobalIPv6Address}}}}",
        net.name
    ));
    assert!(web6.contains(':'), "web has an IPv6 address: {web6:?}");
    each_runtime(|d| {
        let c = d.start("inspect6", &["--network", &net.name], &["sleep", "600"]);
        let want = c.inspect(&format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").GlobalIPv6Address}}}}",
            net.name
        ));
        let gw = c.inspect(&format!(
            "{{{{(index .NetworkSettings.Networks \"{}\").IPv6Gateway}}}}",
            net.name
        ));
        let text = c
            .exec(
                &[],
                &[
                    "sh",
                    "-c",
                    &format!(
                        "ip -6 -o addr show eth0 scope global; ip -6 route; \
                         wget -q -O - 'http://[{web6}]/index.html'"
                    ),
                ],
            )
            .ok()
            .out()
            .to_string();
        let name = d.runtime.docker_name();
        assert!(
            text.contains(&format!("inet6 {want}/64")),
            "{name}: {want} in\n{text}"
        );
        assert!(
            text.contains(&format!("default via {gw} dev eth0")),
            "{name}: default via {gw} in\n{text}"
        );
        assert!(
            text.contains("hello-from-the-container"),
            "{name}: web over IPv6 in\n{text}"
        );
    });
}

#[test]
fn network_none_has_loopback_only() {
    let _ = require!(docker());
    each_runtime(|d| {
        let out = d
            .run_rm(&["--network", "none"], &["ls", "/sys/class/net"])
            .ok();
        assert_eq!(out.out(), "lo", "{}", d.runtime.docker_name());
    });
}

#[test]
fn network_host_is_refused_by_the_microvm_tier() {
    let _ = require!(docker());
    if let Some(why) = common::guest::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let d = docker_with(Runtime::AgentvmDefault).expect("docker");
    let out = d.run_rm(&["--network", "host"], &["true"]);
    assert!(!out.success(), "{out}");
    assert!(
        out.stderr.contains("host's network"),
        "the error names the cause:\n{out}"
    );
}

/// The policy runtimes of each tier that can run here: (the tier's plain
/// runtime, its runtime with `suffix` — `offline`, `only-web`).
fn policy_runtimes(suffix: &str) -> Vec<(Docker, Docker)> {
    let mut out = vec![(
        docker_with(Runtime::AgentvmContainer).expect("docker"),
        Docker {
            runtime: Runtime::Peer(format!("agentvm-container-{suffix}")),
        },
    )];
    match common::guest::unavailable() {
        Some(why) => eprintln!("skipped: microvm: {why}"),
        None => out.push((
            docker_with(Runtime::AgentvmDefault).expect("docker"),
            Docker {
                runtime: Runtime::Peer(format!("agentvm-{suffix}")),
            },
        )),
    }
    out
}

/// `--egress deny` through Docker's `runtimeArgs` (an `agentvm-offline`
/// runtime, `agentvm-container-offline` in the container tier): nothing
/// leaves the sandbox, while its published port still serves (replies to
/// connections from outside pass).
#[test]
fn an_offline_runtime_serves_its_port_but_reaches_nothing() {
    let base = require!(docker());
    let gateway = base.bridge_gateway();
    let listener = TcpListener::bind((gateway.as_str(), 0)).expect("listen on the bridge");
    let port = listener.local_addr().expect("addr").port();
    std::thread::spawn(move || {
        for mut s in listener.incoming().flatten() {
            let mut buf = [0u8; 1024];
            let _ = s.read(&mut buf);
            let _ = s.write_all(b"HTTP/1.0 200 OK\r\n\r\nfrom-the-host\n");
        }
    });
    let url = format!("http://{gateway}:{port}/");
    for (online, offline) in policy_runtimes("offline") {
        eprintln!("-- {}", offline.runtime.docker_name());
        let out = online.run_rm(&[], &["wget", "-q", "-O", "-", &url]).ok();
        assert_eq!(out.out(), "from-the-host");

        let out = offline.run_rm(&[], &["wget", "-q", "-O", "-", &url]);
        assert!(
            !out.success(),
            "the offline sandbox reached the host: {out}"
        );

        let c = offline.start("offline", &["-p", "127.0.0.1::80"], &["sh", "-c", HTTPD]);
        c.wait_for_log("serving");
        let hport = c.inspect("{{(index (index .NetworkSettings.Ports \"80/tcp\") 0).HostPort}}");
        let addr = format!("127.0.0.1:{hport}");
        let body = wait_for(30, || {
            http_get(&addr, "/index.html")
                .ok()
                .filter(|b| !b.is_empty())
        });
        assert_eq!(
            body.as_deref().map(String::from_utf8_lossy).as_deref(),
            Some("hello-from-the-container\n"),
            "the published port of an offline sandbox serves"
        );
    }
}

/// A policy naming a container by its network alias: the sandbox resolves
/// and reaches it through Docker's embedded DNS, and nothing else by name,
/// in both tiers.
#[test]
fn a_policy_by_name_reaches_only_that_container() {
    let base = require!(docker());
    let net = Network::create(base, "egress-names", &[]);
    let runc = docker_with(Runtime::Peer("runc".into())).expect("docker");
    let web = runc.start(
        "web",
        &["--network", &net.name, "--network-alias", "web"],
        &["sh", "-c", HTTPD],
    );
    web.wait_for_log("serving");
    let other = runc.start(
        "other",
        &["--network", &net.name, "--network-alias", "other"],
        &["sh", "-c", HTTPD],
    );
    other.wait_for_log("serving");
    let other_ip = other.inspect("{{range .NetworkSettings.Networks}}{{.IPAddress}}{{end}}");
    for (_, sandbox) in policy_runtimes("only-web") {
        eprintln!("-- {}", sandbox.runtime.docker_name());
        // Root with `--cap-add NET_ADMIN` takes another address of the
        // network (the microVM's guest and the container tier's own
        // namespace are its to change): still nothing but `web`.
        let out = sandbox
            .run_rm(
                &["--network", &net.name, "--cap-add", "NET_ADMIN"],
                &[
                    "sh",
                    "-c",
                    &format!(
                        "wget -q -O - http://web/index.html; \
                         gw=$(ip route | awk '/default/ {{print $3}}'); \
                         ip addr flush dev eth0; ip addr add {spoof}/24 dev eth0; \
                         ip route add default via $gw; \
                         timeout -s KILL 10 wget -q -O - http://{other_ip}/index.html \
                           && echo other-reached || echo other-refused",
                        spoof = spoof_of(&other_ip),
                    ),
                ],
            )
            .ok();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines,
            vec!["hello-from-the-container", "other-refused"],
            "{out}"
        );
        let out = sandbox
            .run_rm(
                &["--network", &net.name],
                &[
                    "sh",
                    "-c",
                    "wget -q -O - http://web/index.html; \
                     wget -q -O - http://other/index.html && echo other-reached || echo other-refused; \
                     nslookup -type=a other 127.0.0.11 >/dev/null 2>&1 && echo other-resolved || echo other-unresolved",
                ],
            )
            .ok();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines,
            vec![
                "hello-from-the-container",
                "other-refused",
                "other-unresolved"
            ],
            "{out}"
        );
    }
}

/// The same policy (`web:80`) on a dual-stack network, over IPv6: the
/// sandbox resolves `web`'s AAAA through Docker's embedded DNS and reaches
/// it at that address; another container's IPv6 address, never resolved
/// from an allowed name, is refused — in both tiers.
#[test]
fn a_policy_by_name_holds_over_ipv6() {
    let base = require!(docker());
    let net = Network::create(
        base,
        "egress-v6",
        &[
            "--ipv6",
            "--subnet",
            "172.31.232.0/24",
            "--subnet",
            "fd00:db8:232::/64",
        ],
    );
    let runc = docker_with(Runtime::Peer("runc".into())).expect("docker");
    let six = format!(
        "{{{{(index .NetworkSettings.Networks \"{}\").GlobalIPv6Address}}}}",
        net.name
    );
    let web = runc.start(
        "web",
        &["--network", &net.name, "--network-alias", "web"],
        &["sh", "-c", HTTPD],
    );
    web.wait_for_log("serving");
    let other = runc.start("other", &["--network", &net.name], &["sh", "-c", HTTPD]);
    other.wait_for_log("serving");
    let (web6, other6) = (web.inspect(&six), other.inspect(&six));
    assert!(
        web6.contains(':') && other6.contains(':'),
        "{web6:?} {other6:?}"
    );
    for (_, sandbox) in policy_runtimes("only-web") {
        eprintln!("-- {}", sandbox.runtime.docker_name());
        let out = sandbox
            .run_rm(
                &["--network", &net.name],
                &[
                    "sh",
                    "-c",
                    &format!(
                        "a=$(nslookup -type=aaaa web 127.0.0.11 | awk '/^Address: / {{print $2}}' | tail -n 1); \
                         echo \"web6 $a\"; \
                         timeout -s KILL 10 wget -q -O - \"http://[$a]/index.html\"; \
                         timeout -s KILL 10 wget -q -O - 'http://[{other6}]/index.html' \
                           && echo other6-reached || echo other6-refused"
                    ),
                ],
            )
            .ok();
        let lines: Vec<&str> = out.stdout.lines().collect();
        assert_eq!(
            lines,
            vec![
                format!("web6 {web6}").as_str(),
                "hello-from-the-container",
                "other6-refused"
            ],
            "{out}"
        );
    }
}

/// An unused address in the /24 of `ip` (its last byte + 100, mod 250).
fn spoof_of(ip: &str) -> String {
    let mut parts: Vec<u32> = ip.split('.').filter_map(|p| p.parse().ok()).collect();
    assert_eq!(parts.len(), 4, "an IPv4 address: {ip}");
    parts[3] = (parts[3] + 100) % 250 + 2;
    parts
        .iter()
        .map(|p| p.to_string())
        .collect::<Vec<_>>()
        .join(".")
}
