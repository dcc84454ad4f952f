//! Control-queue messages of a multiport virtio-console (virtio 1.x,
//! 5.3.6.2): `struct virtio_console_control { le32 id; le16 event; le16
//! value; }`, followed by a name for `PORT_NAME`.
//!
//! What the guest sends is hostile: [`parse_guest`] checks the size, the
//! event (only those a driver sends), the port id (one that exists) and the
//! value, and returns a typed message or a [`ControlError`]; it never
//! panics. What the device sends is built by [`encode`], which refuses a
//! name longer than [`MAX_NAME_LEN`](super::MAX_NAME_LEN).

use super::MAX_NAME_LEN;

/// Size of the fixed part of a control message.
pub const HEADER_LEN: usize = 8;

/// Event ids (virtio 1.x, 5.3.6.2).
pub mod event {
    pub const DEVICE_READY: u16 = 0;
    pub const DEVICE_ADD: u16 = 1;
    pub const DEVICE_REMOVE: u16 = 2;
    pub const PORT_READY: u16 = 3;
    pub const CONSOLE_PORT: u16 = 4;
    pub const RESIZE: u16 = 5;
    pub const PORT_OPEN: u16 = 6;
    pub const PORT_NAME: u16 = 7;
}

/// Why a control message from the guest was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ControlError {
    #[error("a control message needs {HEADER_LEN} bytes, the guest sent {0}")]
    Truncated(usize),
    #[error("a control message of {0} bytes is longer than any the driver sends")]
    TooLong(usize),
    #[error("control event {0} is unknown or not one a driver sends")]
    UnknownEvent(u16),
    #[error("port {id} does not exist (the device has {ports})")]
    NoSuchPort { id: u32, ports: u32 },
    #[error("control event {event} has value {value}, which must be 0 or 1")]
    BadValue { event: u16, value: u16 },
    #[error("a port name of {0} bytes is longer than {MAX_NAME_LEN}")]
    NameTooLong(usize),
}

/// A message the driver sends on the control transmit queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GuestMessage {
    /// The driver is ready (`value` 1) or failed to set up (`value` 0).
    DeviceReady { ok: bool },
    /// The driver set up port `id` (`ok`) or failed to.
    PortReady { id: u32, ok: bool },
    /// An application in the guest opened (`open`) or closed port `id`.
    PortOpen { id: u32, open: bool },
}

/// A message the device sends on the control receive queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DeviceMessage<'a> {
    /// Port `id` exists; the driver answers with `PORT_READY`.
    DeviceAdd { id: u32 },
    /// Port `id` is a console (`hvc`).
    ConsolePort { id: u32 },
    /// The host side of port `id` is connected (`open`) or not.
    PortOpen { id: u32, open: bool },
    /// Port `id` is named `name` (shown in `/sys/class/virtio-ports`).
    PortName { id: u32, name: &'a [u8] },
}

fn flag(event: u16, value: u16) -> Result<bool, ControlError> {
    match value {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(ControlError::BadValue { event, value }),
    }
}

/// Parses one control message the guest sent, for a device with `ports`
/// ports (ids `0..ports`).
pub fn parse_guest(bytes: &[u8], ports: u32) -> Result<GuestMessage, ControlError> {
    let header: &[u8; HEADER_LEN] = match bytes.get(..HEADER_LEN) {
        Some(h) => h
            .try_into()
            .map_err(|_| ControlError::Truncated(bytes.len()))?,
        None => return Err(ControlError::Truncated(bytes.len())),
    };
    if bytes.len() > HEADER_LEN {
        return Err(ControlError::TooLong(bytes.len()));
    }
    let id = u32::from_le_bytes([header[0], header[1], header[2], header[3]]);
    let ev = u16::from_le_bytes([header[4], header[5]]);
    let value = u16::from_le_bytes([header[6], header[7]]);
    let port = |id: u32| {
        if id < ports {
            Ok(id)
        } else {
            Err(ControlError::NoSuchPort { id, ports })
        }
    };
    match ev {
        event::DEVICE_READY => Ok(GuestMessage::DeviceReady {
            ok: flag(ev, value)?,
        }),
        event::PORT_READY => Ok(GuestMessage::PortReady {
            id: port(id)?,
            ok: flag(ev, value)?,
        }),
        event::PORT_OPEN => Ok(GuestMessage::PortOpen {
            id: port(id)?,
            open: flag(ev, value)?,
        }),
        other => Err(ControlError::UnknownEvent(other)),
    }
}

