//! The compiled kernel functions, loaded once per backend.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};

use crate::{CudaError, KernelCache};

const OPS_SRC: &str = include_str!("../kernels/ops.cu");
const ATTENTION_SRC: &str = include_str!("../kernels/attention.cu");

/// Group bounds the attention kernel is instantiated for (query heads per KV head).
const ATTENTION_GROUP_BOUNDS: [usize; 4] = [1, 2, 4, 8];

/// Every kernel the backend launches.
pub(crate) struct Kernels {
    pub(crate) gather_rows: CudaFunction,
    pub(crate) rms_norm: CudaFunction,
    pub(crate) add_rms_norm: CudaFunction,
    pub(crate) add_inplace: CudaFunction,
    pub(crate) add_bias: CudaFunction,
    pub(crate) silu_mul: CudaFunction,
    pub(crate) rope_qk: CudaFunction,
    pub(crate) write_kv: CudaFunction,
    pub(crate) fill_normal: CudaFunction,
    /// Paged attention, indexed by (head width, group bound): see [`Kernels::attention`].
    attention: Vec<((usize, usize), CudaFunction)>,
    pub(crate) attention_combine: CudaFunction,
}

impl Kernels {
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        cache: &KernelCache,
        arch: &'static str,
    ) -> Result<Self, CudaError> {
        let ops = ctx.load_module(cache.ptx("ops", OPS_SRC, arch)?)?;
        let attn = ctx.load_module(cache.ptx("attention", ATTENTION_SRC, arch)?)?;
        Ok(Self {
            gather_rows: ops.load_function("gather_rows_bf16")?,
            rms_norm: ops.load_function("rms_norm_bf16")?,
            add_rms_norm: ops.load_function("add_rms_norm_bf16")?,
            add_inplace: ops.load_function("add_inplace_bf16")?,
            add_bias: ops.load_function("add_bias_bf16")?,
            silu_mul: ops.load_function("silu_mul_bf16")?,
            rope_qk: ops.load_function("rope_qk_bf16")?,
            write_kv: ops.load_function("write_kv_bf16")?,
            fill_normal: ops.load_function("fill_normal_bf16")?,
            attention: [64usize, 128, 256]
                .iter()
                .flat_map(|&d| ATTENTION_GROUP_BOUNDS.iter().map(move |&g| (d, g)))
                .map(|(d, g)| {
                    attn.load_function(&format!("paged_attention_d{d}_g{g}_bf16"))
                        .map(|f| ((d, g), f))
                })
                .collect::<Result<_, _>>()?,
            attention_combine: attn.load_function("attention_combine_bf16")?,
        })
    }

    /// The attention kernel for `head_dim` and `group` query heads per KV head, if instantiated.
    pub(crate) fn attention(&self, head_dim: usize, group: usize) -> Option<&CudaFunction> {
        let bound = ATTENTION_GROUP_BOUNDS
            .iter()
            .copied()
            .find(|&g| g >= group)?;
        self.attention
            .iter()
            .find(|((d, g), _)| *d == head_dim && *g == bound)
            .map(|(_, f)| f)
    }
}
