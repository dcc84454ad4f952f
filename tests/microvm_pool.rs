//! The warm pool of booted microVMs (`microvm.pool`, `src/microvm/pool.rs`):
//! a container that fits takes a VM booted before it (no kernel boot in its
//! trace), never one another container used; one that does not fit boots
//! its own; the pool refills; a keeper hands its VM to the process that
//! claimed it and to no one else; a VM is warmed up before it waits and
//! keeps nothing of the warm-up; `pool drain` leaves nothing behind.
//!
//! Needs what tests/microvm.rs needs; the pool is QEMU's only, so under the
//! builtin VMM each test says `skipped`.

use agentvm_test_support as common;
use common::require;

use std::path::{Path, PathBuf};

use common::bundle::{assert_nothing_left, processes_with, Fixture};
use common::wait_for;

/// A microvm fixture whose config keeps a pool of one VM, with a host
/// directory mounted at /out in the guest.
fn pooled() -> Result<Fixture, String> {
    if common::guest::builtin() {
        return Err("the pool boots VMs with the qemu backend only (vmm = builtin)".into());
    }
    let f = common::guest::microvm_fixture("pool = 1\n")?;
    std::fs::create_dir(out_dir(&f)).map_err(|e| format!("out dir: {e}"))?;
    Ok(f)
}

/// Drains the fixture's pool when dropped, so that a test that fails
/// part-way leaves no VM booted behind it.
struct Drain<'a>(&'a Fixture);

impl Drop for Drain<'_> {
    fn drop(&mut self) {
        let _ = self.0.agentvm(&["pool", "drain"]);
    }
}

fn out_dir(f: &Fixture) -> PathBuf {
    f.dir.path().join("out")
}

fn pool_dir(f: &Fixture) -> PathBuf {
    f.root().join(".~pool")
}

/// A bundle running `script` with the out directory at /out, and
/// `resources` as linux.resources when given.
fn write_script(f: &Fixture, script: &str, resources: Option<serde_json::Value>) {
    write_script_with(f, script, |c| {
        if let Some(r) = resources {
            c["linux"]["resources"] = r;
        }
    });
}

/// A bundle running `script` with the out directory at /out, its config
/// then changed by `edit`.
fn write_script_with(f: &Fixture, script: &str, edit: impl FnOnce(&mut serde_json::Value)) {
    let out = out_dir(f);
    f.write_config(&["sh", "-c", script], |c| {
        c["mounts"]
            .as_array_mut()
            .expect("mounts")
            .push(serde_json::json!({
                "destination": "/out", "type": "bind",
                "source": out, "options": ["rbind", "rw"]
            }));
        edit(c);
    });
}

/// `pool list` as (slot, pid, state) rows.
fn slots(f: &Fixture) -> Vec<(String, i32, String)> {
    let out = f.agentvm(&["pool", "list"]).ok();
    out.stdout
        .lines()
        .skip(1)
        .filter_map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            Some((
                cols.first()?.to_string(),
                cols.get(1)?.parse().ok()?,
                cols.get(2)?.to_string(),
            ))
        })
        .collect()
}

/// Waits until the pool holds one ready VM; returns its slot and keeper.
#[track_caller]
fn ready_slot(f: &Fixture) -> (String, i32) {
    wait_for(120, || {
        let s = slots(f);
        match s.as_slice() {
            [(slot, pid, state)] if state == "ready" => Some((slot.clone(), *pid)),
            _ => None,
        }
    })
    .unwrap_or_else(|| panic!("the pool never held one ready VM: {:?}", slots(f)))
}

fn fill(f: &Fixture) -> (String, i32) {
    let out = f.agentvm(&["pool", "fill", "--wait"]);
    assert_eq!(out.code, 0, "{out}");
    ready_slot(f)
}

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
        && !std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .unwrap_or_default()
            .contains(") Z ")
}

