//! The fuzz targets, one module each. A target turns random choices into an
//! input (`generate`) and feeds an input to the real parser and to what
//! consumes its result (`run`). `run` must return, without panicking and
//! quickly, for every input: a panic, including a failed check of a
//! property the parser promises, is a crash.

use arbitrary::Unstructured;

pub mod annotations;
pub mod config;
pub mod dns_relay;
pub mod egress_proxy;
pub mod egress_resolver;
pub mod ndp;
pub mod protocol;
pub mod spec;
pub mod values;
pub mod virtio_chain;
pub mod virtio_console_control;
pub mod virtio_console_port;
pub mod virtio_fs;
pub mod virtio_mmio;
pub mod virtio_net;

/// One fuzz target.
pub struct Target {
    /// Its name on the command line and under `regressions/`.
    pub name: &'static str,
    /// What it covers, for `--list`.
    pub about: &'static str,
    /// Builds one input from random choices.
    pub generate: fn(&mut Unstructured) -> arbitrary::Result<Vec<u8>>,
    /// Runs one input.
    pub run: fn(&[u8]),
}

/// Every target, in the order `--target all` runs them.
pub const TARGETS: &[Target] = &[
    Target {
        name: "protocol",
        about: "guest-to-host frames: both decoders, control messages, guest log lines",
        generate: protocol::generate,
        run: protocol::run,
    },
    Target {
        name: "spec",
        about: "config.json to OCI spec to the microVM plan and the Create message",
        generate: spec::generate,
        run: spec::run,
    },
    Target {
        name: "config",
        about: "config.toml and what reads its values (tier, egress, VM size, boot timeout)",
        generate: config::generate,
        run: config::run,
    },
    Target {
        name: "dns_relay",
        about: "the host-side DNS relay's table: guest queries and the answers matched back",
        generate: dns_relay::generate,
        run: dns_relay::run,
    },
    Target {
        name: "egress_resolver",
        about: "the egress resolver: sandbox DNS queries it forwards or refuses, upstream answers it allows",
        generate: egress_resolver::generate,
        run: egress_resolver::run,
    },
    Target {
        name: "egress_proxy",
        about: "the egress proxy: first flights (TLS ClientHello, HTTP) read for a name, the judgement, logged packet headers",
        generate: egress_proxy::generate,
        run: egress_proxy::run,
    },
    Target {
        name: "ndp",
        about: "the IPv6 neighbour answers on a microVM's tap: guest frames in, advertisements out",
        generate: ndp::generate,
        run: ndp::run,
    },
    Target {
        name: "virtio_chain",
        about: "the builtin VMM's descriptor-chain validator and virtio-rng: guest descriptor tables and avail rings",
        generate: virtio_chain::generate,
        run: virtio_chain::run,
    },
    Target {
        name: "virtio_console_control",
        about: "the builtin VMM's virtio-console control messages: what a guest driver writes on the control queue",
        generate: virtio_console_control::generate,
        run: virtio_console_control::run,
    },
    Target {
        name: "virtio_console_port",
        about: "the builtin VMM's virtio-console: port 1's data both ways, its control messages and flow control, against a host socket",
        generate: virtio_console_port::generate,
        run: virtio_console_port::run,
    },
    Target {
        name: "virtio_fs",
        about: "the builtin VMM's virtio-fs and its FUSE server over a real share: guest requests, chains and node ids",
        generate: virtio_fs::generate,
        run: virtio_fs::run,
    },
    Target {
        name: "virtio_net",
        about: "the builtin VMM's virtio-net: guest transmit chains and headers, receive buffers, frames from a tap",
        generate: virtio_net::generate,
        run: virtio_net::run,
    },
    Target {
        name: "virtio_mmio",
        about: "the builtin VMM's virtio-mmio transport: guest register reads and writes of any width",
        generate: virtio_mmio::generate,
        run: virtio_mmio::run,
    },
    Target {
        name: "annotations",
        about: "io.agentvm.isolation and io.agentvm.egress values, locked narrowing, nft ruleset",
        generate: annotations::generate,
        run: annotations::run,
    },
];

/// The target called `name`.
pub fn find(name: &str) -> Option<&'static Target> {
    TARGETS.iter().find(|t| t.name == name)
}

/// Random bytes as they are: the input of the structured targets, which
/// read their structure out of them with `arbitrary`.
pub fn raw(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let n = u.len();
    Ok(u.bytes(n)?.to_vec())
}
