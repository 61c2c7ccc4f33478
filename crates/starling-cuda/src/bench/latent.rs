//! STAR-KV latent rows of `starling bench kernels`: attention on a latent cache (decode rows and
//! prefill chunks) and the latent projection + write, each timed beside the dense kernel of the
//! same model shape in the same process, so every figure is a ratio taken on one card at one time;
//! and the same on an fp8 latent cache (`--kv-cache-dtype fp8` with STAR-KV), whose rows the CLI
//! sets beside the bf16 latent rows of the same point.

use starling_backend::{
    AttentionDims, BackendCore, BatchMeta, KvCacheSpec, LatentFactors, ModelOps, RopeSpec,
    RopeStyle,
};
use starling_kv::{CacheDtype, LayerLayout, POSITION_BYTES};

use super::{attention_meta, bench_attention, dtype_name, time_ms, AttentionRow};
use crate::{CudaBackend, CudaError, CudaKvCache};

/// A latent layer's stored ranks (multiples of [`starling_kv::LATENT_RANK_MULTIPLE`]).
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatentRanks {
    /// Key latent rank of each KV head.
    pub key_rank_per_head: Vec<usize>,
    /// The value latent's rank (jointly over heads).
    pub value_rank: usize,
}

impl LatentRanks {
    /// Sum of the key ranks.
    pub fn key_width(&self) -> usize {
        self.key_rank_per_head.iter().sum()
    }

    /// Cache bytes one token holds in bf16 (latents + its position).
    pub fn bytes_per_token(&self) -> u64 {
        self.bytes_per_token_in(CacheDtype::BF16)
    }

    /// Cache bytes one token holds with latents of `dtype` (its position stays 4 bytes).
    pub fn bytes_per_token_in(&self, dtype: CacheDtype) -> u64 {
        dtype.bytes_for((self.key_width() + self.value_rank) as u64) + POSITION_BYTES
    }

    fn layout(&self, dtype: CacheDtype) -> LayerLayout {
        LayerLayout::LowRank {
            key_rank_per_head: self.key_rank_per_head.clone(),
            value_rank: self.value_rank,
            dtype,
        }
    }
}

/// A latent timing beside the dense one of the same shape and sizes.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatentAttentionRow {
    /// The latent kernel's timing; `kv_bytes` counts latent bytes (and positions).
    pub latent: AttentionRow,
    /// The dense kernel on full K/V of the same heads, batch and context.
    pub dense: AttentionRow,
    /// `dense.median_ms / latent.median_ms` (above 1: the latent kernel is faster).
    pub speedup_vs_dense: f64,
    /// Dense K/V bytes over latent bytes per token: the ceiling of a bandwidth-bound speed-up.
    pub byte_ratio: f64,
}

/// RoPE frequencies of a `head_dim`-wide head (θ = 10⁴, NeoX pairing).
fn rope(head_dim: usize) -> RopeSpec {
    RopeSpec {
        inv_freqs: (0..head_dim / 2)
            .map(|i| 1.0 / 1e4f32.powf(2.0 * i as f32 / head_dim as f32))
            .collect(),
        style: RopeStyle::Neox,
    }
}

/// Random up-projections and biases of one latent layer, scaled to keep keys and values O(1).
struct Factors {
    key_up: <CudaBackend as BackendCore>::Tensor,
    key_bias: <CudaBackend as BackendCore>::Tensor,
    value_up: <CudaBackend as BackendCore>::Tensor,
    value_bias: <CudaBackend as BackendCore>::Tensor,
}

impl Factors {
    fn random(
        backend: &CudaBackend,
        dims: &AttentionDims,
        ranks: &LatentRanks,
    ) -> Result<Self, CudaError> {
        let (kw, vw) = (ranks.key_width().max(1), ranks.value_rank.max(1));
        Ok(Self {
            key_up: backend.random_bf16(
                vec![dims.head_dim, kw],
                21,
                1.0 / (kw as f32).sqrt(),
                0.0,
            )?,
            key_bias: backend.random_bf16(vec![dims.kv_size()], 22, 0.5, 0.0)?,
            value_up: backend.random_bf16(
                vec![dims.kv_size(), vw],
                23,
                1.0 / (vw as f32).sqrt(),
                0.0,
            )?,
            value_bias: backend.random_bf16(vec![dims.kv_size()], 24, 0.5, 0.0)?,
        })
    }

    fn view(&self) -> LatentFactors<'_, <CudaBackend as BackendCore>::Tensor> {
        LatentFactors {
            key_up: &self.key_up,
            key_bias: Some(&self.key_bias),
            value_up: &self.value_up,
            value_bias: Some(&self.value_bias),
        }
    }
}

