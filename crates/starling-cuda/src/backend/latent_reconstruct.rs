//! A latent layer's prefill chunks on the GPU: each step's reconstruction plan (scratch slots
//! and block tables for its prefill sequences), the reconstruction of their contexts into a
//! scratch full cache (gather, one GEMM per key head and one for the values, bias and RoPE),
//! and `reconstruct_kv` (a sequence's latents to full K/V).

use cudarc::driver::{CudaSlice, DevicePtr};
use half::bf16;
use starling_backend::cpu::{check_block_table, check_distinct_blocks, physical_slots};
use starling_backend::{AttentionDims, LatentFactors, RopeSpec, RopeStyle};

use super::gemm::GemmShape;
use super::kv_ops::int_arg;
use super::latent::{positions, DeviceFactors, NULL};
use super::{grid_for, CudaBackend, CudaBatch, CudaKvCache};
use crate::kernels::CacheElem;
use crate::{CudaError, CudaTensor};

/// A slot no cache row lives at (padding of a scratch block).
const NO_SLOT: u32 = u32::MAX;

/// One step's reconstruction plan for its prefill sequences (made once per batch, shared by the
/// latent layers): the cache slot behind every scratch slot, and the scratch block tables.
pub(crate) struct PrefillScratchPlan {
    /// `[scratch slots]`: the latent cache slot each reconstructed row comes from.
    pub(super) src_slots: CudaSlice<u32>,
    /// `[sequences, max_blocks]`: sequence `s`'s physical block `b` → scratch block.
    pub(super) tables: CudaSlice<u32>,
    /// Scratch slots (whole blocks).
    pub(super) num_slots: usize,
}

