//! Choosing a token from one row of logits: the math every sampling path shares.
//!
//! The engine's host sampler (penalties, min_tokens masking, top-n log-probabilities) calls
//! [`choose_token`] on its processed logits;
//! [`DeviceSampling::sample_rows`](crate::DeviceSampling::sample_rows) runs the rest of the pipeline (temperature → min-p → top-k → top-p → draw, raw log-probability)
//! next to the logits, and [`sample_row`] is its reference, so a row sampled by a backend and the
//! same row sampled on the host give the same token (bit for bit on the CPU; up to float near-ties
//! on a device, whose sums run in another order).
//!
//! Canonical semantics, which a device kernel reproduces:
//! - greedy (temperature below [`GREEDY_TEMPERATURE_EPS`], or NaN): the largest raw logit, lowest
//!   id on ties;
//! - otherwise `s = min(logit / temperature, f32::MAX)`, `M = max s`, weights `exp(s − M)`; min-p
//!   keeps `s >= M + ln(min_p)`; top-k keeps the k best by rank (s descending by `total_cmp`, lower
//!   id first on ties); top-p keeps the shortest rank prefix of those whose weight reaches
//!   `top_p` of theirs. The kept set is always a rank prefix of the allowed tokens;
//! - the draw walks the kept tokens in increasing id order and takes the first whose cumulative
//!   weight exceeds `uniform · total`.

mod choose;
mod draw;
mod error;
mod filters;
mod normalizer;
mod ranking;
mod vector_math;

use rayon::prelude::*;

use crate::{BackendError, HostTensor};

pub use choose::{choose_token, FilterScratch};
pub use error::LogitsError;
pub use normalizer::log_normalizer;

/// Temperatures below this are treated as greedy decoding (vLLM's `_SAMPLING_EPS`), because dividing
/// logits by a near-zero temperature only amplifies float noise.
pub const GREEDY_TEMPERATURE_EPS: f32 = 1e-5;

/// The sampling knobs applied after penalties and masking: temperature, min-p, top-k, top-p.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct TokenFilter {
    /// Softmax temperature; below [`GREEDY_TEMPERATURE_EPS`] (or NaN) means greedy argmax.
    pub temperature: f32,
    /// Keep the k best-ranked tokens; `None`, 0 or at least the vocabulary size keeps all.
    pub top_k: Option<usize>,
    /// Keep the shortest rank prefix holding this share of the weight; 1 (or NaN) keeps all.
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one; 0 keeps all.
    pub min_p: f32,
}

impl TokenFilter {
    /// Whether the token is the argmax rather than a draw.
    pub fn is_greedy(&self) -> bool {
        // An unvalidated NaN temperature decodes greedily rather than producing NaN weights.
        self.temperature.is_nan() || self.temperature < GREEDY_TEMPERATURE_EPS
    }
}

/// Buffers [`sample_row`] reuses between rows (one per worker thread).
#[derive(Debug, Default)]
pub struct SamplingScratch {
    processed: Vec<f32>,
    filter: FilterScratch,
}

/// One row of a logits tensor to sample where the logits live.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct RowSamplingParams {
    /// Row of the logits tensor.
    pub row: u32,
    /// Temperature and filters.
    pub filter: TokenFilter,
    /// The row's uniform draw in `[0, 1)`, taken from the request's random stream exactly as the
    /// host sampler takes it (one per sampled token, greedy included).
    pub uniform: f64,
}

/// What sampling one row returns: nothing else crosses to the host.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SampledRow {
    /// The chosen token.
    pub token_id: u32,
    /// Its raw log-probability: the log-softmax of the unprocessed logits.
    pub logprob: f32,
}

/// One row's result: its token, or why its logits could not be sampled.
pub type RowOutcome = Result<SampledRow, LogitsError>;

