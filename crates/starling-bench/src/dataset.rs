//! Benchmark requests: random token prompts with configurable lengths, vLLM's
//! `prefix_repetition` shape (prefixes shared by several requests, for prefix caching), or
//! ShareGPT conversations (see [`crate::sharegpt`]).

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::Serialize;

use crate::error::BenchError;

/// The prompt of one benchmark request.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(untagged)]
pub enum BenchPrompt {
    /// Text (ShareGPT).
    Text(String),
    /// Token ids (random dataset: exact input lengths without a client-side tokenizer).
    Tokens(Vec<u32>),
}

/// One request to send.
#[derive(Debug, Clone, PartialEq)]
pub struct BenchRequest {
    /// The prompt.
    pub prompt: BenchPrompt,
    /// Prompt length in the server's tokens.
    pub prompt_len_tokens: usize,
    /// Tokens to ask for (`max_tokens`).
    pub output_len_tokens: usize,
}

/// vLLM's random dataset: lengths drawn uniformly in `[len × (1 − r), len × (1 + r)]`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RandomSpec {
    /// Mean input length, tokens.
    pub input_len_tokens: usize,
    /// Mean output length, tokens.
    pub output_len_tokens: usize,
    /// Relative half-width of the uniform length range, in [0, 1).
    pub range_ratio: f64,
}

/// Token ids random prompts draw from: clear of the special tokens at the start of every
/// vocabulary used here and below the smallest vocabulary (32000), so any served model accepts
/// them.
const RANDOM_TOKEN_IDS: std::ops::Range<u32> = 1000..30000;

