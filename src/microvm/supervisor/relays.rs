//! Bookkeeping of exec relays: which guest stream belongs to which
//! `agentvm exec` connection, and the order in which a connection sees its
//! frames.
//!
//! An exec's connection must receive the `Started` reply before anything
//! of its stream: a process that ends at once has its exit frame on its way
//! right behind the guest's reply, and the reader thread (which forwards
//! the exit) and the request handler (which writes the reply) race. So a
//! stream is registered before its `Exec` request is sent, and frames for
//! it wait until the handler has written the reply and marked it started.

use std::collections::HashMap;
use std::io::Write;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Condvar, Mutex};
use std::time::Duration;

/// How long a frame for a stream waits for its `Started` reply to be
/// written before it is dropped.
const START_WAIT: Duration = Duration::from_secs(30);

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum RelayError {
    /// The guest named a stream the host never handed out.
    #[error("{what} for stream {id}, which the host never started")]
    NeverStarted { what: &'static str, id: u32 },
    #[error("exec relay bookkeeping poisoned")]
    Poisoned,
}

struct Relay<W> {
    conn: W,
    /// The `Started` reply has been written to `conn`.
    started: bool,
}

/// The exec relays of one supervisor, by stream id.
pub struct Relays<W> {
    relays: Mutex<HashMap<u32, Relay<W>>>,
    changed: Condvar,
    next: AtomicU32,
}

/// What became of a frame handed to [`Relays::deliver`].
#[derive(Debug, PartialEq, Eq)]
pub enum Delivery {
    Written,
    /// The relay is gone (hung up, failed to start, or timed out waiting):
    /// the frame has nobody to go to.
    Dropped,
}

impl<W: Write> Relays<W> {
    pub fn new() -> Relays<W> {
        Relays {
            relays: Mutex::new(HashMap::new()),
            changed: Condvar::new(),
            // Stream 0 is the container's init.
            next: AtomicU32::new(1),
        }
    }

    /// Hands out a stream id for a new exec and registers its connection,
    /// not yet started. Call before the `Exec` request is sent.
    pub fn reserve(&self, conn: W) -> Result<u32, RelayError> {
        let mut relays = self.relays.lock().map_err(|_| RelayError::Poisoned)?;
        let id = self.next.fetch_add(1, Ordering::SeqCst);
        relays.insert(
            id,
            Relay {
                conn,
                started: false,
            },
        );
        Ok(id)
    }

    /// The `Started` reply has been written: frames for `id` may flow.
    pub fn started(&self, id: u32) {
        if let Ok(mut relays) = self.relays.lock() {
            if let Some(r) = relays.get_mut(&id) {
                r.started = true;
            }
        }
        self.changed.notify_all();
    }

    /// Forgets a relay (its start failed or its connection went away).
    /// Returns whether it was still registered, i.e. its process has not
    /// been reported as ended.
    pub fn remove(&self, id: u32) -> bool {
        let removed = self
            .relays
            .lock()
            .map(|mut r| r.remove(&id).is_some())
            .unwrap_or(false);
        self.changed.notify_all();
        removed
    }

    /// Whether the host has handed out stream `id`.
    pub fn issued(&self, id: u32) -> bool {
        id != 0 && id < self.next.load(Ordering::SeqCst)
    }

    /// Writes `bytes` (one encoded frame) to stream `id`'s relay once it has
    /// started; with `last` (the stream's exit) the relay is then removed.
    pub fn deliver(
        &self,
        what: &'static str,
        id: u32,
        bytes: &[u8],
        last: bool,
    ) -> Result<Delivery, RelayError> {
        if !self.issued(id) {
            return Err(RelayError::NeverStarted { what, id });
        }
        let relays = self.relays.lock().map_err(|_| RelayError::Poisoned)?;
        let (mut relays, _) = self
            .changed
            .wait_timeout_while(relays, START_WAIT, |r| {
                r.get(&id).is_some_and(|relay| !relay.started)
            })
            .map_err(|_| RelayError::Poisoned)?;
        let Some(relay) = relays.get_mut(&id).filter(|r| r.started) else {
            return Ok(Delivery::Dropped);
        };
        let written = relay.conn.write_all(bytes).and_then(|_| relay.conn.flush());
        if last || written.is_err() {
            relays.remove(&id);
        }
        Ok(if written.is_ok() {
            Delivery::Written
        } else {
            Delivery::Dropped
        })
    }
}

impl<W: Write> Default for Relays<W> {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    /// A connection that records what was written to it.
    #[derive(Clone, Default)]
    struct Conn(Arc<Mutex<Vec<u8>>>);

    impl Write for Conn {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.lock().unwrap().extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }

    impl Conn {
        fn text(&self) -> String {
            String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
        }
    }

    #[test]
    fn an_exit_that_overtakes_the_reply_waits_for_it() {
        let relays = Arc::new(Relays::new());
        let mut conn = Conn::default();
        let id = relays.reserve(conn.clone()).unwrap();
        assert_eq!(id, 1);
        // The reader thread gets the exit before the handler wrote the reply.
        let reader = {
            let relays = relays.clone();
            std::thread::spawn(move || relays.deliver("an exit", id, b"[exit]", true))
        };
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(conn.text(), "", "nothing may precede the reply");
        conn.write_all(b"[started]").unwrap();
        relays.started(id);
        assert_eq!(reader.join().unwrap(), Ok(Delivery::Written));
        assert_eq!(conn.text(), "[started][exit]");
        // The exit ended the stream.
        assert!(!relays.remove(id));
    }

    #[test]
    fn frames_of_a_stream_whose_start_failed_are_dropped() {
        let relays = Arc::new(Relays::new());
        let conn = Conn::default();
        let id = relays.reserve(conn.clone()).unwrap();
        let reader = {
            let relays = relays.clone();
            std::thread::spawn(move || relays.deliver("output", id, b"x", false))
        };
        std::thread::sleep(Duration::from_millis(20));
        assert!(relays.remove(id));
        assert_eq!(reader.join().unwrap(), Ok(Delivery::Dropped));
        assert_eq!(conn.text(), "");
    }

    #[test]
    fn streams_never_handed_out_are_a_violation() {
        let relays: Relays<Conn> = Relays::new();
        assert_eq!(
            relays.deliver("an exit", 7, b"", true),
            Err(RelayError::NeverStarted {
                what: "an exit",
                id: 7
            })
        );
        assert!(!relays.issued(0));
        let id = relays.reserve(Conn::default()).unwrap();
        assert!(relays.issued(id));
        assert!(!relays.issued(id + 1));
    }

    #[test]
    fn output_flows_in_order_once_started_and_a_gone_relay_drops() {
        let relays = Relays::new();
        let conn = Conn::default();
        let id = relays.reserve(conn.clone()).unwrap();
        relays.started(id);
        for chunk in ["a", "b", "c"] {
            assert_eq!(
                relays.deliver("output", id, chunk.as_bytes(), false),
                Ok(Delivery::Written)
            );
        }
        assert_eq!(conn.text(), "abc");
        assert!(relays.remove(id));
        assert_eq!(
            relays.deliver("output", id, b"d", false),
            Ok(Delivery::Dropped)
        );
    }

    #[test]
    fn many_racing_execs_each_see_reply_then_exit() {
        let relays = Arc::new(Relays::new());
        let mut handles = Vec::new();
        for _ in 0..64 {
            let relays = relays.clone();
            handles.push(std::thread::spawn(move || {
                let mut conn = Conn::default();
                let id = relays.reserve(conn.clone()).unwrap();
                let reader = {
                    let relays = relays.clone();
                    std::thread::spawn(move || relays.deliver("an exit", id, b"E", true))
                };
                std::thread::yield_now();
                conn.write_all(b"S").unwrap();
                relays.started(id);
                assert_eq!(reader.join().unwrap(), Ok(Delivery::Written));
                assert_eq!(conn.text(), "SE");
            }));
        }
        for h in handles {
            h.join().unwrap();
        }
    }
}
