//! The spec-to-VM translation: a bundle's `config.json` (the caller's, so
//! outside input) through [`Bundle::parse_spec`] to [`plan`], which
//! rewrites the spec for the guest and sizes the VM, and to the `Create`
//! message that carries it to the guest.
//!
//! An input that starts with `{` is a config.json as it is. Any other is
//! read with `arbitrary` into a structure that builds a
//! well-formed-ish spec — every field the microVM interprets, filled with
//! numbers at type boundaries, negative values, odd cpusets, empty and
//! path-like strings — then edited field by field at random positions of
//! the JSON tree, and sometimes mutated as bytes. What `plan` accepts must
//! hold its promises: paths rewritten onto the share, hooks and host
//! namespaces gone, a VM of at least one vCPU sized from the limit, and a
//! `Create` message the guest decodes to the same spec.

use std::path::Path;

use agentvm::bundle::Bundle;
use agentvm::config::{Config, MicrovmConfig};
use agentvm::egress::{Policy, EGRESS_ANNOTATION};
use agentvm::microvm::spec::{
    check_update, host_limits, is_bind, netns_path, plan, MEMORY_OVERHEAD_MIB, MIN_MEMORY_MIB,
};
use agentvm_protocol::{Frame, HostMessage, SHARE_MOUNT};
use arbitrary::{Arbitrary, Unstructured};
use oci_spec::runtime::{LinuxNamespaceType, LinuxResources};
use serde_json::{json, Map, Value};

use super::values::{Int, Key, Leaf, Text, KEYS};

const BUNDLE: &str = "/fuzz/bundle";

#[derive(Arbitrary, Debug)]
struct ProcessIn {
    /// The first argument and the rest: never empty but by an edit.
    args: Option<(Text, Vec<Text>)>,
    cwd: Option<Text>,
    uid: Option<Int>,
    gid: Option<Int>,
    terminal: Option<bool>,
    env: Vec<Text>,
    console: Option<(Int, Int)>,
    rlimits: Vec<(Text, Int, Int)>,
}

#[derive(Arbitrary, Debug)]
struct MountIn {
    destination: Text,
    typ: Option<Text>,
    source: Option<Text>,
    options: Option<Vec<Text>>,
}

#[derive(Arbitrary, Debug)]
struct ResourcesIn {
    memory_limit: Option<Int>,
    swap: Option<Int>,
    quota: Option<Int>,
    period: Option<Int>,
    cpus: Option<Text>,
    shares: Option<Int>,
    pids: Option<Int>,
}

#[derive(Arbitrary, Debug)]
struct LinuxIn {
    namespaces: Option<Vec<(u8, Option<Text>)>>,
    resources: ResourcesIn,
    cgroups_path: Option<Text>,
    uid_mappings: Vec<(Int, Int, Int)>,
}

/// A change at some node of the JSON tree, reached by `path` (each step
/// picks a child by index).
#[derive(Arbitrary, Debug)]
struct Edit {
    path: Vec<u8>,
    op: Op,
}

#[derive(Arbitrary, Debug)]
enum Op {
    Set(Leaf),
    Remove(u8),
    Insert(Key, Leaf),
}

/// `ociVersion`: mostly one that is supported.
#[derive(Arbitrary, Debug)]
enum Version {
    Supported(u8),
    Any(Text),
}

