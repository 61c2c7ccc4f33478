//! The Llama-family decoder (Llama 2/3, SmolLM2, Mistral-style, Qwen2 with Q/K/V bias, Qwen3
//! with per-head Q/K norms), written once against [`Backend`] ops. Attention receives the paged
//! cache from the caller; the model owns no KV state.

use starling_backend::{
    AttentionDims, Backend, BatchMeta, HeadSpan, HostTensor, KvCacheSpec, LatentFactors, RopeSpec,
    RopeStyle as OpRopeStyle,
};
use starling_kv::{CacheDtype, CacheLayout, LayerLayout, LATENT_RANK_MULTIPLE};

use crate::config::{rope_inv_freqs, ModelConfig, RopeStyle};
use crate::loader::WeightMap;
use crate::ModelError;

/// One decoder layer's weights in backend memory (Q/K/V and gate/up fused at load).
struct DecoderLayer<B: Backend> {
    input_norm: B::Tensor,
    /// `[W_q; W_k; W_v]`, or for a latent layer `[W_q; A_k; A_v]` (the key latents of every
    /// head, then the value latent).
    qkv_weight: B::Tensor,
    qkv_bias: Option<B::Tensor>,
    /// Qwen3's per-head RMSNorms of the queries and keys; `None` for the other architectures.
    head_norms: Option<HeadNorms<B>>,
    /// A STAR-KV latent layer's ranks and up-projections; `None` for full K/V.
    latent: Option<LatentLayer<B>>,
    o_proj: B::Tensor,
    post_attention_norm: B::Tensor,
    gate_up_proj: B::Tensor,
    down_proj: B::Tensor,
}

/// One layer's query and key head norms (`[head_dim]` weights, shared by the heads).
struct HeadNorms<B: Backend> {
    q: B::Tensor,
    k: B::Tensor,
}

impl<B: Backend> HeadNorms<B> {
    /// Normalises the query and key heads of a fused `[n, q | k | v]` projection in place,
    /// before RoPE (Qwen3 rotates the normalised heads).
    fn apply(
        &self,
        backend: &B,
        qkv: &mut B::Tensor,
        dims: &AttentionDims,
        eps: f32,
    ) -> Result<(), ModelError> {
        let q = HeadSpan {
            first_col: 0,
            num_heads: dims.num_heads,
            head_dim: dims.head_dim,
        };
        let k = HeadSpan {
            first_col: dims.q_size(),
            num_heads: dims.num_kv_heads,
            head_dim: dims.head_dim,
        };
        backend.rms_norm_heads(qkv, &self.q, q, eps)?;
        backend.rms_norm_heads(qkv, &self.k, k, eps)?;
        Ok(())
    }
}

/// What a STAR-KV latent layer caches: the stored rank of each KV head's key latent and of the
/// value latent (multiples of [`LATENT_RANK_MULTIPLE`]; padding components are zero).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LatentRanks {
    /// Stored key rank per KV head.
    pub key_ranks: Vec<usize>,
    /// Stored value rank.
    pub value_rank: usize,
}

impl LatentRanks {
    /// Elements of a token's key latents (all heads).
    pub fn key_width(&self) -> usize {
        self.key_ranks.iter().sum()
    }

    /// The cache layout of a layer with these ranks.
    pub fn layout(&self, dtype: CacheDtype) -> LayerLayout {
        LayerLayout::LowRank {
            key_rank_per_head: self.key_ranks.clone(),
            value_rank: self.value_rank,
            dtype,
        }
    }

    fn validate(&self, config: &ModelConfig, layer: usize) -> Result<(), ModelError> {
        let bad = |why: String| {
            Err(ModelError::InvalidConfig(format!(
                "STAR-KV latent ranks of layer {layer}: {why}"
            )))
        };
        if self.key_ranks.len() != config.num_kv_heads {
            return bad(format!(
                "{} key ranks for {} KV heads",
                self.key_ranks.len(),
                config.num_kv_heads
            ));
        }
        let ranks = self.key_ranks.iter().chain([&self.value_rank]);
        if let Some(r) = ranks.clone().find(|&&r| r % LATENT_RANK_MULTIPLE != 0) {
            return bad(format!(
                "rank {r} is not a multiple of {LATENT_RANK_MULTIPLE} (stored ranks are padded)"
            ));
        }
        if self.value_rank == 0 || self.key_width() == 0 {
            return bad("a latent layer stores at least one key and one value component".into());
        }
        Ok(())
    }
}

