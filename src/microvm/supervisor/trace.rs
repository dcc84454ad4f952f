//! The boot trace: where a microVM's `create` spends its time, part by
//! part, from the supervisor's start to the container created in the
//! guest. Kept in `microvm.json` (`boot`), logged at debug level, and read
//! by `make bench` for its cold-start breakdown.
//!
//! The host measures each part on its own monotonic clock. The span from
//! the VMM's launch to the guest's Hello is split with the milestones the
//! guest reports (its kernel's start to /init, /init to the agent ready):
//! the guest is not trusted for them, so milestones that do not fit inside
//! what the host measured leave that span whole.

use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::protocol::GuestBoot;

/// One part of the boot and how long it took, in microseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BootPart {
    pub part: String,
    pub us: u64,
}

/// The parts measured so far.
#[derive(Debug)]
pub struct BootTrace {
    last: Instant,
    parts: Vec<BootPart>,
}

/// The span from the VMM's launch to the guest's Hello, when the guest
/// does not say (or says something impossible).
pub const GUEST_BOOT: &str = "guest boot";

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl BootTrace {
    /// A trace whose first part starts at `start`.
    pub fn new(start: Instant) -> Self {
        BootTrace {
            last: start,
            parts: Vec::new(),
        }
    }

    /// Ends the current part, named `part`, now.
    pub fn mark(&mut self, part: &str) {
        self.mark_at(part, Instant::now());
    }

    fn mark_at(&mut self, part: &str, now: Instant) {
        let us = micros(now.saturating_duration_since(self.last));
        self.last = now;
        self.parts.push(BootPart {
            part: part.to_string(),
            us,
        });
    }

    /// Ends the span from the VMM's launch to the guest's Hello, now,
    /// split by the guest's milestones when they fit in it: the VMM's own
    /// start (until the guest kernel's first instruction), the kernel (to
    /// /init), and the agent (to Hello).
    pub fn guest_booted(&mut self, guest: Option<GuestBoot>) {
        self.guest_booted_at(guest, Instant::now());
    }

    fn guest_booted_at(&mut self, guest: Option<GuestBoot>, now: Instant) {
        let span = micros(now.saturating_duration_since(self.last));
        self.last = now;
        let split = guest.filter(|g| g.init_us <= g.ready_us && g.ready_us <= span);
        match split {
            Some(g) => {
                for (part, us) in [
                    ("vmm start", span - g.ready_us),
                    ("kernel", g.init_us),
                    ("agent", g.ready_us - g.init_us),
                ] {
                    self.parts.push(BootPart {
                        part: part.to_string(),
                        us,
                    });
                }
            }
            None => self.parts.push(BootPart {
                part: GUEST_BOOT.to_string(),
                us: span,
            }),
        }
    }

    pub fn parts(&self) -> &[BootPart] {
        &self.parts
    }

    /// "setup 2.1 ms, hooks 0.0 ms, …; total 1234.5 ms", for the log.
    pub fn summary(&self) -> String {
        let ms = |us: u64| us as f64 / 1000.0;
        let total: u64 = self.parts.iter().map(|p| p.us).fold(0, u64::saturating_add);
        let parts: Vec<String> = self
            .parts
            .iter()
            .map(|p| format!("{} {:.1} ms", p.part, ms(p.us)))
            .collect();
        format!("{}; total {:.1} ms", parts.join(", "), ms(total))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn names(t: &BootTrace) -> Vec<(&str, u64)> {
        t.parts().iter().map(|p| (p.part.as_str(), p.us)).collect()
    }

    #[test]
    fn parts_follow_each_other() {
        let t0 = Instant::now();
        let mut t = BootTrace::new(t0);
        t.mark_at("setup", t0 + Duration::from_millis(3));
        t.mark_at("hooks", t0 + Duration::from_millis(5));
        t.guest_booted_at(
            Some(GuestBoot {
                init_us: 600_000,
                ready_us: 650_000,
            }),
            t0 + Duration::from_millis(905),
        );
        t.mark_at("container", t0 + Duration::from_millis(1005));
        assert_eq!(
            names(&t),
            vec![
                ("setup", 3_000),
                ("hooks", 2_000),
                ("vmm start", 250_000),
                ("kernel", 600_000),
                ("agent", 50_000),
                ("container", 100_000),
            ]
        );
        assert!(
            t.summary().ends_with("; total 1005.0 ms"),
            "{}",
            t.summary()
        );
    }

    #[test]
    fn milestones_that_do_not_fit_leave_the_span_whole() {
        let t0 = Instant::now();
        let at = t0 + Duration::from_millis(500);
        for lie in [
            // Later than the host's whole span.
            GuestBoot {
                init_us: 100,
                ready_us: 900_000,
            },
            // Ready before /init.
            GuestBoot {
                init_us: 300_000,
                ready_us: 200_000,
            },
            GuestBoot {
                init_us: u64::MAX,
                ready_us: u64::MAX,
            },
        ] {
            let mut t = BootTrace::new(t0);
            t.guest_booted_at(Some(lie), at);
            assert_eq!(names(&t), vec![(GUEST_BOOT, 500_000)], "{lie:?}");
        }
        let mut t = BootTrace::new(t0);
        t.guest_booted_at(None, at);
        assert_eq!(names(&t), vec![(GUEST_BOOT, 500_000)]);
    }

    #[test]
    fn a_clock_that_seems_to_go_back_gives_zero() {
        let t0 = Instant::now() + Duration::from_secs(1);
        let mut t = BootTrace::new(t0);
        t.mark_at("setup", t0 - Duration::from_millis(1));
        assert_eq!(names(&t), vec![("setup", 0)]);
    }
}
