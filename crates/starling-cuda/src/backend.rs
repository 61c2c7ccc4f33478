//! [`CudaBackend`]: the `Backend` ops on one GPU, on one stream.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use cudarc::cublas::CudaBlas;
use cudarc::driver::sys::CUdevice_attribute;
use cudarc::driver::{CudaContext, CudaSlice, CudaStream, DevicePtr, LaunchConfig};
use half::bf16;
use rayon::prelude::*;
use starling_backend::sampling::{RowOutcome, RowSamplingParams};
use starling_backend::{
    AttentionDims, Backend, BackendError, BatchMeta, DecodeGraphConfig, DecodeGraphs, HostTensor,
    KeyScoreKind, KvCacheSpec, KvRows, LatentFactors, RopeSpec, RopeStyle, WindowScoreSpec,
};
use starling_kv::CacheDtype;

use crate::kernels::Kernels;
use crate::recording_pool::RecordingPool;
use crate::{cuda_available, CudaError, CudaTensor, DeviceBuf, KernelCache};

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
        // SAFETY: each call site passes the arguments its kernel declares, in order, with
        // buffers sized for the launch geometry it computes; every kernel starts with
        // `pdl_entry()` (tests/nvrtc_compile.rs checks).
        unsafe { args.launch($f, $cfg, $self.pdl) }.map_err(CudaError::from)
    }};
}

mod attention;
mod attention_plan;
mod batch;
// After `launch!`, which they use.
mod gemm;
mod graphs;
mod key_scores;
mod kv_cache;
mod kv_ops;
mod latent;
mod latent_reconstruct;
mod latent_scores;
mod linear;
mod sampling;

pub use batch::CudaBatch;
pub use graphs::{CudaDecodeGraphs, GraphCensus};
pub use kv_cache::CudaKvCache;
pub use latent_scores::{LatentScoreKernel, LATENT_SCORES_ENV};
use linear::GEMV_PREFETCH_BYTES;
pub use linear::{GEMV_KSPLIT_ENV, GEMV_PREFETCH_ENV};

/// Where attention reads full keys and values: a cache through the batch's block tables, or a
/// latent layer's reconstructed context through its scratch tables.
pub(crate) struct KvSource<'a> {
    pub(crate) keys: &'a CudaSlice<bf16>,
    pub(crate) values: &'a CudaSlice<bf16>,
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
    /// Which latent score kernel decode rows use ([`LatentScoreKernel`]).
    latent_score_kernel: latent_scores::ScoreKernelFlag,
    name: String,
    /// The last RoPE frequency table uploaded (every layer passes the same one).
    rope_table: Mutex<Option<RopeTable>>,
    /// The latent kernels' cos/sin table: its frequencies, positions covered, device copy.
    latent_rope_table: Mutex<Option<LatentRopeTable>>,
    /// While a decode graph is recorded, the pool its passes allocate from
    /// ([`RecordingPool`]): a recorded graph then holds no memory nodes.
    recording_pool: Mutex<Option<Arc<RecordingPool>>>,
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

/// The `(rows, width)` of a fused QKV tensor RoPE can rotate for `batch`: the QKV width, one row
/// per batch token, and a frequency per pair of a head.
fn rope_rows(
    qkv: &CudaTensor,
    dims: &AttentionDims,
    rope: &RopeSpec,
    batch: &CudaBatch,
) -> Result<(usize, usize), BackendError> {
    let (n, width) = qkv.matrix_dims().map_err(err)?;
    if width != dims.qkv_size()
        || n != batch.meta.num_tokens()
        || rope.inv_freqs.len() * 2 != dims.head_dim
    {
        return Err(BackendError::Shape(format!(
            "rope: [{n}, {width}] for {dims:?} and {} frequencies",
            rope.inv_freqs.len()
        )));
    }
    Ok((n, width))
}

/// Threads per block of `rope_qk_bf16` and `rope_write_kv_bf16`, whose grid is (token, chunk of
/// per-token work items).
const ROPE_THREADS: u32 = 256;

