// Tiled paged attention for prefill chunks (CPU reference: starling-backend
// cpu::attention::paged_attention; decode tokens use decode_attention.cu or attention.cu).
//
// FlashAttention-2 style. One block per (query tile, KV head, context split). A tile is up to
// BM / group consecutive tokens of ONE sequence; its BM = 128 rows are (token, query head of the
// group) pairs, row r = token * group + head, so each K/V tile staged in shared memory serves
// every query head that shares the KV head (GQA: K/V read once per tile, for twice the rows of
// the former 64-row tiles: half the global and cp.async traffic per flop). WARPS warps own
// WARP_MT 16-row m-tiles each (below); S = Q·Kᵀ and O += P·V run on the tensor cores (mma.sync
// m16n8k16, bf16 in, f32 accumulate) with an online softmax in f32 (log2 domain, exp2f). A warp
// with two m-tiles reuses each K/V fragment it loads for both (half the ldmatrix traffic per
// flop, at twice the accumulator registers): the geometry is a compile-time choice.
//
// K/V tiles of BN = 64 keys come from the paged cache through the block table with 16-byte
// cp.async copies into a ring of STAGES (K, V) tile pairs in dynamic shared memory, so the next
// STAGES - 1 tiles load while one is computed (one barrier per tile). Q stays in shared memory
// (ldmatrix per k-step) rather than registers, which keeps the accumulators within the register
// budget of two resident blocks. Shared rows are swizzled (16-byte chunk c of row r stored at
// c ^ (r & 7)) so ldmatrix reads are free of bank conflicts.
//
// Causality is the decode kernel's: row r sees the context positions below tok_visible of its
// token (physical lengths, so compacted caches work unchanged), and under a sliding window only
// those from tok_visible - window on. A tile's keys start at its first row's window start; with
// several splits each block covers keys [that start + split * split_len, +split_len) and writes an unnormalised partial in the layout
// attention_combine_bf16 (attention.cu) merges, the same layout the decode kernels write.
//
// The helpers (cp.async, ldmatrix, mma.sync, swizzle, tile copies) are in mma_common.cuh, the
// tile's key range, row bounds, online softmax and output write in prefill_common.cuh (shared
// with the Hopper kernel, prefill_wgmma.cu), the fp8 conversions in fp8.cuh; the host prepends
// all three to this source.

#define BM 128          // query rows per block (host: PREFILL_TILE_ROWS)
#define BN 64           // keys per shared-memory tile (host: PREFILL_TILE_KEYS)
// Block geometry: BM = WARPS * 16 * WARP_MT, THREADS = WARPS * 32. Four warps of two m-tiles
// (FlashAttention-2's layout) need about 255 registers and do not spill (ptxas, sm_90), so two
// blocks (8 warps) are resident per SM; eight warps of one m-tile were capped at 128 registers for
// the same residency and spilled at head_dim 128 while loading every K/V fragment twice as often.
#define WARPS 4         // warps per block
#define WARP_MT 2       // 16-row m-tiles per warp
#define THREADS 128     // host: PREFILL_THREADS
#define MIN_BLOCKS 2    // resident blocks per SM the register allocation must allow
#define STAGES_D64 3    // (K, V) tile pairs in the ring at head_dim 64 (host: prefill_stages)
#define STAGES_D128 2   // ... at head_dim 128: 96 KiB with Q, two blocks per SM

static_assert(BM == WARPS * 16 * WARP_MT && THREADS == WARPS * 32, "tile geometry");

