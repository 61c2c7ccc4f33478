//! STAR-KV latent layers: the stored ranks, the host factors a checkpoint gives, and the
//! up-projections a latent layer keeps in backend memory.

use starling_backend::{Backend, HostTensor, LatentFactors};
use starling_kv::{CacheDtype, LayerLayout, LATENT_RANK_MULTIPLE};

use crate::config::ModelConfig;
use crate::ModelError;

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

    pub(super) fn validate(&self, config: &ModelConfig, layer: usize) -> Result<(), ModelError> {
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
pub(super) struct LatentLayer<B: Backend> {
    pub(super) ranks: LatentRanks,
    pub(super) key_up: B::Tensor,
    pub(super) key_bias: Option<B::Tensor>,
    pub(super) value_up: B::Tensor,
    pub(super) value_bias: Option<B::Tensor>,
}

impl<B: Backend> LatentLayer<B> {
    pub(super) fn factors(&self) -> LatentFactors<'_, B::Tensor> {
        LatentFactors {
            key_up: &self.key_up,
            key_bias: self.key_bias.as_ref(),
            value_up: &self.value_up,
            value_bias: self.value_bias.as_ref(),
        }
    }
}

/// Names under which a latent layer's factors enter the weight source (not checkpoint names:
/// [`LlamaModel::load_latent`](super::LlamaModel::load_latent) puts them there).
pub(super) fn latent_tensor_name(layer: usize, what: &str) -> String {
    format!("model.layers.{layer}.self_attn.star_kv.{what}")
}
