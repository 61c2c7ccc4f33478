//! The score launch of a latent layer's decode rows (kernels in `kernels/latent.cu`): which
//! kernel computes `q·RoPE(B_h z + b_h, p)` for every cached key latent, and its arguments.
//!
//! - One query head per KV head (MHA): `latent_scores_rot_*` absorbs RoPE into the query —
//!   `[α | β] = z·M` with `M` built once per block from `B_h` and the query, then two FMAs per
//!   frequency with cos/sin of the key's position. No key is reconstructed.
//! - Several query heads per KV head (GQA): `latent_scores_d*` reconstructs each key once on the
//!   tensor cores, rotates it and dots it with the whole group (the reconstruction is shared by
//!   the group, where absorbing would repeat it per query head).
//!
//! - Any group up to 16 query heads, bf16 cache (opt-in): `latent_scores_rel_*` reconstructs
//!   keys transposed with `B_h` held in registers, and takes RoPE relative to each tile's first
//!   position (the query rotated once per tile, each key by its offset from registers where the
//!   tile's positions are consecutive) — no table read per key and no `B_h` reload per 16 keys.
//!
//! - Head width 128 on Hopper (opt-in): `latent_scores_wg_d128_*` (`latent_wgmma.cu`, bf16 and
//!   fp8) reconstructs as `latent_scores_d*` does, on warpgroup MMA with both operands in
//!   shared memory, positions staged with the tile and cos/sin composed from a few table rows.
//!
//! Reconstruction is the default: measured on the H200 (session 9) it ties with the absorbed
//! kernel on the MHA 50% shape (0.64–0.70× vs 0.66–0.67× of the dense kernel at batch ≥ 16) and
//! serves every shape. An fp8 latent cache reconstructs (`latent_scores_d*_fp8`, or the wgmma
//! kernel's fp8 instantiation): the absorbed and register-factor kernels have none. [`LatentScoreKernel`]
//! (`STARLING_LATENT_SCORES=reconstruct|rotary|registers|wgmma`, or
//! [`CudaBackend::set_latent_score_kernel`]) picks one, for A/B runs and the parity tests.

use std::sync::atomic::{AtomicU8, Ordering};

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use half::bf16;

use super::kv_ops::int_arg;
use super::{CudaBackend, CudaBatch, CudaKvCache};
use crate::geometry::{
    latent_scores_rel_shared_bytes, latent_scores_rot_shared_bytes, latent_scores_shared_bytes,
    latent_scores_wg_shared_bytes, LATENT_WG_MAX_RANK,
};
use crate::kernels::{CacheElem, LATENT_REL_MAX_GROUP, LATENT_THREADS};
use crate::launch::KernelArgs;
use crate::{CudaError, CudaTensor};

/// Which kernel computes a latent layer's decode scores.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LatentScoreKernel {
    /// Keys reconstructed once per KV head on the tensor cores, rotated, dotted with the group.
    Reconstruct,
    /// RoPE absorbed into the query where a KV head has one query head (MHA); reconstruction
    /// for grouped heads.
    RotaryAbsorbed,
    /// Keys reconstructed with `B_h` in registers and RoPE relative to each tile's first
    /// position (bf16 caches, up to 16 query heads per KV head; else reconstruction).
    RegisterFactors,
    /// Keys reconstructed on Hopper's warpgroup MMA (head width 128, a Hopper GPU; else the
    /// mma.sync reconstruction).
    Wgmma,
}

/// The environment variable that picks the latent score kernel (`reconstruct`, `rotary`,
/// `registers`, `wgmma`).
pub const LATENT_SCORES_ENV: &str = "STARLING_LATENT_SCORES";

impl LatentScoreKernel {
    /// The kernel [`LATENT_SCORES_ENV`] names, else [`LatentScoreKernel::Reconstruct`].
    pub fn from_env() -> Self {
        match std::env::var(LATENT_SCORES_ENV).as_deref() {
            Ok("rotary") => Self::RotaryAbsorbed,
            Ok("registers") => Self::RegisterFactors,
            Ok("wgmma") => Self::Wgmma,
            Ok("reconstruct") | Err(_) => Self::Reconstruct,
            Ok(other) => {
                tracing::warn!(
                    "{LATENT_SCORES_ENV}={other} is not reconstruct, rotary, registers or \
                     wgmma: reconstruct"
                );
                Self::Reconstruct
            }
        }
    }
}