/// Times attention on a bf16 latent cache of `ranks` for `batch` sequences of `seq` tokens with
/// `query` new ones each (1: decode rows through the latent decode kernels; more: one prefill
/// chunk per sequence), and the dense kernel at the same point: [`bench_latent_attention_in`].
///
/// The cache is filled through the latent write, every slot at its own position, as a served
/// sequence holds it. Until session 37 these rows used random words with every slot at position
/// 0: one cos/sin table row for every key, always in L1, where a served context reads a row per
/// key position (16 MiB of table at 32k); on the H100 that read the latent kernels up to 1.6×
/// faster than the same contents at their positions.
pub fn bench_latent_attention(
    backend: &CudaBackend,
    dims: AttentionDims,
    ranks: &LatentRanks,
    batch: usize,
    seq: usize,
    query: usize,
) -> Result<LatentAttentionRow, CudaError> {
    bench_latent_attention_in(backend, dims, ranks, batch, seq, query, CacheDtype::BF16)
}

/// [`bench_latent_attention`] on a latent cache of `dtype` (bf16, or fp8: e4m3 latents), filled
/// through the latent write (random words would hold NaN bytes in fp8) with every slot at its
/// own position, so the bf16 and fp8 rows of one point time the same contents.
#[allow(clippy::too_many_arguments)]
pub fn bench_latent_attention_in(
    backend: &CudaBackend,
    dims: AttentionDims,
    ranks: &LatentRanks,
    batch: usize,
    seq: usize,
    query: usize,
    dtype: CacheDtype,
) -> Result<LatentAttentionRow, CudaError> {
    let point = AttentionPoint { batch, seq, query };
    let mut cache = backend.alloc_kv_cache(&point.spec(ranks, dtype))?;
    fill_latents_by_writes(backend, &mut cache, &dims, ranks, seq, 13)?;
    latent_attention_row(backend, dims, ranks, point, &cache, dtype)
}

/// Sequences, context tokens per sequence, new tokens per sequence.
#[derive(Clone, Copy)]
struct AttentionPoint {
    batch: usize,
    seq: usize,
    query: usize,
}

impl AttentionPoint {
    const BLOCK_TOKENS: usize = 16;

    fn num_blocks(&self) -> usize {
        self.batch * self.seq.div_ceil(Self::BLOCK_TOKENS)
    }

    fn spec(&self, ranks: &LatentRanks, dtype: CacheDtype) -> KvCacheSpec {
        KvCacheSpec {
            num_blocks: self.num_blocks(),
            block_size_tokens: Self::BLOCK_TOKENS,
            layout: ranks.layout(dtype),
        }
    }
}

/// Times `latent_attention` at `point` over `cache` (latents of `dtype`) and the dense kernel at
/// the same point.
fn latent_attention_row(
    backend: &CudaBackend,
    dims: AttentionDims,
    ranks: &LatentRanks,
    point: AttentionPoint,
    cache: &CudaKvCache,
    dtype: CacheDtype,
) -> Result<LatentAttentionRow, CudaError> {
    let AttentionPoint { batch, seq, query } = point;
    let dense = bench_attention(backend, dims, batch, seq, query)?;
    let meta = attention_meta(batch, seq, query, AttentionPoint::BLOCK_TOKENS);
    let width = dims.q_size() + ranks.key_width() + ranks.value_rank;
    let qkv = backend.random_bf16(vec![meta.num_tokens(), width], 3, 1.0, 0.0)?;
    let factors = Factors::random(backend, &dims, ranks)?;
    let rope = rope(dims.head_dim);
    let prepared = backend.prepare_batch(&meta, point.num_blocks())?;
    let ms = time_ms(backend, 3, 20, || {
        backend.latent_attention(&qkv, cache, &factors.view(), &dims, &rope, &prepared)?;
        Ok(())
    })?;
    let bytes_per_token = ranks.bytes_per_token_in(dtype);
    let kv_bytes = bytes_per_token * (batch * seq) as u64;
    let latent = AttentionRow {
        dtype: dtype_name(dtype),
        median_ms: ms,
        kv_bytes,
        achieved_tb_s: kv_bytes as f64 / (ms * 1e-3) / 1e12,
        achieved_tflops: dense.achieved_tflops * dense.median_ms / ms,
        ..dense.clone()
    };
    let dense_bytes_per_token = (dims.kv_size() * 2 * 2) as f64;
    Ok(LatentAttentionRow {
        speedup_vs_dense: dense.median_ms / ms,
        byte_ratio: dense_bytes_per_token / bytes_per_token as f64,
        latent,
        dense,
    })
}

