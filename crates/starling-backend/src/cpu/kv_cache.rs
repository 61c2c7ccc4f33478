//! One layer's paged cache in host memory (f32): the CPU reference of every cache layout and
//! element type (an fp8 cache holds e4m3-rounded values in its f32 slots).
//!
//! Two planes, slot-major, as [`KvCacheSpec`] describes them for every backend: keys
//! `[num_slots, key_width]` and values `[num_slots, value_width]`; a latent layer also keeps one
//! position per slot.

use super::matrix_dims;
use crate::{AttentionDims, BackendError, HostTensor, KvCacheSpec};

/// One layer's cache: full K/V (`[num_slots, num_kv_heads, head_dim]` per plane) or STAR-KV
/// latents (key latents, value latent and position per slot), f32.
#[derive(Clone, Debug)]
pub struct CpuKvCache {
    spec: KvCacheSpec,
    key_width: usize,
    value_width: usize,
    keys: Vec<f32>,
    values: Vec<f32>,
    /// One per slot for a latent layer; empty for a full one.
    positions: Vec<u32>,
}

impl CpuKvCache {
    /// A zero-filled cache.
    pub fn new(spec: KvCacheSpec) -> Result<Self, BackendError> {
        let (key_width, value_width) = spec.plane_widths();
        let slots = spec.num_slots();
        let len = |width: usize| {
            slots
                .checked_mul(width)
                .filter(|n| n.saturating_mul(std::mem::size_of::<f32>()) <= isize::MAX as usize)
                .ok_or_else(|| BackendError::OutOfMemory(format!("cache of {spec:?} overflows")))
        };
        // Fail cleanly on an impossible size before asking the allocator (which would abort).
        let (key_len, value_len) = (len(key_width)?, len(value_width)?);
        if key_len.saturating_add(value_len) > isize::MAX as usize / std::mem::size_of::<f32>() {
            return Err(BackendError::OutOfMemory(format!(
                "KV cache of {key_len} + {value_len} f32"
            )));
        }
        let positions = if spec.is_latent() {
            vec![0; slots]
        } else {
            Vec::new()
        };
        // `vec![0.0; n]` maps zeroed pages lazily, so an unused budget costs no RSS.
        Ok(Self {
            key_width,
            value_width,
            keys: vec![0.0; key_len],
            values: vec![0.0; value_len],
            positions,
            spec,
        })
    }

    /// The cache geometry.
    pub fn spec(&self) -> &KvCacheSpec {
        &self.spec
    }

    /// `(num_kv_heads, head_dim)` of a full layer (`(0, 0)` for a latent one, whose rows are
    /// not split into heads of one width).
    fn heads(&self) -> (usize, usize) {
        self.spec.full_heads().unwrap_or((0, 0))
    }

    /// Key of `kv_head` at flat slot `slot` (a full layer).
    pub fn key(&self, slot: usize, kv_head: usize) -> &[f32] {
        let (_, hd) = self.heads();
        &self.key_row(slot)[kv_head * hd..(kv_head + 1) * hd]
    }

    /// Value of `kv_head` at flat slot `slot` (a full layer).
    pub fn value(&self, slot: usize, kv_head: usize) -> &[f32] {
        let (_, hd) = self.heads();
        &self.value_row(slot)[kv_head * hd..(kv_head + 1) * hd]
    }

    /// The key-plane row of flat slot `slot` (all heads' keys, or all key latents).
    pub fn key_row(&self, slot: usize) -> &[f32] {
        &self.keys[slot * self.key_width..(slot + 1) * self.key_width]
    }

    /// The value-plane row of flat slot `slot`.
    pub fn value_row(&self, slot: usize) -> &[f32] {
        &self.values[slot * self.value_width..(slot + 1) * self.value_width]
    }

    /// The RoPE position a latent layer's slot holds (0 for a full layer, which stores none).
    pub fn position(&self, slot: usize) -> u32 {
        self.positions.get(slot).copied().unwrap_or(0)
    }

    /// Copies every slot of block `src` (both planes, positions) over block `dst`. Ids are
    /// checked by the caller (`kv_checks::check_block_copies`).
    pub(super) fn copy_block(&mut self, src: usize, dst: usize) {
        let bs = self.spec.block_size_tokens;
        let copy = |plane: &mut Vec<f32>, width: usize| {
            let elems = bs * width;
            plane.copy_within(src * elems..(src + 1) * elems, dst * elems);
        };
        copy(&mut self.keys, self.key_width);
        copy(&mut self.values, self.value_width);
        if !self.positions.is_empty() {
            self.positions
                .copy_within(src * bs..(src + 1) * bs, dst * bs);
        }
    }