/// The backend's choice, shared by the threads that launch (the variant's index).
pub(super) struct ScoreKernelFlag(AtomicU8);

impl ScoreKernelFlag {
    const ALL: [LatentScoreKernel; 4] = [
        LatentScoreKernel::Reconstruct,
        LatentScoreKernel::RotaryAbsorbed,
        LatentScoreKernel::RegisterFactors,
        LatentScoreKernel::Wgmma,
    ];

    pub(super) fn new(kernel: LatentScoreKernel) -> Self {
        let flag = Self(AtomicU8::new(0));
        flag.set(kernel);
        flag
    }

    fn set(&self, kernel: LatentScoreKernel) {
        let index = Self::ALL.iter().position(|&k| k == kernel).unwrap_or(0);
        self.0.store(index as u8, Ordering::Relaxed);
    }

    fn get(&self) -> LatentScoreKernel {
        Self::ALL
            .get(usize::from(self.0.load(Ordering::Relaxed)))
            .copied()
            .unwrap_or(LatentScoreKernel::Reconstruct)
    }
}

/// The parameters one score kernel has and the other has not.
enum OwnParams {
    /// `latent_scores_rot_*`: the query heads (one per KV head).
    Rotary { heads: i32 },
    /// `latent_scores_d*` and `latent_scores_rel_*`: the shared-memory row stride of a latent
    /// tile, the KV heads and the query heads per KV head.
    Reconstruct {
        row_stride: i32,
        kv_heads: i32,
        group: i32,
    },
}

/// What the score launch reads and writes besides the cache and the batch.
pub(super) struct ScoreArgs<'a> {
    /// `[score tokens, heads]` f32, each row's range head-major.
    pub scores: &'a mut CudaTensor,
    /// `[rows, heads, splits]` f32: each head's split maximum.
    pub part_m: &'a mut CudaTensor,
    pub qkv: &'a CudaTensor,
    pub key_up: &'a CudaSlice<bf16>,
    pub key_bias: Option<&'a CudaSlice<bf16>>,
    /// cos/sin of `[positions][head_dim / 2]`.
    pub rope_table: &'a CudaSlice<f32>,
    pub interleaved: bool,
    pub head_dim: usize,
    pub num_heads: usize,
    pub num_kv_heads: usize,
    pub scale: f32,
    /// Decode rows (the batch's first `count` of `row_order`).
    pub count: usize,
    /// The latent plan's splits and split length, or (replay) the bound of the grid and the
    /// plan words of the layer's shape in the batch buffer.
    pub splits: usize,
    pub split_len: usize,
    pub plan_ptr: u64,
}

impl CudaBackend {
    /// Picks the latent score kernel for every later step (A/B runs, parity tests). Graphs
    /// recorded before keep the kernel they recorded.
    pub fn set_latent_score_kernel(&self, kernel: LatentScoreKernel) {
        self.latent_score_kernel.set(kernel);
    }

    /// The latent score kernel in use.
    pub fn latent_score_kernel(&self) -> LatentScoreKernel {
        self.latent_score_kernel.get()
    }

