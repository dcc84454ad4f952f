//! Pods through containerd's CRI, as the kubelet runs them: RunPodSandbox,
//! CreateContainer/StartContainer, ExecSync, ContainerStatus, the CRI log
//! files, StopContainer/RemoveContainer and StopPodSandbox/RemovePodSandbox
//! against a containerd of the tests with its CRI plugin on and a CNI
//! bridge (tests/support/src/cri.rs). Each case runs with containerd's runc
//! shim (the reference) and with agentvm's shim in the container tier, in
//! the same run.
//!
//! In the microvm tier a pod is one microVM (issue 11):
//! `a_pod_in_the_microvm_tier_is_one_vm` runs the same kinds of cases
//! against a pod whose containers share the sandbox's VM.
//!
//!     cargo build --release -p agentvm-shim
//!     cargo test --release --test cri -- --nocapture

use agentvm_test_support as common;
use common::cri::{
    cri, Cri, Pod, PodSpec, HANDLER_AGENTVM, HANDLER_AGENTVM_CONTAINER, HANDLER_RUNC,
};
use common::{require, unique_name, ISOLATION_ANNOTATION};

/// The runtimes each case runs with: a CRI runtime handler and the pod's
/// annotations.
const RUNTIMES: &[(&str, &[(&str, &str)])] = &[
    (HANDLER_RUNC, &[]),
    (HANDLER_AGENTVM, &[(ISOLATION_ANNOTATION, "container")]),
];

fn run_pod(c: &Cri, prefix: &str, handler: &str, annotations: &[(&str, &str)]) -> Pod {
    let name = unique_name(&format!("{prefix}-{handler}"));
    c.run_pod(&PodSpec {
        name: &name,
        handler,
        annotations,
    })
    .unwrap_or_else(|e| panic!("{handler}: {e}"))
}

/// The pids of `containerd-shim-agentvm-v2` processes started for any of
/// `ids` (containerd starts a shim with `-id <the first container's id>`;
/// the pod's others join it).
fn agentvm_shims_for(ids: &[&str]) -> Vec<String> {
    shims_for("containerd-shim-agentvm-v2", ids)
}

/// The pids of the processes of shim binary `binary` (by its file name)
/// started with `-id` one of `ids`.
fn shims_for(binary: &str, ids: &[&str]) -> Vec<String> {
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_shim = args.first().is_some_and(|a| a.ends_with(binary));
        let id = args
            .iter()
            .position(|a| a == "-id")
            .and_then(|i| args.get(i + 1));
        if is_shim && id.is_some_and(|id| ids.contains(&id.as_str())) {
            found.push(entry.file_name().to_string_lossy().into_owned());
        }
    }
    found
}

/// Removes the pod and checks that nothing of it is left: no container in
/// CRI's list, no process naming its id, no agentvm shim for it.
fn remove_and_check(c: &Cri, handler: &str, pod: &Pod, containers: &[&str]) {
    c.remove_pod(pod)
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
    let listed = c
        .containers_of(pod)
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
    assert!(listed.is_empty(), "{handler}: containers left: {listed:?}");
    let mut ids = vec![pod.id.as_str()];
    ids.extend_from_slice(containers);
    let left = common::wait_for(20, || {
        let shims = agentvm_shims_for(&ids);
        let procs: Vec<String> = ids
            .iter()
            .flat_map(|id| common::bundle::processes_with(id))
            .collect();
        (shims.is_empty() && procs.is_empty()).then_some(())
    });
    assert!(
        left.is_some(),
        "{handler}: processes left after RemovePodSandbox: shims {:?}, others {:?}",
        agentvm_shims_for(&ids),
        ids.iter()
            .flat_map(|id| common::bundle::processes_with(id))
            .collect::<Vec<_>>()
    );
}