/// Runs `id` to its end with create/start, returns its exit status and
/// boot trace, and deletes it.
fn run_to_end(f: &Fixture, id: &str) -> (i64, Vec<String>) {
    let out = f.create(id);
    assert_eq!(out.code, 0, "{out}");
    let parts = f.boot_parts(id);
    let out = f.agentvm(&["start", id]);
    assert_eq!(out.code, 0, "{out}");
    let status = wait_for(60, || {
        let s = f.state(id);
        (s["status"] == "stopped").then_some(())
    });
    assert!(status.is_some(), "{id} never stopped: {}", f.state(id));
    let text = std::fs::read(f.root().join(id).join("microvm.json")).expect("microvm.json");
    let state: serde_json::Value = serde_json::from_slice(&text).expect("json");
    let code = state["exit_status"].as_i64().expect("exit status");
    let out = f.agentvm(&["delete", id]);
    assert_eq!(out.code, 0, "{out}");
    (code, parts)
}

fn drain_and_check(f: &Fixture, ids: &[&str]) {
    let out = f.agentvm(&["pool", "drain"]);
    assert_eq!(out.code, 0, "{out}");
    assert!(!pool_dir(f).exists(), "pool directory left");
    let root = f.root().display().to_string();
    assert_eq!(
        processes_with(&root),
        Vec::<String>::new(),
        "keeper or VM left"
    );
    for id in ids {
        assert_nothing_left(f, id);
    }
}

#[test]
fn a_container_takes_a_booted_vm_never_one_used_before_and_the_pool_refills() {
    let f = require!(pooled());
    let _drain = Drain(&f);
    let (slot, keeper) = fill(&f);
    write_script(
        &f,
        "cat /proc/sys/kernel/random/boot_id > /out/boot; ls / > /out/root; exit 3",
        None,
    );
    let (code, parts) = run_to_end(&f, "pool-a");
    assert_eq!(code, 3, "the workload's exit status");
    assert!(parts.contains(&"pool".to_string()), "{parts:?}");
    assert!(
        !parts.contains(&"kernel".to_string()),
        "the kernel booted for the container: {parts:?}"
    );
    let root = std::fs::read_to_string(out_dir(&f).join("root")).expect("root listing");
    assert!(
        root.lines().any(|l| l == "bin"),
        "not the bundle's rootfs: {root}"
    );
    // The VM went with its container, and its keeper with it.
    assert!(
        wait_for(10, || (!alive(keeper)).then_some(())).is_some(),
        "the keeper of the VM outlived its container"
    );
    // `create` started another VM for the next container.
    let (slot2, _) = ready_slot(&f);
    assert_ne!(slot2, slot, "the used VM came back to the pool");
    let first = std::fs::read_to_string(out_dir(&f).join("boot")).expect("first boot id");
    let (code, parts) = run_to_end(&f, "pool-b");
    assert_eq!(code, 3);
    assert!(parts.contains(&"pool".to_string()), "{parts:?}");
    let second = std::fs::read_to_string(out_dir(&f).join("boot")).expect("second boot id");
    assert_ne!(first, second, "two containers ran in the same VM");
    assert_ne!(first.trim(), common::host_boot_id(), "the host's kernel");
    drain_and_check(&f, &["pool-a", "pool-b"]);
}

#[test]
fn a_pooled_vm_is_warmed_up_and_keeps_nothing_of_the_warm_up() {
    let f = require!(pooled());
    let _drain = Drain(&f);
    let (slot, _) = fill(&f);
    // The keeper had the guest create and delete a throwaway container
    // before it marked the slot ready (guest::warm): the guest said how
    // long that took, and the keeper did not have to go on unwarmed.
    let slot_dir = pool_dir(&f).join(&slot);
    let console = std::fs::read_to_string(slot_dir.join("console.log")).unwrap_or_default();
    assert!(console.contains("warm-up: "), "no warm-up: {console}");
    let keeper_log = std::fs::read_to_string(slot_dir.join("keeper.log")).unwrap_or_default();
    assert!(!keeper_log.contains("unwarmed"), "{keeper_log}");
    // Without a pid namespace of its own the container sees every process
    // of the guest: the agent (pid 1), kernel threads (children of pid 2)
    // and its own shell, which reads /proc with builtins only; nothing
    // left of the warm-up's container, and no zombie.
    let script = "for p in /proc/[0-9]*; do read -r s < $p/stat && echo \"$s\"; done > /out/ps";
    write_script_with(&f, script, |c| {
        c["linux"]["namespaces"]
            .as_array_mut()
            .expect("namespaces")
            .retain(|n| n["type"] != "pid");
    });
    let (code, parts) = run_to_end(&f, "pool-warm");
    assert_eq!(code, 0);
    assert!(parts.contains(&"pool".to_string()), "{parts:?}");
    let ps = std::fs::read_to_string(out_dir(&f).join("ps")).expect("process list");
    // "PID (COMM) STATE PPID ...", COMM up to the last ')'.
    let rows: Vec<(u32, &str, &str, u32)> = ps
        .lines()
        .filter_map(|l| {
            let (pid, rest) = l.split_once(" (")?;
            let (comm, rest) = rest.rsplit_once(") ")?;
            let mut cols = rest.split(' ');
            Some((
                pid.parse().ok()?,
                comm,
                cols.next()?,
                cols.next()?.parse().ok()?,
            ))
        })
        .collect();
    assert!(rows.iter().any(|r| r.0 == 1), "no pid 1 in\n{ps}");
    assert!(
        rows.iter().any(|r| r.1 == "sh"),
        "no shell of the container in\n{ps}"
    );
    let left: Vec<_> = rows
        .iter()
        .filter(|&&(pid, comm, state, ppid)| {
            let kernel = pid == 2 || ppid == 2;
            state == "Z" || (pid != 1 && !kernel && comm != "sh")
        })
        .collect();
    assert!(left.is_empty(), "left of the warm-up: {left:?} in\n{ps}");
    drain_and_check(&f, &["pool-warm"]);
}

