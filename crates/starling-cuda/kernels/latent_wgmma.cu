// STAR-KV latent decode scores on Hopper (sm_90a: wgmma), head width 128. Computes what
// latent.cu's latent_scores_d128_{bf16,fp8} compute, with their parameter list, grid (decode row,
// KV head, split), split plan and outputs; the host launches it in that kernel's place where
// STARLING_LATENT_SCORES=wgmma asks for it and the device is compute capability 9.0 (kernels.rs
// loads the module for sm_90a only there). The host prepends pdl.cuh, fp8.cuh, mma_common.cuh,
// latent_common.cuh and wgmma_common.cuh.
//
// Per tile of 64 keys the block's warpgroup reconstructs K[64 keys × 128] = Z · B_hᵀ with rank/16
// wgmma m64n128k16, both operands read from shared memory through descriptors in the 128-byte
// swizzled layout (wgmma_common.cuh): B_h is read once per warpgroup and k-step, where the
// mma.sync kernel reads all of it through ldmatrix once per warp and tile (4× the shared-memory
// traffic), and no operand passes through registers. The accumulator is mma.sync's C fragment
// per warp (warp w: keys 16w..16w+15; 8-column tile j: dims 8j..8j+7), so the bias, the RoPE
// and the scores against the group's queries (mma.sync, K packed to bf16 as the A fragment) are
// the mma.sync kernel's register code at one pass.
//
// What the mma.sync kernel waits on per tile is gone here too (latent.cu LS_ROPE_SPLIT and
// LS_SLOT_AHEAD, session 37): the tile's positions land in shared memory with its latents
// (cp.async), the block-table lookup of the next tile to load is issued one iteration early, and
// cos/sin at p = hi + lo (lo = p mod LW_ROPE_LO) is the table row of hi (shared by the tile's
// keys: L1) rotated by the row of lo, held in shared memory — not a 512-byte table row per key
// from L2. An fp8 cache's tiles land as bytes (8-byte copies: its rows are only 8-byte aligned)
// and each thread converts the chunks it copied into one bf16 tile in the swizzled layout
// (exactly: every e4m3 value is a bf16), which the products then read.

#define LW_THREADS 128    // one warpgroup (host: LATENT_THREADS)
#define LW_BN 64          // keys per tile: the wgmma's 64 rows
#define LW_STAGES 2       // key-latent tiles in the ring (host: LATENT_WG_STAGES)
#define LW_ROPE_LO 16     // shared cos/sin rows: positions 0..LW_ROPE_LO − 1
#define LW_ALIGN_PAD 1024 // host: LATENT_WG_ALIGN_PAD; the swizzled tiles start 1024-byte aligned

