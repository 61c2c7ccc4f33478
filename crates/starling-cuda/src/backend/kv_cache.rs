//! One layer's paged cache in device memory, for every layout [`KvCacheSpec`] describes: a key
//! plane `[num_slots, key_width]` and a value plane `[num_slots, value_width]` (slot-major; bf16,
//! or fp8 e4m3 bytes — full K/V or STAR-KV latents — stored as half as many bf16 words per row so
//! that the row-moving kernels move them unchanged); a STAR-KV latent layer also keeps one
//! position per slot (a `u32`, whatever the element) and, for its kernels, each head's latent
//! offset and rank.

use cudarc::driver::CudaSlice;
use half::bf16;
use starling_backend::KvCacheSpec;
use starling_kv::{CacheDtype, LayerLayout};

use super::CudaBackend;
use crate::kernels::CacheElem;
use crate::CudaError;

/// One layer's cache on the GPU.
pub struct CudaKvCache {
    pub(crate) spec: KvCacheSpec,
    /// What the key and value planes hold: bf16, or fp8 bytes (full K/V or latents).
    pub(crate) elem: CacheElem,
    /// `[num_slots, key_width]` elements: `elem.words(key_width)` bf16 words per slot.
    pub(crate) keys: CudaSlice<bf16>,
    /// `[num_slots, value_width]` elements, as the keys.
    pub(crate) values: CudaSlice<bf16>,
    /// A latent layer's position of every slot: a `u32` stored as two bf16 words, so the row
    /// kernels that move cache rows (copies, gathers, compaction) move it bit for bit; the
    /// attention kernels read it as `u32`. `None` for a full layer.
    pub(crate) positions: Option<CudaSlice<bf16>>,
    /// A latent layer's `(offset, rank)` of each KV head's key latent in the key row.
    pub(crate) latent_heads: Option<CudaSlice<i32>>,
    /// One past the largest position ever stored (latent layers): the decode kernels rotate
    /// keys from a cos/sin table that must cover every stored position, which may exceed the
    /// batch's own (rows scattered in, positions kept across compaction).
    pub(crate) position_bound: usize,
}

/// bf16 words of one slot's position.
pub(crate) const POSITION_WORDS: usize = 2;

impl CudaKvCache {
    /// The cache geometry.
    pub fn spec(&self) -> &KvCacheSpec {
        &self.spec
    }

    /// `(num_kv_heads, head_dim)` of a full layer, or an error naming `op`.
    pub(crate) fn full_dims(&self, op: &str) -> Result<(usize, usize), CudaError> {
        self.spec.require_full(op).map_err(CudaError::from)
    }

    /// Elements per slot of the key and value planes.
    pub(crate) fn plane_widths(&self) -> (usize, usize) {
        self.spec.plane_widths()
    }

    /// bf16 words per slot of the key and value planes: what the row-moving kernels (copies,
    /// gathers, scatters, compaction) move.
    pub(crate) fn plane_words(&self) -> (usize, usize) {
        let (kw, vw) = self.spec.plane_widths();
        (self.elem.words(kw), self.elem.words(vw))
    }
}

impl CudaBackend {
    /// A zero-filled cache of `spec`: bf16, or fp8 (on sm_89+, which converts fp8 in hardware)
    /// for a full layer of head width a multiple of 8 or a latent layer.
    pub(crate) fn alloc_kv_cache_impl(&self, spec: &KvCacheSpec) -> Result<CudaKvCache, CudaError> {
        let elem = cache_elem(spec, self.fp8_cache, &self.name)?;
        let (kw, vw) = spec.plane_widths();
        let (kw, vw) = (elem.words(kw), elem.words(vw));
        let slots = spec.num_slots();
        let zeros = |n: usize| self.stream().alloc_zeros::<bf16>(n.max(1));
        let (positions, latent_heads) = match spec.latent_key_ranks() {
            None => (None, None),
            Some(ranks) => {
                let mut heads = Vec::with_capacity(2 * ranks.len());
                let mut offset = 0;
                for &rank in ranks {
                    heads.push(i32::try_from(offset).map_err(|_| shape("latent offset"))?);
                    heads.push(i32::try_from(rank).map_err(|_| shape("latent rank"))?);
                    offset += rank;
                }
                (
                    Some(zeros(slots * POSITION_WORDS)?),
                    Some(self.stream().clone_htod(&heads)?),
                )
            }
        };
        Ok(CudaKvCache {
            spec: spec.clone(),
            elem,
            keys: zeros(slots * kw)?,
            values: zeros(slots * vw)?,
            positions,
            latent_heads,
            position_bound: 0,
        })
    }
}