/// The nice values of every thread of `pid` and its descendants.
fn nice_values(pid: i32) -> Vec<(String, i64)> {
    let mut all = Vec::new();
    for p in common::cmd::descendants(pid as u32) {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{p}/task")) else {
            continue;
        };
        for t in tasks.flatten() {
            let stat = std::fs::read_to_string(t.path().join("stat")).unwrap_or_default();
            let Some((head, rest)) = stat.rsplit_once(')') else {
                continue;
            };
            // Field 19 is the nice value; fields after the name start at 3.
            if let Some(nice) = rest.split_whitespace().nth(16).and_then(|n| n.parse().ok()) {
                let comm = head.split_once('(').map_or("", |(_, c)| c);
                all.push((comm.to_string(), nice));
            }
        }
    }
    all
}

/// A pool boots in the background: its keeper, QEMU and virtiofsd wait at
/// nice 19, so that a refill never takes the CPU from running containers;
/// the VM a container takes runs, every thread of it, at the priority of
/// the container's supervisor.
#[test]
fn a_pooled_vm_boots_at_low_priority_and_runs_at_its_container_s() {
    let f = require!(pooled());
    let _drain = Drain(&f);
    let (_slot, keeper) = fill(&f);
    let waiting = nice_values(keeper);
    assert!(
        waiting.iter().any(|(c, _)| c.starts_with("qemu")),
        "{waiting:?}"
    );
    assert!(waiting.iter().all(|(_, n)| *n == 19), "{waiting:?}");
    write_script(&f, "sleep 1000", None);
    let out = f.create("pool-nice");
    assert_eq!(out.code, 0, "{out}");
    assert!(f.boot_parts("pool-nice").contains(&"pool".to_string()));
    let supervisor = f.state("pool-nice")["pid"].as_i64().expect("pid") as i32;
    let ours = nice_values(supervisor)
        .first()
        .map(|(_, n)| *n)
        .expect("the supervisor's nice value");
    let taken = nice_values(keeper);
    assert!(
        taken.iter().any(|(c, _)| c.starts_with("qemu")),
        "{taken:?}"
    );
    assert!(taken.iter().all(|(_, n)| *n == ours), "{taken:?}");
    let out = f.agentvm(&["delete", "--force", "pool-nice"]);
    assert_eq!(out.code, 0, "{out}");
    drain_and_check(&f, &["pool-nice"]);
}

#[test]
fn a_container_that_does_not_fit_boots_its_own_vm_and_leaves_the_pool_alone() {
    let f = require!(pooled());
    let _drain = Drain(&f);
    let (slot, keeper) = fill(&f);
    // A memory limit sizes the VM: not the pool's size.
    write_script(
        &f,
        "exit 0",
        Some(serde_json::json!({"memory": {"limit": 200_000_000}})),
    );
    let (code, parts) = run_to_end(&f, "pool-fit");
    assert_eq!(code, 0);
    assert!(parts.contains(&"kernel".to_string()), "{parts:?}");
    assert!(!parts.contains(&"pool".to_string()), "{parts:?}");
    assert_eq!(ready_slot(&f), (slot, keeper), "the pool's VM was touched");
    drain_and_check(&f, &["pool-fit"]);
}

