//! What a scorer sees: one KV head's keys and, for SnapKV, its query group's window queries.

use crate::EvictError;

/// One KV head's keys, `[n_tokens, head_dim]` row-major, post-RoPE, in physical
/// (chronological) order.
#[derive(Clone, Copy, Debug)]
pub struct HeadKeys<'a> {
    keys: &'a [f32],
    head_dim: usize,
}

impl<'a> HeadKeys<'a> {
    /// Wraps `keys`, which must hold a whole number of `head_dim` rows (`head_dim` > 0).
    pub fn new(keys: &'a [f32], head_dim: usize) -> Result<Self, EvictError> {
        if head_dim == 0 || !keys.len().is_multiple_of(head_dim) {
            return Err(EvictError::Shape(format!(
                "{} key values are not rows of head_dim {head_dim}",
                keys.len()
            )));
        }
        Ok(Self { keys, head_dim })
    }

    /// Number of tokens.
    pub fn len_tokens(&self) -> usize {
        self.keys.len() / self.head_dim
    }

    /// Elements per key.
    pub fn head_dim(&self) -> usize {
        self.head_dim
    }

    /// Key rows, oldest first.
    pub fn rows(&self) -> std::slice::ChunksExact<'a, f32> {
        self.keys.chunks_exact(self.head_dim)
    }
}

/// The last `window_tokens` queries of one KV head's query group, `[window, group, head_dim]`
/// row-major; query `j` belongs to the token at physical index `n_tokens - window + j`.
#[derive(Clone, Copy, Debug)]
pub struct WindowQueries<'a> {
    queries: &'a [f32],
    window_tokens: usize,
    group: usize,
}

impl<'a> WindowQueries<'a> {
    /// Wraps `queries`, which must hold exactly `window_tokens * group * head_dim` values.
    pub fn new(
        queries: &'a [f32],
        window_tokens: usize,
        group: usize,
        head_dim: usize,
    ) -> Result<Self, EvictError> {
        if queries.len() != window_tokens * group * head_dim || group == 0 {
            return Err(EvictError::Shape(format!(
                "{} query values for window {window_tokens} x group {group} x head_dim {head_dim}",
                queries.len()
            )));
        }
        Ok(Self {
            queries,
            window_tokens,
            group,
        })
    }

    /// Window length in tokens.
    pub fn window_tokens(&self) -> usize {
        self.window_tokens
    }

    /// Query heads sharing the KV head.
    pub fn group(&self) -> usize {
        self.group
    }

    /// The `group` query rows of window token `j`, `[group * head_dim]`.
    pub fn token(&self, j: usize) -> &'a [f32] {
        let width = self.queries.len() / self.window_tokens.max(1);
        &self.queries[j * width..(j + 1) * width]
    }
}

/// Everything a [`Scorer`](crate::Scorer) is given for one KV head of one layer.
#[derive(Clone, Copy, Debug)]
pub struct ScoreInput<'a> {
    /// The head's keys.
    pub keys: HeadKeys<'a>,
    /// The window queries (needed by SnapKV only).
    pub queries: Option<WindowQueries<'a>>,
    /// Layer index (decorrelates seeded scorers across layers).
    pub layer: usize,
    /// KV head index (decorrelates seeded scorers across heads).
    pub kv_head: usize,
}

/// Splits interleaved `[n_tokens, num_kv_heads, head_dim]` keys (what `Backend::read_keys`
/// returns) into one contiguous `[n_tokens, head_dim]` buffer per KV head.
pub fn split_heads(
    keys: &[f32],
    num_kv_heads: usize,
    head_dim: usize,
) -> Result<Vec<Vec<f32>>, EvictError> {
    let width = num_kv_heads * head_dim;
    if width == 0 || !keys.len().is_multiple_of(width) {
        return Err(EvictError::Shape(format!(
            "{} key values are not rows of {num_kv_heads} heads x {head_dim}",
            keys.len()
        )));
    }
    let n = keys.len() / width;
    let mut heads = vec![Vec::with_capacity(n * head_dim); num_kv_heads];
    for row in keys.chunks_exact(width) {
        for (head, part) in heads.iter_mut().zip(row.chunks_exact(head_dim)) {
            head.extend_from_slice(part);
        }
    }
    Ok(heads)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn split_heads_deinterleaves() {
        // 2 tokens x 2 heads x head_dim 2: token t head h = [10t + h, 10t + h + 0.5].
        let keys = [0.0, 0.5, 1.0, 1.5, 10.0, 10.5, 11.0, 11.5];
        let heads = split_heads(&keys, 2, 2).unwrap();
        assert_eq!(heads[0], vec![0.0, 0.5, 10.0, 10.5]);
        assert_eq!(heads[1], vec![1.0, 1.5, 11.0, 11.5]);
        assert!(split_heads(&keys[..7], 2, 2).is_err());
        assert!(split_heads(&keys, 0, 2).is_err());
    }

    #[test]
    fn shapes_are_checked() {
        assert!(HeadKeys::new(&[1.0; 6], 4).is_err());
        assert!(HeadKeys::new(&[1.0; 6], 0).is_err());
        assert_eq!(HeadKeys::new(&[1.0; 6], 3).unwrap().len_tokens(), 2);
        assert!(WindowQueries::new(&[1.0; 12], 2, 2, 2).is_err());
        let q = WindowQueries::new(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0], 2, 2, 2).unwrap();
        assert_eq!(q.token(1), &[5.0, 6.0, 7.0, 8.0]);
    }
}
