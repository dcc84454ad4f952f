//! The legacy PC devices a Linux guest needs: the serial port for early
//! debugging (off by default: each byte is a VM exit) and the i8042's
//! reset line, which is how the guest stops the VM (`reboot=k`).

pub mod i8042;
pub mod serial;