/// What the keeper of `slot` answers a connection from this process, or
/// from uid 65534 with `nobody`: the bytes and descriptors it sent.
fn ask_keeper(f: &Fixture, slot: &str, nobody: bool) -> Result<(usize, usize), String> {
    let path = pool_dir(f).join(slot).join("keeper.sock");
    let path = std::ffi::CString::new(path.to_str().expect("utf-8")).expect("path");
    let (r, w) = nix::unistd::pipe().map_err(|e| e.to_string())?;
    // SAFETY: the child makes system calls only (no allocation) and exits.
    let pid = unsafe { libc::fork() };
    if pid == 0 {
        use std::os::fd::AsRawFd;
        // SAFETY: raw system calls on memory this frame owns.
        unsafe {
            if nobody && (libc::setgid(65534) != 0 || libc::setuid(65534) != 0) {
                libc::_exit(10);
            }
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let mut addr: libc::sockaddr_un = std::mem::zeroed();
            addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
            let bytes = path.as_bytes_with_nul();
            if bytes.len() > addr.sun_path.len() {
                libc::_exit(11);
            }
            for (i, b) in bytes.iter().enumerate() {
                addr.sun_path[i] = *b as libc::c_char;
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(s, &addr as *const _ as *const libc::sockaddr, len) != 0 {
                libc::_exit(12);
            }
            let ask = b"adopt\n";
            libc::write(s, ask.as_ptr() as *const libc::c_void, ask.len());
            let mut buf = [0u8; 4096];
            let mut cbuf = [0u8; 256];
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr() as *mut libc::c_void,
                iov_len: buf.len(),
            };
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cbuf.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = cbuf.len();
            let n = libc::recvmsg(s, &mut msg, 0);
            let c = if n > 0 {
                libc::CMSG_FIRSTHDR(&msg)
            } else {
                std::ptr::null_mut()
            };
            let fds = if c.is_null() || ((*c).cmsg_len as usize) < libc::CMSG_LEN(0) as usize {
                0
            } else {
                ((*c).cmsg_len as usize - libc::CMSG_LEN(0) as usize) / 4
            };
            let report = [n.max(0) as u32, fds as u32];
            libc::write(
                w.as_raw_fd(),
                report.as_ptr() as *const libc::c_void,
                std::mem::size_of_val(&report),
            );
            libc::_exit(0);
        }
    }
    drop(w);
    let mut status = 0;
    // SAFETY: waitpid on the child just forked.
    unsafe { libc::waitpid(pid, &mut status, 0) };
    let code = libc::WEXITSTATUS(status);
    if code != 0 {
        return Err(format!("the client exited {code}"));
    }
    let mut report = [0u8; 8];
    let mut file = std::fs::File::from(r);
    std::io::Read::read_exact(&mut file, &mut report).map_err(|e| e.to_string())?;
    let n = u32::from_ne_bytes(report[..4].try_into().expect("4 bytes")) as usize;
    let fds = u32::from_ne_bytes(report[4..].try_into().expect("4 bytes")) as usize;
    Ok((n, fds))
}

#[test]
fn a_keeper_hands_its_vm_only_to_the_root_process_that_claimed_it() {
    let f = require!(pooled());
    let _drain = Drain(&f);
    let (slot, keeper) = fill(&f);
    // Another user cannot even connect (the socket is root's, 0755).
    match ask_keeper(&f, &slot, true) {
        Err(e) => assert_eq!(e, "the client exited 12", "uid 65534"),
        Ok(got) => assert_eq!(got, (0, 0), "uid 65534 got the VM"),
    }
    // Root without claiming the slot first gets nothing either.
    assert_eq!(ask_keeper(&f, &slot, false), Ok((0, 0)), "unclaimed");
    // The VM still waits, untouched, and a container takes it.
    assert_eq!(ready_slot(&f), (slot.clone(), keeper));
    write_script(&f, "exit 5", None);
    let (code, parts) = run_to_end(&f, "pool-after");
    assert_eq!(code, 5);
    assert!(parts.contains(&"pool".to_string()), "{parts:?}");
    drain_and_check(&f, &["pool-after"]);
}

