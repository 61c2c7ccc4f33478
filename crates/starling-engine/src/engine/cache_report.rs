//! What an engine's KV cache is, as one serializable record: the layout (full K/V, or STAR-KV
//! latents and their ranks), bytes per token, blocks, and the longest context it boots. The
//! serve log, `/metrics`, `/v1/models`, the demo and every result file print this record, so
//! none of them re-derives the figures from the configuration.

use std::fmt;

use serde::{Deserialize, Serialize};
use starling_backend::Backend;
use starling_kv::{format_bytes, CacheDtype, CacheLayout, LayerLayout};

use super::{longest_evicting_context, Engine, StarKvInfo};

/// Whether the cache stores full K/V or latents.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CacheKind {
    /// Full K/V in every layer.
    Full,
    /// STAR-KV latents in at least one layer (any other layer full K/V).
    Latent,
}

impl CacheKind {
    /// The name in reports (`full`, `latent`).
    pub fn name(self) -> &'static str {
        match self {
            Self::Full => "full",
            Self::Latent => "latent",
        }
    }
}

/// The stored ranks of a latent cache's layers (multiples of
/// [`starling_kv::LATENT_RANK_MULTIPLE`]), as ranges over its latent layers and heads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct LatentRankSummary {
    /// Smallest key rank of any KV head.
    pub key_rank_per_head_min: usize,
    /// Largest key rank of any KV head.
    pub key_rank_per_head_max: usize,
    /// Smallest value rank of any latent layer.
    pub value_rank_min: usize,
    /// Largest value rank of any latent layer.
    pub value_rank_max: usize,
}

impl LatentRankSummary {
    /// The ranges over the latent layers of `layout`; `None` when it has none.
    pub fn of(layout: &CacheLayout) -> Option<Self> {
        let mut summary: Option<Self> = None;
        for layer in &layout.layers {
            let LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } = layer
            else {
                continue;
            };
            let key_min = key_rank_per_head.iter().copied().min().unwrap_or(0);
            let key_max = key_rank_per_head.iter().copied().max().unwrap_or(0);
            let s = summary.get_or_insert(Self {
                key_rank_per_head_min: key_min,
                key_rank_per_head_max: key_max,
                value_rank_min: *value_rank,
                value_rank_max: *value_rank,
            });
            s.key_rank_per_head_min = s.key_rank_per_head_min.min(key_min);
            s.key_rank_per_head_max = s.key_rank_per_head_max.max(key_max);
            s.value_rank_min = s.value_rank_min.min(*value_rank);
            s.value_rank_max = s.value_rank_max.max(*value_rank);
        }
        summary
    }
}

/// The engine's KV cache: layout, sizing and capacity.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct CacheReport {
    /// Full K/V or latents.
    pub kind: CacheKind,
    /// Element type (`f32` on the CPU, `bf16` on a GPU).
    pub dtype: String,
    /// Bytes one token occupies across all layers (latents padded to their stored ranks, and
    /// each latent layer's position, included).
    pub bytes_per_token: u64,
    /// What one token would occupy as full K/V in the same dtype (the plain model's cache).
    pub full_bytes_per_token: u64,
    /// Token slots per block.
    pub block_size_tokens: usize,
    /// Blocks in the pool.
    pub num_blocks: usize,
    /// Token slots in the pool (of each cache tensor: a hybrid model's block holds one cache
    /// group's layers).
    pub capacity_tokens: usize,
    /// Block tables per sequence: 1, or a hybrid sliding-window model's cache groups (its
    /// windowed layers' blocks in tables of their own, released behind the window).
    #[serde(default = "one_group")]
    pub cache_groups: usize,
    /// Bytes the blocks occupy (at most the budget).
    pub cache_bytes: u64,
    /// Attention layers.
    pub num_layers: usize,
    /// Of those, layers that store latents.
    pub latent_layers: usize,
    /// The latent layers' stored ranks; absent for full K/V.
    pub latent_ranks: Option<LatentRankSummary>,
    /// The context window the engine enforces, tokens.
    pub max_model_len_tokens: usize,
    /// Full-length sequences that fit at once (fractional; under eviction, compressed ones).
    pub max_concurrency: f64,
    /// The longest single sequence the pool holds, within the model's window: every token
    /// held, or under the engine-wide eviction policy its peak (kept tokens plus a chunk).
    pub longest_context_tokens: usize,
    /// The STAR-KV checkpoint the latents come from; absent for full K/V and for synthetic
    /// latents (`--synthetic-latent-share`), whose ranks come from a share, not a checkpoint.
    pub star_kv: Option<StarKvInfo>,
}

fn one_group() -> usize {
    1
}

