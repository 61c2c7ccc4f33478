//! The kernel sources' geometry against the host's constants.

use super::*;
use crate::geometry::{
    decode_mma_shared_bytes, prefill_shared_bytes, prefill_stages, DECODE_MMA_STAGES,
    DECODE_MMA_THREADS, DECODE_MMA_TILE_KEYS, PREFILL_THREADS, PREFILL_TILE_KEYS,
    PREFILL_TILE_ROWS,
};

/// The value of `#define NAME value` in a kernel source.
fn define(source: &str, name: &str) -> usize {
    source
        .lines()
        .find_map(|line| {
            let mut words = line.split_whitespace();
            (words.next() == Some("#define") && words.next() == Some(name))
                .then(|| words.next())
                .flatten()
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(|| panic!("no numeric #define {name}"))
}

#[test]
fn decode_kernel_geometry_matches_the_host() {
    let src = DECODE_ATTENTION_SRC;
    assert_eq!(define(src, "DM_THREADS"), DECODE_MMA_THREADS as usize);
    assert_eq!(define(src, "DM_BN"), DECODE_MMA_TILE_KEYS);
    assert_eq!(define(src, "DM_STAGES"), DECODE_MMA_STAGES);
    // The ring at head_dim 128 needs the opt-in shared memory of sm_80+ (96 KiB per block).
    assert_eq!(decode_mma_shared_bytes(128, CacheElem::Bf16), 96 * 1024);
    assert_eq!(decode_mma_shared_bytes(64, CacheElem::Bf16), 48 * 1024);
    // fp8: the ring of byte tiles and one converted bf16 (K, V) pair.
    assert_eq!(
        decode_mma_shared_bytes(128, CacheElem::Fp8),
        (48 + 32) * 1024
    );
    assert_eq!(
        decode_mma_shared_bytes(64, CacheElem::Fp8),
        (24 + 16) * 1024
    );
}

#[test]
fn prefill_kernel_geometry_matches_the_host() {
    let src = PREFILL_ATTENTION_SRC;
    assert_eq!(define(src, "BM"), PREFILL_TILE_ROWS);
    assert_eq!(define(src, "BN"), PREFILL_TILE_KEYS);
    assert_eq!(define(src, "THREADS"), PREFILL_THREADS as usize);
    assert_eq!(
        define(src, "WARPS") * 16 * define(src, "WARP_MT"),
        PREFILL_TILE_ROWS
    );
    assert_eq!(define(src, "WARPS") * 32, PREFILL_THREADS as usize);
    assert_eq!(
        define(src, "MIN_BLOCKS"),
        crate::geometry::PREFILL_RESIDENT_PER_SM
    );
    for d in PREFILL_HEAD_DIMS {
        assert_eq!(
            define(src, &format!("STAGES_D{d}")),
            prefill_stages(d),
            "d{d}"
        );
    }
    // Q (32 KiB) and two stages of K and V (64 KiB) at head_dim 128; Q (16 KiB) and three
    // stages (48 KiB) at 64. Two blocks of either fit the 228 KiB of an sm_90 SM, each
    // within the 227 KiB one block may opt in to.
    assert_eq!(prefill_shared_bytes(128, CacheElem::Bf16), 96 * 1024);
    assert_eq!(prefill_shared_bytes(64, CacheElem::Bf16), 64 * 1024);
    // fp8: Q, the ring of byte tiles and one converted bf16 (K, V) pair.
    assert_eq!(
        prefill_shared_bytes(128, CacheElem::Fp8),
        (32 + 32 + 32) * 1024
    );
    assert_eq!(
        prefill_shared_bytes(64, CacheElem::Fp8),
        (16 + 24 + 16) * 1024
    );
    for d in PREFILL_HEAD_DIMS {
        for e in CacheElem::ALL {
            assert!(
                2 * (prefill_shared_bytes(d, e) + 1024) <= 228 * 1024,
                "d{d} {e:?}"
            );
        }
    }
}

#[test]
fn latent_kernel_geometry_matches_the_host() {
    let src = LATENT_SRC;
    assert_eq!(define(src, "LS_THREADS"), LATENT_THREADS as usize);
    assert_eq!(define(src, "LV_THREADS"), LATENT_THREADS as usize);
    assert_eq!(define(src, "LS_BN"), crate::geometry::LATENT_SCORE_KEYS);
    assert_eq!(
        define(src, "LS_STAGES"),
        crate::geometry::LATENT_SCORE_STAGES
    );
    // Head width 128 at full rank: B_h and two tiles of 64 keys (136-element rows) plus the
    // bias and the maxima fit one block's opt-in shared memory with room for a second.
    let bytes = latent_scores_shared_bytes(128, 136) as usize;
    assert_eq!(bytes, (128 * 136 + 2 * 64 * 136) * 2 + 512 + 128);
    assert!(2 * (bytes + 1024) <= 228 * 1024);
    // Every rotary-absorbed variant leaves room for two resident blocks per SM (the driver
    // reserves 1 KiB per block of the 228 KiB).
    for (d, ks, mt) in LATENT_ROT_VARIANTS {
        let bytes = latent_scores_rot_shared_bytes(d, ks, mt) as usize;
        assert!(
            2 * (bytes + 1024) <= 228 * 1024,
            "rot d{d} k{ks} m{mt}: {bytes}"
        );
    }
    // The value kernel's static shared memory stays within 48 KiB at every m-tile count.
    for mt in LATENT_M_TILES {
        let (ch, bn) = (512 / mt, define(src, "LV_BN"));
        let stages = if mt == 1 { 2 } else { define(src, "LV_STAGES") };
        let static_bytes = 16 * mt * (bn + 8) * 2 + stages * bn * (ch + 8) * 2 + 2 * 16 * mt * 4;
        assert!(static_bytes <= 48 * 1024, "mt {mt}: {static_bytes}");
    }
}

#[test]
fn key_score_kernel_geometry_matches_the_host() {
    use crate::geometry::{
        KEY_SCORE_MAX_HEAD_DIM as MAX_HEAD_DIM, KEY_SCORE_THREADS as THREADS, WINDOW_TILE_TOKENS,
        WINDOW_WARPS,
    };
    let src = KEY_SCORES_SRC;
    assert_eq!(define(src, "WARPS") * 32, THREADS as usize);
    assert_eq!(define(src, "WARPS"), WINDOW_WARPS);
    assert_eq!(define(src, "MAX_HEAD_DIM"), MAX_HEAD_DIM);
    assert_eq!(define(src, "WS_TILE"), WINDOW_TILE_TOKENS);
    // One block's key tile (rows padded by a word) and per-warp sums fit the 48 KiB of
    // static shared memory.
    const { assert!(WINDOW_TILE_TOKENS * (MAX_HEAD_DIM + 1) * 4 + WINDOW_WARPS * 32 * 4 <= 48 * 1024) };
}

#[test]
fn tiled_kernels_carry_the_shared_helpers() {
    for module in kernel_modules() {
        let has = module
            .source
            .contains("__device__ __forceinline__ void mma_bf16(");
        let tiled = matches!(
            module.name,
            "prefill_attention" | "decode_attention" | "latent" | "latent_rot"
        );
        assert_eq!(has, tiled, "{}", module.name);
    }
}
