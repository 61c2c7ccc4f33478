//! Parsing a GGUF file's header (metadata and tensor directory), with every length checked
//! against the file size so a truncated or hostile file gives an error, never a panic or a
//! huge allocation. The layout is the GGUF v2/v3 spec (ggml `docs/gguf.md`), little-endian.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::Value;

use super::ggml_types::{ggml_type_name, GgmlFormat};
use crate::ModelError;

const GGUF_MAGIC: [u8; 4] = *b"GGUF";
const DEFAULT_ALIGNMENT_BYTES: u64 = 32;
/// ggml tensors have at most 4 dimensions.
const MAX_DIMS: u32 = 4;
/// Arrays of arrays are legal but nothing real nests deeply; bounding depth bounds recursion.
const MAX_VALUE_DEPTH: usize = 8;

/// One entry of the tensor directory.
#[derive(Clone, Debug)]
pub(crate) struct GgufTensorInfo {
    /// Name as stored (`blk.0.attn_q.weight`).
    pub name: String,
    /// Dimensions outermost first (GGUF stores them innermost first), i.e. `[out, in]`.
    pub shape: Vec<usize>,
    /// Data type.
    pub format: GgmlFormat,
    /// Absolute file offset of the tensor's first byte.
    pub file_offset_bytes: u64,
    /// Size of the tensor's data.
    pub size_bytes: usize,
}

impl GgufTensorInfo {
    /// Number of elements.
    pub fn numel(&self) -> usize {
        self.shape.iter().product()
    }
}

/// Everything before the tensor data.
#[derive(Debug)]
pub(crate) struct GgufHeader {
    /// Key/value metadata, in candle's value type (the tokenizer module reads it too).
    pub metadata: HashMap<String, Value>,
    /// The tensor directory, in file order.
    pub tensors: Vec<GgufTensorInfo>,
}

/// Reads and checks the header of the GGUF file at `path`.
pub(crate) fn read_gguf_header(path: &Path) -> Result<GgufHeader, ModelError> {
    let file = File::open(path).map_err(|e| ModelError::io(path, e))?;
    let file_len_bytes = file.metadata().map_err(|e| ModelError::io(path, e))?.len();
    parse_gguf_header(
        BufReader::with_capacity(1 << 20, file),
        file_len_bytes,
        path,
    )
}

/// Reads and checks the header of a GGUF file of `file_len_bytes` from `source`; `path` only
/// names the file in errors.
pub(crate) fn parse_gguf_header(
    source: impl Read,
    file_len_bytes: u64,
    path: &Path,
) -> Result<GgufHeader, ModelError> {
    let mut reader = HeaderReader {
        inner: source,
        position_bytes: 0,
        file_len_bytes,
        path: path.to_owned(),
    };

    let magic = reader.array::<4>("magic")?;
    if magic != GGUF_MAGIC {
        return Err(ModelError::BadMagic {
            path: path.to_owned(),
            found: magic,
        });
    }
    let version = reader.u32("version")?;
    if !(2..=3).contains(&version) {
        return Err(ModelError::UnsupportedVersion {
            path: path.to_owned(),
            version,
        });
    }
    let tensor_count = reader.u64("tensor count")?;
    let metadata_count = reader.u64("metadata count")?;

    let mut metadata = HashMap::new();
    for index in 0..metadata_count {
        let key = reader.string(&format!("key of metadata entry {index}"))?;
        let type_id = reader.u32(&format!("type of metadata `{key}`"))?;
        let value = reader.value(type_id, &format!("metadata `{key}`"), 0)?;
        metadata.insert(key, value);
    }

    let mut raw_tensors = Vec::new();
    for index in 0..tensor_count {
        raw_tensors.push(reader.tensor_info(index)?);
    }

    let alignment_bytes = alignment_bytes(&metadata).map_err(|reason| reader.malformed(reason))?;
    let data_start_bytes = reader.position_bytes.div_ceil(alignment_bytes) * alignment_bytes;
    let tensors = raw_tensors
        .into_iter()
        .map(|raw| raw.locate(data_start_bytes, file_len_bytes, path))
        .collect::<Result<Vec<_>, _>>()?;
    check_unique_names(&tensors).map_err(|reason| reader.malformed(reason))?;
    check_layout(&tensors, data_start_bytes, alignment_bytes)
        .map_err(|reason| reader.malformed(reason))?;
    Ok(GgufHeader { metadata, tensors })
}