impl Version {
    fn json(&self) -> Value {
        const KNOWN: &[&str] = &[
            "1.0.2",
            "1.0.0",
            "1.1.0",
            "1.2.1",
            "1.",
            "1.0.2-dev",
            "1.0.2+x",
        ];
        match self {
            Version::Supported(i) => json!(KNOWN[usize::from(*i) % KNOWN.len()]),
            Version::Any(t) => t.json(),
        }
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    version: Option<Version>,
    process: Option<ProcessIn>,
    root: Option<(Text, Option<bool>)>,
    mounts: Vec<MountIn>,
    /// Present unless an edit removes it: it holds what `plan` reads.
    linux: LinuxIn,
    annotations: Vec<(Key, Text)>,
    hooks: bool,
    default_vcpus: Option<u32>,
    default_memory_mib: Option<u64>,
    update: Option<ResourcesIn>,
    edits: Vec<Edit>,
    mutate_bytes: bool,
}

const NAMESPACES: &[&str] = &[
    "pid", "network", "mount", "ipc", "uts", "user", "cgroup", "time", "net", "",
];

fn opt(map: &mut Map<String, Value>, key: &str, v: Option<Value>) {
    if let Some(v) = v {
        map.insert(key.to_string(), v);
    }
}

impl ResourcesIn {
    fn json(&self) -> Value {
        let mut memory = Map::new();
        opt(
            &mut memory,
            "limit",
            self.memory_limit.as_ref().map(Int::json),
        );
        opt(&mut memory, "swap", self.swap.as_ref().map(Int::json));
        let mut cpu = Map::new();
        opt(&mut cpu, "quota", self.quota.as_ref().map(Int::json));
        opt(&mut cpu, "period", self.period.as_ref().map(Int::json));
        opt(&mut cpu, "cpus", self.cpus.as_ref().map(Text::json));
        opt(&mut cpu, "shares", self.shares.as_ref().map(Int::json));
        let mut r = Map::new();
        r.insert("memory".into(), Value::Object(memory));
        r.insert("cpu".into(), Value::Object(cpu));
        opt(
            &mut r,
            "pids",
            self.pids.as_ref().map(|n| json!({ "limit": n.json() })),
        );
        Value::Object(r)
    }
}

impl Input {
    fn json(&self) -> Value {
        let mut spec = Map::new();
        spec.insert(
            "ociVersion".into(),
            self.version
                .as_ref()
                .map_or_else(|| json!("1.0.2"), Version::json),
        );
        let mut process = Map::new();
        let p = self.process.as_ref();
        process.insert(
            "args".into(),
            p.and_then(|p| p.args.as_ref()).map_or_else(
                || json!(["true"]),
                |(first, rest)| {
                    Value::Array(std::iter::once(first).chain(rest).map(Text::json).collect())
                },
            ),
        );
        process.insert(
            "cwd".into(),
            p.and_then(|p| p.cwd.as_ref())
                .map_or_else(|| json!("/"), Text::json),
        );
        let uid = p.and_then(|p| p.uid.as_ref()).map_or(json!(0), Int::json);
        let gid = p.and_then(|p| p.gid.as_ref()).map_or(json!(0), Int::json);
        process.insert("user".into(), json!({"uid": uid, "gid": gid}));
        if let Some(p) = p {
            opt(&mut process, "terminal", p.terminal.map(Value::Bool));
            process.insert(
                "env".into(),
                Value::Array(p.env.iter().map(Text::json).collect()),
            );
            opt(
                &mut process,
                "consoleSize",
                p.console
                    .as_ref()
                    .map(|(h, w)| json!({"height": h.json(), "width": w.json()})),
            );
            if !p.rlimits.is_empty() {
                let r = p
                    .rlimits
                    .iter()
                    .map(|(t, h, s)| json!({"type": t.json(), "hard": h.json(), "soft": s.json()}))
                    .collect();
                process.insert("rlimits".into(), Value::Array(r));
            }
        }
        spec.insert("process".into(), Value::Object(process));
        let (root, ro) = match &self.root {
            Some((path, ro)) => (path.json(), *ro),
            None => (json!("rootfs"), None),
        };
        let mut r = Map::new();
        r.insert("path".into(), root);
        opt(&mut r, "readonly", ro.map(Value::Bool));
        spec.insert("root".into(), Value::Object(r));
        let mounts = self
            .mounts
            .iter()
            .map(|m| {
                let mut o = Map::new();
                o.insert("destination".into(), m.destination.json());
                opt(&mut o, "type", m.typ.as_ref().map(Text::json));
                opt(&mut o, "source", m.source.as_ref().map(Text::json));
                opt(
                    &mut o,
                    "options",
                    m.options
                        .as_ref()
                        .map(|v| Value::Array(v.iter().map(Text::json).collect())),
                );
                Value::Object(o)
            })
            .collect();
        spec.insert("mounts".into(), Value::Array(mounts));
        {
            let l = &self.linux;
            let mut linux = Map::new();
            opt(
                &mut linux,
                "namespaces",
                l.namespaces.as_ref().map(|nss| {
                    nss.iter()
                        .map(|(t, path)| {
                            let mut o = Map::new();
                            o.insert(
                                "type".into(),
                                json!(NAMESPACES[usize::from(*t) % NAMESPACES.len()]),
                            );
                            opt(&mut o, "path", path.as_ref().map(Text::json));
                            Value::Object(o)
                        })
                        .collect()
                }),
            );
            linux.insert("resources".into(), l.resources.json());
            opt(
                &mut linux,
                "cgroupsPath",
                l.cgroups_path.as_ref().map(Text::json),
            );
            if !l.uid_mappings.is_empty() {
                let m = l
                    .uid_mappings
                    .iter()
                    .map(|(c, h, s)| json!({"containerID": c.json(), "hostID": h.json(), "size": s.json()}))
                    .collect();
                linux.insert("uidMappings".into(), Value::Array(m));
            }
            spec.insert("linux".into(), Value::Object(linux));
        }
        if !self.annotations.is_empty() {
            let a = self
                .annotations
                .iter()
                .map(|(k, v)| (k.string(), v.json()))
                .collect();
            spec.insert("annotations".into(), Value::Object(a));
        }
        if self.hooks {
            spec.insert(
                "hooks".into(),
                json!({"prestart": [{"path": "/bin/true"}], "poststop": [{"path": "/x", "timeout": -1}]}),
            );
        }
        let mut v = Value::Object(spec);
        // A few edits: each one mostly breaks the spec.
        for e in self.edits.iter().take(3) {
            edit(&mut v, &e.path[..e.path.len().min(8)], &e.op);
        }
        v
    }
}

fn edit(v: &mut Value, path: &[u8], op: &Op) {
    if let Some((&step, rest)) = path.split_first() {
        match v {
            Value::Object(m) if !m.is_empty() => {
                let i = usize::from(step) % m.len();
                if let Some(child) = m.values_mut().nth(i) {
                    return edit(child, rest, op);
                }
            }
            Value::Array(a) if !a.is_empty() => {
                let i = usize::from(step) % a.len();
                return edit(&mut a[i], rest, op);
            }
            _ => {}
        }
    }
    match (op, v) {
        (Op::Set(leaf), v) => *v = leaf.json(),
        (Op::Remove(i), Value::Object(m)) if !m.is_empty() => {
            let key = m.keys().nth(usize::from(*i) % m.len()).cloned();
            if let Some(k) = key {
                m.remove(&k);
            }
        }
        (Op::Remove(i), Value::Array(a)) if !a.is_empty() => {
            a.remove(usize::from(*i) % a.len());
        }
        (Op::Insert(k, leaf), Value::Object(m)) => {
            m.insert(k.string(), leaf.json());
        }
        (Op::Insert(_, leaf), Value::Array(a)) => a.push(leaf.json()),
        _ => {}
    }
}

/// Tokens for the byte-level mutations of the JSON text.
const DICT: &[&str] = &[
    "{", "}", "[", "]", ",", ":", "\"", "null", "-", "1e999", "\\u0000", "\\ud800",
];

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    super::raw(u)
}

