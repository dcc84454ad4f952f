//! JSON values biased to the edges, for building structured inputs with
//! `arbitrary`: numbers at type boundaries, negative where unsigned is
//! expected, strings that are empty, huge, path-like or odd cpusets.

use arbitrary::Arbitrary;
use serde_json::{Map, Number, Value};

/// A number, mostly at a boundary of some integer type.
#[derive(Arbitrary, Debug, Clone)]
pub enum Int {
    Small(u8),
    Negative(i8),
    Edge(u8),
    Any(i64),
    AnyUnsigned(u64),
}

const EDGES: &[i128] = &[
    0,
    1,
    -1,
    i32::MAX as i128,
    i32::MIN as i128,
    u32::MAX as i128,
    u32::MAX as i128 + 1,
    i64::MAX as i128,
    i64::MIN as i128,
    u64::MAX as i128,
    1 << 20,
    (1 << 20) + 1,
    1 << 53,
    (1 << 53) + 1,
    i64::MAX as i128 / (1 << 20),
    u64::MAX as i128 / (1 << 20),
    1_000_000,
    100_000,
    999_999_999_999,
];

const FLOATS: &[f64] = &[0.5, -1.5, 1e300, 4294967296.0];

impl Int {
    pub fn json(&self) -> Value {
        let n = match self {
            Int::Small(n) => i128::from(*n),
            Int::Negative(n) => i128::from(*n),
            Int::Edge(i) => match FLOATS.get(usize::from(*i)) {
                // A few floats where integers go.
                Some(f) => return Number::from_f64(*f).map_or(Value::Null, Value::Number),
                None => EDGES[usize::from(*i) % EDGES.len()],
            },
            Int::Any(n) => i128::from(*n),
            Int::AnyUnsigned(n) => i128::from(*n),
        };
        if let Ok(n) = i64::try_from(n) {
            Value::from(n)
        } else if let Ok(n) = u64::try_from(n) {
            Value::from(n)
        } else {
            Value::Null
        }
    }
}

/// A string, often one that sits at an edge of what a field takes.
#[derive(Arbitrary, Debug, Clone)]
pub enum Text {
    Pick(u8),
    Any(String),
    /// Bytes as they would read if they were UTF-8 (lossily).
    Bytes(Vec<u8>),
    /// A short string many times over.
    Repeat(u8, u16),
}

pub const STRINGS: &[&str] = &[
    "",
    " ",
    "/",
    ".",
    "..",
    "../../../etc/shadow",
    "/proc/self/root",
    "rootfs",
    "/dev/null",
    "a\0b",
    "\u{202e}",
    "0",
    "0-3,5",
    "0-99999999999",
    "0-4294967295",
    "4294967295",
    "0-8191",
    "8191",
    "8192",
    "3-1",
    "-1",
    "0--1",
    "1-",
    "-",
    ",",
    ",,0,,",
    " 0 - 3 ",
    "0-1-2",
    "+1",
    "0x1",
    "\u{663}",
    "0-8191,0-8191,0-8191",
    "bind",
    "rbind",
    "ro",
    "rw",
    "microvm",
    "container",
    "allow",
    "deny",
    "10.0.0.0/8",
    "1.0.2",
    "1.",
    "2.0.0",
    "network",
    "cgroup",
];

pub const PIECES: &[&str] = &["0-8191,", "a", "/..", "\u{10ffff}", "0,", "ro,", "é"];

impl Text {
    pub fn string(&self) -> String {
        match self {
            Text::Pick(i) => STRINGS[usize::from(*i) % STRINGS.len()].to_string(),
            Text::Any(s) => s.clone(),
            Text::Bytes(b) => String::from_utf8_lossy(b).into_owned(),
            Text::Repeat(i, n) => {
                PIECES[usize::from(*i) % PIECES.len()].repeat(usize::from(*n) % 3000)
            }
        }
    }

    pub fn json(&self) -> Value {
        Value::String(self.string())
    }
}

/// Any JSON value, shallow.
#[derive(Arbitrary, Debug, Clone)]
pub enum Leaf {
    Null,
    Bool(bool),
    Int(Int),
    Text(Text),
    Array(Vec<Int>),
    Strings(Vec<Text>),
    Object(Vec<(Key, Int)>),
}

/// A field name: most of them the spec's own.
#[derive(Arbitrary, Debug, Clone)]
pub enum Key {
    Known(u8),
    Any(String),
}

pub const KEYS: &[&str] = &[
    "ociVersion",
    "process",
    "root",
    "mounts",
    "linux",
    "hooks",
    "annotations",
    "hostname",
    "args",
    "env",
    "cwd",
    "user",
    "uid",
    "gid",
    "terminal",
    "consoleSize",
    "height",
    "width",
    "rlimits",
    "path",
    "readonly",
    "destination",
    "type",
    "source",
    "options",
    "namespaces",
    "resources",
    "memory",
    "limit",
    "swap",
    "reservation",
    "cpu",
    "quota",
    "period",
    "cpus",
    "mems",
    "shares",
    "pids",
    "cgroupsPath",
    "devices",
    "prestart",
    "createRuntime",
    "poststop",
    "io.agentvm.isolation",
    "io.agentvm.egress",
    "uidMappings",
    "containerID",
    "hostID",
    "size",
];

impl Key {
    pub fn string(&self) -> String {
        match self {
            Key::Known(i) => KEYS[usize::from(*i) % KEYS.len()].to_string(),
            Key::Any(s) => s.clone(),
        }
    }
}

impl Leaf {
    pub fn json(&self) -> Value {
        match self {
            Leaf::Null => Value::Null,
            Leaf::Bool(b) => Value::Bool(*b),
            Leaf::Int(n) => n.json(),
            Leaf::Text(t) => t.json(),
            Leaf::Array(v) => Value::Array(v.iter().map(Int::json).collect()),
            Leaf::Strings(v) => Value::Array(v.iter().map(Text::json).collect()),
            Leaf::Object(v) => Value::Object(
                v.iter()
                    .map(|(k, n)| (k.string(), n.json()))
                    .collect::<Map<_, _>>(),
            ),
        }
    }
}