#[test]
fn the_containers_of_a_pod_share_localhost_its_address_and_one_shim() {
    let c = require!(cri());
    for (handler, annotations) in RUNTIMES {
        let pod = run_pod(c, "pod-net", handler, annotations);
        let server = c
            .start_container(
                &pod,
                "server",
                &[
                    "sh",
                    "-c",
                    "mkdir -p /tmp/w && echo hello-from-the-pod > /tmp/w/index.html \
                     && exec httpd -f -p 8080 -h /tmp/w",
                ],
                &[],
            )
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        let client = c
            .start_container(&pod, "client", &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        let ip = c.pod_ip(&pod).unwrap_or_else(|e| panic!("{handler}: {e}"));
        assert!(ip.starts_with("10.244.77."), "{handler}: pod IP {ip}");
        // The server may still be starting: a few tries over localhost.
        let fetched = common::wait_for(20, || {
            let r = c
                .exec_sync(&client, &["wget", "-q", "-O-", "http://127.0.0.1:8080/"])
                .ok()?;
            (r.exit_code == 0).then_some(r)
        });
        let fetched = fetched.unwrap_or_else(|| {
            panic!("{handler}: the client never reached the server over localhost")
        });
        assert_eq!(fetched.stdout, "hello-from-the-pod\n", "{handler}");
        // The pod's address, from inside the pod and from the host.
        let url = format!("http://{ip}:8080/");
        let r = c.exec_sync(&client, &["wget", "-q", "-O-", &url]).unwrap();
        assert_eq!(
            (r.exit_code, r.stdout.as_str()),
            (0, "hello-from-the-pod\n"),
            "{handler}: {r:?}"
        );
        let host = common::cmd::run(
            std::process::Command::new("busybox").args(["wget", "-q", "-O-", &url]),
        );
        assert_eq!(host.stdout, "hello-from-the-pod\n", "{handler}: {host}");
        // One network namespace and one UTS namespace: the same hostname.
        let names: Vec<String> = [&server, &client]
            .iter()
            .map(|id| c.exec_sync(id, &["hostname"]).unwrap().stdout)
            .collect();
        assert_eq!(names[0], names[1], "{handler}");
        if *handler == HANDLER_AGENTVM {
            // One shim for the pod (grouped by the CRI sandbox id).
            let shims = agentvm_shims_for(&[&pod.id, &server, &client]);
            assert_eq!(shims.len(), 1, "agentvm shims for the pod: {shims:?}");
        }
        remove_and_check(c, handler, &pod, &[&server, &client]);
    }
}

#[test]
fn exec_sync_exit_codes_and_logs_in_cri_format() {
    let c = require!(cri());
    for (handler, annotations) in RUNTIMES {
        let pod = run_pod(c, "pod-exec", handler, annotations);
        let sleeper = c
            .start_container(&pod, "sleeper", &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        let r = c
            .exec_sync(
                &sleeper,
                &["sh", "-c", "echo to-out; echo to-err >&2; exit 3"],
            )
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        assert_eq!(
            (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
            (3, "to-out\n", "to-err\n"),
            "{handler}"
        );
        let r = c
            .exec_sync(&sleeper, &["sh", "-c", "echo $AGENTVM_TEST"])
            .unwrap();
        assert_eq!(r.stdout, "sleeper\n", "{handler}: the container's env");
        // A program that does not exist fails the exec itself (runc:
        // "executable file not found in $PATH"), not with an exit code.
        match c.exec_sync(&sleeper, &["no-such-program"]) {
            Err(e) => assert!(
                e.contains("no-such-program") && e.contains("not found"),
                "{handler}: {e}"
            ),
            Ok(r) => panic!("{handler}: exec of a missing program gave {r:?}"),
        }

        let failing = c
            .start_container(
                &pod,
                "failing",
                &["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7"],
                &[],
            )
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        let state = c
            .wait_exited(&failing, 60)
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        assert_eq!(state.exit_code, 7, "{handler}: {state:?}");
        assert_eq!(state.reason, "Error", "{handler}: {state:?}");
        // CRI's log format: "<RFC 3339 time> <stream> <P|F> <text>".
        let log = std::fs::read_to_string(pod.log_dir.join("failing.log"))
            .unwrap_or_else(|e| panic!("{handler}: no container log: {e}"));
        let mut lines: Vec<(String, String, String)> = log
            .lines()
            .map(|l| {
                let f: Vec<&str> = l.splitn(4, ' ').collect();
                assert_eq!(f.len(), 4, "{handler}: log line {l:?}");
                assert!(
                    f[0].contains('T') && f[0].len() >= 20,
                    "{handler}: time {:?}",
                    f[0]
                );
                (f[1].to_string(), f[2].to_string(), f[3].to_string())
            })
            .collect();
        lines.sort();
        assert_eq!(
            lines,
            vec![
                ("stderr".into(), "F".into(), "to-stderr".into()),
                ("stdout".into(), "F".into(), "to-stdout".into()),
            ],
            "{handler}: {log}"
        );
        remove_and_check(c, handler, &pod, &[&sleeper, &failing]);
    }
}

#[test]
fn removing_one_container_leaves_the_others_running() {
    let c = require!(cri());
    for (handler, annotations) in RUNTIMES {
        let pod = run_pod(c, "pod-rm", handler, annotations);
        let first = c
            .start_container(&pod, "first", &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        let second = c
            .start_container(&pod, "second", &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        c.remove_container(&first)
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        assert_eq!(c.containers_of(&pod).unwrap(), vec![second.clone()]);
        let gone = common::wait_for(10, || {
            common::bundle::processes_with(&first)
                .is_empty()
                .then_some(())
        });
        assert!(
            gone.is_some(),
            "{handler}: the removed container's processes are left"
        );
        let r = c
            .exec_sync(&second, &["echo", "still-here"])
            .unwrap_or_else(|e| panic!("{handler}: {e}"));
        assert_eq!(
            (r.exit_code, r.stdout.as_str()),
            (0, "still-here\n"),
            "{handler}"
        );
        let state = c.container_state(&second).unwrap();
        assert_eq!(state.state, "CONTAINER_RUNNING", "{handler}");
        remove_and_check(c, handler, &pod, &[&first, &second]);
    }
}

/// Mounts of this machine (the test's mount namespace, the host's) whose
/// line names any of `ids`.
fn mounts_naming(ids: &[&str]) -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .filter(|l| ids.iter().any(|id| l.contains(id)))
        .map(str::to_string)
        .collect()
}

/// The first process whose command line is agentvm's `supervise <id>`.
fn supervisor_of(id: &str) -> Option<i32> {
    common::bundle::processes_with(&format!("supervise {id}"))
        .iter()
        .filter(|p| !p.contains("containerd-shim"))
        .find_map(|p| p.split_whitespace().next()?.parse().ok())
}

/// The network interfaces of the namespace `ns` (a descriptor of this
/// process), by `ip -o link` in it.
fn links_in(ns: &std::fs::File) -> String {
    use std::os::fd::AsRawFd;
    let path = format!("/proc/{}/fd/{}", std::process::id(), ns.as_raw_fd());
    let out = common::cmd::run(
        std::process::Command::new("nsenter")
            .arg(format!("--net={path}"))
            .args(["ip", "-o", "link"]),
    );
    assert!(out.success(), "ip link in the pod's namespace: {out}");
    out.stdout
}

/// In the microvm tier a pod is one microVM: the sandbox boots it and the
/// pod's other containers run inside it (issue 11). Two containers talk
/// over `localhost` and see the same guest kernel (not the host's);
/// ExecSync runs in each; a third container's exit code and its CRI log;
/// removing one container leaves the other running; StopPodSandbox and
/// RemovePodSandbox leave no process, mount, tap or cgroup of the pod.
#[test]
fn a_pod_in_the_microvm_tier_is_one_vm() {
    if let Some(why) = common::guest::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let c = require!(cri());
    let handler = HANDLER_AGENTVM;
    let pod = run_pod(c, "pod-vm", handler, &[(ISOLATION_ANNOTATION, "microvm")]);
    let server = c
        .start_container(
            &pod,
            "server",
            &[
                "sh",
                "-c",
                "mkdir -p /tmp/w && echo hello-from-the-vm > /tmp/w/index.html \
                 && exec httpd -f -p 8080 -h /tmp/w",
            ],
            &[],
        )
        .unwrap_or_else(|e| panic!("server: {e}"));
    let client = c
        .start_container(&pod, "client", &["sleep", "1000"], &[])
        .unwrap_or_else(|e| panic!("client: {e}"));
    // One VM: the pod's sandbox has a supervisor, its containers do not
    // (each has a relay into the sandbox's VM), and one shim serves them.
    let sandbox_supervisor = supervisor_of(&pod.id)
        .unwrap_or_else(|| panic!("no supervisor for the pod's sandbox {}", pod.id));
    let shims = agentvm_shims_for(&[&pod.id, &server, &client]);
    assert_eq!(shims.len(), 1, "agentvm shims for the pod: {shims:?}");
    let qemus = common::bundle::processes_with("qemu-system-x86_64");
    let ours: Vec<&String> = qemus
        .iter()
        .filter(|p| {
            [&pod.id, &server, &client]
                .iter()
                .any(|id| p.contains(id.as_str()))
        })
        .collect();
    assert_eq!(ours.len(), 1, "one VM for the pod: {ours:?}");
    assert!(
        ours[0].contains(&pod.id),
        "the VM is the sandbox's: {ours:?}"
    );
    // The pod's network namespace, held so its taps can be looked at after
    // the pod is gone.
    let netns = std::fs::File::open(format!("/proc/{sandbox_supervisor}/ns/net"))
        .expect("the pod's network namespace");
    assert!(
        links_in(&netns).contains("avtap"),
        "the VM's tap in the pod's namespace"
    );

    // localhost joins the two containers: one kernel, one network.
    let fetched = common::wait_for(30, || {
        let r = c
            .exec_sync(&client, &["wget", "-q", "-O-", "http://127.0.0.1:8080/"])
            .ok()?;
        (r.exit_code == 0).then_some(r)
    })
    .expect("the client never reached the server over localhost");
    assert_eq!(fetched.stdout, "hello-from-the-vm\n");
    let host_version = std::fs::read_to_string("/proc/version").expect("/proc/version");
    let versions: Vec<String> = [&server, &client]
        .iter()
        .map(|id| {
            let r = c
                .exec_sync(id, &["cat", "/proc/version"])
                .unwrap_or_else(|e| panic!("{id}: {e}"));
            assert_eq!(r.exit_code, 0, "{id}: {r:?}");
            r.stdout
        })
        .collect();
    assert_eq!(versions[0], versions[1], "one guest kernel for the pod");
    assert_ne!(
        versions[0], host_version,
        "the guest's kernel is not the host's"
    );
    // The pod's pid namespace, as CRI asks by default (NamespaceMode POD:
    // the pause process's, named by its host path): in the VM it is the
    // sandbox container's, whose init (the pause image's sleep) is 1, and
    // the client sees the server's httpd.
    for id in [&server, &client] {
        let r = c
            .exec_sync(id, &["cat", "/proc/1/comm"])
            .unwrap_or_else(|e| panic!("{id}: {e}"));
        assert_eq!(r.stdout.trim(), "sleep", "{id}: {r:?}");
    }
    let r = c
        .exec_sync(&client, &["sh", "-c", "cat /proc/[0-9]*/comm"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert!(r.stdout.lines().any(|l| l == "httpd"), "{r:?}");
    let r = c
        .exec_sync(
            &client,
            &["sh", "-c", "echo to-out; echo to-err >&2; exit 3"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        (r.exit_code, r.stdout.as_str(), r.stderr.as_str()),
        (3, "to-out\n", "to-err\n")
    );
    let r = c
        .exec_sync(&server, &["sh", "-c", "echo $AGENTVM_TEST"])
        .unwrap();
    assert_eq!(r.stdout, "server\n", "the server's own environment");

    // A container that exits: its code, and its output in CRI's log format.
    let failing = c
        .start_container(
            &pod,
            "failing",
            &["sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7"],
            &[],
        )
        .unwrap_or_else(|e| panic!("failing: {e}"));
    let state = c
        .wait_exited(&failing, 60)
        .unwrap_or_else(|e| panic!("failing: {e}"));
    assert_eq!(
        (state.exit_code, state.reason.as_str()),
        (7, "Error"),
        "{state:?}"
    );
    let log = std::fs::read_to_string(pod.log_dir.join("failing.log"))
        .unwrap_or_else(|e| panic!("no container log: {e}"));
    let mut lines: Vec<(String, String, String)> = log
        .lines()
        .map(|l| {
            let f: Vec<&str> = l.splitn(4, ' ').collect();
            assert_eq!(f.len(), 4, "log line {l:?}");
            assert!(f[0].contains('T') && f[0].len() >= 20, "time {:?}", f[0]);
            (f[1].to_string(), f[2].to_string(), f[3].to_string())
        })
        .collect();
    lines.sort();
    assert_eq!(
        lines,
        vec![
            ("stderr".into(), "F".into(), "to-stderr".into()),
            ("stdout".into(), "F".into(), "to-stdout".into()),
        ],
        "{log}"
    );
    c.remove_container(&failing)
        .unwrap_or_else(|e| panic!("remove failing: {e}"));

    // Removing the server leaves the client running, in the same VM.
    c.remove_container(&server)
        .unwrap_or_else(|e| panic!("remove server: {e}"));
    assert_eq!(c.containers_of(&pod).unwrap(), vec![client.clone()]);
    let gone = common::wait_for(20, || {
        (common::bundle::processes_with(&server).is_empty() && mounts_naming(&[&server]).is_empty())
            .then_some(())
    });
    assert!(
        gone.is_some(),
        "the removed container left processes {:?} or mounts {:?}",
        common::bundle::processes_with(&server),
        mounts_naming(&[&server])
    );
    let r = c
        .exec_sync(&client, &["echo", "still-here"])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!((r.exit_code, r.stdout.as_str()), (0, "still-here\n"));
    assert_eq!(
        c.container_state(&client).unwrap().state,
        "CONTAINER_RUNNING"
    );
    let r = c
        .exec_sync(
            &client,
            &["wget", "-q", "-O-", "-T", "2", "http://127.0.0.1:8080/"],
        )
        .unwrap_or_else(|e| panic!("{e}"));
    assert_ne!(r.exit_code, 0, "the removed server still answers: {r:?}");

    remove_and_check(c, handler, &pod, &[&server, &client, &failing]);
    let ids = [pod.id.as_str(), &server, &client, &failing];
    let left = common::wait_for(20, || {
        (mounts_naming(&ids).is_empty()
            && ids
                .iter()
                .all(|id| common::bundle::cgroups_named(id).is_empty()))
        .then_some(())
    });
    assert!(
        left.is_some(),
        "after RemovePodSandbox: mounts {:?}, cgroups {:?}",
        mounts_naming(&ids),
        ids.iter()
            .flat_map(|id| common::bundle::cgroups_named(id))
            .collect::<Vec<_>>()
    );
    assert!(
        !links_in(&netns).contains("avtap"),
        "the VM's tap is left in the pod's namespace: {}",
        links_in(&netns)
    );
}

/// A tier's label, its CRI handler and the pod's annotations.
type FaultRuntime = (
    &'static str,
    &'static str,
    &'static [(&'static str, &'static str)],
);

/// The runtimes the fault and OOM cases run with: runc's shim (the
/// reference), agentvm's container tier and, where a microVM can boot,
/// agentvm's microvm tier (a pod as one VM).
fn fault_runtimes() -> Vec<FaultRuntime> {
    let mut runtimes: Vec<FaultRuntime> = vec![
        ("runc", HANDLER_RUNC, &[]),
        (
            "container",
            HANDLER_AGENTVM,
            &[(ISOLATION_ANNOTATION, "container")],
        ),
    ];
    match common::guest::unavailable() {
        None => runtimes.push((
            "microvm",
            HANDLER_AGENTVM,
            &[(ISOLATION_ANNOTATION, "microvm")],
        )),
        Some(why) => eprintln!("microvm: skipped: {why}"),
    }
    runtimes
}

/// The shim binary a handler's pods are served by.
fn shim_binary(handler: &str) -> &'static str {
    if handler == HANDLER_RUNC {
        "containerd-shim-runc-v2"
    } else {
        "containerd-shim-agentvm-v2"
    }
}

/// A pod of two sleeping containers, and their ids.
fn pod_of_two(
    c: &Cri,
    prefix: &str,
    handler: &str,
    annotations: &[(&str, &str)],
) -> (Pod, [String; 2]) {
    let pod = run_pod(c, prefix, handler, annotations);
    let ids = ["first", "second"].map(|name| {
        c.start_container(&pod, name, &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{prefix} {handler}: {name}: {e}"))
    });
    (pod, ids)
}

/// The pod's network namespace, held open (by its first process with the
/// pod's id whose namespace is not the test's) so its links can be looked
/// at after the pod is gone.
fn hold_netns(pod: &Pod) -> Option<std::fs::File> {
    let mine = std::fs::read_link("/proc/self/ns/net").ok()?;
    common::bundle::processes_with(&pod.id)
        .iter()
        .filter_map(|p| p.split_whitespace().next()?.parse::<i32>().ok())
        .filter(|pid| std::fs::read_link(format!("/proc/{pid}/ns/net")).is_ok_and(|ns| ns != mine))
        .find_map(|pid| std::fs::File::open(format!("/proc/{pid}/ns/net")).ok())
}

/// The processes of the pod: those in the cgroups named by its ids (the
/// containers' own processes, the pause process, a VM's supervisor, QEMU
/// and virtiofsd) and those whose command line names an id (shims, relays),
/// each as its pid and command line.
fn pod_processes(ids: &[&str]) -> Vec<(i32, String)> {
    let mut pids: Vec<i32> = ids
        .iter()
        .flat_map(|id| common::bundle::cgroups_named(id))
        .filter_map(|cg| std::fs::read_to_string(cg.join("cgroup.procs")).ok())
        .flat_map(|procs| {
            procs
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect();
    pids.extend(
        ids.iter()
            .flat_map(|id| common::bundle::processes_with(id))
            .filter_map(|p| p.split_whitespace().next()?.parse::<i32>().ok()),
    );
    pids.sort_unstable();
    pids.dedup();
    pids.into_iter()
        .filter_map(|pid| Some((pid, cmdline_of(pid)?)))
        .collect()
}

fn cmdline_of(pid: i32) -> Option<String> {
    std::fs::read(format!("/proc/{pid}/cmdline"))
        .ok()
        .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
}

/// Those of `procs` that still run (same pid, same command line).
fn still_running(procs: &[(i32, String)]) -> Vec<String> {
    procs
        .iter()
        .filter(|(pid, cmd)| cmdline_of(*pid).is_some_and(|now| now == *cmd))
        .map(|(pid, cmd)| format!("{pid}: {cmd}"))
        .collect()
}

/// Waits for each container to be reported EXITED with a non-zero exit
/// code through ContainerStatus, as a fault leaves them.
fn expect_exited_nonzero(c: &Cri, what: &str, containers: &[String]) {
    for id in containers {
        let state = c
            .wait_exited(id, 120)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_ne!(state.exit_code, 0, "{what}: {id}: {state:?}");
        eprintln!("{what}: {id}: {state:?}");
    }
}

/// StopPodSandbox and RemovePodSandbox after a fault, then: no container
/// listed, no process naming the pod or its containers, no shim, no mount,
/// no cgroup, and no tap in the pod's network namespace (if held).
fn remove_after_fault(
    c: &Cri,
    what: &str,
    handler: &str,
    pod: &Pod,
    containers: &[String],
    netns: Option<&std::fs::File>,
) {
    c.remove_pod(pod).unwrap_or_else(|e| panic!("{what}: {e}"));
    let listed = c
        .containers_of(pod)
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(listed.is_empty(), "{what}: containers left: {listed:?}");
    let mut ids = vec![pod.id.as_str()];
    ids.extend(containers.iter().map(String::as_str));
    let leftovers = || {
        let mut left: Vec<String> = shims_for(shim_binary(handler), &ids);
        left.extend(ids.iter().flat_map(|id| common::bundle::processes_with(id)));
        left.extend(mounts_naming(&ids));
        left.extend(
            ids.iter()
                .flat_map(|id| common::bundle::cgroups_named(id))
                .map(|p| p.display().to_string()),
        );
        if let Some(ns) = netns {
            let links = links_in(ns);
            if links.contains("avtap") {
                left.push(links);
            }
        }
        left
    };
    let clean = common::wait_for(30, || leftovers().is_empty().then_some(()));
    assert!(
        clean.is_some(),
        "{what}: left after StopPodSandbox/RemovePodSandbox: {:?}",
        leftovers()
    );
}

/// The shim killed mid-pod (SIGKILL): containerd sees its connection close,
/// runs the shim's `delete` for each task (its cleanup path) and publishes
/// their exits; CRI then reports the containers EXITED with a non-zero
/// code, and StopPodSandbox/RemovePodSandbox leave nothing of the pod.
/// runc's shim is the reference.
#[test]
fn a_killed_shim_is_reported_and_cleaned_up() {
    let c = require!(cri());
    for (tier, handler, annotations) in fault_runtimes() {
        let what = format!("shim killed, {tier}");
        let (pod, containers) = pod_of_two(c, "pod-shimkill", handler, annotations);
        let netns = hold_netns(&pod);
        let mut ids = vec![pod.id.as_str()];
        ids.extend(containers.iter().map(String::as_str));
        let shims = shims_for(shim_binary(handler), &ids);
        assert_eq!(shims.len(), 1, "{what}: shims of the pod: {shims:?}");
        let shim: i32 = shims[0].parse().expect("a pid");
        if tier == "microvm" {
            let vms: Vec<String> = common::bundle::processes_with("qemu-system-x86_64")
                .into_iter()
                .filter(|p| p.contains(&pod.id))
                .collect();
            assert_eq!(vms.len(), 1, "{what}: the pod's VM: {vms:?}");
        }
        let procs: Vec<(i32, String)> = pod_processes(&ids)
            .into_iter()
            .filter(|(pid, _)| *pid != shim)
            .collect();
        assert!(
            procs.len() >= 3,
            "{what}: the pod's processes (pause and two containers at least): {procs:?}"
        );
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(shim),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap_or_else(|e| panic!("{what}: kill {shim}: {e}"));
        expect_exited_nonzero(c, &what, &containers);
        // containerd's cleanup (the shim's `delete` for each task) ended
        // them, before any StopPodSandbox.
        let ended = common::wait_for(30, || still_running(&procs).is_empty().then_some(()));
        assert!(
            ended.is_some(),
            "{what}: running after the shim's delete: {:?}",
            still_running(&procs)
        );
        remove_after_fault(c, &what, handler, &pod, &containers, netns.as_ref());
        assert_eq!(still_running(&procs), Vec::<String>::new(), "{what}");
    }
}

/// The pod's VM killed mid-pod, in the microvm tier: its QEMU, then (a
/// second pod) its supervisor (the sandbox's pid), SIGKILLed. Every
/// container of the pod is reported EXITED with a non-zero code, and
/// StopPodSandbox/RemovePodSandbox leave nothing of the pod.
#[test]
fn a_killed_pod_vm_is_reported_and_cleaned_up() {
    if let Some(why) = common::guest::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let c = require!(cri());
    let handler = HANDLER_AGENTVM;
    let annotations: &[(&str, &str)] = &[(ISOLATION_ANNOTATION, "microvm")];
    for victim in ["qemu", "supervisor"] {
        let what = format!("{victim} killed");
        let (pod, containers) = pod_of_two(c, "pod-vmkill", handler, annotations);
        let netns = hold_netns(&pod);
        let pid = if victim == "qemu" {
            common::bundle::processes_with("qemu-system-x86_64")
                .iter()
                .filter(|p| p.contains(&pod.id))
                .find_map(|p| p.split_whitespace().next()?.parse().ok())
        } else {
            supervisor_of(&pod.id)
        };
        let pid: i32 = pid.unwrap_or_else(|| panic!("{what}: no {victim} for pod {}", pod.id));
        let mut ids = vec![pod.id.as_str()];
        ids.extend(containers.iter().map(String::as_str));
        let procs = pod_processes(&ids);
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .unwrap_or_else(|e| panic!("{what}: kill {pid}: {e}"));
        expect_exited_nonzero(c, &what, &containers);
        remove_after_fault(c, &what, handler, &pod, &containers, netns.as_ref());
        assert_eq!(still_running(&procs), Vec::<String>::new(), "{what}");
    }
}

/// 32 MiB, the memory limit of the OOM case's container.
const OOM_LIMIT: i64 = 32 << 20;

/// A container over its memory limit (CRI's `memory_limit_in_bytes`, 32
/// MiB; dd's 64 MiB buffer) is OOM-killed: ContainerStatus says EXITED,
/// exit code 137, reason `OOMKilled` (CRI's, from the shim's `TaskOOM`).
/// The pod's other container runs on.
#[test]
fn a_containers_oom_is_reported_through_cri() {
    let c = require!(cri());
    for (tier, handler, annotations) in fault_runtimes() {
        let what = format!("oom, {tier}");
        let pod = run_pod(c, "pod-oom", handler, annotations);
        let sleeper = c
            .start_container(&pod, "sleeper", &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let hog = c
            .start_container_limited(
                &pod,
                "hog",
                &["dd", "if=/dev/zero", "of=/dev/null", "bs=64M", "count=1"],
                &[],
                Some(OOM_LIMIT),
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let state = c
            .wait_exited(&hog, 120)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        // The reason may follow the exit by the OOM watch's last look.
        let state = common::wait_for(10, || {
            let s = c.container_state(&hog).ok()?;
            (s.reason == "OOMKilled").then_some(s)
        })
        .unwrap_or(state);
        assert_eq!(
            (state.exit_code, state.reason.as_str()),
            (137, "OOMKilled"),
            "{what}: {state:?}"
        );
        assert_eq!(
            c.container_state(&sleeper).map(|s| s.state),
            Ok("CONTAINER_RUNNING".to_string()),
            "{what}: the pod's other container"
        );
        remove_and_check(c, handler, &pod, &[&sleeper, &hog]);
    }
}

/// A handler picks the tier by its config file: `agentvm-container`'s
/// `options` name a `ConfigPath` whose file says `isolation =
/// "container"` (as a `RuntimeClass` `agentvm-container` would, with no pod
/// annotation), where this host's default is the microvm tier. The pod's
/// containers then run on the host's kernel, with no VM.
#[test]
fn a_handlers_config_file_picks_the_tier() {
    let c = require!(cri());
    let handler = HANDLER_AGENTVM_CONTAINER;
    let pod = run_pod(c, "pod-cfg", handler, &[]);
    let sleeper = c
        .start_container(&pod, "sleeper", &["sleep", "1000"], &[])
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
    let host_version = std::fs::read_to_string("/proc/version").expect("/proc/version");
    let r = c
        .exec_sync(&sleeper, &["cat", "/proc/version"])
        .unwrap_or_else(|e| panic!("{handler}: {e}"));
    assert_eq!(
        r.stdout, host_version,
        "{handler}: the host's kernel: {r:?}"
    );
    let vms: Vec<String> = common::bundle::processes_with("qemu-system-x86_64")
        .into_iter()
        .filter(|p| p.contains(&pod.id) || p.contains(&sleeper))
        .collect();
    assert!(vms.is_empty(), "{handler}: a VM for the pod: {vms:?}");
    let shims = agentvm_shims_for(&[&pod.id, &sleeper]);
    assert_eq!(shims.len(), 1, "{handler}: agentvm shims: {shims:?}");
    remove_and_check(c, handler, &pod, &[&sleeper]);
}

/// CRI's streaming exec, as `kubectl exec` uses it: the Exec RPC returns a
/// URL of containerd's streaming server, and a websocket to it with the
/// `v4.channel.k8s.io` subprotocol carries stdout (channel 1), stderr (2)
/// and the exit status (3); the older `channel.k8s.io` carries the output
/// alike. In each tier beside runc's shim; in the microvm tier the command
/// runs in the pod's VM (the guest's kernel).
#[test]
fn streaming_exec_over_a_websocket() {
    use common::wsexec::{V1, V4};
    let c = require!(cri());
    let host_version = std::fs::read_to_string("/proc/version").expect("/proc/version");
    for (tier, handler, annotations) in fault_runtimes() {
        let what = format!("streaming exec, {tier}");
        let pod = run_pod(c, "pod-stream", handler, annotations);
        let sleeper = c
            .start_container(&pod, "sleeper", &["sleep", "1000"], &[])
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let r = c
            .exec_stream(
                &sleeper,
                &["sh", "-c", "echo to-out; echo to-err >&2; exit 3"],
                V4,
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.protocol, V4, "{what}: {r:?}");
        assert_eq!(
            (r.stdout.as_str(), r.stderr.as_str(), r.exit_code()),
            ("to-out\n", "to-err\n", Ok(3)),
            "{what}: {r:?}"
        );
        let r = c
            .exec_stream(&sleeper, &["sh", "-c", "echo $AGENTVM_TEST"], V4)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(
            (r.stdout.as_str(), r.exit_code()),
            ("sleeper\n", Ok(0)),
            "{what}: {r:?}"
        );
        let r = c
            .exec_stream(&sleeper, &["cat", "/proc/version"], V1)
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        assert_eq!(r.protocol, V1, "{what}: {r:?}");
        assert!(r.stdout.starts_with("Linux version"), "{what}: {r:?}");
        assert_eq!(
            r.stdout == host_version,
            tier != "microvm",
            "{what}: the kernel the exec ran on: {r:?}"
        );
        remove_and_check(c, handler, &pod, &[&sleeper]);
    }
}

/// ContainerStats through CRI (what `kubectl top` and the kubelet's
/// eviction read): a container that has spun a shell loop reports CPU time
/// and memory, in each tier beside runc's shim (in the microvm tier the
/// figures are the guest's, of the container's own cgroup in the VM).
#[test]
fn container_stats_through_cri() {
    let c = require!(cri());
    for (tier, handler, annotations) in fault_runtimes() {
        let what = format!("stats, {tier}");
        let pod = run_pod(c, "pod-stats", handler, annotations);
        let busy = c
            .start_container(
                &pod,
                "busy",
                &[
                    "sh",
                    "-c",
                    "i=0; while [ $i -lt 20000 ]; do i=$((i+1)); done; exec sleep 1000",
                ],
                &[],
            )
            .unwrap_or_else(|e| panic!("{what}: {e}"));
        let usage = common::wait_for(30, || {
            let u = c.container_stats(&busy).ok()?;
            (u.cpu_ns > 0 && u.working_set > 0 && u.usage > 0).then_some(u)
        });
        assert!(
            usage.is_some(),
            "{what}: ContainerStats without CPU or memory: {:?}",
            c.container_stats(&busy)
        );
        eprintln!("{what}: {usage:?}");
        remove_and_check(c, handler, &pod, &[&busy]);
    }
}
