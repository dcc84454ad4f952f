//! Audit lines as OpenTelemetry logs: OTLP over HTTP (`POST /v1/logs`,
//! protobuf body), the message types of the `opentelemetry-proto` crate.
//!
//! The request is a blocking HTTP/1.1 POST over a `TcpStream` of our own:
//! one small request at a time needs neither an async runtime nor an HTTP
//! library, and the binary is also every guest's `/init`.
//!
//! Each audit line becomes one log record: the body is the line itself
//! (the JSON, unchanged), the timestamp its `time`, `event_name`
//! `agentvm.audit.<event>`, and every top-level field of the line an
//! attribute (`container.id` for `container`, `agentvm.audit.<field>` for
//! the others). Denials and failed execs are `WARN`, the rest `INFO`.

use std::io::{Read, Write};
use std::net::{TcpStream, ToSocketAddrs};
use std::str::FromStr;
use std::time::Duration;

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{
    any_value, AnyValue, ArrayValue, InstrumentationScope, KeyValue,
};
use opentelemetry_proto::tonic::logs::v1::{LogRecord, ResourceLogs, ScopeLogs, SeverityNumber};
use opentelemetry_proto::tonic::resource::v1::Resource;
use prost::Message;

/// The path OTLP/HTTP takes logs at, below the endpoint.
pub const LOGS_PATH: &str = "/v1/logs";
/// Longest response head read back, in bytes.
const MAX_RESPONSE_HEAD: usize = 16 * 1024;

#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error("invalid OTLP endpoint {0:?}: {1}")]
    Endpoint(String, &'static str),
    #[error("OTLP endpoint {url}: cannot resolve {host}: {source}")]
    Resolve {
        url: String,
        host: String,
        #[source]
        source: std::io::Error,
    },
    #[error("OTLP endpoint {url}: {source}")]
    Io {
        url: String,
        #[source]
        source: std::io::Error,
    },
    #[error("OTLP endpoint {url} answered {status}")]
    Status { url: String, status: u16 },
    #[error("OTLP endpoint {url}: not an HTTP response")]
    BadResponse { url: String },
}

impl OtlpError {
    /// Whether sending the same request again may succeed: network
    /// failures, 5xx, 408 and 429. Any other answer refuses the request as
    /// it is, every time.
    pub fn retryable(&self) -> bool {
        match self {
            OtlpError::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            OtlpError::Endpoint(..) => false,
            _ => true,
        }
    }
}

/// An `http://HOST[:PORT][/PATH]` endpoint (`[audit] otlp_endpoint`). The
/// logs go to `PATH/v1/logs`, or to `PATH` when it already ends so (as an
/// OpenTelemetry SDK's base and per-signal endpoints).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Endpoint {
    host: String,
    port: u16,
    path: String,
}

impl FromStr for Endpoint {
    type Err = OtlpError;

    fn from_str(s: &str) -> Result<Endpoint, OtlpError> {
        let bad = |why| OtlpError::Endpoint(s.to_string(), why);
        let rest = if let Some(rest) = s.strip_prefix("http://") {
            rest
        } else if s.starts_with("https://") {
            return Err(bad(
                "https is not supported: use http:// (e.g. a local collector)",
            ));
        } else {
            return Err(bad("expected http://HOST:PORT"));
        };
        let (authority, path) = match rest.find('/') {
            Some(i) => rest.split_at(i),
            None => (rest, ""),
        };
        if authority.contains('@') {
            return Err(bad("credentials in the URL are not supported"));
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let (addr, after) = v6.split_once(']').ok_or_else(|| bad("unclosed '['"))?;
            addr.parse::<std::net::Ipv6Addr>()
                .map_err(|_| bad("not an IPv6 address in brackets"))?;
            (format!("[{addr}]"), after)
        } else {
            match authority.find(':') {
                Some(i) => (authority[..i].to_string(), &authority[i..]),
                None => (authority.to_string(), ""),
            }
        };
        let host_chars = host.trim_start_matches('[').trim_end_matches(']');
        if host_chars.is_empty() {
            return Err(bad("no host"));
        }
        if !host.starts_with('[')
            && !host
                .bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.' || b == b'_')
        {
            return Err(bad("the host is not a name or an address"));
        }
        let port = match port.strip_prefix(':') {
            None if port.is_empty() => 80,
            None => return Err(bad("unexpected text after the host")),
            Some(p) => p
                .parse::<u16>()
                .ok()
                .filter(|p| *p != 0)
                .ok_or_else(|| bad("the port is not a number from 1 to 65535"))?,
        };
        if !path
            .bytes()
            .all(|b| b.is_ascii_graphic() && b != b'?' && b != b'#')
        {
            return Err(bad("the path has spaces, a query or a fragment"));
        }
        let path = if path.ends_with(LOGS_PATH) {
            path.to_string()
        } else {
            format!("{}{LOGS_PATH}", path.trim_end_matches('/'))
        };
        Ok(Endpoint { host, port, path })
    }
}

