// STAR-KV latent layers (CPU references: starling-backend cpu::latent). The host prepends
// pdl.cuh, mma_common.cuh and latent_common.cuh.
//
// A latent layer's cache holds, per slot, every KV head's key latent z_h (rank r_h, pre-RoPE),
// one value latent u (rank r_v, shared by all heads) and the token's position. Keys are
// RoPE(B_h z_h + b_h, position), values B_v u + b_v. Decode rows attend in four launches:
//
//   latent_scores_rot_*  (opt-in, one query head per KV head; latent_rot.cu) grid (row, head,
//                        split): RoPE absorbed into the query, no key reconstructed; else
//   latent_scores_d{D}   grid (row, KV head, split): the split's key latents are turned into keys
//                        on the tensor cores (Z·B_hᵀ, mma.sync), biased and rotated at each
//                        slot's position (RoPE table), and dotted with the group's queries
//                        (Kᵀ·Q on the tensor cores); scores (log2 units) go to a per-row range of
//                        a scratch buffer ([head][token] within the row), each head's split
//                        maximum to part_m.
//   latent_values_mt{MT} grid (row, split, value chunk): P = 2^(S − m) for every head at once
//                        (MT m-tiles of 16 heads), O_latent += P·U on the tensor cores: the value
//                        latent is read once per (row, split), whatever the head count.
//   latent_combine_bf16  grid (row, head): the splits merged, normalised → W [head][row][r_v].
//   (cuBLAS)             per KV head: W_g · B_v,gᵀ, all the group's rows at once (B_v read once).
//   latent_value_out_bf16 bias added, rows back in the layer's output order.
//
// Prefill chunks are reconstructed instead (latent_gather_rows_* → cuBLAS → latent_finish_kv)
// into a scratch full cache that the tiled prefill kernel attends: a chunk amortises the
// reconstruction over its rows.
//
// The kernels that touch the latent planes (the write, latent_scores_d{D}, latent_values_mt{MT},
// latent_gather_rows) are instantiated per cache element, `_bf16` and `_fp8` (fp8.cuh: e4m3,
// scale 1, one byte per element, written nearest-even and saturated to ±448 as the CPU reference
// rounds its f32 slots); the fp8 readers convert each tile to bf16 in shared memory (exactly), so
// everything after the tile load is the bf16 kernel's arithmetic. The rotary-absorbed kernel
// (latent_rot.cu) has no fp8 instantiation: the host uses the reconstruction kernel for fp8.

#define LS_THREADS 128
#define LS_WARPS 4
#define LS_BN 64      // keys per tile of latent_scores (16 per warp)
#define LS_STAGES 2   // key-latent tiles in flight
// Passes over a reconstructed key row: 1 keeps its 4·D/8 accumulators live at once (d128: 138
// registers, 3 blocks per SM); 2 and 4 hold a half and a quarter (ptxas: 102 and 96 registers,
// no spills: 4 and 5 blocks per SM) for the same products, the score's k-steps in another order.
// H100 (session 37): 2 and 4 within ±3% on MHA, 10–13% slower on Qwen at full grids.
#define LS_PASSES 1
// RoPE of the reconstructed keys. 0: cos/sin read from the table row of each key's position
// (64 × D/2 float pairs per tile, 4× the tile's latent bytes, through L2), the position read
// after a block-table → position chain of dependent loads. 1: the tile's positions land in
// shared memory with its latents (cp.async), and cos/sin at p = hi + lo (lo = p mod LS_ROPE_LO)
// is the table row of hi (a tile's keys share a few: L1) times the row of lo, held in static
// shared memory from the table's first LS_ROPE_LO rows. The angle sum rounds differently from
// sincosf(p·θ) with f32 angles: up to 1.9e-3 apart at 32k positions, each within 9.8e-4 of
// the exact product's cos/sin (the f32 angle's own rounding; keys are then rounded to bf16).
// Untimed on a GPU yet: A/B with scripts/device/latent_plan_ab.sh variants.
#define LS_ROPE_SPLIT 0
#define LS_ROPE_LO 16
// 1: the block-table lookup of each tile's slots one iteration before its cp.async (in flight
// while the tile before is computed), not on the way to it after the barrier. Untimed on a GPU.
#define LS_SLOT_AHEAD 0
#define LV_THREADS 128
#define LV_BN 16      // tokens per tile of latent_values (one k-step; its U ring fits static
                      // shared memory at 512 columns: 2 × 16 × 520 × 2 B)
#define LV_STAGES 4   // value-latent tiles in flight where they fit (2 at one m-tile: 512 columns)

