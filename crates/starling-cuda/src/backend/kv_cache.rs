//! One layer's paged cache in device memory, for every layout [`KvCacheSpec`] describes: a key
//! plane `[num_slots, key_width]` and a value plane `[num_slots, value_width]` (slot-major; bf16,
//! or for a full layer fp8 e4m3 bytes, stored as half as many bf16 words per row so that the
//! row-moving kernels move them unchanged); a STAR-KV latent layer also keeps one position per
//! slot and, for its kernels, each head's latent offset and rank.

use cudarc::driver::CudaSlice;
use half::bf16;
use starling_backend::KvCacheSpec;

use super::CudaBackend;
use crate::kernels::CacheElem;
use crate::CudaError;

/// One layer's cache on the GPU.
pub struct CudaKvCache {
    pub(crate) spec: KvCacheSpec,
    /// What the planes hold: bf16, or (full layers) fp8 bytes.
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
    /// A zero-filled cache of `spec`: bf16, or fp8 for a full layer (on sm_89+, which converts
    /// fp8 in hardware).
    pub(crate) fn alloc_kv_cache_impl(&self, spec: &KvCacheSpec) -> Result<CudaKvCache, CudaError> {
        use starling_kv::{CacheDtype, LayerLayout};
        let elem =
            match (&spec.layout, spec.layout.dtype()) {
                (_, CacheDtype::BF16) => CacheElem::Bf16,
                (LayerLayout::Full { head_dim, .. }, CacheDtype::Fp8) if head_dim % 8 == 0 => {
                    if !self.fp8_cache {
                        return Err(CudaError::Shape(format!(
                        "an fp8 KV cache needs a GPU that converts fp8 (compute capability 8.9 \
                         or newer); {} does not: use --kv-cache-dtype auto",
                        self.name
                    )));
                    }
                    CacheElem::Fp8
                }
                (LayerLayout::LowRank { .. }, CacheDtype::Fp8) => {
                    return Err(CudaError::Shape(
                        "fp8 STAR-KV latents have no CUDA kernels yet (the CPU reference stores \
                     them): use --kv-cache-dtype auto with a STAR-KV checkpoint on the GPU"
                            .into(),
                    ))
                }
                (_, CacheDtype::Int8) => return Err(CudaError::Shape(
                    "an int8 KV cache has no CUDA kernels yet (the CPU reference stores it): use \
                     --kv-cache-dtype auto or fp8 on the GPU"
                        .into(),
                )),
                (layout, dtype) => {
                    return Err(CudaError::Shape(format!(
                        "the CUDA backend caches bf16 (and fp8 full K/V of head widths that are \
                     multiples of 8), not {dtype:?} for {layout:?}"
                    )))
                }
            };
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

fn shape(what: &str) -> CudaError {
    CudaError::Shape(format!("{what} does not fit an int"))
}
