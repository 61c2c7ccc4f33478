//! Content addresses for full KV-cache blocks (automatic prefix caching).
//!
//! A full block's K/V is a function of every token up to its end, of the
//! weights that computed it and of how the cache stores it. Its address,
//! [`BlockHash`], therefore folds in the parent block's hash (which covers
//! all earlier tokens), the block's own token ids and a [`CacheIdentity`]
//! (model weights, cache layout, STAR-KV checkpoint, an optional per-request
//! salt). Two blocks with the same hash hold the same K/V, so one can stand
//! in for the other.
//!
//! **Why SHA-256.** The hash must be stable: the same inputs give the same
//! hash on every run, machine and build, so that tests can pin values and a
//! later on-disk or cross-process cache can trust them. SHA-256 over an
//! explicit little-endian byte encoding has no per-process key (unlike
//! `std`'s `RandomState`) and no dependence on `Hash` impls. It must also
//! resist chosen collisions: vLLM's prefix cache was open to a
//! cross-request leak while it used Python's `hash` (CVE-2025-25183), since
//! a prompt that collides with another user's block reads that user's K/V.
//! FNV- or xxhash-style folds are fast but collisions can be constructed for
//! them; SHA-256 cannot be steered that way.
//!
//! **Collisions.** A [`BlockHash`] keeps the first 128 bits of the digest.
//! Matching a *given* block (what a leak needs) costs ~2^128 trials; by
//! the birthday bound, an accidental collision among `n` distinct blocks
//! has probability about `n² / 2^129` — below 10^-20 for 10^9 blocks. Token
//! ids are therefore not stored or compared.
//!
//! **Cost.** About 100 bytes hashed per 16-token block: a 128k-token prompt
//! is ~8k blocks, well under a millisecond or two of one core.
//!
//! Byte encoding (version 1; changing it changes every hash, so the tag
//! would move to `v2`), integers little-endian:
//! - identity: `"starling-kv/cache-identity/v1"`, model identity (u64
//!   length + UTF-8), layout (u64 layer count, then per layer a tag byte
//!   `0` Full: u64 KV heads, u64 head dim, dtype byte; `1` LowRank: u64
//!   head count, u64 per key rank, u64 value rank, dtype byte), checkpoint
//!   (`0`, or `1` + u64 length + UTF-8). Dtype bytes: F32 0, F16 1, BF16 2,
//!   Fp8 3, Int8 4, Int4 5.
//! - salted identity: `"starling-kv/cache-salt/v1"`, the 32-byte identity,
//!   u64 salt length, salt bytes.
//! - block: `"starling-kv/block/v1"`, the 32-byte identity, parent (`0`, or
//!   `1` + the parent's 16 bytes, big-endian), u64 token count, u32 per
//!   token. The hash is the digest's first 16 bytes read big-endian.
//! - compacted state: `"starling-kv/compacted/v1"`, the 32-byte identity,
//!   the 16 bytes of the hash of the last full block of the tokens it stands
//!   for (big-endian), u64 policy length + UTF-8. Used only as the parent of
//!   the first rewritten block of a compacted sequence (see below).
//!
//! **Compacted sequences.** Token eviction rewrites a sequence's slots, so
//! its blocks stop holding whole token blocks of its prompt. When the
//! compaction is a pure function of the tokens before it (a deterministic
//! policy at a fixed point, over the whole context), the kept state is as
//! shareable as dense K/V: [`BlockHash::of_compacted_state`] names it after
//! the tokens it stands for and the policy, and the blocks of the physical
//! slots from the first rewritten one on are hashed in a chain from it, a
//! kept slot `s` standing as the token [`kept_slot_token`]`(s)` and the slots
//! after the kept ones as the tokens that follow
//! ([`BlockHasher::extend_compacted_hashes`]). Two sequences then agree on a
//! hash exactly when they hold the same compacted state and the same tokens
//! after it.

use std::fmt;
use std::num::NonZeroUsize;

use sha2::{Digest, Sha256};

use crate::error::KvError;
use crate::layout::{CacheDtype, CacheLayout, LayerLayout};

