//! The kernel sources' geometry against the host's constants.

use super::*;
use crate::geometry::{
    decode_mma_shared_bytes, latent_rel_tile_keys, latent_values_static_bytes,
    prefill_shared_bytes, prefill_stages, DECODE_MMA_STAGES, DECODE_MMA_THREADS,
    DECODE_MMA_TILE_KEYS, LATENT_REL_STAGES, LATENT_REL_TABLE_ROWS, LATENT_VALUE_STAGES,
    LATENT_VALUE_TOKENS, PREFILL_THREADS, PREFILL_TILE_KEYS, PREFILL_TILE_ROWS,
};

/// The value of `#define NAME value` in a kernel source.
fn define(source: &str, name: &str) -> usize {
    crate::kernel_source::numeric_define(source, name)
        .unwrap_or_else(|| panic!("no numeric #define {name}"))
}

#[test]
fn split_combine_geometry_matches_the_host() {
    use crate::geometry::COMBINE_THREADS;
    for src in [ATTENTION_SRC.text, LATENT_SRC.text] {
        assert_eq!(define(src, "COMBINE_THREADS"), COMBINE_THREADS as usize);
    }
    // Whole warps, and a power of two: the lanes × groups split of a block relies on it.
    assert!(COMBINE_THREADS.is_power_of_two() && COMBINE_THREADS >= 32);
}