/// Fills every slot of a latent cache of any element with N(0, 1) latents through
/// `rope_q_write_latents`, slot `s` at position `s` (one sequence, never compacted).
fn fill_latents_by_writes(
    backend: &CudaBackend,
    cache: &mut CudaKvCache,
    dims: &AttentionDims,
    ranks: &LatentRanks,
    seq_tokens: usize,
    seed: u64,
) -> Result<(), CudaError> {
    let spec = cache.spec().clone();
    let block = spec.block_size_tokens;
    let blocks_per_seq = seq_tokens.div_ceil(block).max(1);
    let width = dims.q_size() + ranks.key_width() + ranks.value_rank;
    let rope = rope(dims.head_dim);
    // Sequence b owns blocks [b · blocks_per_seq, …), as `attention_meta` lays them out. Written
    // a chunk of one sequence at a time at its own positions: one write batch of the whole cache
    // would sum every token's visible context past u32 (the batch's score offsets).
    let chunk = 8192.min(seq_tokens.max(1));
    let mut writes = 0u64;
    for first_block in (0..spec.num_blocks).step_by(blocks_per_seq) {
        let table: Vec<u32> = (first_block as u32..(first_block + blocks_per_seq) as u32).collect();
        let base = first_block * block;
        for start in (0..seq_tokens).step_by(chunk) {
            let n = chunk.min(seq_tokens - start);
            let slots = ((base + start) as u32..(base + start + n) as u32).collect();
            let meta =
                BatchMeta::single_sequence(start, n, slots, table.clone(), block, Vec::new());
            let mut qkv = backend.random_bf16(vec![n, width], seed + writes, 1.0, 0.0)?;
            writes += 1;
            let prepared = backend.prepare_batch(&meta, spec.num_blocks)?;
            backend.rope_q_write_latents(&mut qkv, cache, dims, &rope, &prepared)?;
        }
    }
    Ok(())
}

/// The QKV projection + cache write of `tokens` tokens on a latent layer against a dense one of
/// the same model width: `x · [W_q; A_k; A_v]ᵀ` then the Q RoPE + latent write, against
/// `x · [W_q; W_k; W_v]ᵀ` then the fused RoPE + K/V write.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LatentWriteRow {
    /// Tokens projected and written.
    pub tokens: usize,
    /// Model width (the projection's input).
    pub hidden_size: usize,
    /// Latent projection + write, median.
    pub latent_ms: f64,
    /// Dense projection + write, median.
    pub dense_ms: f64,
    /// `latent_ms / dense_ms` (the target is at most 1).
    pub ratio_to_dense: f64,
}

/// Times the latent and dense projection + write of `tokens` tokens (shuffled-free consecutive
/// slots of one sequence).
pub fn bench_latent_write(
    backend: &CudaBackend,
    dims: AttentionDims,
    ranks: &LatentRanks,
    hidden_size: usize,
    tokens: usize,
) -> Result<LatentWriteRow, CudaError> {
    bench_latent_write_in(backend, dims, ranks, hidden_size, tokens, CacheDtype::BF16)
}

/// [`bench_latent_write`] into a latent cache of `dtype` (fp8: quantised on write); the dense
/// write it is set beside stays bf16.
pub fn bench_latent_write_in(
    backend: &CudaBackend,
    dims: AttentionDims,
    ranks: &LatentRanks,
    hidden_size: usize,
    tokens: usize,
    dtype: CacheDtype,
) -> Result<LatentWriteRow, CudaError> {
    let block_size = 16;
    let meta = attention_meta(1, tokens, tokens, block_size);
    let num_blocks = tokens.div_ceil(block_size);
    let prepared = backend.prepare_batch(&meta, num_blocks)?;
    let rope = rope(dims.head_dim);
    let x = backend.random_bf16(vec![tokens, hidden_size], 7, 1.0, 0.0)?;
    let scale = 1.0 / (hidden_size as f32).sqrt();

    let latent_width = dims.q_size() + ranks.key_width() + ranks.value_rank;
    let w_latent = backend.random_bf16(vec![latent_width, hidden_size], 8, scale, 0.0)?;
    let mut latent_cache = backend.alloc_kv_cache(&KvCacheSpec {
        num_blocks,
        block_size_tokens: block_size,
        layout: ranks.layout(dtype),
    })?;
    let latent_ms = time_ms(backend, 3, 20, || {
        let mut qkv = backend.linear(&x, &w_latent, None)?;
        backend.rope_q_write_latents(&mut qkv, &mut latent_cache, &dims, &rope, &prepared)?;
        Ok(())
    })?;

    let w_dense = backend.random_bf16(vec![dims.qkv_size(), hidden_size], 9, scale, 0.0)?;
    let mut dense_cache = backend.alloc_kv_cache(&KvCacheSpec::full(
        num_blocks,
        block_size,
        dims.num_kv_heads,
        dims.head_dim,
        CacheDtype::BF16,
    ))?;
    let dense_ms = time_ms(backend, 3, 20, || {
        let mut qkv = backend.linear(&x, &w_dense, None)?;
        backend.rope_qk_write_kv(&mut qkv, &mut dense_cache, &dims, &rope, &prepared)?;
        Ok(())
    })?;
    Ok(LatentWriteRow {
        tokens,
        hidden_size,
        latent_ms,
        dense_ms,
        ratio_to_dense: latent_ms / dense_ms,
    })
}
