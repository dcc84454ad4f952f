//! Pods through containerd's CRI, as the kubelet runs them: RunPodSandbox,
//! CreateContainer/StartContainer, ExecSync, ContainerStatus, the CRI log
//! files, StopContainer/RemoveContainer and StopPodSandbox/RemovePodSandbox
//! against a containerd of the tests with its CRI plugin on and a CNI
//! bridge (tests/support/src/cri.rs). Each case runs with containerd's runc
//! shim (the reference) and with agentvm's shim in the container tier, in
//! the same run.
//!
//! A pod in the microvm tier is not one VM yet (issue 11): each container
//! would boot its own, and `localhost` would not join them; those cases
//! come with the pod VM.
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

/// In the microvm tier a pod's sandbox boots in its own microVM (its
/// kernel is not the host's), and a container CRI adds to the pod is
/// refused by name until the pod's VM exists (a VM per container would not
/// share the pod's `localhost`), leaving the pod removable with nothing
/// left behind.
#[test]
fn a_pod_in_the_microvm_tier_refuses_a_second_container_by_name() {
    if let Some(why) = common::guest::unavailable() {
        eprintln!("skipped: {why}");
        return;
    }
    let c = require!(cri());
    let handler = HANDLER_AGENTVM;
    let pod = run_pod(c, "pod-vm", handler, &[(ISOLATION_ANNOTATION, "microvm")]);
    let err = c
        .start_container(&pod, "app", &["sleep", "1000"], &[])
        .expect_err("a second container of a microvm-tier pod was started");
    assert!(
        err.contains("one microVM for the whole pod")
            && err.contains("io.agentvm.isolation=container"),
        "{err}"
    );
    // The sandbox itself runs, in a microVM: the pod's shim lists it.
    let shims = agentvm_shims_for(&[&pod.id]);
    assert_eq!(shims.len(), 1, "agentvm shims for the pod: {shims:?}");
    remove_and_check(c, handler, &pod, &[]);
}
