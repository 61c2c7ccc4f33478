//! Sampler behaviour on hand-computed examples, plus a property test of the filters.

use proptest::prelude::*;

use super::*;

const EOS: u32 = 3;

fn params() -> SamplingParams {
    SamplingParams::default()
}

fn greedy() -> SamplingParams {
    SamplingParams {
        temperature: 0.0,
        ..params()
    }
}

fn no_history() -> SamplingContext<'static> {
    SamplingContext {
        prompt_ids: &[],
        output_ids: &[],
    }
}

fn sample_once(logits: &[f32], context: &SamplingContext<'_>, params: &SamplingParams) -> u32 {
    let mut sampler = Sampler::new(vec![EOS]);
    let mut rng = SequenceRng::from_seed(0);
    sampler
        .sample(logits, context, params, &mut rng)
        .unwrap()
        .token_id
}

/// Token frequencies over `draws` samples with one seeded stream.
fn frequencies(logits: &[f32], params: &SamplingParams, draws: usize) -> Vec<f64> {
    let mut sampler = Sampler::new(vec![EOS]);
    let mut rng = SequenceRng::from_seed(1234);
    let mut counts = vec![0usize; logits.len()];
    for _ in 0..draws {
        let token = sampler
            .sample(logits, &no_history(), params, &mut rng)
            .unwrap();
        counts[token.token_id as usize] += 1;
    }
    counts.iter().map(|&c| c as f64 / draws as f64).collect()
}

fn softmax(logits: &[f32], temperature: f32) -> Vec<f64> {
    let scaled: Vec<f64> = logits.iter().map(|&l| f64::from(l / temperature)).collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let weights: Vec<f64> = scaled.iter().map(|s| (s - max).exp()).collect();
    let total: f64 = weights.iter().sum();
    weights.iter().map(|w| w / total).collect()
}

fn assert_close(actual: &[f64], expected: &[f64], tolerance: f64) {
    for (index, (a, e)) in actual.iter().zip(expected).enumerate() {
        assert!((a - e).abs() < tolerance, "token {index}: {a} vs {e}");
    }
}

#[test]
fn greedy_takes_argmax_and_lowest_id_on_ties() {
    assert_eq!(
        sample_once(&[0.1, 2.5, -3.0, 1.0], &no_history(), &greedy()),
        1
    );
    assert_eq!(
        sample_once(&[1.0, 4.0, 0.0, 4.0, 4.0], &no_history(), &greedy()),
        1
    );
}

#[test]
fn temperature_sampling_matches_softmax_frequencies() {
    let logits = [1.0f32, 2.0, 0.5, -1.0];
    let temperature = 0.7;
    let sampling = SamplingParams {
        temperature,
        ..params()
    };
    let observed = frequencies(&logits, &sampling, 20_000);
    // Standard error is at most 0.0036 per token; 0.015 is four of them.
    assert_close(&observed, &softmax(&logits, temperature), 0.015);
}

#[test]
fn top_k_one_equals_greedy() {
    let logits = [0.3f32, -1.0, 2.2, 2.1, 0.0, 1.7];
    let top_one = SamplingParams {
        temperature: 1.5,
        top_k: Some(1),
        ..params()
    };
    let mut sampler = Sampler::new(vec![EOS]);
    let mut rng = SequenceRng::from_seed(9);
    for _ in 0..200 {
        let token = sampler
            .sample(&logits, &no_history(), &top_one, &mut rng)
            .unwrap();
        assert_eq!(token.token_id, 2);
    }
}

#[test]
fn top_p_samples_only_the_nucleus_renormalised() {
    // Probabilities [0.5, 0.3, 0.15, 0.05]; top_p 0.75 keeps {0, 1} renormalised to [0.625, 0.375].
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let nucleus = SamplingParams {
        top_p: 0.75,
        ..params()
    };
    let observed = frequencies(&logits, &nucleus, 20_000);
    assert_close(&observed, &[0.625, 0.375, 0.0, 0.0], 0.015);
    assert_eq!(observed[2] + observed[3], 0.0);
}