/// The reference of [`DeviceSampling::sample_rows`](crate::DeviceSampling::sample_rows) for one
/// row of raw `logits`: greedy argmax or the filtered draw, and the chosen token's raw log-probability.
pub fn sample_row(
    logits: &[f32],
    filter: &TokenFilter,
    uniform: f64,
    scratch: &mut SamplingScratch,
) -> RowOutcome {
    let log_normalizer = log_normalizer(logits)?;
    let token_id = if filter.is_greedy() {
        // No processing happens before the argmax, so the raw logits need no copy.
        ranking::argmax(logits)
    } else {
        scratch.processed.clear();
        scratch.processed.extend_from_slice(logits);
        choose_token(&mut scratch.processed, filter, uniform, &mut scratch.filter)
    }
    .ok_or(LogitsError::NoCandidate)?;
    Ok(SampledRow {
        token_id,
        logprob: logits[token_id as usize] - log_normalizer,
    })
}

/// [`sample_row`] for every entry of `rows` of a host `[n, vocab]` logits tensor, in parallel
/// across rows; results come back in `rows`' order.
pub fn sample_host_rows(
    logits: &HostTensor,
    rows: &[RowSamplingParams],
) -> Result<Vec<RowOutcome>, BackendError> {
    let (_, vocab) = logits_dims(logits, rows)?;
    Ok(rows
        .par_iter()
        .map_init(SamplingScratch::default, |scratch, params| {
            let start = params.row as usize * vocab;
            let row = &logits.data()[start..start + vocab];
            sample_row(row, &params.filter, params.uniform, scratch)
        })
        .collect())
}

/// `(rows, vocab)` of a logits matrix, checking that every requested row exists.
pub fn logits_dims(
    logits: &HostTensor,
    rows: &[RowSamplingParams],
) -> Result<(usize, usize), BackendError> {
    let (num_rows, vocab) = match logits.shape() {
        [r, c] => (*r, *c),
        s => {
            return Err(BackendError::Shape(format!(
                "sample_rows: logits must be [rows, vocab], got {s:?}"
            )))
        }
    };
    check_rows(num_rows, rows.iter().map(|r| r.row))?;
    Ok((num_rows, vocab))
}

/// Fails when a requested row is not below `num_rows`.
pub fn check_rows(
    num_rows: usize,
    rows: impl IntoIterator<Item = u32>,
) -> Result<(), BackendError> {
    match rows.into_iter().find(|&r| r as usize >= num_rows) {
        Some(bad) => Err(BackendError::Shape(format!(
            "logits row {bad} requested from {num_rows} rows"
        ))),
        None => Ok(()),
    }
}

/// The listed rows of a host `[n, vocab]` matrix, in the listed order.
pub fn select_host_rows(logits: &HostTensor, rows: &[u32]) -> Result<HostTensor, BackendError> {
    let (num_rows, vocab) = match logits.shape() {
        [r, c] => (*r, *c),
        s => {
            return Err(BackendError::Shape(format!(
                "logits rows: expected [rows, vocab], got {s:?}"
            )))
        }
    };
    check_rows(num_rows, rows.iter().copied())?;
    let mut data = Vec::with_capacity(rows.len() * vocab);
    for &row in rows {
        let start = row as usize * vocab;
        data.extend_from_slice(&logits.data()[start..start + vocab]);
    }
    HostTensor::new(vec![rows.len(), vocab], data)
}