#[test]
fn decode_kernel_geometry_matches_the_host() {
    let src = DECODE_ATTENTION_SRC.text;
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
fn warp_specialised_prefill_kernel_geometry_matches_the_host() {
    use crate::geometry::{
        prefill_wgmma_ws_shared_bytes, PREFILL_WGMMA_HEAD_DIM, PREFILL_WGMMA_THREADS,
        PREFILL_WGMMA_WS_ALIGN_PAD, PREFILL_WGMMA_WS_RING_BYTES, PREFILL_WGMMA_WS_THREADS,
    };
    let src = PREFILL_WGMMA_SRC.text;
    // Same tiles as the mma.sync kernel: the host's tile lists and split plan serve both.
    assert_eq!(define(src, "WG_BM"), PREFILL_TILE_ROWS);
    assert_eq!(define(src, "WG_BN"), PREFILL_TILE_KEYS);
    assert!(names::PREFILL_WGMMA_WS.contains(&format!("_d{PREFILL_WGMMA_HEAD_DIM}_")));
    // Two consumer warpgroups; a producer warpgroup beside them.
    assert_eq!(define(src, "WS_CONSUMERS"), PREFILL_WGMMA_THREADS as usize);
    assert_eq!(define(src, "WS_THREADS"), PREFILL_WGMMA_WS_THREADS as usize);
    assert_eq!(
        define(src, "WS_CONSUMERS") + define(src, "WS_PRODUCERS"),
        PREFILL_WGMMA_WS_THREADS as usize
    );
    assert_eq!(define(src, "WS_RING_BYTES"), PREFILL_WGMMA_WS_RING_BYTES);
    assert_eq!(define(src, "WS_ALIGN_PAD"), PREFILL_WGMMA_WS_ALIGN_PAD);
    // Its tiles and stages fit the ring the host allocates (the kernel also asserts it).
    assert!(
        define(src, "WS_STAGES") * 2 * define(src, "WS_BN") * PREFILL_WGMMA_HEAD_DIM * 2
            <= PREFILL_WGMMA_WS_RING_BYTES
    );
    // The register split setmaxnreg asks for fits an SM's 64K registers at one block per SM.
    let regs = define(src, "WS_PRODUCERS") * define(src, "WS_PRODUCER_REGS")
        + define(src, "WS_CONSUMERS") * define(src, "WS_CONSUMER_REGS");
    assert!(regs <= 65536, "{regs}");
    assert!(src.contains(&format!("{}(", names::PREFILL_WGMMA_WS)));
    assert!(src.contains(&format!(
        "prefill_wgmma_ws_impl<{PREFILL_WGMMA_HEAD_DIM}, WS_BN, WS_STAGES>("
    )));
    // Q (32 KiB), the ring (192 KiB) and 1 KiB to align them: one block per SM, within the
    // 227 KiB of a block (with the kernel's 256 bytes of static barriers).
    assert_eq!(prefill_wgmma_ws_shared_bytes(), 225 * 1024);
    assert!(prefill_wgmma_ws_shared_bytes() + 256 <= 227 * 1024);
}

#[test]
fn hopper_prefill_choices_parse() {
    use crate::kernel_source::HopperPrefill;
    assert_eq!(HopperPrefill::parse("mma"), Some(HopperPrefill::Mma));
    assert_eq!(
        HopperPrefill::parse(" wgmma\n"),
        Some(HopperPrefill::WgmmaWarpSpecialised)
    );
    assert_eq!(
        HopperPrefill::parse("wgmma-ws"),
        Some(HopperPrefill::WgmmaWarpSpecialised)
    );
    assert_eq!(HopperPrefill::parse("wgmma_ws"), None);
    assert_eq!(HopperPrefill::parse(""), None);
}

#[test]
fn only_hopper_devices_load_the_wgmma_modules() {
    for module in kernel_modules() {
        let hopper = matches!(module.name, "prefill_wgmma" | "latent_wgmma");
        assert_eq!(
            module.target == ModuleTarget::Hopper,
            hopper,
            "{}",
            module.name
        );
    }
    assert_eq!(ModuleTarget::Hopper.arch("sm_90"), Some("sm_90a"));
    assert_eq!(ModuleTarget::Hopper.arch("sm_89"), None);
    assert_eq!(ModuleTarget::Hopper.arch("sm_100"), None);
    assert_eq!(ModuleTarget::Device.arch("sm_89"), Some("sm_89"));
}

#[test]
fn prefill_kernel_geometry_matches_the_host() {
    let src = PREFILL_ATTENTION_SRC.text;
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
    let src = LATENT_SRC.text;
    assert_eq!(define(src, "LS_THREADS"), LATENT_THREADS as usize);
    assert_eq!(define(src, "LV_THREADS"), LATENT_THREADS as usize);
    assert_eq!(define(src, "LS_BN"), crate::geometry::LATENT_SCORE_KEYS);
    assert_eq!(
        define(src, "LS_STAGES"),
        crate::geometry::LATENT_SCORE_STAGES
    );
    // Head width 128 at full rank: B_h and two tiles of 64 keys (136-element rows) plus the
    // bias and the maxima fit one block's opt-in shared memory with room for a second.
    let bytes = latent_scores_shared_bytes(128, 136, CacheElem::Bf16, 2) as usize;
    assert_eq!(bytes, (128 * 136 + 2 * 64 * 136) * 2 + 512 + 128);
    assert!(2 * (bytes + 1024) <= 228 * 1024);
    // fp8: B_h, two byte tiles and the one bf16 tile they are converted into: at two stages
    // exactly the bf16 kernel's bytes, at every head width and rank stride.
    let fp8 = latent_scores_shared_bytes(128, 136, CacheElem::Fp8, 2) as usize;
    assert_eq!(fp8, 128 * 136 * 2 + 2 * 64 * 136 + 64 * 136 * 2 + 512 + 128);
    for (d, rs) in [(64, 24), (64, 72), (128, 40), (128, 136)] {
        assert_eq!(
            latent_scores_shared_bytes(d, rs, CacheElem::Fp8, 2),
            latent_scores_shared_bytes(d, rs, CacheElem::Bf16, 2),
            "d{d} rs{rs}"
        );
    }
    // Every rotary-absorbed variant leaves room for two resident blocks per SM (the driver
    // reserves 1 KiB per block of the 228 KiB).
    for (d, ks, mt) in LATENT_ROT_VARIANTS {
        let bytes = latent_scores_rot_shared_bytes(d, ks, mt) as usize;
        assert!(
            2 * (bytes + 1024) <= 228 * 1024,
            "rot d{d} k{ks} m{mt}: {bytes}"
        );
    }
    // The register-factor kernel: its ring is the source's, and at the most query heads it
    // serves every variant leaves room for two resident blocks per SM.
    let rel = kernel_modules()
        .into_iter()
        .find(|m| m.name == "latent_rel")
        .expect("the latent_rel module");
    assert_eq!(define(rel.source.text, "LQ_STAGES"), LATENT_REL_STAGES);
    assert_eq!(
        define(rel.source.text, "LQ_THREADS"),
        LATENT_THREADS as usize
    );
    for (d, ks) in LATENT_REL_VARIANTS {
        let bytes = latent_scores_rel_shared_bytes(d, ks, LATENT_REL_MAX_GROUP) as usize;
        assert!(2 * (bytes + 1024) <= 228 * 1024, "rel d{d} k{ks}: {bytes}");
        // Fewer heads per KV head, fewer bytes (the partial scores are sized by the group).
        assert!(latent_scores_rel_shared_bytes(d, ks, 1) < bytes as u32);
    }
    // Head width 128 at rank 64, one query head per KV head: B_h, four 32-key tiles, two query
    // buffers of 16 rows, the positions, two [4][1][32] partial-score buffers, the maxima.
    assert_eq!(
        latent_scores_rel_shared_bytes(128, 4, 1),
        ((128 * 72 + 4 * 32 * 72 + 2 * 16 * 136) * 2 + 4 * 32 * 4 + 2 * 4 * 32 * 4 + 4 * 4 * 4)
            as u32
    );
    assert_eq!(latent_rel_tile_keys(128), 32);
    assert_eq!(latent_rel_tile_keys(64), 64);
    assert!(LATENT_REL_TABLE_ROWS >= latent_rel_tile_keys(64));
    // The value kernel's geometry is the source's, and its static shared memory stays within
    // 48 KiB at every m-tile count and element.
    assert_eq!(define(src, "LV_BN"), LATENT_VALUE_TOKENS);
    assert_eq!(define(src, "LV_STAGES"), LATENT_VALUE_STAGES);
    for mt in LATENT_M_TILES {
        let (ch, bn) = (512 / mt, define(src, "LV_BN"));
        let stages = if mt == 1 { 2 } else { define(src, "LV_STAGES") };
        let bf16 = 16 * mt * (bn + 8) * 2 + stages * bn * (ch + 8) * 2 + 2 * 16 * mt * 4;
        assert_eq!(latent_values_static_bytes(mt, CacheElem::Bf16), bf16);
        // fp8: the ring in bytes, plus one converted bf16 tile.
        let fp8 = bf16 - stages * bn * (ch + 8) + bn * (ch + 8) * 2;
        assert_eq!(latent_values_static_bytes(mt, CacheElem::Fp8), fp8);
        for elem in CacheElem::ALL {
            let bytes = latent_values_static_bytes(mt, elem);
            assert!(bytes <= 48 * 1024, "mt {mt} {elem:?}: {bytes}");
        }
    }
    // At one m-tile (two stages) fp8 takes the bf16 bytes; at more (four stages), fewer.
    assert_eq!(
        latent_values_static_bytes(1, CacheElem::Fp8),
        latent_values_static_bytes(1, CacheElem::Bf16)
    );
    assert!(
        latent_values_static_bytes(4, CacheElem::Fp8)
            < latent_values_static_bytes(4, CacheElem::Bf16)
    );
}

#[test]
fn latent_kernels_have_both_element_instantiations() {
    let latent = kernel_modules()
        .into_iter()
        .find(|m| m.name == "latent")
        .expect("the latent module");
    for elem in CacheElem::ALL {
        let suffix = elem.suffix();
        let mut want = vec![
            format!("rope_q_write_latents_{suffix}"),
            format!("latent_gather_rows_{suffix}"),
        ];
        want.extend(LATENT_HEAD_DIMS.map(|d| format!("latent_scores_d{d}_{suffix}")));
        want.extend(LATENT_M_TILES.map(|mt| format!("latent_values_mt{mt}_{suffix}")));
        // (tests/nvrtc_compile.rs checks that every listed name is an entry of the PTX.)
        for name in want {
            assert!(latent.functions.contains(&name), "{name} not listed");
        }
    }
    // The rotary-absorbed kernel is bf16 only: an fp8 cache reconstructs.
    let rot = kernel_modules()
        .into_iter()
        .find(|m| m.name == "latent_rot")
        .expect("the latent_rot module");
    assert!(rot.functions.iter().all(|f| f.ends_with("_bf16")));
    // So is the register-factor kernel.
    let rel = kernel_modules()
        .into_iter()
        .find(|m| m.name == "latent_rel")
        .expect("the latent_rel module");
    assert!(rel.functions.iter().all(|f| f.ends_with("_bf16")));
    assert_eq!(rel.functions.len(), LATENT_REL_VARIANTS.len());
}

#[test]
fn key_score_kernel_geometry_matches_the_host() {
    use crate::geometry::{
        KEY_SCORE_MAX_HEAD_DIM as MAX_HEAD_DIM, KEY_SCORE_THREADS as THREADS, WINDOW_TILE_TOKENS,
        WINDOW_WARPS,
    };
    let src = KEY_SCORES_SRC.text;
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
            .text
            .contains("__device__ __forceinline__ void mma_bf16(");
        let tiled = matches!(
            module.name,
            "prefill_attention"
                | "prefill_wgmma"
                | "decode_attention"
                | "latent"
                | "latent_rot"
                | "latent_rel"
                | "latent_wgmma"
        );
        assert_eq!(has, tiled, "{}", module.name);
        // The Hopper modules share one copy of the wgmma helpers.
        let wgmma = module
            .source
            .text
            .contains("__device__ __forceinline__ void wgmma_fence(");
        assert_eq!(
            wgmma,
            module.target == ModuleTarget::Hopper,
            "{}",
            module.name
        );
    }
}