impl Endpoint {
    /// Where the logs are posted, as a URL.
    pub fn url(&self) -> String {
        format!("http://{}:{}{}", self.host, self.port, self.path)
    }

    /// POSTs an encoded `ExportLogsServiceRequest`; Ok on a 2xx answer.
    pub fn post(&self, body: &[u8], timeout: Duration) -> Result<(), OtlpError> {
        let url = self.url();
        let io = |source| OtlpError::Io {
            url: url.clone(),
            source,
        };
        let bare = self.host.trim_start_matches('[').trim_end_matches(']');
        let addrs: Vec<_> = (bare, self.port)
            .to_socket_addrs()
            .map_err(|source| OtlpError::Resolve {
                url: url.clone(),
                host: self.host.clone(),
                source,
            })?
            .collect();
        let mut last = std::io::Error::new(std::io::ErrorKind::NotFound, "no address");
        let mut conn = None;
        for addr in addrs {
            match TcpStream::connect_timeout(&addr, timeout) {
                Ok(c) => {
                    conn = Some(c);
                    break;
                }
                Err(e) => last = e,
            }
        }
        let mut conn = conn.ok_or_else(|| io(last))?;
        conn.set_write_timeout(Some(timeout)).map_err(io)?;
        conn.set_read_timeout(Some(timeout)).map_err(io)?;
        let head = format!(
            "POST {} HTTP/1.1\r\nHost: {}:{}\r\nUser-Agent: agentvm/{}\r\n\
             Content-Type: application/x-protobuf\r\nContent-Length: {}\r\n\
             Connection: close\r\n\r\n",
            self.path,
            self.host,
            self.port,
            env!("CARGO_PKG_VERSION"),
            body.len()
        );
        conn.write_all(head.as_bytes()).map_err(io)?;
        conn.write_all(body).map_err(io)?;
        conn.flush().map_err(io)?;
        let status = read_status(&mut conn)
            .map_err(io)?
            .ok_or_else(|| OtlpError::BadResponse { url: url.clone() })?;
        if (200..300).contains(&status) {
            Ok(())
        } else {
            Err(OtlpError::Status { url, status })
        }
    }
}

/// Reads a response head and returns its status code; `None` when what
/// came back is not an HTTP/1.x status line.
fn read_status(conn: &mut impl Read) -> std::io::Result<Option<u16>> {
    let mut head = Vec::new();
    let mut byte = [0u8; 512];
    while !head.windows(4).any(|w| w == b"\r\n\r\n") && head.len() < MAX_RESPONSE_HEAD {
        let n = conn.read(&mut byte)?;
        if n == 0 {
            break;
        }
        head.extend_from_slice(&byte[..n]);
    }
    let line = head.split(|&b| b == b'\n').next().unwrap_or_default();
    let text = String::from_utf8_lossy(line);
    let mut parts = text.split_whitespace();
    if !parts.next().is_some_and(|v| v.starts_with("HTTP/1.")) {
        return Ok(None);
    }
    Ok(parts.next().and_then(|code| code.parse().ok()))
}

fn string(s: impl Into<String>) -> AnyValue {
    AnyValue {
        value: Some(any_value::Value::StringValue(s.into())),
    }
}

