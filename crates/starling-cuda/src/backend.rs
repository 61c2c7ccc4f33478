//! [`CudaBackend`]: the `Backend` ops on one GPU, on one stream.

use std::sync::atomic::AtomicBool;
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use half::bf16;
use starling_backend::sampling::{RowOutcome, RowSamplingParams};
use starling_backend::{
    AttentionDims, BackendCore, BackendError, BatchMeta, DecodeGraphConfig, DecodeGraphs,
    DeviceSampling, GraphCapture, HeadSpan, HostTensor, KeepPlan, KeyScoreKind, KvCacheOps,
    KvCacheSpec, KvRows, LatentFactors, ModelOps, RopeSpec, WindowScoreSpec,
};
use starling_kv::CacheDtype;

use crate::kernel_profile::KernelProfiler;
use crate::kernels::Kernels;
use crate::recording_pool::RecordingPool;
use crate::{cuda_available, CudaError, CudaTensor, KernelCache};

/// Threads per block of the elementwise kernels (grid-stride loops).
const ELEMENTWISE_THREADS: u32 = 256;

/// Launches `$f` on the backend's stream with the given arguments, in the kernel's order, with
/// programmatic dependent launch where the device has it (`crate::launch`).
macro_rules! launch {
    ($self:expr, $f:expr, $cfg:expr, $($arg:expr),* $(,)?) => {{
        let mut args = $crate::launch::KernelArgs::new(&$self.stream);
        // One binding per argument: `let x = &temporary;` keeps a temporary (e.g. a batch view)
        // alive until the launch.
        $( let arg = $arg; args.push(arg); )*
        let function: &cudarc::driver::CudaFunction = $f;
        let backend: &$crate::backend::CudaBackend = $self;
        backend.profiled(
            || backend.kernels.site_name(function),
            // SAFETY: each call site passes the arguments its kernel declares, in order, with
            // buffers sized for the launch geometry it computes; every kernel starts with
            // `pdl_entry()` (tests/nvrtc_compile.rs checks).
            || unsafe { args.launch(function, $cfg, backend.pdl) }.map_err(CudaError::from),
        )
    }};
}

mod attention;
mod attention_plan;
mod batch;
mod buffers;
mod profile;
// After `launch!`, which they use.
mod gemm;
mod graphs;
mod head_norm;
mod key_scores;
mod kv_cache;
mod kv_ops;
mod latent;
mod latent_plan;
mod latent_reconstruct;
mod latent_scores;
mod linear;
mod rope;
mod rows;
mod sampling;
mod select_keep;

pub use batch::CudaBatch;
pub use graphs::{CudaDecodeGraphs, GraphCensus};
pub use kv_cache::CudaKvCache;
pub use latent_scores::{LatentScoreKernel, LATENT_SCORES_ENV};
use linear::GEMV_PREFETCH_BYTES;
pub use linear::{
    GEMM_BIAS_ENV, GEMM_BIAS_EPILOGUE_MAX_ROWS, GEMM_BIAS_EPILOGUE_MAX_ROWS_ENV, GEMV_KSPLIT_ENV,
    GEMV_PREFETCH_ENV,
};

/// Where attention reads full keys and values: a cache through the batch's block tables, or a
/// latent layer's reconstructed context through its scratch tables.
pub(crate) struct KvSource<'a> {
    pub(crate) keys: &'a CudaSlice<bf16>,
    pub(crate) values: &'a CudaSlice<bf16>,
    /// What the planes hold (the kernels' instantiation).
    pub(crate) elem: crate::kernels::CacheElem,
    /// `[sequences, max_blocks]`.
    pub(crate) block_tables: cudarc::driver::CudaView<'a, u32>,
    pub(crate) max_blocks: usize,
}

/// cuBLAS workspace bytes (NVIDIA's recommendation for Hopper). Set explicitly so that eager
/// and graph-captured GEMMs use the same workspace, hence the same algorithms.
const BLAS_WORKSPACE_BYTES: usize = 32 << 20;

/// A RoPE frequency table on the host and its device copy.
type RopeTable = (Vec<f32>, Arc<CudaSlice<f32>>);
/// The latent kernels' cos/sin table: its frequencies, the positions it covers, its device copy.
type LatentRopeTable = (Vec<f32>, usize, Arc<CudaSlice<f32>>);

