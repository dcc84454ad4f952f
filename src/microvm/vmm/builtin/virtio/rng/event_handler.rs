//! The device in the VMM's event loop: a notification of its queue (the
//! queue's eventfd, written by KVM or by the transport) serves the queue.

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;

use super::Rng;

impl MutEventSubscriber for Rng {
    fn init(&mut self, ops: &mut EventOps) {
        if let Err(e) = ops.add(Events::new(&self.queue_events[0], EventSet::IN)) {
            tracing::error!("virtio-rng: cannot watch the queue's event: {e}");
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        if events.event_set() != EventSet::IN {
            tracing::debug!("virtio-rng: unexpected event {:?}", events.event_set());
            return;
        }
        // The count does not matter: the queue is drained either way.
        let _ = self.queue_events[0].read();
        if let Err(e) = self.process_queue() {
            tracing::error!("virtio-rng: {e}");
        }
    }
}
