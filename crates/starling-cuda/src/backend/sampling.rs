//! Token sampling on the GPU (kernel in `kernels/sampling.cu`): one block per sampled row, one
//! launch per step; only each row's status, token id and log-probability (16 bytes) come back,
//! instead of a vocabulary-sized row of f32 logits. Rows the host must sample are copied alone.

use cudarc::driver::LaunchConfig;
use starling_backend::sampling::{
    check_rows, LogitsError, RowOutcome, RowSamplingParams, SampledRow,
};
use starling_backend::HostTensor;

use super::kv_ops::int_arg;
use super::CudaBackend;
use crate::{CudaError, CudaTensor};

/// Threads per row's block (`THREADS` in sampling.cu).
const THREADS: u32 = 1024;
/// Parameter words per row (`PARAM_WORDS` in sampling.cu).
const PARAM_WORDS: usize = 8;
/// Output words per row (`OUT_WORDS` in sampling.cu).
const OUT_WORDS: usize = 4;
/// 8-byte words of a row's share of the greedy passes (`RowPart` in sampling.cu: an f64 sum,
/// the best logit, its id, the first non-finite id, padding).
const ROW_PART_WORDS: usize = 3;
/// Fewest logits a share of a row's greedy passes holds.
const MIN_SHARE_LOGITS: usize = 8192;
/// Most blocks one row's greedy passes are split across.
const MAX_SPLITS: usize = 16;

/// Blocks per sampled row (`sample_rows_f32`'s grid.y): enough for the step's rows to cover about
/// two waves of `num_sms` SMs, every share at least [`MIN_SHARE_LOGITS`], at most
/// [`MAX_SPLITS`]. One row of a 151,936-token vocabulary takes 16 blocks; 128 rows take 3.
fn sampling_splits(rows: usize, vocab: usize, num_sms: usize) -> usize {
    let by_sms = (2 * num_sms).div_ceil(rows.max(1));
    let by_vocab = vocab / MIN_SHARE_LOGITS;
    by_sms.min(by_vocab).clamp(1, MAX_SPLITS)
}
const FLAG_GREEDY: u32 = 1;
const FLAG_TOP_P: u32 = 2;
const STATUS_OK: u32 = 0;
const STATUS_NON_FINITE: u32 = 1;

