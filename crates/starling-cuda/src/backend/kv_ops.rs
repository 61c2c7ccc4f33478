//! Cache-management ops on the GPU (kernels in `kernels/kv_cache.cu`): whole-block copies, one
//! sequence's K/V gathered to contiguous tensors or scattered back, key read-back, and eviction
//! compaction. Arguments are checked on the host by the functions the CPU reference uses
//! (`starling_backend::cpu::check_*`), before anything is launched, so both backends reject the
//! same input and a rejected call leaves the cache untouched.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;
use starling_backend::cpu::{
    check_block_copies, check_block_table, check_compaction, check_distinct_blocks, scatter_len,
};
use starling_backend::HostTensor;

use super::{grid_for, CudaBackend, CudaKvCache};
use crate::{CudaError, CudaTensor, DeviceBuf};

/// Threads per CUDA block of the block-copy kernel (one CUDA block per copied block and tensor).
const COPY_THREADS: u32 = 256;

/// `x` as a kernel's `int` argument.
pub(super) fn int_arg(x: usize, what: &str) -> Result<i32, CudaError> {
    i32::try_from(x).map_err(|_| CudaError::Shape(format!("{what} {x} does not fit an int")))
}

/// Grid for a grid-stride kernel over `rows` rows of `row_elems` bf16, moved as 16-byte vectors
/// when `row_elems` is a multiple of 8 (the kernels pick the same way).
fn rows_grid(rows: usize, row_elems: usize) -> LaunchConfig {
    let units = if row_elems.is_multiple_of(8) {
        rows * row_elems / 8
    } else {
        rows * row_elems
    };
    grid_for(units)
}

impl CudaBackend {
    pub(super) fn copy_kv_blocks_impl(
        &self,
        cache: &mut CudaKvCache,
        pairs: &[(u32, u32)],
    ) -> Result<(), CudaError> {
        check_block_copies(cache.spec.num_blocks, pairs)?;
        if pairs.is_empty() {
            return Ok(());
        }
        // Destinations are distinct block ids, so the grid never exceeds the number of blocks.
        let num_pairs = int_arg(pairs.len(), "copy_kv_blocks: pair count")? as u32;
        let flat: Vec<u32> = pairs.iter().flat_map(|&(s, d)| [s, d]).collect();
        let dev_pairs = self.upload_u32(&flat)?;
        let spec = cache.spec;
        let block_elems = spec.block_size_tokens * spec.num_kv_heads * spec.head_dim;
        let cfg = LaunchConfig {
            grid_dim: (num_pairs, 2, 1),
            block_dim: (COPY_THREADS, 1, 1),
            shared_mem_bytes: 0,
        };
        let CudaKvCache { keys, values, .. } = cache;
        launch!(
            self,
            &self.kernels.copy_kv_blocks,
            cfg,
            keys,
            values,
            &dev_pairs,
            &block_elems
        )
    }

    /// Rows `0..len` of one sequence (`table` on the device) out of one cache tensor, `[len,
    /// row_elems]` contiguous.
    fn gather_rows_of(
        &self,
        src: &CudaSlice<bf16>,
        table: &CudaSlice<u32>,
        block_size_tokens: usize,
        len: usize,
        row_elems: usize,
    ) -> Result<CudaSlice<bf16>, CudaError> {
        let mut out = self.alloc_bf16(len * row_elems)?;
        if len * row_elems > 0 {
            let bs = int_arg(block_size_tokens, "block size")?;
            let row = int_arg(row_elems, "row width")?;
            launch!(
                self,
                &self.kernels.gather_paged_rows,
                rows_grid(len, row_elems),
                src,
                table,
                &bs,
                &mut out,
                &len,
                &row
            )?;
        }
        Ok(out)
    }

    /// Writes `rows` (`[len, row_elems]`) to rows `0..len` of one sequence in one cache tensor.
    fn scatter_rows_of(
        &self,
        dst: &mut CudaSlice<bf16>,
        table: &CudaSlice<u32>,
        block_size_tokens: usize,
        rows: &CudaSlice<bf16>,
        len: usize,
        row_elems: usize,
    ) -> Result<(), CudaError> {
        if len * row_elems == 0 {
            return Ok(());
        }
        let bs = int_arg(block_size_tokens, "block size")?;
        let row = int_arg(row_elems, "row width")?;
        launch!(
            self,
            &self.kernels.scatter_paged_rows,
            rows_grid(len, row_elems),
            dst,
            table,
            &bs,
            rows,
            &len,
            &row
        )
    }

