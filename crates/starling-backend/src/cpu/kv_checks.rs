//! Argument checks of the cache-management ops (`compact_kv`, `read_keys`, `copy_kv_blocks`,
//! `gather_kv`, `scatter_kv`, `key_scores`). The CPU reference applies them and accelerated
//! backends call the same functions on the host before launching anything, so every backend
//! rejects exactly the same input and an error always leaves the cache untouched.

use crate::{BackendError, HostTensor, KvCacheSpec, WindowScoreSpec};

/// Checks that `len_tokens` physical tokens fit `block_table` and that every block id of the table
/// is inside the cache.
pub fn check_block_table(
    spec: &KvCacheSpec,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    op: &str,
) -> Result<(), BackendError> {
    if block_size_tokens != spec.block_size_tokens || block_size_tokens == 0 {
        return Err(BackendError::Shape(format!(
            "{op}: block size {block_size_tokens} differs from the cache's {}",
            spec.block_size_tokens
        )));
    }
    let capacity_tokens = block_table.len().saturating_mul(block_size_tokens);
    if len_tokens > capacity_tokens {
        return Err(BackendError::Shape(format!(
            "{op}: {len_tokens} tokens do not fit {} blocks of {block_size_tokens}",
            block_table.len()
        )));
    }
    if let Some(bad) = block_table.iter().find(|&&b| b as usize >= spec.num_blocks) {
        return Err(BackendError::Shape(format!(
            "{op}: block {bad} out of range (cache has {} blocks)",
            spec.num_blocks
        )));
    }
    Ok(())
}

/// Checks the block table (as [`check_block_table`]) and returns the flat slot of each physical
/// index `0..len_tokens`.
pub fn physical_slots(
    spec: &KvCacheSpec,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    op: &str,
) -> Result<Vec<u32>, BackendError> {
    check_block_table(spec, block_table, block_size_tokens, len_tokens, op)?;
    (0..len_tokens)
        .map(|i| {
            let slot = block_table[i / block_size_tokens] as usize * block_size_tokens
                + i % block_size_tokens;
            u32::try_from(slot)
                .map_err(|_| BackendError::Shape(format!("{op}: slot {slot} does not fit a u32")))
        })
        .collect()
}

/// A full layer's `(num_kv_heads, head_dim)` and the slot of each physical index `0..len_tokens`
/// ([`physical_slots`]): what an op reading a full layer's keys checks first.
pub(crate) fn full_layer_slots(
    spec: &KvCacheSpec,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    op: &str,
) -> Result<((usize, usize), Vec<u32>), BackendError> {
    let heads = spec.require_full(op)?;
    let slots = physical_slots(spec, block_table, block_size_tokens, len_tokens, op)?;
    Ok((heads, slots))
}

/// Checks that the blocks holding physical indices `0..len_tokens` are distinct. Ops that write
/// a sequence's slots in parallel need it: a block listed twice would be written twice at once.
/// Call after [`check_block_table`] (it assumes the tokens fit the table).
pub fn check_distinct_blocks(
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    op: &str,
) -> Result<(), BackendError> {
    let used = len_tokens
        .div_ceil(block_size_tokens.max(1))
        .min(block_table.len());
    let mut blocks = block_table[..used].to_vec();
    blocks.sort_unstable();
    match blocks.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(BackendError::Shape(format!(
            "{op}: block {} appears twice in the sequence's block table",
            w[0]
        ))),
        None => Ok(()),
    }
}

/// Everything `compact_kv` checks before moving anything, on every backend: the block table
/// covers `physical_len_tokens`, its blocks are distinct (compaction writes them in place), and
/// `keep` is valid (see [`kept_count`]). Returns the kept count.
pub fn check_compaction(
    spec: &KvCacheSpec,
    block_table: &[u32],
    block_size_tokens: usize,
    physical_len_tokens: usize,
    keep: &[Vec<u32>],
) -> Result<usize, BackendError> {
    let op = "compact_kv";
    check_block_table(
        spec,
        block_table,
        block_size_tokens,
        physical_len_tokens,
        op,
    )?;
    check_distinct_blocks(block_table, block_size_tokens, physical_len_tokens, op)?;
    kept_count(keep, spec.keep_lists(), physical_len_tokens)
}

