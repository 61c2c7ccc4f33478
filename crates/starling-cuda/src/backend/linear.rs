//! Linear layers on the GPU: the matrix-vector kernels (`gemv.cu`) for decode batches, cuBLAS
//! (bf16 GEMM, f32 accumulation) otherwise, and the rule that picks warps per output column.

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::cublas::{Gemm, GemmConfig};
use cudarc::cublaslt::{CudaBlasLT, Matmul, MatmulConfig};
use cudarc::driver::{CudaStream, DevicePtr, DevicePtrMut, LaunchConfig};
use half::bf16;
use starling_backend::{BackendError, ModelOps};

use super::{err, grid_for, CudaBackend};
use crate::kernels::{GemvKind, GEMV_THREADS};
use crate::{CudaError, CudaTensor, DeviceBuf};

/// The environment variable that forces the warps per matrix-vector column (`1` or `2`) instead
/// of [`gemv_ksplit`]'s choice, for measuring the choice in the same run.
pub const GEMV_KSPLIT_ENV: &str = "STARLING_GEMV_KSPLIT";

/// Set to a byte count to make every warp of a matrix-vector launch prefetch that much of its
/// weight share into L2 (0: none) instead of [`GEMV_PREFETCH_BYTES`] (for A/B runs).
pub const GEMV_PREFETCH_ENV: &str = "STARLING_GEMV_PREFETCH_BYTES";

/// `1` adds a linear layer's bias in a cuBLASLt GEMM's epilogue, `0` in a launch of its own
/// after the cuBLAS GEMM (for A/B runs); unset, [`GEMM_BIAS_EPILOGUE_BY_DEFAULT`] decides.
pub const GEMM_BIAS_ENV: &str = "STARLING_GEMM_BIAS_EPILOGUE";

/// Whether biases go into the GEMM's epilogue when [`GEMM_BIAS_ENV`] is unset. Measured (H100,
/// 2026-12-06, synthetic Qwen2.5-Coder-1.5B, random 4096/128 at 16 concurrent, 0.75 GiB of KV,
/// three runs against four in one lease, `bench/results/gpu/issue21/2026-12-06_s28_h100_wgmma_bias/`):
/// output tokens/s +1.4% (1,573 vs 1,551 mean; every run above every run of the separate
/// launch), TPOT median −1.7%; parity and the decode-graph tests pass with it.
const GEMM_BIAS_EPILOGUE_BY_DEFAULT: bool = true;

/// Set to a row count to move the bias-epilogue GEMM's row limit
/// ([`GEMM_BIAS_EPILOGUE_MAX_ROWS`]) for A/B runs.
pub const GEMM_BIAS_EPILOGUE_MAX_ROWS_ENV: &str = "STARLING_GEMM_BIAS_EPILOGUE_MAX_ROWS";

/// The most input rows (tokens) a linear layer's GEMM takes its bias in the cuBLASLt epilogue
/// for; larger batches run the cuBLAS GEMM and a bias launch. No limit: the epilogue is faster
/// at every size measured. `bench kernels --gemm` (H100, 2026-12-07, session 34,
/// `bench/results/gpu/issue21/2026-12-07_s34_h100_kernel_ab/`), Qwen2.5-Coder-1.5B's QKV
/// (2048 × 1536, 10 calls back to back): 21.7 vs 25.9 µs at 2048 rows, 77.1 vs 94.5 µs at 8192
/// (668 vs 545 TFLOP/s), even at 16–256 rows. Session 32 had capped it at 256 rows on a
/// `serve --kernel-profile` reading of 331 µs a launch at 8192 rows; session 33 found that the
/// profile's events span host time as well (TTFT did not move with the cap), and the GEMM timed
/// alone settles it. Other biased shapes (larger Qwen models) are unmeasured.
pub const GEMM_BIAS_EPILOGUE_MAX_ROWS: usize = usize::MAX;

/// [`GEMM_BIAS_EPILOGUE_MAX_ROWS`], or the override in [`GEMM_BIAS_EPILOGUE_MAX_ROWS_ENV`]
/// (an unreadable value is logged and ignored).
pub(super) fn bias_epilogue_max_rows() -> usize {
    match std::env::var(GEMM_BIAS_EPILOGUE_MAX_ROWS_ENV) {
        Ok(v) => v.trim().parse().unwrap_or_else(|_| {
            tracing::warn!(
                "{GEMM_BIAS_EPILOGUE_MAX_ROWS_ENV}={v:?} is not a row count: using \
                 {GEMM_BIAS_EPILOGUE_MAX_ROWS}"
            );
            GEMM_BIAS_EPILOGUE_MAX_ROWS
        }),
        Err(_) => GEMM_BIAS_EPILOGUE_MAX_ROWS,
    }
}

