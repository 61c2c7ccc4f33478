//! The fp8 KV-cache element (`--kv-cache-dtype fp8`): e4m3 as NVIDIA and OCP define it (4
//! exponent bits of bias 7, 3 mantissa bits, no infinities, largest finite ±448), with the
//! conversions every backend must agree on. Writing rounds to nearest-even and saturates to
//! ±448 (CUDA's `cvt.rn.satfinite.e4m3x2.f32`); reading is exact. The conversions are the
//! `float8` crate's, a port of CUDA's own `cuda_fp8.hpp` (so the CPU reference is not ours).

use float8::F8E4M3;

/// Largest finite e4m3 magnitude: larger values saturate to it when written.
pub const E4M3_MAX: f32 = 448.0;

/// The e4m3 byte `x` is stored as (nearest-even, saturating; NaN stays NaN).
pub fn e4m3_from_f32(x: f32) -> u8 {
    F8E4M3::from_f32(x).to_bits()
}

/// The value of an e4m3 byte.
pub fn e4m3_to_f32(byte: u8) -> f32 {
    F8E4M3::from_bits(byte).to_f32()
}

/// `x` as an fp8 cache slot holds it: stored and read back.
pub fn e4m3_round(x: f32) -> f32 {
    e4m3_to_f32(e4m3_from_f32(x))
}

/// Rounds every element of `values` in place to what an fp8 cache holds.
pub fn e4m3_round_slice(values: &mut [f32]) {
    for v in values {
        *v = e4m3_round(*v);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_finite_byte_round_trips_and_its_value_is_the_format_s() {
        for byte in 0..=255u8 {
            let v = e4m3_to_f32(byte);
            if byte & 0x7f == 0x7f {
                assert!(v.is_nan(), "{byte:#x}");
                continue;
            }
            assert_eq!(e4m3_from_f32(v), byte, "{byte:#x} = {v}");
            // The definition: sign, exponent e (bias 7; 0 = subnormal), mantissa m of 3 bits.
            let (e, m) = (((byte >> 3) & 0xf) as i32, (byte & 7) as f32);
            let magnitude = if e == 0 {
                m / 8.0 * 2f32.powi(-6)
            } else {
                (1.0 + m / 8.0) * 2f32.powi(e - 7)
            };
            let want = if byte & 0x80 != 0 {
                -magnitude
            } else {
                magnitude
            };
            assert_eq!(v.to_bits(), want.to_bits(), "{byte:#x}");
        }
    }

    #[test]
    fn writing_rounds_to_nearest_even_and_saturates() {
        assert_eq!(e4m3_round(1.0), 1.0);
        // 1.0625 is halfway between 1.0 and 1.125: the even mantissa (1.0) wins.
        assert_eq!(e4m3_round(1.0625), 1.0);
        assert_eq!(e4m3_round(1.1875), 1.25);
        assert_eq!(e4m3_round(1.07), 1.125);
        assert_eq!(e4m3_round(1.0e6), E4M3_MAX);
        assert_eq!(e4m3_round(-1.0e6), -E4M3_MAX);
        assert_eq!(e4m3_round(470.0), E4M3_MAX);
        assert_eq!(e4m3_round(2f32.powi(-9)), 2f32.powi(-9));
        assert_eq!(e4m3_round(2f32.powi(-11)), 0.0);
        assert!(e4m3_round(f32::NAN).is_nan());
        // The relative error of a normal value is at most half a unit in the last place: 1/16.
        for i in 1..2000 {
            let x = i as f32 * 0.173 - 150.0;
            if x.abs() >= 2f32.powi(-6) {
                assert!((e4m3_round(x) - x).abs() <= x.abs() / 16.0, "{x}");
            }
        }
    }
}
