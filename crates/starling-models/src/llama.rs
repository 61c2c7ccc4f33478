//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral-style, Qwen2 with Q/K/V bias), written once
//! against [`Backend`] ops. Attention receives the paged cache from the caller; the model owns no
//! KV state.

use starling_backend::{
    AttentionDims, Backend, BatchMeta, HostTensor, KvCacheSpec, RopeSpec, RopeStyle as OpRopeStyle,
};

use crate::config::{rope_inv_freqs, ModelConfig, RopeStyle};
use crate::loader::WeightMap;
use crate::ModelError;

/// One decoder layer's weights in backend memory (Q/K/V and gate/up fused at load).
struct DecoderLayer<B: Backend> {
    input_norm: B::Tensor,
    qkv_weight: B::Tensor,
    qkv_bias: Option<B::Tensor>,
    o_proj: B::Tensor,
    post_attention_norm: B::Tensor,
    gate_up_proj: B::Tensor,
    down_proj: B::Tensor,
}

/// Post-RoPE query rows copied to the host during a forward pass, per layer: what SnapKV's
/// observation window needs. Costs one small gather and copy per layer, only when rows are named.
#[derive(Debug, Default, Clone)]
pub struct QueryCapture {
    rows: Vec<u32>,
    per_layer: Vec<HostTensor>,
}

impl QueryCapture {
    /// Captures batch rows `rows` (indices into the step's flattened tokens).
    pub fn new(rows: Vec<u32>) -> Self {
        Self {
            rows,
            per_layer: Vec::new(),
        }
    }

    /// The captured batch rows, in capture order.
    pub fn rows(&self) -> &[u32] {
        &self.rows
    }

    /// Layer `layer`'s queries, `[rows.len(), num_heads * head_dim]`, after the forward pass.
    pub fn layer(&self, layer: usize) -> Option<&HostTensor> {
        self.per_layer.get(layer)
    }

    fn push_layer(&mut self, qkv_rows: &HostTensor, q_size: usize) -> Result<(), ModelError> {
        let width = qkv_rows.shape().last().copied().unwrap_or(0);
        if width < q_size {
            return Err(ModelError::InvalidConfig(format!(
                "captured rows of width {width} hold no {q_size}-wide queries"
            )));
        }
        let data = qkv_rows
            .data()
            .chunks_exact(width)
            .flat_map(|row| row[..q_size].iter().copied())
            .collect();
        let q = HostTensor::new(vec![self.rows.len(), q_size], data)?;
        self.per_layer.push(q);
        Ok(())
    }
}

/// Receives the rows that enter each layer's Q/K/V projection (the output of the layer's input
/// RMSNorm), copied to the host: what activation-aware calibration (STAR-KV whitening) needs.
/// Costs one device-to-host copy of `[tokens, hidden]` per layer, only when a capture is given.
pub trait ActivationCapture {
    /// Called once per layer, in layer order, with `rows` of shape `[tokens, hidden]`.
    fn attention_input(&mut self, layer: usize, rows: &HostTensor) -> Result<(), ModelError>;
}

/// What a forward pass copies to the host besides the logits (see
/// [`LlamaModel::forward_with_hooks`]); the default copies nothing.
#[derive(Default)]
pub struct ForwardHooks<'a> {
    /// Post-RoPE query rows, per layer.
    pub queries: Option<&'a mut QueryCapture>,
    /// Every layer's Q/K/V projection input.
    pub activations: Option<&'a mut dyn ActivationCapture>,
}

/// A loaded decoder-only model on backend `B`.
pub struct LlamaModel<B: Backend> {
    config: ModelConfig,
    dims: AttentionDims,
    rope: RopeSpec,
    embed_tokens: B::Tensor,
    layers: Vec<DecoderLayer<B>>,
    final_norm: B::Tensor,
    /// `None` when the LM head is tied to the embedding matrix.
    lm_head: Option<B::Tensor>,
}

