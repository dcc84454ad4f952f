//! Pause and resume by parking the vCPUs (Firecracker's and Cloud
//! Hypervisor's way): `pause` asks every vCPU to park, kicks each out of
//! `KVM_RUN` with the kick signal, and returns once all are parked; the
//! guest runs no instruction until `resume`. The devices' threads go on
//! (a packet or a host file answer can still land in guest memory, where
//! the guest sees it when it runs again), and so does the supervisor,
//! which can answer `state` and refuse what needs the guest.
//!
//! A kick that lands just before a vCPU enters `KVM_RUN` is lost; the
//! vCPU looks at the request before each entry, and `pause` kicks again
//! until every vCPU has said it is parked.

use std::sync::{Condvar, Mutex};
use std::time::{Duration, Instant};

use super::vcpu::StopSignal;

/// How long `pause` waits for every vCPU to park.
pub const PARK_TIMEOUT: Duration = Duration::from_secs(5);

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum ParkError {
    #[error("{parked} of {vcpus} vCPUs parked within {PARK_TIMEOUT:?}")]
    Timeout { parked: usize, vcpus: usize },
    #[error("the VM is stopping")]
    Stopping,
}

#[derive(Debug, Default)]
struct ParkState {
    /// Whether the vCPUs are asked to park.
    requested: bool,
    /// How many are parked.
    parked: usize,
    /// The vCPU threads, to kick (registered once they run).
    threads: Vec<libc::pthread_t>,
}

/// Shared by the VM's vCPUs and whoever pauses it.
#[derive(Debug, Default)]
pub struct Park {
    state: Mutex<ParkState>,
    changed: Condvar,
}

impl Park {
    fn lock(&self) -> std::sync::MutexGuard<'_, ParkState> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Registers a running vCPU's thread, for `pause` to kick.
    pub fn register(&self, thread: libc::pthread_t) {
        self.lock().threads.push(thread);
    }

    /// Called by the runner before it joins the vCPU threads: their
    /// handles are no longer to be kicked.
    pub fn forget_threads(&self) {
        self.lock().threads.clear();
    }

    /// Called by a vCPU before each entry into the guest: while a pause is
    /// requested it stays here (parked), unless the VM is stopping.
    pub fn wait_while_paused(&self, stop: &StopSignal) {
        let mut s = self.lock();
        if !s.requested {
            return;
        }
        s.parked += 1;
        self.changed.notify_all();
        while s.requested && stop.requested().is_none() {
            s = match self.changed.wait_timeout(s, Duration::from_millis(50)) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
        s.parked -= 1;
        self.changed.notify_all();
    }

    /// Parks every vCPU of `vcpus` and returns once they are; a pause that
    /// times out is taken back.
    pub fn pause(&self, vcpus: usize, stop: &StopSignal) -> Result<(), ParkError> {
        let deadline = Instant::now() + PARK_TIMEOUT;
        let mut s = self.lock();
        s.requested = true;
        loop {
            if s.parked >= vcpus {
                return Ok(());
            }
            let failed = if stop.requested().is_some() {
                Some(ParkError::Stopping)
            } else if Instant::now() >= deadline {
                Some(ParkError::Timeout {
                    parked: s.parked,
                    vcpus,
                })
            } else {
                None
            };
            if let Some(e) = failed {
                s.requested = false;
                self.changed.notify_all();
                return Err(e);
            }
            for &t in &s.threads {
                // SAFETY: pthread_kill on a vCPU thread of this process,
                // which the runner joins only after the VM has stopped
                // (and a stopping VM is refused above); the kick's handler
                // does nothing.
                unsafe { libc::pthread_kill(t, super::machine::kick_signal()) };
            }
            s = match self.changed.wait_timeout(s, Duration::from_millis(2)) {
                Ok((guard, _)) => guard,
                Err(e) => e.into_inner().0,
            };
        }
    }

    /// Lets the vCPUs run again.
    pub fn resume(&self) {
        self.lock().requested = false;
        self.changed.notify_all();
    }

    pub fn paused(&self) -> bool {
        self.lock().requested
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicU64, Ordering};
    use std::sync::Arc;

    use crate::microvm::vmm::builtin::vcpu::StopReason;

    /// Stand-ins for vCPUs: each counts its "guest" steps, sleeps in a
    /// call the kick interrupts (as KVM_RUN), and looks at the park and
    /// the stop before each step, as a vCPU's run loop does.
    fn vcpus(
        n: usize,
        park: &Arc<Park>,
        stop: &Arc<StopSignal>,
    ) -> (Vec<std::thread::JoinHandle<()>>, Arc<AtomicU64>) {
        crate::microvm::vmm::builtin::machine::install_kick().unwrap();
        let steps = Arc::new(AtomicU64::new(0));
        let threads = (0..n)
            .map(|_| {
                let (mine, stop, steps) = (park.clone(), stop.clone(), steps.clone());
                let t = std::thread::spawn(move || loop {
                    if stop.requested().is_some() {
                        return;
                    }
                    mine.wait_while_paused(&stop);
                    if stop.requested().is_some() {
                        return;
                    }
                    steps.fetch_add(1, Ordering::SeqCst);
                    // A long sleep that a kick ends early with EINTR, as
                    // it ends KVM_RUN (std's sleep would sleep on).
                    let t = libc::timespec {
                        tv_sec: 30,
                        tv_nsec: 0,
                    };
                    // SAFETY: a valid timespec; no remainder is asked for.
                    unsafe { libc::nanosleep(&t, std::ptr::null_mut()) };
                });
                use std::os::unix::thread::JoinHandleExt;
                park.register(t.as_pthread_t());
                t
            })
            .collect();
        (threads, steps)
    }

    #[test]
    fn pause_parks_every_vcpu_and_resume_lets_them_go_on() {
        let (park, stop) = (Arc::new(Park::default()), Arc::new(StopSignal::default()));
        let (threads, steps) = vcpus(3, &park, &stop);
        // Each sits in its long sleep; pause must kick them out of it.
        std::thread::sleep(Duration::from_millis(50));
        let started = Instant::now();
        park.pause(3, &stop).unwrap();
        assert!(started.elapsed() < Duration::from_secs(2));
        assert!(park.paused());
        let frozen = steps.load(Ordering::SeqCst);
        std::thread::sleep(Duration::from_millis(100));
        assert_eq!(
            steps.load(Ordering::SeqCst),
            frozen,
            "a vCPU ran while paused"
        );
        park.resume();
        assert!(!park.paused());
        let deadline = Instant::now() + Duration::from_secs(5);
        while steps.load(Ordering::SeqCst) < frozen + 3 {
            assert!(Instant::now() < deadline, "the vCPUs did not go on");
            std::thread::sleep(Duration::from_millis(5));
        }
        // A stop ends parked vCPUs too, and a stopping VM is not paused.
        park.pause(3, &stop).unwrap();
        stop.request(StopReason::Requested);
        park.forget_threads();
        for t in threads {
            t.join().unwrap();
        }
        park.resume();
        assert_eq!(park.pause(3, &stop), Err(ParkError::Stopping));
        assert!(!park.paused(), "a failed pause is taken back");
    }
}