/// The report's lower-case name of `dtype`.
fn dtype_name(dtype: CacheDtype) -> &'static str {
    match dtype {
        CacheDtype::F32 => "f32",
        CacheDtype::F16 => "f16",
        CacheDtype::BF16 => "bf16",
        CacheDtype::Fp8 => "fp8",
        CacheDtype::Int8 => "int8",
        CacheDtype::Int4 => "int4",
    }
}

impl<B: Backend> Engine<B> {
    /// What this engine's cache is and holds at most (see [`CacheReport`]).
    pub fn cache_report(&self) -> CacheReport {
        let config = self.model.config();
        let sched = self.scheduler.config();
        let sizing = &self.preflight.sizing;
        // The cache's dtype, and the layers that differ: an fp8 cache keeps the layers whose
        // keys e4m3 cannot hold in the activation dtype (`LlamaModel::fp8_exempt_layers`).
        let dtypes: Vec<CacheDtype> = self.layout.layers.iter().map(|l| l.dtype()).collect();
        let dtype = if let Some(quantised) = dtypes
            .iter()
            .find(|d| matches!(d, CacheDtype::Fp8 | CacheDtype::Int8 | CacheDtype::Int4))
        {
            *quantised
        } else {
            dtypes.first().copied().unwrap_or(CacheDtype::F32)
        };
        let other_layers: Vec<usize> = (0..dtypes.len()).filter(|&l| dtypes[l] != dtype).collect();
        let full = CacheLayout {
            layers: dtypes
                .iter()
                .map(|&dtype| LayerLayout::Full {
                    num_kv_heads: config.num_kv_heads,
                    head_dim: config.head_dim,
                    dtype,
                })
                .collect(),
        };
        let latent_layers = self.layout.num_low_rank_layers();
        let cache_groups = self.model.cache_groups().num_groups();
        let longest = if cache_groups > 1 {
            self.scheduler.kv().max_tokens_one_seq()
        } else {
            longest_evicting_context(
                &self.compression,
                sizing.capacity_tokens(),
                sched.max_num_batched_tokens,
            )
        };
        // A hybrid model's sizing counts one group's layers per block; a token of a sequence
        // that keeps every slot costs every layer's bytes.
        let bytes_per_token = if cache_groups > 1 {
            self.layout.bytes_per_token()
        } else {
            sizing.bytes_per_token
        };
        CacheReport {
            kind: if latent_layers > 0 {
                CacheKind::Latent
            } else {
                CacheKind::Full
            },
            dtype: match other_layers.as_slice() {
                [] => dtype_name(dtype).to_owned(),
                layers => format!(
                    "{} ({} in layers {}: key bias too large for fp8)",
                    dtype_name(dtype),
                    dtype_name(dtypes[layers[0]]),
                    layers
                        .iter()
                        .map(usize::to_string)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            },
            bytes_per_token,
            full_bytes_per_token: full.bytes_per_token(),
            block_size_tokens: sizing.block_size_tokens,
            num_blocks: sizing.num_blocks,
            capacity_tokens: sizing.capacity_tokens(),
            cache_groups,
            cache_bytes: sizing.total_bytes(),
            num_layers: self.layout.layers.len(),
            latent_layers,
            latent_ranks: LatentRankSummary::of(&self.layout),
            max_model_len_tokens: sched.max_model_len_tokens,
            max_concurrency: self.preflight.max_concurrency,
            longest_context_tokens: longest.min(config.max_position_embeddings),
            star_kv: self.star_kv.clone(),
        }
    }
}

impl CacheReport {
    /// What the layout is, in a few words: `full K/V`, `STAR-KV latents (balanced, checkpoint
    /// `ckpt`; 27 of 30 layers, key ranks 40-64 per head, value ranks 96-192)`, or the same
    /// with `synthetic latents` when no checkpoint made them.
    pub fn layout_description(&self) -> String {
        let Some(ranks) = &self.latent_ranks else {
            return "full K/V".to_owned();
        };
        let range = |lo: usize, hi: usize| {
            if lo == hi {
                lo.to_string()
            } else {
                format!("{lo}-{hi}")
            }
        };
        let shape = format!(
            "{} of {} layers, key rank {} per head, value rank {}",
            self.latent_layers,
            self.num_layers,
            range(ranks.key_rank_per_head_min, ranks.key_rank_per_head_max),
            range(ranks.value_rank_min, ranks.value_rank_max)
        );
        match &self.star_kv {
            Some(info) => format!(
                "STAR-KV latents ({}, checkpoint `{}`; {shape})",
                info.profile, info.checkpoint_name
            ),
            None => format!("synthetic latents ({shape})"),
        }
    }