/// Checks that `keep` has `num_lists` strictly ascending, in-range index lists (one per KV head
/// of a full layer, one for a latent layer: [`KvCacheSpec::keep_lists`]), all of the same
/// length, and returns that length (the kept count).
pub fn kept_count(
    keep: &[Vec<u32>],
    num_lists: usize,
    physical_len_tokens: usize,
) -> Result<usize, BackendError> {
    if keep.len() != num_lists {
        return Err(BackendError::Shape(format!(
            "compact_kv: {} kept-index lists where the layer takes {num_lists} (one per KV head \
             of a full layer, one for a latent layer)",
            keep.len()
        )));
    }
    let count = keep.first().map_or(0, Vec::len);
    for (head, indices) in keep.iter().enumerate() {
        if indices.len() != count {
            return Err(BackendError::Shape(format!(
                "compact_kv: head {head} keeps {} tokens, head 0 keeps {count} \
                 (every head of a layer must keep the same count)",
                indices.len()
            )));
        }
        if let Some(w) = indices.windows(2).find(|w| w[0] >= w[1]) {
            return Err(BackendError::Shape(format!(
                "compact_kv: head {head} kept indices are not strictly ascending ({} then {})",
                w[0], w[1]
            )));
        }
        if let Some(&last) = indices.last() {
            if last as usize >= physical_len_tokens {
                return Err(BackendError::Shape(format!(
                    "compact_kv: head {head} keeps index {last} of a sequence with \
                     {physical_len_tokens} physical tokens"
                )));
            }
        }
    }
    Ok(count)
}

/// Checks `(src, dst)` block copies: ids in range, destinations distinct, no destination also a
/// source. Under these rules the copies do not depend on each other, so a backend may run them
/// all at once.
pub fn check_block_copies(num_blocks: usize, pairs: &[(u32, u32)]) -> Result<(), BackendError> {
    if let Some(&(src, dst)) = pairs
        .iter()
        .find(|&&(s, d)| s as usize >= num_blocks || d as usize >= num_blocks)
    {
        return Err(BackendError::Shape(format!(
            "copy_kv_blocks: pair ({src}, {dst}) out of range (cache has {num_blocks} blocks)"
        )));
    }
    let mut dsts: Vec<u32> = pairs.iter().map(|&(_, d)| d).collect();
    dsts.sort_unstable();
    if let Some(w) = dsts.windows(2).find(|w| w[0] == w[1]) {
        return Err(BackendError::Shape(format!(
            "copy_kv_blocks: block {} is the destination of two copies",
            w[0]
        )));
    }
    if let Some(&(src, _)) = pairs.iter().find(|(s, _)| dsts.binary_search(s).is_ok()) {
        return Err(BackendError::Shape(format!(
            "copy_kv_blocks: block {src} is both a source and a destination"
        )));
    }
    Ok(())
}

/// Checks the rows given to `scatter_kv`: keys `[len, key_width]`, values `[len, value_width]`
/// (the spec's plane widths) and, for a latent layer, `len` positions (none for a full one);
/// returns `len`.
pub fn scatter_len(
    spec: &KvCacheSpec,
    k_shape: &[usize],
    v_shape: &[usize],
    num_positions: usize,
) -> Result<usize, BackendError> {
    let (kw, vw) = spec.plane_widths();
    let len = match (k_shape, v_shape) {
        ([len, k], [v_len, v]) if *k == kw && *v == vw && len == v_len => *len,
        _ => {
            return Err(BackendError::Shape(format!(
                "scatter_kv: K {k_shape:?} and V {v_shape:?} must be [len, {kw}] and [len, {vw}]"
            )))
        }
    };
    let want_positions = if spec.is_latent() { len } else { 0 };
    if num_positions != want_positions {
        return Err(BackendError::Shape(format!(
            "scatter_kv: {num_positions} positions for {len} rows of a {} layer",
            if spec.is_latent() { "latent" } else { "full" }
        )));
    }
    Ok(len)
}