/// One GPU's backend.
pub struct CudaBackend {
    ctx: Arc<CudaContext>,
    stream: Arc<CudaStream>,
    blas: CudaBlas,
    /// cuBLAS's workspace; declared after `blas` so the handle goes first.
    _blas_workspace: CudaSlice<u8>,
    /// cuBLASLt, for GEMMs with the bias added in their epilogue ([`linear::GEMM_BIAS_ENV`]);
    /// `None` where its handle could not be made or the variable turns it off (a separate bias
    /// launch then follows the cuBLAS GEMM).
    blas_lt: Option<cudarc::cublaslt::CudaBlasLT>,
    /// The most rows a GEMM takes its bias in the cuBLASLt epilogue for
    /// ([`linear::GEMM_BIAS_EPILOGUE_MAX_ROWS`]).
    bias_epilogue_max_rows: usize,
    /// Set while a decode step is being recorded into a CUDA graph: a host upload then would be
    /// recorded with a pointer to host memory that is gone by the replay, so uploads fail instead.
    recording: AtomicBool,
    kernels: Kernels,
    /// Whether kernels are launched with programmatic dependent launch ([`crate::launch`]).
    pdl: bool,
    /// Warps per matrix-vector column forced by [`GEMV_KSPLIT_ENV`] (for A/B runs), else chosen
    /// per launch by [`gemv_ksplit`].
    forced_gemv_ksplit: Option<usize>,
    /// Warps the GPU can hold at once (SMs × the most threads an SM holds / 32).
    max_resident_warps: usize,
    /// Per-warp L2 prefetch of the matrix-vector kernels: [`GEMV_PREFETCH_BYTES`] unless
    /// [`GEMV_PREFETCH_ENV`] sets it (for A/B runs).
    gemv_prefetch_bytes: usize,
    num_sms: usize,
    /// Whether the device converts fp8 in hardware (sm_89+), which an fp8 cache needs.
    fp8_cache: bool,
    /// Which latent score kernel decode rows use ([`LatentScoreKernel`]).
    latent_score_kernel: latent_scores::ScoreKernelFlag,
    name: String,
    /// The RoPE frequency tables uploaded so far: one for most models, two for Gemma-3 (its
    /// windowed layers' local base), kept so a recorded decode graph never uploads.
    rope_tables: Mutex<Vec<RopeTable>>,
    /// The latent kernels' cos/sin table: its frequencies, positions covered, device copy.
    latent_rope_table: Mutex<Option<LatentRopeTable>>,
    /// While a decode graph is recorded, the pool its passes allocate from
    /// ([`RecordingPool`]): a recorded graph then holds no memory nodes.
    recording_pool: Mutex<Option<Arc<RecordingPool>>>,
    /// Device time per launch site, while a kernel profile runs ([`KernelProfiler`]).
    profiler: KernelProfiler,
}

fn err(e: impl Into<CudaError>) -> BackendError {
    BackendError::from(e.into())
}