// Dynamic shared memory (geometry.rs latent_scores_wg_shared_bytes): the alignment pad, then B_h
// as KH halves of 64 ranks × 128 rows (d) × 128 bytes, then (bf16) LW_STAGES tiles of KH halves
// × 64 rows (keys) × 128 bytes, or (FP8) the one bf16 tile of that layout the byte tiles are
// converted into, then LW_STAGES byte tiles of 64 rows × KH · 64 bytes. KH (1 or 2) comes from
// the host's row stride `rs` (the largest rank rounded up to 16, plus 8: the mma.sync kernel's)
// so that every KV head of the layer uses the same tile geometry; a head of smaller rank leaves
// the chunks past its rank unread.
template <bool FP8>
__device__ void latent_scores_wg_impl(LATENT_SCORE_PARAMS) {
    latent_split(plan, splits, split_len);
    if ((int)blockIdx.z >= splits) return;
    constexpr int D = 128;
    constexpr int NT = D / 8;   // 8-wide column tiles of a reconstructed key row
    constexpr int KS = D / 16;  // k-steps of the score over the head dim
    constexpr int HALF = D / 2;
    extern __shared__ __align__(16) unsigned char lw_raw[];
    const unsigned raw_addr = smem_u32(lw_raw);
    unsigned char* base =
        lw_raw + ((LW_ALIGN_PAD - (raw_addr & (LW_ALIGN_PAD - 1))) & (LW_ALIGN_PAD - 1));
    const int kh = (rs - 8 + 63) >> 6;
    unsigned char* b_s = base;                     // [kh][D rows][128 B]
    // bf16: [LW_STAGES][kh][LW_BN rows][128 B]. FP8: z_cvt [kh][LW_BN rows][128 B], then the
    // byte ring [LW_STAGES][LW_BN rows][kh · 64 B].
    unsigned char* z_ring = base + kh * D * 128;
    unsigned char* z_cvt = z_ring;
    if (FP8) z_ring += kh * LW_BN * 128;
    const int z_stage_bytes = kh * LW_BN * (FP8 ? 64 : 128);
    const int z_row_bytes = kh * 64;  // FP8: a byte tile's row
    __shared__ __align__(16) float2 lo_s[LW_ROPE_LO * HALF];
    __shared__ unsigned pos_s[LW_STAGES * LW_BN];
    __shared__ float bias_s[D];
    __shared__ float max_s[4 * 8];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q4 = lane & 3;
    const int i_row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int t = (int)rows[i_row];
    const int num_q_heads = num_kv_heads * group;
    const int offset = latent_heads[2 * kvh], rank = latent_heads[2 * kvh + 1];
    const int r16 = (rank + 15) & ~15;
    const int kv_start = split * split_len;
    const int kv_end = min((int)tok_visible[t], kv_start + split_len);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + LW_BN - 1) / LW_BN : 0;
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;
    // The row's scores, head-major ([head][visible]), as latent.cu writes them.
    const int visible = (int)tok_visible[t];
    float* row_scores = scores + (size_t)score_offsets[i_row] * num_q_heads;

    // B_h (zero past the rank, up to r16), the bias, and cos/sin of positions 0..LW_ROPE_LO − 1
    // (the table's first rows, in 16-byte chunks).
    const int cpr = r16 / 8;  // 16-byte chunks per row
    for (int k = tid; k < D * cpr; k += LW_THREADS) {
        const int d = k / cpr, c = k % cpr;
        const bool valid = 8 * c < rank;
        cp_async16(reinterpret_cast<bf16*>(b_s + tile_chunk_offset<D>(d, c)),
                   valid ? key_up + (size_t)d * key_width + offset + 8 * c : key_up, valid);
    }
    for (int d = tid; d < D; d += LW_THREADS)
        bias_s[d] = key_bias != nullptr ? __bfloat162float(key_bias[kvh * D + d]) : 0.f;
    for (int k = tid; k < LW_ROPE_LO * HALF / 2; k += LW_THREADS)
        cp_async16(reinterpret_cast<bf16*>(lo_s + 2 * k),
                   reinterpret_cast<const bf16*>(rope_table + 2 * k), true);
    cp_async_commit();

    // Two threads per key row, alternate chunks (one slot lookup per row and thread); the even
    // thread also copies the row's position.
    static_assert(LW_THREADS == 2 * LW_BN, "two threads per key-latent row");
    auto tile_slot = [&](int tile) {
        const int j = kv_start + tile * LW_BN + (tid >> 1);
        return j < kv_end ? paged_slot(table, j, block_size) : 0u;
    };
    auto load_tile = [&](int tile, int stage, unsigned slot) {
        const int r = tid >> 1;
        const bool in = kv_start + tile * LW_BN + r < kv_end;
        const size_t row = (size_t)slot * key_width + offset;  // element index in the plane
        unsigned char* dst = z_ring + stage * z_stage_bytes;
        if ((tid & 1) == 0) cp_async4(pos_s + stage * LW_BN + r, pos_plane + slot, in);
        for (int c = tid & 1; c < cpr; c += 2) {
            const bool valid = in && 8 * c < rank;
            if (FP8) {
                cp_async8(dst + r * z_row_bytes + 8 * c,
                          plane_bytes(key_plane, valid ? row + 8 * c : 0), valid);
            } else {
                cp_async16_ca(reinterpret_cast<bf16*>(dst + tile_chunk_offset<LW_BN>(r, c)),
                              valid ? key_plane + row + 8 * c : key_plane, valid);
            }
        }
    };
    // FP8: this thread's chunks of a landed byte tile (the ones it copied; zero past the context
    // and the rank) into z_cvt, each 8-element chunk c to 16-byte chunk c of its bf16 row.
    auto convert_tile = [&](int stage) {
        const int r = tid >> 1;
        const unsigned char* src = z_ring + stage * z_stage_bytes + r * z_row_bytes;
        for (int c = tid & 1; c < cpr; c += 2)
            *reinterpret_cast<uint4*>(z_cvt + tile_chunk_offset<LW_BN>(r, c)) =
                e4m3x8_to_bf16(*reinterpret_cast<const uint2*>(src + 8 * c));
    };
