//! The guest-to-host protocol: bytes the guest writes to the control port.
//!
//! An input is the byte stream itself. `generate` encodes one to four
//! messages with the real encoder (every [`GuestMessage`] and stdio kind,
//! with edge-case values), then mutates the bytes: bit flips, length
//! fields set to huge values, truncation, splices. `run` decodes the stream
//! the two ways the host can — the blocking [`Frame::read_from`] (the
//! supervisor) over short reads and `EINTR`, and the incremental
//! [`Decoder`] fed in random chunks — and checks that they agree, that
//! each decoded frame re-encodes to the bytes it came from, and that an
//! error is a violation exactly when the bytes broke the protocol. Control
//! payloads go through every control-message decoder the host has, and a
//! guest log line through the sanitiser that puts it in the host's log.

use std::io::{self, Read};
use std::time::Instant;

use agentvm::microvm::client::{ExecControl, ExecEvent, SupervisorRequest};
use agentvm::microvm::supervisor::guest_log::{sanitise, GuestLog, MAX_LINE};
use agentvm_protocol::{
    Decoder, Frame, GuestMessage, GuestProcess, GuestStats, HostMessage, Kind, ProtocolError,
    Reply, HEADER_LEN, MAX_PAYLOAD, VERSION,
};
use arbitrary::{Arbitrary, Unstructured};

use crate::rng::{fnv1a, Rng};

/// Tokens worth splicing into an encoded stream.
const DICT: &[&str] = &[
    "{",
    "}",
    "[",
    "]",
    ",",
    ":",
    "\"",
    "null",
    "true",
    "\"type\"",
    "\"hello\"",
    "\"reply\"",
    "\"exit\"",
    "\"log\"",
    "\"result\"",
    "\"ok\"",
    "\"pids\"",
    "\"stats\"",
    "\"error\"",
    "\"message\"",
    "\"level\"",
    "\\u0000",
    "\\ud800",
    "\\u001b[2J",
    "\\n",
    "\u{2028}",
    "\u{202e}",
    "\u{85}",
    "\u{feff}",
];

#[derive(Arbitrary, Debug)]
enum Num {
    Zero,
    Max,
    Min,
    Any(i64),
}

impl Num {
    fn i32(&self) -> i32 {
        match self {
            Num::Zero => 0,
            Num::Max => i32::MAX,
            Num::Min => i32::MIN,
            Num::Any(n) => *n as i32,
        }
    }
    fn u32(&self) -> u32 {
        match self {
            Num::Zero => 0,
            Num::Max => u32::MAX,
            Num::Min => 1,
            Num::Any(n) => *n as u32,
        }
    }
    fn u64(&self) -> u64 {
        match self {
            Num::Zero => 0,
            Num::Max => u64::MAX,
            Num::Min => 1,
            Num::Any(n) => *n as u64,
        }
    }
}

/// Text a hostile guest might log.
#[derive(Arbitrary, Debug)]
enum Text {
    Any(String),
    /// Control characters, escapes, line and bidi separators.
    Controls(Vec<u8>),
    /// One character many times (past the log's line limit).
    Long(char, u16),
}

impl Text {
    fn string(&self) -> String {
        const ODD: &[char] = &[
            '\n', '\r', '\x1b', '\0', '\x7f', '\u{85}', '\u{2028}', '\u{202e}',
        ];
        match self {
            Text::Any(s) => s.clone(),
            Text::Controls(b) => b
                .iter()
                .map(|b| match b % 3 {
                    0 => ODD[usize::from(*b) % ODD.len()],
                    1 => char::from(b % 0x20),
                    _ => char::from(b'a' + b % 26),
                })
                .collect(),
            Text::Long(c, n) => std::iter::repeat_n(*c, usize::from(*n) % 4096).collect(),
        }
    }
}

#[derive(Arbitrary, Debug)]
enum Seed {
    Hello {
        current: bool,
        version: Num,
        kernel: Text,
    },
    Ok,
    Created(Num),
    Started(Num),
    Pids(Vec<Num>, Vec<(Num, Num, Num, Text)>),
    Stats([Num; 7]),
    /// A reply carrying VMM counters, which only the supervisor may add
    /// (it drops the guest's): they must still parse and round-trip.
    StatsWithVmm([Num; 4], Text),
    Error(Text),
    Exit(Num, Num),
    Log(u8, Text),
    Data {
        kind: u8,
        stream: Num,
        payload: Vec<u8>,
    },
    /// A data frame near the payload limit.
    Big {
        kind: u8,
        extra: u8,
    },
}

