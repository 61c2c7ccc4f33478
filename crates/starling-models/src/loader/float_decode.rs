//! Decoding little-endian f32 / f16 / bf16 bytes (GGUF float tensors, safetensors) to f32.

use half::{bf16, f16};
use rayon::prelude::*;

/// A little-endian float encoding.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FloatEncoding {
    /// IEEE single precision.
    F32,
    /// IEEE half precision.
    F16,
    /// bfloat16.
    Bf16,
}

/// Elements decoded per parallel work item.
const CHUNK_ELEMS: usize = 1 << 16;

impl FloatEncoding {
    /// Bytes per element.
    pub(crate) fn size_bytes(self) -> usize {
        match self {
            Self::F32 => 4,
            Self::F16 | Self::Bf16 => 2,
        }
    }
}

/// Decodes `raw` to f32, or describes why its length is not a whole number of elements.
pub(crate) fn decode_floats(encoding: FloatEncoding, raw: &[u8]) -> Result<Vec<f32>, String> {
    let size_bytes = encoding.size_bytes();
    if !raw.len().is_multiple_of(size_bytes) {
        return Err(format!(
            "{} bytes are not a whole number of {encoding:?} values",
            raw.len()
        ));
    }
    let mut out = vec![0f32; raw.len() / size_bytes];
    out.par_chunks_mut(CHUNK_ELEMS)
        .zip(raw.par_chunks(CHUNK_ELEMS * size_bytes))
        .for_each(|(dst, src)| {
            let values = dst.iter_mut().zip(src.chunks_exact(size_bytes));
            match encoding {
                FloatEncoding::F32 => values.for_each(|(d, s)| {
                    *d = f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
                }),
                FloatEncoding::F16 => values.for_each(|(d, s)| {
                    *d = f16::from_le_bytes([s[0], s[1]]).to_f32();
                }),
                FloatEncoding::Bf16 => values.for_each(|(d, s)| {
                    *d = bf16::from_le_bytes([s[0], s[1]]).to_f32();
                }),
            }
        });
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_encoding_decodes_exactly() {
        let values = [1.5f32, -2.25, 0.0, 65504.0];
        let f32_bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            decode_floats(FloatEncoding::F32, &f32_bytes).unwrap(),
            values
        );
        let f16_bytes: Vec<u8> = values
            .iter()
            .flat_map(|&v| f16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(
            decode_floats(FloatEncoding::F16, &f16_bytes).unwrap(),
            values
        );
        let bf16_bytes: Vec<u8> = values[..3]
            .iter()
            .flat_map(|&v| bf16::from_f32(v).to_le_bytes())
            .collect();
        assert_eq!(
            decode_floats(FloatEncoding::Bf16, &bf16_bytes).unwrap(),
            &values[..3]
        );
        assert!(decode_floats(FloatEncoding::F32, &f32_bytes[..5]).is_err());
    }

    #[test]
    fn long_inputs_keep_their_order_across_chunks() {
        let values: Vec<f32> = (0..CHUNK_ELEMS * 2 + 3).map(|i| i as f32).collect();
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(decode_floats(FloatEncoding::F32, &bytes).unwrap(), values);
    }
}
