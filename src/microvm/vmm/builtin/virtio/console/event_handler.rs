//! The device in the VMM's event loop: the six queues' eventfds (written by
//! KVM or by the transport) and the host socket, watched only for what the
//! device waits for ([`Console::socket_interest`]), reconciled after every
//! event.

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;

use super::Console;

/// The socket's tag in the event loop; queue events are tagged with their
/// index.
const SOCKET: u32 = u32::MAX;

impl Console {
    /// Registers, changes or removes the socket's events so that the loop
    /// wakes the device only for what it waits for. A socket watched for
    /// nothing is not registered at all: a hang-up would otherwise be
    /// reported on every wait.
    fn sync_socket(&mut self, ops: &mut EventOps) {
        let want = self.socket_interest();
        if want == self.registered {
            return;
        }
        let result = if self.registered.is_empty() {
            ops.add(Events::with_data(&self.stream, SOCKET, want))
        } else if want.is_empty() {
            ops.remove(Events::with_data(&self.stream, SOCKET, self.registered))
        } else {
            ops.modify(Events::with_data(&self.stream, SOCKET, want))
        };
        match result {
            Ok(()) => self.registered = want,
            Err(e) => tracing::error!("virtio-console: cannot watch the host socket: {e}"),
        }
    }
}

impl MutEventSubscriber for Console {
    fn init(&mut self, ops: &mut EventOps) {
        for (i, evt) in self.queue_events.iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(evt, i as u32, EventSet::IN)) {
                tracing::error!("virtio-console: cannot watch queue {i}'s event: {e}");
            }
        }
        self.sync_socket(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let tag = events.data();
        let result = if tag == SOCKET {
            self.process_socket()
        } else if let Some(evt) = self.queue_events.get(tag as usize) {
            // The count does not matter: the queue is served either way.
            let _ = evt.read();
            self.process_queue(tag as usize)
        } else {
            tracing::debug!("virtio-console: event for unknown source {tag}");
            Ok(())
        };
        if let Err(e) = result {
            tracing::error!("virtio-console: {e}");
        }
        self.sync_socket(ops);
    }
}