    /// The bytes the cache saves per token against full K/V, as a share (0 for full K/V;
    /// negative if a layout stored more).
    pub fn saved_share(&self) -> f64 {
        1.0 - self.bytes_per_token as f64 / self.full_bytes_per_token.max(1) as f64
    }
}

impl fmt::Display for CacheReport {
    /// One line: the layout, bytes per token, blocks and the longest bootable context.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} in {}: {} per token",
            self.layout_description(),
            self.dtype,
            format_bytes(self.bytes_per_token)
        )?;
        if self.kind == CacheKind::Latent {
            write!(
                f,
                " vs {} full ({:.1}% saved)",
                format_bytes(self.full_bytes_per_token),
                100.0 * self.saved_share()
            )?;
        }
        if self.cache_groups > 1 {
            write!(
                f,
                " with every slot kept; windowed layers in {} block tables of their own, \
                 released behind the window",
                self.cache_groups - 1
            )?;
        }
        write!(
            f,
            " → {} blocks × {} tokens ({} tokens, {}); longest bootable context {} tokens",
            self.num_blocks,
            self.block_size_tokens,
            self.capacity_tokens,
            format_bytes(self.cache_bytes),
            self.longest_context_tokens
        )
    }
}

#[cfg(test)]
mod tests {
    use starling_backend::cpu::CpuBackend;
    use starling_models::llama::{LatentRanks, LlamaModel};
    use starling_models::ModelConfig;

    use crate::EngineConfig;

    use super::*;

    const BUDGET_BYTES: u64 = 1 << 20;

    fn engine(latent: Option<&[usize]>) -> Engine<CpuBackend> {
        let config = ModelConfig::tiny_llama_for_tests();
        let backend = CpuBackend::new();
        let model = match latent {
            None => LlamaModel::synthetic(&backend, &config, 3).unwrap(),
            Some(key_ranks) => {
                // Layer 0 stays full, layer 1 stores latents.
                let ranks = LatentRanks {
                    key_ranks: key_ranks.to_vec(),
                    value_rank: 16,
                };
                LlamaModel::synthetic_latent(&backend, &config, 3, &[None, Some(ranks)]).unwrap()
            }
        };
        let engine_config =
            EngineConfig::with_defaults(config.max_position_embeddings, BUDGET_BYTES);
        Engine::new(backend, model, None, engine_config).unwrap()
    }

    #[test]
    fn a_full_cache_reports_its_blocks_and_context() {
        let report = engine(None).cache_report();
        // Tiny model: 2 layers × K+V × 2 heads × 16 × f32 = 512 bytes per token.
        assert_eq!(report.kind, CacheKind::Full);
        assert_eq!(report.dtype, "f32");
        assert_eq!(report.bytes_per_token, 512);
        assert_eq!(report.full_bytes_per_token, 512);
        assert_eq!(report.num_blocks, (BUDGET_BYTES / (512 * 16)) as usize);
        assert_eq!(report.capacity_tokens, report.num_blocks * 16);
        assert_eq!(report.latent_layers, 0);
        assert_eq!(report.latent_ranks, None);
        // The pool holds 2048 tokens; the model's window is 256.
        assert_eq!(report.longest_context_tokens, 256);
        let line = report.to_string();
        assert!(
            line.starts_with("full K/V in f32: 512 B per token"),
            "{line}"
        );
        assert!(
            line.contains("longest bootable context 256 tokens"),
            "{line}"
        );
        let json = serde_json::to_value(&report).unwrap();
        assert_eq!(json["kind"], "full");
        assert_eq!(json["star_kv"], serde_json::Value::Null);
        // What `/v1/models` sends, a client reads back.
        let back: CacheReport = serde_json::from_value(json).unwrap();
        assert_eq!(back, report);
    }

    #[test]
    fn a_latent_layer_buys_blocks_and_is_described() {
        let full = engine(None).cache_report();
        let report = engine(Some(&[8, 16])).cache_report();
        // Layer 1: (8 + 16 + 16) × 4 bytes + a 4-byte position = 164, beside layer 0's 256.
        assert_eq!(report.kind, CacheKind::Latent);
        assert_eq!(report.bytes_per_token, 256 + 164);
        assert_eq!(report.full_bytes_per_token, 512);
        assert!(report.num_blocks > full.num_blocks);
        assert_eq!(report.latent_layers, 1);
        let ranks = report.latent_ranks.unwrap();
        assert_eq!(
            (ranks.key_rank_per_head_min, ranks.key_rank_per_head_max),
            (8, 16)
        );
        assert_eq!((ranks.value_rank_min, ranks.value_rank_max), (16, 16));
        let line = report.to_string();
        assert!(
            line.starts_with(
                "synthetic latents (1 of 2 layers, key rank 8-16 per head, value rank 16)"
            ),
            "{line}"
        );
        assert!(line.contains("vs 512 B full (18.0% saved)"), "{line}");
    }
}