/// Every tensor's data must start on the file's alignment (the GGUF spec's rule; a shifted
/// offset reads the wrong bytes: NaNs and garbage) and no two tensors' data may overlap.
fn check_layout(
    tensors: &[GgufTensorInfo],
    data_start_bytes: u64,
    alignment_bytes: u64,
) -> Result<(), String> {
    if let Some(t) = tensors
        .iter()
        .find(|t| !(t.file_offset_bytes - data_start_bytes).is_multiple_of(alignment_bytes))
    {
        return Err(format!(
            "tensor `{}`: data offset {} is not a multiple of the file's alignment of \
             {alignment_bytes} bytes",
            t.name,
            t.file_offset_bytes - data_start_bytes
        ));
    }
    let mut by_offset: Vec<&GgufTensorInfo> = tensors.iter().filter(|t| t.size_bytes > 0).collect();
    by_offset.sort_by_key(|t| t.file_offset_bytes);
    for pair in by_offset.windows(2) {
        let (first, next) = (pair[0], pair[1]);
        let first_end = first.file_offset_bytes + first.size_bytes as u64;
        if first_end > next.file_offset_bytes {
            return Err(format!(
                "the data of tensors `{}` (bytes {}..{first_end}) and `{}` (from byte {}) overlap",
                first.name, first.file_offset_bytes, next.name, next.file_offset_bytes
            ));
        }
    }
    Ok(())
}

fn alignment_bytes(metadata: &HashMap<String, Value>) -> Result<u64, String> {
    let alignment = match metadata.get("general.alignment") {
        None => DEFAULT_ALIGNMENT_BYTES,
        Some(value) => value
            .to_u64()
            .map_err(|_| format!("general.alignment has type {:?}", value.value_type()))?,
    };
    if alignment == 0 || !alignment.is_power_of_two() {
        return Err(format!(
            "general.alignment {alignment} is not a power of two"
        ));
    }
    Ok(alignment)
}

fn check_unique_names(tensors: &[GgufTensorInfo]) -> Result<(), String> {
    let mut seen = std::collections::HashSet::new();
    match tensors.iter().find(|t| !seen.insert(t.name.as_str())) {
        Some(duplicate) => Err(format!("tensor `{}` appears twice", duplicate.name)),
        None => Ok(()),
    }
}

/// A directory entry before the data section's start is known.
struct RawTensorInfo {
    name: String,
    shape: Vec<usize>,
    format: GgmlFormat,
    relative_offset_bytes: u64,
    size_bytes: usize,
}

impl RawTensorInfo {
    fn locate(
        self,
        data_start_bytes: u64,
        file_len_bytes: u64,
        path: &Path,
    ) -> Result<GgufTensorInfo, ModelError> {
        let start = data_start_bytes.checked_add(self.relative_offset_bytes);
        let end = start.and_then(|s| s.checked_add(self.size_bytes as u64));
        match (start, end) {
            (Some(start), Some(end)) if end <= file_len_bytes => Ok(GgufTensorInfo {
                name: self.name,
                shape: self.shape,
                format: self.format,
                file_offset_bytes: start,
                size_bytes: self.size_bytes,
            }),
            _ => Err(ModelError::Truncated {
                path: path.to_owned(),
                what: format!(
                    "data of tensor `{}` ({} bytes at data offset {}) lies beyond the end of the \
                     {file_len_bytes}-byte file",
                    self.name, self.size_bytes, self.relative_offset_bytes
                ),
            }),
        }
    }
}

/// A byte reader that knows the file length and where it is, for bounds checks and messages.
struct HeaderReader<R> {
    inner: R,
    position_bytes: u64,
    file_len_bytes: u64,
    path: PathBuf,
}

impl<R: Read> HeaderReader<R> {
    fn malformed(&self, reason: String) -> ModelError {
        ModelError::Malformed {
            path: self.path.clone(),
            reason,
        }
    }

    fn truncated(&self, what: &str) -> ModelError {
        ModelError::Truncated {
            path: self.path.clone(),
            what: format!("{what} at byte {}", self.position_bytes),
        }
    }

    fn remaining_bytes(&self) -> u64 {
        self.file_len_bytes.saturating_sub(self.position_bytes)
    }

    fn fill(&mut self, buffer: &mut [u8], what: &str) -> Result<(), ModelError> {
        match self.inner.read_exact(buffer) {
            Ok(()) => {
                self.position_bytes += buffer.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == std::io::ErrorKind::UnexpectedEof => Err(self.truncated(what)),
            Err(e) => Err(ModelError::io(&self.path, e)),
        }
    }

    fn array<const N: usize>(&mut self, what: &str) -> Result<[u8; N], ModelError> {
        let mut bytes = [0u8; N];
        self.fill(&mut bytes, what)?;
        Ok(bytes)
    }

    fn u32(&mut self, what: &str) -> Result<u32, ModelError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }

