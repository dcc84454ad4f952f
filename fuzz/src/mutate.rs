//! Byte-level mutations of a valid input, each choice taken from an
//! `arbitrary::Unstructured`: bit flips, interesting bytes and integers,
//! truncation, insertion and deletion, duplication, splices with another
//! input and tokens from a target's dictionary.

use arbitrary::{Result, Unstructured};

/// Bytes that sit at boundaries.
const BYTES: &[u8] = &[0, 1, 0x7f, 0x80, 0xff, b'"', b'\\', b'\n', b'-', b'0', b'9'];

/// 32-bit values that sit at boundaries, for length and number fields.
const U32S: &[u32] = &[
    0,
    1,
    0x7f,
    0x80,
    0xff,
    0xffff,
    0x7fff_ffff,
    0x8000_0000,
    u32::MAX,
    u32::MAX - 8,
    (1 << 20) - 1,
    1 << 20,
    (1 << 20) + 1,
];

/// Number spellings that trip parsers.
pub const NUMBERS: &[&str] = &[
    "0",
    "-0",
    "-1",
    "1e999",
    "-1e999",
    "0.5",
    "1e-400",
    "2147483647",
    "2147483648",
    "-2147483649",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "-9223372036854775808",
    "-9223372036854775809",
    "18446744073709551615",
    "18446744073709551616",
    "99999999999999999999999999999",
    "0x10",
    "1_000",
    "+1",
    "00",
    "NaN",
    "inf",
];

/// Applies 1 to 8 mutations to `data`. `dict` holds tokens worth
/// inserting; `others` are inputs to splice from.
pub fn mutate(
    u: &mut Unstructured,
    data: &mut Vec<u8>,
    dict: &[&str],
    others: &[&[u8]],
) -> Result<()> {
    let n = u.int_in_range(1..=8)?;
    for _ in 0..n {
        one(u, data, dict, others)?;
    }
    Ok(())
}

fn pos(u: &mut Unstructured, data: &[u8]) -> Result<usize> {
    u.int_in_range(0..=data.len())
}

fn one(u: &mut Unstructured, data: &mut Vec<u8>, dict: &[&str], others: &[&[u8]]) -> Result<()> {
    match u.int_in_range(0..=11)? {
        0 if !data.is_empty() => {
            let i = u.choose_index(data.len())?;
            data[i] ^= 1 << u.int_in_range(0..=7)?;
        }
        1 if !data.is_empty() => {
            let i = u.choose_index(data.len())?;
            data[i] = *u.choose(BYTES)?;
        }
        2 if !data.is_empty() => {
            let i = u.choose_index(data.len())?;
            data[i] = u.arbitrary()?;
        }
        3 => {
            let at = pos(u, data)?;
            data.truncate(at);
        }
        4 => {
            let at = pos(u, data)?;
            let len = u.int_in_range(1..=32)?;
            let bytes: Vec<u8> = (0..len)
                .map(|_| u.arbitrary::<u8>())
                .collect::<Result<_>>()?;
            data.splice(at..at, bytes);
        }
        5 if !data.is_empty() => {
            let a = u.choose_index(data.len())?;
            let len = u.int_in_range(1..=64)?.min(data.len() - a);
            data.drain(a..a + len);
        }
        6 if !data.is_empty() => {
            // Copy a chunk elsewhere, possibly many times over.
            let a = u.choose_index(data.len())?;
            let len = u.int_in_range(1..=256)?.min(data.len() - a);
            let chunk = data[a..a + len].to_vec();
            let at = pos(u, data)?;
            let times = u.int_in_range(1..=16)?;
            data.splice(at..at, chunk.repeat(times));
        }
        7 if data.len() >= 4 => {
            let at = u.choose_index(data.len() - 3)?;
            let v = *u.choose(U32S)?;
            data[at..at + 4].copy_from_slice(&v.to_le_bytes());
        }
        8 if !others.is_empty() => {
            // This input's head, another's tail.
            let other = *u.choose(others)?;
            let at = pos(u, data)?;
            let from = u.int_in_range(0..=other.len())?;
            data.truncate(at);
            data.extend_from_slice(&other[from..]);
        }
        9 if !dict.is_empty() => {
            let token = *u.choose(dict)?;
            let at = pos(u, data)?;
            data.splice(at..at, token.bytes());
        }
        10 => {
            // Replace a run of digits with an interesting number.
            let start = pos(u, data)?;
            if let Some(a) = data[start..].iter().position(u8::is_ascii_digit) {
                let a = start + a;
                let b = data[a..]
                    .iter()
                    .position(|c| !c.is_ascii_digit())
                    .map_or(data.len(), |n| a + n);
                let num = *u.choose(NUMBERS)?;
                data.splice(a..b, num.bytes());
            }
        }
        11 if !dict.is_empty() && !data.is_empty() => {
            // Overwrite rather than insert.
            let token = *u.choose(dict)?;
            let at = u.choose_index(data.len())?;
            let end = (at + token.len()).min(data.len());
            data.splice(at..end, token.bytes());
        }
        _ => {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rng::Rng;

    #[test]
    fn mutations_change_inputs_and_never_panic() {
        let mut r = Rng::new(3);
        let mut changed = 0;
        for _ in 0..5000 {
            let len = r.length(512);
            let bytes = r.bytes(len);
            let mut u = Unstructured::new(&bytes);
            let mut data = b"{\"type\":\"exit\",\"id\":12,\"status\":0}".to_vec();
            let before = data.clone();
            let _ = mutate(&mut u, &mut data, &["\"", "{"], &[b"xyz"]);
            changed += usize::from(data != before);
        }
        assert!(changed > 3000, "{changed}");
    }
}
