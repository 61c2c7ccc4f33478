//! The int4 KV-cache element (`--kv-cache-dtype int4`): symmetric 4-bit integers in −7..=7 with
//! one scale per group of [`INT4_GROUP_ELEMENTS`] consecutive elements of a vector (a KV head's
//! key or value row, or a STAR-KV latent, per token), as the group-wise 4-bit caches of KIVI and
//! QServe do, stored in a Hadamard-rotated basis (QuaRot's remedy for outlier channels).
//!
//! Per group: the elements are rotated by the orthonormal Walsh–Hadamard matrix of the group's
//! size ([`rotation_width`]: 32 for a whole group, the largest power of two dividing a shorter
//! last group, applied block by block), which spreads one large channel (a key bias, a latent's
//! leading component) over the whole group, so the group's maximum sits near its RMS instead of
//! far above it. The rotated values are quantised under `max |y| / 7` (an IEEE half,
//! `starling_kv::SCALE_BYTES`), nearest-even, clamped to ±7; reading back rotates the
//! dequantised values back (the matrix is its own inverse). The rotation is orthonormal, so the
//! error's norm is the rotated quantisation error's; on a GPU a group of 32 is a warp and the
//! rotation five `shfl_xor` butterflies. Groups never straddle vectors: a vector's last group
//! may be shorter. A zero group reads back zeros; a non-finite element makes its group
//! non-finite (the engine's NaN guard then fails that request).

pub use starling_kv::INT4_GROUP_ELEMENTS;

/// The largest stored magnitude.
pub const INT4_MAX: f32 = 7.0;

/// The scale one (rotated) group of `values` is stored with: `max |x| / 7`, rounded to half
/// precision (NaN when an element is not finite).
pub fn group_scale(values: &[f32]) -> f32 {
    crate::int8::half_scale(values, INT4_MAX)
}

/// The stored integer (−7..=7) of `value` under `scale` (0 for a zero scale).
pub fn quantise(value: f32, scale: f32) -> i8 {
    crate::int8::quantise_to(value, scale, INT4_MAX)
}

/// The size of the Hadamard blocks a group of `len` elements is rotated in: the largest power of
/// two dividing `len`, at most [`INT4_GROUP_ELEMENTS`] (1 — no rotation — for an odd length).
pub fn rotation_width(len: usize) -> usize {
    if len == 0 {
        return 1;
    }
    (1usize << len.trailing_zeros()).min(INT4_GROUP_ELEMENTS)
}

/// Rotates `values` in place by the orthonormal Walsh–Hadamard matrix, block by block of
/// [`rotation_width`] elements. Its own inverse.
pub fn rotate(values: &mut [f32]) {
    let width = rotation_width(values.len());
    if width == 1 {
        return;
    }
    let norm = 1.0 / (width as f32).sqrt();
    for block in values.chunks_exact_mut(width) {
        let mut half = 1;
        while half < width {
            for start in (0..width).step_by(2 * half) {
                for i in start..start + half {
                    let (a, b) = (block[i], block[i + half]);
                    block[i] = a + b;
                    block[i + half] = a - b;
                }
            }
            half *= 2;
        }
        for v in block.iter_mut() {
            *v *= norm;
        }
    }
}