fn grid_for(n: usize) -> LaunchConfig {
    let blocks = n
        .div_ceil(ELEMENTWISE_THREADS as usize)
        .clamp(1, 65_535 * 8) as u32;
    LaunchConfig {
        grid_dim: (blocks, 1, 1),
        block_dim: (ELEMENTWISE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// One block per row. Callers return early for zero rows: a row kernel launched anyway would
/// read and write a whole row of a one-element placeholder buffer (`alloc_bf16(0)` allocates one
/// element), corrupting whatever the memory pool put next to it. That happened: non-final
/// prefill chunks sample nothing, and the final RMSNorm of their zero logits rows overwrote
/// live device memory (garbage past ~20k-token prompts on Qwen2.5-1.5B). A zero grid is an
/// invalid launch, so a missing guard now fails loudly instead.
fn rows_config(rows: usize, threads: u32) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (rows as u32, 1, 1),
        block_dim: (threads, 1, 1),
        shared_mem_bytes: 0,
    }
}

/// Threads per block of the one-block-per-row kernels that move a row of `width` bf16 in
/// 16-byte chunks (norms, row gathers, `write_kv`): one chunk each, up to a full block, at least
/// a warp (`norm_vectorised` in ops.cu relies on at most 4 chunks per thread).
fn row_chunk_threads(width: usize) -> u32 {
    width.div_ceil(8).next_multiple_of(32).clamp(32, 1024) as u32
}

impl CudaBackend {
    /// Opens GPU `ordinal`, creates its stream and cuBLAS handle, and loads (compiling on first
    /// use, then from the disk cache) every kernel for the device's architecture.
    pub fn new(ordinal: usize) -> Result<Self, CudaError> {
        if !cuda_available() {
            return Err(CudaError::Unavailable(
                "the CUDA driver library (libcuda) is not installed".into(),
            ));
        }
        let count =
            CudaContext::device_count().map_err(|e| CudaError::Unavailable(e.to_string()))?;
        if ordinal >= count.max(0) as usize {
            return Err(CudaError::Unavailable(format!(
                "GPU {ordinal} requested, {count} present"
            )));
        }
        let ctx = CudaContext::new(ordinal)?;
        if let Some(bytes) = crate::mem_pool::requested_release_threshold()? {
            crate::mem_pool::set_release_threshold(ordinal, bytes)?;
            tracing::info!("memory pool release threshold: {bytes} bytes");
        }
        // One stream of our own: stream capture (CUDA graphs) is impossible on the legacy default
        // stream. Everything runs on it, so cudarc's cross-stream event tracking is only cost
        // (and waits on events recorded before a capture would break it): off, before any
        // allocation.
        // SAFETY: the backend uses this single stream for every buffer and op.
        unsafe { ctx.disable_event_tracking() };
        let stream = ctx.new_stream()?;
        let blas = CudaBlas::new(stream.clone())?;
        // SAFETY: only allocates; cuBLAS writes the workspace before reading it.
        let blas_workspace = unsafe { stream.alloc::<u8>(BLAS_WORKSPACE_BYTES) }?;
        {
            let (ptr, _guard) = blas_workspace.device_ptr(&stream);
            // SAFETY: a live device buffer of the given size, kept for the handle's lifetime.
            unsafe {
                cudarc::cublas::sys::cublasSetWorkspace_v2(
                    *blas.handle(),
                    ptr as *mut _,
                    BLAS_WORKSPACE_BYTES,
                )
            }
            .result()?;
        }
        let blas_lt = linear::make_blas_lt(&stream);
        let (major, minor) = ctx.compute_capability()?;
        // NVRTC wants a &'static str; one small leak per backend created.
        let arch: &'static str = Box::leak(format!("sm_{major}{minor}").into_boxed_str());
        let kernels = Kernels::load(&ctx, &KernelCache::from_env(), arch)?;
        let num_sms =
            ctx.attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT)? as usize;
        let threads_per_sm = ctx
            .attribute(CUdevice_attribute::CU_DEVICE_ATTRIBUTE_MAX_THREADS_PER_MULTIPROCESSOR)?
            as usize;
        let name = format!("cuda:{ordinal} ({}, {arch})", ctx.name()?);
        Ok(Self {
            ctx,
            stream,
            blas,
            _blas_workspace: blas_workspace,
            blas_lt,
            bias_epilogue_max_rows: linear::bias_epilogue_max_rows(),
            recording: AtomicBool::new(false),
            kernels,
            pdl: crate::launch::pdl_enabled(major),
            forced_gemv_ksplit: std::env::var(GEMV_KSPLIT_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .filter(|k| crate::kernels::GEMV_KSPLITS.contains(k)),
            max_resident_warps: num_sms * threads_per_sm / 32,
            gemv_prefetch_bytes: std::env::var(GEMV_PREFETCH_ENV)
                .ok()
                .and_then(|v| v.trim().parse().ok())
                .unwrap_or(GEMV_PREFETCH_BYTES),
            num_sms,
            fp8_cache: (major, minor) >= (8, 9),
            name,
            rope_tables: Mutex::new(Vec::new()),
            latent_rope_table: Mutex::new(None),
            recording_pool: Mutex::new(None),
            profiler: KernelProfiler::default(),
            latent_score_kernel: latent_scores::ScoreKernelFlag::new(LatentScoreKernel::from_env()),
        })
    }

    /// Whether kernels are launched with programmatic dependent launch (sm_90+, unless
    /// [`crate::PDL_ENV`] is `0`).
    pub fn programmatic_launch(&self) -> bool {
        self.pdl
    }

    /// The stream every op runs on.
    pub fn stream(&self) -> &Arc<CudaStream> {
        &self.stream
    }

    /// The device context.
    pub fn context(&self) -> &Arc<CudaContext> {
        &self.ctx
    }

    /// Waits for all queued work (and surfaces asynchronous kernel errors).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        Ok(self.stream.synchronize()?)
    }
}