#pragma unroll
    for (int s = 0; s < LW_STAGES - 1; s++) {
        if (s < n_tiles) load_tile(s, s, tile_slot(s));
        cp_async_commit();
    }
    // The slot of the next tile to load, looked up one iteration before its copy.
    unsigned next_slot = LW_STAGES - 1 < n_tiles ? tile_slot(LW_STAGES - 1) : 0u;

    unsigned qb[KS][2];
    load_group_queries<D>(qb, qkv, qkv_width, t, kvh, group, g, q4);
    const float scale_log2 = scale * LOG2E;
    float run_max[2] = {NEG_INF, NEG_INF};  // heads 2·q4 and 2·q4 + 1 of the group
    const unsigned b_addr = smem_u32(b_s);
    const int wk = warp * 16;

    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<LW_STAGES - 2>();
        // This thread's landed copies, visible to wgmma's operand reads (the async proxy); the
        // barrier then makes every thread's visible, and ends every read of the stage refilled
        // next and (FP8) of z_cvt (their wgmma completed before it, positions were read before it).
        if (!FP8) fence_proxy_async_shared();
        __syncthreads();
        {
            const int next = it + LW_STAGES - 1;
            if (next < n_tiles) load_tile(next, next % LW_STAGES, next_slot);
            cp_async_commit();
            if (next + 1 < n_tiles) next_slot = tile_slot(next + 1);
        }
        const int stage = it % LW_STAGES;
        if (FP8) {
            // The conversion's writes, visible to the products after a second barrier.
            convert_tile(stage);
            fence_proxy_async_shared();
            __syncthreads();
        }
        const unsigned z_addr = smem_u32(FP8 ? z_cvt : z_ring + stage * z_stage_bytes);
        // K = Z · B_hᵀ over the rank's k-steps (k-step ks: 32 bytes into its half's rows).
        float acc[NT][4];
        if (r16 > 0) {
            wgmma_fence();
            wgmma_m64n128k16_ss<false>(acc, wgmma_desc(z_addr, 16, WG_SW_SBO),
                                       wgmma_desc(b_addr, 16, WG_SW_SBO));
            for (int ks = 1; ks < r16 / 16; ks++) {
                const unsigned long long zd =
                    wgmma_desc(z_addr + (ks / 4) * LW_BN * 128 + (ks % 4) * 32, 16, WG_SW_SBO);
                const unsigned long long bd =
                    wgmma_desc(b_addr + (ks / 4) * D * 128 + (ks % 4) * 32, 16, WG_SW_SBO);
                wgmma_m64n128k16_ss<true>(acc, zd, bd);
            }
            wgmma_commit();
        } else {
#pragma unroll
            for (int i = 0; i < NT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
        }
        // While the products run: rows wk + g and wk + g + 8 of the tile, their positions (landed
        // with the tile; zero past the context) and cos/sin rows.
        const int j0 = kv_start + it * LW_BN + wk + g;
        const unsigned p0 = pos_s[stage * LW_BN + wk + g];
        const unsigned p1 = pos_s[stage * LW_BN + wk + g + 8];
        const RopeRow<true> cs0{rope_table + (size_t)(p0 - p0 % LW_ROPE_LO) * HALF,
                                lo_s + (p0 % LW_ROPE_LO) * HALF};
        const RopeRow<true> cs1{rope_table + (size_t)(p1 - p1 % LW_ROPE_LO) * HALF,
                                lo_s + (p1 % LW_ROPE_LO) * HALF};
        if (r16 > 0) {
            wgmma_wait<0>();
            wgmma_fence_operands(acc);
        }
        // Bias, RoPE and the scores against the group: the whole row as one pass.
        bias_rope_keys<NT, NT / 2>(acc, 0, bias_s, cs0, cs1, interleaved, q4);
        float s[4] = {0.f, 0.f, 0.f, 0.f};
        score_keys<NT, NT / 2>(s, acc, 0, qb);
        store_tile_scores(row_scores, s, j0, kv_end, kvh, group, q4, visible, scale_log2, run_max);
    }
    cp_async_wait<0>();
    store_split_maxima<4>(part_m, max_s, run_max, i_row, num_q_heads, kvh, group, splits, split);
}

#define INSTANTIATE_WG_SCORES(ELEM, FP8)                                                         \
    extern "C" __global__ void __launch_bounds__(LW_THREADS)                                     \
        latent_scores_wg_d128_##ELEM(LATENT_SCORE_PARAMS) {                                      \
        pdl_entry();                                                                             \
        latent_scores_wg_impl<FP8>(scores, part_m, qkv, qkv_width, key_plane, key_width,         \
                                   pos_plane, latent_heads, key_up, key_bias, rope_table,        \
                                   interleaved, rs, rows, tok_seq, tok_visible, score_offsets,   \
                                   block_tables, max_blocks, block_size, num_kv_heads, group,    \
                                   scale, splits, split_len, plan);                              \
    }
INSTANTIATE_WG_SCORES(bf16, false)
INSTANTIATE_WG_SCORES(fp8, true)