// Backend::rope_q_write_latents: RoPE on the Q heads of each [q | key latents | value latent] row
// (rope_qk_bf16's expressions), the latents copied unrotated to the row's slot and its position
// stored. Grid (token, item chunk): an item is a Q pair, a chunk of 8 latent elements, or the
// position. Padding rows (slot 0xffffffff) are rotated but store nothing. `FP8` planes are byte
// arrays: the chunk is stored as 8 e4m3 (nearest-even, saturated to ±448: the CPU reference's
// fp8::e4m3_from_f32 of the same bf16 value); else as 8 bf16, bit for bit.
template <bool FP8>
__device__ void rope_q_write_latents_impl(
    bf16* __restrict__ qkv, const unsigned* __restrict__ positions,
    const float* __restrict__ inv_freq, const unsigned* __restrict__ slots,
    bf16* __restrict__ key_plane, bf16* __restrict__ value_plane, unsigned* __restrict__ pos_plane,
    int width, int num_heads, int head_dim, int key_width, int value_width, int interleaved) {
    const int half = head_dim / 2;
    const int q_pairs = num_heads * half;
    const int q_size = num_heads * head_dim;
    const int chunks = (key_width + value_width) / 8;
    const int idx = blockIdx.y * blockDim.x + threadIdx.x;
    if (idx >= q_pairs + chunks + 1) return;
    bf16* row = qkv + (size_t)blockIdx.x * width;
    if (idx < q_pairs) {
        const int h = idx / half, i = idx % half;
        const float pos = (float)positions[blockIdx.x];
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        bf16* head = row + h * head_dim;
        const float x0 = __bfloat162float(head[a]), x1 = __bfloat162float(head[b]);
        head[a] = __float2bfloat16(x0 * c - x1 * s);
        head[b] = __float2bfloat16(x0 * s + x1 * c);
        return;
    }
    const unsigned slot = slots[blockIdx.x];
    if (slot == 0xffffffffu) return;
    const int c = idx - q_pairs;
    if (c == chunks) {
        pos_plane[slot] = positions[blockIdx.x];
        return;
    }
    // Latent widths are multiples of 8 (stored ranks), so a chunk never straddles the planes and
    // its destination is 16-byte (bf16) or 8-byte (fp8) aligned; the source row start is 16-byte
    // aligned when the row width and q_size are, else the chunk is read element by element.
    const bf16* src = row + q_size + 8 * c;
    const bool key = 8 * c < key_width;
    bf16* plane = key ? key_plane : value_plane;
    const size_t elem = key ? (size_t)slot * key_width + 8 * c
                            : (size_t)slot * value_width + (8 * c - key_width);
    uint4 raw;
    if (((width | q_size) & 7) == 0) {
        raw = *reinterpret_cast<const uint4*>(src);
    } else {
        bf16* r = reinterpret_cast<bf16*>(&raw);
#pragma unroll
        for (int e = 0; e < 8; e++) r[e] = src[e];
    }
    if (FP8) {
        const bf16* r = reinterpret_cast<const bf16*>(&raw);
        float f[8];
#pragma unroll
        for (int e = 0; e < 8; e++) f[e] = __bfloat162float(r[e]);
        *reinterpret_cast<uint2*>(reinterpret_cast<unsigned char*>(plane) + elem) = pack8_e4m3(f);
    } else {
        *reinterpret_cast<uint4*>(plane + elem) = raw;
    }
}

#define INSTANTIATE_WRITE(NAME, FP8)                                                             \
    extern "C" __global__ void NAME(bf16* qkv, const unsigned* positions, const float* inv_freq,  \
                                    const unsigned* slots, bf16* key_plane, bf16* value_plane,    \
                                    unsigned* pos_plane, int width, int num_heads, int head_dim,  \
                                    int key_width, int value_width, int interleaved) {            \
        pdl_entry();                                                                             \
        rope_q_write_latents_impl<FP8>(qkv, positions, inv_freq, slots, key_plane, value_plane,   \
                                       pos_plane, width, num_heads, head_dim, key_width,          \
                                       value_width, interleaved);                                 \
    }
INSTANTIATE_WRITE(rope_q_write_latents_bf16, false)
INSTANTIATE_WRITE(rope_q_write_latents_fp8, true)

// cos/sin of position p and frequency i, as rope_qk_bf16 computes them: table[p * half + i].
extern "C" __global__ void latent_rope_table_f32(float2* __restrict__ table,
                                                 const float* __restrict__ inv_freq, int half,
                                                 unsigned first, unsigned count) {
    pdl_entry();
    const size_t n = (size_t)count * half;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const unsigned p = first + (unsigned)(k / half);
        const int i = (int)(k % half);
        float s, c;
        sincosf((float)p * inv_freq[i], &s, &c);
        table[(size_t)first * half + k] = make_float2(c, s);
    }
}

// cos/sin rows of the key positions (latent_common.cuh).
using LsRopeRow = RopeRow<LS_ROPE_SPLIT != 0>;