/// Concatenates matrices with equal column counts along rows (for fused projections).
fn concat_rows(parts: &[HostTensor]) -> Result<HostTensor, ModelError> {
    let cols = parts
        .first()
        .map(|p| *p.shape().last().unwrap_or(&0))
        .unwrap_or(0);
    let mut rows = 0;
    let mut data = Vec::with_capacity(parts.iter().map(|p| p.numel()).sum());
    for p in parts {
        let (r, c) = match p.shape() {
            [n] => (1, *n),
            [r, c] => (*r, *c),
            s => {
                return Err(ModelError::InvalidConfig(format!(
                    "cannot fuse tensor of shape {s:?}"
                )))
            }
        };
        if c != cols && p.shape().len() == 2 {
            return Err(ModelError::InvalidConfig(format!(
                "cannot fuse {c} columns with {cols}"
            )));
        }
        rows += r;
        data.extend_from_slice(p.data());
    }
    let shape = if parts.iter().all(|p| p.shape().len() == 1) {
        vec![data.len()]
    } else {
        vec![rows, cols]
    };
    Ok(HostTensor::new(shape, data)?)
}

/// Where a model's tensors come from: a checkpoint on the host, or synthetic values made on the
/// device (performance runs of real shapes; values do not change speed).
trait WeightSource<B: Backend> {
    /// The rows-concatenation of the named tensors (`(name, shape)`; a fused projection when there
    /// are several), in backend memory. `is_norm` marks RMSNorm scales.
    fn fused(
        &mut self,
        backend: &B,
        parts: &[(String, Vec<usize>)],
        is_norm: bool,
    ) -> Result<B::Tensor, ModelError>;
}

impl<B: Backend> WeightSource<B> for WeightMap {
    fn fused(
        &mut self,
        backend: &B,
        parts: &[(String, Vec<usize>)],
        _is_norm: bool,
    ) -> Result<B::Tensor, ModelError> {
        let mut tensors = Vec::with_capacity(parts.len());
        for (name, shape) in parts {
            tensors.push(self.take(name, shape)?);
        }
        let host = if tensors.len() == 1 {
            tensors
                .pop()
                .ok_or_else(|| ModelError::InvalidConfig("no tensor".into()))?
        } else {
            concat_rows(&tensors)?
        };
        Ok(backend.upload_owned(host)?)
    }
}

/// Random N(0, 0.02) weights (norm scales 1) generated by the backend itself.
struct SyntheticSource {
    seed: u64,
}

impl<B: Backend> WeightSource<B> for SyntheticSource {
    fn fused(
        &mut self,
        backend: &B,
        parts: &[(String, Vec<usize>)],
        is_norm: bool,
    ) -> Result<B::Tensor, ModelError> {
        let rows: usize = parts.iter().map(|(_, s)| s[0]).sum();
        let shape = match parts.first().map(|(_, s)| s.len()) {
            Some(2) => vec![rows, parts[0].1[1]],
            _ => vec![rows],
        };
        self.seed = self.seed.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let (std, mean) = if is_norm { (0.0, 1.0) } else { (0.02, 0.0) };
        Ok(backend.random_tensor(shape, self.seed, std, mean)?)
    }
}

impl<B: Backend> LlamaModel<B> {
    /// Takes every tensor the config implies out of `weights` and uploads it; a missing tensor or a
    /// wrong shape is an error naming the tensor.
    pub fn load(
        backend: &B,
        config: &ModelConfig,
        mut weights: WeightMap,
    ) -> Result<Self, ModelError> {
        Self::build(backend, config, &mut weights)
    }

    /// A model of `config`'s shapes with random weights made directly in backend memory (vLLM's
    /// dummy load format): for performance runs, where weight values do not matter.
    pub fn synthetic(backend: &B, config: &ModelConfig, seed: u64) -> Result<Self, ModelError> {
        Self::build(backend, config, &mut SyntheticSource { seed })
    }

