//! STAR-KV latent layers on the GPU (kernels in `kernels/latent.cu`; CPU references in
//! `starling_backend::cpu::latent`).
//!
//! - The write ([`CudaBackend::rope_q_write_latents_impl`]): one launch rotates Q and stores the
//!   latents (bf16, or e4m3 bytes for an fp8 cache: `CacheElem` picks the instantiation of every
//!   kernel that touches the latent planes) and the position.
//! - Decode rows ([`CudaBackend::latent_decode`]): scores from keys reconstructed on the tensor
//!   cores per (row, KV head, split), weighted value latents per (row, split, column chunk) for
//!   every head at once, a merge of the splits, then one cuBLAS GEMM per KV head for the value
//!   up-projection of all rows: the value latent is read once per row and split, `B_v` once per
//!   step.
//! - Prefill chunks (`latent_reconstruct.rs`): the sequences' contexts are reconstructed into a
//!   scratch full cache ([`CudaBackend::reconstruct_rows`]: gather, one GEMM per key head and one for the values,
//!   bias and RoPE) that the tiled prefill kernel attends through scratch block tables.
//!
//! The decode kernels split the context by a plan of their own (`latent_plan.rs`). Every launch of
//! a decode row sizes its buffers from the batch (a replay batch: the bucket's most latent splits
//! and the cache's slots) and a replay reads the plan of its layer's shape from the batch buffer,
//! so a latent layer records into a decode graph as a full one does.

use std::sync::Arc;

use cudarc::driver::{CudaSlice, DevicePtr, LaunchConfig};
use half::bf16;
use starling_backend::{AttentionDims, LatentFactors, RopeSpec, RopeStyle};

use super::attention_plan::MAX_GROUP;
use super::gemm::GemmShape;
use super::kv_ops::int_arg;
use super::latent_plan::{latent_value_chunk_cols, latent_value_m_tiles, LatentSplitShape};
use super::latent_scores::ScoreArgs;
use super::rope::rope_grid;
use super::{grid_for, CudaBackend, CudaBatch, CudaKvCache, KvSource};
use crate::geometry::{COMBINE_THREADS, LATENT_REL_TABLE_ROWS};
use crate::kernels::{CacheElem, LATENT_THREADS};
use crate::{CudaError, CudaTensor, DeviceBuf};

/// A latent layer's up-projections as device buffers, checked against the cache and the heads.
pub(super) struct DeviceFactors<'a> {
    pub(super) key_up: &'a CudaSlice<bf16>,
    pub(super) key_bias: Option<&'a CudaSlice<bf16>>,
    pub(super) value_up: &'a CudaSlice<bf16>,
    pub(super) value_bias: Option<&'a CudaSlice<bf16>>,
}

impl<'a> DeviceFactors<'a> {
    pub(super) fn new(
        factors: &'a LatentFactors<'a, CudaTensor>,
        cache: &CudaKvCache,
        dims: &AttentionDims,
        op: &str,
    ) -> Result<Self, CudaError> {
        let ranks = cache.spec.require_latent(op)?;
        let (kw, vw) = cache.plane_widths();
        let (hd, kv) = (dims.head_dim, dims.kv_size());
        let shape = |what: &str, t: &CudaTensor, want: &[usize]| -> Result<(), CudaError> {
            if t.shape() == want || (want.len() == 1 && t.shape() == [1, want[0]]) {
                Ok(())
            } else {
                Err(CudaError::Shape(format!(
                    "{op}: {what} is {:?}, expected {want:?}",
                    t.shape()
                )))
            }
        };
        if ranks.len() != dims.num_kv_heads {
            return Err(CudaError::Shape(format!(
                "{op}: a latent cache of {} heads for {dims:?}",
                ranks.len()
            )));
        }
        shape("key_up", factors.key_up, &[hd, kw])?;
        shape("value_up", factors.value_up, &[kv, vw])?;
        if let Some(b) = factors.key_bias {
            shape("key_bias", b, &[kv])?;
        }
        if let Some(b) = factors.value_bias {
            shape("value_bias", b, &[kv])?;
        }
        Ok(Self {
            key_up: factors.key_up.bf16()?,
            key_bias: factors.key_bias.map(CudaTensor::bf16).transpose()?,
            value_up: factors.value_up.bf16()?,
            value_bias: factors.value_bias.map(CudaTensor::bf16).transpose()?,
        })
    }
}