// Scores of one (decode row, KV head, context split). Dynamic shared memory
// (geometry.rs latent_scores_shared_bytes): B_h as [D][rs] bf16 (rs = the host's padded row
// stride ≥ rank rounded up to 16, plus 8 so ldmatrix rows fall in distinct banks), then LS_STAGES
// key-latent tiles [LS_BN][rs] in the cache's element, then (FP8) one bf16 tile [LS_BN][rs] that
// each landed byte tile is converted into, then the bias (f32 [D]) and the warps' maxima.
// An fp8 row is only 8-byte aligned (8-element chunks of one byte each), so its tiles are copied
// in 8-byte pieces; a second barrier per tile orders the conversion before the mma reads.
template <int D, bool FP8>
__device__ void latent_scores_impl(
    float* __restrict__ scores,            // [score_offsets[i] + token][num_q_heads], log2 units
    float* __restrict__ part_m,            // [rows, Hq, splits]: each head's split maximum
    const bf16* __restrict__ qkv, int qkv_width, const bf16* __restrict__ key_plane,
    int key_width, const unsigned* __restrict__ pos_plane, const int* __restrict__ latent_heads,
    const bf16* __restrict__ key_up,       // [D][key_width]
    const bf16* __restrict__ key_bias,     // [kv_heads * D] or null
    const float2* __restrict__ rope_table, int interleaved, int rs,
    const unsigned* __restrict__ rows, const unsigned* __restrict__ tok_seq,
    const unsigned* __restrict__ tok_visible, const unsigned* __restrict__ score_offsets,
    const unsigned* __restrict__ block_tables, int max_blocks, int block_size, int num_kv_heads,
    int group, float scale, int splits, int split_len, const unsigned* __restrict__ plan) {
    latent_split(plan, splits, split_len);
    if ((int)blockIdx.z >= splits) return;
    constexpr int NT = D / 8;    // 8-wide n-tiles of a reconstructed key row
    constexpr int KS = D / 16;   // k-steps of the score over the head dim
    // Passes over the key row (LS_PASSES, at most NT / 4: each pass takes whole k-steps of the
    // score from each half) and first-half n-tiles per pass.
    constexpr int PASSES = LS_PASSES < NT / 4 ? LS_PASSES : NT / 4;
    constexpr int PT = NT / (2 * PASSES);
    static_assert(PT % 2 == 0 && PASSES * 2 * PT == NT, "whole k-steps per pass");
    constexpr int HALF = D / 2;
    constexpr int EB = FP8 ? 1 : 2;  // bytes per cache element
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* b_s = reinterpret_cast<bf16*>(smem_raw);                 // [D][rs]
    unsigned char* z_ring = smem_raw + D * rs * 2;  // [LS_STAGES][LS_BN][rs] cache elements
    bf16* z_cvt = reinterpret_cast<bf16*>(z_ring + LS_STAGES * LS_BN * rs * EB);  // [LS_BN][rs]
    float* bias_s = reinterpret_cast<float*>(z_cvt + (FP8 ? LS_BN * rs : 0));    // [D]
    float* max_s = bias_s + D;                                     // [LS_WARPS][8]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q4 = lane & 3;
    const int i_row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int t = (int)rows[i_row];
    const int num_q_heads = num_kv_heads * group;
    const int offset = latent_heads[2 * kvh], rank = latent_heads[2 * kvh + 1];
    const int r16 = (rank + 15) & ~15;
    const int kv_start = split * split_len;
    const int kv_end = min((int)tok_visible[t], kv_start + split_len);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + LS_BN - 1) / LS_BN : 0;
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;
    // The row's scores, head-major ([head][visible]): the values kernel reads a head's run of
    // tokens in one coalesced load.
    const int visible = (int)tok_visible[t];
    float* row_scores = scores + (size_t)score_offsets[i_row] * num_q_heads;

    // B_h, zero past the rank (the k-steps cover r16).
    const int cpr = r16 / 8;  // 16-byte chunks per row
    for (int k = tid; k < D * cpr; k += LS_THREADS) {
        const int d = k / cpr, c = k % cpr;
        const bool valid = 8 * c < rank;
        cp_async16(b_s + d * rs + 8 * c, valid ? key_up + (size_t)d * key_width + offset + 8 * c
                                               : key_up, valid);
    }
    for (int d = tid; d < D; d += LS_THREADS)
        bias_s[d] = key_bias != nullptr ? __bfloat162float(key_bias[kvh * D + d]) : 0.f;
#if LS_ROPE_SPLIT
    // cos/sin of positions 0..LS_ROPE_LO − 1 (the table's first rows, in 16-byte chunks) and
    // each staged tile's positions.
    __shared__ __align__(16) float2 lo_s[LS_ROPE_LO * HALF];
    __shared__ unsigned pos_s[LS_STAGES * LS_BN];
    for (int k = tid; k < LS_ROPE_LO * HALF / 2; k += LS_THREADS)
        cp_async16(reinterpret_cast<bf16*>(lo_s + 2 * k),
                   reinterpret_cast<const bf16*>(rope_table + 2 * k), true);
