//! GPU measurements behind `starling bench kernels` and `starling bench decode`: device-event
//! timings (median of many runs after warm-up), bytes moved and the copy-bandwidth ceiling measured
//! in the same process.

use cudarc::driver::sys::CUevent_flags;
use half::bf16;
use starling_backend::{AttentionDims, BackendCore, BatchMeta, ModelOps, SeqBatchMeta};
use starling_kv::CacheDtype;

use crate::{CudaBackend, CudaError, CudaKvCache};

pub mod compaction;
pub mod gemm;
pub mod latent;
pub use compaction::{bench_compaction, CompactionRow};
pub use gemm::{bench_projection, GemmRow, Projection, PIPELINED_CALLS};
pub use latent::{
    bench_latent_attention, bench_latent_attention_in, bench_latent_write, bench_latent_write_in,
    LatentAttentionRow, LatentRanks, LatentWriteRow,
};

/// Median milliseconds of `iters` runs of `f`, timed with device events after `warmup` runs.
pub fn time_ms(
    backend: &CudaBackend,
    warmup: usize,
    iters: usize,
    mut f: impl FnMut() -> Result<(), CudaError>,
) -> Result<f64, CudaError> {
    for _ in 0..warmup {
        f()?;
    }
    backend.synchronize()?;
    let ctx = backend.context();
    let mut times = Vec::with_capacity(iters);
    for _ in 0..iters {
        let start = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        let end = ctx.new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))?;
        start.record(backend.stream())?;
        f()?;
        end.record(backend.stream())?;
        times.push(start.elapsed_ms(&end)? as f64);
    }
    times.sort_by(f64::total_cmp);
    Ok(times[times.len() / 2])
}

/// Device-to-device copy bandwidth in TB/s (bytes read + written), over `bytes` bytes.
pub fn copy_bandwidth_tb_s(backend: &CudaBackend, bytes: usize) -> Result<f64, CudaError> {
    let n = bytes / 2;
    let src = backend.stream().alloc_zeros::<bf16>(n)?;
    let mut dst = backend.stream().alloc_zeros::<bf16>(n)?;
    let ms = time_ms(backend, 3, 20, || {
        Ok(backend.stream().memcpy_dtod(&src, &mut dst)?)
    })?;
    Ok(2.0 * (n * 2) as f64 / (ms * 1e-3) / 1e12)
}

/// One attention timing.
#[derive(Debug, Clone, serde::Serialize)]
pub struct AttentionRow {
    /// "decode" or "prefill".
    pub kind: &'static str,
    /// The cache element: "bf16" or "fp8".
    pub dtype: &'static str,
    /// Query heads.
    pub num_heads: usize,
    /// KV heads.
    pub num_kv_heads: usize,
    /// Head width.
    pub head_dim: usize,
    /// Sequences in the batch.
    pub batch: usize,
    /// Context tokens per sequence (including the new ones).
    pub seq_tokens: usize,
    /// New (query) tokens per sequence.
    pub query_tokens: usize,
    /// Median kernel time.
    pub median_ms: f64,
    /// K/V bytes the kernel must read (each once).
    pub kv_bytes: u64,
    /// `kv_bytes` / time.
    pub achieved_tb_s: f64,
    /// Attention arithmetic (Q·Kᵀ and P·V over each query's visible context, causal) / time:
    /// prefill chunks are bound by it rather than by `kv_bytes`.
    pub achieved_tflops: f64,
}

/// A batch of `batch` sequences with `seq` context tokens each, the last `query` of them new.
pub fn attention_meta(batch: usize, seq: usize, query: usize, block_size: usize) -> BatchMeta {
    let blocks_per_seq = seq.div_ceil(block_size);
    let mut meta = BatchMeta {
        block_size_tokens: block_size,
        ..Default::default()
    };
    for s in 0..batch {
        let table: Vec<u32> = (0..blocks_per_seq)
            .map(|b| (s * blocks_per_seq + b) as u32)
            .collect();
        for t in seq - query..seq {
            meta.positions.push(t as u32);
            meta.slot_mapping
                .push(table[t / block_size] * block_size as u32 + (t % block_size) as u32);
        }
        meta.seqs.push(SeqBatchMeta {
            query_start: s * query,
            query_len: query,
            context_len_tokens: seq,
            block_table: table,
        });
        meta.logits_rows.push(((s + 1) * query - 1) as u32);
    }
    meta
}

