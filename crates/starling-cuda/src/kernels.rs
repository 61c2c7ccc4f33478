//! The kernel sources, the one list of functions the backend takes from each
//! ([`kernel_modules`]), and those functions loaded once per backend ([`Kernels`]).
//!
//! `Kernels::load` can only take a function that [`kernel_modules`] lists, and
//! `tests/nvrtc_compile.rs` checks that every listed function is in the compiled PTX, so a renamed
//! or missing kernel is caught by a CPU-only NVRTC run rather than on the GPU.

use std::collections::HashMap;
use std::sync::Arc;

use cudarc::driver::{CudaContext, CudaFunction};

use crate::geometry::{
    latent_scores_rel_shared_bytes, latent_scores_rot_shared_bytes, latent_scores_shared_bytes,
    latent_scores_wg_shared_bytes, latent_values_static_bytes, LATENT_SCORE_STAGES,
    LATENT_WG_MAX_RANK, LATENT_WG_STAGES,
};
use crate::kernel_source::required_define;
use crate::{CudaError, KernelCache};

pub(crate) use crate::geometry::CacheElem;
pub use crate::kernel_source::{
    HopperPrefill, KernelSource, ModuleTarget, KERNEL_DIR_ENV, PREFILL_KERNEL_ENV,
    WGMMA_PREFILL_BY_DEFAULT,
};
use crate::tiled_kernels::{granted_variants, opt_in_shared_memory};
pub(crate) use crate::tiled_kernels::{DecodeMmaKernel, PrefillKernel};

/// A kernel source with the headers it needs prepended, since NVRTC compiles one source string
/// per module: `pdl.cuh` (programmatic dependent launch, which every kernel uses) always, then
/// the named headers from `kernels/` in order — `bf16_vec` (the 16-byte bf16 vector helpers of
/// the row, matrix-vector, attention and key-score kernels), `fp8` (the e4m3 conversions of the
/// fp8 cache, which `mma_common`'s fp8 tile copies use), `kv_elem` (cache element loads of both
/// dtypes), `mma_common` (the tensor-core helpers of the tiled attention kernels),
/// `prefill_common` (the two tiled prefill kernels' key ranges, softmax and output write),
/// `split_combine` (the merge of flash-decoding splits, [`COMBINE_THREADS`] threads a block).
macro_rules! kernel_source {
    ($file:literal $(, $header:ident)*) => {
        KernelSource {
            text: concat!(
                include_str!("../kernels/pdl.cuh"),
                $(include_str!(concat!("../kernels/", stringify!($header), ".cuh")),)*
                include_str!(concat!("../kernels/", $file))
            ),
            files: &["pdl.cuh", $(concat!(stringify!($header), ".cuh"),)* $file],
        }
    };
}

const OPS_SRC: KernelSource = kernel_source!("ops.cu", bf16_vec, fp8);
const HEAD_NORM_SRC: KernelSource = kernel_source!("head_norm.cu", bf16_vec);
const ATTENTION_SRC: KernelSource = kernel_source!(
    "attention.cu",
    bf16_vec,
    fp8,
    kv_elem,
    decode_common,
    split_combine
);
const KV_CACHE_SRC: KernelSource = kernel_source!("kv_cache.cu");
const KEY_SCORES_SRC: KernelSource = kernel_source!("key_scores.cu", bf16_vec, fp8, kv_elem);
const PREFILL_ATTENTION_SRC: KernelSource =
    kernel_source!("prefill_attention.cu", fp8, mma_common, prefill_common);
const PREFILL_WGMMA_SRC: KernelSource = kernel_source!(
    "prefill_wgmma.cu",
    fp8,
    mma_common,
    wgmma_common,
    prefill_common
);
const DECODE_ATTENTION_SRC: KernelSource =
    kernel_source!("decode_attention.cu", fp8, mma_common, decode_common);
const SAMPLING_SRC: KernelSource = kernel_source!("sampling.cu");
const GEMV_SRC: KernelSource = kernel_source!("gemv.cu", bf16_vec);
const LATENT_SRC: KernelSource =
    kernel_source!("latent.cu", fp8, mma_common, latent_common, split_combine);
const LATENT_ROT_SRC: KernelSource =
    kernel_source!("latent_rot.cu", fp8, mma_common, latent_common);
