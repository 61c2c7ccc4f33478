//! The int4 KV-cache element (`--kv-cache-dtype int4`): symmetric 4-bit integers in −7..=7 with
//! one scale per group of [`INT4_GROUP_ELEMENTS`] consecutive elements of a vector (a KV head's
//! key or value row, or a STAR-KV latent, per token), as the group-wise 4-bit caches of KIVI and
//! QServe do. The scale is `max |x| / 7` over the group, stored as an IEEE half
//! (`starling_kv::SCALE_BYTES`); an element is `round(x / scale)` to nearest-even, clamped to
//! ±7, and reads back as `q · scale`. Groups never straddle vectors: a vector's last group may
//! be shorter. A zero group reads back zeros; a non-finite element makes its group non-finite
//! (the engine's NaN guard then fails that request).

pub use starling_kv::INT4_GROUP_ELEMENTS;

/// The largest stored magnitude.
pub const INT4_MAX: f32 = 7.0;

/// The scale one group of `values` is stored with: `max |x| / 7`, rounded to half precision
/// (NaN when an element is not finite).
pub fn group_scale(values: &[f32]) -> f32 {
    crate::int8::half_scale(values, INT4_MAX)
}

/// The stored integer (−7..=7) of `value` under `scale` (0 for a zero scale).
pub fn quantise(value: f32, scale: f32) -> i8 {
    crate::int8::quantise_to(value, scale, INT4_MAX)
}

/// Rounds one vector in place to what an int4 cache holds: each group of
/// [`INT4_GROUP_ELEMENTS`] quantised under its own scale and read back.
pub fn round_vector(values: &mut [f32]) {
    for group in values.chunks_mut(INT4_GROUP_ELEMENTS) {
        crate::int8::round_under_own_scale(group, INT4_MAX);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_round_trips_within_half_a_step_and_its_largest_element_is_7_steps() {
        let values: Vec<f32> = (0..32)
            .map(|i| ((i as f32) * 0.37).sin() * 3.0 - 0.5)
            .collect();
        let scale = group_scale(&values);
        let max = values.iter().fold(0.0f32, |m, v| m.max(v.abs()));
        assert!((scale - max / 7.0).abs() <= 1e-3 * scale, "{scale}");
        let q: Vec<i8> = values.iter().map(|&v| quantise(v, scale)).collect();
        assert!(q.iter().any(|&q| q.unsigned_abs() == 7));
        assert!(q.iter().all(|&q| (-7..=7).contains(&q)));
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
        let tail_scale = group_scale(&tail);
        assert!(tail_scale < 0.02, "{tail_scale}");
        for (r, t) in v[32..].iter().zip(&tail) {
            assert!((r - t).abs() <= 0.5 * tail_scale * 1.01, "{r} vs {t}");
        }
        let mut zero = vec![0.0; 32];
        round_vector(&mut zero);
        assert!(zero.iter().all(|&x| x == 0.0));
        let mut bad = vec![1.0; 64];
        bad[40] = f32::NAN;
        round_vector(&mut bad);
        assert!(
            bad[..32].iter().all(|&x| (x - 1.0).abs() < 1e-3),
            "the first group is finite"
        );
        assert!(bad[32..].iter().all(|x| x.is_nan()));
    }
}