#[test]
fn hopper_latent_score_kernel_geometry_matches_the_host() {
    use crate::geometry::{
        latent_scores_wg_shared_bytes, LATENT_SCORE_KEYS, LATENT_WG_ALIGN_PAD, LATENT_WG_MAX_RANK,
        LATENT_WG_STAGES,
    };
    let src = LATENT_WGMMA_SRC.text;
    assert_eq!(define(src, "LW_THREADS"), LATENT_THREADS as usize);
    // One wgmma's 64 rows per tile: the mma.sync kernel's tile, so the split plan serves both.
    assert_eq!(define(src, "LW_BN"), LATENT_SCORE_KEYS);
    assert_eq!(define(src, "LW_STAGES"), LATENT_WG_STAGES);
    assert_eq!(define(src, "LW_ALIGN_PAD"), LATENT_WG_ALIGN_PAD);
    assert!(src.contains("INSTANTIATE_WG_SCORES(bf16, false)"));
    assert!(src.contains("INSTANTIATE_WG_SCORES(fp8, true)"));
    for elem in CacheElem::ALL {
        assert!(names::latent_scores_wg(elem).ends_with(elem.suffix()));
        // B_h (128 rows) and two stages of 64 keys, in 64-rank halves of 128-byte rows, behind
        // the alignment pad: one half up to rank 64, two up to 128. An fp8 kernel's bf16 tile
        // and two byte tiles take the bytes of the bf16 kernel's two tiles.
        assert_eq!(
            latent_scores_wg_shared_bytes(64, elem, LATENT_WG_STAGES),
            1024 + 256 * 128
        );
        assert_eq!(
            latent_scores_wg_shared_bytes(72, elem, LATENT_WG_STAGES),
            1024 + 2 * 256 * 128
        );
        assert_eq!(
            latent_scores_wg_shared_bytes(LATENT_WG_MAX_RANK, elem, LATENT_WG_STAGES),
            latent_scores_wg_shared_bytes(72, elem, LATENT_WG_STAGES)
        );
        // With its static cos/sin rows, positions, bias and maxima, two blocks fit an SM at the
        // widest rank (the driver reserves 1 KiB per block of the 228 KiB).
        let lo_rows = define(src, "LW_ROPE_LO");
        let statics =
            lo_rows * 64 * 8 + LATENT_WG_STAGES * LATENT_SCORE_KEYS * 4 + 128 * 4 + 32 * 4;
        let widest = latent_scores_wg_shared_bytes(LATENT_WG_MAX_RANK, elem, LATENT_WG_STAGES)
            as usize
            + statics;
        assert!(2 * (widest + 1024) <= 228 * 1024, "{widest}");
    }
}

