//! Launch geometry that the kernel table (`crate::kernels`, which checks it against the `.cu`
//! defines and sizes dynamic shared memory at load) and the launches in `crate::backend` both
//! need. A leaf module, so that neither has to import the other.

/// The element a layer's cache planes hold (full K/V or STAR-KV latents), which picks the
/// instantiation of every kernel that reads or writes them (`_bf16` or `_fp8`;
/// `kernels/fp8.cuh`). Kernels that only move rows (copies, gathers, compaction) move an fp8 row
/// as half as many bf16 words.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum CacheElem {
    /// bf16 (`--kv-cache-dtype auto`).
    Bf16,
    /// fp8 e4m3, one byte per element (`--kv-cache-dtype fp8`).
    Fp8,
}

impl CacheElem {
    /// Both elements, in the order of `kernels::ByElem`'s functions.
    pub(crate) const ALL: [CacheElem; 2] = [CacheElem::Bf16, CacheElem::Fp8];

    /// The suffix of this element's instantiations.
    pub(crate) const fn suffix(self) -> &'static str {
        match self {
            CacheElem::Bf16 => "bf16",
            CacheElem::Fp8 => "fp8",
        }
    }

    /// Bytes per element.
    pub(crate) const fn bytes(self) -> usize {
        match self {
            CacheElem::Bf16 => 2,
            CacheElem::Fp8 => 1,
        }
    }

    /// bf16 words a plane row of `elems` elements takes (`elems` even for fp8).
    pub(crate) const fn words(self, elems: usize) -> usize {
        elems * self.bytes() / 2
    }
}

/// Threads a block of the split-merging kernels (`attention_combine_bf16`,
/// `latent_combine_bf16`; `COMBINE_THREADS` in `kernels/split_combine.cuh`, whose shared arrays
/// are sized by it).
pub(crate) const COMBINE_THREADS: u32 = 256;

// Tiled prefill attention (`prefill_attention.cu`).

/// Query rows per block of the tiled kernel (`BM` in `prefill_attention.cu`): a tile holds
/// `PREFILL_TILE_ROWS / group` tokens × `group` query heads.
pub(crate) const PREFILL_TILE_ROWS: usize = 128;
/// Keys per shared-memory tile of the tiled kernel (`BN`): prefill splits are multiples of it,
/// so no tile straddles two splits.
pub(crate) const PREFILL_TILE_KEYS: usize = 64;
/// Threads per block of the tiled kernel (`THREADS`: 4 warps × 32 rows).
pub(crate) const PREFILL_THREADS: u32 = 128;
/// Tiled prefill blocks resident per SM (`MIN_BLOCKS` in `prefill_attention.cu`: its register
/// bound and 96 KiB of shared memory at head_dim 128 allow two).
pub(crate) const PREFILL_RESIDENT_PER_SM: usize = 2;

/// (K, V) tile pairs in the tiled prefill kernel's shared-memory ring (`STAGES_D64`,
/// `STAGES_D128`): all but one load while one is computed. Head width 64 affords a third stage
/// within the shared memory of two resident blocks.
pub(crate) const fn prefill_stages(head_dim: usize) -> usize {
    if head_dim <= 64 {
        3
    } else {
        2
    }
}

/// Dynamic shared memory of one tiled prefill block: the Q tile (bf16) and the ring of K and V
/// tiles in the cache's element, behind which an fp8 cache's kernel keeps one converted bf16
/// (K, V) pair.
pub(crate) const fn prefill_shared_bytes(head_dim: usize, elem: CacheElem) -> usize {
    PREFILL_TILE_ROWS * head_dim * 2
        + prefill_stages(head_dim) * 2 * PREFILL_TILE_KEYS * head_dim * elem.bytes()
        + converted_pair_bytes(PREFILL_TILE_KEYS, head_dim, elem)
}

/// Consumer threads per block of the Hopper tiled prefill kernel (`WG_THREADS` in
/// `prefill_wgmma.cu`: two warpgroups of 64 rows; same tile rows and keys as the mma.sync kernel).
pub(crate) const PREFILL_WGMMA_THREADS: u32 = 256;
/// Head width of the Hopper prefill kernel (its wgmma shapes are m64n64 for S, m64n128 for O).
pub(crate) const PREFILL_WGMMA_HEAD_DIM: usize = 128;

/// Threads per block of the warp-specialised Hopper prefill kernel (`WS_THREADS`: two consumer
/// warpgroups of 64 rows and a producer warpgroup).
pub(crate) const PREFILL_WGMMA_WS_THREADS: u32 = PREFILL_WGMMA_THREADS + 128;
/// Shared memory its K/V ring may fill (`WS_RING_BYTES`): the kernel chooses its tile keys and
/// stages within it (`WS_BN` × `WS_STAGES`), so that a kernel directory (`STARLING_KERNEL_DIR`)
/// can try other ones without a rebuild.
pub(crate) const PREFILL_WGMMA_WS_RING_BYTES: usize = 192 * 1024;

