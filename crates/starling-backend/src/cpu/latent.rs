//! STAR-KV latent layers on the CPU: the reference of the latent write, of attention on latents
//! and of their reconstruction to full K/V.
//!
//! The reference reconstructs: a slot's keys are `RoPE(B_h z_h + b_h, position)` per KV head and
//! its values `B_v u + b_v` (see [`LatentFactors`]), then attention is the full layer's. Faster
//! backends may work in latent space; they are tested against these functions.

use rayon::prelude::*;

use super::kv_cache::CpuKvCache;
use super::kv_checks::{check_distinct_blocks, physical_slots};
use super::{matrix_dims, rope_head};
use crate::{AttentionDims, BackendError, BatchMeta, HostTensor, LatentFactors, RopeSpec};

/// RoPE on the Q part of each `[q | key latents | value latent]` row at the batch's positions,
/// then the latents and positions written to the batch's slots.
pub fn rope_q_write_latents(
    qkv: &mut HostTensor,
    cache: &mut CpuKvCache,
    dims: &AttentionDims,
    rope: &RopeSpec,
    batch: &BatchMeta,
) -> Result<(), BackendError> {
    let (n, width) = matrix_dims(qkv, "rope_q_write_latents input")?;
    let (kw, vw) = cache.spec().plane_widths();
    if width != dims.q_size() + kw + vw || n != batch.positions.len() {
        return Err(BackendError::Shape(format!(
            "rope_q_write_latents: [{n}, {width}] for {} tokens of {} + {kw} + {vw}",
            batch.positions.len(),
            dims.q_size()
        )));
    }
    cache.spec().require_latent("rope_q_write_latents")?;
    // Check everything the write checks before rotating, so an error leaves `qkv` as it was.
    if batch.slot_mapping.len() != n
        || batch
            .slot_mapping
            .iter()
            .any(|&s| s as usize >= cache.spec().num_slots())
    {
        return Err(BackendError::Shape(format!(
            "rope_q_write_latents: slots {:?} for {n} rows of a {}-slot cache",
            batch.slot_mapping,
            cache.spec().num_slots()
        )));
    }
    let hd = dims.head_dim;
    let q_size = dims.q_size();
    for (row, &position) in qkv.data_mut().chunks_exact_mut(width).zip(&batch.positions) {
        for head in row[..q_size].chunks_exact_mut(hd) {
            rope_head(head, position, &rope.inv_freqs, rope.style);
        }
    }
    cache.write_latents(qkv, q_size, &batch.slot_mapping, &batch.positions)
}

/// The up-projections as host matrices, checked against the cache and the head geometry.
struct HostFactors<'a> {
    key_up: &'a [f32],
    key_bias: Option<&'a [f32]>,
    value_up: &'a [f32],
    value_bias: Option<&'a [f32]>,
    /// Offset of each head's latent in the key row, and its rank.
    heads: Vec<(usize, usize)>,
    key_width: usize,
    value_width: usize,
}

impl<'a> HostFactors<'a> {
    fn new(
        factors: &LatentFactors<'a, HostTensor>,
        cache: &CpuKvCache,
        dims: &AttentionDims,
        op: &str,
    ) -> Result<Self, BackendError> {
        let ranks = cache.spec().require_latent(op)?;
        let (kw, vw) = cache.spec().plane_widths();
        let (hd, kv) = (dims.head_dim, dims.kv_size());
        let bad = |what: &str, t: &HostTensor, want: &[usize]| {
            BackendError::Shape(format!(
                "{op}: {what} is {:?}, expected {want:?}",
                t.shape()
            ))
        };
        if ranks.len() != dims.num_kv_heads {
            return Err(BackendError::Shape(format!(
                "{op}: a latent cache of {} heads for {dims:?}",
                ranks.len()
            )));
        }
        if factors.key_up.shape() != [hd, kw] {
            return Err(bad("key_up", factors.key_up, &[hd, kw]));
        }
        if factors.value_up.shape() != [kv, vw] {
            return Err(bad("value_up", factors.value_up, &[kv, vw]));
        }
        for (what, bias) in [
            ("key_bias", factors.key_bias),
            ("value_bias", factors.value_bias),
        ] {
            if let Some(b) = bias.filter(|b| b.numel() != kv) {
                return Err(bad(what, b, &[kv]));
            }
        }
        let mut heads = Vec::with_capacity(ranks.len());
        let mut offset = 0;
        for &rank in ranks {
            heads.push((offset, rank));
            offset += rank;
        }
        Ok(Self {
            key_up: factors.key_up.data(),
            key_bias: factors.key_bias.map(HostTensor::data),
            value_up: factors.value_up.data(),
            value_bias: factors.value_bias.map(HostTensor::data),
            heads,
            key_width: kw,
            value_width: vw,
        })
    }