impl BackendCore for CudaBackend {
    type Tensor = CudaTensor;

    type KvCache = CudaKvCache;

    type Batch = CudaBatch;

    fn name(&self) -> String {
        self.name.clone()
    }

    fn kv_cache_dtype(&self) -> CacheDtype {
        CacheDtype::BF16
    }

    fn memory_info(&self) -> Option<(u64, u64)> {
        self.ctx
            .mem_get_info()
            .ok()
            .map(|(free, total)| (free as u64, total as u64))
    }

    fn upload(&self, host: &HostTensor) -> Result<CudaTensor, BackendError> {
        self.upload_impl(host)
    }

    fn random_tensor(
        &self,
        shape: Vec<usize>,
        seed: u64,
        std: f32,
        mean: f32,
    ) -> Result<CudaTensor, BackendError> {
        self.random_bf16(shape, seed, std, mean).map_err(err)
    }

    fn to_host(&self, t: &CudaTensor) -> Result<HostTensor, BackendError> {
        self.to_host_impl(t)
    }

    fn alloc_kv_cache(&self, spec: &KvCacheSpec) -> Result<CudaKvCache, BackendError> {
        self.alloc_kv_cache_impl(spec).map_err(err)
    }

    fn prepare_batch(
        &self,
        meta: &BatchMeta,
        num_cache_blocks: usize,
    ) -> Result<CudaBatch, BackendError> {
        meta.validate(num_cache_blocks)?;
        CudaBatch::upload(&self.stream, meta).map_err(err)
    }

    fn start_kernel_profile(&self) -> Result<bool, BackendError> {
        self.profiler.start();
        Ok(true)
    }

    fn kernel_profile(&self) -> Result<Vec<starling_backend::KernelSiteTime>, BackendError> {
        self.profiler.snapshot().map_err(err)
    }
}