/// Rounds one vector in place to what an int4 cache holds: each group of
/// [`INT4_GROUP_ELEMENTS`] rotated, quantised under its own scale, read back and rotated back.
pub fn round_vector(values: &mut [f32]) {
    for group in values.chunks_mut(INT4_GROUP_ELEMENTS) {
        rotate(group);
        crate::int8::round_under_own_scale(group, INT4_MAX);
        rotate(group);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rotation_is_orthonormal_and_its_own_inverse_and_spreads_one_large_channel() {
        for len in [32, 24, 16, 8, 3] {
            let values: Vec<f32> = (0..len).map(|i| (i as f32 * 0.71).cos() - 0.2).collect();
            let mut r = values.clone();
            rotate(&mut r);
            let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm(&r) - norm(&values)).abs() < 1e-4, "{len}");
            rotate(&mut r);
            for (a, b) in values.iter().zip(&r) {
                assert!((a - b).abs() < 1e-5, "{len}: {a} vs {b}");
            }
        }
        assert_eq!(
            [32, 24, 16, 8, 40, 3, 0].map(rotation_width),
            [32, 8, 16, 8, 8, 1, 1]
        );
        // One channel of 100 among small ones: rotated, every element carries ±100/√32.
        let mut spike = vec![0.0f32; 32];
        spike[5] = 100.0;
        rotate(&mut spike);
        assert!(spike
            .iter()
            .all(|v| (v.abs() - 100.0 / 32f32.sqrt()).abs() < 1e-3));
    }

    #[test]
    fn a_group_round_trips_within_half_a_rotated_step() {
        let values: Vec<f32> = (0..32)
            .map(|i| ((i as f32) * 0.37).sin() * 3.0 - 0.5)
            .collect();
        let mut rotated = values.clone();
        rotate(&mut rotated);
        let scale = group_scale(&rotated);
        let max = rotated.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!((scale - max / 7.0).abs() <= 1e-3 * scale, "{scale}");
        let q: Vec<i8> = rotated.iter().map(|&v| quantise(v, scale)).collect();
        assert!(q.iter().any(|&q| q.unsigned_abs() == 7));
        assert!(q.iter().all(|&q| (-7..=7).contains(&q)));
        let mut rounded = values.clone();
        round_vector(&mut rounded);
        // The error's norm is the rotated error's: at most half a step per element.
        let err: f32 = values
            .iter()
            .zip(&rounded)
            .map(|(v, r)| (v - r) * (v - r))
            .sum::<f32>()
            .sqrt();
        assert!(
            err <= 0.5 * scale * 32f32.sqrt() * 1.01,
            "{err} vs step {scale}"
        );
        assert!(err > 0.0);
    }

    #[test]
    fn a_large_channel_costs_the_others_less_than_without_the_rotation() {
        // A Qwen-like key row: one channel offset by 50, the rest of order 1.
        let values: Vec<f32> = (0..32)
            .map(|i| {
                if i == 3 {
                    50.0
                } else {
                    ((i as f32) * 1.3).sin()
                }
            })
            .collect();
        let mut rotated_err = values.clone();
        round_vector(&mut rotated_err);
        let mut plain = values.clone();
        crate::int8::round_under_own_scale(&mut plain, INT4_MAX);
        let sq = |r: &[f32]| -> f32 { values.iter().zip(r).map(|(v, x)| (v - x) * (v - x)).sum() };
        assert!(
            sq(&rotated_err) < 0.5 * sq(&plain),
            "rotated {} vs plain {}",
            sq(&rotated_err),
            sq(&plain)
        );
    }

    #[test]
    fn groups_are_scaled_on_their_own_and_a_short_last_group_has_its_scale() {
        // 40 elements: a group of 32 large values, then a group of 8 small ones.
        let mut v: Vec<f32> = (0..40)
            .map(|i| {
                if i < 32 {
                    100.0 + i as f32
                } else {
                    0.01 * (i - 31) as f32
                }
            })
            .collect();
        let tail: Vec<f32> = v[32..].to_vec();
        round_vector(&mut v);
        for (r, t) in v[32..].iter().zip(&tail) {
            assert!((r - t).abs() < 0.01, "{r} vs {t}");
        }
        let mut zero = vec![0.0; 32];
        round_vector(&mut zero);
        assert!(zero.iter().all(|&x| x == 0.0));
        let mut bad = vec![1.0; 64];
        bad[40] = f32::NAN;
        round_vector(&mut bad);
        assert!(
            bad[..32].iter().all(|&x| (x - 1.0).abs() < 0.05),
            "the first group is finite"
        );
        assert!(bad[32..].iter().all(|x| x.is_nan()));
    }
}