const IDENTITY_TAG: &[u8] = b"starling-kv/cache-identity/v1";
const SALT_TAG: &[u8] = b"starling-kv/cache-salt/v1";
const BLOCK_TAG: &[u8] = b"starling-kv/block/v1";
const COMPACTED_TAG: &[u8] = b"starling-kv/compacted/v1";

/// Marks a slot of a compacted state in a hashed stream (token ids stay far below it; a stream
/// that holds such slots starts from a compacted-state parent, so no real block is confused
/// with it either way).
const KEPT_SLOT_BIT: u32 = 1 << 31;

/// How physical slot `slot` of a compacted state stands in a block's hashed tokens (see the
/// module docs).
pub fn kept_slot_token(slot: usize) -> u32 {
    KEPT_SLOT_BIT | (slot as u32 & !KEPT_SLOT_BIT)
}

/// Content address of one full block: its tokens, every token before it and
/// the [`CacheIdentity`] that produced its K/V. See the module docs for the
/// encoding and why it is stable.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(u128);

impl BlockHash {
    /// The hash of a block holding `token_ids`, following the block hashed
    /// `parent` (`None` for a sequence's first block), under `identity`.
    pub fn of_block(
        identity: &CacheIdentity,
        parent: Option<BlockHash>,
        token_ids: &[u32],
    ) -> Self {
        let mut h = Sha256::new();
        h.update(BLOCK_TAG);
        h.update(identity.0);
        match parent {
            None => h.update([0u8]),
            Some(p) => {
                h.update([1u8]);
                h.update(p.0.to_be_bytes());
            }
        }
        h.update((token_ids.len() as u64).to_le_bytes());
        for t in token_ids {
            h.update(t.to_le_bytes());
        }
        Self::from_digest(h)
    }

    /// The name of a compacted state: what token eviction under `policy` (a description of
    /// everything that decides what it keeps: method, ratio, protections, where it compacts)
    /// keeps of a sequence whose tokens up to the end of the full block hashed
    /// `last_block_of_tokens` were computed under `identity` (see the module docs). It is the
    /// parent of the state's first rewritten block.
    pub fn of_compacted_state(
        identity: &CacheIdentity,
        last_block_of_tokens: BlockHash,
        policy: &str,
    ) -> Self {
        let mut h = Sha256::new();
        h.update(COMPACTED_TAG);
        h.update(identity.0);
        h.update(last_block_of_tokens.0.to_be_bytes());
        update_str(&mut h, policy);
        Self::from_digest(h)
    }

    fn from_digest(h: Sha256) -> Self {
        let digest = h.finalize();
        let mut first = [0u8; 16];
        first.copy_from_slice(&digest[..16]);
        Self(u128::from_be_bytes(first))
    }

    /// The hash as a number (e.g. for logs or an external index).
    pub fn to_u128(self) -> u128 {
        self.0
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:032x}", self.0)
    }
}

/// What, besides the tokens, decides a cached block's contents.
#[derive(Debug, Clone, Copy)]
pub struct CacheIdentityParts<'a> {
    /// Identity of the weights that compute K/V (e.g. a digest of the
    /// checkpoint's tensors; LoRA-free: an adapter would need its own).
    pub model_identity: &'a str,
    /// What each layer stores per token (dense K/V or latents, ranks, dtype).
    pub layout: &'a CacheLayout,
    /// The STAR-KV checkpoint's identity when the cache holds its latents;
    /// `None` for a dense cache.
    pub checkpoint_identity: Option<&'a str>,
}

/// Digest of everything besides the tokens that decides a block's contents;
/// the root of every [`BlockHash`] chain. Blocks are shared only between
/// sequences under the same identity.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct CacheIdentity([u8; 32]);

impl CacheIdentity {
    /// The identity of a cache described by `parts`.
    pub fn new(parts: &CacheIdentityParts<'_>) -> Self {
        let mut h = Sha256::new();
        h.update(IDENTITY_TAG);
        update_str(&mut h, parts.model_identity);
        h.update((parts.layout.layers.len() as u64).to_le_bytes());
        for layer in &parts.layout.layers {
            update_layer(&mut h, layer);
        }
        match parts.checkpoint_identity {
            None => h.update([0u8]),
            Some(c) => {
                h.update([1u8]);
                update_str(&mut h, c);
            }
        }
        Self(h.finalize().into())
    }

