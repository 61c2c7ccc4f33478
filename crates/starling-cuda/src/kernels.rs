//! The kernel sources, the one list of functions the backend takes from each
//! ([`kernel_modules`]), and those functions loaded once per backend ([`Kernels`]).
//!
//! `Kernels::load` can only take a function that [`kernel_modules`] lists, and
//! `tests/nvrtc_compile.rs` checks that every listed function is in the compiled PTX, so a renamed
//! or missing kernel is caught by a CPU-only NVRTC run rather than on the GPU.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};

use crate::{CudaError, KernelCache};

const OPS_SRC: &str = include_str!("../kernels/ops.cu");
const ATTENTION_SRC: &str = include_str!("../kernels/attention.cu");
const KV_CACHE_SRC: &str = include_str!("../kernels/kv_cache.cu");
const KEY_SCORES_SRC: &str = include_str!("../kernels/key_scores.cu");
const PREFILL_ATTENTION_SRC: &str = include_str!("../kernels/prefill_attention.cu");
const SAMPLING_SRC: &str = include_str!("../kernels/sampling.cu");

/// Group bounds the attention kernel is instantiated for (query heads per KV head).
const ATTENTION_GROUP_BOUNDS: [usize; 4] = [1, 2, 4, 8];
/// Head widths the attention kernel is instantiated for.
const ATTENTION_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Head widths the tiled prefill kernel is instantiated for (its K and V tiles of 64 keys fit the
/// 48 KiB of static shared memory up to 128; wider heads take the per-token kernel).
const PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];

/// Function names, each used once in [`kernel_modules`] and once in [`Kernels::load`].
mod names {
    pub(super) const GATHER_ROWS: &str = "gather_rows_bf16";
    pub(super) const RMS_NORM: &str = "rms_norm_bf16";
    pub(super) const ADD_RMS_NORM: &str = "add_rms_norm_bf16";
    pub(super) const ADD_INPLACE: &str = "add_inplace_bf16";
    pub(super) const ADD_BIAS: &str = "add_bias_bf16";
    pub(super) const SILU_MUL: &str = "silu_mul_bf16";
    pub(super) const ROPE_QK: &str = "rope_qk_bf16";
    pub(super) const WRITE_KV: &str = "write_kv_bf16";
    pub(super) const FILL_NORMAL: &str = "fill_normal_bf16";
    pub(super) const ATTENTION_COMBINE: &str = "attention_combine_bf16";
    pub(super) const COPY_KV_BLOCKS: &str = "copy_kv_blocks_bf16";
    pub(super) const GATHER_PAGED_ROWS: &str = "gather_paged_rows_bf16";
    pub(super) const SCATTER_PAGED_ROWS: &str = "scatter_paged_rows_bf16";
    pub(super) const GATHER_KEPT_ROWS: &str = "gather_kept_rows_bf16";
    pub(super) const KEY_DIRECTION_PARTIALS: &str = "key_direction_partials_bf16";
    pub(super) const KEY_DIRECTION_MEAN: &str = "key_direction_mean";
    pub(super) const KEY_SCORES: &str = "key_scores_bf16";
    pub(super) const SAMPLE_ROWS: &str = "sample_rows_f32";

    /// The attention instantiation for head width `d` and group bound `g`.
    pub(super) fn attention(d: usize, g: usize) -> String {
        format!("paged_attention_d{d}_g{g}_bf16")
    }

    /// The tiled prefill attention instantiation for head width `d`.
    pub(super) fn prefill_attention(d: usize) -> String {
        format!("prefill_attention_d{d}_bf16")
    }
}

/// A kernel source file and the functions the backend loads from it.
#[derive(Clone, Debug)]
pub struct KernelModule {
    /// Module name: the NVRTC program name and part of the PTX cache key.
    pub name: &'static str,
    /// CUDA C++ source.
    pub source: &'static str,
    /// The `extern "C"` kernels the backend loads from it.
    pub functions: Vec<String>,
}

