//! The device in an event loop: a notification of either queue (its
//! eventfd, written by KVM or by the transport) serves that queue.

use event_manager::{EventOps, Events, MutEventSubscriber};
use vmm_sys_util::epoll::EventSet;

use super::{queues, Fs};

impl MutEventSubscriber for Fs {
    fn init(&mut self, ops: &mut EventOps) {
        for (index, evt) in self.queue_events.iter().enumerate() {
            if let Err(e) = ops.add(Events::with_data(evt, index as u32, EventSet::IN)) {
                tracing::error!("virtio-fs: cannot watch queue {index}'s event: {e}");
            }
        }
    }

    fn process(&mut self, events: Events, _ops: &mut EventOps) {
        let index = events.data() as usize;
        if events.event_set() != EventSet::IN || index >= queues::COUNT {
            tracing::debug!(
                "virtio-fs: unexpected event {:?} for {index}",
                events.event_set()
            );
            return;
        }
        // The count does not matter: the queue is served either way.
        let _ = self.queue_events[index].read();
        if let Err(e) = self.process_queue(index) {
            tracing::error!("virtio-fs: {e}");
        }
    }
}