#endif
    cp_async_commit();

    // Two threads per key row, alternate chunks: one slot lookup per row and thread, not one
    // per 16-byte chunk (through L1: a sector's halves come from the same two threads).
    static_assert(LS_THREADS == 2 * LS_BN, "two threads per key-latent row");
    // This thread's row's slot in `tile` (0 past the context).
    auto tile_slot = [&](int tile) {
        const int j = kv_start + tile * LS_BN + (tid >> 1);
        return j < kv_end ? paged_slot(table, j, block_size) : 0u;
    };
    auto load_tile = [&](int tile, int stage, unsigned slot) {
        const int r = tid >> 1;
        const bool in = kv_start + tile * LS_BN + r < kv_end;
        const size_t row = (size_t)slot * key_width + offset;
        const size_t z = ((size_t)stage * LS_BN + r) * rs;  // element index in the ring
#if LS_ROPE_SPLIT
        if ((tid & 1) == 0) cp_async4(pos_s + stage * LS_BN + r, pos_plane + slot, in);
#endif
        for (int c = tid & 1; c < cpr; c += 2) {
            const bool valid = in && 8 * c < rank;
            if (FP8) {
                const size_t from = valid ? row + 8 * c : 0;
                cp_async8(z_ring + z + 8 * c, plane_bytes(key_plane, from), valid);
            } else {
                cp_async16_ca(reinterpret_cast<bf16*>(z_ring) + z + 8 * c,
                              valid ? key_plane + row + 8 * c : key_plane, valid);
            }
        }
    };
    // FP8: this thread's chunks of a landed byte tile (the ones it copied) into z_cvt; rows past
    // the context and columns past the rank were zero-filled, and convert to zeros.
    auto convert_tile = [&](int stage) {
        const int r = tid >> 1;
        const unsigned char* src = z_ring + ((size_t)stage * LS_BN + r) * rs;
        for (int c = tid & 1; c < cpr; c += 2)
            *reinterpret_cast<uint4*>(z_cvt + r * rs + 8 * c) =
                e4m3x8_to_bf16(*reinterpret_cast<const uint2*>(src + 8 * c));
    };
#pragma unroll
    for (int s = 0; s < LS_STAGES - 1; s++) {
        if (s < n_tiles) load_tile(s, s, tile_slot(s));
        cp_async_commit();
    }
    // LS_SLOT_AHEAD: the slot of the next tile to load, looked up one iteration early.
    unsigned next_slot = LS_SLOT_AHEAD && LS_STAGES - 1 < n_tiles ? tile_slot(LS_STAGES - 1) : 0u;

    unsigned qb[KS][2];
    load_group_queries<D>(qb, qkv, qkv_width, t, kvh, group, g, q4);
    const float scale_log2 = scale * LOG2E;
    float run_max[2] = {NEG_INF, NEG_INF};  // heads 2·q4 and 2·q4 + 1 of the group

    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<LS_STAGES - 2>();
        __syncthreads();
        {
            const int next = it + LS_STAGES - 1;
            if (next < n_tiles)
                load_tile(next, next % LS_STAGES, LS_SLOT_AHEAD ? next_slot : tile_slot(next));
            cp_async_commit();
            if (LS_SLOT_AHEAD && next + 1 < n_tiles) next_slot = tile_slot(next + 1);
        }
        const bf16* z;
        if (FP8) {
            // The barrier above also ended every warp's reads of z_cvt (the previous tile).
            convert_tile(it % LS_STAGES);
            __syncthreads();
            z = z_cvt;
        } else {
            z = reinterpret_cast<const bf16*>(z_ring) + (it % LS_STAGES) * LS_BN * rs;
        }
        const int wk = warp * 16;
        // Rows wk + g and wk + g + 8 of the tile: their positions for RoPE.
        const int j0 = kv_start + it * LS_BN + wk + g, j1 = j0 + 8;
#if LS_ROPE_SPLIT
        // Landed with the tile (zero past the context).
        const unsigned p0 = pos_s[(it % LS_STAGES) * LS_BN + wk + g];
        const unsigned p1 = pos_s[(it % LS_STAGES) * LS_BN + wk + g + 8];
        const LsRopeRow cs0{rope_table + (size_t)(p0 - p0 % LS_ROPE_LO) * HALF,
                            lo_s + (p0 % LS_ROPE_LO) * HALF};
        const LsRopeRow cs1{rope_table + (size_t)(p1 - p1 % LS_ROPE_LO) * HALF,
                            lo_s + (p1 % LS_ROPE_LO) * HALF};
#else
        const unsigned p0 = j0 < kv_end ? slot_position(pos_plane, paged_slot(table, j0, block_size)) : 0u;
        const unsigned p1 = j1 < kv_end ? slot_position(pos_plane, paged_slot(table, j1, block_size)) : 0u;
        const LsRopeRow cs0{rope_table + (size_t)p0 * HALF, nullptr};
        const LsRopeRow cs1{rope_table + (size_t)p1 * HALF, nullptr};