/// The cuBLASLt handle for GEMMs with a bias epilogue when asked for ([`GEMM_BIAS_ENV`]); `None`
/// where not, or (logged) where the handle or its workspace cannot be made: the bias launch then.
pub(super) fn make_blas_lt(stream: &std::sync::Arc<CudaStream>) -> Option<CudaBlasLT> {
    let wanted = match std::env::var(GEMM_BIAS_ENV) {
        Ok(v) => v.trim() == "1",
        Err(_) => GEMM_BIAS_EPILOGUE_BY_DEFAULT,
    };
    if !wanted {
        return None;
    }
    // cudarc unwraps the workspace allocation inside `new`: contain a failure to this fallback.
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        CudaBlasLT::new(stream.clone())
    })) {
        Ok(Ok(lt)) => Some(lt),
        Ok(Err(e)) => {
            tracing::warn!("cuBLASLt unavailable ({e}): biases are added after the GEMM");
            None
        }
        Err(_) => {
            tracing::warn!("cuBLASLt workspace allocation failed: biases are added after the GEMM");
            None
        }
    }
}

/// Bytes of its weight share each warp of a matrix-vector launch requests into L2 before it waits
/// on the preceding kernel (`gemv.cu`). Measured on the H200 (synthetic llama2-7b and qwen2.5-7b
/// decode at batch 1 and 2, 2026-11-30, `bench/results/gpu/2026-11-30_s7_gemv_prefetch/`): more is
/// slower — 8 KiB +0.6 ms per batch-1 step, 2 KiB (session 6's choice) +0.1 ms against 512 bytes —
/// and none at all is as fast as 512 bytes at batch 1, slightly slower at batch 2.
pub(super) const GEMV_PREFETCH_BYTES: usize = 512;

/// Blocks of a matrix-vector launch with `columns` outputs per input row and `ksplit` warps per
/// column. (A grid capped at 16 blocks per SM left some warps two columns and the rest one.)
fn gemv_blocks(columns: usize, ksplit: usize) -> u32 {
    columns.div_ceil(GEMV_THREADS as usize / 32 / ksplit) as u32
}

/// Warps per output column of a matrix-vector launch: two (each half the row) for one input row,
/// unless the columns fill more than half the GPU's `resident_warps` but not all of them — split,
/// they would spill a sliver into a second wave. One input row is latency-bound per warp: a
/// 4,096-row projection on one warp per row fills half an H200, and a 12,288-row one takes 1.45
/// waves. Measured (H200, 2026-11-29, `bench decode`, same run, against one warp everywhere,
/// `bench/results/gpu/2026-11-29_s6_gemv_ksplit/`): llama2-7b batch 1 4.16 → 3.98 ms, qwen2.5-7b
/// batch 1 4.16 → 4.15 ms (two warps everywhere made it 4.20: its 4,608-row QKV is the sliver
/// case), batch 2 unchanged (two warps everywhere made qwen2.5-7b 4% slower) — so two input rows
/// keep one warp per column. `resident_warps` is the hardware bound, not the kernels' occupancy
/// (the rule measured with the occupancy figure, 6 blocks per SM, was 0.07 ms slower on llama2-7b).
pub(crate) fn gemv_ksplit(input_rows: usize, columns: usize, resident_warps: usize) -> usize {
    let spills = resident_warps / 2 < columns && columns <= resident_warps;
    if input_rows == 1 && !spills {
        2
    } else {
        1
    }
}

