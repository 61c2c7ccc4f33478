//! Which of a step's rows the backend samples where the logits live, and the split of a step
//! between that op and the host sampler pool.
//!
//! A row qualifies when its request needs nothing beyond temperature, min-p, top-k, top-p and the
//! chosen token's raw log-probability: then only its token id and log-probability cross to the
//! host (on a GPU, instead of a vocabulary-sized row of f32 logits). The other rows (penalties,
//! min_tokens masking, top-n or full log-probabilities, teacher forcing) are copied to the host,
//! alone, and sampled as before. Either way each row takes exactly one uniform from its
//! request's stream, so a seeded request draws the same numbers on both paths.

use starling_backend::sampling::{RowSamplingParams, TokenFilter};
use starling_backend::Backend;

use super::row_sampling::{RowSample, SamplerPool};
use super::sequence::Sequence;
use super::EngineError;
use crate::sampling::SampledToken;

/// The filter of a row the backend may sample, or `None` when the request needs the host sampler.
pub(super) fn device_filter(seq: &Sequence) -> Option<TokenFilter> {
    let params = &seq.params;
    let host_only = seq.forced_output_ids.is_some()
        || seq.return_full_logprobs
        || params.logprobs.is_some_and(|top_n| top_n > 0)
        // The same tests the penalty pass uses to decide it has work to do.
        || params.repetition_penalty != 1.0
        || params.presence_penalty != 0.0
        || params.frequency_penalty != 0.0
        || seq.output_ids().len() < params.min_tokens;
    (!host_only).then(|| params.token_filter())
}