/// The element `spec`'s planes hold on a device named `device` (which converts fp8 in hardware
/// when `converts_fp8`: sm_89+), or why the CUDA backend cannot cache it.
fn cache_elem(
    spec: &KvCacheSpec,
    converts_fp8: bool,
    device: &str,
) -> Result<CacheElem, CudaError> {
    let fp8 = match (&spec.layout, spec.layout.dtype()) {
        (_, CacheDtype::BF16) => return Ok(CacheElem::Bf16),
        (LayerLayout::Full { head_dim, .. }, CacheDtype::Fp8) if head_dim % 8 == 0 => {
            CacheElem::Fp8
        }
        (
            LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            },
            CacheDtype::Fp8,
        ) => {
            check_fp8_latent_ranks(key_rank_per_head, *value_rank)?;
            CacheElem::Fp8
        }
        (_, quantised @ (CacheDtype::Int8 | CacheDtype::Int4)) => {
            return Err(CudaError::Shape(format!(
                "an {} KV cache has no CUDA kernels yet (the CPU reference stores it): use \
                     --kv-cache-dtype auto or fp8 on the GPU",
                format!("{quantised:?}").to_lowercase()
            )))
        }
        (layout, dtype) => {
            return Err(CudaError::Shape(format!(
                "the CUDA backend caches bf16 (and fp8 full K/V of head widths that are \
                     multiples of 8, and fp8 STAR-KV latents), not {dtype:?} for {layout:?}"
            )))
        }
    };
    if !converts_fp8 {
        return Err(CudaError::Shape(format!(
            "an fp8 KV cache (full K/V or STAR-KV latents) needs a GPU that converts fp8 \
             (compute capability 8.9 or newer); {device} does not: use --kv-cache-dtype auto"
        )));
    }
    Ok(fp8)
}

/// The fp8 latent kernels copy a latent row in 8-byte pieces (one byte per element; cp.async
/// takes 4, 8 or 16 bytes, and a row starts 8-byte aligned only when every rank before it is a
/// multiple of 8), so every stored rank must be a multiple of 8 — as the model pads them
/// (`starling_kv::LATENT_RANK_MULTIPLE`). Refused here rather than read misaligned later.
fn check_fp8_latent_ranks(key_rank_per_head: &[usize], value_rank: usize) -> Result<(), CudaError> {
    let multiple = starling_kv::LATENT_RANK_MULTIPLE;
    match key_rank_per_head
        .iter()
        .chain([&value_rank])
        .find(|r| !r.is_multiple_of(multiple))
    {
        Some(r) => Err(CudaError::Shape(format!(
            "an fp8 STAR-KV latent cache needs stored ranks that are multiples of {multiple} \
             (the fp8 kernels copy 8-byte pieces); rank {r} is not"
        ))),
        None => Ok(()),
    }
}

fn shape(what: &str) -> CudaError {
    CudaError::Shape(format!("{what} does not fit an int"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn latent(ranks: &[usize], value_rank: usize, dtype: CacheDtype) -> KvCacheSpec {
        KvCacheSpec {
            num_blocks: 4,
            block_size_tokens: 16,
            layout: LayerLayout::LowRank {
                key_rank_per_head: ranks.to_vec(),
                value_rank,
                dtype,
            },
        }
    }

    fn refusal(spec: &KvCacheSpec, converts_fp8: bool) -> String {
        match cache_elem(spec, converts_fp8, "GPU X") {
            Ok(elem) => panic!("{spec:?} accepted as {elem:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn fp8_latents_are_cached_as_bytes_on_gpus_that_convert_fp8() {
        let fp8 = latent(&[64, 72, 0], 128, CacheDtype::Fp8);
        assert_eq!(cache_elem(&fp8, true, "H100").ok(), Some(CacheElem::Fp8));
        let bf16 = latent(&[64, 72, 0], 128, CacheDtype::BF16);
        assert_eq!(cache_elem(&bf16, false, "A100").ok(), Some(CacheElem::Bf16));
        let full = KvCacheSpec::full(4, 16, 2, 128, CacheDtype::Fp8);
        assert_eq!(cache_elem(&full, true, "H100").ok(), Some(CacheElem::Fp8));
        // One byte per element: a latent row of 64 + 72 + 0 key elements is 68 bf16 words.
        assert_eq!(CacheElem::Fp8.words(136), 68);
    }

    #[test]
    fn fp8_caches_are_refused_with_the_reason_where_the_kernels_cannot_run() {
        let fp8 = latent(&[64, 72], 128, CacheDtype::Fp8);
        let old_gpu = refusal(&fp8, false);
        assert!(
            old_gpu.contains("8.9") && old_gpu.contains("GPU X") && old_gpu.contains("auto"),
            "{old_gpu}"
        );
        // Ranks the 8-byte copies cannot take (the model always pads to multiples of 8).
        for (ranks, value_rank) in [(vec![64, 12], 128), (vec![64, 72], 100)] {
            let odd = latent(&ranks, value_rank, CacheDtype::Fp8);
            let why = refusal(&odd, true);
            assert!(why.contains("multiples of 8"), "{why}");
        }
        let narrow = KvCacheSpec::full(4, 16, 2, 36, CacheDtype::Fp8);
        assert!(refusal(&narrow, true).contains("multiples of 8"));
        let int8 = latent(&[64], 64, CacheDtype::Int8);
        assert!(refusal(&int8, true).contains("int8"));
        let int4 = KvCacheSpec::full(4, 16, 2, 64, CacheDtype::Int4);
        assert!(refusal(&int4, true).contains("int4 KV cache has no CUDA kernels"));
    }
}