    /// This identity with a per-request salt folded in (vLLM's `cache_salt`):
    /// only requests with the same salt share blocks, e.g. one tenant's.
    pub fn salted(&self, salt: &[u8]) -> Self {
        let mut h = Sha256::new();
        h.update(SALT_TAG);
        h.update(self.0);
        h.update((salt.len() as u64).to_le_bytes());
        h.update(salt);
        Self(h.finalize().into())
    }

    /// The 32-byte digest.
    pub fn digest(&self) -> [u8; 32] {
        self.0
    }
}

/// Hashes a sequence's full blocks under one identity and block size.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockHasher {
    identity: CacheIdentity,
    block_size_tokens: NonZeroUsize,
}

impl BlockHasher {
    /// A hasher for blocks of `block_size_tokens` under `identity`.
    ///
    /// Fails with [`KvError::InvalidConfig`] for a zero block size.
    pub fn new(identity: CacheIdentity, block_size_tokens: usize) -> Result<Self, KvError> {
        let block_size_tokens = NonZeroUsize::new(block_size_tokens)
            .ok_or_else(|| KvError::InvalidConfig("block size must be > 0 tokens".into()))?;
        Ok(Self {
            identity,
            block_size_tokens,
        })
    }

    /// The identity every hash is rooted in.
    pub fn identity(&self) -> &CacheIdentity {
        &self.identity
    }

    /// Tokens per block.
    pub fn block_size_tokens(&self) -> usize {
        self.block_size_tokens.get()
    }

    /// Hashes of every full block of `token_ids`, in order; a trailing
    /// partial block has no hash (its contents are not final).
    pub fn full_block_hashes(&self, token_ids: &[u32]) -> Vec<BlockHash> {
        let mut hashes = Vec::with_capacity(token_ids.len() / self.block_size_tokens());
        self.extend_full_block_hashes(token_ids, &mut hashes);
        hashes
    }

    /// Appends to `hashes` the hashes of the full blocks of `token_ids`
    /// beyond the `hashes.len()` already there, so a growing sequence is
    /// hashed once per block. `hashes` must be this hasher's hashes of a
    /// prefix of `token_ids` (the chain continues from its last entry).
    pub fn extend_full_block_hashes(&self, token_ids: &[u32], hashes: &mut Vec<BlockHash>) {
        let bs = self.block_size_tokens();
        let num_full = token_ids.len() / bs;
        for i in hashes.len()..num_full {
            let parent = hashes.last().copied();
            let block = &token_ids[i * bs..(i + 1) * bs];
            hashes.push(BlockHash::of_block(&self.identity, parent, block));
        }
    }
}

impl BlockHasher {
    /// Extends the hashes of a compacted sequence's physical blocks: `hashes` holds those of
    /// its leading blocks the compaction left in place (`hashes.len()` of them), `state` names
    /// the compacted state ([`BlockHash::of_compacted_state`]), the compaction kept
    /// `kept_tokens` slots, and `tokens_after` are the tokens that follow the point it stands
    /// for. Appends the hashes of every full block of slots from `hashes.len() * block_size`
    /// on: kept slots as [`kept_slot_token`], then `tokens_after`. The first appended block's
    /// parent is `state`.
    pub fn extend_compacted_hashes(
        &self,
        state: BlockHash,
        kept_tokens: usize,
        tokens_after: &[u32],
        hashes: &mut Vec<BlockHash>,
    ) {
        let bs = self.block_size_tokens();
        let first_slot = hashes.len() * bs;
        // The blocks left in place end at or before the first rewritten slot, which is kept.
        debug_assert!(
            first_slot <= kept_tokens,
            "{first_slot} slots in place > {kept_tokens} kept"
        );
        let total_slots = kept_tokens + tokens_after.len();
        let slot_token = |s: usize| {
            if s < kept_tokens {
                kept_slot_token(s)
            } else {
                tokens_after[s - kept_tokens]
            }
        };
        let mut parent = state;
        let mut block = Vec::with_capacity(bs);
        for start in (first_slot..total_slots).step_by(bs) {
            if start + bs > total_slots {
                break;
            }
            block.clear();
            block.extend((start..start + bs).map(slot_token));
            parent = BlockHash::of_block(&self.identity, Some(parent), &block);
            hashes.push(parent);
        }
    }
}