#[test]
fn a_pooled_vm_that_dies_while_it_waits_leaves_the_pool_and_is_replaced() {
    let f = require!(pooled());
    let _drain = Drain(&f);
    let (slot, keeper) = fill(&f);
    let qemu = common::bundle::children_of(keeper)
        .iter()
        .find(|p| p.contains("qemu-system"))
        .and_then(|p| p.split(':').next()?.parse::<i32>().ok())
        .expect("the keeper's QEMU");
    // SAFETY: kill(2) on the pid just looked up.
    assert_eq!(unsafe { libc::kill(qemu, libc::SIGKILL) }, 0);
    assert!(
        wait_for(20, || (!pool_dir(&f).join(&slot).exists()).then_some(())).is_some(),
        "the dead VM's slot stayed: {:?}",
        slots(&f)
    );
    assert!(!alive(keeper), "its keeper stayed");
    let (slot2, _) = fill(&f);
    assert_ne!(slot2, slot);
    drain_and_check(&f, &[]);
}

#[test]
fn pool_commands_say_what_is_wrong() {
    let f = require!(common::guest::microvm_fixture(""));
    let out = f.agentvm(&["pool", "fill"]);
    assert_eq!(out.code, 1, "{out}");
    assert!(out.stderr.contains("microvm.pool"), "{out}");
    let out = f.agentvm(&["pool", "drain"]);
    assert_eq!(out.code, 0, "{out}");
    assert_eq!(f.leftovers(), Vec::<String>::new());
}

#[test]
fn a_pooled_vm_s_nic_becomes_the_container_s_network() {
    use common::netns::{ip_out, Netns, GUEST, PEER};
    let f = require!(pooled());
    let _drain = Drain(&f);
    if let Some(why) = common::host_unsuitable(&["ip"]) {
        eprintln!("skipped: {why}");
        return;
    }
    let (slot, _) = fill(&f);
    let ns = Netns::new("pool");
    let before = ns.snapshot();
    let path = ns.path();
    let out = out_dir(&f);
    f.write_config(
        &[
            "sh",
            "-c",
            "{ ip -4 -o addr show eth0; cat /sys/class/net/eth0/address; \
             ping -c 1 -W 5 10.231.0.1 >/dev/null && echo ping-ok; } > /out/net",
        ],
        |c| {
            for n in c["linux"]["namespaces"]
                .as_array_mut()
                .expect("namespaces")
                .iter_mut()
            {
                if n["type"] == "network" {
                    n["path"] = serde_json::json!(path);
                }
            }
            let caps = serde_json::json!(["CAP_NET_ADMIN", "CAP_NET_RAW"]);
            c["process"]["capabilities"] = serde_json::json!({
                "bounding": caps, "effective": caps, "permitted": caps
            });
            c["mounts"].as_array_mut().expect("mounts").extend([
                serde_json::json!({
                    "destination": "/out", "type": "bind",
                    "source": out, "options": ["rbind", "rw"]
                }),
                serde_json::json!({
                    "destination": "/sys", "type": "sysfs", "source": "sysfs",
                    "options": ["nosuid", "noexec", "nodev", "ro"]
                }),
            ]);
        },
    );
    let (code, parts) = run_to_end(&f, "pool-net");
    assert_eq!(code, 0);
    assert!(parts.contains(&"pool".to_string()), "{parts:?}");
    let net = std::fs::read_to_string(out_dir(&f).join("net")).expect("net");
    assert!(net.contains(&format!("inet {GUEST}/24")), "{net}");
    let guest_mac = net.lines().nth(1).unwrap_or_default().to_string();
    let ns_mac = ip_out(&["-n", &ns.container, "-o", "link", "show", "eth0"]);
    assert!(
        !guest_mac.is_empty() && ns_mac.contains(&guest_mac),
        "the guest's MAC {guest_mac} is the namespace interface's: {ns_mac}"
    );
    assert!(net.contains("ping-ok"), "{net} (peer {PEER})");
    // The pooled VM's tap went with it.
    assert_eq!(ns.snapshot(), before, "the namespace is as it was");
    assert_ne!(ready_slot(&f).0, slot);
    drain_and_check(&f, &["pool-net"]);
}