// FP8: the planes hold e4m3 bytes; the ring stages fp8 tiles and each tile is converted into one
// bf16 (K, V) pair behind it before the mma loops (decode_attention.cu's scheme: a second
// barrier per tile). Host: prefill_shared_bytes(D, fp8).
template <int D, int STAGES, bool FP8>
__device__ void prefill_attention_impl(
    bf16* __restrict__ out,             // [T, Hq*D] (splits == 1)
    float* __restrict__ part_acc,       // [T, Hq, splits, D] (splits > 1)
    float* __restrict__ part_ml,        // [T, Hq, splits, 2]
    const bf16* __restrict__ qkv, int qkv_width,
    const bf16* __restrict__ k_cache, const bf16* __restrict__ v_cache,
    const unsigned* __restrict__ tiles,        // (first token, tokens) per query tile
    const unsigned* __restrict__ tok_seq,      // sequence of each query token
    const unsigned* __restrict__ tok_visible,  // context positions each query token sees
    const unsigned* __restrict__ block_tables, int max_blocks, int block_size,
    int num_kv_heads, int group, float scale,
    int window,                                // sliding-window reach; 0: the whole context
    int splits, int split_len) {
    constexpr int KS = D / 16;       // k-steps of S over the head dim
    constexpr int NT = BN / 8;       // 8-key column tiles of S
    constexpr int DT = D / 8;        // 8-wide column tiles of O
    constexpr int MT = WARP_MT;      // 16-row m-tiles of this warp
    constexpr int TILE = BN * D;     // elements of one K or V tile
    typedef TileCopy<FP8 ? D / 2 : D, THREADS, BN> Copy;
    typedef TileCopy<D, THREADS, BM> QCopy;
    static_assert(STAGES >= 2, "the ring needs a stage in flight");

    // Q [BM][D], then stage s of the ring: K at (2s)·TILE, V at (2s + 1)·TILE (host:
    // prefill_shared_bytes).
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* q_s = reinterpret_cast<bf16*>(smem_raw);
    bf16* ring = q_s + BM * D;
    unsigned char* ring8 = reinterpret_cast<unsigned char*>(ring);  // FP8: the ring in bytes
    bf16* k_conv = reinterpret_cast<bf16*>(ring8 + STAGES * 2 * TILE);  // FP8 only
    bf16* v_conv = k_conv + TILE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int num_q_heads = num_kv_heads * group;
    const int qc = lane & 3;
    const PrefillTile<MT> tile = prefill_tile<THREADS, WARPS, MT, BN>(
        tiles, tok_seq, tok_visible, block_tables, max_blocks, group, window, split, split_len);
    const int first = tile.first, rows = tile.rows, kv_start = tile.kv_start, kv_end = tile.kv_end;

    // Prologue: Q (padding rows zero-filled) and the first STAGES - 1 K/V tiles go in flight,
    // one commit group per tile (Q joins tile 0's; groups may be empty, so the count stays
    // uniform for the waits).
    const size_t slot_stride = (size_t)num_kv_heads * D, head_off = (size_t)kvh * D;
    // Issues the copies of the K and V tiles starting at key `kb` into ring stage `s`.
    auto load_kv_tiles = [&](int s, int kb) {
        unsigned slots[Copy::LPT];
        if constexpr (FP8) {
            tile_slots<D / 2, THREADS, BN>(slots, tile.table, kb, kv_end, block_size);
            load_tile_fp8<D, THREADS, BN>(ring8 + 2 * s * TILE, k_cache, slots, slot_stride,
                                          head_off);
            load_tile_fp8<D, THREADS, BN>(ring8 + (2 * s + 1) * TILE, v_cache, slots,
                                          slot_stride, head_off);
        } else {
            tile_slots<D, THREADS, BN>(slots, tile.table, kb, kv_end, block_size);
            load_tile<D, THREADS, BN>(ring + 2 * s * TILE, k_cache, slots, slot_stride, head_off);
            load_tile<D, THREADS, BN>(ring + (2 * s + 1) * TILE, v_cache, slots, slot_stride,
                                      head_off);
        }
    };
    {
        const int c = tid % QCopy::CPR;
#pragma unroll
        for (int p = 0; p < QCopy::LPT; p++) {
            const int r = tid / QCopy::CPR + p * QCopy::RPP;
            const bool valid = r < rows;
            const bf16* src = valid ? qkv + (size_t)(first + r / group) * qkv_width +
                                          (size_t)(kvh * group + r % group) * D + c * 8
                                    : qkv;
            cp_async16(q_s + swz<D>(r, c), src, valid);
        }
    }
#pragma unroll
    for (int s = 0; s < STAGES - 1; s++) {
        if (s < tile.n_tiles) load_kv_tiles(s, kv_start + s * BN);
        cp_async_commit();
    }

    float o[MT][DT][4];
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            o[mt][dt][0] = o[mt][dt][1] = o[mt][dt][2] = o[mt][dt][3] = 0.f;
    float m[MT][2], l[MT][2];
#pragma unroll
    for (int mt = 0; mt < MT; mt++) m[mt][0] = m[mt][1] = NEG_INF, l[mt][0] = l[mt][1] = 0.f;
    const float scale_log2 = scale * LOG2E;

    for (int it = 0; it < tile.n_tiles; it++) {
        cp_async_wait<STAGES - 2>();  // tile `it` (and Q) has landed (this thread's copies)
        __syncthreads();  // ... everyone's; and every warp is done with tile it - 1's stage
        {
            // Refill the stage tile it - 1 used with tile it + STAGES - 1.
            const int next = it + STAGES - 1;
            if (next < tile.n_tiles) load_kv_tiles(next % STAGES, kv_start + next * BN);
            cp_async_commit();
        }
        const bf16* k_s = ring + 2 * (it % STAGES) * TILE;
        const bf16* v_s = k_s + TILE;
        if constexpr (FP8) {
            const unsigned char* staged = ring8 + 2 * (it % STAGES) * TILE;
            convert_tile_fp8<D, THREADS, BN>(k_conv, staged);
            convert_tile_fp8<D, THREADS, BN>(v_conv, staged + TILE);
            __syncthreads();  // every thread's conversions before anyone's mma reads
            k_s = k_conv;
            v_s = v_conv;
        }
        const int kb = kv_start + it * BN;

        float s[MT][NT][4];
#pragma unroll
        for (int mt = 0; mt < MT; mt++)
#pragma unroll
            for (int nt = 0; nt < NT; nt++)
                s[mt][nt][0] = s[mt][nt][1] = s[mt][nt][2] = s[mt][nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            unsigned qa[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++)
                ldmatrix_x4(qa[mt], q_s + swz<D>((warp * MT + mt) * 16 + (lane & 15),
                                                 2 * ks + (lane >> 4)));
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                unsigned b[4];
                ldmatrix_x4(b, k_s + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                            2 * ks + ((lane >> 3) & 1)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(s[mt][2 * np], qa[mt], b[0], b[1]);
                    mma_bf16(s[mt][2 * np + 1], qa[mt], b[2], b[3]);
                }
            }
        }

        // Online softmax per row (each row's 64 scores are spread over a quad of lanes). Only a
        // tile reaching past some row's end (the diagonal, the context's end) or before some
        // row's window start needs the mask.
        if (kb >= tile.warp_full_start && kb + BN <= tile.warp_full_end)
            online_softmax_tile<false, MT, NT, DT>(s, o, m, l, tile.row_visible, kv_end,
                                                  window, kb, qc, scale_log2);
        else
            online_softmax_tile<true, MT, NT, DT>(s, o, m, l, tile.row_visible, kv_end,
                                                  window, kb, qc, scale_log2);

        // O += P·V: S's accumulator fragments of two 8-key tiles are P's A fragment.
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            unsigned a[MT][4];
#pragma unroll
            for (int mt = 0; mt < MT; mt++) {
                a[mt][0] = pack_bf16(s[mt][2 * kk][0], s[mt][2 * kk][1]);
                a[mt][1] = pack_bf16(s[mt][2 * kk][2], s[mt][2 * kk][3]);
                a[mt][2] = pack_bf16(s[mt][2 * kk + 1][0], s[mt][2 * kk + 1][1]);
                a[mt][3] = pack_bf16(s[mt][2 * kk + 1][2], s[mt][2 * kk + 1][3]);
            }
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                unsigned b[4];
                ldmatrix_x4_trans(b, v_s + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                  2 * dp + (lane >> 4)));