fn attribute(key: impl Into<String>, value: AnyValue) -> KeyValue {
    KeyValue {
        key: key.into(),
        value: Some(value),
        ..Default::default()
    }
}

/// A JSON value as an attribute value: scalars as themselves, arrays of
/// them as arrays, anything else as its JSON text.
fn any_value(v: &serde_json::Value) -> AnyValue {
    use serde_json::Value as J;
    let value = match v {
        J::String(s) => any_value::Value::StringValue(s.clone()),
        J::Bool(b) => any_value::Value::BoolValue(*b),
        J::Number(n) => match n.as_i64() {
            Some(i) => any_value::Value::IntValue(i),
            None => any_value::Value::DoubleValue(n.as_f64().unwrap_or(f64::NAN)),
        },
        J::Array(items) if items.iter().all(|i| !i.is_array() && !i.is_object()) => {
            any_value::Value::ArrayValue(ArrayValue {
                values: items.iter().map(any_value).collect(),
            })
        }
        other => any_value::Value::StringValue(other.to_string()),
    };
    AnyValue { value: Some(value) }
}

/// One audit line as a log record; `None` when the line is not an audit
/// record (not a JSON object with `time`, `container` and `event`).
pub fn log_record(line: &str) -> Option<LogRecord> {
    let serde_json::Value::Object(fields) = serde_json::from_str(line).ok()? else {
        return None;
    };
    let time = fields.get("time")?.as_str()?;
    let container = fields.get("container")?.as_str()?;
    let event = fields.get("event")?.as_str()?;
    let time_unix_nano = chrono::DateTime::parse_from_rfc3339(time)
        .ok()
        .and_then(|t| t.timestamp_nanos_opt())
        .and_then(|n| u64::try_from(n).ok())
        .unwrap_or(0);
    let warn = fields.get("verdict").and_then(|v| v.as_str()) == Some("denied")
        || fields.get("error").is_some_and(|e| !e.is_null());
    let (severity_number, severity_text) = if warn {
        (SeverityNumber::Warn, "WARN")
    } else {
        (SeverityNumber::Info, "INFO")
    };
    let mut attributes = vec![attribute("container.id", string(container))];
    for (key, value) in &fields {
        if key == "time" || key == "container" {
            continue;
        }
        attributes.push(attribute(format!("agentvm.audit.{key}"), any_value(value)));
    }
    Some(LogRecord {
        time_unix_nano,
        observed_time_unix_nano: now_unix_nano(),
        severity_number: severity_number as i32,
        severity_text: severity_text.to_string(),
        body: Some(string(line)),
        attributes,
        event_name: format!("agentvm.audit.{event}"),
        ..Default::default()
    })
}

fn now_unix_nano() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_nanos()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

/// The export request for a batch of records, from this host.
pub fn request(records: Vec<LogRecord>) -> ExportLogsServiceRequest {
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_default();
    ExportLogsServiceRequest {
        resource_logs: vec![ResourceLogs {
            resource: Some(Resource {
                attributes: vec![
                    attribute("service.name", string("agentvm")),
                    attribute("service.version", string(env!("CARGO_PKG_VERSION"))),
                    attribute("host.name", string(host)),
                ],
                ..Default::default()
            }),
            scope_logs: vec![ScopeLogs {
                scope: Some(InstrumentationScope {
                    name: "agentvm.audit".to_string(),
                    version: env!("CARGO_PKG_VERSION").to_string(),
                    ..Default::default()
                }),
                log_records: records,
                ..Default::default()
            }],
            ..Default::default()
        }],
    }
}

