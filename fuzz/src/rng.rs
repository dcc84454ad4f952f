//! A small deterministic PRNG: the raw bytes every case starts from.
//!
//! SplitMix64 — one 64-bit state, full period, good enough to feed
//! `arbitrary`. The same seed gives the same bytes on every machine, which
//! is what makes a fuzz run reproducible from its seed.

/// The generator.
#[derive(Debug, Clone)]
pub struct Rng {
    state: u64,
}

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng { state: seed }
    }

    pub fn next_u64(&mut self) -> u64 {
        self.state = self.state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`0` when `n` is 0).
    pub fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.next_u64() % n
        }
    }

    /// `len` random bytes.
    pub fn bytes(&mut self, len: usize) -> Vec<u8> {
        let mut out = Vec::with_capacity(len + 8);
        while out.len() < len {
            out.extend_from_slice(&self.next_u64().to_le_bytes());
        }
        out.truncate(len);
        out
    }

    /// A length up to `max`, small ones more likely (most bugs need few
    /// bytes; some need many).
    pub fn length(&mut self, max: usize) -> usize {
        let bits = self.below(u64::from(usize::BITS - max.leading_zeros()) + 1);
        let cap = (1u64 << bits).min(max as u64 + 1);
        self.below(cap) as usize
    }
}

/// Mixes a run's seed with a target and a case number into the seed of
/// one case, so any case can be regenerated alone.
pub fn case_seed(seed: u64, target: &str, case: u64) -> u64 {
    let mut r = Rng::new(seed ^ fnv1a(target.as_bytes()));
    let a = r.next_u64();
    Rng::new(a ^ case.wrapping_mul(0xd6e8_feb8_6659_fd93)).next_u64()
}

/// FNV-1a, 64 bits: names crash files after their content.
pub fn fnv1a(bytes: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn same_seed_same_stream() {
        let (mut a, mut b) = (Rng::new(7), Rng::new(7));
        assert_eq!(a.bytes(100), b.bytes(100));
        assert_ne!(Rng::new(8).bytes(16), Rng::new(7).bytes(16));
        assert_ne!(case_seed(1, "spec", 0), case_seed(1, "spec", 1));
        assert_ne!(case_seed(1, "spec", 0), case_seed(1, "config", 0));
    }

    #[test]
    fn lengths_stay_in_bounds() {
        let mut r = Rng::new(1);
        for max in [0, 1, 2, 7, 4096] {
            for _ in 0..1000 {
                assert!(r.length(max) <= max);
            }
        }
    }
}