#[cfg(test)]
mod tests {
    use rand::{Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;

    use super::*;

    /// The canonical semantics of the module note, written plainly: full sort, f64 sums.
    fn naive_token(logits: &[f32], filter: &TokenFilter, uniform: f64) -> u32 {
        let best = |ids: &mut dyn Iterator<Item = usize>| ids.next().unwrap_or(0) as u32;
        if filter.is_greedy() {
            let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            return best(&mut (0..logits.len()).filter(|&i| logits[i] == max));
        }
        let scaled: Vec<f32> = logits
            .iter()
            .map(|&l| (l / filter.temperature).min(f32::MAX))
            .collect();
        let max = scaled.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let floor = if filter.min_p > 0.0 {
            max + filter.min_p.min(1.0).ln()
        } else {
            f32::NEG_INFINITY
        };
        let mut ranked: Vec<usize> = (0..logits.len())
            .filter(|&i| scaled[i] >= floor && scaled[i] > f32::NEG_INFINITY)
            .collect();
        ranked.sort_by(|&a, &b| scaled[b].total_cmp(&scaled[a]).then(a.cmp(&b)));
        if let Some(k) = filter.top_k.filter(|&k| k > 0 && k < logits.len()) {
            ranked.truncate(k);
        }
        let weight = |i: usize| f64::from(scaled[i] - max).exp();
        if filter.top_p < 1.0 {
            let total: f64 = ranked.iter().map(|&i| weight(i)).sum();
            let mut cumulative = 0.0;
            let keep = 1 + ranked
                .iter()
                .position(|&i| {
                    cumulative += weight(i);
                    cumulative >= f64::from(filter.top_p) * total
                })
                .unwrap_or(ranked.len() - 1);
            ranked.truncate(keep);
        }
        ranked.sort_unstable();
        let total: f64 = ranked.iter().map(|&i| weight(i)).sum();
        let mut left = uniform * total;
        for &i in &ranked {
            left -= weight(i);
            if left < 0.0 {
                return i as u32;
            }
        }
        ranked.last().map_or(0, |&i| i as u32)
    }

    #[test]
    fn sample_row_follows_the_canonical_semantics() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut scratch = SamplingScratch::default();
        let filters = [
            (0.0, None, 1.0, 0.0),
            (1.0, None, 1.0, 0.0),
            (0.7, Some(10), 1.0, 0.0),
            (1.0, None, 0.8, 0.0),
            (1.3, Some(100), 0.9, 0.05),
            (0.9, None, 1.0, 0.1),
        ];
        for case in 0..40 {
            // Peaked rows with a tie at the top and ties across the top-k boundary.
            let mut logits: Vec<f32> = (0..2_000).map(|_| rng.gen_range(-6.0f32..0.0)).collect();
            for id in 0..30 {
                logits[(id * 67 + case) % 2_000] = 2.0;
            }
            logits[1_999] = 4.0;
            logits[(case * 13) % 1_000] = 4.0;
            for &(temperature, top_k, top_p, min_p) in &filters {
                let filter = TokenFilter {
                    temperature,
                    top_k,
                    top_p,
                    min_p,
                };
                let uniform: f64 = rng.gen();
                let got = sample_row(&logits, &filter, uniform, &mut scratch).unwrap();
                assert_eq!(
                    got.token_id,
                    naive_token(&logits, &filter, uniform),
                    "case {case} {filter:?} u {uniform}"
                );
                let lse = logits.iter().map(|&l| f64::from(l).exp()).sum::<f64>().ln();
                let logprob = f64::from(logits[got.token_id as usize]) - lse;
                assert!((f64::from(got.logprob) - logprob).abs() < 1e-5);
            }
        }
    }

    #[test]
    fn host_rows_are_checked_selected_and_sampled_in_request_order() {
        let logits = HostTensor::new(vec![3, 2], vec![0.0, 1.0, 5.0, 2.0, f32::NAN, 0.0]).unwrap();
        let greedy = TokenFilter {
            temperature: 0.0,
            top_k: None,
            top_p: 1.0,
            min_p: 0.0,
        };
        let request = |row| RowSamplingParams {
            row,
            filter: greedy,
            uniform: 0.5,
        };
        let out = sample_host_rows(&logits, &[request(1), request(0), request(2)]).unwrap();
        assert_eq!(out[0].map(|s| s.token_id), Ok(0));
        assert_eq!(out[1].map(|s| s.token_id), Ok(1));
        assert!(matches!(
            out[2],
            Err(LogitsError::NonFinite { token_id: 0, .. })
        ));
        assert!(sample_host_rows(&logits, &[request(3)]).is_err());
        let picked = select_host_rows(&logits, &[2, 0]).unwrap();
        assert_eq!(picked.shape(), &[2, 2]);
        assert_eq!(picked.data()[1..], [0.0, 0.0, 1.0]);
        assert!(select_host_rows(&logits, &[3]).is_err());
    }
}