#[test]
fn min_p_drops_unlikely_tokens() {
    // min_p 0.2 of the top probability 0.5 is 0.1: token 3 (0.05) is never drawn, the rest are
    // renormalised over 0.95.
    let logits: Vec<f32> = [0.5f32, 0.3, 0.15, 0.05].iter().map(|p| p.ln()).collect();
    let with_min_p = SamplingParams {
        min_p: 0.2,
        ..params()
    };
    let observed = frequencies(&logits, &with_min_p, 20_000);
    assert_eq!(observed[3], 0.0);
    assert_close(
        &observed,
        &[0.5 / 0.95, 0.3 / 0.95, 0.15 / 0.95, 0.0],
        0.015,
    );
}

#[test]
fn repetition_penalty_changes_greedy_choice_by_hand_values() {
    let penalised = SamplingParams {
        repetition_penalty: 2.0,
        ..greedy()
    };
    let prompt_has_zero = SamplingContext {
        prompt_ids: &[0],
        output_ids: &[],
    };
    // 2.0 / 2 = 1.0 < 1.5.
    assert_eq!(sample_once(&[2.0, 1.5], &prompt_has_zero, &penalised), 1);
    // 2.0 / 2 = 1.0 > 0.9.
    assert_eq!(sample_once(&[2.0, 0.9], &prompt_has_zero, &penalised), 0);
    // Negative logits are multiplied: -1.0 * 2 = -2.0 < -1.5.
    assert_eq!(sample_once(&[-1.0, -1.5], &prompt_has_zero, &penalised), 1);
}

#[test]
fn frequency_and_presence_penalties_change_greedy_choice_by_hand_values() {
    let output_two_zeros = SamplingContext {
        prompt_ids: &[],
        output_ids: &[0, 0],
    };
    let frequency = |value| SamplingParams {
        frequency_penalty: value,
        ..greedy()
    };
    // 1.0 - 0.25 * 2 = 0.5 < 0.6, but 1.0 - 0.1 * 2 = 0.8 > 0.6.
    assert_eq!(
        sample_once(&[1.0, 0.6], &output_two_zeros, &frequency(0.25)),
        1
    );
    assert_eq!(
        sample_once(&[1.0, 0.6], &output_two_zeros, &frequency(0.1)),
        0
    );

    let presence = SamplingParams {
        presence_penalty: 0.5,
        ..greedy()
    };
    // Presence subtracts once regardless of count: 1.0 - 0.5 = 0.5 < 0.6.
    assert_eq!(sample_once(&[1.0, 0.6], &output_two_zeros, &presence), 1);
    // Prompt tokens are not penalised by presence/frequency.
    let prompt_only = SamplingContext {
        prompt_ids: &[0, 0],
        output_ids: &[],
    };
    assert_eq!(sample_once(&[1.0, 0.6], &prompt_only, &presence), 0);
}

#[test]
fn same_seed_reproduces_regardless_of_batch_neighbours() {
    let logits = [0.2f32, 0.1, 0.4, -0.3, 0.0, 0.25];
    let seeded = SamplingParams {
        seed: Some(77),
        ..params()
    };
    let run_alone = || {
        let mut sampler = Sampler::new(vec![EOS]);
        let mut rng = SequenceRng::from_seed(77);
        (0..50)
            .map(|_| {
                sampler
                    .sample(&logits, &no_history(), &seeded, &mut rng)
                    .unwrap()
                    .token_id
            })
            .collect::<Vec<u32>>()
    };
    let alone = run_alone();
    assert_eq!(alone, run_alone());

    // Interleave with a neighbour that uses its own stream and a shared sampler.
    let mut sampler = Sampler::new(vec![EOS]);
    let mut ours = SequenceRng::from_seed(77);
    let mut neighbour = SequenceRng::from_seed(5);
    let mut batched = Vec::new();
    for _ in 0..50 {
        sampler
            .sample(&[1.0, 0.0, 3.0], &no_history(), &params(), &mut neighbour)
            .unwrap();
        batched.push(
            sampler
                .sample(&logits, &no_history(), &seeded, &mut ours)
                .unwrap()
                .token_id,
        );
    }
    assert_eq!(alone, batched);
    // The distribution is flat enough that 50 draws are not all the same token.
    assert!(alone.iter().any(|&t| t != alone[0]));
}