/// Samples `rows` (each a row of `logits` and its request), returning the results in `rows`'
/// order: qualifying rows through
/// [`DeviceSampling::sample_rows`](starling_backend::DeviceSampling::sample_rows), the others by
/// `samplers` on just their rows copied to the host.
pub(super) fn sample_step<B: Backend>(
    backend: &B,
    samplers: &mut SamplerPool,
    logits: &B::Tensor,
    rows: &mut [(u32, &mut Sequence)],
) -> Result<Vec<Result<RowSample, EngineError>>, EngineError> {
    let mut device_rows = Vec::new();
    let mut host_rows = Vec::new();
    let mut on_device = Vec::with_capacity(rows.len());
    for (row, seq) in rows.iter_mut() {
        let device = match device_filter(seq) {
            Some(filter) => {
                device_rows.push(RowSamplingParams {
                    row: *row,
                    filter,
                    uniform: seq.rng.next_uniform(),
                });
                true
            }
            None => {
                host_rows.push(*row);
                false
            }
        };
        on_device.push(device);
    }
    let device_out = if device_rows.is_empty() {
        Vec::new()
    } else {
        backend.sample_rows(logits, &device_rows)?
    };
    if device_out.len() != device_rows.len() {
        return Err(EngineError::InvalidRequest(format!(
            "the backend sampled {} rows of {}",
            device_out.len(),
            device_rows.len()
        )));
    }
    let host_out = if host_rows.is_empty() {
        Vec::new()
    } else {
        let host_logits = backend.logits_rows_to_host(logits, &host_rows)?;
        let vocab = match host_logits.shape() {
            [n, vocab] if *n == host_rows.len() && *vocab > 0 => *vocab,
            shape => {
                return Err(EngineError::InvalidRequest(format!(
                    "logits of shape {shape:?} for {} host-sampled rows",
                    host_rows.len()
                )))
            }
        };
        let mut jobs: Vec<(&mut Sequence, &[f32])> = rows
            .iter_mut()
            .zip(&on_device)
            .filter(|(_, &device)| !device)
            .map(|((_, seq), _)| &mut **seq)
            .zip(host_logits.data().chunks_exact(vocab))
            .collect();
        samplers.sample_rows(&mut jobs)
    };
    let mut device_out = device_out.into_iter();
    let mut host_out = host_out.into_iter();
    on_device
        .iter()
        .map(|&device| {
            let missing = || EngineError::InvalidRequest("a sampling row has no result".into());
            if device {
                let outcome = device_out.next().ok_or_else(missing)?;
                Ok(outcome
                    .map(|sampled| RowSample {
                        sampled: SampledToken {
                            token_id: sampled.token_id,
                            logprob: sampled.logprob,
                            top_logprobs: Vec::new(),
                        },
                        full_logprobs: None,
                    })
                    .map_err(|e| EngineError::Sampling(e.into())))
            } else {
                host_out.next().ok_or_else(missing)
            }
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use starling_backend::cpu::CpuBackend;
    use starling_backend::{DeviceSampling, HostTensor};

    use super::*;
    use crate::sampling::{Sampler, SamplingContext, SamplingParams, SequenceRng, StopChecker};

    /// Rows with a peaked spread, a flat one, ties at the top and at a top-k boundary, and half
    /// the vocabulary masked.
    fn logits(vocab: usize, seed: u64) -> HostTensor {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut rows = Vec::new();
        let mut peaked: Vec<f32> = (0..vocab).map(|_| rng.gen_range(-4.0f32..4.0)).collect();
        for _ in 0..20 {
            peaked[rng.gen_range(0..vocab)] = rng.gen_range(8.0f32..14.0);
        }
        rows.extend_from_slice(&peaked);
        rows.extend((0..vocab).map(|_| rng.gen_range(-1.0f32..1.0)));
        let mut ties = peaked.clone();
        for id in [vocab - 3, 7, vocab / 2] {
            ties[id] = 20.0;
        }
        for id in 0..60 {
            ties[(id * 31 + 5) % vocab] = 15.0;
        }
        rows.extend_from_slice(&ties);
        rows.extend(peaked.iter().enumerate().map(
            |(id, &l)| {
                if id % 2 == 1 {
                    f32::NEG_INFINITY
                } else {
                    l
                }
            },
        ));
        HostTensor::new(vec![4, vocab], rows).unwrap()
    }

    fn params(temperature: f32, top_k: Option<usize>, top_p: f32, min_p: f32) -> SamplingParams {
        SamplingParams {
            temperature,
            top_k,
            top_p,
            min_p,
            ..SamplingParams::default()
        }
    }

    /// Greedy, temperature, top-k (1, inside the tie, large), top-p, min-p and combinations.
    fn combos() -> Vec<SamplingParams> {
        vec![
            params(0.0, None, 1.0, 0.0),
            params(0.0, Some(5), 0.5, 0.3),
            params(1.0, None, 1.0, 0.0),
            params(0.7, None, 1.0, 0.0),
            params(1.0, Some(1), 1.0, 0.0),
            params(1.0, Some(30), 1.0, 0.0),
            params(0.8, Some(2_000), 1.0, 0.0),
            params(1.0, None, 0.9, 0.0),
            params(0.6, None, 0.5, 0.0),
            params(1.3, None, 0.99, 0.0),
            params(1.0, None, 1.0, 0.05),
            params(0.8, Some(40), 0.9, 0.0),
            params(1.0, Some(2_000), 0.95, 0.02),
            params(0.7, Some(50), 0.8, 0.1),
        ]
    }

    #[test]
    fn cpu_backend_sampling_equals_the_host_sampler_bit_for_bit() {
        let backend = CpuBackend::new();
        let no_history = SamplingContext {
            prompt_ids: &[],
            output_ids: &[],
        };
        for vocab in [5_000usize, 151_936] {
            let logits = logits(vocab, vocab as u64);
            let mut sampler = Sampler::new(Vec::new());
            let mut requests = Vec::new();
            let mut expected = Vec::new();
            for row in 0..4u32 {
                let row_logits = &logits.data()[row as usize * vocab..][..vocab];
                for (index, params) in combos().iter().enumerate() {
                    for draw in 0..3u64 {
                        let seed = u64::from(row) * 1_000 + index as u64 * 10 + draw;
                        let mut rng = SequenceRng::from_seed(seed);
                        expected.push(
                            sampler
                                .sample(row_logits, &no_history, params, &mut rng)
                                .unwrap(),
                        );
                        requests.push(RowSamplingParams {
                            row,
                            filter: params.token_filter(),
                            uniform: SequenceRng::from_seed(seed).next_uniform(),
                        });
                    }
                }
            }
            let got = backend.sample_rows(&logits, &requests).unwrap();
            for ((request, want), got) in requests.iter().zip(&expected).zip(got) {
                let got = got.unwrap();
                assert_eq!(got.token_id, want.token_id, "vocab {vocab} {request:?}");
                assert_eq!(got.logprob.to_bits(), want.logprob.to_bits(), "{request:?}");
            }
        }
    }

    fn sequence(params: SamplingParams, seed: u64) -> Sequence {
        Sequence {
            token_ids: vec![1, 2, 3],
            num_prompt_tokens: 3,
            stop: StopChecker::new(&params, &[], 16),
            params,
            rng: SequenceRng::from_seed(seed),
            text: None,
            compression: None,
            window_tail: None,
            compacted_off_plan: false,
            forced_output_ids: None,
            return_full_logprobs: false,
        }
    }

    #[test]
    fn only_requests_needing_nothing_more_qualify() {
        let plain = params(0.7, Some(40), 0.9, 0.05);
        assert_eq!(
            device_filter(&sequence(plain.clone(), 0)),
            Some(plain.token_filter())
        );
        let with = |change: fn(&mut SamplingParams)| {
            let mut p = plain.clone();
            change(&mut p);
            device_filter(&sequence(p, 0))
        };
        assert!(with(|p| p.repetition_penalty = 1.1).is_none());
        assert!(with(|p| p.presence_penalty = 0.5).is_none());
        assert!(with(|p| p.frequency_penalty = -0.5).is_none());
        assert!(with(|p| p.logprobs = Some(2)).is_none());
        assert!(with(|p| p.logprobs = Some(0)).is_some());
        // min_tokens masks only until reached: 1 output token is already there.
        assert!(with(|p| p.min_tokens = 2).is_none());
        let mut reached = sequence(
            SamplingParams {
                min_tokens: 1,
                ..plain.clone()
            },
            0,
        );
        reached.token_ids.push(4);
        assert!(device_filter(&reached).is_some());
        let mut forced = sequence(plain.clone(), 0);
        forced.forced_output_ids = Some(vec![5]);
        assert!(device_filter(&forced).is_none());
        let mut full = sequence(plain, 0);
        full.return_full_logprobs = true;
        assert!(device_filter(&full).is_none());
    }

    #[test]
    fn a_mixed_step_equals_sampling_every_row_on_the_host() {
        let vocab = 3_000;
        let logits = logits(vocab, 9);
        let mixed = [
            params(0.7, None, 0.9, 0.0),
            SamplingParams {
                repetition_penalty: 1.3,
                ..params(0.9, Some(20), 1.0, 0.0)
            },
            params(0.0, None, 1.0, 0.0),
            SamplingParams {
                logprobs: Some(3),
                ..params(1.0, None, 1.0, 0.1)
            },
        ];
        let mut seqs: Vec<Sequence> = (0u64..)
            .zip(&mixed)
            .map(|(seed, p)| sequence(p.clone(), seed))
            .collect();
        let mut reference: Vec<Sequence> = (0u64..)
            .zip(&mixed)
            .map(|(seed, p)| sequence(p.clone(), seed))
            .collect();
        // Logits rows in reverse order of the requests, so the merge must follow `rows`.
        let mut rows: Vec<(u32, &mut Sequence)> = seqs
            .iter_mut()
            .zip((0..4u32).rev())
            .map(|(seq, row)| (row, seq))
            .collect();
        let mut pool = SamplerPool::new(&[], 2);
        let got = sample_step(&CpuBackend::new(), &mut pool, &logits, &mut rows).unwrap();
        let mut sampler = Sampler::new(Vec::new());
        for ((seq, row), got) in reference.iter_mut().zip((0..4usize).rev()).zip(got) {
            let row_logits = &logits.data()[row * vocab..][..vocab];
            let context = SamplingContext {
                prompt_ids: &seq.token_ids[..3],
                output_ids: &[],
            };
            let want = sampler
                .sample(row_logits, &context, &seq.params, &mut seq.rng)
                .unwrap();
            assert_eq!(got.unwrap().sampled, want, "{:?}", seq.params);
        }
        // Every request took exactly one uniform from its stream.
        for (seq, reference) in seqs.iter_mut().zip(&mut reference) {
            assert_eq!(seq.rng.next_uniform(), reference.rng.next_uniform());
        }
    }
}