    /// Overwrites flat slot `slot` with one key-plane row, one value-plane row and (a latent
    /// layer) its position. The caller checks the slot and the row widths. An fp8 cache holds
    /// each element rounded to e4m3 ([`crate::fp8`]), an int8 cache each vector quantised
    /// under its own scale ([`crate::int8`]) and an int4 cache each group of a vector
    /// ([`crate::int4`]), as a GPU's quantised slots hold them, so every reader
    /// (attention, scores, compaction) sees what a GPU's would.
    pub(super) fn set_slot(&mut self, slot: usize, k: &[f32], v: &[f32], position: u32) {
        let (kw, vw) = (self.key_width, self.value_width);
        let keys = &mut self.keys[slot * kw..(slot + 1) * kw];
        keys.copy_from_slice(k);
        let values = &mut self.values[slot * vw..(slot + 1) * vw];
        values.copy_from_slice(v);
        match self.spec.layout.dtype() {
            starling_kv::CacheDtype::Fp8 => {
                crate::fp8::e4m3_round_slice(keys);
                crate::fp8::e4m3_round_slice(values);
            }
            // One scale per KV head's row (full) or per latent (low-rank), as the layout
            // counts; int4 one per group of 32 inside each of those vectors.
            starling_kv::CacheDtype::Int8 => {
                round_each_vector(&self.spec.layout, keys, values, crate::int8::round_vector)
            }
            starling_kv::CacheDtype::Int4 => {
                round_each_vector(&self.spec.layout, keys, values, crate::int4::round_vector)
            }
            _ => {}
        }
        if let Some(p) = self.positions.get_mut(slot) {
            *p = position;
        }
    }

    /// Writes the K and V parts of each fused QKV row of a full layer into its slot.
    pub fn write(
        &mut self,
        qkv: &HostTensor,
        dims: &AttentionDims,
        slots: &[u32],
    ) -> Result<(), BackendError> {
        let (n, width) = matrix_dims(qkv, "write_kv input")?;
        let (heads, head_dim) = self.spec.require_full("write_kv")?;
        if width != dims.qkv_size()
            || slots.len() != n
            || dims.num_kv_heads != heads
            || dims.head_dim != head_dim
        {
            return Err(BackendError::Shape(format!(
                "write_kv: [{n}, {width}] with {} slots into {:?} for {dims:?}",
                slots.len(),
                self.spec
            )));
        }
        self.check_slots(slots, "write_kv")?;
        let (q, kv) = (dims.q_size(), dims.kv_size());
        for (row, &slot) in qkv.data().chunks_exact(width).zip(slots) {
            self.set_slot(slot as usize, &row[q..q + kv], &row[q + kv..q + 2 * kv], 0);
        }
        Ok(())
    }

    /// Writes the key and value latents of each `[q | key latents | value latent]` row of a
    /// latent layer into its slot, with the token's position.
    pub fn write_latents(
        &mut self,
        qkv: &HostTensor,
        q_size: usize,
        slots: &[u32],
        positions: &[u32],
    ) -> Result<(), BackendError> {
        self.spec.require_latent("write_latents")?;
        let (n, width) = matrix_dims(qkv, "write_latents input")?;
        let (kw, vw) = (self.key_width, self.value_width);
        if width != q_size + kw + vw || slots.len() != n || positions.len() != n {
            return Err(BackendError::Shape(format!(
                "write_latents: [{n}, {width}] with {} slots and {} positions into {:?} \
                 (rows of {q_size} + {kw} + {vw})",
                slots.len(),
                positions.len(),
                self.spec
            )));
        }
        self.check_slots(slots, "write_latents")?;
        for ((row, &slot), &position) in qkv.data().chunks_exact(width).zip(slots).zip(positions) {
            let (k, v) = row[q_size..].split_at(kw);
            self.set_slot(slot as usize, k, v, position);
        }
        Ok(())
    }

    fn check_slots(&self, slots: &[u32], op: &str) -> Result<(), BackendError> {
        match slots.iter().find(|&&s| s as usize >= self.spec.num_slots()) {
            Some(slot) => Err(BackendError::Shape(format!(
                "{op}: slot {slot} out of range"
            ))),
            None => Ok(()),
        }
    }
}

/// Applies `round` to every vector one token's planes hold under `layout`, each on its own:
/// each KV head's key row and value row (full), each key head's latent and the value latent
/// (low-rank) — [`starling_kv::LayerLayout::vector_widths`]' order, keys first.
fn round_each_vector(
    layout: &starling_kv::LayerLayout,
    keys: &mut [f32],
    values: &mut [f32],
    round: fn(&mut [f32]),
) {
    let key_vectors = match layout {
        starling_kv::LayerLayout::Full { num_kv_heads, .. } => *num_kv_heads,
        starling_kv::LayerLayout::LowRank {
            key_rank_per_head, ..
        } => key_rank_per_head.len(),
    };
    let mut widths = layout.vector_widths();
    crate::int8::for_each_vector(keys, widths.by_ref().take(key_vectors), round);
    crate::int8::for_each_vector(values, widths, round);
}