/// Times paged attention for one shape (K/V caches filled with random values). A `query` above 1
/// makes each sequence one prefill run, which the backend sends to the tiled tensor-core kernel
/// (head widths 64 and 128); `query == 1` is decode (the tensor-core decode kernel for grouped-query
/// shapes at head widths 64 and 128, the per-token kernel otherwise).
pub fn bench_attention(
    backend: &CudaBackend,
    dims: AttentionDims,
    batch: usize,
    seq: usize,
    query: usize,
) -> Result<AttentionRow, CudaError> {
    bench_attention_in(backend, dims, batch, seq, query, CacheDtype::BF16)
}

/// [`bench_attention`] over a cache of `dtype` (bf16, or fp8: `--kv-cache-dtype fp8`).
pub fn bench_attention_in(
    backend: &CudaBackend,
    dims: AttentionDims,
    batch: usize,
    seq: usize,
    query: usize,
    dtype: CacheDtype,
) -> Result<AttentionRow, CudaError> {
    let block_size = 16;
    let meta = attention_meta(batch, seq, query, block_size);
    let num_blocks = batch * seq.div_ceil(block_size);
    let spec = starling_backend::KvCacheSpec::full(
        num_blocks,
        block_size,
        dims.num_kv_heads,
        dims.head_dim,
        dtype,
    );
    let mut cache = backend.alloc_kv_cache(&spec)?;
    match dtype {
        CacheDtype::Fp8 => fill_cache_by_writes(backend, &mut cache, &dims, 11)?,
        _ => fill_cache(backend, &mut cache, 11)?,
    }
    let qkv = backend.random_bf16(vec![meta.num_tokens(), dims.qkv_size()], 3, 1.0, 0.0)?;
    let prepared = backend.prepare_batch(&meta, num_blocks)?;
    let ms = time_ms(backend, 3, 20, || {
        backend.paged_attention(&qkv, &cache, &dims, &prepared)?;
        Ok(())
    })?;
    let kv_bytes = dtype.bytes_for((batch * seq * dims.num_kv_heads * dims.head_dim * 2) as u64);
    // Query i of a run sees seq - query + i + 1 positions; 2 flops per multiply-add, 2 products.
    let visible_per_seq = query * (seq - query) + query * (query + 1) / 2;
    let flops = 4.0 * (batch * visible_per_seq * dims.num_heads * dims.head_dim) as f64;
    Ok(AttentionRow {
        kind: if query == 1 { "decode" } else { "prefill" },
        dtype: dtype_name(dtype),
        num_heads: dims.num_heads,
        num_kv_heads: dims.num_kv_heads,
        head_dim: dims.head_dim,
        batch,
        seq_tokens: seq,
        query_tokens: query,
        median_ms: ms,
        kv_bytes,
        achieved_tb_s: kv_bytes as f64 / (ms * 1e-3) / 1e12,
        achieved_tflops: flops / (ms * 1e-3) / 1e12,
    })
}

/// The rows' name of a cache element type.
fn dtype_name(dtype: CacheDtype) -> &'static str {
    match dtype {
        CacheDtype::Fp8 => "fp8",
        CacheDtype::Int8 => "int8",
        CacheDtype::Int4 => "int4",
        CacheDtype::F32 => "f32",
        CacheDtype::F16 => "f16",
        CacheDtype::BF16 => "bf16",
    }
}