const LATENT_REL_SRC: KernelSource =
    kernel_source!("latent_rel.cu", fp8, mma_common, latent_common);
const LATENT_WGMMA_SRC: KernelSource = kernel_source!(
    "latent_wgmma.cu",
    fp8,
    mma_common,
    latent_common,
    wgmma_common
);

/// Head widths the latent score kernel (`latent.cu`) is instantiated for.
const LATENT_HEAD_DIMS: [usize; 2] = [64, 128];
/// (head width, k-steps of 16 ranks, m-tiles of 16 keys per warp) the rotary-absorbed latent
/// score kernel (`latent_scores_rot`, one query head per KV head) is instantiated for.
/// Two m-tiles only: four (256 keys per tile) spilled at 255 registers and measured 15–20%
/// slower on the H200.
pub(crate) const LATENT_ROT_VARIANTS: [(usize, usize, usize); 4] =
    [(64, 2, 2), (64, 4, 2), (128, 4, 2), (128, 8, 2)];
/// (head width, k-steps of 16 ranks) the register-factor latent score kernel
/// (`latent_scores_rel`) is instantiated for: ranks up to half the head width or all of it.
pub(crate) const LATENT_REL_VARIANTS: [(usize, usize); 4] = [(64, 2), (64, 4), (128, 4), (128, 8)];
/// Most query heads per KV head the register-factor kernel serves (16 query rows; its shared
/// memory is granted for this many).
pub(crate) const LATENT_REL_MAX_GROUP: usize = 16;
/// m-tiles of 16 query heads the latent value kernel is instantiated for (up to 64 heads).
const LATENT_M_TILES: [usize; 3] = [1, 2, 4];
// The latent value kernel's static shared memory fits the 48 KiB a block has without opting in,
// at every m-tile count and element (checked at compile time: the kernel cannot ask for more).
const _: () = {
    let mut i = 0;
    while i < LATENT_M_TILES.len() {
        assert!(latent_values_static_bytes(LATENT_M_TILES[i], CacheElem::Bf16) <= 48 * 1024);
        assert!(latent_values_static_bytes(LATENT_M_TILES[i], CacheElem::Fp8) <= 48 * 1024);
        i += 1;
    }
};
/// Threads per block of the latent kernels (`LS_THREADS`, `LV_THREADS`).
pub(crate) const LATENT_THREADS: u32 = 128;

/// Most input rows the matrix-vector kernels (`gemv.cu`) take; larger batches go to cuBLAS.
/// Measured on the H200 (synthetic llama2-7b decode, 2026-11-29): one and two rows beat cuBLAS
/// (batch-1 step 5.79 → 5.33 ms), four rows lose to it (6.66 ms against 6.07 ms for cuBLAS at
/// eight), since every extra row re-reads the input through L1 for each weight chunk.
pub(crate) const GEMV_MAX_ROWS: usize = 2;
/// Warps per output column the matrix-vector kernels are instantiated for (`KSPLIT`).
pub(crate) const GEMV_KSPLITS: [usize; 2] = [1, 2];

/// Every matrix-vector instantiation for `n` input rows, in [`Kernels::gemv`]'s table order.
fn gemv_names(n: usize) -> Vec<String> {
    GemvKind::ALL
        .iter()
        .flat_map(|&kind| GEMV_KSPLITS.map(|ks| names::gemv(n, kind, ks)))
        .collect()
}

/// What a matrix-vector kernel (`gemv.cu`) writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum GemvKind {
    /// `x · wᵀ (+ bias)` in bf16 (a linear layer).
    Bf16,
    /// `x · wᵀ` in f32 (logits).
    F32,
    /// `silu(x · gateᵀ) * (x · upᵀ)` in bf16, for `w = [gate; up]`.
    SwiGlu,
}

impl GemvKind {
    /// Every kind, in the order of [`Kernels`]' table.
    pub(crate) const ALL: [GemvKind; 3] = [GemvKind::Bf16, GemvKind::F32, GemvKind::SwiGlu];
}

/// Threads per block of the matrix-vector kernels (`GEMV_WARPS` × 32).
pub(crate) const GEMV_THREADS: u32 = 256;

/// One kernel's two instantiations, by the cache element it reads or writes.
pub(crate) struct ByElem([CudaFunction; 2]);

