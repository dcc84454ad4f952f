//! The config file, `/etc/agentvm/config.toml`: [`Config::parse`] and what
//! reads the values it accepts (the tier, the egress policy, the VM's size
//! when a container sets no limit, the supervisor's boot deadline).
//!
//! An input is the file's bytes. `generate` starts from a valid file or
//! builds one with `arbitrary` out of the real keys and edge-case values
//! (huge, negative and oddly spelt numbers, every kind of TOML string,
//! arrays and tables where scalars go, dotted keys), then mutates bytes.
//! A file that parses must be usable: nothing that reads its values may
//! panic or get a VM it cannot boot.

use std::path::Path;
use std::time::{Duration, Instant};

use agentvm::config::Config;
use agentvm::egress::Policy;
use agentvm::microvm::spec::{plan, MIN_MEMORY_MIB};
use arbitrary::{Arbitrary, Unstructured};

use super::values::Text;
use crate::mutate::NUMBERS;

/// Valid files to start from.
const SEEDS: &[&str] = &[
    "",
    "isolation = \"container\"\n",
    "isolation = \"microvm\"\n\n[microvm]\nkernel = \"/usr/local/share/agentvm/vmlinux\"\n\
     virtiofsd = \"/usr/libexec/virtiofsd\"\ndefault_memory_mib = 512\ndefault_vcpus = 2\n\
     boot_timeout_secs = 120\nguest_agent = \"/opt/agent\"\n",
    "[egress]\npolicy = \"10.0.0.0/8,192.0.2.7:53/udp\"\nlocked = true\n",
    "microvm.default_vcpus = 4\negress.policy = 'deny'\n",
    "# comment\n[microvm] # trailing\nboot_timeout_secs = 30\n",
    "[microvm]\nvmm = \"builtin\"\n",
    "microvm.vmm = 'qemu'\n",
    "[audit]\npath = \"/var/log/agentvm/audit.jsonl\"\notlp_endpoint = \"http://127.0.0.1:4318\"\n",
    "audit.otlp_endpoint = \"http://[::1]:4318/otlp/v1/logs\"\n",
];

const DICT: &[&str] = &[
    "[microvm]\n",
    "[egress]\n",
    "[audit]\n",
    "[[microvm]]\n",
    "\n",
    "=",
    "\"",
    "'",
    "\"\"\"",
    "#",
    ".",
    "\\u0000",
    "\\U0010FFFF",
    "\\x",
    "isolation",
    "kernel",
    "virtiofsd",
    "default_memory_mib",
    "default_vcpus",
    "boot_timeout_secs",
    "guest_agent",
    "vmm",
    "auto",
    "builtin",
    "qemu",
    "policy",
    "locked",
    "microvm.",
    "egress.",
    "audit.",
    "path",
    "otlp_endpoint",
    "http://",
    "https://",
    "[::1]",
    ":4318",
    "/v1/logs",
    "inf",
    "nan",
    "1979-05-27T07:32:00Z",
    "[",
    "]",
    "{",
    "}",
];

const KEYS: &[&str] = &[
    "isolation",
    "microvm.kernel",
    "microvm.virtiofsd",
    "microvm.default_memory_mib",
    "microvm.default_vcpus",
    "microvm.boot_timeout_secs",
    "microvm.guest_agent",
    "microvm.vmm",
    "egress.policy",
    "egress.locked",
    "audit.path",
    "audit.otlp_endpoint",
    "microvm",
    "egress",
    "unknown",
];

#[derive(Arbitrary, Debug)]
enum Val {
    Int(i64),
    Edge(u8),
    Number(u8),
    Float(f64),
    Bool(bool),
    Basic(Text),
    Literal(Text),
    Multiline(Text),
    /// The text between quotes as it is, escapes and all.
    Raw(Text),
    Array(Vec<i64>),
    Table(Vec<(u8, i64)>),
}

const EDGES: &[&str] = &[
    "0",
    "1",
    "-1",
    "127",
    "128",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "17592186044416",
    "18446744073709551",
    "0x7fffffffffffffff",
    "0o777",
    "0b1",
];

impl Val {
    fn toml(&self) -> String {
        match self {
            Val::Int(n) => n.to_string(),
            Val::Edge(i) => EDGES[usize::from(*i) % EDGES.len()].to_string(),
            Val::Number(i) => NUMBERS[usize::from(*i) % NUMBERS.len()].to_string(),
            Val::Float(f) => format!("{f:?}"),
            Val::Bool(b) => b.to_string(),
            // A JSON string is a TOML basic string but for a few escapes.
            Val::Basic(t) => serde_json::Value::String(t.string()).to_string(),
            Val::Literal(t) => format!("'{}'", t.string()),
            Val::Multiline(t) => format!("\"\"\"\n{}\"\"\"", t.string()),
            Val::Raw(t) => format!("\"{}\"", t.string()),
            Val::Array(v) => format!(
                "[{}]",
                v.iter().map(i64::to_string).collect::<Vec<_>>().join(", ")
            ),
            Val::Table(v) => format!(
                "{{{}}}",
                v.iter()
                    .map(|(k, n)| format!("{} = {n}", KEYS[usize::from(*k) % KEYS.len()]))
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        }
    }
}

/// A file built from the real keys, dotted or under their table.
#[derive(Arbitrary, Debug)]
struct Doc {
    entries: Vec<(u8, bool, Val)>,
}

impl Doc {
    fn toml(&self) -> String {
        let mut root = String::new();
        let mut tables: Vec<(String, String)> = Vec::new();
        for (k, tabled, v) in &self.entries {
            let key = KEYS[usize::from(*k) % KEYS.len()];
            match key.split_once('.') {
                Some((table, field)) if *tabled => {
                    let line = format!("{field} = {}\n", v.toml());
                    match tables.iter_mut().find(|(t, _)| t == table) {
                        Some((_, body)) => body.push_str(&line),
                        None => tables.push((table.to_string(), line)),
                    }
                }
                _ => root.push_str(&format!("{key} = {}\n", v.toml())),
            }
        }
        for (t, body) in tables {
            root.push_str(&format!("[{t}]\n{body}"));
        }
        root
    }
}

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let mut text = if u.ratio(1, 3)? {
        u.choose(SEEDS)?.as_bytes().to_vec()
    } else {
        Doc::arbitrary(u)?.toml().into_bytes()
    };
    if u.ratio(1, 2)? {
        let others: Vec<&[u8]> = SEEDS.iter().map(|s| s.as_bytes()).collect();
        crate::mutate::mutate(u, &mut text, DICT, &others)?;
    }
    Ok(text)
}