/// Docker's network hook fills the container's namespace after the pooled
/// VM was taken (its tap waiting in the namespace), and the VM's NIC still
/// becomes the container's interface.
#[test]
fn a_pooled_vm_is_taken_before_docker_s_network_hook_runs() {
    use common::netns::{ip_out, Netns, GUEST, PEER};
    let f = require!(pooled());
    let _drain = Drain(&f);
    if let Some(why) = common::host_unsuitable(&["ip", "nsenter"]) {
        eprintln!("skipped: {why}");
        return;
    }
    fill(&f);
    let ns = Netns::new("pook");
    let hook = ns.docker_like_hook(f.dir.path(), false, false);
    let out = out_dir(&f);
    f.write_config(
        &[
            "sh",
            "-c",
            "{ ip -4 -o addr show eth0; cat /sys/class/net/eth0/address; \
             ping -c 1 -W 5 10.231.0.1 >/dev/null && echo ping-ok; } > /out/net",
        ],
        |c| {
            c["hooks"] = serde_json::json!({"prestart": [hook]});
            c["mounts"].as_array_mut().expect("mounts").extend([
                serde_json::json!({
                    "destination": "/out", "type": "bind",
                    "source": out, "options": ["rbind", "rw"]
                }),
                serde_json::json!({
                    "destination": "/sys", "type": "sysfs", "source": "sysfs",
                    "options": ["nosuid", "noexec", "nodev", "ro"]
                }),
            ]);
        },
    );
    let ns_mac = ip_out(&["-n", &ns.container, "-o", "link", "show", "eth0"]);
    let (code, parts) = run_to_end(&f, "pool-hook");
    assert_eq!(code, 0);
    let at = |p: &str| parts.iter().position(|x| x == p);
    assert!(
        at("pool").is_some() && at("pool") < at("hooks"),
        "the pooled VM was not taken before the hook: {parts:?}"
    );
    let net = std::fs::read_to_string(out_dir(&f).join("net")).expect("net");
    assert!(net.contains(&format!("inet {GUEST}/24")), "{net}");
    let guest_mac = net.lines().nth(1).unwrap_or_default().to_string();
    assert!(
        !guest_mac.is_empty() && ns_mac.contains(&guest_mac),
        "the guest's MAC {guest_mac} is the veth's: {ns_mac}"
    );
    assert!(net.contains("ping-ok"), "{net} (peer {PEER})");
    drain_and_check(&f, &["pool-hook"]);
}

#[test]
fn with_a_memory_ceiling_one_pooled_vm_serves_any_limit_below_it() {
    if common::guest::builtin() {
        eprintln!("skipped: the pool boots VMs with the qemu backend only (vmm = builtin)");
        return;
    }
    let f = require!(common::guest::microvm_fixture(
        "pool = 1\nmemory_ceiling_mib = 1024\n"
    ));
    let _drain = Drain(&f);
    fill(&f);
    let id = "pool-limit";
    f.write_config(&["sleep", "1000"], |c| {
        c["linux"]["resources"]["memory"] = serde_json::json!({"limit": 100u64 << 20});
        c["mounts"].as_array_mut().expect("mounts").extend([
            serde_json::json!({
                "destination": "/sys", "type": "sysfs", "source": "sysfs",
                "options": ["nosuid", "noexec", "nodev", "ro"]
            }),
            serde_json::json!({
                "destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]
            }),
        ]);
    });
    let out = f.create(id);
    assert_eq!(out.code, 0, "{out}");
    assert!(f.boot_parts(id).contains(&"pool".to_string()));
    f.agentvm(&["start", id]).ok();
    // The balloon leaves the guest what its limit needs (+ 64 MiB), and
    // update moves it, as in a VM booted for the container.
    assert_eq!(
        common::guest::wait_for_guest_ram(&f, id, 164).1,
        (100u64 << 20).to_string()
    );
    f.agentvm(&["update", "--memory", "600m", id]).ok();
    assert_eq!(
        common::guest::wait_for_guest_ram(&f, id, 664).1,
        (600u64 << 20).to_string()
    );
    f.agentvm(&["delete", "--force", id]).ok();
    drain_and_check(&f, &[id]);
}