impl ByElem {
    /// The instantiation for `elem`.
    pub(crate) fn get(&self, elem: CacheElem) -> &CudaFunction {
        &self.0[elem as usize]
    }
}

/// Group bounds the attention kernel is instantiated for (query heads per KV head).
const ATTENTION_GROUP_BOUNDS: [usize; 4] = [1, 2, 4, 8];
/// Head widths the attention kernel is instantiated for.
const ATTENTION_HEAD_DIMS: [usize; 3] = [64, 128, 256];
/// Head widths the tiled prefill kernel is instantiated for (its Q tile and K/V ring take 96 KiB
/// of shared memory at 128, so two blocks fit an SM; wider heads take the per-token kernel).
const PREFILL_HEAD_DIMS: [usize; 2] = [64, 128];

/// Head widths the tensor-core decode kernel (`decode_attention.cu`) is instantiated for.
const DECODE_MMA_HEAD_DIMS: [usize; 2] = [64, 128];
/// Function names, each used once in [`kernel_modules`] and once in [`Kernels::load`].
mod names;

/// A kernel source file and the functions the backend loads from it.
#[derive(Clone, Debug)]
pub struct KernelModule {
    /// Module name: the NVRTC program name and part of the PTX cache key.
    pub name: &'static str,
    /// CUDA C++ source (built in) and the files it is made of.
    pub source: KernelSource,
    /// The `extern "C"` kernels the backend loads from it.
    pub functions: Vec<String>,
    /// The devices it is compiled for.
    pub target: ModuleTarget,
}

/// Every (head width, group bound, cache element) the per-token attention kernel is
/// instantiated for.
fn attention_variants() -> impl Iterator<Item = (usize, usize, CacheElem)> {
    ATTENTION_HEAD_DIMS.iter().flat_map(|&d| {
        ATTENTION_GROUP_BOUNDS
            .iter()
            .flat_map(move |&g| CacheElem::ALL.map(|e| (d, g, e)))
    })
}