    fn build(
        backend: &B,
        config: &ModelConfig,
        weights: &mut dyn WeightSource<B>,
    ) -> Result<Self, ModelError> {
        config.validate()?;
        let (d, q, kv, f) = (
            config.hidden_size,
            config.q_size(),
            config.kv_size(),
            config.intermediate_size,
        );
        let one = |name: String, shape: Vec<usize>| vec![(name, shape)];
        let embed_tokens = weights.fused(
            backend,
            &one(
                "model.embed_tokens.weight".into(),
                vec![config.vocab_size, d],
            ),
            false,
        )?;
        let mut layers = Vec::with_capacity(config.num_layers);
        for l in 0..config.num_layers {
            let p = format!("model.layers.{l}");
            let attn = |t: &str| format!("{p}.self_attn.{t}");
            let qkv_bias = if config.attention_bias {
                let parts = [
                    (attn("q_proj.bias"), vec![q]),
                    (attn("k_proj.bias"), vec![kv]),
                    (attn("v_proj.bias"), vec![kv]),
                ];
                Some(weights.fused(backend, &parts, false)?)
            } else {
                None
            };
            let qkv = [
                (attn("q_proj.weight"), vec![q, d]),
                (attn("k_proj.weight"), vec![kv, d]),
                (attn("v_proj.weight"), vec![kv, d]),
            ];
            let gate_up = [
                (format!("{p}.mlp.gate_proj.weight"), vec![f, d]),
                (format!("{p}.mlp.up_proj.weight"), vec![f, d]),
            ];
            layers.push(DecoderLayer {
                input_norm: weights.fused(
                    backend,
                    &one(format!("{p}.input_layernorm.weight"), vec![d]),
                    true,
                )?,
                qkv_weight: weights.fused(backend, &qkv, false)?,
                qkv_bias,
                o_proj: weights.fused(backend, &one(attn("o_proj.weight"), vec![d, q]), false)?,
                post_attention_norm: weights.fused(
                    backend,
                    &one(format!("{p}.post_attention_layernorm.weight"), vec![d]),
                    true,
                )?,
                gate_up_proj: weights.fused(backend, &gate_up, false)?,
                down_proj: weights.fused(
                    backend,
                    &one(format!("{p}.mlp.down_proj.weight"), vec![d, f]),
                    false,
                )?,
            });
        }
        let final_norm = weights.fused(backend, &one("model.norm.weight".into(), vec![d]), true)?;
        let lm_head = if config.tie_word_embeddings {
            None
        } else {
            Some(weights.fused(
                backend,
                &one("lm_head.weight".into(), vec![config.vocab_size, d]),
                false,
            )?)
        };
        let style = match config.rope.style {
            RopeStyle::Interleaved => OpRopeStyle::Interleaved,
            RopeStyle::Neox => OpRopeStyle::Neox,
        };
        Ok(Self {
            dims: AttentionDims {
                num_heads: config.num_attention_heads,
                num_kv_heads: config.num_kv_heads,
                head_dim: config.head_dim,
                scale: 1.0 / (config.head_dim as f32).sqrt(),
            },
            rope: RopeSpec {
                inv_freqs: rope_inv_freqs(&config.rope, config.head_dim),
                style,
            },
            embed_tokens,
            layers,
            final_norm,
            lm_head,
            config: config.clone(),
        })
    }

    /// The model's hyper-parameters.
    pub fn config(&self) -> &ModelConfig {
        &self.config
    }

    /// Attention head geometry (the same in every layer).
    pub fn attention_dims(&self) -> &AttentionDims {
        &self.dims
    }

