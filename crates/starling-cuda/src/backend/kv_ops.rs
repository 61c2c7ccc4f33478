//! Cache-management ops on the GPU (kernels in `kernels/kv_cache.cu`): whole-block copies, one
//! sequence's K/V gathered to contiguous tensors or scattered back, key read-back, and eviction
//! compaction. Arguments are checked on the host by the functions the CPU reference uses
//! (`starling_backend::cpu::check_*`), before anything is launched, so both backends reject the
//! same input and a rejected call leaves the cache untouched. Rows move as bf16 words: an fp8
//! cache's row of `w` elements is `w / 2` words ([`CudaKvCache::plane_words`]; a latent layer's
//! key and value planes alike, its positions two words per slot whatever the element), so its
//! gathered rows are raw words (`[len, w / 2]`), which only a scatter into an fp8 cache reads
//! back. An fp8 latent row of `w` bytes is `w / 2` words, a multiple of 4 but not always of 8:
//! the row kernels then move it word by word (their scalar path), never as misaligned vectors.

use cudarc::driver::{CudaSlice, LaunchConfig};
use half::bf16;
use starling_backend::cpu::{
    check_block_copies, check_block_table, check_compaction, check_distinct_blocks, scatter_len,
};
use starling_backend::{AttentionDims, BackendError, HostTensor, KvRows};

use super::kv_cache::POSITION_WORDS;
use super::{err, grid_for, row_chunk_threads, rows_config, CudaBackend, CudaBatch, CudaKvCache};
use crate::kernels::CacheElem;
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

/// The cache's planes as `(buffer, bf16 words per slot)`: keys, values and, for a latent layer,
/// the positions (two bf16 words per slot, moved bit for bit like any row).
fn planes(cache: &CudaKvCache) -> Vec<(&CudaSlice<bf16>, usize)> {
    let (kw, vw) = cache.plane_words();
    let mut planes = vec![(&cache.keys, kw), (&cache.values, vw)];
    if let Some(p) = &cache.positions {
        planes.push((p, POSITION_WORDS));
    }
    planes
}

/// [`planes`], mutably.
fn planes_mut(cache: &mut CudaKvCache) -> Vec<(&mut CudaSlice<bf16>, usize)> {
    let (kw, vw) = cache.plane_words();
    let CudaKvCache {
        keys,
        values,
        positions,
        ..
    } = cache;
    let mut planes = vec![(keys, kw), (values, vw)];
    if let Some(p) = positions.as_mut() {
        planes.push((p, POSITION_WORDS));
    }
    planes
}

