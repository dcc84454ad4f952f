//! The device in the VMM's event loop: the two queues' eventfds (written
//! by KVM or by the transport) and the tap, watched only while a frame
//! read from it can go somewhere ([`Net::tap_interest`]), reconciled after
//! every event.

use event_manager::{EventOps, Events, MutEventSubscriber};

use super::Net;

/// The tap's tag in the event loop; queue events are tagged with their
/// index.
const TAP: u32 = u32::MAX;

impl Net {
    fn sync_tap(&mut self, ops: &mut EventOps) {
        let want = self.tap_interest();
        if want == self.registered {
            return;
        }
        let result = if self.registered.is_empty() {
            ops.add(Events::with_data(&self.tap, TAP, want))
        } else if want.is_empty() {
            ops.remove(Events::with_data(&self.tap, TAP, self.registered))
        } else {
            ops.modify(Events::with_data(&self.tap, TAP, want))
        };
        match result {
            Ok(()) => self.registered = want,
            Err(e) => tracing::error!("virtio-net: cannot watch the tap: {e}"),
        }
    }
}

impl MutEventSubscriber for Net {
    fn init(&mut self, ops: &mut EventOps) {
        for (i, evt) in self.queue_events.iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(
                evt,
                i as u32,
                vmm_sys_util::epoll::EventSet::IN,
            )) {
                tracing::error!("virtio-net: cannot watch queue {i}'s event: {e}");
            }
        }
        self.sync_tap(ops);
    }

    fn process(&mut self, events: Events, ops: &mut EventOps) {
        let tag = events.data();
        let result = if tag == TAP {
            self.process_tap()
        } else if let Some(evt) = self.queue_events.get(tag as usize) {
            // The count does not matter: the queue is served either way.
            let _ = evt.read();
            self.process_queue(tag as usize)
        } else {
            tracing::debug!("virtio-net: event for unknown source {tag}");
            Ok(())
        };
        if let Err(e) = result {
            tracing::error!("virtio-net: {e}");
        }
        self.sync_tap(ops);
    }
}