    pub(super) fn gather_kv_impl(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<(CudaTensor, CudaTensor), CudaError> {
        check_block_table(
            &cache.spec,
            block_table,
            block_size_tokens,
            len_tokens,
            "gather_kv",
        )?;
        let width = cache.spec.num_kv_heads * cache.spec.head_dim;
        let table = self.upload_u32(block_table)?;
        let k = self.gather_rows_of(&cache.keys, &table, block_size_tokens, len_tokens, width)?;
        let v = self.gather_rows_of(&cache.values, &table, block_size_tokens, len_tokens, width)?;
        Ok((
            self.tensor(DeviceBuf::Bf16(k), vec![len_tokens, width]),
            self.tensor(DeviceBuf::Bf16(v), vec![len_tokens, width]),
        ))
    }

    pub(super) fn read_keys_impl(
        &self,
        cache: &CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        len_tokens: usize,
    ) -> Result<HostTensor, CudaError> {
        check_block_table(
            &cache.spec,
            block_table,
            block_size_tokens,
            len_tokens,
            "read_keys",
        )?;
        let (nkv, hd) = (cache.spec.num_kv_heads, cache.spec.head_dim);
        let table = self.upload_u32(block_table)?;
        let k =
            self.gather_rows_of(&cache.keys, &table, block_size_tokens, len_tokens, nkv * hd)?;
        let raw: Vec<bf16> = self.stream.clone_dtoh(&k)?;
        let data = raw[..len_tokens * nkv * hd]
            .iter()
            .map(|x| x.to_f32())
            .collect();
        Ok(HostTensor::new(vec![len_tokens, nkv, hd], data)?)
    }

    pub(super) fn scatter_kv_impl(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        k: &CudaTensor,
        v: &CudaTensor,
    ) -> Result<(), CudaError> {
        let width = cache.spec.num_kv_heads * cache.spec.head_dim;
        let len = scatter_len(k.shape(), v.shape(), width)?;
        check_block_table(
            &cache.spec,
            block_table,
            block_size_tokens,
            len,
            "scatter_kv",
        )?;
        check_distinct_blocks(block_table, block_size_tokens, len, "scatter_kv")?;
        let (kb, vb) = (k.bf16()?, v.bf16()?);
        let table = self.upload_u32(block_table)?;
        self.scatter_rows_of(&mut cache.keys, &table, block_size_tokens, kb, len, width)?;
        self.scatter_rows_of(&mut cache.values, &table, block_size_tokens, vb, len, width)
    }

    /// Gathers each head's kept rows into a scratch copy, then scatters the scratch to physical
    /// tokens `0..count`: two launches on one stream, so sources that overlap destinations are
    /// read before anything is written.
    pub(super) fn compact_kv_impl(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        physical_len_tokens: usize,
        keep: &[Vec<u32>],
    ) -> Result<(), CudaError> {
        let spec = cache.spec;
        let count = check_compaction(
            &spec,
            block_table,
            block_size_tokens,
            physical_len_tokens,
            keep,
        )?;
        let (nkv, hd) = (spec.num_kv_heads, spec.head_dim);
        let width = nkv * hd;
        if count * width == 0 {
            return Ok(());
        }
        let table = self.upload_u32(block_table)?;
        let kept = self.upload_u32(&keep.concat())?;
        let bs = int_arg(block_size_tokens, "block size")?;
        let (nkv_i, hd_i) = (int_arg(nkv, "KV heads")?, int_arg(hd, "head_dim")?);
        let mut scratch_k = self.alloc_bf16(count * width)?;
        let mut scratch_v = self.alloc_bf16(count * width)?;
        for (src, scratch) in [
            (&cache.keys, &mut scratch_k),
            (&cache.values, &mut scratch_v),
        ] {
            launch!(
                self,
                &self.kernels.gather_kept_rows,
                rows_grid(count * nkv, hd),
                src,
                &table,
                &bs,
                &kept,
                scratch,
                &count,
                &nkv_i,
                &hd_i
            )?;
        }
        self.scatter_rows_of(
            &mut cache.keys,
            &table,
            block_size_tokens,
            &scratch_k,
            count,
            width,
        )?;
        self.scatter_rows_of(
            &mut cache.values,
            &table,
            block_size_tokens,
            &scratch_v,
            count,
            width,
        )
    }
}