impl CudaBackend {
    /// `y = x · wᵀ (+ bias)` through the matrix-vector kernels (`gemv.cu`) when the batch is small
    /// enough for them and the rows are 16-byte aligned (`k % 8 == 0`); `None` otherwise, for
    /// cuBLAS. At decode batch sizes a linear layer is a stream over its weights, which cuBLAS's
    /// one-row GEMMs read well below copy bandwidth.
    pub(super) fn try_gemv(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
        f32_out: bool,
    ) -> Result<Option<CudaTensor>, CudaError> {
        let (n, k) = x.matrix_dims()?;
        let (m, wk) = w.matrix_dims()?;
        let kind = if f32_out {
            GemvKind::F32
        } else {
            GemvKind::Bf16
        };
        let ksplit = self.gemv_ksplit(n, m);
        let Some(function) = self.kernels.gemv(n, kind, ksplit) else {
            return Ok(None);
        };
        if k != wk || k % 8 != 0 || m == 0 || k > i32::MAX as usize || m > i32::MAX as usize {
            return Ok(None);
        }
        let bias_ptr = match bias {
            Some(b) if b.numel() != m => {
                return Err(CudaError::Shape(format!(
                    "linear: bias of {} for {m} outputs",
                    b.numel()
                )))
            }
            Some(b) => Some(b.bf16()?),
            None => None,
        };
        let blocks = gemv_blocks(m, ksplit);
        let cfg = LaunchConfig {
            grid_dim: (blocks, 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let (k_i, m_i) = (k as i32, m as i32);
        let prefetch = self.gemv_prefetch(k * 2 / ksplit);
        // A null bias pointer when there is none (the kernel checks it).
        let null = 0u64;
        macro_rules! run {
            ($out:expr) => {
                match bias_ptr {
                    Some(b) => launch!(
                        self,
                        function,
                        cfg,
                        x.bf16()?,
                        w.bf16()?,
                        b,
                        $out,
                        &k_i,
                        &m_i,
                        &prefetch
                    )?,
                    None => launch!(
                        self,
                        function,
                        cfg,
                        x.bf16()?,
                        w.bf16()?,
                        &null,
                        $out,
                        &k_i,
                        &m_i,
                        &prefetch
                    )?,
                }
            };
        }
        let buf = if f32_out {
            // SAFETY: the kernel writes all n·m outputs (every row j of w by one warp).
            let mut out = self.alloc_f32(n * m)?;
            run!(&mut out);
            DeviceBuf::F32(out)
        } else {
            let mut out = self.alloc_bf16(n * m)?;
            run!(&mut out);
            DeviceBuf::Bf16(out)
        };
        Ok(Some(self.tensor(buf, vec![n, m])))
    }

    /// Per-warp L2 prefetch bytes of a matrix-vector launch whose warps each stream
    /// `share_bytes` of weights, as the kernel's `int` argument.
    pub(super) fn gemv_prefetch(&self, share_bytes: usize) -> i32 {
        i32::try_from(self.gemv_prefetch_bytes.min(share_bytes)).unwrap_or(i32::MAX)
    }

    /// Warps per output column for a matrix-vector launch ([`gemv_ksplit`], unless forced).
    pub(super) fn gemv_ksplit(&self, input_rows: usize, columns: usize) -> usize {
        self.forced_gemv_ksplit
            .unwrap_or_else(|| gemv_ksplit(input_rows, columns, self.max_resident_warps))
    }

    /// `silu(x · gateᵀ) * (x · upᵀ)` for `w = [gate; up]` through the fused matrix-vector kernel,
    /// under the same conditions as [`CudaBackend::try_gemv`]; `None` otherwise.
    pub(super) fn try_gemv_swiglu(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
    ) -> Result<Option<CudaTensor>, CudaError> {
        let (n, k) = x.matrix_dims()?;
        let (two_f, wk) = w.matrix_dims()?;
        let f = two_f / 2;
        let ksplit = self.gemv_ksplit(n, f);
        let Some(function) = self.kernels.gemv(n, GemvKind::SwiGlu, ksplit) else {
            return Ok(None);
        };
        if k != wk || k % 8 != 0 || two_f % 2 != 0 || f == 0 || k > i32::MAX as usize {
            return Ok(None);
        }
        let f_i = i32::try_from(f).map_err(|_| CudaError::Shape(format!("swiglu: {f} columns")))?;
        let cfg = LaunchConfig {
            grid_dim: (gemv_blocks(f, ksplit), 1, 1),
            block_dim: (GEMV_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let mut out = self.alloc_bf16(n * f)?;
        let k_i = k as i32;
        // Each warp streams a gate and an up row.
        let prefetch = self.gemv_prefetch(2 * k * 2 / ksplit);
        launch!(
            self,
            function,
            cfg,
            x.bf16()?,
            w.bf16()?,
            &mut out,
            &k_i,
            &f_i,
            &prefetch
        )?;
        Ok(Some(self.tensor(DeviceBuf::Bf16(out), vec![n, f])))
    }

    pub(super) fn gemm_bf16(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        f32_out: bool,
    ) -> Result<CudaTensor, CudaError> {
        if let Some(y) = self.try_gemv(x, w, None, f32_out)? {
            return Ok(y);
        }
        let (n, k) = x.matrix_dims()?;
        let (m, wk) = w.matrix_dims()?;
        if k != wk {
            return Err(CudaError::Shape(format!(
                "linear: input [{n}, {k}] vs weight [{m}, {wk}]"
            )));
        }
        // Row-major y[n, m] = x[n, k] · w[m, k]ᵀ is column-major yᵀ = w · xᵀ:
        // A = w (stored k×m column-major, transposed), B = x (k×n column-major).
        if !f32_out {
            let mut out = self.alloc_bf16(n * m)?;
            let cfg = GemmConfig {
                transa: cublasOperation_t::CUBLAS_OP_T,
                transb: cublasOperation_t::CUBLAS_OP_N,
                m: m as i32,
                n: n as i32,
                k: k as i32,
                alpha: bf16::ONE,
                lda: k as i32,
                ldb: k as i32,
                beta: bf16::ZERO,
                ldc: m as i32,
            };
            let (wb, xb) = (w.bf16()?, x.bf16()?);
            self.profiled_library(Self::blas_site("gemm", m, k), || {
                // SAFETY: shapes checked above; buffers hold m*k, n*k and n*m elements.
                unsafe { self.blas.gemm(cfg, wb, xb, &mut out) }.map_err(CudaError::from)
            })?;
            return Ok(self.tensor(DeviceBuf::Bf16(out), vec![n, m]));
        }
        // SAFETY: as above; the output is f32 (cuBLAS bf16 × bf16 → f32 with f32 compute).
        let mut out = self.alloc_f32(n * m)?;
        {
            let (a, _ga) = w.bf16()?.device_ptr(&self.stream);
            let (b, _gb) = x.bf16()?.device_ptr(&self.stream);
            let (c, _gc) = out.device_ptr_mut(&self.stream);
            let alpha = 1.0f32;
            let beta = 0.0f32;
            // SAFETY: pointers are live device buffers of the sizes checked above.
            self.profiled_library(Self::blas_site("gemm_f32_out", m, k), || unsafe {
                cudarc::cublas::result::gemm_ex(
                    *self.blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    m as i32,
                    n as i32,
                    k as i32,
                    (&alpha) as *const f32 as *const _,
                    a as *const _,
                    cudaDataType_t::CUDA_R_16BF,
                    k as i32,
                    b as *const _,
                    cudaDataType_t::CUDA_R_16BF,
                    k as i32,
                    (&beta) as *const f32 as *const _,
                    c as *mut _,
                    cudaDataType_t::CUDA_R_32F,
                    m as i32,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .map_err(CudaError::from)
            })?;
        }
        Ok(self.tensor(DeviceBuf::F32(out), vec![n, m]))
    }
}

impl CudaBackend {
    /// `y = x · wᵀ + bias` (bf16) in one cuBLASLt GEMM, the bias added in its epilogue (the
    /// layout of [`CudaBackend::gemm_bf16`]: column-major `yᵀ = w · xᵀ`, whose rows are the
    /// outputs the bias vector runs along).
    fn gemm_bias_bf16(
        &self,
        lt: &CudaBlasLT,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: &CudaTensor,
    ) -> Result<CudaTensor, CudaError> {
        let (n, k) = x.matrix_dims()?;
        let (m, wk) = w.matrix_dims()?;
        if k != wk || bias.numel() != m {
            return Err(CudaError::Shape(format!(
                "linear: input [{n}, {k}] vs weight [{m}, {wk}], bias of {}",
                bias.numel()
            )));
        }
        let mut out = self.alloc_bf16(n * m)?;
        let cfg = MatmulConfig {
            transa: true,
            transb: false,
            transc: false,
            m: m as u64,
            n: n as u64,
            k: k as u64,
            alpha: 1.0,
            lda: k as i64,
            ldb: k as i64,
            beta: 0.0,
            ldc: m as i64,
            stride_a: None,
            stride_b: None,
            stride_c: None,
            stride_bias: None,
            batch_size: None,
        };
        let (wb, xb, bb) = (w.bf16()?, x.bf16()?, bias.bf16()?);
        self.profiled_library(Self::blas_site("gemm_bias", m, k), || {
            // SAFETY: shapes checked above; buffers hold m*k, n*k, m and n*m elements.
            unsafe { lt.matmul(cfg, wb, xb, &mut out, Some(bb), None) }.map_err(CudaError::from)
        })?;
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![n, m]))
    }

    /// The most rows whose bias this backend adds in the cuBLASLt GEMM's epilogue
    /// ([`GEMM_BIAS_EPILOGUE_MAX_ROWS`] or its environment override), for reports.
    pub fn bias_epilogue_max_rows(&self) -> usize {
        self.bias_epilogue_max_rows
    }

    /// [`ModelOps::linear`]: GEMV for small batches (bias fused), else a cuBLASLt GEMM with the
    /// bias in its epilogue (up to [`GEMM_BIAS_EPILOGUE_MAX_ROWS`] rows), or cuBLAS and a bias
    /// launch.
    pub(super) fn linear_impl(
        &self,
        x: &CudaTensor,
        w: &CudaTensor,
        bias: Option<&CudaTensor>,
    ) -> Result<CudaTensor, BackendError> {
        // Small batches: one kernel with the bias fused.
        if let Some(y) = self.try_gemv(x, w, bias, false).map_err(err)? {
            return Ok(y);
        }
        let rows = x.matrix_dims().map_err(err)?.0;
        let epilogue = self
            .blas_lt
            .as_ref()
            .filter(|_| rows <= self.bias_epilogue_max_rows);
        if let (Some(b), Some(lt)) = (bias, epilogue) {
            match self.gemm_bias_bf16(lt, x, w, b) {
                Ok(y) => return Ok(y),
                // A shape cuBLASLt has no algorithm for (its heuristic is asked per call) takes
                // the GEMM and the bias launch below; a bad shape fails there as well.
                Err(CudaError::BlasLt(e)) => tracing::debug!("cuBLASLt bias GEMM: {e:?}"),
                Err(e) => return Err(err(e)),
            }
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
            // One thread per 16-byte chunk where the rows are chunked (ops.cu).
            let threads = if cols % 8 == 0 { n / 8 } else { n };
            launch!(
                self,
                &self.kernels.add_bias,
                grid_for(threads),
                yb,
                bb,
                &rows,
                &cols_i
            )
            .map_err(err)?;
        }
        Ok(y)
    }

    /// [`ModelOps::linear_swiglu`]: the fused GEMV + SwiGLU where it applies.
    pub(super) fn linear_swiglu_impl(
        &self,
        x: &CudaTensor,
        gate_up: &CudaTensor,
    ) -> Result<CudaTensor, BackendError> {
        match self.try_gemv_swiglu(x, gate_up).map_err(err)? {
            Some(act) => Ok(act),
            None => self.silu_mul(&self.linear(x, gate_up, None)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The H200: 132 SMs × 8 blocks of 8 warps.
    const H200_WARPS: usize = 132 * 8 * 8;

    #[test]
    fn one_input_row_splits_columns_unless_that_spills_a_sliver() {
        // llama2-7b: o / down (4,096 columns) and QKV (12,288) and gate|up pairs (11,008) split.
        for columns in [4096, 12_288, 11_008, 32_000] {
            assert_eq!(gemv_ksplit(1, columns, H200_WARPS), 2, "{columns}");
        }
        // qwen2.5-7b's QKV (4,608 columns) fills more than half the GPU: split, it would take a
        // second wave for 9% of its work.
        assert_eq!(gemv_ksplit(1, 4608, H200_WARPS), 1);
        // The edges: exactly half splits into exactly one wave; exactly one wave stays.
        assert_eq!(gemv_ksplit(1, H200_WARPS / 2, H200_WARPS), 2);
        assert_eq!(gemv_ksplit(1, H200_WARPS / 2 + 1, H200_WARPS), 1);
        assert_eq!(gemv_ksplit(1, H200_WARPS, H200_WARPS), 1);
        assert_eq!(gemv_ksplit(1, H200_WARPS + 1, H200_WARPS), 2);
    }

    #[test]
    fn two_input_rows_keep_one_warp_per_column() {
        for columns in [1, 4096, 4608, 12_288, 152_064] {
            assert_eq!(gemv_ksplit(2, columns, H200_WARPS), 1, "{columns}");
        }
    }

    #[test]
    fn blocks_cover_every_column() {
        assert_eq!(gemv_blocks(4096, 1), 512);
        assert_eq!(gemv_blocks(4096, 2), 1024);
        assert_eq!(gemv_blocks(9, 2), 3);
        assert_eq!(gemv_blocks(1, 1), 1);
    }
}
