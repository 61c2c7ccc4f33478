//! Cache groups: which layers share a block table (vLLM's KV-cache groups for hybrid models).
//!
//! A model whose layers all attend the same way (all full, or all over one window) has one
//! group: every layer reads the same block table, and block `b` holds slot range `b` in every
//! layer's cache, as it always has.
//!
//! A hybrid model (Gemma-3: a 512-token window on 5 of 6 layers, full attention on the rest)
//! cannot free the windowed layers' old slots if they share blocks with the full layers. So its
//! layers are split by kind into groups of equal size `G` ([`CacheGroups::num_slots`]); each
//! group has its own block table per sequence, all drawn from one pool, and the cache holds `G`
//! tensors ("slots") of `num_blocks` blocks: the `p`-th layer of whichever group owns block `b`
//! keeps its K/V in slot `p`'s block `b`. A block therefore costs `G` layers' bytes, and a
//! windowed group's table gives its blocks back once the window has passed them, so at 32k a
//! sequence holds the full layers' 32k slots plus about one window in the windowed layers.
//! `G` is the smallest kind's layer count (vLLM's rule: or the largest, when that is within
//! 1.25x of it), so the last group of a kind may have fewer layers than slots: those slots of
//! its blocks stay unused.

use std::collections::BTreeMap;

use crate::error::KvError;

/// Layers that share one block table per sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheGroup {
    /// The group's layers, ascending; the `p`-th keeps its K/V in cache slot `p`.
    pub layers: Vec<usize>,
    /// The window the group's layers attend over; `None`: the whole context.
    pub window_tokens: Option<usize>,
}

/// The model's layers split into [`CacheGroup`]s (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheGroups {
    groups: Vec<CacheGroup>,
    num_slots: usize,
    /// `(group, slot)` of each layer.
    layer_place: Vec<(usize, usize)>,
}

