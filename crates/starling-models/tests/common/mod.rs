//! Helpers shared by the loader tests: tiny GGUF files written with candle's writer (or by
//! hand for broken ones), and deterministic tensor contents.

#![allow(dead_code)] // Each test binary uses a different subset.

use std::io::Cursor;
use std::path::Path;

use candle_core::quantized::gguf_file::{self, Value};
use candle_core::quantized::{GgmlDType, QTensor};
use candle_core::{Device, Tensor};
use starling_models::ModelConfig;

/// Deterministic values in [-0.5, 0.5): a different pattern per `salt`.
pub fn pattern(numel: usize, salt: usize) -> Vec<f32> {
    (0..numel)
        .map(|i| ((i * 7919 + salt * 104_729) % 1000) as f32 / 1000.0 - 0.5)
        .collect()
}

/// One tensor to write: GGUF name, shape `[out, in]`, the f32 values and the stored type.
pub struct TensorSpec {
    pub name: String,
    pub shape: Vec<usize>,
    pub values: Vec<f32>,
    pub dtype: GgmlDType,
}

/// Which optional parts a tiny model file has.
#[derive(Clone, Copy)]
pub struct TinyOptions {
    pub architecture: &'static str,
    pub with_output: bool,
    pub with_bias: bool,
}

impl TinyOptions {
    pub fn llama() -> Self {
        Self {
            architecture: "llama",
            with_output: false,
            with_bias: false,
        }
    }

    pub fn qwen2() -> Self {
        Self {
            architecture: "qwen2",
            with_output: true,
            with_bias: true,
        }
    }
}

/// The tensors of [`ModelConfig::tiny_llama_for_tests`] under llama.cpp names: matrices Q8_0,
/// norms and biases F32, the embedding F16.
pub fn tiny_tensors(options: TinyOptions) -> Vec<TensorSpec> {
    let c = ModelConfig::tiny_llama_for_tests();
    let (d, q, kv, ffn, vocab) = (
        c.hidden_size,
        c.q_size(),
        c.kv_size(),
        c.intermediate_size,
        c.vocab_size,
    );
    let mut specs: Vec<(String, Vec<usize>, GgmlDType)> = vec![
        ("token_embd.weight".into(), vec![vocab, d], GgmlDType::F16),
        ("output_norm.weight".into(), vec![d], GgmlDType::F32),
    ];
    if options.with_output {
        specs.push(("output.weight".into(), vec![vocab, d], GgmlDType::Q8_0));
    }
    for layer in 0..c.num_layers {
        let name = |suffix: &str| format!("blk.{layer}.{suffix}");
        specs.push((name("attn_norm.weight"), vec![d], GgmlDType::F32));
        specs.push((name("attn_q.weight"), vec![q, d], GgmlDType::Q8_0));
        specs.push((name("attn_k.weight"), vec![kv, d], GgmlDType::Q8_0));
        specs.push((name("attn_v.weight"), vec![kv, d], GgmlDType::Q8_0));
        if options.with_bias {
            specs.push((name("attn_q.bias"), vec![q], GgmlDType::F32));
            specs.push((name("attn_k.bias"), vec![kv], GgmlDType::F32));
            specs.push((name("attn_v.bias"), vec![kv], GgmlDType::F32));
        }
        specs.push((name("attn_output.weight"), vec![d, q], GgmlDType::Q8_0));
        specs.push((name("ffn_norm.weight"), vec![d], GgmlDType::F32));
        specs.push((name("ffn_gate.weight"), vec![ffn, d], GgmlDType::Q8_0));
        specs.push((name("ffn_up.weight"), vec![ffn, d], GgmlDType::Q8_0));
        specs.push((name("ffn_down.weight"), vec![d, ffn], GgmlDType::Q8_0));
    }
    patterned(specs)
}

/// Tensors of the given names, shapes and types, each filled with its own [`pattern`].
pub fn patterned(specs: Vec<(String, Vec<usize>, GgmlDType)>) -> Vec<TensorSpec> {
    specs
        .into_iter()
        .enumerate()
        .map(|(salt, (name, shape, dtype))| TensorSpec {
            values: pattern(shape.iter().product(), salt),
            name,
            shape,
            dtype,
        })
        .collect()
}

