//! Where the egress daemon's events go: the audit log, stamped with the
//! container's id, with denials to one destination kept to one line per
//! [`DENY_INTERVAL`] (a flood of packets or connections to a denied
//! address cannot fill the disk).

use std::path::Path;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use crate::audit::{DenyLimiter, Event, Log};

/// One line per denied destination per this long.
pub const DENY_INTERVAL: Duration = Duration::from_secs(60);
/// Denied destinations tracked at once.
pub const DENY_CAPACITY: usize = 1024;

enum Sink {
    File(Log),
    /// Kept in memory (tests).
    Memory(Mutex<Vec<Event>>),
    None,
}

pub struct Trail {
    id: String,
    sink: Sink,
    limiter: Mutex<DenyLimiter>,
}

impl Trail {
    /// The audit log at `path` for container `id`; without one (it cannot
    /// be opened), events are logged as warnings only.
    pub fn open(path: Option<&Path>, id: &str) -> Trail {
        let sink = match path.map(Log::open) {
            Some(Ok(log)) => Sink::File(log),
            Some(Err(e)) => {
                tracing::warn!("{e}: the audit trail of {id} is lost");
                Sink::None
            }
            None => Sink::None,
        };
        Trail::with(sink, id)
    }

    /// A trail that keeps events in memory, for tests.
    pub fn memory(id: &str) -> Trail {
        Trail::with(Sink::Memory(Mutex::new(Vec::new())), id)
    }

    fn with(sink: Sink, id: &str) -> Trail {
        Trail {
            id: id.to_string(),
            sink,
            limiter: Mutex::new(DenyLimiter::new(DENY_INTERVAL, DENY_CAPACITY)),
        }
    }

    /// The events kept by [`Trail::memory`].
    pub fn events(&self) -> Vec<Event> {
        match &self.sink {
            Sink::Memory(m) => m.lock().map(|v| v.clone()).unwrap_or_default(),
            _ => Vec::new(),
        }
    }

    pub fn record(&self, event: Event) {
        match &self.sink {
            Sink::File(log) => {
                if let Err(e) = log.append(&self.id, event) {
                    tracing::warn!("{e}");
                }
            }
            Sink::Memory(m) => {
                if let Ok(mut v) = m.lock() {
                    v.push(event);
                }
            }
            Sink::None => {}
        }
    }

    /// Records an event unless one for `key` (a denied destination, a
    /// name) was recorded less than [`DENY_INTERVAL`] ago; `event` gets
    /// the count of those not recorded since.
    pub fn limited(&self, key: &str, event: impl FnOnce(u64) -> Event) {
        let admitted = match self.limiter.lock() {
            Ok(mut l) => l.admit(key, Instant::now()),
            Err(_) => None,
        };
        if let Some(suppressed) = admitted {
            self.record(event(suppressed));
        }
    }
}
