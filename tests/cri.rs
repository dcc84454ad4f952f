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
use common::cri::{cri, Cri, Pod, PodSpec, HANDLER_AGENTVM, HANDLER_RUNC};
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
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
            continue;
        };
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).into_owned())
            .collect();
        let is_shim = args
            .first()
            .is_some_and(|a| a.ends_with("containerd-shim-agentvm-v2"));
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