/// `num_prompts` random-token requests, reproducible from `seed`.
pub fn random_requests(
    num_prompts: usize,
    spec: RandomSpec,
    seed: u64,
) -> Result<Vec<BenchRequest>, BenchError> {
    if !(0.0..1.0).contains(&spec.range_ratio) {
        return Err(BenchError::Invalid(format!(
            "--random-range-ratio must be in [0, 1), got {}",
            spec.range_ratio
        )));
    }
    if spec.input_len_tokens == 0 || spec.output_len_tokens == 0 {
        return Err(BenchError::Invalid(
            "--random-input-len and --random-output-len must be at least 1".into(),
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let draw = |rng: &mut ChaCha8Rng, mean: usize| {
        let low = ((mean as f64) * (1.0 - spec.range_ratio)).floor().max(1.0) as usize;
        let high = ((mean as f64) * (1.0 + spec.range_ratio)).ceil() as usize;
        rng.gen_range(low..=high.max(low))
    };
    Ok((0..num_prompts)
        .map(|_| {
            let input = draw(&mut rng, spec.input_len_tokens);
            let output = draw(&mut rng, spec.output_len_tokens);
            let ids = (0..input)
                .map(|_| rng.gen_range(RANDOM_TOKEN_IDS))
                .collect();
            BenchRequest {
                prompt: BenchPrompt::Tokens(ids),
                prompt_len_tokens: input,
                output_len_tokens: output,
            }
        })
        .collect())
}

/// vLLM's `prefix_repetition` dataset: `num_prefixes` random prefixes, each followed by
/// random suffixes; the requests are shuffled, so a prefix's first request computes it and its
/// later ones may reuse it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PrefixRepetitionSpec {
    /// Distinct prefixes (the requests are spread evenly over them).
    pub num_prefixes: usize,
    /// Prefix length, tokens.
    pub prefix_len_tokens: usize,
    /// Suffix length, tokens.
    pub suffix_len_tokens: usize,
    /// Output length, tokens.
    pub output_len_tokens: usize,
}

/// `num_prompts` requests of `spec`'s shape, reproducible from `seed`: request `i` uses prefix
/// `i % num_prefixes`, so each prefix serves `num_prompts / num_prefixes` requests (one more
/// for the first `num_prompts % num_prefixes`), in shuffled order.
pub fn prefix_repetition_requests(
    num_prompts: usize,
    spec: PrefixRepetitionSpec,
    seed: u64,
) -> Result<Vec<BenchRequest>, BenchError> {
    if spec.num_prefixes == 0 || spec.suffix_len_tokens + spec.prefix_len_tokens == 0 {
        return Err(BenchError::Invalid(
            "--prefix-repetition-num-prefixes and the prompt length must be at least 1".into(),
        ));
    }
    if spec.output_len_tokens == 0 {
        return Err(BenchError::Invalid(
            "--prefix-repetition-output-len must be at least 1".into(),
        ));
    }
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut tokens =
        |len: usize| -> Vec<u32> { (0..len).map(|_| rng.gen_range(RANDOM_TOKEN_IDS)).collect() };
    let prefixes: Vec<Vec<u32>> = (0..spec.num_prefixes)
        .map(|_| tokens(spec.prefix_len_tokens))
        .collect();
    let mut requests: Vec<BenchRequest> = (0..num_prompts)
        .map(|i| {
            let mut ids = prefixes[i % spec.num_prefixes].clone();
            ids.extend(tokens(spec.suffix_len_tokens));
            BenchRequest {
                prompt_len_tokens: ids.len(),
                prompt: BenchPrompt::Tokens(ids),
                output_len_tokens: spec.output_len_tokens,
            }
        })
        .collect();
    // Fisher-Yates with the same generator, so the order is reproducible too.
    for i in (1..requests.len()).rev() {
        requests.swap(i, rng.gen_range(0..=i));
    }
    Ok(requests)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_repetition_shares_each_prefix_among_its_requests() {
        let spec = PrefixRepetitionSpec {
            num_prefixes: 3,
            prefix_len_tokens: 20,
            suffix_len_tokens: 5,
            output_len_tokens: 7,
        };
        let a = prefix_repetition_requests(10, spec, 4).unwrap();
        assert_eq!(a, prefix_repetition_requests(10, spec, 4).unwrap());
        let mut prefixes: Vec<Vec<u32>> = Vec::new();
        for r in &a {
            assert_eq!((r.prompt_len_tokens, r.output_len_tokens), (25, 7));
            let BenchPrompt::Tokens(ids) = &r.prompt else {
                panic!("token prompts")
            };
            prefixes.push(ids[..20].to_vec());
        }
        let mut distinct = prefixes.clone();
        distinct.sort();
        distinct.dedup();
        assert_eq!(distinct.len(), 3);
        let uses = |p: &Vec<u32>| prefixes.iter().filter(|q| *q == p).count();
        let mut counts: Vec<usize> = distinct.iter().map(uses).collect();
        counts.sort();
        assert_eq!(counts, vec![3, 3, 4]);
        let zero = PrefixRepetitionSpec {
            num_prefixes: 0,
            ..spec
        };
        assert!(prefix_repetition_requests(1, zero, 0).is_err());
    }

    #[test]
    fn random_lengths_stay_in_range_and_are_reproducible() {
        let spec = RandomSpec {
            input_len_tokens: 100,
            output_len_tokens: 20,
            range_ratio: 0.5,
        };
        let a = random_requests(200, spec, 7).unwrap();
        let b = random_requests(200, spec, 7).unwrap();
        assert_eq!(a, b);
        for r in &a {
            assert!(
                (50..=150).contains(&r.prompt_len_tokens),
                "{}",
                r.prompt_len_tokens
            );
            assert!((10..=30).contains(&r.output_len_tokens));
            let BenchPrompt::Tokens(ids) = &r.prompt else {
                panic!("random prompts are token ids")
            };
            assert_eq!(ids.len(), r.prompt_len_tokens);
        }
        let spread = a.iter().map(|r| r.prompt_len_tokens).max().unwrap()
            - a.iter().map(|r| r.prompt_len_tokens).min().unwrap();
        assert!(spread > 50, "lengths vary: {spread}");
        assert!(random_requests(
            1,
            RandomSpec {
                range_ratio: 1.0,
                ..spec
            },
            0
        )
        .is_err());
    }

    #[test]
    fn zero_ratio_gives_exact_lengths() {
        let spec = RandomSpec {
            input_len_tokens: 32,
            output_len_tokens: 8,
            range_ratio: 0.0,
        };
        for r in random_requests(10, spec, 1).unwrap() {
            assert_eq!((r.prompt_len_tokens, r.output_len_tokens), (32, 8));
        }
    }
}