#[test]
fn logprobs_are_raw_log_softmax_and_top_n_is_ordered() {
    let logits = [1.0f32, -0.5, 2.0, 0.0, 2.0, -3.0, 0.7, 1.5, -1.0, 0.2];
    let processed = SamplingParams {
        temperature: 0.3,
        repetition_penalty: 1.8,
        logprobs: Some(10),
        ..params()
    };
    let context = SamplingContext {
        prompt_ids: &[2, 4],
        output_ids: &[7],
    };
    let mut sampler = Sampler::new(vec![EOS]);
    let mut rng = SequenceRng::from_seed(3);
    let token = sampler
        .sample(&logits, &context, &processed, &mut rng)
        .unwrap();

    let expected: Vec<f64> = softmax(&logits, 1.0).iter().map(|p| p.ln()).collect();
    assert_eq!(token.top_logprobs.len(), 10);
    let total: f64 = token
        .top_logprobs
        .iter()
        .map(|&(_, lp)| f64::from(lp).exp())
        .sum();
    assert!((total - 1.0).abs() < 1e-5, "{total}");
    for &(token_id, logprob) in &token.top_logprobs {
        assert!((f64::from(logprob) - expected[token_id as usize]).abs() < 1e-5);
    }
    let order: Vec<u32> = token.top_logprobs.iter().map(|&(id, _)| id).collect();
    assert_eq!(order, vec![2, 4, 7, 0, 6, 9, 3, 1, 8, 5]);
    assert!((f64::from(token.logprob) - expected[token.token_id as usize]).abs() < 1e-5);

    let two = SamplingParams {
        logprobs: Some(2),
        ..params()
    };
    let top_two = sampler
        .sample(&logits, &no_history(), &two, &mut rng)
        .unwrap()
        .top_logprobs;
    assert_eq!(
        top_two.iter().map(|&(id, _)| id).collect::<Vec<_>>(),
        vec![2, 4]
    );
    let none = sampler
        .sample(&logits, &no_history(), &params(), &mut rng)
        .unwrap();
    assert!(none.top_logprobs.is_empty());
}

#[test]
fn min_tokens_masks_eos_and_stop_ids_until_reached() {
    // EOS (3) and stop id 1 dominate; token 0 is the best remaining.
    let logits = [1.0f32, 8.0, -2.0, 9.0];
    let with_min = SamplingParams {
        min_tokens: 2,
        stop_token_ids: vec![1],
        ..greedy()
    };
    let one_generated = SamplingContext {
        prompt_ids: &[],
        output_ids: &[0],
    };
    let two_generated = SamplingContext {
        prompt_ids: &[],
        output_ids: &[0, 0],
    };
    assert_eq!(sample_once(&logits, &one_generated, &with_min), 0);
    assert_eq!(sample_once(&logits, &two_generated, &with_min), EOS);
    // ignore_eos: EOS is not a stop, so it is not masked; stop ids still are.
    let ignoring = SamplingParams {
        ignore_eos: true,
        ..with_min
    };
    assert_eq!(sample_once(&logits, &one_generated, &ignoring), EOS);
}

#[test]
fn fully_masked_logits_are_an_error() {
    let only_eos = [f32::NEG_INFINITY, f32::NEG_INFINITY, f32::NEG_INFINITY, 0.0];
    let with_min = SamplingParams {
        min_tokens: 1,
        ..params()
    };
    let mut sampler = Sampler::new(vec![EOS]);
    let mut rng = SequenceRng::from_seed(0);
    let result = sampler.sample(&only_eos, &no_history(), &with_min, &mut rng);
    assert_eq!(result, Err(SamplingError::NoCandidate));
    let greedy_min = SamplingParams {
        min_tokens: 1,
        ..greedy()
    };
    let result = sampler.sample(&only_eos, &no_history(), &greedy_min, &mut rng);
    assert_eq!(result, Err(SamplingError::NoCandidate));
    let result = sampler.sample(&[0.0, f32::NAN], &no_history(), &params(), &mut rng);
    assert!(matches!(
        result,
        Err(SamplingError::NonFiniteLogit { token_id: 1, .. })
    ));
}