/// Spare bytes in front of its tiles (`WS_ALIGN_PAD`): the kernel starts them at the first
/// 1024-byte boundary, which its 128-byte swizzled layout needs.
pub(crate) const PREFILL_WGMMA_WS_ALIGN_PAD: usize = 1024;

/// Dynamic shared memory of one warp-specialised Hopper prefill block: the Q tile, its ring and
/// the alignment pad (one block per SM; with the kernel's static barriers, within the 227 KiB a
/// block may have).
pub(crate) const fn prefill_wgmma_ws_shared_bytes() -> usize {
    PREFILL_TILE_ROWS * PREFILL_WGMMA_HEAD_DIM * 2
        + PREFILL_WGMMA_WS_RING_BYTES
        + PREFILL_WGMMA_WS_ALIGN_PAD
}

/// The bf16 (K, V) tile pair an fp8 kernel converts each staged tile into (none for bf16).
const fn converted_pair_bytes(keys: usize, head_dim: usize, elem: CacheElem) -> usize {
    match elem {
        CacheElem::Bf16 => 0,
        CacheElem::Fp8 => 2 * keys * head_dim * 2,
    }
}

// Tensor-core decode attention (`decode_attention.cu`).

/// Threads per block of the tensor-core decode kernel (`DM_THREADS`).
pub(crate) const DECODE_MMA_THREADS: u32 = 128;
/// Keys per K/V tile of the tensor-core decode kernel (`DM_BN`).
pub(crate) const DECODE_MMA_TILE_KEYS: usize = 64;
/// K/V tiles in the decode kernel's shared-memory ring (`DM_STAGES`): all but one are in flight
/// while one is computed.
pub(crate) const DECODE_MMA_STAGES: usize = 3;

/// Dynamic shared memory of one tensor-core decode block: the ring of K and V tiles in the
/// cache's element (and an fp8 kernel's converted bf16 pair).
pub(crate) const fn decode_mma_shared_bytes(head_dim: usize, elem: CacheElem) -> usize {
    DECODE_MMA_STAGES * 2 * DECODE_MMA_TILE_KEYS * head_dim * elem.bytes()
        + converted_pair_bytes(DECODE_MMA_TILE_KEYS, head_dim, elem)
}

// Key scores (`key_scores.cu`).

/// Threads per CUDA block: `WARPS * 32` in key_scores.cu.
pub(crate) const KEY_SCORE_THREADS: u32 = 256;
/// Warps per block of the window-score kernels (`WARPS` in key_scores.cu).
pub(crate) const WINDOW_WARPS: usize = 8;
/// Tokens per block of the window-score kernels, one per lane (`WS_TILE` in key_scores.cu).
pub(crate) const WINDOW_TILE_TOKENS: usize = 32;
/// Widest head the kernels hold in registers and shared memory (`MAX_HEAD_DIM` in key_scores.cu).
pub(crate) const KEY_SCORE_MAX_HEAD_DIM: usize = 256;

// Latent score kernels (`latent.cu`, `latent_rot.cu`, `latent_rel.cu`).

/// Keys per key-latent tile of the latent score kernel (`LS_BN`).
pub(crate) const LATENT_SCORE_KEYS: usize = 64;
/// Key-latent tiles in its shared-memory ring (`LS_STAGES`) as built in; the host sizes the
/// ring from the define of the source it compiles (`Kernels::latent_score_stages`).
pub(crate) const LATENT_SCORE_STAGES: usize = 2;
/// Key-latent tiles in the rotary-absorbed kernel's shared-memory ring (`LR_STAGES`).
const ROT_STAGES: usize = 2;

/// Dynamic shared memory of `latent_scores_rot_d{D}_k{KS}_m{MT}`: `M`, the rings of key
/// latents, positions and table rows (64·MT keys, 4·MT m-tiles per tile), cs(p0), α0/β0 and the
/// warps' maxima.
pub(crate) const fn latent_scores_rot_shared_bytes(
    head_dim: usize,
    k_steps: usize,
    m_tiles: usize,
) -> u32 {
    let rs = 16 * k_steps + 8;
    let keys = 64 * m_tiles;
    let half = head_dim / 2;
    let latents = (head_dim * rs + ROT_STAGES * keys * rs) * 2;
    let table_rows = (ROT_STAGES * 4 * m_tiles * half + half) * 8;
    (latents + table_rows + ROT_STAGES * keys * 4 + head_dim * 4 + 4 * 4) as u32
}

/// Dynamic shared memory of `latent_scores_d{D}_{elem}` at latent row stride `rs` (elements):
/// `B_h` (bf16), the ring of key-latent tiles in the cache's element, for fp8 the one bf16 tile
/// each landed byte tile is converted into, then the bias and the warps' maxima. At two stages an
/// fp8 kernel takes the bf16 kernel's bytes (two byte tiles and one bf16 tile for two bf16 tiles).
pub(crate) const fn latent_scores_shared_bytes(
    head_dim: usize,
    rs: usize,
    elem: CacheElem,
    stages: usize,
) -> u32 {
    let converted = match elem {
        CacheElem::Bf16 => 0,
        CacheElem::Fp8 => LATENT_SCORE_KEYS * rs * 2,
    };
    (head_dim * rs * 2
        + stages * LATENT_SCORE_KEYS * rs * elem.bytes()
        + converted
        + head_dim * 4
        + 4 * 8 * 4) as u32
}