fn kind_of(b: u8) -> Kind {
    match b % 5 {
        0 => Kind::Stdout,
        1 => Kind::Stderr,
        2 => Kind::Stdin,
        3 => Kind::StdinClose,
        _ => Kind::Control,
    }
}

fn frame_of(seed: &Seed) -> Frame {
    let msg = match seed {
        Seed::Hello {
            current,
            version,
            kernel,
        } => GuestMessage::Hello {
            version: if *current { VERSION } else { version.u32() },
            kernel: kernel.string(),
            boot: None,
        },
        Seed::Ok => GuestMessage::Reply(Reply::Ok),
        Seed::Created(pid) => GuestMessage::Reply(Reply::Created { pid: pid.i32() }),
        Seed::Started(pid) => GuestMessage::Reply(Reply::Started { pid: pid.i32() }),
        Seed::Pids(pids, procs) => GuestMessage::Reply(Reply::Pids {
            pids: pids.iter().map(Num::i32).collect(),
            processes: procs
                .iter()
                .map(|(pid, ppid, uid, cmd)| GuestProcess {
                    pid: pid.i32(),
                    ppid: ppid.i32(),
                    uid: uid.u32(),
                    cmd: cmd.string(),
                })
                .collect(),
        }),
        Seed::Stats(n) => GuestMessage::Reply(Reply::Stats {
            stats: GuestStats {
                memory_total_bytes: n[0].u64(),
                memory_available_bytes: n[1].u64(),
                memory_usage_bytes: n[2].u64(),
                memory_limit_bytes: n[3].u64(),
                cpu_usage_ns: n[4].u64(),
                pids: n[5].u64(),
                oom_kills: n[6].u64(),
            },
            vmm: None,
        }),
        Seed::StatsWithVmm(n, name) => GuestMessage::Reply(Reply::Stats {
            stats: GuestStats::default(),
            vmm: Some(agentvm_protocol::VmmCounters {
                first_instruction_us: Some(n[0].u64()),
                vcpu_exits: n[1].u64(),
                bad_chains: n[2].u64(),
                nics: vec![agentvm_protocol::NicCounters {
                    name: name.string(),
                    rx_bytes: n[3].u64(),
                    ..Default::default()
                }],
                ..Default::default()
            }),
        }),
        Seed::Error(m) => GuestMessage::Reply(Reply::Error {
            message: m.string(),
        }),
        Seed::Exit(id, status) => GuestMessage::Exit {
            id: id.u32(),
            status: status.i32(),
            oom_kills: (id.u32() % 2 == 0).then(|| u64::from(status.u32())),
        },
        Seed::Log(level, message) => GuestMessage::Log {
            level: ["error", "warn", "info", "debug", "trace", "\x1b[31m", ""]
                [usize::from(*level) % 7]
                .to_string(),
            message: message.string(),
        },
        Seed::Data {
            kind,
            stream,
            payload,
        } => return Frame::data(kind_of(*kind), stream.u32(), payload),
        Seed::Big { kind, extra } => {
            let len = MAX_PAYLOAD - usize::from(*extra);
            return Frame::data(kind_of(*kind), 1, &vec![b'x'; len]);
        }
    };
    Frame::control(&msg)
}

/// One to four encoded guest messages, then (mostly) mutated.
pub fn generate(u: &mut Unstructured) -> arbitrary::Result<Vec<u8>> {
    let n = u.int_in_range(1..=4)?;
    let mut wire = Vec::new();
    let mut frames = Vec::new();
    for _ in 0..n {
        let seed: Seed = u.arbitrary()?;
        // Payloads within the limit always encode.
        if let Ok(bytes) = frame_of(&seed).encode() {
            wire.extend_from_slice(&bytes);
            frames.push(bytes);
        }
    }
    if u.ratio(1, 2)? {
        let others: Vec<&[u8]> = frames.iter().map(Vec::as_slice).collect();
        crate::mutate::mutate(u, &mut wire, DICT, &others)?;
    }
    Ok(wire)
}

/// A reader that hands out the input in random short reads with `EINTR`s
/// between them, like a socket.
struct Trickle<'a> {
    data: &'a [u8],
    rng: Rng,
}

impl Read for Trickle<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if self.rng.below(8) == 0 {
            return Err(io::ErrorKind::Interrupted.into());
        }
        let n = (self.rng.below(64) as usize + 1)
            .min(buf.len())
            .min(self.data.len());
        buf[..n].copy_from_slice(&self.data[..n]);
        self.data = &self.data[n..];
        Ok(n)
    }
}