/// Every kernel module and the functions the backend loads from each.
pub fn kernel_modules() -> Vec<KernelModule> {
    let owned = |names: &[&str]| names.iter().map(|n| n.to_string()).collect::<Vec<_>>();
    let attention = attention_variants()
        .map(|(d, g, elem)| names::attention(d, g, elem))
        .chain([names::ATTENTION_COMBINE.to_string()])
        .collect();
    let by_elem = |bases: &[&str]| {
        bases
            .iter()
            .flat_map(|b| CacheElem::ALL.map(|e| names::by_elem(b, e)))
            .collect::<Vec<_>>()
    };
    vec![
        KernelModule {
            target: ModuleTarget::Device,
            name: "ops",
            source: OPS_SRC,
            functions: owned(&[
                names::GATHER_ROWS,
                names::RMS_NORM,
                names::ADD_RMS_NORM,
                names::ADD_INPLACE,
                names::ADD_BIAS,
                names::SILU_MUL,
                names::GELU_TANH_MUL,
                names::SCALE,
                names::ROPE_QK,
                names::FILL_NORMAL,
            ])
            .into_iter()
            .chain(by_elem(&[names::WRITE_KV, names::ROPE_WRITE_KV]))
            .collect(),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "head_norm",
            source: HEAD_NORM_SRC,
            functions: owned(&[names::RMS_NORM_HEADS]),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "attention",
            source: ATTENTION_SRC,
            functions: attention,
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "prefill_attention",
            source: PREFILL_ATTENTION_SRC,
            functions: PREFILL_HEAD_DIMS
                .iter()
                .flat_map(|&d| CacheElem::ALL.map(|e| names::prefill_attention(d, e)))
                .collect(),
        },
        KernelModule {
            target: ModuleTarget::Hopper,
            name: "prefill_wgmma",
            source: PREFILL_WGMMA_SRC,
            functions: owned(&[names::PREFILL_WGMMA_WS]),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "decode_attention",
            source: DECODE_ATTENTION_SRC,
            functions: DECODE_MMA_HEAD_DIMS
                .iter()
                .flat_map(|&d| CacheElem::ALL.map(|e| names::decode_attention_mma(d, e)))
                .collect(),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "kv_cache",
            source: KV_CACHE_SRC,
            functions: owned(&[
                names::COPY_KV_BLOCKS,
                names::GATHER_PAGED_ROWS,
                names::SCATTER_PAGED_ROWS,
                names::GATHER_KEPT_ROWS,
                names::SELECT_KEPT_TOKENS,
            ]),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "key_scores",
            source: KEY_SCORES_SRC,
            functions: owned(&[
                names::KEY_DIRECTION_MEAN,
                names::WINDOW_SOFTMAX_COMBINE,
                names::WINDOW_POOL_SCORES,
            ])
            .into_iter()
            .chain(by_elem(&[
                names::KEY_DIRECTION_PARTIALS,
                names::KEY_SCORES,
                names::WINDOW_SOFTMAX_PARTIALS,
                names::WINDOW_ATTENTION_MASS,
            ]))
            .collect(),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "gemv",
            source: GEMV_SRC,
            functions: (1..=GEMV_MAX_ROWS).flat_map(gemv_names).collect(),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "sampling",
            source: SAMPLING_SRC,
            functions: owned(&[names::SAMPLE_ROWS]),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "latent",
            source: LATENT_SRC,
            functions: owned(&[
                names::LATENT_ROPE_TABLE,
                names::LATENT_COMBINE,
                names::LATENT_VALUE_OUT,
                names::LATENT_GATHER_POSITIONS,
                names::LATENT_FINISH_KV,
            ])
            .into_iter()
            .chain(by_elem(&[
                names::ROPE_Q_WRITE_LATENTS,
                names::LATENT_GATHER_ROWS,
            ]))
            .chain(
                LATENT_HEAD_DIMS
                    .iter()
                    .flat_map(|&d| CacheElem::ALL.map(|e| names::latent_scores(d, e))),
            )
            .chain(
                LATENT_M_TILES
                    .iter()
                    .flat_map(|&mt| CacheElem::ALL.map(|e| names::latent_values(mt, e))),
            )
            .collect(),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "latent_rot",
            source: LATENT_ROT_SRC,
            functions: LATENT_ROT_VARIANTS
                .iter()
                .map(|&(d, ks, mt)| names::latent_scores_rot(d, ks, mt))
                .collect(),
        },
        KernelModule {
            target: ModuleTarget::Device,
            name: "latent_rel",
            source: LATENT_REL_SRC,
            functions: LATENT_REL_VARIANTS
                .iter()
                .map(|&(d, ks)| names::latent_scores_rel(d, ks))
                .collect(),
        },
        KernelModule {
            target: ModuleTarget::Hopper,
            name: "latent_wgmma",
            source: LATENT_WGMMA_SRC,
            functions: CacheElem::ALL.map(names::latent_scores_wg).to_vec(),
        },
    ]
}

