//! Fuzz targets for every parser of agentvm that takes outside input, on
//! stable Rust: no libFuzzer, no sanitizers, inputs from a seeded PRNG
//! read through `arbitrary`.
//!
//! - `protocol`: the frames and control messages a guest sends the host;
//! - `spec`: a bundle's config.json, through to the microVM plan;
//! - `config`: `/etc/agentvm/config.toml` and what reads its values;
//! - `annotations`: the `io.agentvm.isolation` and `io.agentvm.egress`
//!   values;
//! - `dns_relay`: the host-side DNS relay's table, which the guest's
//!   queries fill;
//! - `egress_resolver`: the egress policy's resolver, which the sandbox's
//!   DNS queries and the upstream's answers reach;
//! - `virtio_chain`, `virtio_mmio`: the builtin VMM's descriptor-chain
//!   validator with virtio-rng, and its virtio-mmio transport;
//! - `virtio_console_control`: the builtin VMM's virtio-console control
//!   messages;
//! - `virtio_net`: the builtin VMM's virtio-net device, its transmit and
//!   receive queues against a socketpair standing in for the tap;
//! - `virtio_fs`: the builtin VMM's virtio-fs device and its FUSE server
//!   over a real share, driven by hostile requests and chains;
//! - `virtio_console_port`: the builtin VMM's virtio-console device, its
//!   port data path and flow control against a host socket.
//!
//! `cargo test` runs each target for a bounded number of cases and replays
//! `regressions/<target>/*`; the `agentvm-fuzz` binary (`make fuzz`) runs
//! them for longer and saves any crashing input under `crashes/`.
//! docs/fuzzing.md tells how.

pub mod driver;
pub mod mutate;
pub mod rng;
pub mod targets;

#[cfg(test)]
mod tests {
    use super::driver::{self, Limits};
    use super::targets::{find, TARGETS};

    /// The seed of the bounded runs in `cargo test`; `AGENTVM_FUZZ_SEED`
    /// and `AGENTVM_FUZZ_CASES` change the seed and the number of cases.
    const SEED: u64 = 0x00a9_e47f;

    fn env_number(name: &str) -> Option<u64> {
        std::env::var(name).ok().and_then(|v| v.parse().ok())
    }

    #[test]
    fn regressions_replay_clean() {
        let mut failures = Vec::new();
        for t in TARGETS {
            let files = driver::regression_files(t.name).unwrap();
            assert!(!files.is_empty(), "regressions/{} is empty", t.name);
            for (file, result) in driver::replay(t, &files).unwrap() {
                if let Err(msg) = result {
                    failures.push(format!("{}: {msg}", file.display()));
                }
            }
        }
        assert!(failures.is_empty(), "{failures:#?}");
    }

    fn bounded(name: &str, cases: u64) {
        let t = find(name).unwrap();
        let limits = Limits {
            cases: Some(env_number("AGENTVM_FUZZ_CASES").unwrap_or(cases)),
            time: None,
        };
        let seed = env_number("AGENTVM_FUZZ_SEED").unwrap_or(SEED);
        if let Err(crash) = driver::fuzz(t, seed, limits, |_| {}) {
            let dir = driver::crate_dir().join("crashes");
            let file = driver::save(&dir, t.name, &crash.input).unwrap();
            panic!("{crash}\ninput saved to {}", file.display());
        }
    }

    #[test]
    fn protocol_bounded() {
        bounded("protocol", 5000);
    }

    #[test]
    fn spec_bounded() {
        bounded("spec", 5000);
    }

    #[test]
    fn config_bounded() {
        bounded("config", 5000);
    }

    #[test]
    fn annotations_bounded() {
        bounded("annotations", 5000);
    }

    #[test]
    fn virtio_chain_bounded() {
        bounded("virtio_chain", 5000);
    }

    #[test]
    fn virtio_console_control_bounded() {
        bounded("virtio_console_control", 5000);
    }

    #[test]
    fn virtio_console_port_bounded() {
        bounded("virtio_console_port", 2000);
    }

    #[test]
    fn virtio_fs_bounded() {
        bounded("virtio_fs", 500);
    }

    #[test]
    fn virtio_net_bounded() {
        bounded("virtio_net", 3000);
    }

    #[test]
    fn virtio_mmio_bounded() {
        bounded("virtio_mmio", 5000);
    }

    #[test]
    fn dns_relay_bounded() {
        bounded("dns_relay", 5000);
    }

    #[test]
    fn egress_resolver_bounded() {
        bounded("egress_resolver", 5000);
    }

    #[test]
    fn a_run_is_a_function_of_its_seed() {
        for t in TARGETS {
            for case in [0, 1, 77] {
                assert_eq!(driver::input_for(t, 5, case), driver::input_for(t, 5, case));
            }
            assert_ne!(driver::input_for(t, 5, 3), driver::input_for(t, 6, 3));
        }
    }
}