    /// Post-RoPE keys `[kv_size]` and values `[kv_size]` of one slot.
    fn reconstruct(
        &self,
        cache: &CpuKvCache,
        slot: usize,
        dims: &AttentionDims,
        rope: &RopeSpec,
    ) -> (Vec<f32>, Vec<f32>) {
        let hd = dims.head_dim;
        let z = cache.key_row(slot);
        let mut k = vec![0.0f32; dims.kv_size()];
        for (h, &(offset, rank)) in self.heads.iter().enumerate() {
            let head = &mut k[h * hd..(h + 1) * hd];
            for (d, out) in head.iter_mut().enumerate() {
                let row = &self.key_up[d * self.key_width + offset..][..rank];
                *out = row
                    .iter()
                    .zip(&z[offset..offset + rank])
                    .map(|(a, b)| a * b)
                    .sum();
            }
            if let Some(bias) = self.key_bias {
                head.iter_mut()
                    .zip(&bias[h * hd..(h + 1) * hd])
                    .for_each(|(x, b)| *x += b);
            }
            rope_head(head, cache.position(slot), &rope.inv_freqs, rope.style);
        }
        let u = cache.value_row(slot);
        let mut v: Vec<f32> = self
            .value_up
            .chunks_exact(self.value_width.max(1))
            .take(dims.kv_size())
            .map(|row| row.iter().zip(u).map(|(a, b)| a * b).sum())
            .collect();
        v.resize(dims.kv_size(), 0.0);
        if let Some(bias) = self.value_bias {
            v.iter_mut().zip(bias).for_each(|(x, b)| *x += b);
        }
        (k, v)
    }
}

/// Causal attention of the Q part of each row over its sequence's reconstructed keys and
/// values (the reference of [`crate::ModelOps::latent_attention`]).
pub fn latent_attention(
    qkv: &HostTensor,
    cache: &CpuKvCache,
    factors: &LatentFactors<'_, HostTensor>,
    dims: &AttentionDims,
    rope: &RopeSpec,
    batch: &BatchMeta,
) -> Result<HostTensor, BackendError> {
    let host = HostFactors::new(factors, cache, dims, "latent_attention")?;
    let (n, width) = matrix_dims(qkv, "latent_attention input")?;
    if width != dims.q_size() + host.key_width + host.value_width || n != batch.num_tokens() {
        return Err(BackendError::Shape(format!(
            "latent_attention: [{n}, {width}] for {} tokens of {} + {} + {}",
            batch.num_tokens(),
            dims.q_size(),
            host.key_width,
            host.value_width
        )));
    }
    let (hd, kv) = (dims.head_dim, dims.kv_size());
    let group = dims.num_heads / dims.num_kv_heads.max(1);
    let bs = batch.block_size_tokens;
    let mut out = vec![0.0f32; n * dims.q_size()];
    for seq in &batch.seqs {
        let ctx = seq.context_len_tokens;
        let slots = physical_slots(cache.spec(), &seq.block_table, bs, ctx, "latent_attention")?;
        // Every visible slot reconstructed once for all of the sequence's rows.
        let kv_rows: Vec<(Vec<f32>, Vec<f32>)> = slots
            .par_iter()
            .map(|&s| host.reconstruct(cache, s as usize, dims, rope))
            .collect();
        let rows = &mut out
            [seq.query_start * dims.q_size()..(seq.query_start + seq.query_len) * dims.q_size()];
        rows.par_chunks_mut(hd).enumerate().for_each(|(chunk, o)| {
            let (i, head) = (chunk / dims.num_heads, chunk % dims.num_heads);
            let row = seq.query_start + i;
            let q = &qkv.data()[row * width + head * hd..row * width + (head + 1) * hd];
            let kv_head = head / group;
            let visible = ctx - seq.query_len + i + 1;
            let scores: Vec<f32> = kv_rows[..visible]
                .iter()
                .map(|(k, _)| {
                    let k = &k[kv_head * hd..(kv_head + 1) * hd];
                    q.iter().zip(k).map(|(a, b)| a * b).sum::<f32>() * dims.scale
                })
                .collect();
            let max = scores.iter().copied().fold(f32::NEG_INFINITY, f32::max);
            let exps: Vec<f32> = scores.iter().map(|s| (s - max).exp()).collect();
            let denom: f32 = exps.iter().sum();
            for ((_, v), e) in kv_rows[..visible].iter().zip(&exps) {
                let v = &v[kv_head * hd..(kv_head + 1) * hd];
                for (acc, x) in o.iter_mut().zip(v) {
                    *acc += e / denom * x;
                }
            }
        });
        debug_assert_eq!(kv, dims.num_kv_heads * hd);
    }
    HostTensor::new(vec![n, dims.q_size()], out)
}

