//! Just enough of the i8042 keyboard controller for the guest to stop the
//! VM: writing the "pulse reset" command (0xfe) to its command port.

use std::sync::Arc;

use crate::microvm::vmm::builtin::bus::BusDevice;
use crate::microvm::vmm::builtin::vcpu::{StopReason, StopSignal};

/// Ports 0x60 (data) to 0x64 (command/status).
pub const BASE: u64 = 0x60;
pub const LEN: u64 = 5;
const COMMAND: u64 = 4;
const PULSE_RESET: u8 = 0xfe;

pub struct I8042 {
    stop: Arc<StopSignal>,
}

impl I8042 {
    pub fn new(stop: Arc<StopSignal>) -> I8042 {
        I8042 { stop }
    }
}

impl BusDevice for I8042 {
    fn read(&mut self, _offset: u64, data: &mut [u8]) {
        // No keyboard: empty buffers, nothing to read.
        data.fill(0);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if offset == COMMAND && data.first() == Some(&PULSE_RESET) {
            self.stop.request(StopReason::Reset);
        }
    }
}