/// Every kernel the backend launches.
pub(crate) struct Kernels {
    /// Each loaded function's name by its driver handle, for the kernel profile's sites.
    site_names: HashMap<usize, Arc<str>>,
    pub(crate) gather_rows: CudaFunction,
    pub(crate) rms_norm: CudaFunction,
    pub(crate) add_rms_norm: CudaFunction,
    pub(crate) rms_norm_heads: CudaFunction,
    pub(crate) add_inplace: CudaFunction,
    pub(crate) add_bias: CudaFunction,
    pub(crate) silu_mul: CudaFunction,
    pub(crate) gelu_tanh_mul: CudaFunction,
    pub(crate) scale: CudaFunction,
    pub(crate) rope_qk: CudaFunction,
    pub(crate) write_kv: ByElem,
    pub(crate) rope_write_kv: ByElem,
    pub(crate) fill_normal: CudaFunction,
    /// Paged attention, indexed by (head width, group bound, cache element): see
    /// [`Kernels::attention`].
    attention: Vec<((usize, usize, CacheElem), CudaFunction)>,
    pub(crate) attention_combine: CudaFunction,
    /// Tiled prefill attention, indexed by head width, where the device can run both element
    /// instantiations: see [`Kernels::prefill_attention`].
    prefill_attention: Vec<(usize, [PrefillKernel; 2])>,
    /// The Hopper tiled prefill kernel asked for ([`HopperPrefill`]: head width 128, bf16
    /// cache), which takes the place of the mma.sync one where it loaded (on compute capability
    /// 9.0): see [`Kernels::prefill_attention`].
    prefill_wgmma: Option<PrefillKernel>,
    /// Tensor-core decode attention, indexed by head width, where the device can run both
    /// element instantiations: see [`Kernels::decode_attention_mma`].
    decode_attention_mma: Vec<(usize, [DecodeMmaKernel; 2])>,
    pub(crate) copy_kv_blocks: CudaFunction,
    pub(crate) gather_paged_rows: CudaFunction,
    pub(crate) scatter_paged_rows: CudaFunction,
    pub(crate) gather_kept_rows: CudaFunction,
    pub(crate) select_kept_tokens: CudaFunction,
    pub(crate) key_direction_partials: ByElem,
    pub(crate) key_direction_mean: CudaFunction,
    pub(crate) key_scores: ByElem,
    pub(crate) window_softmax_partials: ByElem,
    pub(crate) window_softmax_combine: CudaFunction,
    pub(crate) window_attention_mass: ByElem,
    pub(crate) window_pool_scores: CudaFunction,
    pub(crate) sample_rows: CudaFunction,
    /// In [`gemv_names`] order, see [`Kernels::gemv`].
    gemv: Vec<CudaFunction>,
    pub(crate) rope_q_write_latents: ByElem,
    pub(crate) latent_rope_table: CudaFunction,
    pub(crate) latent_combine: CudaFunction,
    pub(crate) latent_value_out: CudaFunction,
    pub(crate) latent_gather_rows: ByElem,
    pub(crate) latent_gather_positions: CudaFunction,
    pub(crate) latent_finish_kv: CudaFunction,
    /// Latent scores by head width (both cache elements), where the device grants their shared
    /// memory.
    latent_scores: Vec<(usize, ByElem)>,
    /// Rotary-absorbed latent scores by (head width, k-steps, m-tiles), where the device grants
    /// their shared memory.
    latent_scores_rot: Vec<((usize, usize, usize), CudaFunction)>,
    /// Register-factor latent scores by (head width, k-steps), where the device grants their
    /// shared memory.
    latent_scores_rel: Vec<((usize, usize), CudaFunction)>,
    /// The Hopper latent score kernel (head width 128) per cache element, where its module
    /// loaded and the device grants its shared memory at the widest rank.
    latent_scores_wg: Vec<(CacheElem, CudaFunction)>,
    /// Latent values by m-tiles (both cache elements), [`LATENT_M_TILES`] order.
    latent_values: Vec<(usize, ByElem)>,
    /// Ring stages of the compiled latent score kernels (`LS_STAGES` of latent.cu, `LW_STAGES`
    /// of latent_wgmma.cu, as the compiled text defines them: a kernel directory may change
    /// them), from which their shared memory is sized.
    latent_score_stages: usize,
    latent_wg_stages: usize,
}

impl Kernels {
    /// The name of a loaded function (`"kernel"` for one this table did not load).
    pub(crate) fn site_name(&self, function: &CudaFunction) -> Arc<str> {
        self.site_names
            .get(&(function.cu_function() as usize))
            .cloned()
            .unwrap_or_else(|| Arc::from("kernel"))
    }

