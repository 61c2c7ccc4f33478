//! The int8 KV-cache element (`--kv-cache-dtype int8`): symmetric 8-bit integers with one scale
//! per vector (a KV head's key or value row, or a STAR-KV latent, per token), as per-token KV
//! quantisation does (KIVI, KVQuant for values). The scale is `max |x| / 127` stored as an IEEE
//! half (`starling_kv::SCALE_BYTES`); an element is `round(x / scale)` to nearest-even, clamped
//! to ±127, and reads back as `q · scale`. A zero vector has scale 0 and reads back zeros; a
//! non-finite element makes its vector non-finite (the engine's NaN guard then fails that
//! request).

use half::f16;

/// The largest stored magnitude.
pub const INT8_MAX: f32 = 127.0;

/// The scale `values` are stored with: `max |x| / 127`, rounded to half precision.
pub fn vector_scale(values: &[f32]) -> f32 {
    half_scale(values, INT8_MAX)
}

/// `max |x| / max_level` over `values`, rounded to half precision; NaN when an element is not
/// finite (shared with [`crate::int4`]).
pub(crate) fn half_scale(values: &[f32], max_level: f32) -> f32 {
    if values.iter().any(|v| !v.is_finite()) {
        return f32::NAN;
    }
    let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
    f16::from_f32(max / max_level).to_f32()
}

/// The stored integer of `value` under `scale` (0 for a zero scale).
pub fn quantise(value: f32, scale: f32) -> i8 {
    quantise_to(value, scale, INT8_MAX)
}

/// `value / scale` rounded to nearest-even and clamped to ±`max_level` (0 for a zero scale).
pub(crate) fn quantise_to(value: f32, scale: f32, max_level: f32) -> i8 {
    if scale == 0.0 {
        return 0;
    }
    (value / scale)
        .round_ties_even()
        .clamp(-max_level, max_level) as i8
}

/// Rounds one vector in place to what an int8 cache holds: quantised under its own scale and
/// read back.
pub fn round_vector(values: &mut [f32]) {
    round_under_own_scale(values, INT8_MAX);
}

/// Quantises `values` under their own scale to ±`max_level` and reads them back in place
/// (all NaN when the scale is not finite).
pub(crate) fn round_under_own_scale(values: &mut [f32], max_level: f32) {
    let scale = half_scale(values, max_level);
    for v in values.iter_mut() {
        *v = if scale.is_finite() {
            f32::from(quantise_to(*v, scale, max_level)) * scale
        } else {
            f32::NAN
        };
    }
}

/// [`round_vector`] over consecutive vectors of the given widths (their sum must be the
/// slice's length; a zero width is an empty vector).
pub fn round_vectors(values: &mut [f32], widths: impl IntoIterator<Item = usize>) {
    for_each_vector(values, widths, round_vector);
}

/// Applies `round` to consecutive vectors of `values` of the given widths (a zero width is an
/// empty vector; widths past the end are cut to what is left). Shared by the int8 and int4
/// caches' writers.
pub(crate) fn for_each_vector(
    values: &mut [f32],
    widths: impl IntoIterator<Item = usize>,
    round: fn(&mut [f32]),
) {
    let mut rest = values;
    for width in widths {
        let (vector, tail) = rest.split_at_mut(width.min(rest.len()));
        round(vector);
        rest = tail;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_vector_round_trips_within_half_a_step_and_its_largest_element_is_127_steps() {
        let values: Vec<f32> = (0..64)
            .map(|i| ((i as f32) * 0.37).sin() * 3.0 - 0.5)
            .collect();
        let scale = vector_scale(&values);
        let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!((scale - max / 127.0).abs() <= 1e-3 * scale, "{scale}");
        let q: Vec<i8> = values.iter().map(|&v| quantise(v, scale)).collect();
        assert!(q.iter().any(|&q| q.unsigned_abs() == 127));
        let mut rounded = values.clone();
        round_vector(&mut rounded);
        for ((v, r), q) in values.iter().zip(&rounded).zip(&q) {
            assert!((v - r).abs() <= 0.5 * scale * 1.01 + 1e-6, "{v} vs {r}");
            assert_eq!(*r, f32::from(*q) * scale);
        }
        // Reading back and writing again changes nothing.
        let mut again = rounded.clone();
        round_vector(&mut again);
        assert_eq!(again, rounded);
    }

    #[test]
    fn vectors_are_scaled_on_their_own_and_zero_or_non_finite_ones_stay_so() {
        // A large head beside a small one: the small one keeps its precision.
        let mut both = vec![1000.0, -500.0, 0.001, -0.002];
        round_vectors(&mut both, [2, 2]);
        assert!(
            (both[2] - 0.001).abs() < 2e-5 && (both[3] + 0.002).abs() < 2e-5,
            "{both:?}"
        );
        let mut zero = vec![0.0; 8];
        round_vector(&mut zero);
        assert!(zero.iter().all(|&v| v == 0.0));
        let mut bad = vec![1.0, f32::INFINITY, 2.0];
        round_vector(&mut bad);
        assert!(bad.iter().all(|v| v.is_nan()));
        // Empty vectors and a width past the end are tolerated; each vector keeps its own
        // largest element exactly up to the half-precision scale.
        let mut short = vec![1.0, 2.0, 3.0];
        round_vectors(&mut short, [0, 2, 5]);
        let scale = vector_scale(&[1.0, 2.0]);
        assert_eq!(short[1], 127.0 * scale);
        assert_eq!(short[2], 127.0 * vector_scale(&[3.0]));
    }
}