impl CacheGroups {
    /// Groups for layers attending over `layer_windows` (`None`: full attention): one group
    /// when every layer attends the same way, else groups per kind, full attention first,
    /// then windows ascending.
    pub fn plan(layer_windows: &[Option<usize>]) -> Result<Self, KvError> {
        if layer_windows.is_empty() {
            return Err(KvError::InvalidConfig("a model without layers".into()));
        }
        if layer_windows.contains(&Some(0)) {
            return Err(KvError::InvalidConfig(
                "a sliding window of 0 tokens".into(),
            ));
        }
        let mut kinds: BTreeMap<Option<usize>, Vec<usize>> = BTreeMap::new();
        for (layer, window) in layer_windows.iter().enumerate() {
            kinds.entry(*window).or_default().push(layer);
        }
        let min_layers = kinds.values().map(Vec::len).min().unwrap_or(1);
        let max_layers = kinds.values().map(Vec::len).max().unwrap_or(1);
        let num_slots = if kinds.len() == 1 || 4 * max_layers < 5 * min_layers {
            max_layers
        } else {
            min_layers
        };
        let groups: Vec<CacheGroup> = kinds
            .into_iter()
            .flat_map(|(window_tokens, layers)| {
                layers
                    .chunks(num_slots)
                    .map(|chunk| CacheGroup {
                        layers: chunk.to_vec(),
                        window_tokens,
                    })
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut layer_place = vec![(0, 0); layer_windows.len()];
        for (g, group) in groups.iter().enumerate() {
            for (slot, &layer) in group.layers.iter().enumerate() {
                layer_place[layer] = (g, slot);
            }
        }
        Ok(Self {
            groups,
            num_slots,
            layer_place,
        })
    }

    /// One group of `num_layers` full-attention layers (a model without windows).
    pub fn single(num_layers: usize) -> Self {
        Self {
            groups: vec![CacheGroup {
                layers: (0..num_layers).collect(),
                window_tokens: None,
            }],
            num_slots: num_layers,
            layer_place: (0..num_layers).map(|l| (0, l)).collect(),
        }
    }

    /// The groups, in table order (group 0's table is the sequence's main one).
    pub fn groups(&self) -> &[CacheGroup] {
        &self.groups
    }

    /// Number of groups (block tables per sequence).
    pub fn num_groups(&self) -> usize {
        self.groups.len()
    }

    /// Cache tensors to allocate: layers per group (every layer, with one group).
    pub fn num_slots(&self) -> usize {
        self.num_slots
    }

    /// Layers covered.
    pub fn num_layers(&self) -> usize {
        self.layer_place.len()
    }

    /// `(group, cache slot)` of `layer`, or `None` past the last layer.
    pub fn place(&self, layer: usize) -> Option<(usize, usize)> {
        self.layer_place.get(layer).copied()
    }

    /// Each group's window, in group order (what the KV manager releases behind).
    pub fn windows(&self) -> Vec<Option<usize>> {
        self.groups.iter().map(|g| g.window_tokens).collect()
    }

    /// Slots left unused in every block of a group smaller than [`Self::num_slots`], summed
    /// over groups: padding, as a count of layers.
    pub fn padding_layers(&self) -> usize {
        self.groups
            .iter()
            .map(|g| self.num_slots - g.layers.len())
            .sum()
    }
}

/// The most token slots a table of a group with `window_tokens` holds for a sequence of
/// `total_tokens`, with at most `chunk_tokens` written in one step before the step's release:
/// everything without a window, else the window plus the partial block before it and one
/// chunk.
pub fn group_held_tokens(
    window_tokens: Option<usize>,
    block_size_tokens: usize,
    total_tokens: usize,
    chunk_tokens: usize,
) -> usize {
    match window_tokens {
        None => total_tokens,
        Some(w) => total_tokens.min(
            w.saturating_add(block_size_tokens)
                .saturating_add(chunk_tokens),
        ),
    }
}

/// Blocks one sequence of `total_tokens` holds at most over groups with `windows` (each
/// [`group_held_tokens`], in whole blocks).
pub fn group_blocks_for_tokens(
    windows: &[Option<usize>],
    block_size_tokens: usize,
    total_tokens: usize,
    chunk_tokens: usize,
) -> usize {
    windows
        .iter()
        .map(|w| {
            group_held_tokens(*w, block_size_tokens, total_tokens, chunk_tokens)
                .div_ceil(block_size_tokens)
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Gemma-3-270M: 18 layers, every sixth full.
    fn gemma_270m() -> Vec<Option<usize>> {
        (0..18)
            .map(|l| if l % 6 == 5 { None } else { Some(512) })
            .collect()
    }

    #[test]
    fn one_kind_is_one_group_of_every_layer() {
        let g = CacheGroups::plan(&[None; 4]).unwrap();
        assert_eq!(g, CacheGroups::single(4));
        assert_eq!((g.num_groups(), g.num_slots()), (1, 4));
        assert_eq!(g.place(3), Some((0, 3)));
        let w = CacheGroups::plan(&[Some(8); 3]).unwrap();
        assert_eq!(w.windows(), vec![Some(8)]);
        assert_eq!(w.num_slots(), 3);
    }

    #[test]
    fn gemma_splits_into_one_full_and_five_windowed_groups_of_three() {
        let g = CacheGroups::plan(&gemma_270m()).unwrap();
        assert_eq!(g.num_slots(), 3);
        assert_eq!(g.num_groups(), 6);
        assert_eq!(g.groups()[0].layers, vec![5, 11, 17]);
        assert_eq!(g.groups()[0].window_tokens, None);
        assert_eq!(g.groups()[1].layers, vec![0, 1, 2]);
        assert_eq!(g.groups()[5].layers, vec![14, 15, 16]);
        assert_eq!(g.place(11), Some((0, 1)));
        assert_eq!(g.place(6), Some((2, 2)));
        assert_eq!(g.padding_layers(), 0);
        // Every layer has exactly one place, and no two share one.
        let mut places: Vec<_> = (0..18).map(|l| g.place(l).unwrap()).collect();
        places.sort();
        places.dedup();
        assert_eq!(places.len(), 18);
    }

    #[test]
    fn uneven_kinds_pad_the_last_group() {
        // Gemma-3-4B: 34 layers, 5 full.
        let windows: Vec<_> = (0..34)
            .map(|l| if l % 6 == 5 { None } else { Some(1024) })
            .collect();
        let g = CacheGroups::plan(&windows).unwrap();
        assert_eq!(g.num_slots(), 5);
        assert_eq!(g.num_groups(), 1 + 6);
        assert_eq!(g.groups()[6].layers.len(), 4);
        assert_eq!(g.padding_layers(), 1);
        // Kinds within 1.25x of each other use the larger count: 7 and 8 layers, one group
        // each; 4 and 5 are not (5 = 1.25 x 4), so 4 slots and a padded second windowed group.
        let near: Vec<_> = (0..15).map(|l| (l % 2 == 0).then_some(16)).collect();
        let g = CacheGroups::plan(&near).unwrap();
        let shape = |g: &CacheGroups| (g.num_slots(), g.num_groups(), g.padding_layers());
        assert_eq!(shape(&g), (8, 2, 1));
        let edge: Vec<_> = (0..9).map(|l| (l % 2 == 0).then_some(16)).collect();
        assert_eq!(shape(&CacheGroups::plan(&edge).unwrap()), (4, 3, 3));
    }

    #[test]
    fn bad_plans_are_refused() {
        assert!(CacheGroups::plan(&[]).is_err());
        assert!(CacheGroups::plan(&[None, Some(0)]).is_err());
    }

    #[test]
    fn windowed_groups_hold_a_window_a_block_and_a_chunk() {
        assert_eq!(group_held_tokens(None, 16, 32_768, 2048), 32_768);
        assert_eq!(
            group_held_tokens(Some(512), 16, 32_768, 2048),
            512 + 16 + 2048
        );
        assert_eq!(group_held_tokens(Some(512), 16, 100, 2048), 100);
    }
}