pub fn run(data: &[u8]) {
    // The file is read with read_to_string: not UTF-8 is an error there,
    // but the parser still gets to see the rest.
    let text = String::from_utf8_lossy(data);
    let Ok(config) = Config::parse(&text) else {
        return;
    };
    check(&config);
}

/// Everything that reads a parsed config's values, as create and the
/// supervisor read them.
fn check(config: &Config) {
    if let Err(e) = config.select_isolation(None, None) {
        panic!("a parsed config picks no tier: {e}");
    }
    let _ = Policy::select(
        None,
        None,
        config.egress.policy.as_deref(),
        config.egress.locked,
    );

    // The VMM backend a container that picks none gets, on a host with a
    // standard KVM and on one without: `auto` and `qemu` always give one,
    // `builtin` wherever there is a standard KVM (saying what it lacks
    // while incomplete), and `auto` picks it only once it is complete.
    {
        use agentvm::microvm::vmm::builtin;
        use agentvm::microvm::vmm::choice::{decide, requested, HostKvm, VmmChoice};
        let Ok((choice, source)) = requested(config.microvm.vmm, None) else {
            panic!("a parsed config's vmm cannot be read");
        };
        for host in [
            HostKvm::from_facts("flags : vmx\n", |m| m == "kvm_intel", true),
            HostKvm::from_facts("flags : hypervisor\n", |m| m == "kvm_pvm", true),
        ] {
            let d = decide(choice, source, &host, builtin::MISSING);
            match choice {
                VmmChoice::Auto | VmmChoice::Qemu => assert!(d.is_ok(), "{choice}: {d:?}"),
                VmmChoice::Builtin => {
                    assert_eq!(d.is_ok(), host.standard().is_ok(), "{d:?}");
                    if let Ok(d) = &d {
                        assert_eq!(d.why.contains("not complete"), !builtin::complete());
                    }
                }
            }
            if let (VmmChoice::Auto, Ok(d)) = (choice, &d) {
                assert_eq!(
                    d.backend == agentvm::microvm::vmm::choice::BackendKind::Builtin,
                    builtin::complete() && host.standard().is_ok()
                );
            }
        }
    }

    // The VM of a container that sets no limits.
    let spec = match serde_json::from_str(
        r#"{"ociVersion":"1.0.2","process":{"args":["true"],"cwd":"/","user":{"uid":0,"gid":0}},"root":{"path":"rootfs"}}"#,
    ) {
        Ok(s) => s,
        Err(e) => panic!("the minimal spec: {e}"),
    };
    let p = match plan(&spec, Path::new("/b"), Path::new("/b/rootfs"), config) {
        Ok(p) => p,
        Err(e) => panic!("a minimal spec does not plan under this config: {e}"),
    };
    assert!(p.vcpus >= 1);
    assert!(
        p.memory_mib >= MIN_MEMORY_MIB,
        "a {} MiB VM: below the {MIN_MEMORY_MIB} MiB minimum",
        p.memory_mib
    );
    assert!(
        p.memory_mib.checked_mul(1 << 20).is_some(),
        "a {} MiB VM: its size in bytes overflows",
        p.memory_mib
    );

    // The supervisor's boot deadline (microvm/supervisor/mod.rs), as it
    // computed it before the fuzzer found the overflow: the file's value
    // must be one this works for.
    let secs = config.microvm.boot_timeout_secs;
    assert_ne!(secs, Some(0), "a zero boot timeout");
    let timeout = Duration::from_secs(secs.unwrap_or(120));
    let _deadline = Instant::now() + timeout;
    assert_eq!(config.microvm.boot_timeout(), timeout);

    // The audit file and the exporter's endpoint, as create and the
    // exporter read them: an endpoint that parsed is one the exporter can
    // use, and the URL it posts to reads back as the same endpoint.
    assert!(config.audit.path().is_absolute(), "a relative audit path");
    if let Some(text) = &config.audit.otlp_endpoint {
        let Some(endpoint) = config.audit.endpoint() else {
            panic!("otlp_endpoint {text:?} was accepted but does not parse");
        };
        let url = endpoint.url();
        match url.parse::<agentvm::audit::otlp::Endpoint>() {
            Ok(again) => assert_eq!(again, endpoint, "{text:?} -> {url}"),
            Err(e) => panic!("{text:?} posts to {url}, which does not parse: {e}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_inputs_parse() {
        let t = crate::targets::find("config").unwrap();
        let parsed = (0..2000)
            .map(|case| crate::driver::input_for(t, 1, case))
            .filter(|i| Config::parse(&String::from_utf8_lossy(i)).is_ok())
            .count();
        assert!(parsed > 200, "{parsed} of 2000 parse");
    }
}