/// The metadata llama.cpp writes for the tiny model.
pub fn tiny_metadata(architecture: &str) -> Vec<(String, Value)> {
    let c = ModelConfig::tiny_llama_for_tests();
    let key = |suffix: &str| format!("{architecture}.{suffix}");
    let tokens = (0..c.vocab_size)
        .map(|i| Value::String(format!("tok{i}")))
        .collect();
    vec![
        (
            "general.architecture".into(),
            Value::String(architecture.into()),
        ),
        (key("block_count"), Value::U32(c.num_layers as u32)),
        (key("embedding_length"), Value::U32(c.hidden_size as u32)),
        (
            key("feed_forward_length"),
            Value::U32(c.intermediate_size as u32),
        ),
        (
            key("attention.head_count"),
            Value::U32(c.num_attention_heads as u32),
        ),
        (
            key("attention.head_count_kv"),
            Value::U32(c.num_kv_heads as u32),
        ),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("rope.freq_base"), Value::F32(10_000.0)),
        (key("context_length"), Value::U32(256)),
        ("tokenizer.ggml.tokens".into(), Value::Array(tokens)),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
    ]
}

/// Serialises a GGUF with candle's writer, then marks it version 3 (candle writes 2; the two
/// layouts are identical for little-endian files).
pub fn gguf_bytes(metadata: &[(String, Value)], tensors: &[TensorSpec]) -> Vec<u8> {
    let qtensors: Vec<(String, QTensor)> = tensors
        .iter()
        .map(|spec| {
            let tensor =
                Tensor::from_vec(spec.values.clone(), spec.shape.clone(), &Device::Cpu).unwrap();
            (
                spec.name.clone(),
                QTensor::quantize(&tensor, spec.dtype).unwrap(),
            )
        })
        .collect();
    let metadata_refs: Vec<(&str, &Value)> =
        metadata.iter().map(|(k, v)| (k.as_str(), v)).collect();
    let tensor_refs: Vec<(&str, &QTensor)> =
        qtensors.iter().map(|(n, t)| (n.as_str(), t)).collect();
    let mut cursor = Cursor::new(Vec::new());
    gguf_file::write(&mut cursor, &metadata_refs, &tensor_refs).unwrap();
    let mut bytes = cursor.into_inner();
    bytes[4..8].copy_from_slice(&3u32.to_le_bytes());
    bytes
}

/// Writes a tiny model file and returns the tensors it holds.
pub fn write_tiny_gguf(path: &Path, options: TinyOptions) -> Vec<TensorSpec> {
    let tensors = tiny_tensors(options);
    let bytes = gguf_bytes(&tiny_metadata(options.architecture), &tensors);
    std::fs::write(path, bytes).unwrap();
    tensors
}

/// Little-endian GGUF header bytes written by hand, for files candle's writer cannot produce.
pub struct RawGguf {
    pub bytes: Vec<u8>,
}

impl RawGguf {
    pub fn new(version: u32, tensor_count: u64, metadata_count: u64) -> Self {
        let mut bytes = b"GGUF".to_vec();
        bytes.extend_from_slice(&version.to_le_bytes());
        bytes.extend_from_slice(&tensor_count.to_le_bytes());
        bytes.extend_from_slice(&metadata_count.to_le_bytes());
        Self { bytes }
    }

    pub fn string(mut self, s: &str) -> Self {
        self.bytes
            .extend_from_slice(&(s.len() as u64).to_le_bytes());
        self.bytes.extend_from_slice(s.as_bytes());
        self
    }

    pub fn u32(mut self, v: u32) -> Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    pub fn u64(mut self, v: u64) -> Self {
        self.bytes.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A string-valued metadata entry.
    pub fn string_entry(self, key: &str, value: &str) -> Self {
        const STRING_TYPE: u32 = 8;
        self.string(key).u32(STRING_TYPE).string(value)
    }

    /// A tensor directory entry; `dims` innermost first, as GGUF stores them.
    pub fn tensor_entry(self, name: &str, dims: &[u64], type_id: u32, offset: u64) -> Self {
        let mut raw = self.string(name).u32(dims.len() as u32);
        for &dim in dims {
            raw = raw.u64(dim);
        }
        raw.u32(type_id).u64(offset)
    }

    /// Pads to the default 32-byte alignment and appends `data_bytes` zero bytes.
    pub fn with_data(mut self, data_bytes: usize) -> Vec<u8> {
        let padded = self.bytes.len().div_ceil(32) * 32;
        self.bytes.resize(padded + data_bytes, 0);
        self.bytes
    }
}