    /// Launches the scores of a latent layer's decode rows with the kernel the shape calls for.
    pub(super) fn launch_latent_scores(
        &self,
        cache: &CudaKvCache,
        batch: &CudaBatch,
        positions: &CudaSlice<bf16>,
        latent_heads: &CudaSlice<i32>,
        args: ScoreArgs<'_>,
    ) -> Result<(), CudaError> {
        let (d, heads, kv_heads) = (args.head_dim, args.num_heads, args.num_kv_heads);
        let group = heads / kv_heads.max(1);
        let ranks = cache.spec.require_latent("latent_attention")?;
        let max_rank = ranks.iter().copied().max().unwrap_or(0);
        let (kw, _) = cache.plane_widths();
        let qkv_width = int_arg(args.qkv.matrix_dims()?.1, "row width")?;
        let kw_i = int_arg(kw, "key width")?;
        let ints = [
            int_arg(batch.max_blocks, "block-table width")?,
            int_arg(batch.meta.block_size_tokens, "block size")?,
            int_arg(args.splits, "splits")?,
            int_arg(args.split_len, "split length")?,
            i32::from(args.interleaved),
        ];
        let [max_blocks, block_size, splits_i, split_len_i, inter] = ints;
        let key_bias = args.key_bias.map_or(0u64, |b| b.device_ptr(&self.stream).0);
        let grid_dim = (args.count as u32, kv_heads as u32, args.splits as u32);
        let order = batch.row_order(args.count);
        let offsets = batch.score_offsets(0, args.count);
        let (tok_seq, tok_visible, block_tables) =
            (batch.tok_seq(), batch.tok_visible(), batch.block_tables(0));
        let rotary = match cache.elem {
            CacheElem::Bf16 => self.rotary_scores_kernel(d, group, max_rank),
            // No fp8 instantiation of the absorbed kernel: reconstruct (module docs).
            CacheElem::Fp8 => None,
        };
        let (function, shared_mem_bytes, own) = match rotary {
            Some((function, k_steps, m_tiles)) => (
                function,
                latent_scores_rot_shared_bytes(d, k_steps, m_tiles),
                OwnParams::Rotary {
                    heads: int_arg(heads, "heads")?,
                },
            ),
            None => match self.register_factor_kernel(d, group, max_rank, cache.elem) {
                Some((function, k_steps)) => (
                    function,
                    latent_scores_rel_shared_bytes(d, k_steps, group),
                    OwnParams::Reconstruct {
                        row_stride: int_arg(16 * k_steps + 8, "latent row stride")?,
                        kv_heads: int_arg(kv_heads, "KV heads")?,
                        group: int_arg(group, "group")?,
                    },
                ),
                None => match self.wgmma_scores_kernel(d, max_rank, cache.elem) {
                    Some(function) => (
                        function,
                        latent_scores_wg_shared_bytes(
                            max_rank,
                            cache.elem,
                            self.kernels.latent_wg_stages(),
                        ),
                        reconstruct_params(max_rank, kv_heads, group)?,
                    ),
                    None => self.reconstruct_kernel(d, kv_heads, group, max_rank, cache.elem)?,
                },
            },
        };
        // One parameter list for the four kernels (latent.cu `latent_scores_d*`, latent_rot.cu
        // `latent_scores_rot_*`; latent_rel.cu `latent_scores_rel_*` and latent_wgmma.cu
        // `latent_scores_wg_*` with the first's), their own parameters where each declares them.
        let mut a = KernelArgs::new(&self.stream);
        a.push(args.scores.f32_mut()?);
        a.push(args.part_m.f32_mut()?);
        a.push(args.qkv.bf16()?);
        a.push(&qkv_width);
        a.push(&cache.keys);
        a.push(&kw_i);
        a.push(positions);
        a.push(latent_heads);
        a.push(args.key_up);
        a.push(&key_bias);
        a.push(args.rope_table);
        a.push(&inter);
        if let OwnParams::Reconstruct { row_stride, .. } = &own {
            a.push(row_stride);
        }
        for view in [&order, &tok_seq, &tok_visible, &offsets, &block_tables] {
            a.push(view);
        }
        a.push(&max_blocks);
        a.push(&block_size);
        match &own {
            OwnParams::Rotary { heads } => a.push(heads),
            OwnParams::Reconstruct {
                kv_heads, group, ..
            } => {
                a.push(kv_heads);
                a.push(group);
            }
        }
        a.push(&args.scale);
        a.push(&splits_i);
        a.push(&split_len_i);
        a.push(&args.plan_ptr);
        let cfg = LaunchConfig {
            grid_dim,
            block_dim: (LATENT_THREADS, 1, 1),
            shared_mem_bytes,
        };
        // SAFETY: the arguments above are the kernel's parameters in its order (the two kernels
        // share all but `OwnParams`), with buffers sized for this grid; both kernels start with
        // `pdl_entry()` (tests/nvrtc_compile.rs checks).
        unsafe { a.launch(function, cfg, self.pdl) }.map_err(CudaError::from)
    }

    /// The reconstruction kernel (`latent_scores_d*`) with its shared memory and parameters.
    fn reconstruct_kernel(
        &self,
        head_dim: usize,
        kv_heads: usize,
        group: usize,
        max_rank: usize,
        elem: CacheElem,
    ) -> Result<(&cudarc::driver::CudaFunction, u32, OwnParams), CudaError> {
        let function = self.kernels.latent_scores(head_dim, elem).ok_or_else(|| {
            CudaError::Shape(format!(
                "latent_attention: head_dim {head_dim} unsupported on CUDA (64 or 128)"
            ))
        })?;
        let rs = latent_row_stride(max_rank);
        Ok((
            function,
            latent_scores_shared_bytes(head_dim, rs, elem, self.kernels.latent_score_stages()),
            reconstruct_params(max_rank, kv_heads, group)?,
        ))
    }

