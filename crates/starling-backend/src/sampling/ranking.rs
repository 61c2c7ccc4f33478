//! The single token order every step uses, so ties always break the same way.

use std::cmp::Ordering;

use super::vector_math::max_value;

/// A token still in the running, with its processed logit stored beside the id so that sorting
/// and summing read contiguous memory instead of gathering from the vocabulary-sized buffer.
#[derive(Debug, Clone, Copy, PartialEq)]
pub(super) struct Candidate {
    /// Processed (penalised, temperature-scaled) logit.
    pub(super) logit: f32,
    /// Token id.
    pub(super) token_id: u32,
}

/// Orders candidates by logit, highest first; equal logits put the lower token id first, which
/// makes greedy decoding, top-k and top-p deterministic.
pub(super) fn by_rank(a: &Candidate, b: &Candidate) -> Ordering {
    b.logit
        .total_cmp(&a.logit)
        .then(a.token_id.cmp(&b.token_id))
}

/// The highest-ranked token of `logits` (lowest id among ties), or `None` when all are -inf or
/// the slice is empty.
pub(super) fn argmax(logits: &[f32]) -> Option<u32> {
    // A vectorised max, then a scan for its first occurrence, beats one branchy pass.
    let max_logit = max_value(logits);
    if max_logit == f32::NEG_INFINITY {
        return None;
    }
    (0u32..)
        .zip(logits)
        .find(|&(_, &logit)| logit == max_logit)
        .map(|(token_id, _)| token_id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn argmax_prefers_lowest_id_on_ties() {
        assert_eq!(argmax(&[0.5, 2.0, -1.0, 2.0]), Some(1));
        assert_eq!(argmax(&[f32::NEG_INFINITY, f32::NEG_INFINITY]), None);
        assert_eq!(argmax(&[]), None);
    }

    #[test]
    fn order_is_descending_with_id_tiebreak() {
        let candidate = |token_id, logit| Candidate { logit, token_id };
        let mut candidates = [
            candidate(3, -2.0),
            candidate(2, 3.0),
            candidate(0, 1.0),
            candidate(1, 3.0),
        ];
        candidates.sort_by(by_rank);
        let ids: Vec<u32> = candidates.iter().map(|c| c.token_id).collect();
        assert_eq!(ids, vec![1, 2, 0, 3]);
    }
}
