//! A client for CRI's streaming exec over a websocket, as `kubectl exec`
//! speaks it: the URL the Exec RPC returns (containerd's streaming
//! server), a websocket upgrade (RFC 6455) asking for one of Kubernetes'
//! channel subprotocols, then binary messages whose first byte names the
//! stream: 1 stdout, 2 stderr, 3 the error channel (with
//! `v4.channel.k8s.io` a JSON `Status` that carries the exit code).
//!
//! Only what a test needs: no stdin, no terminal, a fixed key (the
//! accept header is not checked), client frames never sent but the close.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::Duration;

/// The subprotocol whose error channel carries the exit code.
pub const V4: &str = "v4.channel.k8s.io";
/// The first subprotocol (error channel: a message, no exit code).
pub const V1: &str = "channel.k8s.io";

/// What came back over the streams.
#[derive(Debug, Default)]
pub struct Streamed {
    pub stdout: String,
    pub stderr: String,
    /// The error channel's text, as sent.
    pub error: String,
    /// The subprotocol the server chose.
    pub protocol: String,
}

impl Streamed {
    /// The exit code the `v4.channel.k8s.io` status gives: 0 for
    /// `Success`, the `ExitCode` cause for `NonZeroExitCode`.
    pub fn exit_code(&self) -> Result<i32, String> {
        let status: serde_json::Value = serde_json::from_str(&self.error)
            .map_err(|e| format!("error channel {:?} is not a status: {e}", self.error))?;
        if status["status"] == "Success" {
            return Ok(0);
        }
        status["details"]["causes"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c["reason"] == "ExitCode")
            .and_then(|c| c["message"].as_str()?.parse().ok())
            .ok_or_else(|| format!("no exit code in the status {}", self.error))
    }
}

/// `http://host:port/path` split into `host:port` and `/path`.
fn split_url(url: &str) -> Result<(&str, &str), String> {
    let rest = url
        .strip_prefix("http://")
        .ok_or_else(|| format!("exec URL {url:?} is not http://"))?;
    let slash = rest.find('/').unwrap_or(rest.len());
    let (authority, path) = rest.split_at(slash);
    Ok((authority, if path.is_empty() { "/" } else { path }))
}

/// Connects to `url` with the websocket `protocol` and collects the
/// streams until the server closes.
pub fn run(url: &str, protocol: &str) -> Result<Streamed, String> {
    let (authority, path) = split_url(url)?;
    let mut conn =
        TcpStream::connect(authority).map_err(|e| format!("connect to {authority}: {e}"))?;
    conn.set_read_timeout(Some(Duration::from_secs(60)))
        .map_err(|e| e.to_string())?;
    let request = format!(
        "GET {path} HTTP/1.1\r\nHost: {authority}\r\nUpgrade: websocket\r\n\
         Connection: Upgrade\r\nSec-WebSocket-Key: YWdlbnR2bS10ZXN0LWtleQ==\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Protocol: {protocol}\r\n\r\n"
    );
    conn.write_all(request.as_bytes())
        .map_err(|e| format!("websocket request: {e}"))?;
    let (head, mut buffered) = read_head(&mut conn)?;
    let status_line = head.lines().next().unwrap_or_default();
    if !status_line.contains(" 101 ") {
        return Err(format!("no websocket upgrade: {head}"));
    }
    let mut out = Streamed {
        protocol: head
            .lines()
            .find_map(|l| {
                let (k, v) = l.split_once(':')?;
                k.eq_ignore_ascii_case("sec-websocket-protocol")
                    .then(|| v.trim().to_string())
            })
            .unwrap_or_default(),
        ..Default::default()
    };
    let mut message: Vec<u8> = Vec::new();
    while let Some((fin, opcode, payload)) = read_frame(&mut conn, &mut buffered)? {
        match opcode {
            // Continuation, text, binary.
            0..=2 => {
                message.extend_from_slice(&payload);
                if !fin {
                    continue;
                }
                let whole = std::mem::take(&mut message);
                if let Some((&channel, data)) = whole.split_first() {
                    let text = String::from_utf8_lossy(data);
                    match channel {
                        1 => out.stdout.push_str(&text),
                        2 => out.stderr.push_str(&text),
                        3 => out.error.push_str(&text),
                        _ => {}
                    }
                }
            }
            // Close: answer it (masked, empty) and stop.
            8 => {
                let _ = conn.write_all(&[0x88, 0x80, 0, 0, 0, 0]);
                break;
            }
            // Ping, pong: nothing to do for a short exec.
            _ => {}
        }
    }
    Ok(out)
}