/// The protobuf encoding of `request(records)`.
pub fn encode(records: Vec<LogRecord>) -> Vec<u8> {
    request(records).encode_to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_http_urls() {
        let e: Endpoint = "http://127.0.0.1:4318".parse().unwrap();
        assert_eq!(e.url(), "http://127.0.0.1:4318/v1/logs");
        let e: Endpoint = "http://collector.local".parse().unwrap();
        assert_eq!(e.url(), "http://collector.local:80/v1/logs");
        let e: Endpoint = "http://[::1]:4318/otlp/".parse().unwrap();
        assert_eq!(e.url(), "http://[::1]:4318/otlp/v1/logs");
        let e: Endpoint = "http://h:1/v1/logs".parse().unwrap();
        assert_eq!(e.url(), "http://h:1/v1/logs");
        for bad in [
            "https://h:4318",
            "h:4318",
            "http://",
            "http://:4318",
            "http://h:0",
            "http://h:99999",
            "http://h:x",
            "http://u:p@h:1",
            "http://[::1:1",
            "http://h:1/a b",
            "http://h:1/?q",
            "http://h h:1",
            "ftp://h",
        ] {
            assert!(bad.parse::<Endpoint>().is_err(), "{bad}");
        }
    }

    #[test]
    fn a_line_becomes_a_log_record() {
        let line = r#"{"time":"2025-03-01T10:00:00.250Z","container":"c1","event":"connection","verdict":"denied","proto":"tcp","dst":"192.0.2.1","port":443,"name":"evil.example","bytes_out":0,"bytes_in":0,"duration_ms":0,"suppressed":3}"#;
        let r = log_record(line).expect("a record");
        assert_eq!(r.time_unix_nano, 1_740_823_200_250_000_000);
        assert_eq!(r.severity_number, SeverityNumber::Warn as i32);
        assert_eq!(r.event_name, "agentvm.audit.connection");
        assert_eq!(r.body, Some(string(line)));
        let get = |k: &str| {
            r.attributes
                .iter()
                .find(|a| a.key == k)
                .and_then(|a| a.value.clone())
        };
        assert_eq!(get("container.id"), Some(string("c1")));
        assert_eq!(get("agentvm.audit.verdict"), Some(string("denied")));
        assert_eq!(
            get("agentvm.audit.port"),
            Some(AnyValue {
                value: Some(any_value::Value::IntValue(443))
            })
        );
        let exec = r#"{"time":"2025-03-01T10:00:00Z","container":"c1","event":"exec","argv":["sh","-c","exit 7"],"user":"0:0","cwd":"/","exit":7}"#;
        let r = log_record(exec).expect("a record");
        assert_eq!(r.severity_number, SeverityNumber::Info as i32);
        let argv = r
            .attributes
            .iter()
            .find(|a| a.key == "agentvm.audit.argv")
            .and_then(|a| a.value.clone());
        assert!(
            matches!(argv, Some(AnyValue { value: Some(any_value::Value::ArrayValue(ref a)) }) if a.values.len() == 3),
            "{argv:?}"
        );
        for not_a_record in ["", "garbage", "[1]", r#"{"container":"c1"}"#] {
            assert!(log_record(not_a_record).is_none(), "{not_a_record}");
        }
    }

    #[test]
    fn requests_round_trip_through_protobuf() {
        let line = r#"{"time":"2025-03-01T10:00:00Z","container":"c1","event":"exec","argv":["ls"],"user":"0:0","cwd":"/"}"#;
        let bytes = encode(vec![log_record(line).expect("record")]);
        let back = ExportLogsServiceRequest::decode(bytes.as_slice()).expect("decode");
        let logs = &back.resource_logs[0].scope_logs[0].log_records;
        assert_eq!(logs.len(), 1);
        assert_eq!(logs[0].body, Some(string(line)));
    }

    #[test]
    fn status_lines() {
        let mut ok: &[u8] = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n";
        assert_eq!(read_status(&mut ok).unwrap(), Some(200));
        let mut busy: &[u8] = b"HTTP/1.0 503 Service Unavailable\r\n\r\n";
        assert_eq!(read_status(&mut busy).unwrap(), Some(503));
        let mut junk: &[u8] = b"SSH-2.0-OpenSSH\r\n";
        assert_eq!(read_status(&mut junk).unwrap(), None);
        let retry = |status| {
            OtlpError::Status {
                url: String::new(),
                status,
            }
            .retryable()
        };
        assert!(retry(503) && retry(429) && retry(500));
        assert!(!retry(400) && !retry(404));
    }
}
