//! Branch-free reductions over the vocabulary (max, sums of exponentials) that the compiler can
//! vectorise.
//!
//! `f32::exp` is a libm call that cannot be vectorised, and `fold(f32::max)` is serialised by its
//! NaN rules; over a 152k-token vocabulary they made the log-softmax alone cost about a millisecond
//! per token. The `exp` here is Cephes-style (range reduction by ln 2, degree-6 polynomial, exponent
//! built from bits), accurate to a few ulp, with no branches, libm calls or saturating casts. Sums
//! run in f32 lanes over short blocks and add the blocks in f64, which vectorises and stays
//! accurate to about 1e-7 relative.

use super::ranking::Candidate;

/// Below this, `exp` underflows the normal f32 range; such weights are treated as exactly 0.
const MIN_EXPONENT: f32 = -87.0;
/// Adding 1.5 * 2^23 rounds an f32 of magnitude below 2^22 to an integer held in the low mantissa
/// bits, which avoids both `round()` (a libm call without SSE4.1) and an `as i32` cast.
const ROUNDING_MAGIC: f32 = 12_582_912.0;
const LOG2_E: f32 = std::f32::consts::LOG2_E;
/// ln 2 split into a part exact in f32 and a remainder, so `x - n ln 2` loses no precision.
const LN2_HIGH: f32 = 0.693_359_4;
const LN2_LOW: f32 = -2.121_944_4e-4;
/// Width of the accumulators; wide enough for AVX and small enough for SSE registers.
pub(super) const LANES: usize = 8;
/// Elements summed in f32 lanes before the block's total is added in f64.
pub(super) const BLOCK_LEN: usize = 1024;

/// `exp(x)` for `x <= 0` (including `-inf`, which gives 0); relative error below 1e-6.
#[inline(always)]
pub(super) fn exp_nonpositive(x: f32) -> f32 {
    let clamped = x.max(MIN_EXPONENT);
    let shifted = clamped * LOG2_E + ROUNDING_MAGIC;
    let n = shifted - ROUNDING_MAGIC;
    let exponent = (shifted.to_bits() as i32).wrapping_sub(ROUNDING_MAGIC.to_bits() as i32);
    let r = clamped - n * LN2_HIGH - n * LN2_LOW;
    let mut p = 1.987_569_1e-4f32;
    p = p * r + 1.398_199_9e-3;
    p = p * r + 8.333_452e-3;
    p = p * r + 4.166_579_6e-2;
    p = p * r + 1.666_666_5e-1;
    p = p * r + 0.5;
    let mantissa = p * r * r + r + 1.0;
    let scale = f32::from_bits((exponent.wrapping_add(127) as u32) << 23);
    let value = mantissa * scale;
    if x < MIN_EXPONENT {
        0.0
    } else {
        value
    }
}

/// `exp(value - shift)` when `value >= floor`, else 0: the weight of a token that survived a
/// threshold filter.
#[inline(always)]
pub(super) fn weight_at_least(value: f32, shift: f32, floor: f32) -> f32 {
    let weight = exp_nonpositive(value - shift);
    if value >= floor {
        weight
    } else {
        0.0
    }
}

/// The largest value, ignoring NaN; `-inf` when `values` is empty.
pub(super) fn max_value(values: &[f32]) -> f32 {
    let mut lanes = [f32::NEG_INFINITY; LANES];
    let chunks = values.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            // A plain comparison (unlike `f32::max`) compiles to a vector max instruction.
            *lane = if value > *lane { value } else { *lane };
        }
    }
    lanes
        .iter()
        .chain(tail)
        .copied()
        .fold(f32::NEG_INFINITY, f32::max)
}

/// Whether any value is NaN or `+inf`, the logits a softmax cannot use.
pub(super) fn has_nan_or_positive_infinity(values: &[f32]) -> bool {
    // A non-short-circuiting fold, so the loop vectorises; only the error path pays a second scan.
    values.iter().fold(false, |found, &value| {
        found | value.is_nan() | (value == f32::INFINITY)
    })
}