/// The HTTP response head, and whatever was read past it.
fn read_head(conn: &mut TcpStream) -> Result<(String, Vec<u8>), String> {
    let mut data = Vec::new();
    let mut chunk = [0u8; 4096];
    loop {
        if let Some(end) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            let rest = data.split_off(end + 4);
            return Ok((String::from_utf8_lossy(&data).into_owned(), rest));
        }
        if data.len() > 64 << 10 {
            return Err("websocket response head too long".into());
        }
        let n = conn
            .read(&mut chunk)
            .map_err(|e| format!("websocket response: {e}"))?;
        if n == 0 {
            return Err(format!(
                "connection closed in the response head: {}",
                String::from_utf8_lossy(&data)
            ));
        }
        data.extend_from_slice(&chunk[..n]);
    }
}

/// Exactly `n` bytes: first from `buffered`, then from the connection;
/// `None` at a clean end of the stream before the first byte.
fn take(conn: &mut TcpStream, buffered: &mut Vec<u8>, n: usize) -> Result<Option<Vec<u8>>, String> {
    let mut chunk = [0u8; 4096];
    while buffered.len() < n {
        let got = conn
            .read(&mut chunk)
            .map_err(|e| format!("websocket read: {e}"))?;
        if got == 0 {
            if buffered.is_empty() {
                return Ok(None);
            }
            return Err("connection closed inside a websocket frame".into());
        }
        buffered.extend_from_slice(&chunk[..got]);
    }
    let rest = buffered.split_off(n);
    Ok(Some(std::mem::replace(buffered, rest)))
}

/// One frame: FIN, opcode, payload (unmasked); `None` at the end.
fn read_frame(
    conn: &mut TcpStream,
    buffered: &mut Vec<u8>,
) -> Result<Option<(bool, u8, Vec<u8>)>, String> {
    let Some(head) = take(conn, buffered, 2)? else {
        return Ok(None);
    };
    let fin = head[0] & 0x80 != 0;
    let opcode = head[0] & 0x0f;
    let masked = head[1] & 0x80 != 0;
    let len = match head[1] & 0x7f {
        126 => {
            let b = take(conn, buffered, 2)?.ok_or("truncated frame length")?;
            u64::from(u16::from_be_bytes([b[0], b[1]]))
        }
        127 => {
            let b = take(conn, buffered, 8)?.ok_or("truncated frame length")?;
            let mut a = [0u8; 8];
            a.copy_from_slice(&b);
            u64::from_be_bytes(a)
        }
        n => u64::from(n),
    };
    if len > 16 << 20 {
        return Err(format!("websocket frame of {len} bytes"));
    }
    let mask = if masked {
        take(conn, buffered, 4)?.ok_or("truncated frame mask")?
    } else {
        Vec::new()
    };
    let len = usize::try_from(len).map_err(|e| e.to_string())?;
    let mut payload = if len == 0 {
        Vec::new()
    } else {
        take(conn, buffered, len)?.ok_or("truncated frame payload")?
    };
    if masked {
        for (i, b) in payload.iter_mut().enumerate() {
            *b ^= mask[i % 4];
        }
    }
    Ok(Some((fin, opcode, payload)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls_split_into_authority_and_path() {
        assert_eq!(
            split_url("http://127.0.0.1:4567/exec/abc").unwrap(),
            ("127.0.0.1:4567", "/exec/abc")
        );
        assert!(split_url("https://x/exec").is_err());
    }

    #[test]
    fn v4_statuses_give_exit_codes() {
        let ok = Streamed {
            error: r#"{"metadata":{},"status":"Success"}"#.into(),
            ..Default::default()
        };
        assert_eq!(ok.exit_code(), Ok(0));
        let failed = Streamed {
            error: r#"{"metadata":{},"status":"Failure","message":"command terminated with non-zero exit code","reason":"NonZeroExitCode","details":{"causes":[{"reason":"ExitCode","message":"3"}]}}"#.into(),
            ..Default::default()
        };
        assert_eq!(failed.exit_code(), Ok(3));
        assert!(Streamed::default().exit_code().is_err());
    }
}