#endif
        // The key row in PASSES passes of 2·PT n-tiles each: PT from the first half of the head
        // dim and their RoPE partners PT from the second (n-tile nt pairs with nt + NT/2), so a
        // pass holds 8·PT accumulators instead of 4·NT (occupancy: LS_PASSES at the top).
        float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int pass = 0; pass < PASSES; pass++) {
            // acc[i], i < PT: n-tile pass·PT + i; acc[PT + i]: its partner NT/2 + pass·PT + i.
            float acc[2 * PT][4];
#pragma unroll
            for (int i = 0; i < 2 * PT; i++) acc[i][0] = acc[i][1] = acc[i][2] = acc[i][3] = 0.f;
            // Keys = Z · B_hᵀ over the rank (k-steps of 16).
            for (int ks = 0; ks < r16 / 16; ks++) {
                unsigned a[4];
                ldmatrix_x4(a, z + (wk + (lane & 15)) * rs + 16 * ks + 8 * (lane >> 4));
#pragma unroll
                for (int h = 0; h < 2; h++) {
#pragma unroll
                    for (int p = 0; p < PT / 2; p++) {
                        // B rows of n-tiles nt0 and nt0 + 1 (16 rows of B_h from row 8·nt0).
                        const int nt0 = h * (NT / 2) + pass * PT + 2 * p;
                        unsigned b[4];
                        ldmatrix_x4(b, b_s + (8 * nt0 + (lane & 7) + ((lane >> 4) << 3)) * rs +
                                           16 * ks + 8 * ((lane >> 3) & 1));
                        mma_bf16(acc[h * PT + 2 * p], a, b[0], b[1]);
                        mma_bf16(acc[h * PT + 2 * p + 1], a, b[2], b[3]);
                    }
                }
            }
            bias_rope_keys<NT, PT>(acc, pass, bias_s, cs0, cs1, interleaved, q4);
            score_keys<NT, PT>(s, acc, pass, qb);
        }
        store_tile_scores(row_scores, s, j0, kv_end, kvh, group, q4, visible, scale_log2, run_max);
    }
    cp_async_wait<0>();
    store_split_maxima<LS_WARPS>(part_m, max_s, run_max, i_row, num_q_heads, kvh, group, splits,
                                 split);
}

#define INSTANTIATE_SCORES(D, ELEM, FP8)                                                         \
    extern "C" __global__ void __launch_bounds__(LS_THREADS)                                     \
        latent_scores_d##D##_##ELEM(LATENT_SCORE_PARAMS) {                                       \
        pdl_entry();                                                                             \
        latent_scores_impl<D, FP8>(scores, part_m, qkv, qkv_width, key_plane, key_width,        \
                                   pos_plane, latent_heads, key_up, key_bias, rope_table,        \
                                   interleaved, rs, rows, tok_seq, tok_visible, score_offsets,   \
                                   block_tables, max_blocks, block_size, num_kv_heads, group,    \
                                   scale, splits, split_len, plan);                              \
    }
INSTANTIATE_SCORES(64, bf16, false)
INSTANTIATE_SCORES(128, bf16, false)
INSTANTIATE_SCORES(64, fp8, true)
INSTANTIATE_SCORES(128, fp8, true)