    pub(crate) fn load(
        ctx: &Arc<CudaContext>,
        cache: &KernelCache,
        arch: &'static str,
    ) -> Result<Self, CudaError> {
        let mut loaded: HashMap<String, CudaFunction> = HashMap::new();
        let mut site_names = HashMap::new();
        let hopper_prefill = HopperPrefill::requested();
        let (mut latent_score_stages, mut latent_wg_stages) =
            (LATENT_SCORE_STAGES, LATENT_WG_STAGES);
        for module in kernel_modules() {
            let Some(module_arch) = module.target.arch(arch) else {
                continue;
            };
            if hopper_prefill == HopperPrefill::Mma && module.name == "prefill_wgmma" {
                continue;
            }
            let source = module.source.load(module.name)?;
            match module.name {
                "latent" => latent_score_stages = required_define(&source, "latent", "LS_STAGES")?,
                "latent_wgmma" => {
                    latent_wg_stages = required_define(&source, "latent_wgmma", "LW_STAGES")?
                }
                _ => {}
            }
            let m = ctx.load_module(cache.ptx(module.name, &source, module_arch)?)?;
            for f in module.functions {
                let function = m.load_function(&f)?;
                site_names.insert(function.cu_function() as usize, Arc::from(f.as_str()));
                loaded.insert(f, function);
            }
        }
        // Only where its module loaded (a Hopper GPU, not switched off).
        let prefill_wgmma = match hopper_prefill {
            HopperPrefill::Mma => None,
            HopperPrefill::WgmmaWarpSpecialised => loaded.remove(names::PREFILL_WGMMA_WS),
        }
        .and_then(|f| PrefillKernel::prepare_wgmma(f, hopper_prefill));
        let mut take = |name: &str| {
            loaded
                .remove(name)
                .ok_or_else(|| CudaError::UnlistedKernel(name.to_string()))
        };
        let attention = attention_variants()
            .map(|v @ (d, g, elem)| take(&names::attention(d, g, elem)).map(|f| (v, f)))
            .collect::<Result<_, _>>()?;
        let mut prefill_attention = Vec::new();
        for d in PREFILL_HEAD_DIMS {
            let [bf16, fp8] = CacheElem::ALL.map(|e| take(&names::prefill_attention(d, e)));
            let prepare = |f, e| PrefillKernel::prepare(f, d, e);
            if let (Some(b), Some(f)) = (
                prepare(bf16?, CacheElem::Bf16),
                prepare(fp8?, CacheElem::Fp8),
            ) {
                prefill_attention.push((d, [b, f]));
            }
        }
        let gemv: Vec<CudaFunction> = (1..=GEMV_MAX_ROWS)
            .flat_map(gemv_names)
            .map(|name| take(&name))
            .collect::<Result<_, _>>()?;
        let mut decode_attention_mma = Vec::new();
        for d in DECODE_MMA_HEAD_DIMS {
            let [bf16, fp8] = CacheElem::ALL.map(|e| take(&names::decode_attention_mma(d, e)));
            let prepare = |f, e| DecodeMmaKernel::prepare(f, d, e);
            if let (Some(b), Some(f)) = (
                prepare(bf16?, CacheElem::Bf16),
                prepare(fp8?, CacheElem::Fp8),
            ) {
                decode_attention_mma.push((d, [b, f]));
            }
        }
        // Both instantiations of a kernel instantiated per cache element.
        macro_rules! by_elem {
            ($base:expr) => {{
                let [b, f] = CacheElem::ALL.map(|e| take(&names::by_elem($base, e)));
                ByElem([b?, f?])
            }};
        }
        let mut latent_scores = Vec::new();
        for d in LATENT_HEAD_DIMS {
            let [bf16, fp8] = CacheElem::ALL.map(|e| take(&names::latent_scores(d, e)));
            let (bf16, fp8) = (bf16?, fp8?);
            // The most a layer asks for: every head at rank head_dim.
            let granted = |function: &CudaFunction, elem: CacheElem| {
                opt_in_shared_memory(
                    function,
                    latent_scores_shared_bytes(d, d + 8, elem, latent_score_stages) as usize,
                    LATENT_THREADS,
                    &format!("latent scores d{d} {}", elem.suffix()),
                    "latent layers of this head width cannot run",
                )
                .is_some()
            };
            if granted(&bf16, CacheElem::Bf16) && granted(&fp8, CacheElem::Fp8) {
                latent_scores.push((d, ByElem([bf16, fp8])));
            }
        }
        let latent_scores_rot = granted_variants(
            LATENT_ROT_VARIANTS,
            |(d, ks, mt)| {
                let function = take(&names::latent_scores_rot(d, ks, mt))?;
                let bytes = latent_scores_rot_shared_bytes(d, ks, mt) as usize;
                Ok((
                    function,
                    bytes,
                    format!("latent scores (rotary absorbed) d{d} k{ks} m{mt}"),
                ))
            },
            LATENT_THREADS,
            "MHA latent layers use the reconstruction kernel",
        )?;
        let latent_scores_rel = granted_variants(
            LATENT_REL_VARIANTS,
            |(d, ks)| {
                let function = take(&names::latent_scores_rel(d, ks))?;
                let bytes = latent_scores_rel_shared_bytes(d, ks, LATENT_REL_MAX_GROUP) as usize;
                Ok((
                    function,
                    bytes,
                    format!("latent scores (register factors) d{d} k{ks}"),
                ))
            },
            LATENT_THREADS,
            "latent layers use the reconstruction kernel",
        )?;
        // Only on a Hopper GPU (its module's target).
        let latent_scores_wg = CacheElem::ALL
            .into_iter()
            .filter_map(|elem| {
                let function = take(&names::latent_scores_wg(elem)).ok()?;
                opt_in_shared_memory(
                    &function,
                    latent_scores_wg_shared_bytes(LATENT_WG_MAX_RANK, elem, latent_wg_stages)
                        as usize,
                    LATENT_THREADS,
                    &format!("latent scores (wgmma) {}", elem.suffix()),
                    "latent layers use the mma.sync reconstruction kernel",
                )
                .map(|_| (elem, function))
            })
            .collect();
        let mut latent_values = Vec::new();
        for mt in LATENT_M_TILES {
            let [bf16, fp8] = CacheElem::ALL.map(|e| take(&names::latent_values(mt, e)));
            latent_values.push((mt, ByElem([bf16?, fp8?])));
        }
        Ok(Self {
            site_names,
            rope_q_write_latents: by_elem!(names::ROPE_Q_WRITE_LATENTS),
            latent_rope_table: take(names::LATENT_ROPE_TABLE)?,
            latent_combine: take(names::LATENT_COMBINE)?,
            latent_value_out: take(names::LATENT_VALUE_OUT)?,
            latent_gather_rows: by_elem!(names::LATENT_GATHER_ROWS),
            latent_gather_positions: take(names::LATENT_GATHER_POSITIONS)?,
            latent_finish_kv: take(names::LATENT_FINISH_KV)?,
            latent_scores,
            latent_scores_rot,
            latent_scores_rel,
            latent_scores_wg,
            latent_values,
            latent_score_stages,
            latent_wg_stages,
            gather_rows: take(names::GATHER_ROWS)?,
            rms_norm: take(names::RMS_NORM)?,
            add_rms_norm: take(names::ADD_RMS_NORM)?,
            rms_norm_heads: take(names::RMS_NORM_HEADS)?,
            add_inplace: take(names::ADD_INPLACE)?,
            add_bias: take(names::ADD_BIAS)?,
            silu_mul: take(names::SILU_MUL)?,
            gelu_tanh_mul: take(names::GELU_TANH_MUL)?,
            scale: take(names::SCALE)?,
            rope_qk: take(names::ROPE_QK)?,
            write_kv: by_elem!(names::WRITE_KV),
            rope_write_kv: by_elem!(names::ROPE_WRITE_KV),
            fill_normal: take(names::FILL_NORMAL)?,
            attention,
            attention_combine: take(names::ATTENTION_COMBINE)?,
            prefill_attention,
            prefill_wgmma,
            decode_attention_mma,
            copy_kv_blocks: take(names::COPY_KV_BLOCKS)?,
            gather_paged_rows: take(names::GATHER_PAGED_ROWS)?,
            scatter_paged_rows: take(names::SCATTER_PAGED_ROWS)?,
            gather_kept_rows: take(names::GATHER_KEPT_ROWS)?,
            select_kept_tokens: take(names::SELECT_KEPT_TOKENS)?,
            key_direction_partials: by_elem!(names::KEY_DIRECTION_PARTIALS),
            key_direction_mean: take(names::KEY_DIRECTION_MEAN)?,
            key_scores: by_elem!(names::KEY_SCORES),
            window_softmax_partials: by_elem!(names::WINDOW_SOFTMAX_PARTIALS),
            window_softmax_combine: take(names::WINDOW_SOFTMAX_COMBINE)?,
            window_attention_mass: by_elem!(names::WINDOW_ATTENTION_MASS),
            window_pool_scores: take(names::WINDOW_POOL_SCORES)?,
            sample_rows: take(names::SAMPLE_ROWS)?,
            gemv,
        })
    }

