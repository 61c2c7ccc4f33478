//! The compiled kernel functions, loaded once per backend.

use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};

use crate::{CudaError, KernelCache};

const OPS_SRC: &str = include_str!("../kernels/ops.cu");
const ATTENTION_SRC: &str = include_str!("../kernels/attention.cu");

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
    pub(crate) attention_d64: CudaFunction,
    pub(crate) attention_d128: CudaFunction,
    pub(crate) attention_d256: CudaFunction,
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
            attention_d64: attn.load_function("paged_attention_d64_bf16")?,
            attention_d128: attn.load_function("paged_attention_d128_bf16")?,
            attention_d256: attn.load_function("paged_attention_d256_bf16")?,
            attention_combine: attn.load_function("attention_combine_bf16")?,
        })
    }
}