/// Checks the arguments of `window_scores` (block table as [`check_block_table`], queries
/// `[window, num_kv_heads * group * head_dim]` with `1 <= window <= len_tokens`, a non-zero
/// group, a finite scale and an odd pool width) and returns the window length in tokens.
pub fn check_window_scores(
    spec: &KvCacheSpec,
    block_table: &[u32],
    block_size_tokens: usize,
    len_tokens: usize,
    queries: &HostTensor,
    score: &WindowScoreSpec,
) -> Result<usize, BackendError> {
    let op = "window_scores";
    check_block_table(spec, block_table, block_size_tokens, len_tokens, op)?;
    let (num_kv_heads, head_dim) = spec.require_full(op)?;
    let width = num_kv_heads * score.group * head_dim;
    let window = match queries.shape() {
        [rows, cols] if *cols == width => *rows,
        other => {
            return Err(BackendError::Shape(format!(
                "{op}: queries of shape {other:?}, expected [window, {width}] ({num_kv_heads} KV heads x group {} x head_dim {head_dim})",
                score.group
            )))
        }
    };
    if score.group == 0 || window == 0 || window > len_tokens {
        return Err(BackendError::Shape(format!(
            "{op}: a window of {window} queries (group {}) over {len_tokens} tokens",
            score.group
        )));
    }
    if !score.scale.is_finite() || score.pool_kernel_tokens.is_multiple_of(2) {
        return Err(BackendError::Shape(format!(
            "{op}: scale {} and pool width {} (finite scale, odd width)",
            score.scale, score.pool_kernel_tokens
        )));
    }
    Ok(window)
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_kv::CacheDtype;

    #[test]
    fn block_tables_are_checked() {
        let spec = KvCacheSpec::full(8, 4, 2, 3, CacheDtype::F32);
        let spec = &spec;
        assert!(check_block_table(spec, &[1, 7], 4, 8, "t").is_ok());
        assert!(check_block_table(spec, &[1, 7], 4, 9, "t").is_err());
        assert!(check_block_table(spec, &[1, 8], 4, 1, "t").is_err());
        assert!(check_block_table(spec, &[1], 2, 1, "t").is_err());
        assert!(check_block_table(spec, &[], 4, 0, "t").is_ok());
        assert_eq!(
            physical_slots(spec, &[5, 2], 4, 6, "t").unwrap(),
            vec![20, 21, 22, 23, 8, 9]
        );
    }

    #[test]
    fn distinct_blocks_only_count_the_used_part() {
        assert!(check_distinct_blocks(&[3, 1, 3], 4, 8, "t").is_ok());
        assert!(check_distinct_blocks(&[3, 1, 3], 4, 9, "t").is_err());
        assert!(check_distinct_blocks(&[3, 3], 4, 4, "t").is_ok());
        assert!(check_distinct_blocks(&[3, 3], 4, 5, "t").is_err());
    }

    #[test]
    fn scatter_rows_match_the_layout() {
        let full = KvCacheSpec::full(8, 4, 2, 3, CacheDtype::F32);
        assert_eq!(scatter_len(&full, &[5, 6], &[5, 6], 0).unwrap(), 5);
        assert!(scatter_len(&full, &[5, 6], &[4, 6], 0).is_err());
        assert!(scatter_len(&full, &[5, 6], &[5, 6], 5).is_err());
        let latent = KvCacheSpec {
            num_blocks: 8,
            block_size_tokens: 4,
            layout: starling_kv::LayerLayout::LowRank {
                key_rank_per_head: vec![8, 16],
                value_rank: 8,
                dtype: CacheDtype::F32,
            },
        };
        assert_eq!(scatter_len(&latent, &[3, 24], &[3, 8], 3).unwrap(), 3);
        assert!(scatter_len(&latent, &[3, 24], &[3, 8], 0).is_err());
        assert!(scatter_len(&latent, &[3, 16], &[3, 8], 3).is_err());
        assert_eq!(latent.keep_lists(), 1);
        assert_eq!(full.keep_lists(), 2);
    }

    #[test]
    fn block_copies_must_be_independent() {
        assert!(check_block_copies(8, &[]).is_ok());
        assert!(check_block_copies(8, &[(0, 1), (0, 2), (3, 4)]).is_ok());
        assert!(check_block_copies(8, &[(0, 8)]).is_err());
        assert!(check_block_copies(8, &[(8, 0)]).is_err());
        assert!(check_block_copies(8, &[(0, 2), (1, 2)]).is_err());
        assert!(check_block_copies(8, &[(0, 1), (1, 2)]).is_err());
        assert!(check_block_copies(8, &[(3, 3)]).is_err());
    }
}