/// The launch of a RoPE kernel over `tokens` rows of `items_per_token` work items (rotated pairs,
/// plus copied K/V pairs for the fused write).
fn rope_grid(tokens: usize, items_per_token: usize) -> LaunchConfig {
    LaunchConfig {
        grid_dim: (
            tokens as u32,
            items_per_token.div_ceil(ROPE_THREADS as usize) as u32,
            1,
        ),
        block_dim: (ROPE_THREADS, 1, 1),
        shared_mem_bytes: 0,
    }
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
            name,
            rope_table: Mutex::new(None),
            latent_rope_table: Mutex::new(None),
            recording_pool: Mutex::new(None),
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

    /// Copies a host tensor to the device in f32, the dtype [`Backend::logits`] returns (logits
    /// for the sampling op in tests and tools; [`Backend::upload`] converts to bf16).
    pub fn upload_f32(&self, host: &HostTensor) -> Result<CudaTensor, CudaError> {
        let buf = if host.numel() == 0 {
            self.stream.alloc_zeros::<f32>(1)?
        } else {
            self.stream.clone_htod(host.data())?
        };
        Ok(self.tensor(DeviceBuf::F32(buf), host.shape().to_vec()))
    }

    /// A device tensor of N(mean, std) bf16 values made on the GPU (synthetic weights: no host
    /// copy, no transfer).
    pub fn random_bf16(
        &self,
        shape: Vec<usize>,
        seed: u64,
        std: f32,
        mean: f32,
    ) -> Result<CudaTensor, CudaError> {
        let n: usize = shape.iter().product();
        let mut buf = self.alloc_bf16(n)?;
        launch!(
            self,
            &self.kernels.fill_normal,
            grid_for(n),
            &mut buf,
            &n,
            &seed,
            &std,
            &mean
        )?;
        Ok(self.tensor(DeviceBuf::Bf16(buf), shape))
    }

    /// Overwrites a device buffer with N(0, `std`) values (benchmarks fill caches this way).
    pub fn fill_normal_slice(
        &self,
        buf: &mut CudaSlice<bf16>,
        seed: u64,
        std: f32,
    ) -> Result<(), CudaError> {
        let n = buf.len();
        let mean = 0.0f32;
        launch!(
            self,
            &self.kernels.fill_normal,
            grid_for(n),
            buf,
            &n,
            &seed,
            &std,
            &mean
        )
    }

    /// An uninitialised buffer of `n` bf16 (at least one), for a tensor built by
    /// [`CudaBackend::tensor`]: from the recording pool while a decode graph is recorded.
    fn alloc_bf16(&self, n: usize) -> Result<CudaSlice<bf16>, CudaError> {
        self.alloc_for_tensor(n)
    }

    /// As [`CudaBackend::alloc_bf16`], f32.
    fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>, CudaError> {
        self.alloc_for_tensor(n)
    }

    fn alloc_for_tensor<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        if let Some(pool) = self.active_pool() {
            // SAFETY: every caller fully overwrites the buffer before it is read, and wraps it in
            // a tensor through `tensor`, which hands it back to the pool on drop.
            if let Some(buf) = unsafe { pool.take::<T>(n) }? {
                return Ok(buf);
            }
        }
        // SAFETY: every caller fully overwrites the buffer before it is read.
        Ok(unsafe { self.stream.alloc::<T>(n.max(1)) }?)
    }

    /// The recording pool, while a decode graph is recorded.
    fn active_pool(&self) -> Option<Arc<RecordingPool>> {
        self.recording_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes (`Some`) or clears (`None`) the pool the backend's tensors allocate from.
    pub(crate) fn set_recording_pool(&self, pool: Option<Arc<RecordingPool>>) {
        *self
            .recording_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = pool;
    }

    /// A tensor of `buf`: one the recording pool lent goes back to it on drop; any other is
    /// freed with the tensor. Every tensor the backend makes is made here.
    pub(crate) fn tensor(&self, buf: DeviceBuf, shape: Vec<usize>) -> CudaTensor {
        match self.active_pool() {
            Some(pool) if pool.lent(&buf) => CudaTensor::pooled(buf, shape, pool),
            _ => CudaTensor::new(buf, shape),
        }
    }

    /// Refuses host uploads while a decode graph is being recorded (see `recording`).
    fn check_not_recording(&self, what: &str) -> Result<(), CudaError> {
        if self.recording.load(Ordering::Relaxed) {
            return Err(CudaError::Shape(format!(
                "{what} would upload host data while a CUDA graph is being recorded"
            )));
        }
        Ok(())
    }

    fn upload_u32(&self, v: &[u32]) -> Result<CudaSlice<u32>, CudaError> {
        self.check_not_recording("an index upload")?;
        if v.is_empty() {
            return Ok(self.stream.clone_htod(&[0u32][..])?);
        }
        Ok(self.stream.clone_htod(v)?)
    }

    fn rope_freqs(&self, inv_freqs: &[f32]) -> Result<Arc<CudaSlice<f32>>, CudaError> {
        let mut guard = self
            .rope_table
            .lock()
            .map_err(|_| CudaError::Shape("rope table lock poisoned".into()))?;
        if let Some((host, dev)) = guard.as_ref() {
            if host.as_slice() == inv_freqs {
                return Ok(dev.clone());
            }
        }
        self.check_not_recording("the RoPE table")?;
        let dev = Arc::new(self.stream.clone_htod(inv_freqs)?);
        *guard = Some((inv_freqs.to_vec(), dev.clone()));
        Ok(dev)
    }
}

