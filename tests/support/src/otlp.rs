//! A small OTLP/HTTP logs receiver for the audit tests: listens on
//! 127.0.0.1 (a port of its own), takes `POST /v1/logs` with a protobuf
//! `ExportLogsServiceRequest`, decodes it and keeps the log records. It can
//! be told to refuse the next requests with a status, to test retries.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::logs::v1::ExportLogsServiceRequest;
use opentelemetry_proto::tonic::common::v1::{any_value, AnyValue};
use prost::Message;

/// One log record as received.
#[derive(Debug, Clone)]
pub struct Received {
    /// The `container.id` attribute.
    pub container: String,
    pub event_name: String,
    /// The body, when it is a string (the audit line).
    pub body: String,
    pub time_unix_nano: u64,
    pub severity_text: String,
    /// Every attribute, its value rendered as text.
    pub attributes: Vec<(String, String)>,
    /// The resource's `service.name`.
    pub service: String,
}

impl Received {
    pub fn attribute(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

#[derive(Default)]
struct Shared {
    records: Mutex<Vec<Received>>,
    /// Requests answered so far, refused ones included.
    requests: AtomicUsize,
    /// The next this many requests get `fail_status`.
    fail: Mutex<(usize, u16)>,
    /// Requests that were not a well-formed OTLP logs POST.
    bad: Mutex<Vec<String>>,
    stop: AtomicBool,
}

/// The receiver; it stops when dropped.
pub struct Receiver {
    port: u16,
    shared: Arc<Shared>,
}

impl Receiver {
    pub fn start() -> Result<Receiver, String> {
        let listener =
            TcpListener::bind("127.0.0.1:0").map_err(|e| format!("cannot listen: {e}"))?;
        let port = listener
            .local_addr()
            .map_err(|e| format!("local address: {e}"))?
            .port();
        let shared = Arc::new(Shared::default());
        let s = shared.clone();
        std::thread::spawn(move || {
            for conn in listener.incoming() {
                if s.stop.load(Ordering::Relaxed) {
                    return;
                }
                if let Ok(conn) = conn {
                    serve(conn, &s);
                }
            }
        });
        Ok(Receiver { port, shared })
    }

    /// The endpoint to configure (`[audit] otlp_endpoint`).
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// Refuses the next `n` requests with `status`.
    pub fn fail_next(&self, n: usize, status: u16) {
        if let Ok(mut f) = self.shared.fail.lock() {
            *f = (n, status);
        }
    }

    /// Requests answered so far.
    pub fn requests(&self) -> usize {
        self.shared.requests.load(Ordering::Relaxed)
    }

    /// The records taken so far.
    pub fn records(&self) -> Vec<Received> {
        self.shared
            .records
            .lock()
            .map(|r| r.clone())
            .unwrap_or_default()
    }

    /// Waits until at least `n` records were taken, or `timeout`; returns
    /// what was taken. Panics if a request was not a valid OTLP request.
    pub fn wait_for(&self, n: usize, timeout: Duration) -> Vec<Received> {
        self.wait_until(timeout, |r| r.len() >= n)
    }

    /// Waits until `done` holds for the records taken, or `timeout`.
    pub fn wait_until(
        &self,
        timeout: Duration,
        done: impl Fn(&[Received]) -> bool,
    ) -> Vec<Received> {
        let deadline = Instant::now() + timeout;
        loop {
            let bad = self
                .shared
                .bad
                .lock()
                .map(|b| b.clone())
                .unwrap_or_default();
            assert!(bad.is_empty(), "bad OTLP requests: {bad:?}");
            let records = self.records();
            if done(&records) || Instant::now() >= deadline {
                return records;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::Relaxed);
        // Wake the accept loop.
        let _ = TcpStream::connect(("127.0.0.1", self.port));
    }
}

fn text(v: &Option<AnyValue>) -> String {
    match v.as_ref().and_then(|v| v.value.as_ref()) {
        Some(any_value::Value::StringValue(s)) => s.clone(),
        Some(any_value::Value::IntValue(i)) => i.to_string(),
        Some(any_value::Value::BoolValue(b)) => b.to_string(),
        Some(any_value::Value::DoubleValue(d)) => d.to_string(),
        Some(any_value::Value::ArrayValue(a)) => {
            let items: Vec<String> = a.values.iter().map(|v| text(&Some(v.clone()))).collect();
            format!("[{}]", items.join(","))
        }
        Some(other) => format!("{other:?}"),
        None => String::new(),
    }
}

/// Reads one HTTP/1.1 request: (request line, body).
fn read_request(conn: &mut TcpStream) -> Result<(String, Vec<u8>), String> {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if data.len() > 64 * 1024 {
            return Err("request head too long".into());
        }
        let n = conn.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed in the head".into());
        }
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_string();
    let request_line = head.lines().next().unwrap_or_default().to_string();
    let length: usize = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .find(|(k, _)| k.trim().eq_ignore_ascii_case("content-length"))
        .and_then(|(_, v)| v.trim().parse().ok())
        .ok_or("no Content-Length")?;
    let content_type_ok = head
        .lines()
        .filter_map(|l| l.split_once(':'))
        .any(|(k, v)| {
            k.trim().eq_ignore_ascii_case("content-type") && v.trim() == "application/x-protobuf"
        });
    if !content_type_ok {
        return Err(format!("not a protobuf request: {head}"));
    }
    let mut body = data[head_end..].to_vec();
    while body.len() < length {
        let n = conn.read(&mut buf).map_err(|e| e.to_string())?;
        if n == 0 {
            return Err("connection closed in the body".into());
        }
        body.extend_from_slice(&buf[..n]);
    }
    body.truncate(length);
    Ok((request_line, body))
}

fn serve(mut conn: TcpStream, s: &Shared) {
    let _ = conn.set_read_timeout(Some(Duration::from_secs(10)));
    let (line, body) = match read_request(&mut conn) {
        Ok(r) => r,
        Err(e) => {
            if let Ok(mut b) = s.bad.lock() {
                b.push(e);
            }
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            return;
        }
    };
    s.requests.fetch_add(1, Ordering::Relaxed);
    let refuse = s.fail.lock().ok().and_then(|mut f| {
        (f.0 > 0).then(|| {
            f.0 -= 1;
            f.1
        })
    });
    if let Some(status) = refuse {
        let _ = write!(
            conn,
            "HTTP/1.1 {status} Refused\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
        );
        return;
    }
    if !line.starts_with("POST /v1/logs ") {
        if let Ok(mut b) = s.bad.lock() {
            b.push(format!("unexpected request line {line:?}"));
        }
        let _ = conn.write_all(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n");
        return;
    }
    let request = match ExportLogsServiceRequest::decode(body.as_slice()) {
        Ok(r) => r,
        Err(e) => {
            if let Ok(mut b) = s.bad.lock() {
                b.push(format!("not an ExportLogsServiceRequest: {e}"));
            }
            let _ = conn.write_all(b"HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
            return;
        }
    };
    let mut got = Vec::new();
    for rl in &request.resource_logs {
        let service = rl
            .resource
            .as_ref()
            .and_then(|r| r.attributes.iter().find(|a| a.key == "service.name"))
            .map(|a| text(&a.value))
            .unwrap_or_default();
        for sl in &rl.scope_logs {
            for r in &sl.log_records {
                let attributes: Vec<(String, String)> = r
                    .attributes
                    .iter()
                    .map(|a| (a.key.clone(), text(&a.value)))
                    .collect();
                let container = attributes
                    .iter()
                    .find(|(k, _)| k == "container.id")
                    .map(|(_, v)| v.clone())
                    .unwrap_or_default();
                got.push(Received {
                    container,
                    event_name: r.event_name.clone(),
                    body: text(&r.body),
                    time_unix_nano: r.time_unix_nano,
                    severity_text: r.severity_text.clone(),
                    attributes,
                    service: service.clone(),
                });
            }
        }
    }
    if let Ok(mut records) = s.records.lock() {
        records.extend(got);
    }
    // An empty ExportLogsServiceResponse.
    let _ = conn.write_all(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\nConnection: close\r\n\r\n",
    );
}