// Weighted value latents of one (row, split, chunk of CH = 512 / MT value columns) for all
// MT·16 ≥ Hq heads: P = 2^(S − m_split) in shared memory, O += P · U on the tensor cores (each
// warp owns CH / 4 columns). Writes the unnormalised partial and, from chunk 0, each head's sum.
// `FP8` value planes are byte rows: their U tiles land as bytes (8-byte copies: a row is only
// 8-byte aligned) and each thread converts the chunks it copied into one bf16 tile before the
// barrier that precedes the mma (geometry.rs latent_values_static_bytes counts both).
template <int MT, bool FP8>
__device__ void latent_values_impl(
    float* __restrict__ part_acc,          // [rows, Hq, splits, value_width]
    float* __restrict__ part_l,            // [rows, Hq, splits]
    const float* __restrict__ scores, const float* __restrict__ part_m,
    const bf16* __restrict__ value_plane, int value_width, const unsigned* __restrict__ rows,
    const unsigned* __restrict__ tok_seq, const unsigned* __restrict__ tok_visible,
    const unsigned* __restrict__ score_offsets, const unsigned* __restrict__ block_tables,
    int max_blocks, int block_size, int num_q_heads, int splits, int split_len,
    const unsigned* __restrict__ plan) {
    latent_split(plan, splits, split_len);
    if ((int)blockIdx.y >= splits) return;
    constexpr int CH = 512 / MT;       // value columns of this block
    constexpr int WN = CH / 4;         // ... of each warp
    constexpr int NTW = WN / 8;        // n-tiles per warp
    constexpr int HP = 16 * MT;        // padded head rows
    constexpr int PS = LV_BN + 8;      // P row stride (bf16)
    constexpr int US = CH + 8;         // U row stride (bf16)
    __shared__ __align__(16) bf16 p_s[HP * PS];
    // Four 16-token tiles in flight keep ~34 KB per block moving (two left the value kernel at
    // 2.7 TB/s); at one m-tile (512 columns) only two fit the 48 KiB of static shared memory.
    constexpr int ST = MT == 1 ? 2 : LV_STAGES;
    constexpr int EB = FP8 ? 1 : 2;  // bytes per cache element
    // The ring of U tiles in the cache's element, then (FP8) the one converted bf16 tile.
    __shared__ __align__(16) unsigned char u_raw[ST * LV_BN * US * EB + (FP8 ? LV_BN * US * 2 : 0)];
    bf16* u_cvt = reinterpret_cast<bf16*>(u_raw + ST * LV_BN * US * EB);
    __shared__ float m_s[HP];
    __shared__ float l_s[HP];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q4 = lane & 3;
    const int i_row = blockIdx.x, split = blockIdx.y, c0 = blockIdx.z * CH;
    const int t = (int)rows[i_row];
    const int kv_start = split * split_len;
    const int kv_end = min((int)tok_visible[t], kv_start + split_len);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + LV_BN - 1) / LV_BN : 0;
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;
    const int visible = (int)tok_visible[t];
    const float* row_scores = scores + (size_t)score_offsets[i_row] * num_q_heads;
    for (int h = tid; h < HP; h += LV_THREADS) {
        m_s[h] = h < num_q_heads ? part_m[((size_t)i_row * num_q_heads + h) * splits + split]
                                 : NEG_INF;
        l_s[h] = 0.f;
    }

    // Each thread copies CPT consecutive 16-byte chunks of one row (one slot lookup per tile,
    // fixed offsets; through L1, as a sector's halves come from one thread), not one lookup
    // and address per chunk.
    constexpr int CPR = CH / 8;                 // chunks per row
    constexpr int TPR = LV_THREADS / LV_BN;     // threads per row
    constexpr int CPT = CPR / TPR;              // chunks per thread
    static_assert(LV_THREADS % LV_BN == 0 && CPR % TPR == 0, "value tile copy geometry");
    const int copy_r = tid / TPR, copy_c = (tid % TPR) * CPT;
    auto load_tile = [&](int tile, int stage) {
        const size_t u = ((size_t)stage * LV_BN + copy_r) * US;  // element index in the ring
        const int j = kv_start + tile * LV_BN + copy_r;
        const bool in = j < kv_end;
        const size_t row = (size_t)(in ? paged_slot(table, j, block_size) : 0u) * value_width + c0;
#pragma unroll
        for (int e = 0; e < CPT; e++) {
            const int c = copy_c + e;
            const bool valid = in && c0 + 8 * c < value_width;
            if (FP8) {
                const size_t from = valid ? row + 8 * c : 0;
                cp_async8(u_raw + u + 8 * c, plane_bytes(value_plane, from), valid);
            } else {
                cp_async16_ca(reinterpret_cast<bf16*>(u_raw) + u + 8 * c,
                              valid ? value_plane + row + 8 * c : value_plane, valid);
            }
        }
    };
    float acc[MT][NTW][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int n = 0; n < NTW; n++) acc[mt][n][0] = acc[mt][n][1] = acc[mt][n][2] = acc[mt][n][3] = 0.f;
