//! GGML tensor data types: their names, their block layout, and conversion of raw tensor bytes
//! to f32 (floats by [`super::float_decode`], quantised blocks by candle).

use std::borrow::Cow;

use candle_core::quantized::GgmlDType;
use candle_core::CpuStorage;
use rayon::prelude::*;

use super::float_decode::{decode_floats, FloatEncoding};

/// A GGML data type this loader can convert to f32.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GgmlFormat {
    /// Plain floats.
    Float(FloatEncoding),
    /// A block-quantised type candle can dequantise.
    Quantized(GgmlDType),
}

/// Elements dequantised per parallel work item: a multiple of every block size (32 and 256),
/// large enough to amortise candle's per-call setup.
const CHUNK_ELEMS: usize = 1 << 16;

/// Alignment of the buffers handed to [`to_f32`]: at least that of every candle block type.
pub(crate) const BUFFER_ALIGN_BYTES: usize = 8;

impl GgmlFormat {
    /// The format of GGML type `id`, or `None` when it cannot be converted.
    pub(crate) fn from_type_id(id: u32) -> Option<Self> {
        let quantized = match id {
            0 => return Some(Self::Float(FloatEncoding::F32)),
            1 => return Some(Self::Float(FloatEncoding::F16)),
            30 => return Some(Self::Float(FloatEncoding::Bf16)),
            2 => GgmlDType::Q4_0,
            3 => GgmlDType::Q4_1,
            6 => GgmlDType::Q5_0,
            7 => GgmlDType::Q5_1,
            8 => GgmlDType::Q8_0,
            10 => GgmlDType::Q2K,
            11 => GgmlDType::Q3K,
            12 => GgmlDType::Q4K,
            13 => GgmlDType::Q5K,
            14 => GgmlDType::Q6K,
            _ => return None,
        };
        Some(Self::Quantized(quantized))
    }

    /// Elements per block (1 for float types).
    pub(crate) fn block_elems(self) -> usize {
        match self {
            Self::Float(_) => 1,
            Self::Quantized(dtype) => dtype.block_size(),
        }
    }

    /// Bytes per block.
    pub(crate) fn block_bytes(self) -> usize {
        match self {
            Self::Float(encoding) => encoding.size_bytes(),
            Self::Quantized(dtype) => dtype.type_size(),
        }
    }
}

/// The llama.cpp name of GGML type `id` (`ggml_type` enum), for error messages.
pub(crate) fn ggml_type_name(id: u32) -> String {
    const NAMES: [&str; 40] = [
        "F32",
        "F16",
        "Q4_0",
        "Q4_1",
        "Q4_2",
        "Q4_3",
        "Q5_0",
        "Q5_1",
        "Q8_0",
        "Q8_1",
        "Q2_K",
        "Q3_K",
        "Q4_K",
        "Q5_K",
        "Q6_K",
        "Q8_K",
        "IQ2_XXS",
        "IQ2_XS",
        "IQ3_XXS",
        "IQ1_S",
        "IQ4_NL",
        "IQ3_S",
        "IQ2_S",
        "IQ4_XS",
        "I8",
        "I16",
        "I32",
        "I64",
        "F64",
        "IQ1_M",
        "BF16",
        "Q4_0_4_4",
        "Q4_0_4_8",
        "Q4_0_8_8",
        "TQ1_0",
        "TQ2_0",
        "IQ4_NL_4_4",
        "IQ4_NL_4_8",
        "IQ4_NL_8_8",
        "MXFP4",
    ];
    match NAMES.get(id as usize) {
        Some(name) => format!("{name} (ggml type {id})"),
        None => format!("unknown ggml type {id}"),
    }
}

/// A byte buffer whose contents start at a [`BUFFER_ALIGN_BYTES`]-aligned address, so candle
/// can view it as blocks (it casts the pointer without checking alignment).
pub(crate) struct AlignedBytes {
    storage: Vec<u8>,
    start: usize,
    len: usize,
}

impl AlignedBytes {
    /// A zeroed buffer of `len` bytes.
    pub(crate) fn zeroed(len: usize) -> Self {
        let storage = vec![0u8; len + BUFFER_ALIGN_BYTES];
        // For byte pointers `align_offset` is always below the alignment; `min` only guards
        // the documented "may return usize::MAX" case.
        let start = storage
            .as_ptr()
            .align_offset(BUFFER_ALIGN_BYTES)
            .min(BUFFER_ALIGN_BYTES);
        Self {
            storage,
            start,
            len,
        }
    }

    /// The bytes.
    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.storage[self.start..self.start + self.len]
    }

    /// The bytes, mutably.
    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.storage[self.start..self.start + self.len]
    }
}