    /// The attention kernel for `head_dim`, `group` query heads per KV head and the cache
    /// element, if instantiated.
    pub(crate) fn attention(
        &self,
        head_dim: usize,
        group: usize,
        elem: CacheElem,
    ) -> Option<&CudaFunction> {
        let bound = ATTENTION_GROUP_BOUNDS
            .iter()
            .copied()
            .find(|&g| g >= group)?;
        self.attention
            .iter()
            .find(|(v, _)| *v == (head_dim, bound, elem))
            .map(|(_, f)| f)
    }

    /// The tiled prefill attention kernel for `head_dim` (any group of 1..=8 query heads per KV
    /// head: the group is a launch argument) and the cache element, if instantiated and runnable
    /// on this device (both elements are, or neither): the wgmma kernel where it loaded and
    /// covers the shape (both take the same arguments and compute the same), else mma.sync's.
    pub(crate) fn prefill_attention(
        &self,
        head_dim: usize,
        elem: CacheElem,
    ) -> Option<&PrefillKernel> {
        if let Some(k) = &self.prefill_wgmma {
            if head_dim == crate::geometry::PREFILL_WGMMA_HEAD_DIM && elem == CacheElem::Bf16 {
                return Some(k);
            }
        }
        self.prefill_attention
            .iter()
            .find(|(d, _)| *d == head_dim)
            .map(|(_, k)| &k[elem as usize])
    }