#pragma unroll
    for (int s = 0; s < ST - 1; s++) {
        if (s < n_tiles) load_tile(s, s);
        cp_async_commit();
    }
    __syncthreads();  // m_s, l_s

    // Each half-warp takes one head at a time (heads 2w + hw, then + 8, ...), lane & 15 = the
    // token; a tile's scores are loaded one tile ahead, into registers, so their latency hides
    // behind the previous tile's products.
    constexpr int HPT = HP / (2 * LV_THREADS / 32);  // heads per thread
    float sc[HPT];
    auto load_scores = [&](int tile) {
        const int j = kv_start + tile * LV_BN + (lane & 15);
#pragma unroll
        for (int k = 0; k < HPT; k++) {
            const int h = 2 * warp + (lane >> 4) + k * (2 * LV_THREADS / 32);
            sc[k] = h < num_q_heads && j < kv_end ? row_scores[(size_t)h * visible + j] : NEG_INF;
        }
    };
    if (n_tiles > 0) load_scores(0);
    for (int it = 0; it < n_tiles; it++) {
        if (it + ST - 1 < n_tiles) load_tile(it + ST - 1, (it + ST - 1) % ST);
        cp_async_commit();
        // P tile; each head's sum of the unrounded weights goes to l_s (one half-warp owns it).
        const int j = kv_start + it * LV_BN + (lane & 15);
#pragma unroll
        for (int k = 0; k < HPT; k++) {
            const int h = 2 * warp + (lane >> 4) + k * (2 * LV_THREADS / 32);
            float p = 0.f;
            const float m = m_s[h];
            if (h < num_q_heads && j < kv_end && m != NEG_INF) p = fast_exp2(sc[k] - m);
            p_s[h * PS + (lane & 15)] = __float2bfloat16(p);
            float sum = p;
#pragma unroll
            for (int o = 8; o > 0; o >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, o);
            if ((lane & 15) == 0) l_s[h] += sum;
        }
        if (it + 1 < n_tiles) load_scores(it + 1);
        cp_async_wait<ST - 1>();  // tile it has landed (the next ST - 1 may be in flight)
        if (FP8) {
            // This thread's own chunks (landed for it after its wait) into the bf16 tile, which
            // every warp finished reading at the previous iteration's closing barrier.
            const unsigned char* src = u_raw + ((size_t)(it % ST) * LV_BN + copy_r) * US;
            // Two chunks at a time: fully unrolled, the eight chunks of one m-tile (512 columns)
            // took 130 registers (3 blocks per SM instead of the bf16 kernel's 4).
#pragma unroll 2
            for (int e = 0; e < CPT; e++) {
                const int c = copy_c + e;
                *reinterpret_cast<uint4*>(u_cvt + copy_r * US + 8 * c) =
                    e4m3x8_to_bf16(*reinterpret_cast<const uint2*>(src + 8 * c));
            }
        }
        __syncthreads();  // p_s (and u_cvt) complete
        const bf16* u =
            FP8 ? u_cvt : reinterpret_cast<const bf16*>(u_raw) + (it % ST) * LV_BN * US;
#pragma unroll
        for (int ks = 0; ks < LV_BN / 16; ks++) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(a[mt], p_s + (16 * mt + (lane & 15)) * PS + 16 * ks + 8 * (lane >> 4));
#pragma unroll
            for (int dp = 0; dp < NTW / 2; dp++) {
                unsigned b[4];
                ldmatrix_x4_trans(b, u + (16 * ks + (lane & 7) + (((lane >> 3) & 1) << 3)) * US +
                                         warp * WN + 16 * dp + 8 * (lane >> 4));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(acc[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_bf16(acc[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        __syncthreads();  // p_s, u_cvt and this stage are rewritten next
    }
    cp_async_wait<0>();
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int n = 0; n < NTW; n++) {
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int h = 16 * mt + g + (e >= 2 ? 8 : 0);
                const int col = c0 + warp * WN + 8 * n + 2 * q4 + (e & 1);
                if (h < num_q_heads && col < value_width)
                    part_acc[(((size_t)i_row * num_q_heads + h) * splits + split) * value_width +
                             col] = acc[mt][n][e];
            }
        }
    }
    if (blockIdx.z == 0) {
        for (int h = tid; h < num_q_heads; h += LV_THREADS)
            part_l[((size_t)i_row * num_q_heads + h) * splits + split] = l_s[h];
    }
}

#define INSTANTIATE_VALUES(MT, ELEM, FP8)                                                        \
    extern "C" __global__ void __launch_bounds__(LV_THREADS) latent_values_mt##MT##_##ELEM(      \
        float* part_acc, float* part_l, const float* scores, const float* part_m,                \
        const bf16* value_plane, int value_width, const unsigned* rows, const unsigned* tok_seq, \
        const unsigned* tok_visible, const unsigned* score_offsets,                              \
        const unsigned* block_tables, int max_blocks, int block_size, int num_q_heads,           \
        int splits, int split_len, const unsigned* plan) {                              \
        pdl_entry();                                                                             \
        latent_values_impl<MT, FP8>(part_acc, part_l, scores, part_m, value_plane, value_width,  \
                                    rows, tok_seq, tok_visible, score_offsets, block_tables,     \
                                    max_blocks, block_size, num_q_heads, splits, split_len,      \
                                    plan);                                                       \
    }
INSTANTIATE_VALUES(1, bf16, false)
INSTANTIATE_VALUES(2, bf16, false)
INSTANTIATE_VALUES(4, bf16, false)
INSTANTIATE_VALUES(1, fp8, true)
INSTANTIATE_VALUES(2, fp8, true)
INSTANTIATE_VALUES(4, fp8, true)

// The splits of one (row, head) merged and normalised: w = Σ 2^(m_s − M) acc_s / Σ 2^(m_s − M) l_s,
// written head-major (W[head][row][c]) for the per-KV-head up-projection GEMM. A row that saw no
// key (a padding row) gets zeros.
extern "C" __global__ void latent_combine_bf16(bf16* __restrict__ w, const float* __restrict__ part_acc,
                                               const float* __restrict__ part_m,
                                               const float* __restrict__ part_l, int num_rows,
                                               int num_q_heads, int value_width, int splits,
                                               const unsigned* __restrict__ plan) {
    pdl_entry();
    // The step's split count (every latent kernel indexes the partials by it).
    int split_len = 1;
    latent_split(plan, splits, split_len);
    const int i_row = blockIdx.x, h = blockIdx.y;
    const size_t base = ((size_t)i_row * num_q_heads + h) * splits;
    combine_splits<true>(w + ((size_t)h * num_rows + i_row) * value_width,
                         part_acc + base * value_width, part_m + base, part_l + base, 1, splits,
                         value_width);
}

// out[rows[i]][h·D + d] = o[h][i][d] + b_v[(h / group)·D + d]: the up-projected values of the
// decode rows, biased, back in the layer's row order.
extern "C" __global__ void latent_value_out_bf16(bf16* __restrict__ out, const bf16* __restrict__ o,
                                                 const bf16* __restrict__ value_bias,
                                                 const unsigned* __restrict__ rows, int num_rows,
                                                 int num_q_heads, int head_dim, int group) {
    pdl_entry();
    const int i_row = blockIdx.x, h = blockIdx.y;
    const int t = (int)rows[i_row];
    for (int d = threadIdx.x; d < head_dim; d += blockDim.x) {
        float v = __bfloat162float(o[((size_t)h * num_rows + i_row) * head_dim + d]);
        if (value_bias != nullptr) v += __bfloat162float(value_bias[(h / group) * head_dim + d]);
        out[(size_t)t * num_q_heads * head_dim + (size_t)h * head_dim + d] = __float2bfloat16(v);
    }
}