#pragma unroll
                for (int mt = 0; mt < MT; mt++) {
                    mma_bf16(o[mt][2 * dp], a[mt], b[0], b[1]);
                    mma_bf16(o[mt][2 * dp + 1], a[mt], b[2], b[3]);
                }
            }
        }
        // The next iteration's barrier orders these reads before the stage is refilled.
    }
    // No copy may land in shared memory after the block exits (a block with no key tile never
    // waited for its Q copies).
    cp_async_wait<0>();

    prefill_write_rows<MT, DT>(o, m, l, first, rows, group, kvh, num_q_heads, splits, split, out,
                               part_acc, part_ml);
}

#define INSTANTIATE_ELEM(D, ELEM, FP8)                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, MIN_BLOCKS)                          \
        prefill_attention_d##D##_##ELEM(                                                        \
            bf16* out, float* part_acc, float* part_ml, const bf16* qkv, int qkv_width,         \
            const bf16* k_cache, const bf16* v_cache, const unsigned* tiles,                    \
            const unsigned* tok_seq, const unsigned* tok_visible, const unsigned* block_tables, \
            int max_blocks, int block_size, int num_kv_heads, int group, float scale,           \
            int window, int splits, int split_len) {                                            \
        pdl_entry();                                                                            \
        prefill_attention_impl<D, STAGES_D##D, FP8>(                                            \
            out, part_acc, part_ml, qkv, qkv_width, k_cache, v_cache, tiles, tok_seq,           \
            tok_visible, block_tables, max_blocks, block_size, num_kv_heads, group, scale,      \
            window, splits, split_len);                                                         \
    }
#define INSTANTIATE(D) INSTANTIATE_ELEM(D, bf16, false) INSTANTIATE_ELEM(D, fp8, true)
INSTANTIATE(64)
INSTANTIATE(128)