    /// The matrix-vector kernel for `rows` input rows (`1..=GEMV_MAX_ROWS`), `kind` of output and
    /// `ksplit` warps per output column (one of [`GEMV_KSPLITS`]).
    pub(crate) fn gemv(&self, rows: usize, kind: GemvKind, ksplit: usize) -> Option<&CudaFunction> {
        if rows == 0 || rows > GEMV_MAX_ROWS {
            return None;
        }
        let split = GEMV_KSPLITS.iter().position(|&k| k == ksplit)?;
        self.gemv
            .get(((rows - 1) * GemvKind::ALL.len() + kind as usize) * GEMV_KSPLITS.len() + split)
    }

    /// The latent score kernel for `head_dim` and the latent cache's element, if instantiated
    /// and runnable here (both elements are, or neither).
    pub(crate) fn latent_scores(&self, head_dim: usize, elem: CacheElem) -> Option<&CudaFunction> {
        self.latent_scores
            .iter()
            .find(|(d, _)| *d == head_dim)
            .map(|(_, f)| f.get(elem))
    }

    /// The rotary-absorbed latent score kernel for `(head_dim, k_steps, m_tiles)`, if
    /// instantiated and runnable here.
    pub(crate) fn latent_scores_rot(
        &self,
        head_dim: usize,
        k_steps: usize,
        m_tiles: usize,
    ) -> Option<&CudaFunction> {
        self.latent_scores_rot
            .iter()
            .find(|(v, _)| *v == (head_dim, k_steps, m_tiles))
            .map(|(_, f)| f)
    }

    /// The register-factor latent score kernel for `(head_dim, k_steps)`, where runnable here.
    pub(crate) fn latent_scores_rel(
        &self,
        head_dim: usize,
        k_steps: usize,
    ) -> Option<&CudaFunction> {
        self.latent_scores_rel
            .iter()
            .find(|(v, _)| *v == (head_dim, k_steps))
            .map(|(_, f)| f)
    }

    /// Ring stages of the compiled `latent_scores_d*` (its `LS_STAGES`).
    pub(crate) fn latent_score_stages(&self) -> usize {
        self.latent_score_stages
    }

    /// Ring stages of the compiled `latent_scores_wg_*` (its `LW_STAGES`).
    pub(crate) fn latent_wg_stages(&self) -> usize {
        self.latent_wg_stages
    }

    /// The Hopper latent score kernel (head width 128) for the cache's element, where runnable
    /// here.
    pub(crate) fn latent_scores_wg(&self, elem: CacheElem) -> Option<&CudaFunction> {
        self.latent_scores_wg
            .iter()
            .find(|(e, _)| *e == elem)
            .map(|(_, f)| f)
    }

    /// The latent value kernel for `m_tiles` tiles of 16 query heads and the latent cache's
    /// element: the smallest instantiation that holds them.
    pub(crate) fn latent_values(&self, m_tiles: usize, elem: CacheElem) -> Option<&CudaFunction> {
        self.latent_values
            .iter()
            .find(|(mt, _)| *mt >= m_tiles)
            .map(|(_, f)| f.get(elem))
    }

    /// The tensor-core decode kernel for `head_dim` (any group of 1..=8 query heads per KV head)
    /// and the cache element, if instantiated and runnable on this device (both elements are, or
    /// neither).
    pub(crate) fn decode_attention_mma(
        &self,
        head_dim: usize,
        elem: CacheElem,
    ) -> Option<&DecodeMmaKernel> {
        self.decode_attention_mma
            .iter()
            .find(|(d, _)| *d == head_dim)
            .map(|(_, k)| &k[elem as usize])
    }
}

#[cfg(test)]
mod tests;