// rows[k] = plane[src_slots[k]] (a zero row where src_slots[k] == 0xffffffff) as bf16: the latents
// of the prefill sequences' contexts gathered in scratch-slot order, for the reconstruction GEMMs
// (and reconstruct_kv's). row_elems a multiple of 8 (stored ranks; positions are gathered by their
// own call). `FP8` planes are byte rows, read 8 bytes per chunk and converted exactly.
template <bool FP8>
__device__ void latent_gather_rows_impl(bf16* __restrict__ out, const bf16* __restrict__ plane,
                                        const unsigned* __restrict__ src_slots, size_t count,
                                        int row_elems) {
    const int vpr = row_elems / 8;
    const size_t n = count * vpr;
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < n;
         k += (size_t)gridDim.x * blockDim.x) {
        const size_t r = k / vpr, c = k % vpr;
        const unsigned slot = src_slots[r];
        uint4 v = make_uint4(0u, 0u, 0u, 0u);
        if (slot != 0xffffffffu) {
            const size_t chunk = (size_t)slot * vpr + c;
            v = FP8 ? e4m3x8_to_bf16(reinterpret_cast<const uint2*>(plane)[chunk])
                    : reinterpret_cast<const uint4*>(plane)[chunk];
        }
        reinterpret_cast<uint4*>(out)[k] = v;
    }
}

#define INSTANTIATE_GATHER(NAME, FP8)                                                            \
    extern "C" __global__ void NAME(bf16* out, const bf16* plane, const unsigned* src_slots,      \
                                    size_t count, int row_elems) {                               \
        pdl_entry();                                                                             \
        latent_gather_rows_impl<FP8>(out, plane, src_slots, count, row_elems);                   \
    }
INSTANTIATE_GATHER(latent_gather_rows_bf16, false)
INSTANTIATE_GATHER(latent_gather_rows_fp8, true)

// positions[k] = pos_plane[src_slots[k]] (0 for a padding row).
extern "C" __global__ void latent_gather_positions(unsigned* __restrict__ out,
                                                   const unsigned* __restrict__ pos_plane,
                                                   const unsigned* __restrict__ src_slots,
                                                   size_t count) {
    pdl_entry();
    for (size_t k = blockIdx.x * (size_t)blockDim.x + threadIdx.x; k < count;
         k += (size_t)gridDim.x * blockDim.x) {
        const unsigned slot = src_slots[k];
        out[k] = slot != 0xffffffffu ? pos_plane[slot] : 0u;
    }
}

// The reconstructed rows made keys and values: k += b_k then RoPE at the row's position (the
// rope_qk_bf16 expressions and rounding), v += b_v. k and v are [count][kv_heads · D] bf16.
extern "C" __global__ void latent_finish_kv_bf16(bf16* __restrict__ k, bf16* __restrict__ v,
                                                 const unsigned* __restrict__ positions,
                                                 const bf16* __restrict__ key_bias,
                                                 const bf16* __restrict__ value_bias,
                                                 const float* __restrict__ inv_freq, size_t count,
                                                 int num_kv_heads, int head_dim, int interleaved) {
    pdl_entry();
    const int half = head_dim / 2;
    const int kv = num_kv_heads * head_dim;
    const int items = num_kv_heads * half + kv;  // key pairs, then value elements
    const size_t n = count * items;
    for (size_t idx = blockIdx.x * (size_t)blockDim.x + threadIdx.x; idx < n;
         idx += (size_t)gridDim.x * blockDim.x) {
        const size_t r = idx / items;
        const int item = (int)(idx % items);
        if (item >= num_kv_heads * half) {
            const int e = item - num_kv_heads * half;
            if (value_bias != nullptr) {
                bf16* x = v + r * kv + e;
                *x = __float2bfloat16(__bfloat162float(*x) + __bfloat162float(value_bias[e]));
            }
            continue;
        }
        const int h = item / half, i = item % half;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        bf16* head = k + r * kv + h * head_dim;
        float x0 = __bfloat162float(head[a]), x1 = __bfloat162float(head[b]);
        if (key_bias != nullptr) {
            x0 = __bfloat162float(__float2bfloat16(x0 + __bfloat162float(key_bias[h * head_dim + a])));
            x1 = __bfloat162float(__float2bfloat16(x1 + __bfloat162float(key_bias[h * head_dim + b])));
        }
        float s, c;
        sincosf((float)positions[r] * inv_freq[i], &s, &c);
        head[a] = __float2bfloat16(x0 * c - x1 * s);
        head[b] = __float2bfloat16(x0 * s + x1 * c);
    }
}