/// The row count of `rows` scattered into an fp8 cache: raw words (`gather_kv`'s), `[n, words]`
/// for each plane, and `n` positions for a latent layer (none for a full one).
fn fp8_scatter_len(cache: &CudaKvCache, rows: &KvRows<CudaTensor>) -> Result<usize, CudaError> {
    let (kw, vw) = cache.plane_words();
    let n = match (rows.keys.shape(), rows.values.shape()) {
        ([n, k], [m, v]) if n == m && *k == kw && *v == vw => *n,
        (k, v) => {
            return Err(CudaError::Shape(format!(
                "scatter_kv: rows of {k:?} and {v:?} into an fp8 cache of {kw} + {vw} words \
                 per slot"
            )))
        }
    };
    let want_positions = if cache.spec.is_latent() { n } else { 0 };
    if rows.positions.len() != want_positions {
        return Err(CudaError::Shape(format!(
            "scatter_kv: {} positions for {n} rows of an fp8 {} layer",
            rows.positions.len(),
            if cache.spec.is_latent() {
                "latent"
            } else {
                "full"
            }
        )));
    }
    Ok(n)
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
        let bs = cache.spec.block_size_tokens;
        // One launch per plane: their widths differ in a latent layer.
        for (plane, width) in planes_mut(cache) {
            let block_elems = bs * width;
            let cfg = LaunchConfig {
                grid_dim: (num_pairs, 1, 1),
                block_dim: (COPY_THREADS, 1, 1),
                shared_mem_bytes: 0,
            };
            launch!(
                self,
                &self.kernels.copy_kv_blocks,
                cfg,
                plane,
                &dev_pairs,
                &block_elems
            )?;
        }
        Ok(())
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
    pub(super) fn scatter_rows_of(
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
    ) -> Result<KvRows<CudaTensor>, CudaError> {
        check_block_table(
            &cache.spec,
            block_table,
            block_size_tokens,
            len_tokens,
            "gather_kv",
        )?;
        let table = self.upload_u32(block_table)?;
        let mut gathered = Vec::with_capacity(3);
        for (plane, width) in planes(cache) {
            gathered.push((
                self.gather_rows_of(plane, &table, block_size_tokens, len_tokens, width)?,
                width,
            ));
        }
        let positions = match gathered.get(2) {
            Some((words, _)) => {
                let raw: Vec<bf16> = self.stream.clone_dtoh(words)?;
                raw.chunks_exact(POSITION_WORDS)
                    .take(len_tokens)
                    .map(|w| u32::from(w[0].to_bits()) | (u32::from(w[1].to_bits()) << 16))
                    .collect()
            }
            None => Vec::new(),
        };
        let mut planes = gathered.into_iter();
        let mut next = |what: &str| {
            planes
                .next()
                .map(|(buf, width)| self.tensor(DeviceBuf::Bf16(buf), vec![len_tokens, width]))
                .ok_or_else(|| CudaError::Shape(format!("gather_kv: no {what} plane")))
        };
        Ok(KvRows {
            keys: next("key")?,
            values: next("value")?,
            positions,
        })
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
        let (nkv, hd) = cache.full_dims("read_keys")?;
        let table = self.upload_u32(block_table)?;
        let words = cache.elem.words(nkv * hd);
        let k = self.gather_rows_of(&cache.keys, &table, block_size_tokens, len_tokens, words)?;
        let raw: Vec<bf16> = self.stream.clone_dtoh(&k)?;
        let raw = &raw[..len_tokens * words];
        let data = match cache.elem {
            CacheElem::Bf16 => raw.iter().map(|x| x.to_f32()).collect(),
            // Two e4m3 bytes per word, the lower element in the low byte (little-endian).
            CacheElem::Fp8 => raw
                .iter()
                .flat_map(|w| w.to_bits().to_le_bytes())
                .map(starling_backend::fp8::e4m3_to_f32)
                .collect(),
        };
        Ok(HostTensor::new(vec![len_tokens, nkv, hd], data)?)
    }

    pub(super) fn scatter_kv_impl(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        rows: &KvRows<CudaTensor>,
    ) -> Result<(), CudaError> {
        let len = match cache.elem {
            CacheElem::Bf16 => scatter_len(
                &cache.spec,
                rows.keys.shape(),
                rows.values.shape(),
                rows.positions.len(),
            )?,
            // An fp8 cache's rows are the raw words its gather_kv returned (and, for latents,
            // one position per row, as for bf16).
            CacheElem::Fp8 => fp8_scatter_len(cache, rows)?,
        };
        check_block_table(
            &cache.spec,
            block_table,
            block_size_tokens,
            len,
            "scatter_kv",
        )?;
        check_distinct_blocks(block_table, block_size_tokens, len, "scatter_kv")?;
        if let Some(&max) = rows.positions.iter().max() {
            cache.position_bound = cache.position_bound.max(max as usize + 1);
        }
        let words: Vec<bf16> = rows
            .positions
            .iter()
            .flat_map(|&p| {
                [
                    bf16::from_bits((p & 0xffff) as u16),
                    bf16::from_bits((p >> 16) as u16),
                ]
            })
            .collect();
        let positions = match words.is_empty() {
            true => None,
            false => Some(self.stream.clone_htod(&words)?),
        };
        let table = self.upload_u32(block_table)?;
        let sources = [
            Some(rows.keys.bf16()?),
            Some(rows.values.bf16()?),
            positions.as_ref(),
        ];
        for ((plane, width), src) in planes_mut(cache).into_iter().zip(sources) {
            if let Some(src) = src {
                self.scatter_rows_of(plane, &table, block_size_tokens, src, len, width)?;
            }
        }
        Ok(())
    }

    /// Gathers each list's kept rows into a scratch copy, then scatters the scratch to physical
    /// tokens `0..count`: two launches per plane on one stream, so sources that overlap
    /// destinations are read before anything is written. A full layer has one list per head
    /// (each head's segment of both planes moves on its own); a latent layer has one list, and
    /// its key row, value row and position move together.
    pub(super) fn compact_kv_impl(
        &self,
        cache: &mut CudaKvCache,
        block_table: &[u32],
        block_size_tokens: usize,
        physical_len_tokens: usize,
        keep: &[Vec<u32>],
    ) -> Result<(), CudaError> {
        let count = check_compaction(
            &cache.spec,
            block_table,
            block_size_tokens,
            physical_len_tokens,
            keep,
        )?;
        if count == 0 {
            return Ok(());
        }
        let table = self.upload_u32(block_table)?;
        let kept = self.upload_u32(&keep.concat())?;
        self.move_kept_rows(cache, &table, block_size_tokens, &kept, count, keep.len())
    }

    /// The moves of a compaction whose kept indices are on the device: `kept` holds `lists`
    /// lists of `count` physical indices (`[lists, count]`, checked by the caller), each list's
    /// rows gathered into a scratch copy and scattered to physical tokens `0..count`.
    pub(super) fn move_kept_rows(
        &self,
        cache: &mut CudaKvCache,
        table: &CudaSlice<u32>,
        block_size_tokens: usize,
        kept: &CudaSlice<u32>,
        count: usize,
        lists: usize,
    ) -> Result<(), CudaError> {
        let bs = int_arg(block_size_tokens, "block size")?;
        let lists_i = int_arg(lists, "kept-index lists")?;
        let mut scratches = Vec::with_capacity(3);
        for (plane, width) in planes(cache) {
            // Each list moves a `width / lists` segment of the row (positions: one list).
            let segment = width / lists;
            let mut scratch = self.alloc_bf16(count * width)?;
            let segment_i = int_arg(segment, "row segment")?;
            launch!(
                self,
                &self.kernels.gather_kept_rows,
                rows_grid(count * lists, segment),
                plane,
                table,
                &bs,
                kept,
                &mut scratch,
                &count,
                &lists_i,
                &segment_i
            )?;
            scratches.push((scratch, width));
        }
        for ((plane, width), (scratch, _)) in planes_mut(cache).into_iter().zip(&scratches) {
            self.scatter_rows_of(plane, table, block_size_tokens, scratch, count, width)?;
        }
        Ok(())
    }
}