/// `sum(exp(v - shift))` over the values `v >= floor` of one block (at most [`BLOCK_LEN`]), where
/// `shift` is at least every value.
pub(super) fn block_sum_exp(block: &[f32], shift: f32, floor: f32) -> f64 {
    let mut lanes = [0f32; LANES];
    let chunks = block.chunks_exact(LANES);
    let tail = chunks.remainder();
    for chunk in chunks {
        for (lane, &value) in lanes.iter_mut().zip(chunk) {
            *lane += weight_at_least(value, shift, floor);
        }
    }
    let tail_sum: f32 = tail
        .iter()
        .map(|&value| weight_at_least(value, shift, floor))
        .sum();
    lanes.iter().map(|&lane| f64::from(lane)).sum::<f64>() + f64::from(tail_sum)
}

/// `sum(exp(v - shift))` over all `values`, where `shift` is at least every value.
pub(super) fn sum_exp_shifted(values: &[f32], shift: f32) -> f64 {
    values
        .chunks(BLOCK_LEN)
        .map(|block| block_sum_exp(block, shift, f32::NEG_INFINITY))
        .sum()
}

/// `sum(exp(c.logit - shift))` over `candidates`.
pub(super) fn sum_exp_candidates(candidates: &[Candidate], shift: f32) -> f64 {
    let mut total = 0f64;
    for block in candidates.chunks(BLOCK_LEN) {
        let mut lanes = [0f32; LANES];
        let chunks = block.chunks_exact(LANES);
        let tail = chunks.remainder();
        for chunk in chunks {
            for (lane, candidate) in lanes.iter_mut().zip(chunk) {
                *lane += exp_nonpositive(candidate.logit - shift);
            }
        }
        let tail_sum: f32 = tail
            .iter()
            .map(|candidate| exp_nonpositive(candidate.logit - shift))
            .sum();
        total += lanes.iter().map(|&lane| f64::from(lane)).sum::<f64>() + f64::from(tail_sum);
    }
    total
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_std_exp_over_the_range() {
        let mut worst_relative = 0f64;
        for step in 0..=200_000 {
            let x = -87.0 * step as f32 / 200_000.0;
            let exact = f64::from(x).exp();
            let relative = (f64::from(exp_nonpositive(x)) - exact).abs() / exact;
            worst_relative = worst_relative.max(relative);
        }
        assert!(worst_relative < 1e-6, "{worst_relative}");
        assert_eq!(exp_nonpositive(0.0), 1.0);
        assert_eq!(exp_nonpositive(f32::NEG_INFINITY), 0.0);
        assert_eq!(exp_nonpositive(-100.0), 0.0);
    }

    #[test]
    fn sums_match_naive_sums() {
        let values: Vec<f32> = (0..3_003)
            .map(|i| -((i * 7919) % 503) as f32 / 37.0)
            .collect();
        let naive: f64 = values.iter().map(|&v| f64::from(v).exp()).sum();
        assert!((sum_exp_shifted(&values, 0.0) - naive).abs() / naive < 1e-6);

        let above: f64 = values
            .iter()
            .filter(|&&v| v >= -5.0)
            .map(|&v| f64::from(v - 1.0).exp())
            .sum();
        let block = &values[..BLOCK_LEN];
        let block_above: f64 = block
            .iter()
            .filter(|&&v| v >= -5.0)
            .map(|&v| f64::from(v - 1.0).exp())
            .sum();
        assert!((block_sum_exp(block, 1.0, -5.0) - block_above).abs() / block_above < 1e-6);
        assert!(above > block_above);

        let candidates: Vec<Candidate> = (0..3_003u32)
            .step_by(3)
            .map(|id| Candidate {
                logit: values[id as usize],
                token_id: id,
            })
            .collect();
        let naive_candidates: f64 = candidates
            .iter()
            .map(|c| f64::from(c.logit - 1.0).exp())
            .sum();
        let fast = sum_exp_candidates(&candidates, 1.0);
        assert!((fast - naive_candidates).abs() / naive_candidates < 1e-6);
    }

    #[test]
    fn max_and_invalid_detection() {
        let mut values: Vec<f32> = (0..37).map(|i| (i as f32 * 1.7).sin()).collect();
        values[29] = 3.5;
        assert_eq!(max_value(&values), 3.5);
        assert_eq!(max_value(&[]), f32::NEG_INFINITY);
        assert_eq!(max_value(&[f32::NEG_INFINITY, -1.0]), -1.0);
        assert!(!has_nan_or_positive_infinity(&values));
        values[30] = f32::NAN;
        assert!(has_nan_or_positive_infinity(&values));
        assert!(has_nan_or_positive_infinity(&[0.0, f32::INFINITY]));
        assert!(!has_nan_or_positive_infinity(&[f32::NEG_INFINITY]));
    }
}