/// Encodes `msg` into `out` (cleared first): the bytes to write into one
/// buffer of the control receive queue.
pub fn encode(msg: &DeviceMessage<'_>, out: &mut Vec<u8>) -> Result<(), ControlError> {
    let (id, ev, value, name): (u32, u16, u16, &[u8]) = match *msg {
        DeviceMessage::DeviceAdd { id } => (id, event::DEVICE_ADD, 0, &[]),
        DeviceMessage::ConsolePort { id } => (id, event::CONSOLE_PORT, 1, &[]),
        DeviceMessage::PortOpen { id, open } => (id, event::PORT_OPEN, u16::from(open), &[]),
        DeviceMessage::PortName { id, name } => {
            if name.len() > MAX_NAME_LEN {
                return Err(ControlError::NameTooLong(name.len()));
            }
            (id, event::PORT_NAME, 1, name)
        }
    };
    out.clear();
    out.extend_from_slice(&id.to_le_bytes());
    out.extend_from_slice(&ev.to_le_bytes());
    out.extend_from_slice(&value.to_le_bytes());
    out.extend_from_slice(name);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(id: u32, ev: u16, value: u16) -> Vec<u8> {
        let mut v = id.to_le_bytes().to_vec();
        v.extend_from_slice(&ev.to_le_bytes());
        v.extend_from_slice(&value.to_le_bytes());
        v
    }

    #[test]
    fn the_drivers_messages_in_its_handshake_order_parse() {
        // Linux's virtio_console: DEVICE_READY, then per port PORT_READY,
        // then PORT_OPEN when an application opens the port.
        assert_eq!(
            parse_guest(&raw(0, event::DEVICE_READY, 1), 2),
            Ok(GuestMessage::DeviceReady { ok: true })
        );
        assert_eq!(
            parse_guest(&raw(1, event::PORT_READY, 1), 2),
            Ok(GuestMessage::PortReady { id: 1, ok: true })
        );
        assert_eq!(
            parse_guest(&raw(1, event::PORT_OPEN, 0), 2),
            Ok(GuestMessage::PortOpen { id: 1, open: false })
        );
        // DEVICE_READY's id is not a port: any value is fine.
        assert_eq!(
            parse_guest(&raw(0xffff_ffff, event::DEVICE_READY, 0), 2),
            Ok(GuestMessage::DeviceReady { ok: false })
        );
    }

    #[test]
    fn hostile_messages_are_refused() {
        assert_eq!(parse_guest(&[], 2), Err(ControlError::Truncated(0)));
        assert_eq!(
            parse_guest(&raw(1, event::PORT_READY, 1)[..7], 2),
            Err(ControlError::Truncated(7))
        );
        let mut long = raw(1, event::PORT_READY, 1);
        long.push(0);
        assert_eq!(parse_guest(&long, 2), Err(ControlError::TooLong(9)));
        assert_eq!(
            parse_guest(&raw(2, event::PORT_READY, 1), 2),
            Err(ControlError::NoSuchPort { id: 2, ports: 2 })
        );
        assert_eq!(
            parse_guest(&raw(u32::MAX, event::PORT_OPEN, 1), 2),
            Err(ControlError::NoSuchPort {
                id: u32::MAX,
                ports: 2
            })
        );
        assert_eq!(
            parse_guest(&raw(1, event::PORT_OPEN, 2), 2),
            Err(ControlError::BadValue {
                event: event::PORT_OPEN,
                value: 2
            })
        );
        // Events only the device sends, and ids nobody defined.
        for ev in [
            event::DEVICE_ADD,
            event::DEVICE_REMOVE,
            event::CONSOLE_PORT,
            event::RESIZE,
            event::PORT_NAME,
            8,
            u16::MAX,
        ] {
            assert_eq!(
                parse_guest(&raw(1, ev, 1), 2),
                Err(ControlError::UnknownEvent(ev))
            );
        }
    }

    #[test]
    fn device_messages_encode_as_the_spec_lays_them_out() {
        let mut out = Vec::new();
        encode(&DeviceMessage::DeviceAdd { id: 1 }, &mut out).unwrap();
        assert_eq!(out, raw(1, event::DEVICE_ADD, 0));
        encode(&DeviceMessage::ConsolePort { id: 0 }, &mut out).unwrap();
        assert_eq!(out, raw(0, event::CONSOLE_PORT, 1));
        encode(&DeviceMessage::PortOpen { id: 1, open: true }, &mut out).unwrap();
        assert_eq!(out, raw(1, event::PORT_OPEN, 1));
        encode(&DeviceMessage::PortOpen { id: 1, open: false }, &mut out).unwrap();
        assert_eq!(out, raw(1, event::PORT_OPEN, 0));
        encode(
            &DeviceMessage::PortName {
                id: 1,
                name: crate::protocol::PORT_NAME.as_bytes(),
            },
            &mut out,
        )
        .unwrap();
        let mut want = raw(1, event::PORT_NAME, 1);
        want.extend_from_slice(crate::protocol::PORT_NAME.as_bytes());
        assert_eq!(out, want);
    }

    #[test]
    fn a_name_longer_than_allowed_is_refused() {
        let mut out = vec![9];
        let name = [b'a'; MAX_NAME_LEN + 1];
        assert_eq!(
            encode(&DeviceMessage::PortName { id: 1, name: &name }, &mut out),
            Err(ControlError::NameTooLong(MAX_NAME_LEN + 1))
        );
        // Nothing was written.
        assert_eq!(out, vec![9]);
        let name = [b'a'; MAX_NAME_LEN];
        encode(&DeviceMessage::PortName { id: 1, name: &name }, &mut out).unwrap();
        assert_eq!(out.len(), HEADER_LEN + MAX_NAME_LEN);
    }

    #[test]
    fn the_protocols_port_name_fits() {
        assert!(crate::protocol::PORT_NAME.len() <= MAX_NAME_LEN);
    }
}
