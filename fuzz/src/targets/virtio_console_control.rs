//! The builtin VMM's virtio-console control messages
//! ([`agentvm::microvm::vmm::builtin::virtio::console::control`]): what a
//! guest's driver writes on the control transmit queue.
//!
//! An input is a port count byte, then the message bytes. `generate` lays
//! out 0 to 12 bytes with the event and port id drawn around the edges
//! (every defined event, the next one, `u16::MAX`; ports inside, at and
//! past the count, `u32::MAX`). A message that parses must have been
//! exactly 8 bytes, name an event a driver sends, a port that exists
//! (`DEVICE_READY` aside) and a 0/1 value; a device message built from it
//! must encode to 8 bytes that carry the same id.

use agentvm::microvm::vmm::builtin::virtio::console::control::{
    encode, event, parse_guest, DeviceMessage, GuestMessage, HEADER_LEN,
};
use arbitrary::Unstructured;

pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let ports: u8 = u.int_in_range(0..=4)?;
    let id: u32 = match u.int_in_range(0..=3)? {
        0 => u32::from(ports),
        1 => u32::MAX,
        2 => u.int_in_range(0..=5)?,
        _ => u.arbitrary()?,
    };
    let ev: u16 = match u.int_in_range(0..=2)? {
        0 => u.int_in_range(event::DEVICE_READY..=event::PORT_NAME + 1)?,
        1 => u16::MAX,
        _ => u.arbitrary()?,
    };
    let value: u16 = if u.arbitrary()? {
        u.int_in_range(0..=2)?
    } else {
        u.arbitrary()?
    };
    let mut out = vec![ports];
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&ev.to_le_bytes());
    out.extend_from_slice(&value.to_le_bytes());
    let extra: usize = u.int_in_range(0..=4)?;
    for _ in 0..extra {
        out.push(u.arbitrary()?);
    }
    let len = 1 + u.int_in_range(0..=out.len() - 1)?;
    out.truncate(len);
    Ok(out)
}

pub fn run(data: &[u8]) {
    let Some((&ports, msg)) = data.split_first() else {
        return;
    };
    let ports = u32::from(ports);
    let Ok(parsed) = parse_guest(msg, ports) else {
        return;
    };
    assert_eq!(
        msg.len(),
        HEADER_LEN,
        "a message of {} bytes parsed",
        msg.len()
    );
    let id = match parsed {
        GuestMessage::DeviceReady { .. } => return,
        GuestMessage::PortReady { id, .. } | GuestMessage::PortOpen { id, .. } => id,
    };
    assert!(id < ports, "port {id} of {ports} accepted");
    let mut out = Vec::new();
    encode(&DeviceMessage::PortOpen { id, open: true }, &mut out)
        .unwrap_or_else(|e| panic!("encoding PORT_OPEN failed: {e}"));
    assert_eq!(out.len(), HEADER_LEN);
    assert_eq!(out[..4], msg[..4]);
}
