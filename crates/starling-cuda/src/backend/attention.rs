//! Attention over full K/V on the GPU: the context split plan shared by eager steps and decode
//! graphs, and the launches of the decode kernels (per-token or tensor-core), the tiled prefill
//! kernel and the split combine.

use cudarc::driver::{DevicePtr, LaunchConfig};
use starling_backend::{AttentionDims, BackendError};

use super::attention_plan::{plan_splits, DecodeKernel, GridBlocks, SplitPlan, MAX_GROUP};
use super::{err, CudaBackend, CudaBatch, CudaKvCache, KvSource};
use crate::geometry::{COMBINE_THREADS, DECODE_MMA_THREADS};
use crate::kernels::CacheElem;
use crate::{CudaError, CudaTensor, DeviceBuf};

impl CudaBackend {
    /// The function name of the tiled prefill kernel that prefill chunks of `head_dim` over a
    /// bf16 cache run on here (the wgmma kernel on a Hopper GPU at head width 128, else the
    /// mma.sync one), or `None` where prefill rows go to the decode kernels.
    pub fn prefill_kernel_name(&self, head_dim: usize) -> Option<std::sync::Arc<str>> {
        self.kernels
            .prefill_attention(head_dim, CacheElem::Bf16)
            .map(|k| self.kernels.site_name(&k.function))
    }

    /// The context split of one attention call: `decode_rows` × `num_kv_heads` blocks go to the
    /// decode kernel this head width, group and row count get ([`DecodeKernel::choose`]),
    /// `prefill_blocks` (tiles × KV heads) to the tiled kernel. Eager launches and recorded decode
    /// graphs plan through here, so a replayed step splits exactly as the eager one.
    pub(crate) fn attention_split_plan(
        &self,
        head_dim: usize,
        group: usize,
        decode_rows: usize,
        num_kv_heads: usize,
        prefill_blocks: usize,
        max_visible_tokens: usize,
    ) -> SplitPlan {
        // Both elements' decode kernels exist or neither; the bf16 one's occupancy plans both,
        // so a plan depends on the model only (recorded graphs replay what eager steps do).
        let mma = self.kernels.decode_attention_mma(head_dim, CacheElem::Bf16);
        let choice = DecodeKernel::choose(group, decode_rows, mma.is_some());
        let decode_blocks = decode_rows * num_kv_heads;
        let (per_token, mma_blocks) = match choice {
            DecodeKernel::PerToken => (decode_blocks, 0),
            DecodeKernel::Mma => (0, decode_blocks),
        };
        plan_splits(
            GridBlocks {
                per_token,
                mma: mma_blocks,
                mma_resident_per_sm: mma.map_or(1, |k| k.resident_per_sm),
                prefill: prefill_blocks,
                prefill_resident_per_sm: self
                    .kernels
                    .prefill_attention(head_dim, CacheElem::Bf16)
                    .map(|k| k.resident_per_sm),
            },
            max_visible_tokens,
            self.num_sms,
        )
    }

