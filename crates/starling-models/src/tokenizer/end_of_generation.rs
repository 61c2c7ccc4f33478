//! Which token ids end generation.
//!
//! Files name one EOS id, but chat models stop on more than one token: SmolLM2 and Qwen2.5 end
//! a turn with `<|im_end|>` yet may also emit `<|endoftext|>`. Like llama.cpp, Starling treats
//! the named EOS/EOT/EOM ids plus any token spelled like a well-known end marker as
//! end-of-generation.

/// Token texts that end generation wherever they appear in a vocabulary (llama.cpp's list).
pub(crate) const END_OF_GENERATION_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "<|end_of_text|>",
    "<end_of_utterance>",
];

/// The primary EOS id first (when known), then the other ids in ascending order, no repeats.
pub(crate) fn collect_end_of_generation_ids(
    primary_eos: Option<u32>,
    named_ids: impl IntoIterator<Item = u32>,
    token_to_id: impl Fn(&str) -> Option<u32>,
) -> Vec<u32> {
    let mut others: Vec<u32> = named_ids
        .into_iter()
        .chain(
            END_OF_GENERATION_TEXTS
                .iter()
                .filter_map(|text| token_to_id(text)),
        )
        .filter(|id| Some(*id) != primary_eos)
        .collect();
    others.sort_unstable();
    others.dedup();
    primary_eos.into_iter().chain(others).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn primary_first_then_sorted_unique() {
        let lookup = |text: &str| match text {
            "<|endoftext|>" => Some(0),
            "<|im_end|>" => Some(2),
            _ => None,
        };
        assert_eq!(
            collect_end_of_generation_ids(Some(2), [7, 2, 7], lookup),
            [2, 0, 7]
        );
        assert_eq!(collect_end_of_generation_ids(None, [], lookup), [0, 2]);
    }
}