/// A latent layer's factors on the host, at the stored ranks (padding rows of the down- and
/// columns of the up-projections zero): `key_down` `[Σ r_h, hidden]` (every head's `A_h`
/// stacked in head order), `key_up` `[head_dim, Σ r_h]` (every head's `B_h` side by side),
/// `value_down` `[r_v, hidden]`, `value_up` `[kv_heads * head_dim, r_v]`. The model's key and
/// value biases stay where they are and are added after reconstruction.
#[derive(Clone, Debug)]
pub struct LatentLayerWeights {
    /// The stored ranks.
    pub ranks: LatentRanks,
    /// `A_k` of every head.
    pub key_down: HostTensor,
    /// `B_k` of every head.
    pub key_up: HostTensor,
    /// `A_v`.
    pub value_down: HostTensor,
    /// `B_v`.
    pub value_up: HostTensor,
}

/// A latent layer's ranks and up-projections in backend memory.
struct LatentLayer<B: Backend> {
    ranks: LatentRanks,
    key_up: B::Tensor,
    key_bias: Option<B::Tensor>,
    value_up: B::Tensor,
    value_bias: Option<B::Tensor>,
}

impl<B: Backend> LatentLayer<B> {
    fn factors(&self) -> LatentFactors<'_, B::Tensor> {
        LatentFactors {
            key_up: &self.key_up,
            key_bias: self.key_bias.as_ref(),
            value_up: &self.value_up,
            value_bias: self.value_bias.as_ref(),
        }
    }
}