    fn u64(&mut self, what: &str) -> Result<u64, ModelError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }

    /// Fails unless `count` items of at least `min_item_bytes` each fit in the rest of the file.
    fn check_fits(&self, count: u64, min_item_bytes: u64, what: &str) -> Result<(), ModelError> {
        if count.saturating_mul(min_item_bytes) > self.remaining_bytes() {
            return Err(self.truncated(&format!("{what} ({count} items announced)")));
        }
        Ok(())
    }

    fn string(&mut self, what: &str) -> Result<String, ModelError> {
        let len = self.u64(what)?;
        self.check_fits(len, 1, what)?;
        let mut bytes = vec![0u8; len as usize];
        self.fill(&mut bytes, what)?;
        // Some writers NUL-terminate despite the spec; invalid UTF-8 is replaced, not fatal.
        while bytes.last() == Some(&0) {
            bytes.pop();
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    fn value(&mut self, type_id: u32, what: &str, depth: usize) -> Result<Value, ModelError> {
        Ok(match type_id {
            0 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            1 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            2 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            3 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            4 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            5 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            6 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            7 => match self.array::<1>(what)?[0] {
                0 => Value::Bool(false),
                1 => Value::Bool(true),
                other => return Err(self.malformed(format!("{what}: bool byte {other}"))),
            },
            8 => Value::String(self.string(what)?),
            9 => self.array_value(what, depth)?,
            10 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            11 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            12 => Value::F64(f64::from_le_bytes(self.array(what)?)),
            other => return Err(self.malformed(format!("{what}: unknown value type {other}"))),
        })
    }

    fn array_value(&mut self, what: &str, depth: usize) -> Result<Value, ModelError> {
        if depth >= MAX_VALUE_DEPTH {
            return Err(self.malformed(format!("{what}: arrays nested too deeply")));
        }
        let item_type = self.u32(what)?;
        let len = self.u64(what)?;
        let min_item_bytes = match item_type {
            0 | 1 | 7 => 1,
            2 | 3 => 2,
            4..=6 => 4,
            8 | 10..=12 => 8,
            9 => 12,
            other => return Err(self.malformed(format!("{what}: unknown array item type {other}"))),
        };
        self.check_fits(len, min_item_bytes, what)?;
        let items = (0..len)
            .map(|_| self.value(item_type, what, depth + 1))
            .collect::<Result<Vec<_>, _>>()?;
        Ok(Value::Array(items))
    }

    fn tensor_info(&mut self, index: u64) -> Result<RawTensorInfo, ModelError> {
        let name = self.string(&format!("name of tensor {index}"))?;
        let what = format!("directory entry of tensor `{name}`");
        let n_dims = self.u32(&what)?;
        if n_dims > MAX_DIMS {
            return Err(self.malformed(format!("tensor `{name}` has {n_dims} dimensions")));
        }
        let mut shape = Vec::with_capacity(n_dims as usize);
        for _ in 0..n_dims {
            let dim = self.u64(&what)?;
            let dim = usize::try_from(dim)
                .map_err(|_| self.malformed(format!("tensor `{name}`: dimension {dim}")))?;
            shape.push(dim);
        }
        // GGUF lists dimensions innermost first; HF and HostTensor list them outermost first.
        shape.reverse();
        let type_id = self.u32(&what)?;
        let relative_offset_bytes = self.u64(&what)?;
        let format =
            GgmlFormat::from_type_id(type_id).ok_or_else(|| ModelError::UnsupportedQuantType {
                tensor: name.clone(),
                type_name: ggml_type_name(type_id),
            })?;
        let size_bytes = tensor_size_bytes(&shape, format)
            .map_err(|reason| self.malformed(format!("tensor `{name}`: {reason}")))?;
        Ok(RawTensorInfo {
            name,
            shape,
            format,
            relative_offset_bytes,
            size_bytes,
        })
    }
}

/// Bytes of a tensor of `shape` (outermost first) in `format`; rows must be whole blocks.
fn tensor_size_bytes(shape: &[usize], format: GgmlFormat) -> Result<usize, String> {
    let numel = shape
        .iter()
        .try_fold(1usize, |acc, &d| acc.checked_mul(d))
        .ok_or_else(|| format!("shape {shape:?} overflows"))?;
    let row_len = shape.last().copied().unwrap_or(1);
    if !row_len.is_multiple_of(format.block_elems()) {
        return Err(format!(
            "row length {row_len} is not a multiple of the {format:?} block size {}",
            format.block_elems()
        ));
    }
    (numel / format.block_elems())
        .checked_mul(format.block_bytes())
        .ok_or_else(|| format!("shape {shape:?} overflows"))
}