fn update_str(h: &mut Sha256, s: &str) {
    h.update((s.len() as u64).to_le_bytes());
    h.update(s.as_bytes());
}

fn update_layer(h: &mut Sha256, layer: &LayerLayout) {
    match layer {
        LayerLayout::Full {
            num_kv_heads,
            head_dim,
            dtype,
        } => {
            h.update([0u8]);
            h.update((*num_kv_heads as u64).to_le_bytes());
            h.update((*head_dim as u64).to_le_bytes());
            h.update([dtype_byte(*dtype)]);
        }
        LayerLayout::LowRank {
            key_rank_per_head,
            value_rank,
            dtype,
        } => {
            h.update([1u8]);
            h.update((key_rank_per_head.len() as u64).to_le_bytes());
            for r in key_rank_per_head {
                h.update((*r as u64).to_le_bytes());
            }
            h.update((*value_rank as u64).to_le_bytes());
            h.update([dtype_byte(*dtype)]);
        }
    }
}

/// Written out rather than `as u8`, so reordering the enum cannot change
/// hashes.
fn dtype_byte(dtype: CacheDtype) -> u8 {
    match dtype {
        CacheDtype::F32 => 0,
        CacheDtype::F16 => 1,
        CacheDtype::BF16 => 2,
        CacheDtype::Fp8 => 3,
        CacheDtype::Int8 => 4,
        CacheDtype::Int4 => 5,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn dense() -> CacheLayout {
        CacheLayout::uniform(
            2,
            LayerLayout::Full {
                num_kv_heads: 2,
                head_dim: 64,
                dtype: CacheDtype::BF16,
            },
        )
    }

    fn identity(model: &str, layout: &CacheLayout, checkpoint: Option<&str>) -> CacheIdentity {
        CacheIdentity::new(&CacheIdentityParts {
            model_identity: model,
            layout,
            checkpoint_identity: checkpoint,
        })
    }

    /// Pinned values, computed independently with Python's `hashlib` from
    /// the byte encoding in the module docs
    /// (`tests/fixtures/block_hash_vectors.py`). If this test fails, every stored hash changed: bump the
    /// encoding's version tag instead of updating the numbers.
    #[test]
    fn fixed_inputs_give_fixed_hashes() {
        let layout = dense();
        let id = identity("tiny-llama", &layout, None);
        assert_eq!(
            hex(&id.digest()),
            "39bf0be6d616bb8070b745cc159dc8d4065c6ebd5274e06a86796622f0d73f26"
        );
        let first = BlockHash::of_block(&id, None, &[1, 2, 3, 4]);
        assert_eq!(first.to_string(), "b5935f73c38e449cd14a33f6e95266bf");
        let second = BlockHash::of_block(&id, Some(first), &[5, 6, 7, 8]);
        assert_eq!(second.to_string(), "066d20ed0dc1008aeb76ac436f33fae8");
        let salted = id.salted(b"tenant-a");
        assert_eq!(
            hex(&salted.digest()),
            "cd81f861f1af5e0b354d633a5d54f4b452108a8b7baa6333e65ae5145a72e2cc"
        );
    }

    fn hex(bytes: &[u8]) -> String {
        bytes.iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn every_identity_part_changes_the_hash() {
        let layout = dense();
        let base = identity("m", &layout, None);
        let tokens = [10, 20, 30, 40];
        let h = |id: &CacheIdentity| BlockHash::of_block(id, None, &tokens);
        let mut bf16_to_f16 = dense();
        bf16_to_f16.layers[1] = LayerLayout::Full {
            num_kv_heads: 2,
            head_dim: 64,
            dtype: CacheDtype::F16,
        };
        let latent = CacheLayout::uniform(
            2,
            LayerLayout::low_rank_padded(&[8, 8], 16, CacheDtype::BF16),
        );
        let others = [
            identity("m2", &layout, None),
            identity("m", &bf16_to_f16, None),
            identity("m", &latent, None),
            identity("m", &latent, Some("ckpt-a")),
            identity("m", &latent, Some("ckpt-b")),
            base.salted(b""),
            base.salted(b"tenant"),
        ];
        let mut all: Vec<BlockHash> = others.iter().map(h).collect();
        all.push(h(&base));
        all.sort();
        all.dedup();
        assert_eq!(all.len(), others.len() + 1, "two identities collided");
        // Same parts, same identity: nothing per-process leaks in.
        assert_eq!(identity("m", &layout, None), base);
    }

    #[test]
    fn parent_and_tokens_change_the_hash() {
        let layout = dense();
        let id = identity("m", &layout, None);
        let a = BlockHash::of_block(&id, None, &[1, 2]);
        let b = BlockHash::of_block(&id, None, &[2, 1]);
        let c = BlockHash::of_block(&id, Some(a), &[1, 2]);
        let d = BlockHash::of_block(&id, None, &[1, 2, 0]);
        assert!(a != b && a != c && a != d && b != c);
    }

    #[test]
    fn a_compacted_state_is_named_by_its_tokens_and_policy_and_hashes_its_slots() {
        let layout = dense();
        let hasher = BlockHasher::new(identity("m", &layout, None), 4).unwrap();
        let dense_chain = hasher.full_block_hashes(&(0..8).collect::<Vec<u32>>());
        let state = BlockHash::of_compacted_state(hasher.identity(), dense_chain[1], "p");
        assert_ne!(state, dense_chain[1]);
        assert_ne!(
            state,
            BlockHash::of_compacted_state(hasher.identity(), dense_chain[1], "q")
        );
        assert_ne!(
            state,
            BlockHash::of_compacted_state(hasher.identity(), dense_chain[0], "p")
        );
        // Block 0 left in place, 6 slots kept (slots 4 and 5 rewritten), then the tokens
        // after the point: block [4..8) mixes the two kept slots and the first two tokens.
        let mut chain = vec![dense_chain[0]];
        hasher.extend_compacted_hashes(state, 6, &[8, 9, 10], &mut chain);
        assert_eq!(
            chain.len(),
            2,
            "slot 11 is not there yet: one block appended"
        );
        let mixed = [kept_slot_token(4), kept_slot_token(5), 8, 9];
        assert_eq!(
            chain[1],
            BlockHash::of_block(hasher.identity(), Some(state), &mixed)
        );
        chain.truncate(1);
        hasher.extend_compacted_hashes(state, 6, &[8, 9, 10, 11, 12, 13], &mut chain);
        assert_eq!(chain.len(), 3);
        assert_eq!(
            chain[2],
            BlockHash::of_block(hasher.identity(), Some(chain[1]), &[10, 11, 12, 13])
        );
        assert_ne!(kept_slot_token(4), 4);
    }

    #[test]
    fn chain_covers_full_blocks_only_and_extends_incrementally() {
        let layout = dense();
        let hasher = BlockHasher::new(identity("m", &layout, None), 4).unwrap();
        let tokens: Vec<u32> = (0..11).collect();
        let all = hasher.full_block_hashes(&tokens);
        assert_eq!(all.len(), 2);
        assert_eq!(
            all[0],
            BlockHash::of_block(hasher.identity(), None, &[0, 1, 2, 3])
        );
        assert_eq!(
            all[1],
            BlockHash::of_block(hasher.identity(), Some(all[0]), &[4, 5, 6, 7])
        );
        // Growing one token at a time gives the same chain.
        let mut grown = Vec::new();
        for n in 0..=tokens.len() {
            hasher.extend_full_block_hashes(&tokens[..n], &mut grown);
        }
        assert_eq!(grown, all);
        assert!(BlockHasher::new(*hasher.identity(), 0).is_err());
    }
}