impl CudaBackend {
    pub(super) fn sample_rows_impl(
        &self,
        logits: &CudaTensor,
        rows: &[RowSamplingParams],
    ) -> Result<Vec<RowOutcome>, CudaError> {
        let (num_rows, vocab) = logits_matrix(logits)?;
        check_rows(num_rows, rows.iter().map(|r| r.row))?;
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        if vocab == 0 {
            return Ok(vec![Err(LogitsError::Empty); rows.len()]);
        }
        let vocab_i = int_arg(vocab, "sample_rows: vocabulary")?;
        let grid = u32::try_from(rows.len())
            .map_err(|_| CudaError::Shape(format!("{} sampling rows", rows.len())))?;
        let params = self.upload_u32(&pack_params(rows, vocab))?;
        // SAFETY: thread 0 of each row's last block writes all OUT_WORDS words of its row.
        let mut out = unsafe { self.stream.alloc::<u32>(rows.len() * OUT_WORDS) }?;
        let splits = sampling_splits(rows.len(), vocab, self.num_sms);
        let cfg = LaunchConfig {
            grid_dim: (grid, splits as u32, 1),
            block_dim: (THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        // A row's shares of the greedy passes (RowPart: 3 × 8 bytes) and its count of finished
        // blocks, which must start at zero; one split touches neither.
        let (shares_words, done_words) = if splits > 1 {
            (rows.len() * splits * ROW_PART_WORDS, rows.len())
        } else {
            (1, 1)
        };
        // SAFETY: each block writes its own share before the row's last block reads them all.
        let mut shares = unsafe { self.stream.alloc::<u64>(shares_words) }?;
        let mut done = self.stream.alloc_zeros::<u32>(done_words)?;
        launch!(
            self,
            &self.kernels.sample_rows,
            cfg,
            logits.f32()?,
            &vocab_i,
            &params,
            &mut out,
            &mut shares,
            &mut done
        )?;
        let words: Vec<u32> = self.stream.clone_dtoh(&out)?;
        Ok(words.chunks_exact(OUT_WORDS).map(decode).collect())
    }

    pub(super) fn logits_rows_to_host_impl(
        &self,
        logits: &CudaTensor,
        rows: &[u32],
    ) -> Result<HostTensor, CudaError> {
        let (num_rows, vocab) = logits_matrix(logits)?;
        check_rows(num_rows, rows.iter().copied())?;
        let src = logits.f32()?;
        let every_row_in_order =
            rows.len() == num_rows && rows.iter().zip(0u32..).all(|(&row, i)| row == i);
        let data = if rows.is_empty() || vocab == 0 {
            Vec::new()
        } else if every_row_in_order {
            let mut data: Vec<f32> = self.stream.clone_dtoh(src)?;
            data.truncate(num_rows * vocab);
            data
        } else {
            // Pack the rows on the device, then make one copy to the host.
            // SAFETY: the loop below writes every row of `packed`.
            let mut packed = unsafe { self.stream.alloc::<f32>(rows.len() * vocab) }?;
            for (i, &row) in rows.iter().enumerate() {
                let start = row as usize * vocab;
                let from = src.try_slice(start..start + vocab).ok_or_else(|| {
                    CudaError::Shape(format!("logits buffer holds no row {row} of {vocab}"))
                })?;
                let mut to = packed.slice_mut(i * vocab..(i + 1) * vocab);
                self.stream.memcpy_dtod(&from, &mut to)?;
            }
            self.stream.clone_dtoh(&packed)?
        };
        Ok(HostTensor::new(vec![rows.len(), vocab], data)?)
    }
}

/// `(rows, vocab)` of an f32 logits matrix.
fn logits_matrix(logits: &CudaTensor) -> Result<(usize, usize), CudaError> {
    match logits.shape() {
        [rows, vocab] => Ok((*rows, *vocab)),
        s => Err(CudaError::Shape(format!(
            "sampling: logits must be [rows, vocab], got {s:?}"
        ))),
    }
}

/// The kernel's parameter words for each row. The filters' host-side constants are computed
/// here with the host sampler's own expressions (`ln(min(min_p, 1))` in f32, the greedy rule,
/// which top-k and top-p are on), so the device starts from identical values.
fn pack_params(rows: &[RowSamplingParams], vocab: usize) -> Vec<u32> {
    let mut words = Vec::with_capacity(rows.len() * PARAM_WORDS);
    for params in rows {
        let filter = &params.filter;
        let mut flags = 0;
        if filter.is_greedy() {
            flags |= FLAG_GREEDY;
        }
        if filter.top_p < 1.0 {
            flags |= FLAG_TOP_P;
        }
        // Off, 0 and at least the vocabulary all mean "no top-k" (as in choose_token); what is
        // left is below a vocabulary whose size fits an i32.
        let top_k = filter
            .top_k
            .filter(|&k| k > 0 && k < vocab)
            .map_or(0, |k| k as u32);
        let log_min_p = if filter.min_p > 0.0 {
            filter.min_p.min(1.0).ln()
        } else {
            f32::NEG_INFINITY
        };
        let uniform = params.uniform.to_bits();
        words.extend_from_slice(&[
            params.row,
            flags,
            top_k,
            filter.temperature.to_bits(),
            filter.top_p.to_bits(),
            log_min_p.to_bits(),
            uniform as u32,
            (uniform >> 32) as u32,
        ]);
    }
    words
}

/// One row's output words as the host's result.
fn decode(words: &[u32]) -> RowOutcome {
    match words[0] {
        STATUS_OK => Ok(SampledRow {
            token_id: words[1],
            logprob: f32::from_bits(words[2]),
        }),
        STATUS_NON_FINITE => Err(LogitsError::NonFinite {
            token_id: words[1],
            value: f32::from_bits(words[2]),
        }),
        _ => Err(LogitsError::NoCandidate),
    }
}

#[cfg(test)]
mod tests {
    use starling_backend::sampling::TokenFilter;

    use super::*;

    #[test]
    fn rows_split_across_blocks_by_the_sms_and_the_vocabulary() {
        // H200: 132 SMs. Qwen's vocabulary at batch 1 and 16: the 16-block cap.
        assert_eq!(sampling_splits(1, 151_936, 132), 16);
        assert_eq!(sampling_splits(16, 151_936, 132), 16);
        assert_eq!(sampling_splits(128, 151_936, 132), 3);
        assert_eq!(sampling_splits(256, 151_936, 132), 2);
        assert_eq!(sampling_splits(512, 151_936, 132), 1);
        // Llama's 32,000 tokens: shares of at least 8,192.
        assert_eq!(sampling_splits(1, 32_000, 132), 3);
        // Small vocabularies stay in one block.
        assert_eq!(sampling_splits(1, 256, 132), 1);
        assert_eq!(sampling_splits(1, 8191, 132), 1);
    }

    #[test]
    fn params_pack_the_host_sampler_constants() {
        let row = |temperature, top_k, top_p, min_p| RowSamplingParams {
            row: 3,
            filter: TokenFilter {
                temperature,
                top_k,
                top_p,
                min_p,
            },
            uniform: 0.25,
        };
        let words = pack_params(
            &[
                row(0.0, Some(5), 0.9, 0.0),
                row(0.7, Some(100), 1.0, 0.05),
                row(1.0, Some(99), 0.5, 2.0),
            ],
            100,
        );
        assert_eq!(words.len(), 3 * PARAM_WORDS);
        let (greedy, plain, clamped) = (&words[..8], &words[8..16], &words[16..]);
        assert_eq!(greedy[..3], [3, FLAG_GREEDY | FLAG_TOP_P, 5]);
        assert_eq!(f32::from_bits(greedy[5]), f32::NEG_INFINITY);
        assert_eq!(
            f64::from_bits(u64::from(greedy[6]) | (u64::from(greedy[7]) << 32)),
            0.25
        );
        // top_k equal to the vocabulary is off; min-p is a log threshold.
        assert_eq!(plain[1..3], [0, 0]);
        assert_eq!(f32::from_bits(plain[3]), 0.7);
        assert_eq!(f32::from_bits(plain[5]), 0.05f32.ln());
        // min_p above 1 keeps the top token only: ln(1) = 0.
        assert_eq!(clamped[1..3], [FLAG_TOP_P, 99]);
        assert_eq!(f32::from_bits(clamped[5]), 0.0);
    }

    #[test]
    fn outputs_decode_to_tokens_and_errors() {
        assert_eq!(
            decode(&[STATUS_OK, 7, (-1.5f32).to_bits(), 0]),
            Ok(SampledRow {
                token_id: 7,
                logprob: -1.5
            })
        );
        assert!(matches!(
            decode(&[STATUS_NON_FINITE, 4, f32::NAN.to_bits(), 0]),
            Err(LogitsError::NonFinite { token_id: 4, value }) if value.is_nan()
        ));
        assert_eq!(decode(&[2, 0, 0, 0]), Err(LogitsError::NoCandidate));
    }
}