pub fn run(data: &[u8]) {
    let _ = reach(data);
}

/// How far an input got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Depth {
    /// Not a spec.
    Rejected,
    /// A spec that `plan` refused, naming the field.
    Refused,
    /// A spec planned into a VM.
    Planned,
}

fn reach(data: &[u8]) -> Depth {
    // A config.json as it is (a regression case written by hand).
    if data.first() == Some(&b'{') {
        return check(data, &Config::default(), None);
    }
    let mut u = Unstructured::new(data);
    let Ok(input) = Input::arbitrary(&mut u) else {
        return Depth::Rejected;
    };
    let mut text = input.json().to_string().into_bytes();
    if input.mutate_bytes {
        let known: Vec<&str> = DICT.iter().chain(KEYS).copied().collect();
        let _ = crate::mutate::mutate(&mut u, &mut text, &known, &[]);
    }
    let config = Config {
        microvm: MicrovmConfig {
            default_vcpus: input.default_vcpus,
            default_memory_mib: input.default_memory_mib,
            ..Default::default()
        },
        ..Default::default()
    };
    let update = input
        .update
        .as_ref()
        .and_then(|r| serde_json::from_value::<LinuxResources>(r.json()).ok());
    check(&text, &config, update.as_ref())
}

/// Feeds one config.json text through everything the microvm tier does
/// with it before the VM boots, and checks what `plan` promises.
pub fn check(text: &[u8], config: &Config, update: Option<&LinuxResources>) -> Depth {
    let bundle = Path::new(BUNDLE);
    let Ok(spec) = Bundle::parse_spec(&bundle.join("config.json"), text) else {
        return Depth::Rejected;
    };
    let annotations = spec.annotations().as_ref();
    let _ = config.select_isolation(None, annotations);
    let egress = annotations
        .and_then(|a| a.get(EGRESS_ANNOTATION))
        .map(String::as_str);
    let _ = Policy::select(None, egress, None, false);
    let _ = netns_path(&spec);
    let p = match plan(&spec, bundle, &bundle.join("rootfs"), config) {
        Ok(p) => p,
        Err(e) => {
            let msg = e.to_string();
            assert!(msg.contains(": "), "an error that names nothing: {msg}");
            return Depth::Refused;
        }
    };

    assert!(p.vcpus >= 1, "a VM without vCPUs");
    let limit = spec
        .linux()
        .as_ref()
        .and_then(|l| l.resources().as_ref())
        .and_then(|r| r.memory().as_ref())
        .and_then(|m| m.limit())
        .filter(|l| *l > 0);
    if let Some(limit) = limit {
        let want = (limit as u64)
            .div_ceil(1 << 20)
            .saturating_add(MEMORY_OVERHEAD_MIB)
            .max(MIN_MEMORY_MIB);
        assert_eq!(p.memory_mib, want, "VM size for a {limit}-byte limit");
    }

    // Paths: the root and every bind source are on the share.
    let root = p.spec.root().as_ref().map(|r| r.path().clone());
    assert_eq!(
        root,
        Some(Path::new(SHARE_MOUNT).join("rootfs")),
        "guest root path"
    );
    assert_eq!(p.staged[0].name, "rootfs");
    assert_eq!(p.staged[0].source, bundle.join("rootfs"));
    let mut binds = 0;
    for m in p.spec.mounts().iter().flatten() {
        if is_bind(m) {
            binds += 1;
            let src = m.source().clone().unwrap_or_default();
            let name = src
                .strip_prefix(SHARE_MOUNT)
                .ok()
                .and_then(|n| n.to_str())
                .unwrap_or_default()
                .to_string();
            assert!(
                p.staged.iter().any(|s| s.name == name && !name.is_empty()),
                "bind source {} is not a staged share entry",
                src.display()
            );
        }
    }
    assert_eq!(p.staged.len(), binds + 1, "one staged entry per bind mount");
    let mut names: Vec<&str> = p.staged.iter().map(|s| s.name.as_str()).collect();
    names.sort_unstable();
    names.dedup();
    assert_eq!(names.len(), p.staged.len(), "staged names collide");

    // What runs on the host or joins host objects is gone.
    assert!(p.spec.hooks().is_none(), "hooks reach the guest");
    if let Some(linux) = p.spec.linux() {
        assert_eq!(linux.cgroups_path().as_deref(), Some(Path::new("/agentvm")));
        if let Some(nss) = linux.namespaces() {
            assert!(
                nss.iter().all(|n| n.path().is_none()),
                "a host namespace path"
            );
            assert!(nss.iter().any(|n| n.typ() == LinuxNamespaceType::Cgroup));
        }
        if let Some(r) = linux.resources() {
            let _ = host_limits(r);
            let _ = check_update(r, p.vcpus, p.memory_mib);
        }
    }
    if let Some(r) = update {
        let _ = check_update(r, p.vcpus, p.memory_mib);
    }

    // The Create message decodes on the guest's side to the same spec.
    let frame = Frame::control(&HostMessage::Create {
        spec: Box::new(p.spec.clone()),
    });
    assert!(!frame.payload.is_empty(), "the spec does not serialize");
    match frame.parse_control::<HostMessage>() {
        Ok(HostMessage::Create { spec }) => {
            assert!(*spec == p.spec, "the guest reads another spec")
        }
        Ok(other) => panic!("Create decodes as {other:?}"),
        Err(e) => panic!("the guest cannot decode the Create message: {e}"),
    }
    Depth::Planned
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn most_inputs_reach_the_plan() {
        let t = crate::targets::find("spec").unwrap();
        let mut counts = [0usize; 3];
        for case in 0..2000 {
            let depth = reach(&crate::driver::input_for(t, 1, case));
            counts[depth as usize] += 1;
        }
        // Rejected, refused, planned.
        assert!(counts[2] > 500, "{counts:?}");
        assert!(counts[1] > 20, "{counts:?}");
    }
}
