//! Property tests of the one cache description's arithmetic: for any mix of full and latent
//! layers in any element type (fp8 included), the bytes per token are the layers' elements times
//! their element's bits plus a latent layer's positions and an int8 vector's (an int4 group's)
//! scale, the budget buys exactly
//! `budget / bytes_per_block` blocks, and storing the same layout in fp8 instead of bf16 buys
//! the blocks its byte ratio says (twice as many for full K/V, positions excepted for latents).

use proptest::prelude::*;
use starling_kv::{CacheDtype, CacheLayout, CacheSizing, LayerLayout, POSITION_BYTES, SCALE_BYTES};

fn dtype() -> impl Strategy<Value = CacheDtype> {
    prop_oneof![
        Just(CacheDtype::F32),
        Just(CacheDtype::F16),
        Just(CacheDtype::BF16),
        Just(CacheDtype::Fp8),
        Just(CacheDtype::Int8),
        Just(CacheDtype::Int4),
    ]
}

fn layer() -> impl Strategy<Value = LayerLayout> {
    let full = (
        1usize..=8,
        prop_oneof![Just(64usize), Just(128), Just(256)],
        dtype(),
    )
        .prop_map(|(num_kv_heads, head_dim, dtype)| LayerLayout::Full {
            num_kv_heads,
            head_dim,
            dtype,
        });
    let latent = (
        prop::collection::vec(1usize..=128, 1..=8),
        1usize..=1024,
        dtype(),
    )
        .prop_map(|(keys, value, dtype)| LayerLayout::low_rank_padded(&keys, value, dtype));
    prop_oneof![full, latent]
}

/// `layout` with every layer's element type replaced by `dtype`.
fn in_dtype(layout: &CacheLayout, dtype: CacheDtype) -> CacheLayout {
    CacheLayout {
        layers: layout.layers.iter().map(|l| l.with_dtype(dtype)).collect(),
    }
}

proptest! {
    #[test]
    fn bytes_and_blocks_follow_the_layers(
        layers in prop::collection::vec(layer(), 1..=40),
        block in prop_oneof![Just(1usize), Just(16), Just(32)],
        budget in 1u64..(16u64 << 30),
    ) {
        let layout = CacheLayout { layers };
        let expected: u64 = layout
            .layers
            .iter()
            .map(|l| {
                // Every vector's width, independently of LayerLayout::vector_widths.
                let widths: Vec<usize> = match l {
                    LayerLayout::Full { num_kv_heads, head_dim, .. } => {
                        vec![*head_dim; 2 * num_kv_heads]
                    }
                    LayerLayout::LowRank { key_rank_per_head, value_rank, .. } => {
                        key_rank_per_head.iter().copied().chain([*value_rank]).collect()
                    }
                };
                let scales: u64 = match l.dtype() {
                    CacheDtype::Int8 => widths.len() as u64,
                    CacheDtype::Int4 => widths.iter().map(|w| w.div_ceil(32) as u64).sum(),
                    _ => 0,
                };
                let bits: u64 = match l.dtype() {
                    CacheDtype::F32 => 32,
                    CacheDtype::F16 | CacheDtype::BF16 => 16,
                    CacheDtype::Fp8 | CacheDtype::Int8 => 8,
                    CacheDtype::Int4 => 4,
                };
                (l.elements_per_token() * bits).div_ceil(8)
                    + if l.is_low_rank() { POSITION_BYTES } else { 0 }
                    + scales * SCALE_BYTES
            })
            .sum();
        prop_assert_eq!(layout.bytes_per_token(), expected);
        prop_assert_eq!(layout.bytes_per_block(block), expected * block as u64);
        let sizing = CacheSizing::from_budget(budget, &layout, block).unwrap();
        prop_assert_eq!(sizing.num_blocks as u64, budget / (expected * block as u64));
        // Whatever is left over is less than one block.
        prop_assert!(budget - sizing.num_blocks as u64 * sizing.bytes_per_block < sizing.bytes_per_block);
    }

    #[test]
    fn fp8_buys_the_byte_ratio_in_blocks(
        layers in prop::collection::vec(layer(), 1..=40),
        budget in (1u64 << 20)..(16u64 << 30),
    ) {
        let layout = CacheLayout { layers };
        let bf16 = in_dtype(&layout, CacheDtype::BF16);
        let fp8 = in_dtype(&layout, CacheDtype::Fp8);
        let positions: u64 = layout.layers.iter().filter(|l| l.is_low_rank()).count() as u64
            * POSITION_BYTES;
        // Elements halve; positions stay 4 bytes each.
        prop_assert_eq!(
            2 * (fp8.bytes_per_token() - positions),
            bf16.bytes_per_token() - positions
        );
        let blocks = |l: &CacheLayout| CacheSizing::from_budget(budget, l, 16).unwrap().num_blocks;
        prop_assert_eq!(blocks(&fp8) as u64, budget / (fp8.bytes_per_token() * 16));
        prop_assert!(blocks(&fp8) >= blocks(&bf16));
        // int8 stores the fp8 layout's bytes plus one half-precision scale per vector.
        let int8 = in_dtype(&layout, CacheDtype::Int8);
        let vectors: u64 = layout.layers.iter().map(LayerLayout::vectors_per_token).sum();
        prop_assert_eq!(int8.bytes_per_token(), fp8.bytes_per_token() + vectors * SCALE_BYTES);
        prop_assert!(blocks(&int8) <= blocks(&fp8) && blocks(&int8) >= blocks(&bf16));
        // int4 halves fp8's elements (stored ranks are multiples of 8) and adds a scale per
        // started group of 32: never more bytes than int8.
        let int4 = in_dtype(&layout, CacheDtype::Int4);
        let groups: u64 = layout
            .layers
            .iter()
            .map(|l| l.with_dtype(CacheDtype::Int4).scales_per_token())
            .sum();
        prop_assert_eq!(
            2 * (int4.bytes_per_token() - positions - groups * SCALE_BYTES),
            fp8.bytes_per_token() - positions
        );
        prop_assert!(blocks(&int4) >= blocks(&int8));
        if positions == 0 {
            // Full K/V only: exactly twice the tokens, up to one block's rounding.
            prop_assert!(blocks(&fp8) / 2 <= blocks(&bf16) && blocks(&bf16) <= blocks(&fp8).div_ceil(2));
        }
    }
}