/// Fills every slot of a full cache of any element type with N(0, 1) K/V through `write_kv`
/// (an fp8 plane filled with random words would hold NaN bytes).
pub fn fill_cache_by_writes(
    backend: &CudaBackend,
    cache: &mut CudaKvCache,
    dims: &AttentionDims,
    seed: u64,
) -> Result<(), CudaError> {
    let spec = cache.spec().clone();
    let slots = spec.num_slots();
    let chunk = 8192.min(slots.max(1));
    for (i, start) in (0..slots).step_by(chunk).enumerate() {
        let n = chunk.min(slots - start);
        let meta = BatchMeta::single_sequence(
            0,
            n,
            (start as u32..(start + n) as u32).collect(),
            (0..spec.num_blocks as u32).collect(),
            spec.block_size_tokens,
            Vec::new(),
        );
        let qkv = backend.random_bf16(vec![n, dims.qkv_size()], seed + i as u64, 1.0, 0.0)?;
        let prepared = backend.prepare_batch(&meta, spec.num_blocks)?;
        backend.write_kv(cache, &qkv, dims, &prepared)?;
    }
    Ok(())
}

/// Fills a cache with N(0, 1) values.
pub fn fill_cache(
    backend: &CudaBackend,
    cache: &mut CudaKvCache,
    seed: u64,
) -> Result<(), CudaError> {
    backend.fill_normal_slice(&mut cache.keys, seed, 1.0)?;
    backend.fill_normal_slice(&mut cache.values, seed ^ 0x5555, 1.0)
}

/// KV-write timing against a plain device copy of the same payload.
#[derive(Debug, Clone, serde::Serialize)]
pub struct KvWriteRow {
    /// The cache element: "bf16" or "fp8".
    pub dtype: &'static str,
    /// Tokens written.
    pub tokens: usize,
    /// KV heads × head dim per token.
    pub kv_width: usize,
    /// Median time of the paged write.
    pub write_ms: f64,
    /// Median time of a device-to-device copy of the same K+V bytes.
    pub copy_ms: f64,
    /// `write_ms / copy_ms` (the prior work's cache write cost 99× a copy).
    pub ratio_to_copy: f64,
}

/// Times `write_kv` of `tokens` tokens into shuffled slots vs `memcpy_dtod` of the same bytes.
pub fn bench_kv_write(
    backend: &CudaBackend,
    dims: AttentionDims,
    tokens: usize,
) -> Result<KvWriteRow, CudaError> {
    bench_kv_write_in(backend, dims, tokens, CacheDtype::BF16)
}

/// [`bench_kv_write`] into a cache of `dtype`, against a copy of the bytes it stores.
pub fn bench_kv_write_in(
    backend: &CudaBackend,
    dims: AttentionDims,
    tokens: usize,
    dtype: CacheDtype,
) -> Result<KvWriteRow, CudaError> {
    let block_size = 16;
    let meta = attention_meta(1, tokens, tokens, block_size);
    let num_blocks = tokens.div_ceil(block_size);
    let spec = starling_backend::KvCacheSpec::full(
        num_blocks,
        block_size,
        dims.num_kv_heads,
        dims.head_dim,
        dtype,
    );
    let mut cache = backend.alloc_kv_cache(&spec)?;
    let qkv = backend.random_bf16(vec![tokens, dims.qkv_size()], 5, 1.0, 0.0)?;
    let prepared = backend.prepare_batch(&meta, num_blocks)?;
    let write_ms = time_ms(backend, 3, 20, || {
        backend.write_kv(&mut cache, &qkv, &dims, &prepared)?;
        Ok(())
    })?;
    // bf16 words of the K+V bytes the cache stores.
    let payload = dtype.bytes_for((2 * tokens * dims.kv_size()) as u64) as usize / 2;
    let src = backend.stream().alloc_zeros::<bf16>(payload)?;
    let mut dst = backend.stream().alloc_zeros::<bf16>(payload)?;
    let copy_ms = time_ms(backend, 3, 20, || {
        Ok(backend.stream().memcpy_dtod(&src, &mut dst)?)
    })?;
    Ok(KvWriteRow {
        dtype: dtype_name(dtype),
        tokens,
        kv_width: dims.kv_size(),
        write_ms,
        copy_ms,
        ratio_to_copy: write_ms / copy_ms,
    })
}

/// The uncompressed cache dtype the CUDA backend uses (for byte counts).
pub const CACHE_DTYPE: CacheDtype = CacheDtype::BF16;