    /// Attention of the Q part of `qkv` (`[n, width]`, Q first) over full K/V read from
    /// `source`: every row (`prefill_only == false`: decode rows to a decode kernel, prefill
    /// tiles to the tiled kernel), or only the prefill tiles (a latent layer's reconstructed
    /// context; its decode rows are the latent kernels', which write their rows of the result
    /// afterwards).
    pub(crate) fn paged_attention_impl(
        &self,
        qkv: &CudaTensor,
        source: &KvSource<'_>,
        dims: &AttentionDims,
        batch: &CudaBatch,
        prefill_only: bool,
    ) -> Result<CudaTensor, CudaError> {
        let (n, width) = qkv.matrix_dims()?;
        if width < dims.q_size() || n != batch.meta.num_tokens() {
            return Err(CudaError::Shape(format!(
                "attention: [{n}, {width}] for {} tokens of {} query elements",
                batch.meta.num_tokens(),
                dims.q_size()
            )));
        }
        if n == 0 {
            // As the CPU backend: an empty batch attends to nothing (no zero-sized grid).
            return Ok(self.tensor(DeviceBuf::Bf16(self.alloc_bf16(0)?), vec![0, dims.q_size()]));
        }
        let group = dims.num_heads / dims.num_kv_heads.max(1);
        if group == 0 || group > MAX_GROUP || group * dims.num_kv_heads != dims.num_heads {
            return Err(CudaError::Shape(format!(
                "attention: {group} query heads per KV head unsupported (1..={MAX_GROUP})"
            )));
        }
        // Prefill runs go to the tiled kernel where it is instantiated for this head width;
        // otherwise the decode kernel serves every row (`row_order` lists them all; both decode
        // kernels attend any single row correctly, prefill rows included).
        let rows = &batch.rows;
        let elem = source.elem;
        let prefill = match self.kernels.prefill_attention(dims.head_dim, elem) {
            Some(kernel) if rows.num_prefill() > 0 => Some((kernel, rows.tile_ranges[group - 1])),
            _ => None,
        };
        if prefill_only && prefill.is_none() {
            return Err(CudaError::Shape(
                "attention: a prefill-only launch without prefill tiles".into(),
            ));
        }
        let decode_rows = match (prefill.is_some(), prefill_only) {
            (_, true) => 0,
            (true, false) => rows.num_decode,
            (false, false) => n,
        };
        let mma = self.kernels.decode_attention_mma(dims.head_dim, elem);
        let decode_choice = DecodeKernel::choose(group, decode_rows, mma.is_some());
        // (function, block threads, dynamic shared bytes) of the decode launch.
        let decode_kernel = match (decode_choice, mma) {
            (DecodeKernel::Mma, Some(k)) => (&k.function, DECODE_MMA_THREADS, k.shared_bytes),
            _ => {
                let f = self
                    .kernels
                    .attention(dims.head_dim, group, elem)
                    .ok_or_else(|| {
                        CudaError::Shape(format!(
                            "attention: head_dim {} with {group} query heads per KV head \
                             unsupported (head_dim 64/128/256, up to 8 per KV head)",
                            dims.head_dim
                        ))
                    })?;
                (f, 128, 0)
            }
        };
        let tiles = prefill.map_or(0, |(_, (_, count))| count);
        // An eager launch passes its plan by value. A replay batch's launches are recorded once,
        // so they are sized for the bucket's most splits and the kernels read each step's plan
        // from the batch (`plan_ptr`), the same plan an eager run of the step computes.
        let (splits, split_len, plan_ptr) = match &batch.replay {
            None => {
                let plan = self.attention_split_plan(
                    dims.head_dim,
                    group,
                    decode_rows,
                    dims.num_kv_heads,
                    tiles * dims.num_kv_heads,
                    batch.max_visible,
                );
                (plan.splits, plan.split_len, 0u64)
            }
            Some(shape) => {
                if shape.num_kv_heads != dims.num_kv_heads || prefill.is_some() {
                    return Err(CudaError::Shape(format!(
                        "attention: a replay batch for {} KV heads and decode rows only, got {} \
                         and {} prefill rows",
                        shape.num_kv_heads,
                        dims.num_kv_heads,
                        rows.num_prefill()
                    )));
                }
                let view = batch.plan();
                let ptr = view.device_ptr(&self.stream).0;
                (shape.max_splits, 1, ptr)
            }
        };
        let mut out = self.alloc_bf16(n * dims.q_size())?;
        let part_len = if splits > 1 {
            n * dims.num_heads * splits
        } else {
            1
        };
        // SAFETY: the kernels write every partial the combine reads: each (row, head, split) is
        // written by exactly one of the launches below (empty splits write m = -inf).
        // Tensors (not bare buffers) so that under a decode-graph recording they come from and
        // go back to the recording pool.
        let mut part_acc = self.tensor(
            DeviceBuf::F32(self.alloc_f32(part_len * dims.head_dim)?),
            vec![part_len, dims.head_dim],
        );
        let mut part_ml = self.tensor(
            DeviceBuf::F32(self.alloc_f32(part_len * 2)?),
            vec![part_len, 2],
        );
        let (qkv_width, max_blocks, block_size) = (
            width as i32,
            source.max_blocks as i32,
            batch.meta.block_size_tokens as i32,
        );
        let (num_kv, group_i, splits_i, split_len_i) = (
            dims.num_kv_heads as i32,
            group as i32,
            splits as i32,
            split_len as i32,
        );
        // 0: the whole context (the kernels' convention for no window).
        let window_i = window_param(dims.window_tokens)?;
        if decode_rows > 0 {
            let (function, threads, shared_bytes) = decode_kernel;
            let cfg = LaunchConfig {
                grid_dim: (decode_rows as u32, dims.num_kv_heads as u32, splits as u32),
                block_dim: (threads, 1, 1),
                shared_mem_bytes: shared_bytes,
            };
            let order = batch.row_order(decode_rows);
            // Both decode kernels take the same arguments.
            launch!(
                self,
                function,
                cfg,
                &mut out,
                part_acc.f32_mut()?,
                part_ml.f32_mut()?,
                qkv.bf16()?,
                &qkv_width,
                source.keys,
                source.values,
                &order,
                &batch.tok_seq(),
                &batch.tok_visible(),
                &source.block_tables,
                &max_blocks,
                &block_size,
                &num_kv,
                &group_i,
                &dims.scale,
                &window_i,
                &splits_i,
                &split_len_i,
                &plan_ptr
            )?;
        }
        if let Some((kernel, (first, count))) = prefill {
            let cfg = LaunchConfig {
                grid_dim: (count as u32, dims.num_kv_heads as u32, splits as u32),
                block_dim: (kernel.threads, 1, 1),
                shared_mem_bytes: kernel.shared_bytes,
            };
            let tile_list = batch.prefill_tiles(first, count);
            launch!(
                self,
                &kernel.function,
                cfg,
                &mut out,
                part_acc.f32_mut()?,
                part_ml.f32_mut()?,
                qkv.bf16()?,
                &qkv_width,
                source.keys,
                source.values,
                &tile_list,
                &batch.tok_seq(),
                &batch.tok_visible(),
                &source.block_tables,
                &max_blocks,
                &block_size,
                &num_kv,
                &group_i,
                &dims.scale,
                &window_i,
                &splits_i,
                &split_len_i
            )?;
        }
        if splits > 1 {
            let cfg = LaunchConfig {
                grid_dim: (n as u32, dims.num_heads as u32, 1),
                block_dim: (COMBINE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            let (heads, hd) = (dims.num_heads as i32, dims.head_dim as i32);
            launch!(
                self,
                &self.kernels.attention_combine,
                cfg,
                &mut out,
                part_acc.f32()?,
                part_ml.f32()?,
                &heads,
                &splits_i,
                &hd,
                &plan_ptr
            )?;
        }
        Ok(self.tensor(DeviceBuf::Bf16(out), vec![n, dims.q_size()]))
    }
}

/// The attention kernels' `window` argument: a sliding window's reach in keys, 0 for none.
fn window_param(window_tokens: Option<usize>) -> Result<i32, CudaError> {
    match window_tokens {
        None => Ok(0),
        Some(w) if w >= 1 && w <= i32::MAX as usize => Ok(w as i32),
        Some(w) => Err(CudaError::Shape(format!("sliding window of {w} tokens"))),
    }
}

impl CudaBackend {
    /// `Backend::paged_attention` over a full cache: checks it against the heads, then attends
    /// through the batch's block tables.
    pub(super) fn full_paged_attention(
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
            elem: cache.elem,
            block_tables: batch.block_tables(dims.cache_group),
            max_blocks: batch.max_blocks,
        };
        self.paged_attention_impl(qkv, &source, dims, batch, false)
            .map_err(err)
    }
}