/// What the host does with a decoded frame's payload.
fn consume(frame: &Frame, log: &mut GuestLog, now: Instant) {
    let _ = frame.parse_control::<HostMessage>();
    let _ = frame.parse_control::<SupervisorRequest>();
    let _ = frame.parse_control::<ExecControl>();
    let _ = frame.parse_control::<ExecEvent>();
    let _ = frame.parse_control::<Reply>();
    let Ok(msg) = frame.parse_control::<GuestMessage>() else {
        return;
    };
    // What was read means the same when written again.
    match Frame::control(&msg).parse_control::<GuestMessage>() {
        Ok(again) => assert_eq!(again, msg, "a guest message changes when re-encoded"),
        Err(e) => panic!("a decoded guest message does not decode again: {e}"),
    }
    let message = match &msg {
        GuestMessage::Log { level, message } => {
            let _ = log.accept(now, level, message);
            message
        }
        GuestMessage::Hello { kernel, .. } => kernel,
        GuestMessage::Reply(Reply::Error { message }) => message,
        _ => return,
    };
    check_sanitised(message, &sanitise(message));
}

/// A guest's words reach the host log as one bounded, printable line.
fn check_sanitised(message: &str, line: &str) {
    assert!(
        !line.chars().any(char::is_control),
        "a control character survived sanitising: {line:?}"
    );
    let suffix = format!(" [{} more bytes cut]", message.len());
    assert!(
        line.len() <= MAX_LINE + suffix.len(),
        "a sanitised line of {} bytes",
        line.len()
    );
    if message.len() <= MAX_LINE && !message.chars().any(char::is_control) {
        assert_eq!(line, message, "a short printable line was changed");
    }
}

pub fn run(data: &[u8]) {
    let seed = fnv1a(data);
    let now = Instant::now();
    let mut log = GuestLog::new(now);

    // The supervisor's blocking reader.
    let mut reader = Trickle {
        data,
        rng: Rng::new(seed),
    };
    let mut by_read = Vec::new();
    let read_end = loop {
        match Frame::read_from(&mut reader) {
            Ok(f) => {
                consume(&f, &mut log, now);
                by_read.push(f);
            }
            Err(e) => break e,
        }
    };

    // The incremental decoder, fed in other chunks.
    let mut rng = Rng::new(seed ^ 1);
    let mut decoder = Decoder::default();
    let mut by_decoder = Vec::new();
    let mut decode_err = None;
    let mut rest = data;
    'feed: while !rest.is_empty() {
        let n = (rng.below(200) as usize + 1).min(rest.len());
        decoder.push(&rest[..n]);
        rest = &rest[n..];
        loop {
            match decoder.next_frame() {
                Ok(Some(f)) => by_decoder.push(f),
                Ok(None) => break,
                Err(e) => {
                    decode_err = Some(e);
                    break 'feed;
                }
            }
        }
    }

    assert_eq!(by_read, by_decoder, "the two decoders disagree");
    // Each frame is exactly the bytes it was decoded from.
    let mut at = 0;
    for f in &by_read {
        assert!(f.payload.len() <= MAX_PAYLOAD);
        let bytes = match f.encode() {
            Ok(b) => b,
            Err(e) => panic!("a decoded frame does not encode: {e}"),
        };
        assert_eq!(
            data.get(at..at + bytes.len()),
            Some(&bytes[..]),
            "frame at {at} re-encodes differently"
        );
        at += bytes.len();
    }
    let left = data.len() - at;
    match &read_end {
        ProtocolError::Closed => {
            assert_eq!(left, 0, "closed with {left} bytes unread");
            assert!(decode_err.is_none());
        }
        ProtocolError::Io(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            // A frame cut short: the decoder waits for the rest.
            assert!(
                left > 0 && decode_err.is_none(),
                "eof: {left} {decode_err:?}"
            );
        }
        e if e.is_violation() => {
            assert!(left >= HEADER_LEN, "a violation in {left} bytes");
            let Some(d) = &decode_err else {
                panic!("read_from found {e}, the decoder nothing")
            };
            assert!(d.is_violation(), "{e} vs {d}");
            assert_eq!(e.to_string(), d.to_string());
        }
        e => panic!("unexpected end of a byte stream: {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn many_inputs_carry_guest_messages() {
        let t = crate::targets::find("protocol").unwrap();
        let mut messages = 0;
        let mut violations = 0;
        for case in 0..2000 {
            let input = crate::driver::input_for(t, 1, case);
            let mut d = Decoder::default();
            d.push(&input);
            loop {
                match d.next_frame() {
                    Ok(Some(f)) => {
                        messages += usize::from(f.parse_control::<GuestMessage>().is_ok())
                    }
                    Ok(None) => break,
                    Err(_) => {
                        violations += 1;
                        break;
                    }
                }
            }
        }
        assert!(
            messages > 800 && violations > 200,
            "{messages} messages, {violations} violations"
        );
    }
}