/// Converts `raw` (exactly `numel` elements of `format`, whole blocks) to f32, in parallel
/// chunks. Errors are descriptions for the caller to wrap with the tensor name.
pub(crate) fn to_f32(format: GgmlFormat, raw: &[u8], numel: usize) -> Result<Vec<f32>, String> {
    let block_elems = format.block_elems();
    let block_bytes = format.block_bytes();
    if !numel.is_multiple_of(block_elems) || raw.len() != numel / block_elems * block_bytes {
        return Err(format!(
            "{} bytes do not hold {numel} elements of {format:?}",
            raw.len()
        ));
    }
    let dtype = match format {
        GgmlFormat::Float(encoding) => return decode_floats(encoding, raw),
        GgmlFormat::Quantized(dtype) => dtype,
    };
    if !(raw.as_ptr() as usize).is_multiple_of(BUFFER_ALIGN_BYTES) {
        return Err("tensor bytes are not aligned for block access".to_owned());
    }
    let mut out = vec![0f32; numel];
    // Every chunk starts a whole number of blocks in, and a block's size is a multiple of its
    // alignment, so chunks stay aligned.
    let chunk_bytes = CHUNK_ELEMS / block_elems * block_bytes;
    out.par_chunks_mut(CHUNK_ELEMS)
        .zip(raw.par_chunks(chunk_bytes))
        .try_for_each(|(dst, src)| dequantize_blocks(dtype, src, dst))?;
    Ok(out)
}

/// Dequantises whole blocks `src` into `dst` (same element count) through candle.
fn dequantize_blocks(dtype: GgmlDType, src: &[u8], dst: &mut [f32]) -> Result<(), String> {
    // `from_data` asserts what `to_f32` already checked: `src` is aligned and whole blocks.
    let blocks = dtype.from_data(Cow::Borrowed(src));
    match blocks.dequantize(dst.len()) {
        Ok(CpuStorage::F32(values)) if values.len() == dst.len() => {
            dst.copy_from_slice(&values);
            Ok(())
        }
        Ok(_) => Err(format!("dequantising {dtype:?} gave an unexpected result")),
        Err(e) => Err(format!("dequantising {dtype:?}: {e}")),
    }
}

/// The largest alignment among candle's block types, checked against [`BUFFER_ALIGN_BYTES`]
/// in tests so an upgrade that widens a block cannot silently misalign.
#[cfg(test)]
fn max_block_align_bytes() -> usize {
    use candle_core::quantized::k_quants;
    use std::mem::align_of;
    [
        align_of::<k_quants::BlockQ4_0>(),
        align_of::<k_quants::BlockQ4_1>(),
        align_of::<k_quants::BlockQ5_0>(),
        align_of::<k_quants::BlockQ5_1>(),
        align_of::<k_quants::BlockQ8_0>(),
        align_of::<k_quants::BlockQ2K>(),
        align_of::<k_quants::BlockQ3K>(),
        align_of::<k_quants::BlockQ4K>(),
        align_of::<k_quants::BlockQ5K>(),
        align_of::<k_quants::BlockQ6K>(),
        align_of::<f32>(),
    ]
    .into_iter()
    .max()
    .unwrap_or(1)
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    #[test]
    fn buffers_are_aligned_for_every_block_type() {
        assert!(max_block_align_bytes() <= BUFFER_ALIGN_BYTES);
        for len in [0, 1, 33, 4096] {
            let buffer = AlignedBytes::zeroed(len);
            assert_eq!(buffer.as_slice().len(), len);
            assert_eq!(buffer.as_slice().as_ptr() as usize % BUFFER_ALIGN_BYTES, 0);
        }
    }

    #[test]
    fn type_names_cover_known_and_unknown_ids() {
        assert_eq!(ggml_type_name(16), "IQ2_XXS (ggml type 16)");
        assert_eq!(ggml_type_name(99), "unknown ggml type 99");
        assert_eq!(GgmlFormat::from_type_id(16), None);
        assert_eq!(GgmlFormat::from_type_id(9), None);
        assert_eq!(
            GgmlFormat::from_type_id(12),
            Some(GgmlFormat::Quantized(GgmlDType::Q4K))
        );
    }

    #[test]
    fn floats_are_delegated_and_sizes_checked() {
        let bytes: Vec<u8> = [1.5f32, -2.0]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let f32_format = GgmlFormat::from_type_id(0).unwrap();
        assert_eq!(to_f32(f32_format, &bytes, 2).unwrap(), vec![1.5, -2.0]);
        assert!(to_f32(f32_format, &bytes, 3).is_err());
        let q8 = GgmlFormat::Quantized(GgmlDType::Q8_0);
        assert!(to_f32(q8, &bytes, 32).is_err());
    }

    /// Quantises a ramp in [-1, 1] with candle, then checks several chunks' worth dequantise back in
    /// order and within each format's step size.
    #[test]
    fn quantized_formats_round_trip_across_chunks() {
        let numel = 2 * CHUNK_ELEMS + 512;
        let values: Vec<f32> = (0..numel)
            .map(|i| ((i % 97) as f32 - 48.0) / 48.0)
            .collect();
        let source = Tensor::from_vec(values.clone(), numel, &Device::Cpu).unwrap();
        for (dtype, tolerance) in [
            (GgmlDType::Q8_0, 0.01),
            (GgmlDType::Q4_1, 0.07),
            (GgmlDType::Q5_0, 0.07),
            (GgmlDType::Q4K, 0.07),
            (GgmlDType::Q6K, 0.03),
        ] {
            let quantized = QTensor::quantize(&source, dtype).unwrap();
            let data = quantized.data().unwrap();
            let mut buffer = AlignedBytes::zeroed(data.len());
            buffer.as_mut_slice().copy_from_slice(&data);
            let restored = to_f32(GgmlFormat::Quantized(dtype), buffer.as_slice(), numel).unwrap();
            let worst = values
                .iter()
                .zip(&restored)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0f32, f32::max);
            assert!(worst < tolerance, "{dtype:?}: max error {worst}");
        }
    }
}