impl Backend for CudaBackend {
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
        let data: Vec<bf16> = host.data().par_iter().map(|&v| bf16::from_f32(v)).collect();
        let buf = if data.is_empty() {
            self.alloc_bf16(1).map_err(err)?
        } else {
            self.stream.clone_htod(&data).map_err(err)?
        };
        Ok(self.tensor(DeviceBuf::Bf16(buf), host.shape().to_vec()))
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
        let n = t.numel();
        let data = match t.buf() {
            DeviceBuf::Bf16(b) => {
                let v: Vec<bf16> = self.stream.clone_dtoh(b).map_err(err)?;
                v[..n].iter().map(|x| x.to_f32()).collect()
            }
            DeviceBuf::F32(b) => {
                let mut v: Vec<f32> = self.stream.clone_dtoh(b).map_err(err)?;
                v.truncate(n);
                v
            }
        };
        HostTensor::new(t.shape().to_vec(), data)
    }

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

    fn embedding(&self, table: &CudaTensor, ids: &[u32]) -> Result<CudaTensor, BackendError> {
        let (vocab, d) = table.matrix_dims().map_err(err)?;
        if let Some(bad) = ids.iter().find(|&&i| i as usize >= vocab) {
            return Err(BackendError::Shape(format!(
                "token id {bad} outside a vocabulary of {vocab}"
            )));
        }
        self.gather_rows(table, ids).map(|mut t| {
            t.set_shape(vec![ids.len(), d]);
            t
        })
    }

    fn embedding_for_batch(
        &self,
        table: &CudaTensor,
        ids: &[u32],
        batch: &CudaBatch,
    ) -> Result<CudaTensor, BackendError> {
        if batch.replay.is_none() {
            return self.embedding(table, ids);
        }
        // A replay batch holds the step's ids (checked against the vocabulary by the runner).
        let (vocab, d) = table.matrix_dims().map_err(err)?;
        let rows = batch.meta.num_tokens();
        if ids.len() != rows || vocab == 0 {
            return Err(BackendError::Shape(format!(
                "embedding: {} ids for a replay batch of {rows} rows",
                ids.len()
            )));
        }
        let mut out = self.alloc_bf16(rows * d).map_err(err)?;
        let d_i = d as i32;
        launch!(
            self,
            &self.kernels.gather_rows,
            rows_config(rows, row_chunk_threads(d)),
            table.bf16().map_err(err)?,
            &batch.token_ids(),
            &mut out,
            &d_i
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![rows, d]))
    }

    fn decode_graphs(
        &self,
        config: &DecodeGraphConfig,
    ) -> Result<Option<Box<dyn DecodeGraphs<Self>>>, BackendError> {
        Ok(Some(Box::new(CudaDecodeGraphs::new(config).map_err(err)?)))
    }

    fn linear(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor, BackendError> {
        // Small batches: one kernel with the bias fused.
        if let Some(y) = self.try_gemv(x, w, bias, false).map_err(err)? {
            return Ok(y);
        }
        let mut y = self.gemm_bf16(x, w, false).map_err(err)?;
        if let Some(b) = bias {
            let (rows, cols) = (y.shape()[0], y.shape()[1]);
            if b.numel() != cols {
                return Err(BackendError::Shape(format!(
                    "linear: bias of {} for {cols} outputs",
                    b.numel()
                )));
            }
            let n = rows * cols;
            let cols_i = cols as i32;
            let bb = b.bf16().map_err(err)?;
            let yb = y.bf16_mut().map_err(err)?;
            launch!(
                self,
                &self.kernels.add_bias,
                grid_for(n),
                yb,
                bb,
                &rows,
                &cols_i
            )
            .map_err(err)?;
        }
        Ok(y)
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
        let (rows, d) = x.matrix_dims().map_err(err)?;
        if w.numel() != d {
            return Err(BackendError::Shape(format!(
                "rms_norm: weight of {} for rows of {d}",
                w.numel()
            )));
        }
        let mut out = self.alloc_bf16(rows * d).map_err(err)?;
        if rows == 0 {
            return Ok(self.tensor(DeviceBuf::Bf16(out), x.shape().to_vec()));
        }
        let d_i = d as i32;
        launch!(
            self,
            &self.kernels.rms_norm,
            rows_config(rows, row_chunk_threads(d)),
            x.bf16().map_err(err)?,
            w.bf16().map_err(err)?,
            &mut out,
            &d_i,
            &eps
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), x.shape().to_vec()))
    }

    fn add_rms_norm(
        &self,
        residual: &mut CudaTensor,
        delta: &CudaTensor,
        w: &CudaTensor,
        eps: f32,
    ) -> Result<CudaTensor, BackendError> {
        let (rows, d) = residual.matrix_dims().map_err(err)?;
        if delta.shape() != residual.shape() || w.numel() != d {
            return Err(BackendError::Shape(format!(
                "add_rms_norm: {:?} + {:?}, weight {}",
                residual.shape(),
                delta.shape(),
                w.numel()
            )));
        }
        let mut out = self.alloc_bf16(rows * d).map_err(err)?;
        let d_i = d as i32;
        let shape = residual.shape().to_vec();
        if rows == 0 {
            return Ok(self.tensor(DeviceBuf::Bf16(out), shape));
        }
        let (db, wb) = (delta.bf16().map_err(err)?, w.bf16().map_err(err)?);
        let rb = residual.bf16_mut().map_err(err)?;
        launch!(
            self,
            &self.kernels.add_rms_norm,
            rows_config(rows, row_chunk_threads(d)),
            rb,
            db,
            wb,
            &mut out,
            &d_i,
            &eps
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), shape))
    }

    fn add_inplace(&self, x: &mut CudaTensor, delta: &CudaTensor) -> Result<(), BackendError> {
        if x.shape() != delta.shape() {
            return Err(BackendError::Shape(format!(
                "add: {:?} vs {:?}",
                x.shape(),
                delta.shape()
            )));
        }
        let n = x.numel();
        let db = delta.bf16().map_err(err)?;
        let xb = x.bf16_mut().map_err(err)?;
        launch!(self, &self.kernels.add_inplace, grid_for(n), xb, db, &n).map_err(err)
    }

    fn silu_mul(&self, gate_up: &CudaTensor) -> Result<CudaTensor, BackendError> {
        let (rows, two_f) = gate_up.matrix_dims().map_err(err)?;
        if two_f % 2 != 0 {
            return Err(BackendError::Shape(format!("silu_mul: odd width {two_f}")));
        }
        let f = two_f / 2;
        let mut out = self.alloc_bf16(rows * f).map_err(err)?;
        let f_i = f as i32;
        launch!(
            self,
            &self.kernels.silu_mul,
            grid_for(rows * f),
            gate_up.bf16().map_err(err)?,
            &mut out,
            &rows,
            &f_i
        )
        .map_err(err)?;
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![rows, f]))
    }

    fn linear_swiglu(
        &self,
        x: &CudaTensor,
        gate_up: &CudaTensor,
    ) -> Result<CudaTensor, BackendError> {
        match self.try_gemv_swiglu(x, gate_up).map_err(err)? {
            Some(act) => Ok(act),
            None => self.silu_mul(&self.linear(x, gate_up, None)?),
        }
    }

    fn gather_rows(&self, x: &CudaTensor, rows: &[u32]) -> Result<CudaTensor, BackendError> {
        let (n, d) = x.matrix_dims().map_err(err)?;
        if let Some(bad) = rows.iter().find(|&&r| r as usize >= n) {
            return Err(BackendError::Shape(format!("row {bad} outside {n} rows")));
        }
        if rows.len() == n && rows.iter().enumerate().all(|(i, &r)| r as usize == i) {
            // Every row in order (decode steps' logits rows): a device copy, no index upload,
            // so a recorded decode step can contain it.
            // Through `alloc_bf16`, so that a recorded step holds no memory node here.
            let mut copy = self.alloc_bf16(n * d).map_err(err)?;
            self.stream
                .memcpy_dtod(&x.bf16().map_err(err)?.slice(..n * d), &mut copy)
                .map_err(err)?;
            return Ok(self.tensor(DeviceBuf::Bf16(copy), vec![n, d]));
        }
        let ids = self.upload_u32(rows).map_err(err)?;
        let mut out = self.alloc_bf16(rows.len() * d).map_err(err)?;
        if !rows.is_empty() {
            let d_i = d as i32;
            launch!(
                self,
                &self.kernels.gather_rows,
                rows_config(rows.len(), row_chunk_threads(d)),
                x.bf16().map_err(err)?,
                &ids,
                &mut out,
                &d_i
            )
            .map_err(err)?;
        }
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![rows.len(), d]))
    }

    fn rope_qk(
        &self,
        qkv: &mut CudaTensor,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        let (n, width) = rope_rows(qkv, dims, rope, batch)?;
        let freqs = self.rope_freqs(&rope.inv_freqs).map_err(err)?;
        let (width_i, rot_heads, hd, interleaved) = (
            width as i32,
            (dims.num_heads + dims.num_kv_heads) as i32,
            dims.head_dim as i32,
            i32::from(rope.style == RopeStyle::Interleaved),
        );
        if n == 0 {
            return Ok(());
        }
        let config = rope_grid(n, (dims.num_heads + dims.num_kv_heads) * dims.head_dim / 2);
        let q = qkv.bf16_mut().map_err(err)?;
        launch!(
            self,
            &self.kernels.rope_qk,
            config,
            q,
            &batch.positions(),
            freqs.as_ref(),
            &width_i,
            &rot_heads,
            &hd,
            &interleaved
        )
        .map_err(err)
    }

    fn rope_qk_write_kv(
        &self,
        qkv: &mut CudaTensor,
        cache: &mut CudaKvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        let (n, width) = rope_rows(qkv, dims, rope, batch)?;
        if cache.full_dims("rope_qk_write_kv").map_err(err)? != (dims.num_kv_heads, dims.head_dim) {
            return Err(BackendError::Shape(format!(
                "rope + write_kv: {dims:?} into {:?}",
                cache.spec
            )));
        }
        if n == 0 {
            return Ok(());
        }
        let freqs = self.rope_freqs(&rope.inv_freqs).map_err(err)?;
        let config = rope_grid(
            n,
            (dims.num_heads + dims.num_kv_heads) * dims.head_dim / 2 + dims.kv_size() / 2,
        );
        let (width_i, heads_i, kv_heads_i, hd_i, interleaved) = (
            width as i32,
            dims.num_heads as i32,
            dims.num_kv_heads as i32,
            dims.head_dim as i32,
            i32::from(rope.style == RopeStyle::Interleaved),
        );
        let CudaKvCache { keys, values, .. } = cache;
        let q = qkv.bf16_mut().map_err(err)?;
        launch!(
            self,
            &self.kernels.rope_write_kv,
            config,
            q,
            &batch.positions(),
            freqs.as_ref(),
            &batch.slots(),
            keys,
            values,
            &width_i,
            &heads_i,
            &kv_heads_i,
            &hd_i,
            &interleaved
        )
        .map_err(err)
    }

    fn write_kv(
        &self,
        cache: &mut CudaKvCache,
        qkv: &CudaTensor,
        dims: &AttentionDims,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        let (n, width) = qkv.matrix_dims().map_err(err)?;
        if width != dims.qkv_size()
            || n != batch.meta.num_tokens()
            || cache.full_dims("write_kv").map_err(err)? != (dims.num_kv_heads, dims.head_dim)
        {
            return Err(BackendError::Shape(format!(
                "write_kv: [{n}, {width}] into {:?} for {dims:?}",
                cache.spec
            )));
        }
        let (width_i, q_i, kv_i) = (width as i32, dims.q_size() as i32, dims.kv_size() as i32);
        if n == 0 {
            return Ok(());
        }
        let CudaKvCache { keys, values, .. } = cache;
        launch!(
            self,
            &self.kernels.write_kv,
            rows_config(n, row_chunk_threads(dims.kv_size())),
            qkv.bf16().map_err(err)?,
            &batch.slots(),
            keys,
            values,
            &width_i,
            &q_i,
            &kv_i
        )
        .map_err(err)
    }

    fn paged_attention(
        &self,
        qkv: &CudaTensor,
        cache: &CudaKvCache,
        dims: &AttentionDims,
        batch: &CudaBatch,
    ) -> Result<CudaTensor, BackendError> {
        qkv.bf16().map_err(err)?;
        let (_, width) = qkv.matrix_dims().map_err(err)?;
        if width != dims.qkv_size()
            || cache.full_dims("paged_attention").map_err(err)?
                != (dims.num_kv_heads, dims.head_dim)
        {
            return Err(BackendError::Shape(format!(
                "attention: rows of {width} for {dims:?} over a cache of {:?}",
                cache.spec
            )));
        }
        let source = KvSource {
            keys: &cache.keys,
            values: &cache.values,
            block_tables: batch.block_tables(),
            max_blocks: batch.max_blocks,
        };
        self.paged_attention_impl(qkv, &source, dims, batch, false)
            .map_err(err)
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

    fn key_scores(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
        kind: KeyScoreKind,
    ) -> Result<HostTensor, BackendError> {
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
    ) -> Result<HostTensor, BackendError> {
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
}