    /// Logits at every position of `ids`, run as one sequence through a fresh private cache: the
    /// reference path for parity tests and quality measurements (the engine batches instead).
    pub fn sequence_logits(&self, backend: &B, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        let every_row: Vec<u32> = (0..ids.len() as u32).collect();
        let logits = self.run_sequence(backend, ids, every_row, ForwardHooks::default())?;
        Ok(logits
            .data()
            .chunks(self.config.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }

    /// Runs `ids` as one sequence through a fresh private cache, handing every layer's Q/K/V
    /// projection input to `capture`; no logits are computed (the head is skipped).
    pub fn sequence_activations(
        &self,
        backend: &B,
        ids: &[u32],
        capture: &mut dyn ActivationCapture,
    ) -> Result<(), ModelError> {
        let hooks = ForwardHooks {
            queries: None,
            activations: Some(capture),
        };
        self.run_sequence(backend, ids, Vec::new(), hooks)?;
        Ok(())
    }

    /// One sequence through a fresh private cache, logits for `logits_rows`.
    fn run_sequence(
        &self,
        backend: &B,
        ids: &[u32],
        logits_rows: Vec<u32>,
        hooks: ForwardHooks<'_>,
    ) -> Result<HostTensor, ModelError> {
        const BLOCK_TOKENS: usize = 16;
        if ids.is_empty() {
            return Err(ModelError::InvalidConfig(
                "a single-sequence run needs at least one token".into(),
            ));
        }
        let n = ids.len();
        let blocks = n.div_ceil(BLOCK_TOKENS);
        let spec = self.kv_cache_spec(blocks, BLOCK_TOKENS);
        let mut caches = (0..self.layers.len())
            .map(|_| backend.alloc_kv_cache(&spec))
            .collect::<Result<Vec<_>, _>>()?;
        // Blocks 0.. in order, so token i lives in slot i.
        let every_row: Vec<u32> = (0..n as u32).collect();
        let meta = BatchMeta::single_sequence(
            0,
            n,
            every_row,
            (0..blocks as u32).collect(),
            BLOCK_TOKENS,
            logits_rows,
        );
        let batch = backend.prepare_batch(&meta, blocks)?;
        self.forward_with_hooks(backend, ids, &meta, &batch, &mut caches, hooks)
    }

    /// The per-layer cache geometry for a pool of `num_blocks` blocks.
    pub fn kv_cache_spec(&self, num_blocks: usize, block_size_tokens: usize) -> KvCacheSpec {
        KvCacheSpec {
            num_blocks,
            block_size_tokens,
            num_kv_heads: self.config.num_kv_heads,
            head_dim: self.config.head_dim,
        }
    }

    /// Runs the batch's tokens through the model, writing their K/V into `caches` (one per layer),
    /// and returns the logits `[meta.logits_rows.len(), vocab]` of the requested rows.
    pub fn forward(
        &self,
        backend: &B,
        token_ids: &[u32],
        meta: &BatchMeta,
        batch: &B::Batch,
        caches: &mut [B::KvCache],
    ) -> Result<HostTensor, ModelError> {
        self.forward_with_hooks(
            backend,
            token_ids,
            meta,
            batch,
            caches,
            ForwardHooks::default(),
        )
    }

    /// [`LlamaModel::forward`] with the host copies `hooks` asks for: query rows
    /// ([`QueryCapture`]) and/or every layer's Q/K/V projection input ([`ActivationCapture`]).
    pub fn forward_with_hooks(
        &self,
        backend: &B,
        token_ids: &[u32],
        meta: &BatchMeta,
        batch: &B::Batch,
        caches: &mut [B::KvCache],
        hooks: ForwardHooks<'_>,
    ) -> Result<HostTensor, ModelError> {
        match self.forward_device_logits(backend, token_ids, meta, batch, caches, hooks)? {
            Some(logits) => Ok(backend.to_host(&logits)?),
            // A non-final prefill chunk samples nothing: the head was skipped.
            None => Ok(HostTensor::new(
                vec![0, self.config.vocab_size],
                Vec::new(),
            )?),
        }
    }

    /// [`LlamaModel::forward`] without the copy to the host and without hooks: the f32 logits
    /// `[meta.logits_rows.len(), vocab]` stay in backend memory. Issues backend ops only (no host
    /// copy, token ids read through [`Backend::embedding_for_batch`]), which is what a recorded
    /// decode step (`starling_backend::DecodeGraphs`) needs. `meta.logits_rows` must not be empty.
    pub fn forward_device(
        &self,
        backend: &B,
        token_ids: &[u32],
        meta: &BatchMeta,
        batch: &B::Batch,
        caches: &mut [B::KvCache],
    ) -> Result<B::Tensor, ModelError> {
        let hooks = ForwardHooks::default();
        self.forward_device_logits(backend, token_ids, meta, batch, caches, hooks)?
            .ok_or_else(|| ModelError::InvalidConfig("forward_device: no logits rows".into()))
    }

    /// [`LlamaModel::forward_device`] as the closure a backend records decode graphs from
    /// ([`starling_backend::DeviceForward`]); a backend error passes through as itself.
    pub fn device_forward(&self) -> Box<starling_backend::DeviceForward<'_, B>> {
        Box::new(move |backend, ids, meta, batch, caches| {
            self.forward_device(backend, ids, meta, batch, caches)
                .map_err(|e| match e {
                    ModelError::Backend(b) => b,
                    other => starling_backend::BackendError::Device(other.to_string()),
                })
        })
    }

    /// [`LlamaModel::forward_with_hooks`], leaving the f32 logits `[meta.logits_rows.len(), vocab]`
    /// in backend memory (for [`Backend::sample_rows`], so a device backend copies only sampled
    /// tokens to the host); `None` when the batch requests no logits rows (the head is skipped).
    pub fn forward_device_logits(
        &self,
        backend: &B,
        token_ids: &[u32],
        meta: &BatchMeta,
        batch: &B::Batch,
        caches: &mut [B::KvCache],
        hooks: ForwardHooks<'_>,
    ) -> Result<Option<B::Tensor>, ModelError> {
        let ForwardHooks {
            queries: mut capture,
            mut activations,
        } = hooks;
        if let Some(c) = capture.as_deref_mut() {
            c.per_layer.clear();
            if let Some(&bad) = c.rows.iter().find(|&&r| r as usize >= token_ids.len()) {
                return Err(ModelError::InvalidConfig(format!(
                    "query capture row {bad} outside a batch of {} rows",
                    token_ids.len()
                )));
            }
        }
        if caches.len() != self.layers.len() || token_ids.len() != meta.num_tokens() {
            return Err(ModelError::InvalidConfig(format!(
                "forward: {} caches for {} layers, {} ids for {} batch rows",
                caches.len(),
                self.layers.len(),
                token_ids.len(),
                meta.num_tokens()
            )));
        }
        let eps = self.config.rms_norm_eps;
        let mut residual = backend.embedding_for_batch(&self.embed_tokens, token_ids, batch)?;
        let mut pending_delta: Option<B::Tensor> = None;
        for (index, (layer, cache)) in self.layers.iter().zip(caches.iter_mut()).enumerate() {
            let x = match pending_delta.take() {
                None => backend.rms_norm(&residual, &layer.input_norm, eps)?,
                Some(delta) => {
                    backend.add_rms_norm(&mut residual, &delta, &layer.input_norm, eps)?
                }
            };
            if let Some(a) = activations.as_deref_mut() {
                a.attention_input(index, &backend.to_host(&x)?)?;
            }
            let mut qkv = backend.linear(&x, &layer.qkv_weight, layer.qkv_bias.as_ref())?;
            // The captured rows are read after the write: it leaves `qkv` as RoPE left it.
            backend.rope_qk_write_kv(&mut qkv, cache, &self.dims, &self.rope, batch)?;
            if let Some(c) = capture.as_deref_mut().filter(|c| !c.rows.is_empty()) {
                let rows = backend.to_host(&backend.gather_rows(&qkv, &c.rows)?)?;
                c.push_layer(&rows, self.dims.q_size())?;
            }
            let attn = backend.paged_attention(&qkv, cache, &self.dims, batch)?;
            let attn_out = backend.linear(&attn, &layer.o_proj, None)?;
            let x =
                backend.add_rms_norm(&mut residual, &attn_out, &layer.post_attention_norm, eps)?;
            let act = backend.linear_swiglu(&x, &layer.gate_up_proj)?;
            pending_delta = Some(backend.linear(&act, &layer.down_proj, None)?);
        }
        if meta.logits_rows.is_empty() {
            // A non-final prefill chunk samples nothing: skip the head entirely.
            return Ok(None);
        }
        if let Some(delta) = pending_delta {
            backend.add_inplace(&mut residual, &delta)?;
        }
        let last = backend.gather_rows(&residual, &meta.logits_rows)?;
        let normed = backend.rms_norm(&last, &self.final_norm, eps)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        Ok(Some(backend.logits(&normed, head)?))
    }
}
