//! The one error type of `starling-kv`.

use crate::bytes::{format_bytes, format_bytes_in_unit_of};
use crate::ids::{BlockId, SeqId};

/// Everything that can go wrong while keeping KV-cache books.
///
/// Every variant is a caller mistake or a capacity limit; none leaves the
/// manager in a half-changed state (operations are all-or-nothing).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum KvError {
    /// Not enough free blocks for the request; nothing was allocated.
    #[error("out of KV-cache blocks: {needed} needed, {free} free")]
    OutOfBlocks {
        /// Blocks the operation needed.
        needed: usize,
        /// Blocks that were free.
        free: usize,
    },

    /// The sequence has no block table.
    #[error("unknown sequence {0}")]
    UnknownSequence(SeqId),

    /// A block was freed while no one held it (double free, or never allocated).
    #[error("block {0} freed while not allocated (double free?)")]
    DoubleFree(BlockId),

    /// A block was shared while free (only allocated blocks can gain holders).
    #[error("block {0} is free and cannot be shared")]
    BlockNotAllocated(BlockId),

    /// A block was registered in the prefix cache twice.
    #[error("block {0} is already registered in the prefix cache")]
    BlockAlreadyRegistered(BlockId),

    /// A new block table was asked for a sequence that already has one.
    #[error("sequence {0} already holds a block table")]
    SequenceExists(SeqId),

    /// A sequence was to start from cached blocks that are not (all) cached.
    #[error("sequence {seq} asked for {wanted_blocks} cached blocks, {cached_blocks} are cached")]
    PrefixNotCached {
        /// The sequence.
        seq: SeqId,
        /// Leading blocks it asked to reuse.
        wanted_blocks: usize,
        /// Of those, the leading run found cached.
        cached_blocks: usize,
    },

    /// An in-place rewrite (compaction, or appending into a block cut short)
    /// would touch a block other tables share; nothing was changed.
    #[error("sequence {seq} would rewrite block {block}, which other sequences share")]
    SharedBlockRewrite {
        /// The sequence asking.
        seq: SeqId,
        /// The first shared block in the way.
        block: BlockId,
    },

    /// A block id outside the pool.
    #[error("block {block} does not exist (pool has {num_total_blocks} blocks)")]
    InvalidBlock {
        /// The offending id.
        block: BlockId,
        /// Size of the pool.
        num_total_blocks: usize,
    },

    /// A range of token slots outside what the sequence holds.
    #[error(
        "token range {start}..{end} is outside the {physical_len_tokens} physical slots of sequence {seq}"
    )]
    InvalidRange {
        /// The sequence.
        seq: SeqId,
        /// First index asked for.
        start: usize,
        /// One past the last index asked for.
        end: usize,
        /// Slots the sequence holds.
        physical_len_tokens: usize,
    },

    /// The cache budget cannot hold one sequence of the maximum model length.
    #[error(
        "KV cache needs {needed} for one {max_model_len_tokens}-token sequence{held}, \
         {available} available ({needed_bytes} vs {available_bytes} bytes); \
         lower max_model_len or raise the KV-cache memory budget",
        needed = format_bytes(*.needed_bytes),
        available = format_bytes_in_unit_of(*.available_bytes, *.needed_bytes),
        held = peak_note(*.peak_tokens, *.max_model_len_tokens)
    )]
    InsufficientMemory {
        /// Bytes one `max_model_len_tokens` sequence needs at its peak (whole blocks).
        needed_bytes: u64,
        /// Bytes of the budget.
        available_bytes: u64,
        /// The maximum model length the check was made for.
        max_model_len_tokens: usize,
        /// Token slots such a sequence holds at its peak (`max_model_len_tokens` unless token
        /// eviction keeps fewer).
        peak_tokens: usize,
    },

    /// A configuration value that cannot work (block size 0, empty layout, ...).
    #[error("invalid KV-cache configuration: {0}")]
    InvalidConfig(String),

    /// `check_invariants` found inconsistent books (a bug, reported for tests).
    #[error("KV-cache invariant violated: {0}")]
    InvariantViolated(String),
}

/// The "(holding N tokens at its peak)" part of the preflight refusal, empty when the sequence
/// holds every token.
fn peak_note(peak_tokens: usize, max_model_len_tokens: usize) -> String {
    if peak_tokens >= max_model_len_tokens {
        String::new()
    } else {
        format!(" holding {peak_tokens} tokens at its peak under eviction")
    }
}
