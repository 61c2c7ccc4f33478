//! Property tests for automatic prefix caching: random interleavings of
//! allocate-with-prefix / compute + register / append / announce-and-compact
//! / free over a small pool, with prompts that share prefixes.
//!
//! The test keeps a model of what every block slot *contains* (a
//! fingerprint of the token prefix whose K/V was written there, or a
//! "garbage" marker for slots a compaction rewrote) and of what each
//! registered hash *means* (the fingerprints of the block it names). After
//! every step it checks:
//! - the manager's own invariants (ref count = holders, lists, map);
//! - free uncached + free cached + used = pool size, used = blocks held;
//! - every hash the map holds points at a block whose contents are exactly
//!   what the hash names (so a hit always reads the right K/V);
//! - a block handed out fresh was held by no one, and the caller only ever
//!   writes blocks it holds alone and has not registered;
//! - after freeing everything, no block is leaked.
//!
//! Compacted state (the engine's prefix caching under eviction): a compaction
//! announced by a fork writes slots that are a function of what it compacted
//! (in the model: of the tokens, the cut and the state before), so after it
//! the sequence may resume registration under that state's chain, and a new
//! sequence may start from the cached state; the same checks then prove that
//! a state's blocks are never rewritten while cached and that one hash never
//! names two contents.
//!
//! A second property runs the same kind of script with caching off through
//! the prefix API and checks it matches a plain manager step for step.

use std::cell::Cell;
use std::collections::{HashMap, HashSet};

use proptest::prelude::*;
use proptest::test_runner::{RngAlgorithm, TestRng, TestRunner};
use starling_kv::{
    BlockHash, BlockHasher, BlockId, CacheIdentity, CacheIdentityParts, CacheLayout,
    CompactedPrefixQuery, KvCacheConfig, KvCacheManager, KvError, PrefixQuery, SeqId,
};

/// Marks slot contents written by a compaction (never a fingerprint).
const GARBAGE: u64 = 1 << 63;

fn hasher(block_size: usize) -> BlockHasher {
    let layout = CacheLayout { layers: vec![] };
    let id = CacheIdentity::new(&CacheIdentityParts {
        model_identity: "props",
        layout: &layout,
        checkpoint_identity: None,
    });
    BlockHasher::new(id, block_size).unwrap()
}

