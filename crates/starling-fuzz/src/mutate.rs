//! Byte-level mutations in the manner of libFuzzer's: each case stacks a few of them.

use crate::rng::SplitMix64;

/// Integers that sit on parser boundaries: zero, one, sign bits, maxima, typical size limits.
const INTERESTING_U64: &[u64] = &[
    0,
    1,
    2,
    3,
    4,
    7,
    8,
    16,
    32,
    63,
    64,
    127,
    128,
    255,
    256,
    1023,
    1024,
    4096,
    65_535,
    65_536,
    0x7fff_ffff,
    0x8000_0000,
    0xffff_ffff,
    0x1_0000_0000,
    0x7fff_ffff_ffff_ffff,
    0x8000_0000_0000_0000,
    u64::MAX,
    u64::MAX - 1,
];
/// Most mutations stacked on one case.
const MAX_STACK: usize = 8;

/// Makes new inputs from old ones.
#[derive(Debug, Clone)]
pub struct Mutator {
    dictionary: Vec<Vec<u8>>,
    max_len: usize,
}

impl Default for Mutator {
    fn default() -> Self {
        Mutator {
            dictionary: Vec::new(),
            max_len: 1 << 20,
        }
    }
}

impl Mutator {
    /// The same mutator with `tokens` to insert and overwrite with.
    pub fn with_dictionary(mut self, tokens: &[&[u8]]) -> Self {
        self.dictionary = tokens.iter().map(|t| t.to_vec()).collect();
        self
    }

    /// The same mutator producing inputs of at most `bytes`.
    pub fn with_max_len(mut self, bytes: usize) -> Self {
        self.max_len = bytes.max(1);
        self
    }

    /// A mutation of `base`: one to eight stacked edits, `other` available for splicing.
    pub fn mutate(&self, base: &[u8], other: &[u8], rng: &mut SplitMix64) -> Vec<u8> {
        let mut data = base.to_vec();
        let edits = 1 + rng.below(MAX_STACK);
        for _ in 0..edits {
            self.edit(&mut data, other, rng);
        }
        data.truncate(self.max_len);
        data
    }

    fn edit(&self, data: &mut Vec<u8>, other: &[u8], rng: &mut SplitMix64) {
        let choices = if self.dictionary.is_empty() { 10 } else { 12 };
        match rng.below(choices) {
            0 => flip_bit(data, rng),
            1 => set_byte(data, rng),
            2 => interesting_integer(data, rng),
            3 => add_to_byte(data, rng),
            4 => delete_range(data, rng),
            5 => duplicate_range(data, rng),
            6 => insert_random(data, rng),
            7 => splice(data, other, rng),
            8 => truncate(data, rng),
            9 => swap_ranges(data, rng),
            10 => self.insert_token(data, rng),
            _ => self.overwrite_token(data, rng),
        }
    }

    fn token<'a>(&'a self, rng: &mut SplitMix64) -> &'a [u8] {
        &self.dictionary[rng.below(self.dictionary.len())]
    }

    fn insert_token(&self, data: &mut Vec<u8>, rng: &mut SplitMix64) {
        let at = rng.below(data.len() + 1);
        let token = self.token(rng).to_vec();
        data.splice(at..at, token);
    }

    fn overwrite_token(&self, data: &mut Vec<u8>, rng: &mut SplitMix64) {
        let token = self.token(rng).to_vec();
        if data.len() < token.len() {
            data.extend_from_slice(&token);
            return;
        }
        let at = rng.below(data.len() - token.len() + 1);
        data[at..at + token.len()].copy_from_slice(&token);
    }
}

fn flip_bit(data: &mut [u8], rng: &mut SplitMix64) {
    if !data.is_empty() {
        let at = rng.below(data.len());
        data[at] ^= 1 << rng.below(8);
    }
}

fn set_byte(data: &mut [u8], rng: &mut SplitMix64) {
    if !data.is_empty() {
        let at = rng.below(data.len());
        data[at] = [0, 0xff, 0x7f, 0x80, rng.next_u64() as u8][rng.below(5)];
    }
}

