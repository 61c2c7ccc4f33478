//! Per-head RMSNorm (Qwen3's q/k norm) on the GPU: the host side of `kernels/head_norm.cu`.
//! Arguments are checked by the CPU reference's own check (`starling_backend::cpu::
//! check_head_span`), so both backends reject the same input.

use cudarc::driver::LaunchConfig;
use starling_backend::cpu::check_head_span;
use starling_backend::{BackendError, HeadSpan};

use super::kv_ops::int_arg;
use super::{err, CudaBackend};
use crate::{CudaError, CudaTensor};

/// Widest head the kernel takes: 32 lanes × `HEAD_NORM_PER_LANE` (8) elements in registers.
pub(crate) const HEAD_NORM_MAX_DIM: usize = 256;
/// Warps per block (`HEAD_NORM_WARPS`), one head each.
const HEAD_NORM_WARPS: usize = 4;

/// [`starling_backend::ModelOps::rms_norm_heads`] on `backend`'s stream.
pub(super) fn rms_norm_heads(
    backend: &CudaBackend,
    x: &mut CudaTensor,
    w: &CudaTensor,
    span: HeadSpan,
    eps: f32,
) -> Result<(), BackendError> {
    let (rows, width) = x.matrix_dims().map_err(err)?;
    check_head_span(width, w.numel(), span)?;
    if span.head_dim > HEAD_NORM_MAX_DIM {
        return Err(BackendError::Shape(format!(
            "rms_norm_heads: heads of {} are wider than the kernel's {HEAD_NORM_MAX_DIM}",
            span.head_dim
        )));
    }
    if rows == 0 {
        return Ok(());
    }
    let head_groups = span.num_heads.div_ceil(HEAD_NORM_WARPS);
    let config = LaunchConfig {
        grid_dim: (
            u32::try_from(rows).map_err(|_| BackendError::Shape(format!("{rows} rows")))?,
            u32::try_from(head_groups)
                .map_err(|_| BackendError::Shape(format!("{} heads", span.num_heads)))?,
            1,
        ),
        block_dim: (32 * HEAD_NORM_WARPS as u32, 1, 1),
        shared_mem_bytes: 0,
    };
    let width_i = int_arg(width, "row width").map_err(err)?;
    let first_i = int_arg(span.first_col, "first column").map_err(err)?;
    let heads_i = int_arg(span.num_heads, "heads").map_err(err)?;
    let dim_i = int_arg(span.head_dim, "head_dim").map_err(err)?;
    let wb = w.bf16().map_err(err)?;
    let xb = x.bf16_mut().map_err(err)?;
    launch!(
        backend,
        &backend.kernels.rms_norm_heads,
        config,
        xb,
        wb,
        &width_i,
        &first_i,
        &heads_i,
        &dim_i,
        &eps
    )
    .map_err(err)
}