    /// The Hopper reconstruction kernel where it is the one chosen and serves the layer (head
    /// width 128, ranks up to [`LATENT_WG_MAX_RANK`], its module loaded).
    fn wgmma_scores_kernel(
        &self,
        head_dim: usize,
        max_rank: usize,
        elem: CacheElem,
    ) -> Option<&cudarc::driver::CudaFunction> {
        if self.latent_score_kernel() != LatentScoreKernel::Wgmma
            || head_dim != 128
            || max_rank > LATENT_WG_MAX_RANK
        {
            return None;
        }
        self.kernels.latent_scores_wg(elem)
    }

    /// The register-factor kernel and its k-steps (the largest rank rounded up: half the head
    /// width or all of it) where it is the one chosen and serves the layer (bf16 cache, at most
    /// [`LATENT_REL_MAX_GROUP`] query heads per KV head).
    fn register_factor_kernel(
        &self,
        head_dim: usize,
        group: usize,
        max_rank: usize,
        elem: CacheElem,
    ) -> Option<(&cudarc::driver::CudaFunction, usize)> {
        if self.latent_score_kernel() != LatentScoreKernel::RegisterFactors
            || elem != CacheElem::Bf16
            || group > LATENT_REL_MAX_GROUP
        {
            return None;
        }
        let k_steps = rank_k_steps(head_dim, max_rank);
        self.kernels
            .latent_scores_rel(head_dim, k_steps)
            .map(|f| (f, k_steps))
    }

    /// The rotary-absorbed kernel for one query head per KV head, with its k-steps (the largest
    /// rank rounded up: half the head width or all of it) and m-tiles per warp (two: four
    /// spilled and ran slower); `None` where the reconstruction kernel is the one to use.
    fn rotary_scores_kernel(
        &self,
        head_dim: usize,
        group: usize,
        max_rank: usize,
    ) -> Option<(&cudarc::driver::CudaFunction, usize, usize)> {
        if group != 1 || self.latent_score_kernel() != LatentScoreKernel::RotaryAbsorbed {
            return None;
        }
        let k_steps = rank_k_steps(head_dim, max_rank);
        let m_tiles = 2;
        self.kernels
            .latent_scores_rot(head_dim, k_steps, m_tiles)
            .map(|f| (f, k_steps, m_tiles))
    }
}

/// The shared-memory row stride of a latent tile in the reconstruction kernels (elements): the
/// largest rank rounded up to 16, plus 8 so that ldmatrix rows fall in distinct banks. The
/// wgmma kernel takes it too, for the 64-rank halves of its tiles.
fn latent_row_stride(max_rank: usize) -> usize {
    max_rank.div_ceil(16) * 16 + 8
}

/// The reconstruction kernels' own parameters for a layer's largest rank, KV heads and group.
fn reconstruct_params(
    max_rank: usize,
    kv_heads: usize,
    group: usize,
) -> Result<OwnParams, CudaError> {
    Ok(OwnParams::Reconstruct {
        row_stride: int_arg(latent_row_stride(max_rank), "latent row stride")?,
        kv_heads: int_arg(kv_heads, "KV heads")?,
        group: int_arg(group, "group")?,
    })
}

/// k-steps of 16 ranks an instantiation of the absorbed or register-factor kernel covers for
/// ranks up to `max_rank`: half the head width or all of it (the two instantiated per width).
fn rank_k_steps(head_dim: usize, max_rank: usize) -> usize {
    if max_rank <= head_dim / 2 {
        head_dim / 32
    } else {
        head_dim / 16
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranks_pick_the_half_or_full_width_instantiation() {
        assert_eq!(rank_k_steps(128, 64), 4);
        assert_eq!(rank_k_steps(128, 72), 8);
        assert_eq!(rank_k_steps(64, 32), 2);
        assert_eq!(rank_k_steps(64, 33), 4);
    }

    #[test]
    fn the_score_kernel_flag_holds_each_choice() {
        for kernel in ScoreKernelFlag::ALL {
            let flag = ScoreKernelFlag::new(kernel);
            assert_eq!(flag.get(), kernel);
            for other in ScoreKernelFlag::ALL {
                flag.set(other);
                assert_eq!(flag.get(), other);
            }
        }
    }
}