impl CudaBackend {
    /// The batch's prefill reconstruction plan (made on first use).
    pub(super) fn prefill_scratch_plan<'b>(
        &self,
        batch: &'b CudaBatch,
    ) -> Result<&'b PrefillScratchPlan, CudaError> {
        if let Some(plan) = batch.latent_prefill.get() {
            return Ok(plan);
        }
        let bs = batch.meta.block_size_tokens;
        let mut tables = vec![0u32; batch.meta.seqs.len() * batch.max_blocks];
        let mut src = Vec::new();
        let mut next_block = 0usize;
        for (s, seq) in batch.meta.seqs.iter().enumerate() {
            if seq.query_len < 2 {
                continue;
            }
            let blocks = seq.context_len_tokens.div_ceil(bs);
            for b in 0..blocks {
                tables[s * batch.max_blocks + b] = u32::try_from(next_block + b)
                    .map_err(|_| CudaError::Shape("scratch block id exceeds u32".into()))?;
            }
            for j in 0..blocks * bs {
                src.push(if j < seq.context_len_tokens {
                    seq.block_table[j / bs] * bs as u32 + (j % bs) as u32
                } else {
                    NO_SLOT
                });
            }
            next_block += blocks;
        }
        let plan = PrefillScratchPlan {
            num_slots: src.len(),
            src_slots: self.upload_u32(&src)?,
            tables: self.upload_u32(&tables)?,
        };
        // A concurrent caller may have set it first; either plan is the same.
        let _ = batch.latent_prefill.set(plan);
        batch
            .latent_prefill
            .get()
            .ok_or_else(|| CudaError::Shape("latent prefill plan".into()))
    }

    /// Full post-RoPE keys and values `[count, kv_heads · head_dim]` of the latent rows at
    /// `src_slots` (a zero latent where the slot is [`NO_SLOT`]).
    pub(super) fn reconstruct_rows(
        &self,
        cache: &CudaKvCache,
        factors: &DeviceFactors<'_>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        src_slots: &CudaSlice<u32>,
        count: usize,
    ) -> Result<(CudaSlice<bf16>, CudaSlice<bf16>), CudaError> {
        let (kw, vw) = cache.plane_widths();
        let (d, kv) = (dims.head_dim, dims.kv_size());
        let ranks = cache.spec.require_latent("reconstruct")?;
        let mut z = self.alloc_bf16(count * kw)?;
        let mut u = self.alloc_bf16(count * vw)?;
        // SAFETY: the gather writes all `count` positions.
        let mut pos = unsafe { self.stream.alloc::<u32>(count.max(1)) }?;
        for (plane, out, width) in [(&cache.keys, &mut z, kw), (&cache.values, &mut u, vw)] {
            let width_i = int_arg(width, "latent width")?;
            if count * width > 0 {
                launch!(
                    self,
                    self.kernels.latent_gather_rows.get(cache.elem),
                    grid_for(count * width / 8),
                    out,
                    plane,
                    src_slots,
                    &count,
                    &width_i
                )?;
            }
        }
        launch!(
            self,
            &self.kernels.latent_gather_positions,
            grid_for(count),
            &mut pos,
            positions(cache)?,
            src_slots,
            &count
        )?;
        // A head of rank 0 has keys of its bias alone: the GEMMs leave its columns zero.
        let mut k = self.stream.alloc_zeros::<bf16>((count * kv).max(1))?;
        let mut v = self.alloc_bf16(count * kv)?;
        let mut offset = 0;
        for (h, &rank) in ranks.iter().enumerate() {
            if rank > 0 && count > 0 {
                self.gemm_bf16_raw(
                    GemmShape::single(d, count, rank, kw, kw, kv),
                    (factors.key_up, offset),
                    (&z, offset),
                    (&mut k, h * d),
                )?;
            }
            offset += rank;
        }
        if count > 0 {
            self.gemm_bf16_raw(
                GemmShape::single(kv, count, vw, vw, vw, kv),
                (factors.value_up, 0),
                (&u, 0),
                (&mut v, 0),
            )?;
        }
        let freqs = self.rope_freqs(&rope.inv_freqs)?;
        let key_bias = factors
            .key_bias
            .map_or(NULL, |b| b.device_ptr(&self.stream).0);
        let value_bias = factors
            .value_bias
            .map_or(NULL, |b| b.device_ptr(&self.stream).0);
        let ints = [
            int_arg(dims.num_kv_heads, "KV heads")?,
            int_arg(d, "head_dim")?,
            i32::from(rope.style == RopeStyle::Interleaved),
        ];
        if count > 0 {
            launch!(
                self,
                &self.kernels.latent_finish_kv,
                grid_for(count * (kv / 2 + kv)),
                &mut k,
                &mut v,
                &pos,
                &key_bias,
                &value_bias,
                freqs.as_ref(),
                &count,
                &ints[0],
                &ints[1],
                &ints[2]
            )?;
        }
        Ok((k, v))
    }

    #[allow(clippy::too_many_arguments)]
    pub(super) fn reconstruct_kv_impl(
        &self,
        latent: &CudaKvCache,
        factors: &LatentFactors<'_, CudaTensor>,
        dims: &AttentionDims,
        rope: &RopeSpec,
        block_table: &[u32],
        len_tokens: usize,
        dense: &mut CudaKvCache,
        dense_table: &[u32],
    ) -> Result<(), CudaError> {
        let op = "reconstruct_kv";
        let dev = DeviceFactors::new(factors, latent, dims, op)?;
        let bs = latent.spec.block_size_tokens;
        let src = physical_slots(&latent.spec, block_table, bs, len_tokens, op)?;
        if dense.full_dims(op)? != (dims.num_kv_heads, dims.head_dim) {
            return Err(CudaError::Shape(format!(
                "{op}: a full cache of {:?} for {dims:?}",
                dense.spec.layout
            )));
        }
        // The reconstructed rows are bf16 and scattered as they are: an fp8 destination would
        // need its own quantising write (the engine reconstructs into the activation dtype).
        if dense.elem != CacheElem::Bf16 {
            return Err(CudaError::Shape(format!(
                "{op}: reconstructs into a bf16 full cache, not {:?}",
                dense.elem
            )));
        }
        let dense_bs = dense.spec.block_size_tokens;
        check_block_table(&dense.spec, dense_table, dense_bs, len_tokens, op)?;
        check_distinct_blocks(dense_table, dense_bs, len_tokens, op)?;
        if len_tokens == 0 {
            return Ok(());
        }
        let src = self.upload_u32(&src)?;
        let (k, v) = self.reconstruct_rows(latent, &dev, dims, rope, &src, len_tokens)?;
        let table = self.upload_u32(dense_table)?;
        let kv = dims.kv_size();
        self.scatter_rows_of(&mut dense.keys, &table, dense_bs, &k, len_tokens, kv)?;
        self.scatter_rows_of(&mut dense.values, &table, dense_bs, &v, len_tokens, kv)
    }
}
