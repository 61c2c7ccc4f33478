//! The strided batched bf16 GEMM of the latent layers (`CudaBackend::gemm_bf16_raw`), on
//! buffers and element offsets rather than tensors: the up-projections run per KV head over
//! slices of one buffer. Its own module because both the decode path (`latent.rs`) and the
//! prefill reconstruction (`latent_reconstruct.rs`) call it.

use cudarc::cublas::sys::{
    cublasComputeType_t, cublasGemmAlgo_t, cublasOperation_t, cudaDataType_t,
};
use cudarc::driver::{CudaSlice, DevicePtr, DevicePtrMut};
use half::bf16;

use super::kv_ops::int_arg;
use super::CudaBackend;
use crate::CudaError;

impl CudaBackend {
    /// `C = op(A) · op(B)` in cuBLAS's column-major terms (A transposed, B not: the row-major
    /// `C[n × m] = B[n × k] · A[m × k]ᵀ`), bf16 operands and result, f32 accumulation, over
    /// `shape.batch` strided problems. Each operand is a buffer and an element offset.
    pub(super) fn gemm_bf16_raw(
        &self,
        shape: GemmShape,
        a: (&CudaSlice<bf16>, usize),
        b: (&CudaSlice<bf16>, usize),
        c: (&mut CudaSlice<bf16>, usize),
    ) -> Result<(), CudaError> {
        let need = |lead: usize, cols: usize, stride: usize| {
            (shape.batch.max(1) - 1) * stride + (cols.max(1) - 1) * lead
        };
        let fits =
            |len: usize, offset: usize, last: usize, rows: usize| offset + last + rows <= len;
        if !fits(
            a.0.len(),
            a.1,
            need(shape.lda, shape.m, shape.stride_a),
            shape.k,
        ) || !fits(
            b.0.len(),
            b.1,
            need(shape.ldb, shape.n, shape.stride_b),
            shape.k,
        ) || !fits(
            c.0.len(),
            c.1,
            need(shape.ldc, shape.n, shape.stride_c),
            shape.m,
        ) {
            return Err(CudaError::Shape(format!(
                "latent GEMM {shape:?} out of its buffers ({}, {}, {})",
                a.0.len(),
                b.0.len(),
                c.0.len()
            )));
        }
        let to_i = |x: usize| int_arg(x, "GEMM dimension");
        let elem = std::mem::size_of::<bf16>() as u64;
        let (pa, _ga) = a.0.device_ptr(&self.stream);
        let (pb, _gb) = b.0.device_ptr(&self.stream);
        let (pc, _gc) = c.0.device_ptr_mut(&self.stream);
        let (alpha, beta) = (1.0f32, 0.0f32);
        let (m, n, k) = (to_i(shape.m)?, to_i(shape.n)?, to_i(shape.k)?);
        let (lda, ldb, ldc, batch) = (
            to_i(shape.lda)?,
            to_i(shape.ldb)?,
            to_i(shape.ldc)?,
            to_i(shape.batch)?,
        );
        // SAFETY: every problem's extent was checked against its buffer above.
        self.profiled_library(
            Self::blas_site("gemm_strided", shape.m, shape.k),
            || unsafe {
                cudarc::cublas::result::gemm_strided_batched_ex(
                    *self.blas.handle(),
                    cublasOperation_t::CUBLAS_OP_T,
                    cublasOperation_t::CUBLAS_OP_N,
                    m,
                    n,
                    k,
                    (&alpha) as *const f32 as *const _,
                    (pa + a.1 as u64 * elem) as *const _,
                    cudaDataType_t::CUDA_R_16BF,
                    lda,
                    shape.stride_a as i64,
                    (pb + b.1 as u64 * elem) as *const _,
                    cudaDataType_t::CUDA_R_16BF,
                    ldb,
                    shape.stride_b as i64,
                    (&beta) as *const f32 as *const _,
                    (pc + c.1 as u64 * elem) as *mut _,
                    cudaDataType_t::CUDA_R_16BF,
                    ldc,
                    shape.stride_c as i64,
                    batch,
                    cublasComputeType_t::CUBLAS_COMPUTE_32F,
                    cublasGemmAlgo_t::CUBLAS_GEMM_DEFAULT,
                )
                .map_err(CudaError::from)
            },
        )
    }
}

/// The shape of a (strided batched) column-major GEMM `C[m × n] = Aᵀ[m × k] · B[k × n]`.
#[derive(Clone, Copy, Debug)]
pub(super) struct GemmShape {
    pub(super) m: usize,
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) lda: usize,
    pub(super) ldb: usize,
    pub(super) ldc: usize,
    pub(super) stride_a: usize,
    pub(super) stride_b: usize,
    pub(super) stride_c: usize,
    pub(super) batch: usize,
}

impl GemmShape {
    /// One problem.
    pub(super) fn single(m: usize, n: usize, k: usize, lda: usize, ldb: usize, ldc: usize) -> Self {
        Self {
            m,
            n,
            k,
            lda,
            ldb,
            ldc,
            stride_a: 0,
            stride_b: 0,
            stride_c: 0,
            batch: 1,
        }
    }
}