/// Key-latent tiles in the ring of the Hopper latent score kernel (`LW_STAGES` in
/// `latent_wgmma.cu`) as built in; the host sizes the ring from the define of the source it
/// compiles (`Kernels::latent_wg_stages`).
pub(crate) const LATENT_WG_STAGES: usize = 2;
/// Spare bytes in front of its tiles (`LW_ALIGN_PAD`): they start at the first 1024-byte
/// boundary, which the 128-byte swizzled layout of wgmma operands needs.
pub(crate) const LATENT_WG_ALIGN_PAD: usize = 1024;
/// Widest rank the Hopper latent score kernel serves: two 64-rank halves of its tiles.
pub(crate) const LATENT_WG_MAX_RANK: usize = 128;

/// Dynamic shared memory of `latent_scores_wg_d128_{elem}` for ranks up to `max_rank` and a
/// ring of `stages` tiles: the alignment pad, `B_h` (128 rows) and the ring of 64-key tiles,
/// each as one or two 64-rank halves of 128-byte rows; for fp8 the one bf16 tile the byte tiles
/// are converted into and a ring of byte tiles (64 bytes a row per half). Its cos/sin rows,
/// positions, bias and maxima are static. At two stages an fp8 kernel takes the bf16 kernel's
/// bytes.
pub(crate) const fn latent_scores_wg_shared_bytes(
    max_rank: usize,
    elem: CacheElem,
    stages: usize,
) -> u32 {
    let halves = max_rank.div_ceil(64);
    let tiles = match elem {
        CacheElem::Bf16 => stages * LATENT_SCORE_KEYS * 128,
        CacheElem::Fp8 => LATENT_SCORE_KEYS * 128 + stages * LATENT_SCORE_KEYS * 64,
    };
    (LATENT_WG_ALIGN_PAD + halves * (128 * 128 + tiles)) as u32
}

/// Keys per tile of the register-factor latent score kernel (`latent_rel.cu`: 32 per warp
/// across the keys; head width 128 puts all four warps across the dims, 64 two).
pub(crate) const fn latent_rel_tile_keys(head_dim: usize) -> usize {
    32 * (4 / (head_dim / 32))
}
/// Key-latent tiles in its ring (`LQ_STAGES`).
pub(crate) const LATENT_REL_STAGES: usize = 4;
/// Table rows the register-factor kernel reads at offsets within a tile (cos/sin of 0..64
/// positions), whatever the context length.
pub(crate) const LATENT_REL_TABLE_ROWS: usize = 64;

/// Dynamic shared memory of `latent_scores_rel_d{D}_k{KS}_bf16` for `group` query heads per KV
/// head: `B_h`, the key-latent ring, two buffers of rotated queries (16 rows), the positions
/// ring, two buffers of the warps' partial scores and the maxima.
pub(crate) const fn latent_scores_rel_shared_bytes(
    head_dim: usize,
    k_steps: usize,
    group: usize,
) -> u32 {
    let rs = 16 * k_steps + 8;
    let keys = latent_rel_tile_keys(head_dim);
    let dim_warps = head_dim / 32;
    ((head_dim * rs + LATENT_REL_STAGES * keys * rs + 2 * 16 * (head_dim + 8)) * 2
        + LATENT_REL_STAGES * keys * 4
        + 2 * dim_warps * group * keys * 4
        + 4 * (16 * keys / 128) * 4) as u32
}

// Latent value kernel (`latent_values_mt{MT}` in `latent.cu`).

/// Tokens per value-latent tile (`LV_BN`): one k-step of the P·U product.
pub(crate) const LATENT_VALUE_TOKENS: usize = 16;
/// Value-latent tiles in flight where they fit (`LV_STAGES`); two at one m-tile (512 columns).
pub(crate) const LATENT_VALUE_STAGES: usize = 4;

/// Static shared memory of `latent_values_mt{m_tiles}_{elem}`: the P tile (bf16, 16·MT head
/// rows), the ring of U tiles (512 / MT columns, padded by 8) in the cache's element, for fp8 the
/// one converted bf16 U tile, and each head's maximum and sum. Static shared memory is capped at
/// 48 KiB per block.
pub(crate) const fn latent_values_static_bytes(m_tiles: usize, elem: CacheElem) -> usize {
    let stages = if m_tiles == 1 { 2 } else { LATENT_VALUE_STAGES };
    let (heads, row) = (16 * m_tiles, 512 / m_tiles + 8);
    let converted = match elem {
        CacheElem::Bf16 => 0,
        CacheElem::Fp8 => LATENT_VALUE_TOKENS * row * 2,
    };
    heads * (LATENT_VALUE_TOKENS + 8) * 2
        + stages * LATENT_VALUE_TOKENS * row * elem.bytes()
        + converted
        + 2 * heads * 4
}