/// Writes one sequence's reconstructed keys and values into a full cache (the reference of
/// [`crate::KvCacheOps::reconstruct_kv`]).
#[allow(clippy::too_many_arguments)]
pub fn reconstruct_kv(
    latent: &CpuKvCache,
    factors: &LatentFactors<'_, HostTensor>,
    dims: &AttentionDims,
    rope: &RopeSpec,
    block_table: &[u32],
    len_tokens: usize,
    dense: &mut CpuKvCache,
    dense_table: &[u32],
) -> Result<(), BackendError> {
    let op = "reconstruct_kv";
    let host = HostFactors::new(factors, latent, dims, op)?;
    let bs = latent.spec().block_size_tokens;
    let src = physical_slots(latent.spec(), block_table, bs, len_tokens, op)?;
    let (heads, head_dim) = dense.spec().require_full(op)?;
    if (heads, head_dim) != (dims.num_kv_heads, dims.head_dim) {
        return Err(BackendError::Shape(format!(
            "{op}: a full cache of {heads} x {head_dim} for {dims:?}"
        )));
    }
    let dense_bs = dense.spec().block_size_tokens;
    let dst = physical_slots(dense.spec(), dense_table, dense_bs, len_tokens, op)?;
    check_distinct_blocks(dense_table, dense_bs, len_tokens, op)?;
    let rows: Vec<(Vec<f32>, Vec<f32>)> = src
        .par_iter()
        .map(|&s| host.reconstruct(latent, s as usize, dims, rope))
        .collect();
    for (&slot, (k, v)) in dst.iter().zip(&rows) {
        dense.set_slot(slot as usize, k, v, 0);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cpu::{attention, compact, elementwise};
    use crate::{KvCacheSpec, RopeStyle, SeqBatchMeta};
    use rand::{seq::SliceRandom, Rng, SeedableRng};
    use rand_chacha::ChaCha8Rng;
    use starling_kv::{CacheDtype, LayerLayout};

    const DIMS: AttentionDims = AttentionDims {
        cache_group: 0,
        window_tokens: None,
        num_heads: 6,
        num_kv_heads: 2,
        head_dim: 8,
        scale: 0.3,
    };
    const KEY_RANKS: [usize; 2] = [3, 5];
    const VALUE_RANK: usize = 7;
    const BLOCK: usize = 4;
    const BLOCKS: usize = 24;

    fn random(rng: &mut ChaCha8Rng, shape: Vec<usize>) -> HostTensor {
        let n = shape.iter().product();
        HostTensor::new(shape, (0..n).map(|_| rng.gen_range(-1.0..1.0)).collect()).unwrap()
    }

    /// Factors, the latent cache and the full cache the reference path would hold.
    struct Fixture {
        key_up: HostTensor,
        key_bias: HostTensor,
        value_up: HostTensor,
        value_bias: HostTensor,
        rope: RopeSpec,
        latent: CpuKvCache,
        full: CpuKvCache,
    }

    impl Fixture {
        fn new(rng: &mut ChaCha8Rng, style: RopeStyle) -> Self {
            let (kw, vw): (usize, usize) = (KEY_RANKS.iter().sum(), VALUE_RANK);
            let latent_spec = KvCacheSpec {
                num_blocks: BLOCKS,
                block_size_tokens: BLOCK,
                layout: LayerLayout::LowRank {
                    key_rank_per_head: KEY_RANKS.to_vec(),
                    value_rank: VALUE_RANK,
                    dtype: CacheDtype::F32,
                },
            };
            let full_spec = KvCacheSpec::full(
                BLOCKS,
                BLOCK,
                DIMS.num_kv_heads,
                DIMS.head_dim,
                CacheDtype::F32,
            );
            Self {
                key_up: random(rng, vec![DIMS.head_dim, kw]),
                key_bias: random(rng, vec![DIMS.kv_size()]),
                value_up: random(rng, vec![DIMS.kv_size(), vw]),
                value_bias: random(rng, vec![DIMS.kv_size()]),
                rope: RopeSpec {
                    inv_freqs: (0..DIMS.head_dim / 2)
                        .map(|i| 10_000f32.powf(-2.0 * i as f32 / DIMS.head_dim as f32))
                        .collect(),
                    style,
                },
                latent: CpuKvCache::new(latent_spec).unwrap(),
                full: CpuKvCache::new(full_spec).unwrap(),
            }
        }

        fn factors(&self) -> LatentFactors<'_, HostTensor> {
            LatentFactors {
                key_up: &self.key_up,
                key_bias: Some(&self.key_bias),
                value_up: &self.value_up,
                value_bias: Some(&self.value_bias),
            }
        }

        /// The full-layout row `[q | B z + b_k | B_v u + b_v]` of a latent row `[q | z | u]`.
        fn full_row(&self, row: &[f32]) -> Vec<f32> {
            let (q, kv, hd) = (DIMS.q_size(), DIMS.kv_size(), DIMS.head_dim);
            let kw: usize = KEY_RANKS.iter().sum();
            let (z, u) = row[q..].split_at(kw);
            let mut out = row[..q].to_vec();
            let mut offset = 0;
            for (h, &rank) in KEY_RANKS.iter().enumerate() {
                for d in 0..hd {
                    let b = &self.key_up.data()[d * kw + offset..][..rank];
                    let dot: f32 = b
                        .iter()
                        .zip(&z[offset..offset + rank])
                        .map(|(a, x)| a * x)
                        .sum();
                    out.push(dot + self.key_bias.data()[h * hd + d]);
                }
                offset += rank;
            }
            for (r, b) in self
                .value_up
                .data()
                .chunks_exact(VALUE_RANK)
                .zip(self.value_bias.data())
            {
                out.push(r.iter().zip(u).map(|(a, x)| a * x).sum::<f32>() + b);
            }
            assert_eq!(out.len(), q + 2 * kv);
            out
        }

        /// Runs one step through both paths and returns (latent, full) attention outputs.
        fn step(&mut self, latent_rows: &HostTensor, meta: &BatchMeta) -> (HostTensor, HostTensor) {
            let width = latent_rows.shape()[1];
            let full_data: Vec<f32> = latent_rows
                .data()
                .chunks_exact(width)
                .flat_map(|r| self.full_row(r))
                .collect();
            let mut full_rows =
                HostTensor::new(vec![meta.num_tokens(), DIMS.qkv_size()], full_data).unwrap();
            elementwise::rope_qk(&mut full_rows, &DIMS, &self.rope, &meta.positions).unwrap();
            self.full
                .write(&full_rows, &DIMS, &meta.slot_mapping)
                .unwrap();
            let want = attention::paged_attention(&full_rows, &self.full, &DIMS, meta).unwrap();
            let mut rows = latent_rows.clone();
            rope_q_write_latents(&mut rows, &mut self.latent, &DIMS, &self.rope, meta).unwrap();
            let factors = self.factors();
            let got =
                latent_attention(&rows, &self.latent, &factors, &DIMS, &self.rope, meta).unwrap();
            (got, want)
        }
    }

    fn assert_close(got: &HostTensor, want: &HostTensor) {
        assert_eq!(got.shape(), want.shape());
        for (g, w) in got.data().iter().zip(want.data()) {
            assert!((g - w).abs() < 1e-4, "{g} vs {w}");
        }
    }

    /// One step's metadata for sequences `(table, physical_start, logical_start, new)`.
    fn batch(seqs: &[(&[u32], usize, usize, usize)]) -> BatchMeta {
        let mut meta = BatchMeta {
            block_size_tokens: BLOCK,
            ..Default::default()
        };
        for &(table, physical, logical, new) in seqs {
            meta.seqs.push(SeqBatchMeta {
                query_start: meta.positions.len(),
                query_len: new,
                context_len_tokens: physical + new,
                block_table: table.to_vec(),
            });
            for i in 0..new {
                let p = physical + i;
                meta.positions.push((logical + i) as u32);
                meta.slot_mapping
                    .push(table[p / BLOCK] * BLOCK as u32 + (p % BLOCK) as u32);
            }
        }
        meta.validate(BLOCKS).unwrap();
        meta
    }

    /// Latent attention equals full attention over the reconstructed K/V, through chunked
    /// prefill and decode of two sequences in shuffled blocks, for both RoPE styles; after a
    /// compaction (every head keeping the same tokens, so positions and slots part ways) the
    /// following decode steps still agree.
    #[test]
    fn latent_attention_equals_the_reconstructed_full_cache() {
        for style in [RopeStyle::Neox, RopeStyle::Interleaved] {
            let mut rng = ChaCha8Rng::seed_from_u64(11);
            let mut fx = Fixture::new(&mut rng, style);
            let mut blocks: Vec<u32> = (0..BLOCKS as u32).collect();
            blocks.shuffle(&mut rng);
            let (a, b) = (blocks[..10].to_vec(), blocks[10..20].to_vec());
            let width = DIMS.q_size() + KEY_RANKS.iter().sum::<usize>() + VALUE_RANK;
            // Prefill in two chunks, then two decode steps.
            let steps = [(0, 9, 0, 5), (9, 7, 5, 6), (16, 1, 11, 1), (17, 1, 12, 1)];
            for (pa, na, pb, nb) in steps {
                let meta = batch(&[(&a, pa, pa, na), (&b, pb, pb, nb)]);
                let rows = random(&mut rng, vec![meta.num_tokens(), width]);
                let (got, want) = fx.step(&rows, &meta);
                assert_close(&got, &want);
            }
            // Sequence a holds 18 tokens: keep 9 of them in both caches.
            let keep: Vec<u32> = vec![0, 1, 2, 5, 8, 11, 14, 16, 17];
            compact::compact_kv(&mut fx.latent, &a, BLOCK, 18, std::slice::from_ref(&keep))
                .unwrap();
            compact::compact_kv(&mut fx.full, &a, BLOCK, 18, &[keep.clone(), keep]).unwrap();
            for logical in [18, 19] {
                let physical = logical - 9;
                let meta = batch(&[(&a, physical, logical, 1)]);
                let rows = random(&mut rng, vec![1, width]);
                let (got, want) = fx.step(&rows, &meta);
                assert_close(&got, &want);
            }
        }
    }

    /// Reconstruction writes the full cache the reference path holds; bad input writes nothing.
    #[test]
    fn reconstruction_equals_the_reference_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(3);
        let mut fx = Fixture::new(&mut rng, RopeStyle::Neox);
        let table: Vec<u32> = vec![7, 2, 9];
        let width = DIMS.q_size() + KEY_RANKS.iter().sum::<usize>() + VALUE_RANK;
        let meta = batch(&[(&table, 0, 3, 11)]);
        let rows = random(&mut rng, vec![11, width]);
        fx.step(&rows, &meta);
        let spec = KvCacheSpec::full(4, BLOCK, DIMS.num_kv_heads, DIMS.head_dim, CacheDtype::F32);
        let mut dense = CpuKvCache::new(spec).unwrap();
        let dense_table = [3u32, 0, 1];
        let factors = fx.factors();
        reconstruct_kv(
            &fx.latent,
            &factors,
            &DIMS,
            &fx.rope,
            &table,
            11,
            &mut dense,
            &dense_table,
        )
        .unwrap();
        for i in 0..11 {
            let src = table[i / BLOCK] as usize * BLOCK + i % BLOCK;
            let dst = dense_table[i / BLOCK] as usize * BLOCK + i % BLOCK;
            for (g, w) in dense.key_row(dst).iter().zip(fx.full.key_row(src)) {
                assert!((g - w).abs() < 1e-5);
            }
            for (g, w) in dense.value_row(dst).iter().zip(fx.full.value_row(src)) {
                assert!((g - w).abs() < 1e-5);
            }
        }
        let before = dense.clone();
        let bad_tables: [&[u32]; 3] = [&[3, 3, 1], &[3, 0], &[3, 0, 4]];
        for bad in bad_tables {
            assert!(reconstruct_kv(
                &fx.latent, &factors, &DIMS, &fx.rope, &table, 11, &mut dense, bad
            )
            .is_err());
        }
        let wrong = LatentFactors {
            key_up: &fx.value_up,
            ..fx.factors()
        };
        assert!(reconstruct_kv(
            &fx.latent,
            &wrong,
            &DIMS,
            &fx.rope,
            &table,
            11,
            &mut dense,
            &dense_table
        )
        .is_err());
        assert_eq!(dense.key_row(0), before.key_row(0));
        // Full-layer ops refuse latent caches, and the latent write refuses a full cache.
        assert!(compact::read_keys(&fx.latent, &table, BLOCK, 3).is_err());
        let mut full_rows = random(&mut rng, vec![1, width]);
        let one = batch(&[(&table, 11, 14, 1)]);
        assert!(rope_q_write_latents(&mut full_rows, &mut fx.full, &DIMS, &fx.rope, &one).is_err());
    }

    /// Compaction of a latent layer moves key latents, value latent and position together.
    #[test]
    fn latent_compaction_moves_positions_with_rows() {
        let mut rng = ChaCha8Rng::seed_from_u64(5);
        let mut fx = Fixture::new(&mut rng, RopeStyle::Neox);
        let table: Vec<u32> = vec![4, 1, 6];
        let width = DIMS.q_size() + KEY_RANKS.iter().sum::<usize>() + VALUE_RANK;
        let meta = batch(&[(&table, 0, 100, 10)]);
        fx.step(&random(&mut rng, vec![10, width]), &meta);
        let before = fx.latent.clone();
        let keep = vec![1u32, 4, 9];
        compact::compact_kv(
            &mut fx.latent,
            &table,
            BLOCK,
            10,
            std::slice::from_ref(&keep),
        )
        .unwrap();
        let slot = |i: usize| table[i / BLOCK] as usize * BLOCK + i % BLOCK;
        for (i, &src) in keep.iter().enumerate() {
            let (dst, src) = (slot(i), slot(src as usize));
            assert_eq!(fx.latent.key_row(dst), before.key_row(src));
            assert_eq!(fx.latent.value_row(dst), before.value_row(src));
            assert_eq!(fx.latent.position(dst), before.position(src));
        }
        assert_eq!(fx.latent.position(slot(2)), 109);
        // One list per head is a full layer's form: refused for a latent one.
        assert!(
            compact::compact_kv(&mut fx.latent, &table, BLOCK, 3, &[keep.clone(), keep]).is_err()
        );
    }
}