/// Fingerprint of each token prefix `tokens[..=i]`: what that token's K/V
/// depends on. Independent of the crate's hashing.
fn fingerprints(tokens: &[u32]) -> Vec<u64> {
    let mut fp = 0xcbf2_9ce4_8422_2325u64;
    tokens
        .iter()
        .map(|t| {
            for b in t.to_le_bytes() {
                fp = (fp ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
            }
            fp & !GARBAGE
        })
        .collect()
}

/// Three "system prompts": 0 and 1 share their first 6 tokens, 2 shares none.
fn base(which: usize) -> Vec<u32> {
    (0..16u32)
        .map(|i| match which {
            0 => 10 + i,
            1 if i < 6 => 10 + i,
            1 => 40 + i,
            _ => 70 + i,
        })
        .collect()
}

#[derive(Debug, Clone)]
enum Op {
    /// A new request: `base_len` tokens of a base prompt, then `suffix`.
    Start {
        seq: u64,
        base: usize,
        base_len: usize,
        suffix: Vec<u32>,
        chunk: usize,
    },
    /// The forward pass ran: write the scheduled slots, register full blocks.
    Compute { seq: u64 },
    /// Schedule more: the next prompt chunk, or decoded tokens.
    Append { seq: u64, tokens: Vec<u32> },
    /// Announce a compaction of the private tail (the seq is then held).
    Prepare { seq: u64, from_permille: usize },
    /// Announce a compaction over the whole context, forking the cached and
    /// shared blocks it rewrites into private copies first.
    Fork { seq: u64, from_permille: usize },
    /// Compact: announced (from the announced slot) or not (from slot 0).
    Shrink { seq: u64, keep_permille: usize },
    /// Finished, preempted or aborted.
    Free { seq: u64 },
    /// After a finished fork-announced compaction: register again under the
    /// compacted state's chain.
    Resume { seq: u64 },
    /// A new request starting from a cached compacted state: the tokens of
    /// the state's sequence up to `extra` past its point, then `suffix`.
    StartFrom {
        seq: u64,
        entry: usize,
        extra: usize,
        suffix: Vec<u32>,
        chunk: usize,
    },
}

fn op() -> impl Strategy<Value = Op> {
    let seq = 0u64..5;
    let toks = prop::collection::vec(0u32..3, 1..6);
    prop_oneof![
        3 => (seq.clone(), 0usize..3, 0usize..=16, prop::collection::vec(0u32..3, 0..6), 1usize..20)
            .prop_map(|(seq, base, base_len, suffix, chunk)| Op::Start { seq, base, base_len, suffix, chunk }),
        4 => seq.clone().prop_map(|seq| Op::Compute { seq }),
        2 => (seq.clone(), toks).prop_map(|(seq, tokens)| Op::Append { seq, tokens }),
        2 => (seq.clone(), 0usize..=1000).prop_map(|(seq, from_permille)| Op::Prepare { seq, from_permille }),
        2 => (seq.clone(), 0usize..=1000).prop_map(|(seq, from_permille)| Op::Fork { seq, from_permille }),
        2 => (seq.clone(), 0usize..=1000).prop_map(|(seq, keep_permille)| Op::Shrink { seq, keep_permille }),
        2 => seq.clone().prop_map(|seq| Op::Free { seq }),
        2 => seq.clone().prop_map(|seq| Op::Resume { seq }),
        3 => (seq, 0usize..8, 0usize..12, prop::collection::vec(0u32..3, 0..4), 1usize..20)
            .prop_map(|(seq, entry, extra, suffix, chunk)| Op::StartFrom { seq, entry, extra, suffix, chunk }),
    ]
}

/// What the test knows about one live sequence.
#[derive(Debug)]
struct Seq {
    /// Prompt plus decoded tokens known so far.
    tokens: Vec<u32>,
    prompt_len: usize,
    /// Physical slots whose K/V has been written.
    written: usize,
    compacted: bool,
    pending_rewrite_from: Option<usize>,
    /// The pending rewrite was announced by a fork (over the whole context).
    pending_fork: bool,
    /// Some compaction's slots are not a function of what it compacted (it
    /// kept a shared prefix, or was not announced by a fork), or slots were
    /// written after a compaction before resuming: never registers again.
    tainted: bool,
    /// The compacted state the table's slots follow (registers under its
    /// chain), `None` for dense slots.
    state: Option<State>,
    /// A finished fork-announced compaction's state, until `Resume`.
    resumable: Option<State>,
}

/// A compacted state: its name, the slots it kept, the logical position it
/// stands at, and the hashes of the blocks it left in place.
#[derive(Debug, Clone)]
struct State {
    name: BlockHash,
    kept: usize,
    point: usize,
    in_place: Vec<BlockHash>,
}

/// A state some sequence registered under, with that sequence's tokens.
#[derive(Debug, Clone)]
struct Entry {
    tokens: Vec<u32>,
    state: State,
}

/// A slot value that is a function of `a` and `b`, never a fingerprint.
fn mix(a: u64, b: u64) -> u64 {
    let mut x = a ^ b.wrapping_mul(0x9e37_79b9_7f4a_7c15);
    x ^= x >> 31;
    x = x.wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x ^= x >> 29;
    x | GARBAGE
}

/// How often a script reached each interesting path.
#[derive(Debug, Clone, Copy, Default)]
struct Reached {
    hits: usize,
    out_of_blocks: usize,
    announced_compactions: usize,
    unannounced_compactions: usize,
    refused_rewrites: usize,
    forks: usize,
    refused_forks: usize,
    /// Forks that left private registered blocks uncopied (pool short).
    partial_forks: usize,
    evicted_blocks: u64,
    /// Registrations resumed under a compacted state.
    resumed: usize,
    /// Sequences started from a cached compacted state.
    compacted_hits: usize,
}

struct World {
    kv: KvCacheManager,
    reached: Reached,
    hasher: BlockHasher,
    bs: usize,
    seqs: HashMap<SeqId, Seq>,
    /// Per block, per slot: what was last written there.
    content: Vec<Vec<Option<u64>>>,
    /// Per registered hash: the slot fingerprints of the block it names.
    meaning: HashMap<BlockHash, Vec<u64>>,
    next_garbage: u64,
    /// Every compacted state registered under, in order.
    entries: Vec<Entry>,
}

impl World {
    fn new(num_blocks: usize, bs: usize) -> Self {
        let kv = KvCacheManager::with_config(KvCacheConfig {
            num_blocks,
            block_size_tokens: bs,
            enable_prefix_caching: true,
        })
        .unwrap();
        Self {
            kv,
            reached: Reached::default(),
            hasher: hasher(bs),
            bs,
            seqs: HashMap::new(),
            content: vec![vec![None; bs]; num_blocks],
            meaning: HashMap::new(),
            next_garbage: 0,
            entries: Vec::new(),
        }
    }

    fn held_by_others(&self, seq: SeqId) -> HashSet<BlockId> {
        self.seqs
            .keys()
            .filter(|s| **s != seq)
            .flat_map(|s| self.kv.table(*s).unwrap().block_ids().to_vec())
            .collect()
    }

    /// Writes `values` into `seq`'s physical slots `start..`: the caller
    /// writes only blocks it holds alone and has not registered.
    fn write(&mut self, seq: SeqId, start: usize, values: &[u64]) {
        let slots = self
            .kv
            .slot_mapping(seq, start..start + values.len())
            .unwrap();
        for (slot, v) in slots.iter().zip(values) {
            let (block, off) = (*slot as usize / self.bs, *slot as usize % self.bs);
            let id = BlockId(block as u32);
            assert_eq!(self.kv.ref_count(id), Some(1), "{seq} writes shared {id}");
            assert_eq!(self.kv.block_hash(id), None, "{seq} writes registered {id}");
            self.content[block][off] = Some(*v);
        }
    }

    fn garbage(&mut self, n: usize) -> Vec<u64> {
        (0..n)
            .map(|_| {
                self.next_garbage += 1;
                GARBAGE | self.next_garbage
            })
            .collect()
    }

    fn start(&mut self, seq: SeqId, tokens: Vec<u32>, chunk: usize) {
        if self.seqs.contains_key(&seq) {
            let q = PrefixQuery {
                block_hashes: &[],
                query_len_tokens: 1,
            };
            assert_eq!(
                self.kv.allocate_with_prefix(seq, q, 1),
                Err(KvError::SequenceExists(seq))
            );
            return;
        }
        let bs = self.bs;
        let len = tokens.len();
        // Every full block before the last token (which must be computed).
        let hashes = self.hasher.full_block_hashes(&tokens[..len - 1]);
        let found = self.kv.find_cached_prefix(&hashes);
        let num_tokens = len.min(found.num_tokens + chunk);
        let needed = self.kv.blocks_needed_with_prefix(&hashes, num_tokens);
        let free_before = self.kv.num_free_blocks();
        let counts_before = self.kv.block_counts();
        let stats_before = self.kv.prefix_cache_stats();
        let others = self.held_by_others(seq);
        let query = PrefixQuery {
            block_hashes: &hashes,
            query_len_tokens: len,
        };
        match self.kv.allocate_with_prefix(seq, query, num_tokens) {
            Ok(hit) => {
                assert_eq!(hit, found, "nothing changed between find and allocate");
                self.reached.hits += usize::from(hit.num_blocks > 0);
                assert!(needed <= free_before);
                assert_eq!(self.kv.num_free_blocks(), free_before - needed);
                let table = self.kv.table(seq).unwrap();
                assert_eq!(table.logical_len_tokens(), num_tokens);
                assert_eq!(table.num_hashed_blocks(), hit.num_blocks);
                // Fresh blocks were held by no one else.
                for b in &table.block_ids()[hit.num_blocks..] {
                    assert!(!others.contains(b), "{b} handed out while held");
                    assert_eq!(self.kv.ref_count(*b), Some(1));
                }
                // Hit blocks hold exactly this prompt's K/V.
                let fps = fingerprints(&tokens);
                for (i, b) in table.block_ids()[..hit.num_blocks].iter().enumerate() {
                    let want: Vec<Option<u64>> =
                        fps[i * bs..(i + 1) * bs].iter().map(|f| Some(*f)).collect();
                    assert_eq!(self.content[b.index()], want, "hit {b} has other contents");
                }
                let stats = self.kv.prefix_cache_stats();
                assert_eq!(stats.requests, stats_before.requests + 1);
                assert_eq!(
                    stats.hit_tokens,
                    stats_before.hit_tokens + hit.num_tokens as u64
                );
                self.seqs.insert(
                    seq,
                    Seq {
                        prompt_len: len,
                        tokens,
                        written: hit.num_tokens,
                        compacted: false,
                        pending_rewrite_from: None,
                        pending_fork: false,
                        tainted: false,
                        state: None,
                        resumable: None,
                    },
                );
            }
            Err(KvError::OutOfBlocks { needed: n, free }) => {
                self.reached.out_of_blocks += 1;
                assert_eq!((n, free), (needed, free_before));
                assert!(needed > free_before);
                assert!(!self.kv.contains(seq));
                assert_eq!(self.kv.block_counts(), counts_before);
                assert_eq!(self.kv.prefix_cache_stats().requests, stats_before.requests);
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn compute(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.get(&seq) else {
            return;
        };
        if s.pending_rewrite_from.is_some() {
            return; // held while compacting
        }
        let physical = self.kv.table(seq).unwrap().physical_len_tokens();
        let (written, compacted) = (s.written, s.compacted);
        let values = if compacted {
            self.garbage(physical - written)
        } else if let Some(st) = &s.state {
            // Computed over the state: a function of it and the tokens after its point.
            let fps = fingerprints(&s.tokens[st.point..]);
            let name = st.name.to_u128() as u64;
            (written..physical)
                .map(|slot| mix(name, fps[slot - st.kept]))
                .collect()
        } else {
            fingerprints(&s.tokens[..physical])[written..].to_vec()
        };
        self.write(seq, written, &values);
        let s = self.seqs.get_mut(&seq).unwrap();
        s.written = physical;
        if compacted {
            // Slots written after the compaction over an unnamed context.
            s.resumable = None;
            s.tainted = true;
            let hashes = self.hasher.full_block_hashes(&s.tokens[..physical]);
            assert_eq!(self.kv.register_full_blocks(seq, &hashes).unwrap(), 0);
            return;
        }
        self.register(seq);
    }

    /// Registers `seq`'s written full blocks under the chain of its slots and
    /// records what each hash names (one hash never names two contents).
    fn register(&mut self, seq: SeqId) {
        let hashes = self.chain(seq);
        self.kv.register_full_blocks(seq, &hashes).unwrap();
        let table = self.kv.table(seq).unwrap();
        for (h, b) in hashes.iter().zip(table.block_ids()) {
            let block_values: Vec<u64> = self.content[b.index()]
                .iter()
                .map(|v| v.expect("a full block of written slots"))
                .collect();
            let prev = self.meaning.insert(*h, block_values.clone());
            assert!(
                prev.is_none_or(|p| p == block_values),
                "one hash, two meanings"
            );
        }
    }

    /// The hashes of `seq`'s full physical blocks as its slots are now: its
    /// dense tokens, or its state's chain.
    fn chain(&self, seq: SeqId) -> Vec<BlockHash> {
        self.chain_at(seq, self.kv.table(seq).unwrap().physical_len_tokens())
    }

    /// The hashes of `seq`'s first `physical` slots' full blocks under its
    /// state (dense tokens when none).
    fn chain_at(&self, seq: SeqId, physical: usize) -> Vec<BlockHash> {
        let s = &self.seqs[&seq];
        match &s.state {
            None => self.hasher.full_block_hashes(&s.tokens[..physical]),
            Some(st) => {
                let mut chain = st.in_place.clone();
                let after = &s.tokens[st.point..st.point + physical - st.kept];
                self.hasher
                    .extend_compacted_hashes(st.name, st.kept, after, &mut chain);
                chain
            }
        }
    }

    fn append(&mut self, seq: SeqId, tokens: Vec<u32>) {
        let others = self.held_by_others(seq);
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        if s.pending_rewrite_from.is_some() {
            return;
        }
        let table = self.kv.table(seq).unwrap();
        let (logical, before) = (table.logical_len_tokens(), table.block_ids().len());
        // The next prompt chunk, or decoded tokens (known from now on).
        let decoding = logical >= s.prompt_len;
        let n = if decoding {
            tokens.len()
        } else {
            tokens.len().min(s.prompt_len - logical)
        };
        match self.kv.allocate_slots(seq, n) {
            Ok(()) => {
                if decoding {
                    s.tokens.extend(&tokens);
                }
                for b in &self.kv.table(seq).unwrap().block_ids()[before..] {
                    assert!(!others.contains(b), "{b} handed out while held");
                }
            }
            Err(KvError::OutOfBlocks { .. }) => {
                assert_eq!(self.kv.table(seq).unwrap().logical_len_tokens(), logical);
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn prepare(&mut self, seq: SeqId, from_permille: usize) {
        let Some(s) = self.seqs.get_mut(&seq) else {
            return;
        };
        let physical = self.kv.table(seq).unwrap().physical_len_tokens();
        if s.pending_rewrite_from.is_some() || s.written != physical {
            return; // compact computed sequences only, one compaction at a time
        }
        let shared = self.kv.shared_prefix_len_tokens(seq).unwrap();
        let from = shared + (physical - shared) * from_permille / 1000;
        self.kv.prepare_rewrite(seq, from).unwrap();
        s.pending_rewrite_from = Some(from);
        s.compacted = true;
        // It keeps the shared prefix whole: what it keeps depends on the sharing.
        s.pending_fork = false;
        s.tainted = true;
        s.resumable = None;
        assert!(self.kv.table(seq).unwrap().is_compacted());
        // Nothing from `from` on can be found any more.
        let table = self.kv.table(seq).unwrap();
        for b in &table.block_ids()[from / self.bs..] {
            assert_eq!(self.kv.block_hash(*b), None);
        }
    }

    fn fork(&mut self, seq: SeqId, from_permille: usize) {
        let Some(s) = self.seqs.get(&seq) else {
            assert_eq!(
                self.kv.fork_for_rewrite(seq, 0),
                Err(KvError::UnknownSequence(seq))
            );
            return;
        };
        let table = self.kv.table(seq).unwrap().clone();
        let physical = table.physical_len_tokens();
        if s.pending_rewrite_from.is_some() || s.written != physical {
            return;
        }
        let from = physical * from_permille / 1000;
        let needed = self.kv.blocks_to_fork(seq, from).unwrap();
        let counts_before = self.kv.block_counts();
        let free_before = self.kv.num_free_blocks();
        let others = self.held_by_others(seq);
        let rewritten = &table.block_ids()[(from / self.bs).min(table.block_ids().len())..];
        let shared: Vec<_> = rewritten
            .iter()
            .filter(|b| self.kv.ref_count(**b) > Some(1))
            .copied()
            .collect();
        let registered_private = rewritten
            .iter()
            .filter(|b| self.kv.ref_count(**b) == Some(1) && self.kv.block_hash(**b).is_some())
            .count();
        match self.kv.fork_for_rewrite(seq, from) {
            Ok(pairs) => {
                self.reached.forks += usize::from(!pairs.is_empty());
                // Every shared block is copied; private registered ones only
                // into uncached free blocks beyond those, and all of them
                // when there are enough.
                assert_eq!(needed, shared.len());
                let olds: Vec<_> = pairs.iter().map(|(old, _)| *old).collect();
                assert!(
                    shared.iter().all(|b| olds.contains(b)),
                    "a shared block not copied"
                );
                let spare = counts_before.free_uncached.saturating_sub(needed);
                assert!(pairs.len() <= needed + spare.min(registered_private));
                if spare >= registered_private {
                    assert_eq!(pairs.len(), needed + registered_private);
                } else {
                    self.reached.partial_forks += 1;
                }
                let after = self.kv.table(seq).unwrap().clone();
                for (old, new) in &pairs {
                    assert!(!others.contains(new), "{new} handed out while held");
                    assert_eq!(self.kv.ref_count(*new), Some(1));
                    assert!(!after.block_ids().contains(old));
                    // The caller copies the block's K/V.
                    self.content[new.index()] = self.content[old.index()].clone();
                }
                // Everything from `from` on is private and unregistered now,
                // so the rewrite may touch any of it.
                for b in &after.block_ids()[from / self.bs..] {
                    assert_eq!(self.kv.ref_count(*b), Some(1));
                    assert_eq!(self.kv.block_hash(*b), None);
                }
                assert_eq!(
                    &after.block_ids()[..from / self.bs],
                    &table.block_ids()[..from / self.bs]
                );
                assert!(after.is_compacted());
                let s = self.seqs.get_mut(&seq).unwrap();
                // Compacted again before its slots were named: the chain before is unknown.
                s.tainted |= s.compacted;
                s.pending_rewrite_from = Some(from);
                s.compacted = true;
                s.pending_fork = true;
                s.resumable = None;
            }
            Err(KvError::OutOfBlocks { .. }) => {
                self.reached.refused_forks += 1;
                assert!(needed > free_before);
                assert_eq!(
                    self.kv.table(seq),
                    Some(&table),
                    "refusal changed the table"
                );
                assert_eq!(self.kv.block_counts(), counts_before);
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn shrink(&mut self, seq: SeqId, keep_permille: usize) {
        let Some(s) = self.seqs.get(&seq) else {
            assert_eq!(
                self.kv.shrink_physical(seq, 0),
                Err(KvError::UnknownSequence(seq))
            );
            return;
        };
        let physical = self.kv.table(seq).unwrap().physical_len_tokens();
        if s.written != physical {
            return;
        }
        let from = s.pending_rewrite_from.unwrap_or(0);
        let new_len = from + (physical - from) * keep_permille / 1000;
        // Without an announcement, every kept slot may have been rewritten.
        let rewritten = from.min(new_len) / self.bs..new_len.div_ceil(self.bs);
        let table = self.kv.table(seq).unwrap().clone();
        let refused = table.block_ids()[rewritten]
            .iter()
            .any(|b| self.kv.is_shared(*b));
        let free_before = self.kv.num_free_blocks();
        // Dropped blocks return to the pool only if this was their last holder.
        let back_to_pool = table.block_ids()[new_len.div_ceil(self.bs)..]
            .iter()
            .filter(|b| self.kv.ref_count(**b) == Some(1))
            .count();
        match self.kv.shrink_physical(seq, new_len) {
            Ok(freed) => {
                if s.pending_rewrite_from.is_some() {
                    self.reached.announced_compactions += 1;
                } else {
                    self.reached.unannounced_compactions += 1;
                }
                assert!(!refused);
                assert_eq!(
                    freed,
                    physical.div_ceil(self.bs) - new_len.div_ceil(self.bs)
                );
                assert_eq!(self.kv.num_free_blocks(), free_before + back_to_pool);
                let from = from.min(new_len);
                let named = s.pending_fork && !s.tainted;
                let state = named.then(|| {
                    // What it keeps is a function of the tokens, the cut and the state before.
                    let logical = table.logical_len_tokens();
                    let before = self.chain_at(seq, table.physical_len_tokens());
                    let fp = fingerprints(&s.tokens[..logical])
                        .last()
                        .copied()
                        .unwrap_or(0);
                    let prior = s.state.as_ref().map(|st| st.name);
                    let policy = format!("{logical}/{from}/{new_len}/{fp}/{prior:?}");
                    let parent = BlockHash::of_block(self.hasher.identity(), None, &[7]);
                    State {
                        name: BlockHash::of_compacted_state(
                            self.hasher.identity(),
                            parent,
                            &policy,
                        ),
                        kept: new_len,
                        point: logical,
                        in_place: before[..(from / self.bs).min(before.len())].to_vec(),
                    }
                });
                let values = match &state {
                    Some(st) => {
                        let name = st.name.to_u128() as u64;
                        (from..new_len).map(|slot| mix(name, slot as u64)).collect()
                    }
                    None => self.garbage(new_len - from),
                };
                self.write(seq, from, &values);
                let s = self.seqs.get_mut(&seq).unwrap();
                s.written = new_len;
                s.compacted = true;
                s.pending_rewrite_from = None;
                s.pending_fork = false;
                s.tainted |= state.is_none();
                s.resumable = state;
                if keep_permille.is_multiple_of(2) {
                    // The engine resumes as the compaction finishes.
                    self.resume(seq);
                }
            }
            Err(KvError::SharedBlockRewrite { seq: got, block }) => {
                assert!(refused, "refused a private rewrite");
                self.reached.refused_rewrites += 1;
                assert_eq!(got, seq);
                assert!(self.kv.is_shared(block));
                assert_eq!(
                    self.kv.table(seq),
                    Some(&table),
                    "refusal changed the table"
                );
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn resume(&mut self, seq: SeqId) {
        let Some(s) = self.seqs.get_mut(&seq) else {
            assert_eq!(
                self.kv.resume_registration(seq, 0),
                Err(KvError::UnknownSequence(seq))
            );
            return;
        };
        if s.pending_rewrite_from.is_some() {
            assert!(
                self.kv.resume_registration(seq, 0).is_err(),
                "resumed mid-rewrite"
            );
            return;
        }
        let physical = self.kv.table(seq).unwrap().physical_len_tokens();
        if s.written != physical {
            return; // slots allocated since the compaction are not written yet
        }
        let Some(state) = s.resumable.take().filter(|_| !s.tainted) else {
            return;
        };
        self.kv
            .resume_registration(seq, state.in_place.len())
            .unwrap();
        assert!(!self.kv.table(seq).unwrap().is_compacted());
        s.compacted = false;
        s.state = Some(state.clone());
        self.entries.push(Entry {
            tokens: s.tokens.clone(),
            state,
        });
        self.reached.resumed += 1;
        // The kept blocks are final: registered at once, as the engine does.
        self.register(seq);
    }

    fn start_from(&mut self, seq: SeqId, entry: usize, extra: usize, suffix: &[u32], chunk: usize) {
        if self.entries.is_empty() || self.seqs.contains_key(&seq) {
            return;
        }
        let e = self.entries[entry % self.entries.len()].clone();
        let st = &e.state;
        let mut tokens = e.tokens[..e.tokens.len().min(st.point + extra)].to_vec();
        tokens.extend(suffix);
        if tokens.len() <= st.point {
            return;
        }
        let len = tokens.len();
        let bs = self.bs;
        // Every full block before the last token (which must be computed).
        let mut chain = st.in_place.clone();
        self.hasher.extend_compacted_hashes(
            st.name,
            st.kept,
            &tokens[st.point..len - 1],
            &mut chain,
        );
        let run = self.kv.find_cached_prefix(&chain).num_blocks;
        if run * bs < st.kept || run < st.in_place.len() {
            return; // the state is not wholly cached
        }
        let logical_hit = st.point + run * bs - st.kept;
        let n = (len - logical_hit).min(chunk);
        let free_before = self.kv.num_free_blocks();
        let counts_before = self.kv.block_counts();
        let needed = self
            .kv
            .blocks_needed_with_compacted_prefix(&chain[..run], n);
        let others = self.held_by_others(seq);
        let query = CompactedPrefixQuery {
            block_hashes: &chain[..run],
            logical_hit_tokens: logical_hit,
            query_len_tokens: len,
        };
        match self.kv.allocate_with_compacted_prefix(seq, query, n) {
            Ok(hit) => {
                self.reached.compacted_hits += 1;
                assert_eq!((hit.num_blocks, hit.num_tokens), (run, logical_hit));
                assert_eq!(self.kv.num_free_blocks(), free_before - needed);
                let table = self.kv.table(seq).unwrap();
                assert_eq!(table.logical_len_tokens(), logical_hit + n);
                assert_eq!(table.physical_len_tokens(), run * bs + n);
                for b in &table.block_ids()[run..] {
                    assert!(!others.contains(b), "{b} handed out while held");
                }
                self.seqs.insert(
                    seq,
                    Seq {
                        prompt_len: len,
                        tokens,
                        written: run * bs,
                        compacted: false,
                        pending_rewrite_from: None,
                        pending_fork: false,
                        tainted: false,
                        state: Some(e.state.clone()),
                        resumable: None,
                    },
                );
            }
            Err(KvError::OutOfBlocks { needed: got, free }) => {
                self.reached.out_of_blocks += 1;
                assert_eq!((got, free), (needed, free_before));
                assert!(!self.kv.contains(seq));
                assert_eq!(self.kv.block_counts(), counts_before);
            }
            Err(e) => panic!("unexpected {e}"),
        }
    }

    fn free(&mut self, seq: SeqId) {
        let result = self.kv.free(seq);
        match self.seqs.remove(&seq) {
            Some(_) => assert!(result.is_ok()),
            None => assert_eq!(result, Err(KvError::UnknownSequence(seq))),
        }
    }

    fn check(&self) {
        self.kv.check_invariants().unwrap();
        let counts = self.kv.block_counts();
        assert_eq!(
            counts.total(),
            self.kv.num_total_blocks(),
            "counts do not add up"
        );
        assert_eq!(
            counts.free_uncached + counts.free_cached,
            self.kv.num_free_blocks()
        );
        let mut held = HashSet::new();
        for (seq, s) in &self.seqs {
            let t = self.kv.table(*seq).expect("live sequence has a table");
            assert_eq!(t.is_compacted(), s.compacted);
            assert!(s.written <= t.physical_len_tokens());
            for b in t.block_ids() {
                assert!(self.kv.ref_count(*b).is_some_and(|n| n >= 1));
                held.insert(*b);
            }
        }
        assert_eq!(counts.used, held.len(), "used blocks are not the held ones");
        assert_eq!(self.kv.seq_ids().count(), self.seqs.len());
        // The map points only at blocks holding what their hash names.
        for (hash, block) in self.kv.cached_blocks() {
            let want = self
                .meaning
                .get(&hash)
                .expect("hash the test never registered");
            let got: Vec<u64> = self.content[block.index()]
                .iter()
                .map(|v| v.expect("registered block has an unwritten slot"))
                .collect();
            assert_eq!(&got, want, "{block} under {hash} holds other contents");
        }
    }
}

fn prompt(base_which: usize, base_len: usize, suffix: &[u32]) -> Vec<u32> {
    let mut tokens = base(base_which)[..base_len].to_vec();
    tokens.extend(suffix);
    if tokens.is_empty() {
        tokens.push(0);
    }
    tokens
}

/// Runs one script against a cache-on manager, checking after every step.
fn run_script(num_blocks: usize, block_size: usize, ops: Vec<Op>) -> Reached {
    let mut w = World::new(num_blocks, block_size);
    for op in ops {
        match op {
            Op::Start {
                seq,
                base,
                base_len,
                suffix,
                chunk,
            } => w.start(SeqId(seq), prompt(base, base_len, &suffix), chunk),
            Op::Compute { seq } => w.compute(SeqId(seq)),
            Op::Append { seq, tokens } => w.append(SeqId(seq), tokens),
            Op::Prepare { seq, from_permille } => w.prepare(SeqId(seq), from_permille),
            Op::Fork { seq, from_permille } => w.fork(SeqId(seq), from_permille),
            Op::Shrink { seq, keep_permille } => w.shrink(SeqId(seq), keep_permille),
            Op::Free { seq } => w.free(SeqId(seq)),
            Op::Resume { seq } => w.resume(SeqId(seq)),
            Op::StartFrom {
                seq,
                entry,
                extra,
                suffix,
                chunk,
            } => w.start_from(SeqId(seq), entry, extra, &suffix, chunk),
        }
        w.check();
    }
    // Drain: every block is free again, the cached ones still valid.
    let live: Vec<SeqId> = w.seqs.keys().copied().collect();
    for seq in live {
        w.free(seq);
    }
    w.check();
    let counts = w.kv.block_counts();
    assert_eq!(counts.used, 0, "leaked blocks");
    assert_eq!(counts.free_uncached + counts.free_cached, num_blocks);
    assert_eq!(counts.free_cached, w.kv.num_cached_blocks());
    w.reached.evicted_blocks = w.kv.prefix_cache_stats().evicted_blocks;
    w.reached
}

fn script() -> impl Strategy<Value = (usize, usize, Vec<Op>)> {
    (0usize..24, 1usize..5, prop::collection::vec(op(), 1..150))
}

/// The generator must keep reaching every path the property is about;
/// a fixed seed makes this deterministic.
#[test]
fn scripts_reach_hits_evictions_refusals_and_compactions() {
    let mut runner = TestRunner::new_with_rng(
        ProptestConfig::with_cases(512),
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let total = Cell::new(Reached::default());
    runner
        .run(&script(), |(num_blocks, block_size, ops)| {
            let r = run_script(num_blocks, block_size, ops);
            let mut t = total.get();
            t.hits += r.hits;
            t.out_of_blocks += r.out_of_blocks;
            t.announced_compactions += r.announced_compactions;
            t.unannounced_compactions += r.unannounced_compactions;
            t.refused_rewrites += r.refused_rewrites;
            t.forks += r.forks;
            t.refused_forks += r.refused_forks;
            t.partial_forks += r.partial_forks;
            t.evicted_blocks += r.evicted_blocks;
            t.resumed += r.resumed;
            t.compacted_hits += r.compacted_hits;
            total.set(t);
            Ok(())
        })
        .unwrap();
    let t = total.get();
    assert!(
        t.hits >= 50
            && t.out_of_blocks >= 50
            && t.announced_compactions >= 20
            && t.unannounced_compactions >= 20
            && t.refused_rewrites >= 10
            && t.forks >= 20
            && t.refused_forks >= 5
            && t.partial_forks >= 5
            && t.evicted_blocks >= 50
            && t.resumed >= 20
            && t.compacted_hits >= 10,
        "scripts no longer reach every path: {t:?}"
    );
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn prefix_caching_keeps_the_books((num_blocks, block_size, ops) in script()) {
        run_script(num_blocks, block_size, ops);
    }

    /// Caching off, driven through the prefix API, is the plain manager.
    #[test]
    fn caching_off_matches_the_plain_manager(
        num_blocks in 0usize..16,
        block_size in 1usize..5,
        ops in prop::collection::vec(op(), 1..100),
    ) {
        let mut plain = KvCacheManager::new(num_blocks, block_size).unwrap();
        let mut off = KvCacheManager::with_config(KvCacheConfig {
            num_blocks,
            block_size_tokens: block_size,
            enable_prefix_caching: false,
        })
        .unwrap();
        let h = hasher(block_size);
        for op in ops {
            match op {
                Op::Start { seq, base, base_len, suffix, chunk } => {
                    let seq = SeqId(seq);
                    let tokens = prompt(base, base_len, &suffix);
                    let hashes = h.full_block_hashes(&tokens);
                    let n = tokens.len().min(chunk);
                    prop_assert_eq!(off.find_cached_prefix(&hashes).num_tokens, 0);
                    prop_assert_eq!(
                        off.blocks_needed_with_prefix(&hashes, n),
                        plain.blocks_needed(SeqId(u64::MAX), n)
                    );
                    let query = PrefixQuery { block_hashes: &hashes, query_len_tokens: tokens.len() };
                    let got = off.allocate_with_prefix(seq, query, n);
                    if plain.contains(seq) {
                        prop_assert_eq!(got, Err(KvError::SequenceExists(seq)));
                    } else {
                        prop_assert_eq!(got.map(|hit| hit.num_tokens), plain.allocate_slots(seq, n).map(|()| 0));
                    }
                }
                Op::Compute { seq } | Op::Append { seq, .. } if !plain.contains(SeqId(seq)) => {}
                Op::Compute { seq } => {
                    let seq = SeqId(seq);
                    let len = off.table(seq).unwrap().physical_len_tokens();
                    let hashes = h.full_block_hashes(&vec![1; len]);
                    prop_assert_eq!(off.register_full_blocks(seq, &hashes), Ok(0));
                }
                Op::Append { seq, tokens } => {
                    let seq = SeqId(seq);
                    prop_assert_eq!(off.allocate_slots(seq, tokens.len()), plain.allocate_slots(seq, tokens.len()));
                }
                Op::Prepare { seq, from_permille } => {
                    let seq = SeqId(seq);
                    if let Some(t) = off.table(seq) {
                        let from = t.physical_len_tokens() * from_permille / 1000;
                        prop_assert_eq!(off.prepare_rewrite(seq, from), Ok(0));
                    }
                }
                Op::Fork { seq, from_permille } => {
                    let seq = SeqId(seq);
                    if let Some(t) = off.table(seq) {
                        let from = t.physical_len_tokens() * from_permille / 1000;
                        prop_assert_eq!(off.blocks_to_fork(seq, from), Ok(0));
                        prop_assert_eq!(off.fork_for_rewrite(seq, from), Ok(vec![]));
                    }
                }
                Op::Shrink { seq, keep_permille } => {
                    let seq = SeqId(seq);
                    let new_len = plain.table(seq).map_or(0, |t| t.physical_len_tokens() * keep_permille / 1000);
                    prop_assert_eq!(off.shrink_physical(seq, new_len), plain.shrink_physical(seq, new_len));
                }
                Op::Free { seq } => {
                    prop_assert_eq!(off.free(SeqId(seq)), plain.free(SeqId(seq)));
                }
                // Nothing is cached with caching off: no state to start from.
                Op::Resume { .. } | Op::StartFrom { .. } => {}
            }
            off.check_invariants().unwrap();
            prop_assert_eq!(off.block_counts(), plain.block_counts());
            prop_assert_eq!(off.num_cached_blocks(), 0);
            let mut seqs: Vec<SeqId> = plain.seq_ids().collect();
            seqs.sort();
            for seq in seqs {
                let (a, b) = (plain.table(seq).unwrap(), off.table(seq).unwrap());
                prop_assert_eq!(a.block_ids(), b.block_ids());
                prop_assert_eq!(a.logical_len_tokens(), b.logical_len_tokens());
                prop_assert_eq!(a.physical_len_tokens(), b.physical_len_tokens());
            }
        }
        prop_assert_eq!(off.prefix_cache_stats(), Default::default());
    }
}