impl CudaBackend {
    /// `Backend::write_kv`: each token's K and V into its slot.
    pub(super) fn write_kv_impl(
        &self,
        cache: &mut CudaKvCache,
        qkv: &CudaTensor,
        dims: &AttentionDims,
        batch: &CudaBatch,
    ) -> Result<(), BackendError> {
        let (n, width) = qkv.matrix_dims().map_err(err)?;
        if width != dims.qkv_size()
            || n != batch.meta.num_tokens()
            || cache.full_dims("write_kv").map_err(err)? != (dims.num_kv_heads, dims.head_dim)
        {
            return Err(BackendError::Shape(format!(
                "write_kv: [{n}, {width}] into {:?} for {dims:?}",
                cache.spec
            )));
        }
        let (width_i, q_i, kv_i) = (width as i32, dims.q_size() as i32, dims.kv_size() as i32);
        if n == 0 {
            return Ok(());
        }
        let function = self.kernels.write_kv.get(cache.elem);
        let CudaKvCache { keys, values, .. } = cache;
        launch!(
            self,
            function,
            rows_config(n, row_chunk_threads(dims.kv_size())),
            qkv.bf16().map_err(err)?,
            &batch.slots(dims.cache_group),
            keys,
            values,
            &width_i,
            &q_i,
            &kv_i
        )
        .map_err(err)
    }
}