#[test]
fn large_vocabulary_with_filters_stays_in_top_k() {
    let vocab = 152_064usize;
    let logits: Vec<f32> = (0..vocab)
        .map(|i| ((i as u64 * 2_654_435_761) % 10_007) as f32 / 1_000.0)
        .collect();
    let filtered = SamplingParams {
        top_k: Some(50),
        top_p: 0.9,
        logprobs: Some(5),
        ..params()
    };
    let mut sorted = logits.clone();
    sorted.sort_by(|a, b| b.total_cmp(a));
    let fiftieth = sorted[49];
    let mut sampler = Sampler::new(vec![EOS]);
    let mut rng = SequenceRng::from_seed(11);
    for _ in 0..20 {
        let token = sampler
            .sample(&logits, &no_history(), &filtered, &mut rng)
            .unwrap();
        assert!(logits[token.token_id as usize] >= fiftieth);
        assert_eq!(token.top_logprobs.len(), 5);
    }
}

/// Tokens the filters may return, computed independently of the implementation: min-p in
/// probability space with a small slack, top-k by full sort (same id tie-break), top-p by full sort
/// with a small slack on the cumulative mass.
fn allowed_tokens(logits: &[f32], params: &SamplingParams) -> Vec<u32> {
    let scaled: Vec<f64> = logits
        .iter()
        .map(|&l| f64::from(l) / f64::from(params.temperature))
        .collect();
    let max = scaled.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    let min_p = f64::from(params.min_p);
    let mut kept: Vec<u32> = (0..logits.len() as u32)
        .filter(|&id| (scaled[id as usize] - max).exp() >= min_p * (1.0 - 1e-4))
        .collect();
    kept.sort_by(|&a, &b| {
        scaled[b as usize]
            .total_cmp(&scaled[a as usize])
            .then(a.cmp(&b))
    });
    if let Some(k) = params.top_k.filter(|&k| k > 0) {
        kept.truncate(k);
    }
    let weights: Vec<f64> = kept
        .iter()
        .map(|&id| (scaled[id as usize] - max).exp())
        .collect();
    let total: f64 = weights.iter().sum();
    let mut mass_above = 0.0;
    let mut allowed = Vec::new();
    for (&id, &weight) in kept.iter().zip(&weights) {
        if mass_above < f64::from(params.top_p) * total * (1.0 + 1e-6) {
            allowed.push(id);
        }
        mass_above += weight;
    }
    allowed
}

proptest! {
    #[test]
    fn sampled_token_is_within_filters(
        // Half-unit steps make ties common; large vocabularies span several sum blocks.
        steps in prop_oneof![1usize..40, 1_000usize..3_000]
            .prop_flat_map(|len| prop::collection::vec(-16i32..16, len)),
        temperature in 0.1f32..2.0,
        top_k in prop::option::of(0usize..45),
        top_p in prop::option::of(0.05f32..1.0),
        min_p in prop::option::of(0.0f32..0.9),
        seed in any::<u64>(),
    ) {
        let logits: Vec<f32> = steps.iter().map(|&s| s as f32 * 0.5).collect();
        let top_p = top_p.unwrap_or(1.0);
        let min_p = min_p.unwrap_or(0.0);
        let filtered = SamplingParams { temperature, top_k, top_p, min_p, ..params() };
        let allowed = allowed_tokens(&logits, &filtered);
        let mut sampler = Sampler::new(vec![]);
        let mut rng = SequenceRng::from_seed(seed);
        for _ in 0..8 {
            let token = sampler.sample(&logits, &no_history(), &filtered, &mut rng).unwrap();
            prop_assert!(allowed.contains(&token.token_id), "{} not in {:?}", token.token_id, allowed);
        }
    }
}