/// Names under which a latent layer's factors enter the weight source (not checkpoint names:
/// [`LlamaModel::load_latent`] puts them there).
fn latent_tensor_name(layer: usize, what: &str) -> String {
    format!("model.layers.{layer}.self_attn.star_kv.{what}")
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
        Self::build(backend, config, &mut weights, &[])
    }

    /// A model of `config`'s shapes with random weights made directly in backend memory (vLLM's
    /// dummy load format): for performance runs, where weight values do not matter.
    pub fn synthetic(backend: &B, config: &ModelConfig, seed: u64) -> Result<Self, ModelError> {
        Self::build(backend, config, &mut SyntheticSource { seed }, &[])
    }

    /// [`LlamaModel::load`] with STAR-KV latent layers: layer `l` caches latents when
    /// `latents[l]` is `Some` (its `W_k` and `W_v` are replaced by the factors and leave the
    /// model; their shapes are still checked), full K/V otherwise. An empty `latents` is the
    /// plain model.
    pub fn load_latent(
        backend: &B,
        config: &ModelConfig,
        mut weights: WeightMap,
        latents: Vec<Option<LatentLayerWeights>>,
    ) -> Result<Self, ModelError> {
        if !latents.is_empty() && latents.len() != config.num_layers {
            return Err(ModelError::InvalidConfig(format!(
                "STAR-KV factors for {} layers, the model has {}",
                latents.len(),
                config.num_layers
            )));
        }
        let mut ranks = Vec::with_capacity(latents.len());
        for (layer, latent) in latents.into_iter().enumerate() {
            let Some(latent) = latent else {
                ranks.push(None);
                continue;
            };
            latent.ranks.validate(config, layer)?;
            let p = format!("model.layers.{layer}.self_attn");
            let (d, kv) = (config.hidden_size, config.kv_size());
            weights.take(&format!("{p}.k_proj.weight"), &[kv, d])?;
            weights.take(&format!("{p}.v_proj.weight"), &[kv, d])?;
            let LatentLayerWeights {
                ranks: layer_ranks,
                key_down,
                key_up,
                value_down,
                value_up,
            } = latent;
            let width = layer_ranks.key_width() + layer_ranks.value_rank;
            for (what, tensor) in [
                ("key_down", key_down),
                ("key_up", key_up),
                ("value_down", value_down),
                ("value_up", value_up),
                ("zero_bias", HostTensor::zeros(vec![width])),
            ] {
                weights.insert(latent_tensor_name(layer, what), tensor);
            }
            ranks.push(Some(layer_ranks));
        }
        Self::build(backend, config, &mut weights, &ranks)
    }

    /// [`LlamaModel::synthetic`] with latent layers of the given stored ranks (`None`: full
    /// K/V), for performance runs of a STAR-KV cache at real shapes.
    pub fn synthetic_latent(
        backend: &B,
        config: &ModelConfig,
        seed: u64,
        ranks: &[Option<LatentRanks>],
    ) -> Result<Self, ModelError> {
        for (layer, r) in ranks.iter().enumerate() {
            if let Some(r) = r {
                r.validate(config, layer)?;
            }
        }
        Self::build(backend, config, &mut SyntheticSource { seed }, ranks)
    }

    fn build(
        backend: &B,
        config: &ModelConfig,
        weights: &mut dyn WeightSource<B>,
        latent_ranks: &[Option<LatentRanks>],
    ) -> Result<Self, ModelError> {
        config.validate()?;
        if !latent_ranks.is_empty() && latent_ranks.len() != config.num_layers {
            return Err(ModelError::InvalidConfig(format!(
                "latent ranks for {} layers, the model has {}",
                latent_ranks.len(),
                config.num_layers
            )));
        }
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
            let ranks = latent_ranks.get(l).and_then(Option::as_ref);
            let head_norms = if config.architecture.has_qk_norm() {
                if ranks.is_some() {
                    // The key norm sits between the key projection and RoPE, so keys are no
                    // longer linear in the latents the cache would hold.
                    return Err(ModelError::InvalidConfig(format!(
                        "layer {l}: STAR-KV latents are not supported for {} (per-head key norm)",
                        config.architecture.name()
                    )));
                }
                let norm = |t: &str| one(attn(t), vec![config.head_dim]);
                Some(HeadNorms {
                    q: weights.fused(backend, &norm("q_norm.weight"), true)?,
                    k: weights.fused(backend, &norm("k_norm.weight"), true)?,
                })
            } else {
                None
            };
            let (qkv, qkv_bias, latent) = match ranks {
                None => {
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
                    let qkv = vec![
                        (attn("q_proj.weight"), vec![q, d]),
                        (attn("k_proj.weight"), vec![kv, d]),
                        (attn("v_proj.weight"), vec![kv, d]),
                    ];
                    (qkv, qkv_bias, None)
                }
                Some(r) => {
                    let (kw, vw) = (r.key_width(), r.value_rank);
                    let star = |what: &str| latent_tensor_name(l, what);
                    // Biases move after the reconstruction; the latents themselves get none.
                    let (qkv_bias, key_bias, value_bias) = if config.attention_bias {
                        let parts = [
                            (attn("q_proj.bias"), vec![q]),
                            (star("zero_bias"), vec![kw + vw]),
                        ];
                        (
                            Some(weights.fused(backend, &parts, false)?),
                            Some(weights.fused(
                                backend,
                                &one(attn("k_proj.bias"), vec![kv]),
                                false,
                            )?),
                            Some(weights.fused(
                                backend,
                                &one(attn("v_proj.bias"), vec![kv]),
                                false,
                            )?),
                        )
                    } else {
                        (None, None, None)
                    };
                    let latent = LatentLayer {
                        ranks: r.clone(),
                        key_up: weights.fused(
                            backend,
                            &one(star("key_up"), vec![config.head_dim, kw]),
                            false,
                        )?,
                        key_bias,
                        value_up: weights.fused(
                            backend,
                            &one(star("value_up"), vec![kv, vw]),
                            false,
                        )?,
                        value_bias,
                    };
                    let qkv = vec![
                        (attn("q_proj.weight"), vec![q, d]),
                        (star("key_down"), vec![kw, d]),
                        (star("value_down"), vec![vw, d]),
                    ];
                    (qkv, qkv_bias, Some(latent))
                }
            };
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
                head_norms,
                latent,
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
        let mut caches = self.alloc_kv_caches(backend, blocks, BLOCK_TOKENS)?;
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

    /// What each layer caches per token with `dtype` elements: full K/V, or the latent ranks of
    /// a STAR-KV layer. The one description the engine sizes, checks and allocates the cache
    /// from.
    pub fn cache_layout(&self, dtype: CacheDtype) -> CacheLayout {
        let layers = self
            .layers
            .iter()
            .map(|layer| match &layer.latent {
                None => LayerLayout::Full {
                    num_kv_heads: self.config.num_kv_heads,
                    head_dim: self.config.head_dim,
                    dtype,
                },
                Some(latent) => latent.ranks.layout(dtype),
            })
            .collect();
        CacheLayout { layers }
    }

    /// Every layer's cache spec for a pool of `num_blocks` blocks (from
    /// [`cache_layout`](Self::cache_layout)).
    pub fn kv_cache_specs(
        &self,
        num_blocks: usize,
        block_size_tokens: usize,
        dtype: CacheDtype,
    ) -> Vec<KvCacheSpec> {
        self.cache_layout(dtype)
            .layers
            .into_iter()
            .map(|layout| KvCacheSpec {
                num_blocks,
                block_size_tokens,
                layout,
            })
            .collect()
    }

    /// Allocates every layer's cache (zero-filled) for a pool of `num_blocks` blocks in the
    /// backend's cache dtype.
    pub fn alloc_kv_caches(
        &self,
        backend: &B,
        num_blocks: usize,
        block_size_tokens: usize,
    ) -> Result<Vec<B::KvCache>, ModelError> {
        self.kv_cache_specs(num_blocks, block_size_tokens, backend.kv_cache_dtype())
            .iter()
            .map(|spec| Ok(backend.alloc_kv_cache(spec)?))
            .collect()
    }

    /// The stored latent ranks of each layer (`None`: full K/V).
    pub fn latent_ranks(&self) -> Vec<Option<LatentRanks>> {
        self.layers
            .iter()
            .map(|l| l.latent.as_ref().map(|lat| lat.ranks.clone()))
            .collect()
    }

    /// Whether any layer caches STAR-KV latents.
    pub fn has_latent_layers(&self) -> bool {
        self.layers.iter().any(|l| l.latent.is_some())
    }

    /// Layer `layer`'s up-projections when it caches latents (what reconstructing its keys and
    /// values needs, e.g. to score them for eviction).
    pub fn latent_factors(&self, layer: usize) -> Option<LatentFactors<'_, B::Tensor>> {
        self.layers
            .get(layer)
            .and_then(|l| l.latent.as_ref())
            .map(LatentLayer::factors)
    }

    /// The rotary embedding every layer applies.
    pub fn rope(&self) -> &RopeSpec {
        &self.rope
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
            if let Some(norms) = &layer.head_norms {
                norms.apply(backend, &mut qkv, &self.dims, eps)?;
            }
            // The captured rows are read after the write: it leaves `qkv` as RoPE left it.
            match &layer.latent {
                None => backend.rope_qk_write_kv(&mut qkv, cache, &self.dims, &self.rope, batch)?,
                Some(_) => {
                    backend.rope_q_write_latents(&mut qkv, cache, &self.dims, &self.rope, batch)?
                }
            }
            if let Some(c) = capture.as_deref_mut().filter(|c| !c.rows.is_empty()) {
                let rows = backend.to_host(&backend.gather_rows(&qkv, &c.rows)?)?;
                c.push_layer(&rows, self.dims.q_size())?;
            }
            let attn = match &layer.latent {
                None => backend.paged_attention(&qkv, cache, &self.dims, batch)?,
                Some(latent) => backend.latent_attention(
                    &qkv,
                    cache,
                    &latent.factors(),
                    &self.dims,
                    &self.rope,
                    batch,
                )?,
            };
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