impl ModelOps for CudaBackend {
    fn embedding(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor, BackendError> {
        self.embedding_impl(table, ids)
    }

    fn embedding_for_batch(
        &self,
        table: &CudaTensor,
        ids: &[u32],
        batch: &CudaBatch,
    ) -> Result<CudaTensor, BackendError> {
        self.embedding_for_batch_impl(table, ids, batch)
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor, BackendError> {
        self.linear_impl(x, w, bias)
    }

    fn logits(&self, x: &CudaTensor, w: &CudaTensor) -> Result<CudaTensor, BackendError> {
        self.gemm_bf16(x, w, true).map_err(err)
    }

    fn rms_norm(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, BackendError> {
        self.rms_norm_impl(x, w, eps)
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        delta: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, BackendError> {
        self.add_rms_norm_impl(residual, delta, w, eps)
    }

    fn rms_norm_heads(
        &self,
        x: &mut CudaTensor,
        w: &CudaTensor,
        span: HeadSpan,
        eps: f32,
    ) -> Result<(), BackendError> {
        head_norm::rms_norm_heads(self, x, w, span, eps)
    }

    fn add_inplace(&self, x: &mut CudaTensor, delta: &CudaTensor) -> Result<(), BackendError> {
        self.add_inplace_impl(x, delta)
    }

    fn silu_mul(&self, gate_up: &CudaTensor) -> Result<CudaTensor, BackendError> {
        self.gated_mul_impl(gate_up, &self.kernels.silu_mul, "silu_mul")
    }

    fn gelu_tanh_mul(&self, gate_up: &CudaTensor) -> Result<CudaTensor, BackendError> {
        self.gated_mul_impl(gate_up, &self.kernels.gelu_tanh_mul, "gelu_tanh_mul")
    }

    fn scale_inplace(&self, x: &mut CudaTensor, factor: f32) -> Result<(), BackendError> {
        self.scale_inplace_impl(x, factor)
    }

    fn linear_swiglu(
        &self,
        x: &CudaTensor,
        gate_up: &CudaTensor,
    ) -> Result<CudaTensor, BackendError> {
        self.linear_swiglu_impl(x, gate_up)
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[u32]) -> Result<CudaTensor, BackendError> {
        self.gather_rows_impl(x, rows)
    }

    fn rope_qk(
        &self,
        qkv: &mut CudaTensor,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        self.rope_qk_impl(qkv, dims, rope, batch)
    }

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        qkv: &CudaTensor,
        dims: &AttentionDims,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        self.write_kv_impl(cache, qkv, dims, batch)
    }

    fn rope_qk_write_kv(
        &self,
        qkv: &mut CudaTensor,
        cache: &mut CudaKvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        self.rope_qk_write_kv_impl(qkv, cache, dims, rope, batch)
    }

    fn paged_attention(
        &self,
        qkv: &CudaTensor,
        cache: &CudaKvCache,
        dims: &AttentionDims,
        batch: &CudaBatch,
    ) -> Result<CudaTensor, BackendError> {
        self.full_paged_attention(qkv, cache, dims, batch)
    }

    fn rope_q_write_latents(
        &self,
        qkv: &mut CudaTensor,
        cache: &mut CudaKvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        self.rope_q_write_latents_impl(qkv, cache, dims, rope, batch)
            .map_err(err)
    }

    fn latent_attention(
        &self,
        qkv: &CudaTensor,
        cache: &CudaKvCache,
        factors: &LatentFactors<'_, CudaTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<CudaTensor, BackendError> {
        self.latent_attention_impl(qkv, cache, factors, dims, rope, batch)
            .map_err(err)
    }
}

impl KvCacheOps for CudaBackend {
    fn copy_kv_blocks(
        &self,
        cache: &mut CudaKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), BackendError> {
        self.copy_kv_blocks_impl(cache, pairs).map_err(err)
    }

    fn gather_kv(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<KvRows<CudaTensor>, BackendError> {
        self.gather_kv_impl(cache, block_table, block_size_tokens, len_tokens)
            .map_err(err)
    }

    fn scatter_kv(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        rows: &KvRows<CudaTensor>,
    ) -> Result<(), BackendError> {
        self.scatter_kv_impl(cache, block_table, block_size_tokens, rows)
            .map_err(err)
    }

    fn compact_kv(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        physical_len_tokens: usize,
        keep: &[Vec<u32>],
    ) -> Result<(), BackendError> {
        self.compact_kv_impl(
            cache,
            block_table,
            block_size_tokens,
            physical_len_tokens,
            keep,
        )
        .map_err(err)
    }

    fn compact_kv_by_scores(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        scores: &CudaTensor,
        plan: &KeepPlan,
    ) -> Result<(), BackendError> {
        self.compact_kv_by_scores_impl(cache, block_table, block_size_tokens, scores, plan)
            .map_err(err)
    }

    fn read_keys(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<HostTensor, BackendError> {
        self.read_keys_impl(cache, block_table, block_size_tokens, len_tokens)
            .map_err(err)
    }

    fn key_scores(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<CudaTensor, BackendError> {
        self.key_scores_impl(cache, block_table, block_size_tokens, len_tokens, kind)
            .map_err(err)
    }

    fn window_scores(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        queries: &HostTensor,
        spec: &WindowScoreSpec,
    ) -> Result<CudaTensor, BackendError> {
        self.window_scores_impl(
            cache,
            block_table,
            block_size_tokens,
            len_tokens,
            queries,
            spec,
        )
        .map_err(err)
    }

    fn reconstruct_kv(
        &self,
        latent: &CudaKvCache,
        factors: &LatentFactors<'_, CudaTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        block_table: &[u32],
        len_tokens: usize,
        dense: &mut CudaKvCache,
        dense_table: &[u32],
    ) -> Result<(), BackendError> {
        self.reconstruct_kv_impl(
            latent,
            factors,
            dims,
            rope,
            block_table,
            len_tokens,
            dense,
            dense_table,
        )
        .map_err(err)
    }
}

impl DeviceSampling for CudaBackend {
    fn sample_rows(
        &self,
        logits: &CudaTensor,
        rows: &[RowSamplingParams],
    ) -> Result<Vec<RowOutcome>, BackendError> {
        self.sample_rows_impl(logits, rows).map_err(err)
    }

    fn logits_rows_to_host(
        &self,
        logits: &CudaTensor,
        rows: &[u32],
    ) -> Result<HostTensor, BackendError> {
        self.logits_rows_to_host_impl(logits, rows).map_err(err)
    }
}

impl GraphCapture for CudaBackend {
    fn decode_graphs(
        &self,
        config: &DecodeGraphConfig,
    ) -> Result<Option<Box<dyn DecodeGraphs<Self>>>, BackendError> {
        Ok(Some(Box::new(CudaDecodeGraphs::new(config).map_err(err)?)))
    }
}