/// A latent cache's position plane, as the kernels read it (`u32` per slot).
pub(super) fn positions(cache: &CudaKvCache) -> Result<&CudaSlice<bf16>, CudaError> {
    cache
        .positions
        .as_ref()
        .ok_or_else(|| CudaError::Shape("a latent cache without positions".into()))
}

pub(super) fn latent_heads(cache: &CudaKvCache) -> Result<&CudaSlice<i32>, CudaError> {
    cache
        .latent_heads
        .as_ref()
        .ok_or_else(|| CudaError::Shape("a latent cache without head offsets".into()))
}

/// A null device pointer (an absent bias).
pub(super) const NULL: u64 = 0;

impl CudaBackend {
    pub(super) fn rope_q_write_latents_impl(
        &self,
        qkv: &mut CudaTensor,
        cache: &mut CudaKvCache,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<(), CudaError> {
        cache.spec.require_latent("rope_q_write_latents")?;
        let (n, width) = qkv.matrix_dims()?;
        let (kw, vw) = cache.plane_widths();
        if width != dims.q_size() + kw + vw
            || n != batch.meta.num_tokens()
            || rope.inv_freqs.len() != dims.head_dim / 2
        {
            return Err(CudaError::Shape(format!(
                "rope_q_write_latents: [{n}, {width}] for {} tokens of {} + {kw} + {vw}",
                batch.meta.num_tokens(),
                dims.q_size()
            )));
        }
        if n == 0 {
            return Ok(());
        }
        cache.position_bound = cache.position_bound.max(self.rope_positions_needed(batch));
        let freqs = self.rope_freqs(&rope.inv_freqs)?;
        let items = dims.num_heads * dims.head_dim / 2 + (kw + vw) / 8 + 1;
        let config = rope_grid(n, items);
        let args = [
            int_arg(width, "row width")?,
            int_arg(dims.num_heads, "heads")?,
            int_arg(dims.head_dim, "head_dim")?,
            int_arg(kw, "key width")?,
            int_arg(vw, "value width")?,
            i32::from(rope.style == RopeStyle::Interleaved),
        ];
        let function = self.kernels.rope_q_write_latents.get(cache.elem);
        let CudaKvCache {
            keys,
            values,
            positions,
            ..
        } = cache;
        let positions = positions
            .as_mut()
            .ok_or_else(|| CudaError::Shape("a latent cache without positions".into()))?;
        launch!(
            self,
            function,
            config,
            qkv.bf16_mut()?,
            &batch.positions(),
            freqs.as_ref(),
            &batch.slots(0),
            keys,
            values,
            positions,
            &args[0],
            &args[1],
            &args[2],
            &args[3],
            &args[4],
            &args[5]
        )
    }

    pub(super) fn latent_attention_impl(
        &self,
        qkv: &CudaTensor,
        cache: &CudaKvCache,
        factors: &LatentFactors<'_, CudaTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
    ) -> Result<CudaTensor, CudaError> {
        let dev = DeviceFactors::new(factors, cache, dims, "latent_attention")?;
        let (n, width) = qkv.matrix_dims()?;
        let (kw, vw) = cache.plane_widths();
        if width != dims.q_size() + kw + vw || n != batch.meta.num_tokens() {
            return Err(CudaError::Shape(format!(
                "latent_attention: [{n}, {width}] for {} tokens of {} + {kw} + {vw}",
                batch.meta.num_tokens(),
                dims.q_size()
            )));
        }
        let group = dims.num_heads / dims.num_kv_heads.max(1);
        if group == 0 || group > MAX_GROUP || group * dims.num_kv_heads != dims.num_heads {
            return Err(CudaError::Shape(format!(
                "latent_attention: {group} query heads per KV head unsupported (1..={MAX_GROUP})"
            )));
        }
        if n == 0 {
            return Ok(self.tensor(DeviceBuf::Bf16(self.alloc_bf16(0)?), vec![0, dims.q_size()]));
        }
        let rows = &batch.rows;
        let tiled = self
            .kernels
            .prefill_attention(dims.head_dim, CacheElem::Bf16)
            .is_some();
        let (mut out, decode_rows) = if tiled && rows.num_prefill() > 0 && batch.replay.is_none() {
            // Prefill chunks attend their reconstructed contexts with the tiled kernel; its
            // launch leaves the decode rows to the latent kernels below.
            let plan = self.prefill_scratch_plan(batch)?;
            let (k, v) =
                self.reconstruct_rows(cache, &dev, dims, rope, &plan.src_slots, plan.num_slots)?;
            let source = KvSource {
                keys: &k,
                values: &v,
                elem: CacheElem::Bf16,
                block_tables: plan.tables.slice(..),
                max_blocks: batch.max_blocks,
            };
            let out = self.paged_attention_impl(qkv, &source, dims, batch, true)?;
            (out, rows.num_decode)
        } else {
            let out = self.alloc_bf16(n * dims.q_size())?;
            (self.tensor(DeviceBuf::Bf16(out), vec![n, dims.q_size()]), n)
        };
        if decode_rows > 0 {
            let score_rows = if decode_rows == rows.num_decode && decode_rows < n {
                batch.decode_score_capacity
            } else {
                batch.score_capacity
            };
            self.latent_decode(
                out.bf16_mut()?,
                qkv,
                cache,
                &dev,
                dims,
                rope,
                batch,
                decode_rows,
                score_rows,
            )?;
        }
        Ok(out)
    }

    /// The latent decode launches for the first `count` rows of the batch's `row_order`, whose
    /// scores take at most `score_tokens` context positions together.
    #[allow(clippy::too_many_arguments)]
    fn latent_decode(
        &self,
        out: &mut CudaSlice<bf16>,
        qkv: &CudaTensor,
        cache: &CudaKvCache,
        factors: &DeviceFactors<'_>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        batch: &CudaBatch,
        count: usize,
        score_tokens: usize,
    ) -> Result<(), CudaError> {
        let (d, heads, kv_heads) = (dims.head_dim, dims.num_heads, dims.num_kv_heads);
        let group = heads / kv_heads.max(1);
        let (_, vw) = cache.plane_widths();
        let m_tiles = latent_value_m_tiles(heads, vw);
        let values_kernel = self
            .kernels
            .latent_values(m_tiles, cache.elem)
            .ok_or_else(|| {
                CudaError::Shape(format!(
                    "latent_attention: {heads} query heads unsupported on CUDA (up to 64)"
                ))
            })?;
        let ranks = cache.spec.require_latent("latent_attention")?;
        let max_rank = ranks.iter().copied().max().unwrap_or(0);
        if max_rank > d {
            return Err(CudaError::Shape(format!(
                "latent_attention: key rank {max_rank} exceeds head_dim {d}"
            )));
        }
        // The latent plan of this layer's shape (latent_plan.rs): made here for an eager step;
        // a replay batch carries each shape's plan in its plan words, written per step by the
        // same function, and its launches are sized for the bucket's bound.
        let split_shape = latent_split_shape(cache, heads, kv_heads);
        let (splits, split_len, plan_ptr) = match &batch.replay {
            None => {
                let plan = split_shape.plan(count, batch.max_visible, self.num_sms);
                (plan.splits, plan.split_len, 0u64)
            }
            Some(shape) => {
                let words = batch.latent_plan(&split_shape).ok_or_else(|| {
                    CudaError::Shape(format!(
                        "latent_attention: no replay plan recorded for {split_shape:?}"
                    ))
                })?;
                let ptr = words.device_ptr(&self.stream).0;
                (shape.max_latent_splits, 1, ptr)
            }
        };
        // The rotary-absorbed kernel also reads rows at positions relative to a split's first
        // key (up to the longest context).
        // The register-factor kernel reads rows at offsets within a tile (0..64).
        let needed = self
            .rope_positions_needed(batch)
            .max(cache.position_bound)
            .max(batch.max_visible)
            .max(LATENT_REL_TABLE_ROWS);
        let table = self.latent_rope_table(rope, d, needed)?;
        let mut scores = self.tensor(
            DeviceBuf::F32(self.alloc_f32(score_tokens.max(1) * heads)?),
            vec![score_tokens.max(1), heads],
        );
        let parts = count * heads * splits;
        let mut part_m = self.tensor(DeviceBuf::F32(self.alloc_f32(parts)?), vec![parts]);
        let mut part_l = self.tensor(DeviceBuf::F32(self.alloc_f32(parts)?), vec![parts]);
        let mut part_acc =
            self.tensor(DeviceBuf::F32(self.alloc_f32(parts * vw)?), vec![parts, vw]);
        self.launch_latent_scores(
            cache,
            batch,
            positions(cache)?,
            latent_heads(cache)?,
            ScoreArgs {
                scores: &mut scores,
                part_m: &mut part_m,
                qkv,
                key_up: factors.key_up,
                key_bias: factors.key_bias,
                rope_table: table.as_ref(),
                interleaved: rope.style == RopeStyle::Interleaved,
                head_dim: d,
                num_heads: heads,
                num_kv_heads: kv_heads,
                scale: dims.scale,
                count,
                splits,
                split_len,
                plan_ptr,
            },
        )?;
        let order = batch.row_order(count);
        let offsets = batch.score_offsets(0, count);
        let ints = [
            int_arg(batch.max_blocks, "block-table width")?,
            int_arg(batch.meta.block_size_tokens, "block size")?,
            int_arg(group, "group")?,
            int_arg(splits, "splits")?,
            int_arg(split_len, "split length")?,
            int_arg(heads, "heads")?,
            int_arg(count, "rows")?,
            int_arg(d, "head_dim")?,
            int_arg(vw, "value width")?,
        ];
        let [max_blocks, block_size, group_i, splits_i, split_len_i, heads_i, rows_i, d_i, vw_i] =
            ints;
        let value_bias = factors
            .value_bias
            .map_or(NULL, |b| b.device_ptr(&self.stream).0);
        let chunk_cols = latent_value_chunk_cols(m_tiles);
        launch!(
            self,
            values_kernel,
            LaunchConfig {
                grid_dim: (count as u32, splits as u32, vw.div_ceil(chunk_cols) as u32),
                block_dim: (LATENT_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            part_acc.f32_mut()?,
            part_l.f32_mut()?,
            scores.f32()?,
            part_m.f32()?,
            &cache.values,
            &vw_i,
            &order,
            &batch.tok_seq(),
            &batch.tok_visible(),
            &offsets,
            &batch.block_tables(0),
            &max_blocks,
            &block_size,
            &heads_i,
            &splits_i,
            &split_len_i,
            &plan_ptr
        )?;
        let mut w = self.tensor(
            DeviceBuf::Bf16(self.alloc_bf16(heads * count * vw)?),
            vec![heads * count, vw],
        );
        launch!(
            self,
            &self.kernels.latent_combine,
            LaunchConfig {
                grid_dim: (count as u32, heads as u32, 1),
                block_dim: (COMBINE_THREADS, 1, 1),
                shared_mem_bytes: 0,
            },
            w.bf16_mut()?,
            part_acc.f32()?,
            part_m.f32()?,
            part_l.f32()?,
            &rows_i,
            &heads_i,
            &vw_i,
            &splits_i,
            &plan_ptr
        )?;
        // O_g[(group · rows) × D] = W_g · B_v,gᵀ for every KV head g (W head-major).
        let mut o = self.tensor(
            DeviceBuf::Bf16(self.alloc_bf16(heads * count * d)?),
            vec![heads * count, d],
        );
        self.gemm_bf16_raw(
            GemmShape {
                m: d,
                n: group * count,
                k: vw,
                lda: vw,
                ldb: vw,
                ldc: d,
                stride_a: d * vw,
                stride_b: group * count * vw,
                stride_c: group * count * d,
                batch: kv_heads,
            },
            (factors.value_up, 0),
            (w.bf16()?, 0),
            (o.bf16_mut()?, 0),
        )?;
        launch!(
            self,
            &self.kernels.latent_value_out,
            LaunchConfig {
                grid_dim: (count as u32, heads as u32, 1),
                block_dim: (d as u32, 1, 1),
                shared_mem_bytes: 0,
            },
            out,
            o.bf16()?,
            &value_bias,
            &order,
            &rows_i,
            &heads_i,
            &d_i,
            &group_i
        )
    }

    /// Positions the RoPE table must cover for `batch`: its largest position (eager), or every
    /// position a replay of its bucket may see.
    fn rope_positions_needed(&self, batch: &CudaBatch) -> usize {
        match &batch.replay {
            Some(shape) => shape.max_blocks * shape.block_size_tokens,
            None => batch
                .meta
                .positions
                .iter()
                .copied()
                .max()
                .map_or(1, |p| p as usize + 1),
        }
    }

    /// The cos/sin table of `rope` (`[positions][head_dim / 2]` float pairs, computed as the
    /// RoPE kernels compute their angles) covering at least `positions` positions: kept and
    /// grown in powers of two, never while a graph is recorded (a recording reads it in place).
    fn latent_rope_table(
        &self,
        rope: &RopeSpec,
        head_dim: usize,
        positions: usize,
    ) -> Result<Arc<CudaSlice<f32>>, CudaError> {
        let mut guard = self
            .latent_rope_table
            .lock()
            .map_err(|_| CudaError::Shape("latent RoPE table lock poisoned".into()))?;
        if let Some((freqs, capacity, table)) = guard.as_ref() {
            if freqs.as_slice() == rope.inv_freqs && *capacity >= positions {
                return Ok(table.clone());
            }
        }
        self.check_not_recording("the latent RoPE table")?;
        let half = head_dim / 2;
        if rope.inv_freqs.len() != half {
            return Err(CudaError::Shape(format!(
                "latent RoPE: {} frequencies for head_dim {head_dim}",
                rope.inv_freqs.len()
            )));
        }
        let capacity = positions.max(4096).next_power_of_two();
        let freqs = self.rope_freqs(&rope.inv_freqs)?;
        // SAFETY: the kernel below writes every one of the capacity × half pairs.
        let mut table = unsafe { self.stream.alloc::<f32>(2 * capacity * half) }?;
        let (half_i, first, count) = (int_arg(half, "half")?, 0u32, capacity as u32);
        launch!(
            self,
            &self.kernels.latent_rope_table,
            grid_for(capacity * half),
            &mut table,
            freqs.as_ref(),
            &half_i,
            &first,
            &count
        )?;
        let table = Arc::new(table);
        *guard = Some((rope.inv_freqs.clone(), capacity, table.clone()));
        Ok(table)
    }
}

/// The split shape of a latent layer of `num_heads` query heads over `num_kv_heads` key latents
/// cached in `cache` (what its plan depends on besides rows and context).
pub(crate) fn latent_split_shape(
    cache: &CudaKvCache,
    num_heads: usize,
    num_kv_heads: usize,
) -> LatentSplitShape {
    let (_, vw) = cache.plane_widths();
    let (key_words, value_words) = cache.plane_words();
    LatentSplitShape::new(num_heads, num_kv_heads, key_words, value_words, vw)
}
