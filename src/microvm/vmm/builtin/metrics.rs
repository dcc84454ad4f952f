//! What the builtin VMM counts for a VM, read by `events --stats` (through
//! the supervisor) and by `make bench`: the time from the VM's creation to
//! the guest's first instruction, the vCPUs' exits, and each device's own
//! counters. Everything here is measured on the host; the guest can make
//! the counts grow, never set them.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use super::virtio::console::ConsoleMetrics;
use super::virtio::fs::FsMetrics;
use super::virtio::net::NetMetrics;
use super::virtio::queue::QueueMetrics;
use crate::protocol::{NicCounters, VmmCounters};

/// A VM's own counters, shared by its vCPU threads.
#[derive(Debug)]
pub struct VmMetrics {
    /// When the VM's creation began (before `/dev/kvm` was opened).
    created: Instant,
    /// When a vCPU first entered `KVM_RUN`.
    first_run: OnceLock<Instant>,
    /// The steps from the creation to the first `KVM_RUN`, and when the
    /// last one ended.
    steps: Mutex<(Vec<(&'static str, Duration)>, Instant)>,
    exits: AtomicU64,
    pio: AtomicU64,
    mmio: AtomicU64,
}

impl Default for VmMetrics {
    fn default() -> Self {
        VmMetrics::new(Instant::now())
    }
}

impl VmMetrics {
    /// Counters of a VM whose creation began at `created`.
    pub fn new(created: Instant) -> VmMetrics {
        VmMetrics {
            created,
            first_run: OnceLock::new(),
            steps: Mutex::new((Vec::new(), created)),
            exits: AtomicU64::new(0),
            pio: AtomicU64::new(0),
            mmio: AtomicU64::new(0),
        }
    }

    /// A vCPU is about to enter `KVM_RUN`: the first time, the guest's
    /// first instruction follows.
    pub fn entering_guest(&self) {
        self.first_run.get_or_init(|| {
            self.step("vCPU thread to KVM_RUN");
            Instant::now()
        });
    }

    /// Ends a step of the VM's start, named `name`, now (before the first
    /// `KVM_RUN`; later steps are not kept).
    pub fn step(&self, name: &'static str) {
        if self.first_run.get().is_some() {
            return;
        }
        let now = Instant::now();
        if let Ok(mut s) = self.steps.lock() {
            let since = now.saturating_duration_since(s.1);
            s.0.push((name, since));
            s.1 = now;
        }
    }

    /// The steps of the VM's start, in order.
    pub fn steps(&self) -> Vec<(&'static str, Duration)> {
        self.steps.lock().map(|s| s.0.clone()).unwrap_or_default()
    }

    /// From the VM's creation to its first `KVM_RUN`; `None` before it.
    pub fn first_instruction(&self) -> Option<Duration> {
        self.first_run
            .get()
            .map(|t| t.saturating_duration_since(self.created))
    }

    pub fn count_exit(&self) {
        self.exits.fetch_add(1, Ordering::Relaxed);
    }
    pub fn count_pio(&self) {
        self.pio.fetch_add(1, Ordering::Relaxed);
    }
    pub fn count_mmio(&self) {
        self.mmio.fetch_add(1, Ordering::Relaxed);
    }
    pub fn exits(&self) -> u64 {
        self.exits.load(Ordering::Relaxed)
    }
    pub fn pio(&self) -> u64 {
        self.pio.load(Ordering::Relaxed)
    }
    pub fn mmio(&self) -> u64 {
        self.mmio.load(Ordering::Relaxed)
    }
}

/// Every counter of one machine, kept apart from the devices (which their
/// threads lock): reading them never waits for a device.
#[derive(Debug, Clone)]
pub struct MachineCounters {
    pub vm: Arc<VmMetrics>,
    pub rng: Arc<QueueMetrics>,
    pub console: Option<Arc<ConsoleMetrics>>,
    pub fs: Option<Arc<FsMetrics>>,
    pub nics: Vec<Arc<NetMetrics>>,
}

fn get(c: &AtomicU64) -> u64 {
    c.load(Ordering::Relaxed)
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl MachineCounters {
    /// The counters now. The NICs are named `eth0`, `eth1`… in order; the
    /// supervisor, which knows the guest's names, renames them.
    pub fn read(&self) -> VmmCounters {
        let mut bad_chains = self.rng.bad_chains();
        if let Some(c) = &self.console {
            bad_chains += c.queues.bad_chains();
        }
        if let Some(f) = &self.fs {
            bad_chains += get(&f.bad_chains);
        }
        let nics = self
            .nics
            .iter()
            .enumerate()
            .map(|(i, n)| {
                bad_chains += get(&n.bad_chains);
                NicCounters {
                    name: format!("eth{i}"),
                    rx_bytes: get(&n.rx_bytes),
                    rx_packets: get(&n.rx_frames),
                    rx_errors: 0,
                    rx_dropped: get(&n.rx_dropped),
                    tx_bytes: get(&n.tx_bytes),
                    tx_packets: get(&n.tx_frames),
                    tx_errors: 0,
                    tx_dropped: get(&n.tx_dropped),
                }
            })
            .collect();
        VmmCounters {
            first_instruction_us: self.vm.first_instruction().map(micros),
            first_instruction_steps: self
                .vm
                .steps()
                .into_iter()
                .map(|(n, d)| (n.to_string(), micros(d)))
                .collect(),
            vcpu_exits: self.vm.exits(),
            pio_exits: self.vm.pio(),
            mmio_exits: self.vm.mmio(),
            bad_chains,
            fs_requests: self.fs.as_ref().map_or(0, |f| f.requests()),
            nics,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_instruction_is_timed_once_from_creation() {
        let created = Instant::now();
        let m = VmMetrics::new(created);
        assert_eq!(m.first_instruction(), None);
        std::thread::sleep(Duration::from_millis(5));
        m.step("a");
        m.entering_guest();
        let first = m.first_instruction().expect("timed");
        assert!(first >= Duration::from_millis(5), "{first:?}");
        let steps = m.steps();
        let names: Vec<&str> = steps.iter().map(|(n, _)| *n).collect();
        assert_eq!(names, ["a", "vCPU thread to KVM_RUN"]);
        assert!(steps.iter().map(|(_, d)| *d).sum::<Duration>() <= first);
        m.step("after");
        assert_eq!(m.steps().len(), 2, "steps after the first run are not kept");
        std::thread::sleep(Duration::from_millis(5));
        m.entering_guest();
        assert_eq!(m.first_instruction(), Some(first));
    }

    #[test]
    fn counters_sum_every_device_s_refused_chains() {
        let vm = Arc::new(VmMetrics::default());
        vm.count_exit();
        vm.count_exit();
        vm.count_mmio();
        let rng = Arc::new(QueueMetrics::default());
        rng.bad_chains.fetch_add(1, Ordering::Relaxed);
        let fs = Arc::new(FsMetrics::default());
        fs.bad_chains.fetch_add(2, Ordering::Relaxed);
        fs.requests.fetch_add(7, Ordering::Relaxed);
        let nic = Arc::new(NetMetrics::default());
        nic.bad_chains.fetch_add(4, Ordering::Relaxed);
        nic.rx_frames.fetch_add(3, Ordering::Relaxed);
        nic.rx_bytes.fetch_add(300, Ordering::Relaxed);
        nic.tx_dropped.fetch_add(1, Ordering::Relaxed);
        let c = MachineCounters {
            vm,
            rng,
            console: None,
            fs: Some(fs),
            nics: vec![nic],
        }
        .read();
        assert_eq!((c.vcpu_exits, c.mmio_exits, c.pio_exits), (2, 1, 0));
        assert_eq!(c.bad_chains, 7);
        assert_eq!(c.fs_requests, 7);
        assert_eq!(c.first_instruction_us, None);
        assert_eq!(c.nics.len(), 1);
        let n = &c.nics[0];
        assert_eq!(n.name, "eth0");
        assert_eq!((n.rx_packets, n.rx_bytes, n.tx_dropped), (3, 300, 1));
    }
}