/// Every kernel module and the functions the backend loads from each.
pub fn kernel_modules() -> Vec<KernelModule> {
    let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let attention = ATTENTION_HEAD_DIMS
        .iter()
        .flat_map(|&d| {
            ATTENTION_GROUP_BOUNDS
                .iter()
                .map(move |&g| names::attention(d, g))
        })
        .chain([names::ATTENTION_COMBINE.to_string()])
        .collect();
    vec![
        KernelModule {
            name: "ops",
            source: OPS_SRC,
            functions: owned(&[
                names::GATHER_ROWS,
                names::RMS_NORM,
                names::ADD_RMS_NORM,
                names::ADD_INPLACE,
                names::ADD_BIAS,
                names::SILU_MUL,
                names::ROPE_QK,
                names::WRITE_KV,
                names::FILL_NORMAL,
            ]),
        },
        KernelModule {
            name: "attention",
            source: ATTENTION_SRC,
            functions: attention,
        },
        KernelModule {
            name: "prefill_attention",
            source: PREFILL_ATTENTION_SRC,
            functions: PREFILL_HEAD_DIMS
                .iter()
                .map(|&d| names::prefill_attention(d))
                .collect(),
        },
        KernelModule {
            name: "kv_cache",
            source: KV_CACHE_SRC,
            functions: owned(&[
                names::COPY_KV_BLOCKS,
                names::GATHER_PAGED_ROWS,
                names::SCATTER_PAGED_ROWS,
                names::GATHER_KEPT_ROWS,
            ]),
        },
        KernelModule {
            name: "key_scores",
            source: KEY_SCORES_SRC,
            functions: owned(&[
                names::KEY_DIRECTION_PARTIALS,
                names::KEY_DIRECTION_MEAN,
                names::KEY_SCORES,
            ]),
        },
        KernelModule {
            name: "sampling",
            source: SAMPLING_SRC,
            functions: owned(&[names::SAMPLE_ROWS]),
        },
    ]
}

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
    /// Tiled prefill attention, indexed by head width: see [`Kernels::prefill_attention`].
    prefill_attention: Vec<(usize, CudaFunction)>,
    pub(crate) copy_kv_blocks: CudaFunction,
    pub(crate) gather_paged_rows: CudaFunction,
    pub(crate) scatter_paged_rows: CudaFunction,
    pub(crate) gather_kept_rows: CudaFunction,
    pub(crate) key_direction_partials: CudaFunction,
    pub(crate) key_direction_mean: CudaFunction,
    pub(crate) key_scores: CudaFunction,
    pub(crate) sample_rows: CudaFunction,
}

impl Kernels {
    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        cache: &KernelCache,
        arch: &'static str,
    ) -> Result<Self, CudaError> {
        let mut loaded: HashMap<String, CudaFunction> = HashMap::new();
        for module in kernel_modules() {
            let m = ctx.load_module(cache.ptx(module.name, module.source, arch)?)?;
            for f in module.functions {
                let function = m.load_function(&f)?;
                loaded.insert(f, function);
            }
        }
        let mut take = |name: &str| {
            loaded
                .remove(name)
                .ok_or_else(|| CudaError::UnlistedKernel(name.to_string()))
        };
        let attention = ATTENTION_HEAD_DIMS
            .iter()
            .flat_map(|&d| ATTENTION_GROUP_BOUNDS.iter().map(move |&g| (d, g)))
            .map(|(d, g)| take(&names::attention(d, g)).map(|f| ((d, g), f)))
            .collect::<Result<_, _>>()?;
        let prefill_attention = PREFILL_HEAD_DIMS
            .iter()
            .map(|&d| take(&names::prefill_attention(d)).map(|f| (d, f)))
            .collect::<Result<_, _>>()?;
        Ok(Self {
            gather_rows: take(names::GATHER_ROWS)?,
            rms_norm: take(names::RMS_NORM)?,
            add_rms_norm: take(names::ADD_RMS_NORM)?,
            add_inplace: take(names::ADD_INPLACE)?,
            add_bias: take(names::ADD_BIAS)?,
            silu_mul: take(names::SILU_MUL)?,
            rope_qk: take(names::ROPE_QK)?,
            write_kv: take(names::WRITE_KV)?,
            fill_normal: take(names::FILL_NORMAL)?,
            attention,
            attention_combine: take(names::ATTENTION_COMBINE)?,
            prefill_attention,
            copy_kv_blocks: take(names::COPY_KV_BLOCKS)?,
            gather_paged_rows: take(names::GATHER_PAGED_ROWS)?,
            scatter_paged_rows: take(names::SCATTER_PAGED_ROWS)?,
            gather_kept_rows: take(names::GATHER_KEPT_ROWS)?,
            key_direction_partials: take(names::KEY_DIRECTION_PARTIALS)?,
            key_direction_mean: take(names::KEY_DIRECTION_MEAN)?,
            key_scores: take(names::KEY_SCORES)?,
            sample_rows: take(names::SAMPLE_ROWS)?,
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

    /// The tiled prefill attention kernel for `head_dim`, if instantiated (any group of 1..=8
    /// query heads per KV head: the group is a launch argument).
    pub(crate) fn prefill_attention(&self, head_dim: usize) -> Option<&CudaFunction> {
        self.prefill_attention
            .iter()
            .find(|(d, _)| *d == head_dim)
            .map(|(_, f)| f)
    }
}