#[test]
fn kernel_files_rebuild_the_built_in_sources() {
    // What STARLING_KERNEL_DIR compiles from the checkout is what the binary has built in: the
    // file lists name every part, in order.
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("kernels");
    for module in kernel_modules() {
        // Bare names: a copy of the directory elsewhere must serve (a `../kernels/` prefix would
        // read the checkout's file instead, or nothing).
        for file in module.source.files {
            assert!(!file.contains('/'), "{}: {file}", module.name);
        }
        let text = module.source.read_from(&dir, module.name).unwrap();
        assert_eq!(text, module.source.text, "{}", module.name);
    }
    let err = PREFILL_WGMMA_SRC
        .read_from(std::path::Path::new("no-such-kernel-dir"), "prefill_wgmma")
        .unwrap_err()
        .to_string();
    assert!(err.contains("pdl.cuh"), "{err}");
}

#[test]
fn ring_stages_come_from_the_compiled_source() {
    use crate::geometry::{latent_scores_wg_shared_bytes, LATENT_SCORE_KEYS};
    use crate::kernel_source::{numeric_define, required_define};
    // A kernel directory's variant with another ring: the host reads the stages from the text
    // it compiles and sizes the shared memory for them, one more tile a stage.
    let built_in = LATENT_SRC.text;
    let variant = built_in.replace("#define LS_STAGES 2 ", "#define LS_STAGES 3 ");
    assert_ne!(variant, built_in, "the built-in ring is LS_STAGES 2");
    assert_eq!(numeric_define(&variant, "LS_STAGES"), Some(3));
    assert_eq!(
        required_define(built_in, "latent", "LS_STAGES").ok(),
        Some(2)
    );
    assert!(required_define("#define LS_STAGES two", "latent", "LS_STAGES").is_err());
    assert_eq!(numeric_define("//#define LS_STAGES 4\n", "LS_STAGES"), None);
    for elem in CacheElem::ALL {
        let rs = 72;
        assert_eq!(
            latent_scores_shared_bytes(128, rs, elem, 3)
                - latent_scores_shared_bytes(128, rs, elem, 2),
            (LATENT_SCORE_KEYS * rs * elem.bytes()) as u32
        );
        let tile = match elem {
            CacheElem::Bf16 => LATENT_SCORE_KEYS * 128,
            CacheElem::Fp8 => LATENT_SCORE_KEYS * 64,
        };
        assert_eq!(
            latent_scores_wg_shared_bytes(64, elem, 3) - latent_scores_wg_shared_bytes(64, elem, 2),
            tile as u32
        );
    }
}