fn add_to_byte(data: &mut [u8], rng: &mut SplitMix64) {
    if !data.is_empty() {
        let at = rng.below(data.len());
        let delta = 1 + rng.below(16) as u8;
        data[at] = if rng.one_in(2) {
            data[at].wrapping_add(delta)
        } else {
            data[at].wrapping_sub(delta)
        };
    }
}

/// Overwrites 1, 2, 4 or 8 bytes with an interesting integer, little- or big-endian.
fn interesting_integer(data: &mut [u8], rng: &mut SplitMix64) {
    let width = [1usize, 2, 4, 8][rng.below(4)];
    if data.len() < width {
        return;
    }
    let value = INTERESTING_U64[rng.below(INTERESTING_U64.len())];
    let value = if rng.one_in(4) {
        value.wrapping_neg()
    } else {
        value
    };
    let bytes = if rng.one_in(4) {
        value.to_be_bytes()
    } else {
        value.to_le_bytes()
    };
    let at = rng.below(data.len() - width + 1);
    let source = if rng.one_in(4) { 8 - width } else { 0 };
    data[at..at + width].copy_from_slice(&bytes[source..source + width]);
}

fn range(len: usize, rng: &mut SplitMix64) -> (usize, usize) {
    let start = rng.below(len);
    // Mostly short ranges, sometimes long ones.
    let max = if rng.one_in(8) {
        len - start
    } else {
        (len - start).min(16)
    };
    (start, start + 1 + rng.below(max.max(1)))
}

fn delete_range(data: &mut Vec<u8>, rng: &mut SplitMix64) {
    if !data.is_empty() {
        let (start, end) = range(data.len(), rng);
        data.drain(start..end.min(data.len()));
    }
}

fn duplicate_range(data: &mut Vec<u8>, rng: &mut SplitMix64) {
    if !data.is_empty() {
        let (start, end) = range(data.len(), rng);
        let copy = data[start..end.min(data.len())].to_vec();
        let at = rng.below(data.len() + 1);
        data.splice(at..at, copy);
    }
}

fn insert_random(data: &mut Vec<u8>, rng: &mut SplitMix64) {
    let at = rng.below(data.len() + 1);
    let len = 1 + rng.below(8);
    let bytes: Vec<u8> = (0..len).map(|_| rng.next_u64() as u8).collect();
    data.splice(at..at, bytes);
}

/// Replaces the tail of `data` from a random point with the tail of `other` from another.
fn splice(data: &mut Vec<u8>, other: &[u8], rng: &mut SplitMix64) {
    if other.is_empty() {
        return;
    }
    let cut = rng.below(data.len() + 1);
    let from = rng.below(other.len());
    data.truncate(cut);
    data.extend_from_slice(&other[from..]);
}

fn truncate(data: &mut Vec<u8>, rng: &mut SplitMix64) {
    let keep = rng.below(data.len() + 1);
    data.truncate(keep);
}

fn swap_ranges(data: &mut [u8], rng: &mut SplitMix64) {
    if data.len() < 2 {
        return;
    }
    let width = 1 + rng.below(8.min(data.len() / 2));
    let a = rng.below(data.len() - width + 1);
    let b = rng.below(data.len() - width + 1);
    for i in 0..width {
        data.swap(a + i, b + i);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mutations_stay_within_the_length_limit_and_change_the_input() {
        let mutator = Mutator::default()
            .with_dictionary(&[b"temperature", b"\xff\xff\xff\xff"])
            .with_max_len(64);
        let mut rng = SplitMix64::new(3);
        let base = b"{\"prompt\": \"hello\", \"max_tokens\": 4}".to_vec();
        let mut changed = 0;
        for _ in 0..10_000 {
            let out = mutator.mutate(&base, b"[1,2,3]", &mut rng);
            assert!(out.len() <= 64);
            changed += usize::from(out != base);
        }
        assert!(changed > 9_000, "{changed}");
        // Empty inputs are fine too.
        for _ in 0..1_000 {
            mutator.mutate(b"", b"", &mut rng);
        }
    }
}
