//! The 16550A serial port on COM1 (`vm-superio`), where the guest's early
//! console goes when the VM is started with one.

use std::io::Write;

use vm_superio::serial::NoEvents;
use vm_superio::{Serial, Trigger};
use vmm_sys_util::eventfd::EventFd;

use crate::microvm::vmm::builtin::bus::BusDevice;

/// COM1.
pub const BASE: u64 = 0x3f8;
pub const LEN: u64 = 8;
/// Its interrupt (ISA IRQ 4).
pub const IRQ: u32 = 4;

/// The serial port's interrupt line: an eventfd registered with KVM.
pub struct IrqLine(pub EventFd);

impl Trigger for IrqLine {
    type E = std::io::Error;

    fn trigger(&self) -> std::io::Result<()> {
        self.0.write(1)
    }
}

pub struct SerialPort<W: Write + Send> {
    serial: Serial<IrqLine, NoEvents, W>,
}

impl<W: Write + Send> SerialPort<W> {
    pub fn new(irq: EventFd, out: W) -> SerialPort<W> {
        SerialPort {
            serial: Serial::new(IrqLine(irq), out),
        }
    }

    pub fn output(&self) -> &W {
        self.serial.writer()
    }
}

impl<W: Write + Send> BusDevice for SerialPort<W> {
    fn read(&mut self, offset: u64, data: &mut [u8]) {
        match (u8::try_from(offset), data) {
            (Ok(o), [b]) => *b = self.serial.read(o),
            (_, data) => data.fill(0),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if let (Ok(o), [b]) = (u8::try_from(offset), data) {
            if let Err(e) = self.serial.write(o, *b) {
                tracing::debug!("serial: {e:?}");
            }
        }
    }
}
