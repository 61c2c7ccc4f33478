// Tensor-core paged decode attention for grouped-query models (CPU reference: starling-backend
// cpu::attention::paged_attention). MHA decode rows and head widths other than 64/128 keep the
// per-token kernel (attention.cu); prefill chunks use prefill_attention.cu.
//
// One block per (query token, KV head, context split), as attention.cu, but the G ≤ 8 query heads
// sharing the KV head are the M rows of mma.sync m16n8k16 (row r = head r of the group; rows
// G..15 are zero and never written). The per-token kernel spent, per K row and lane, G shuffle
// reductions and G exponentials: arithmetic-bound at batch ≥ 16. Here S = Q·Kᵀ and O += P·V run on
// the tensor cores and the softmax costs 4 exponentials per lane per 16 keys whatever G is.
//
// K/V tiles of DM_BN = 64 keys are copied from the paged cache through the block table by all
// 128 threads with 16-byte cp.async copies into a ring of DM_STAGES tiles (dynamic shared memory,
// swizzled as the prefill kernel's), so DM_STAGES - 1 tiles (64 KiB at head_dim 128) are in flight
// while one is computed: decode is bound by bytes in flight. Each of the four warps owns 16 keys of
// every tile and keeps its own online softmax (log2 domain); the warps are merged in shared memory
// at the end. Every K/V byte is read from global memory once per (token, KV head).
//
// Causality and compaction are attention.cu's: the token sees the context positions below
// tok_visible (physical lengths), from tok_visible - window on under a sliding window. With
// several splits each block covers keys [first + split * split_len, +split_len) and writes an unnormalised partial in natural-log units that
// attention_combine_bf16 (attention.cu) merges.
//
// The helpers (cp.async, ldmatrix, mma.sync, swizzle, tile copies) are in mma_common.cuh, the
// parameter list and the split-plan read shared with attention.cu in decode_common.cuh, the fp8
// conversions in fp8.cuh; the host prepends them to this source.

#define DM_THREADS 128   // 4 warps
#define DM_WARPS 4
#define DM_BN 64         // keys per tile: 16 per warp
#define DM_STAGES 3      // tiles in the shared-memory ring (host: DECODE_MMA_STAGES)
#define DM_MAX_GROUP 8   // query heads per KV head: rows 0..7 of the 16-row fragment

// FP8: the planes hold e4m3 bytes. The ring then stages fp8 tiles (TILE bytes each), and after
// the copies of tile `it` land each thread converts the chunks it copied into one bf16 (K, V)
// pair behind the ring (mma_common.cuh: convert_tile_fp8); a second barrier per tile orders the
// conversions before the mma loops (the first orders the previous tile's reads of the pair
// before they are overwritten). Host: decode_mma_shared_bytes(D, fp8).
template <int D, bool FP8>
__device__ void decode_attention_mma_impl(DECODE_ATTENTION_PARAMS) {
    if (!decode_split_in_plan(plan, splits, split_len)) return;
    constexpr int KS = D / 16;      // k-steps of S over the head dim
    constexpr int DT = D / 8;       // 8-wide column tiles of O
    constexpr int TILE = DM_BN * D; // elements of one K or V tile
    constexpr int ELEM_BYTES = FP8 ? 1 : 2;
    typedef TileCopy<FP8 ? D / 2 : D, DM_THREADS, DM_BN> Copy;
    // The warp merge reuses the ring: it must fit.
    static_assert(DM_WARPS * DM_MAX_GROUP * (D + 2) * 4 <= DM_STAGES * 2 * TILE * ELEM_BYTES,
                  "merge scratch exceeds the tile ring");

    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* ring = reinterpret_cast<bf16*>(smem_raw);  // stage s: K at 2s·TILE, V at (2s+1)·TILE
    unsigned char* ring8 = smem_raw;                  // FP8: the same ring, in bytes
    bf16* k_conv = reinterpret_cast<bf16*>(smem_raw + DM_STAGES * 2 * TILE);  // FP8 only
    bf16* v_conv = k_conv + TILE;

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int t = (int)rows[blockIdx.x], kvh = blockIdx.y, split = blockIdx.z;
    const int num_q_heads = num_kv_heads * group;
    const int visible = (int)tok_visible[t];
    const int kv_start = window_first_key(visible, window) + split * split_len;
    const int kv_end = min(visible, kv_start + split_len);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + DM_BN - 1) / DM_BN : 0;
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;
    const size_t slot_stride = (size_t)num_kv_heads * D, head_off = (size_t)kvh * D;
    // Issues the copies of the K and V tiles starting at key `kb` into ring stage `s`.
    auto load_kv_tiles = [&](int s, int kb) {
        unsigned slots[Copy::LPT];
        if constexpr (FP8) {
            tile_slots<D / 2, DM_THREADS, DM_BN>(slots, table, kb, kv_end, block_size);
            load_tile_fp8<D, DM_THREADS, DM_BN>(ring8 + 2 * s * TILE, k_cache, slots, slot_stride,
                                                head_off);
            load_tile_fp8<D, DM_THREADS, DM_BN>(ring8 + (2 * s + 1) * TILE, v_cache, slots,
                                                slot_stride, head_off);
        } else {
            tile_slots<D, DM_THREADS, DM_BN>(slots, table, kb, kv_end, block_size);
            load_tile<D, DM_THREADS, DM_BN>(ring + 2 * s * TILE, k_cache, slots, slot_stride,
                                            head_off);
            load_tile<D, DM_THREADS, DM_BN>(ring + (2 * s + 1) * TILE, v_cache, slots,
                                            slot_stride, head_off);
        }
    };

    // Prologue: the first DM_STAGES - 1 tiles go in flight before anything else, one commit group
    // per tile (possibly empty, so the group count stays uniform for the waits).
#pragma unroll
    for (int s = 0; s < DM_STAGES - 1; s++) {
        if (s < n_tiles)
            load_kv_tiles(s, kv_start + s * DM_BN);
        cp_async_commit();
    }

    // Q fragments straight from global memory (tiny, and read while the tiles are in flight):
    // this lane's row qr = head qr of the group, columns 2qc, 2qc + 1 (a0) and + 8 (a2) of each
    // k-step. Rows 8..15 of the fragment (a1, a3) are zero, so only rows < 8 are ever computed.
    const int qr = lane >> 2, qc = lane & 3;
    const bool row_ok = qr < group;
    unsigned qa[KS][2];
    {
        const bf16* q = qkv + (size_t)t * qkv_width + (size_t)(kvh * group + qr) * D + 2 * qc;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            qa[ks][0] = row_ok ? *reinterpret_cast<const unsigned*>(q + 16 * ks) : 0u;
            qa[ks][1] = row_ok ? *reinterpret_cast<const unsigned*>(q + 16 * ks + 8) : 0u;
        }
    }

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m = NEG_INF, l = 0.f;  // row qr's running max (log2 units) and this lane's share of l
    const float scale_log2 = scale * LOG2E;

    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<DM_STAGES - 2>();  // tile `it` has landed (this thread's copies)
        __syncthreads();  // ... everyone's; and every warp is done with tile it - 1's stage
        {
            // Refill the stage tile it - 1 used with tile it + DM_STAGES - 1.
            const int next = it + DM_STAGES - 1;
            if (next < n_tiles) load_kv_tiles(next % DM_STAGES, kv_start + next * DM_BN);
            cp_async_commit();
        }
        const bf16* k_s = ring + 2 * (it % DM_STAGES) * TILE;
        const bf16* v_s = k_s + TILE;
        if constexpr (FP8) {
            const unsigned char* staged = ring8 + 2 * (it % DM_STAGES) * TILE;
            convert_tile_fp8<D, DM_THREADS, DM_BN>(k_conv, staged);
            convert_tile_fp8<D, DM_THREADS, DM_BN>(v_conv, staged + TILE);
            __syncthreads();  // every thread's conversions before anyone's mma reads
            k_s = k_conv;
            v_s = v_conv;
        }
        const int wk = warp * 16;                        // this warp's first key row in the tile
        const int kb = kv_start + it * DM_BN + wk;       // ... and its context position

        // S[16 x 16] = Q · Kᵀ over this warp's 16 keys: s[0] keys 0..7, s[1] keys 8..15.
        float s[2][4];
#pragma unroll
        for (int nt = 0; nt < 2; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
            unsigned b[4];
            ldmatrix_x4(b, k_s + swz<D>(wk + (lane & 7) + ((lane >> 4) << 3),
                                        2 * ks + ((lane >> 3) & 1)));
            const unsigned a[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
            mma_bf16(s[0], a, b[0], b[1]);
            mma_bf16(s[1], a, b[2], b[3]);
        }

        // Online softmax of row qr (its 16 scores are spread over a quad of lanes; c2, c3 belong
        // to the zero rows 8..15 and are ignored).
        float mx = NEG_INF;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const int key = kb + nt * 8 + 2 * qc + e;
                const float v = key < kv_end ? s[nt][e] * scale_log2 : NEG_INF;
                s[nt][e] = v;
                mx = fmaxf(mx, v);
            }
        }
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
        const float m_new = fmaxf(m, mx);
        // Nothing seen yet: any finite base keeps exp2f(-inf - base) = 0 (no NaN).
        const float base = m_new == NEG_INF ? 0.f : m_new;
        const float corr = exp2f(m - base);
        m = m_new;
        float sum = 0.f;
#pragma unroll
        for (int nt = 0; nt < 2; nt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                const float p = exp2f(s[nt][e] - base);
                s[nt][e] = p;
                sum += p;
            }
        }
        l = l * corr + sum;
#pragma unroll
        for (int dt = 0; dt < DT; dt++) {
            o[dt][0] *= corr;
            o[dt][1] *= corr;
        }

        // O += P · V: the S accumulators of the two 8-key tiles are P's A fragment (k = the
        // warp's 16 keys); V comes transposed out of the swizzled tile.
        const unsigned pa[4] = {pack_bf16(s[0][0], s[0][1]), 0u, pack_bf16(s[1][0], s[1][1]), 0u};
#pragma unroll
        for (int dp = 0; dp < DT / 2; dp++) {
            unsigned b[4];
            ldmatrix_x4_trans(b, v_s + swz<D>(wk + (lane & 7) + (((lane >> 3) & 1) << 3),
                                              2 * dp + (lane >> 4)));
            mma_bf16(o[2 * dp], pa, b[0], b[1]);
            mma_bf16(o[2 * dp + 1], pa, b[2], b[3]);
        }
    }

    // Merge the four warps (each saw its own 16 keys of every tile) through the ring.
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    cp_async_wait<0>();  // only empty groups can be left, but the ring is about to be reused
    __syncthreads();
    float* ml_s = reinterpret_cast<float*>(smem_raw);  // [DM_WARPS][DM_MAX_GROUP][2]
    float* acc_s = ml_s + DM_WARPS * DM_MAX_GROUP * 2;  // [DM_WARPS][DM_MAX_GROUP][D]
    if (row_ok) {
        const int r = warp * DM_MAX_GROUP + qr;
        if (qc == 0) {
            ml_s[2 * r] = m;
            ml_s[2 * r + 1] = l;
        }
        float* dst = acc_s + (size_t)r * D + 2 * qc;
#pragma unroll
        for (int dt = 0; dt < DT; dt++)
            *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][0], o[dt][1]);
    }
    __syncthreads();
    for (int i = tid; i < group * D; i += DM_THREADS) {
        const int g = i / D, d = i % D;
        float m_max = NEG_INF;
#pragma unroll
        for (int w = 0; w < DM_WARPS; w++) m_max = fmaxf(m_max, ml_s[2 * (w * DM_MAX_GROUP + g)]);
        float acc = 0.f, den = 0.f;
#pragma unroll
        for (int w = 0; w < DM_WARPS; w++) {
            const int r = w * DM_MAX_GROUP + g;
            const float mw = ml_s[2 * r];
            if (mw == NEG_INF) continue;  // this warp saw no key of the split
            const float wgt = exp2f(mw - m_max);
            acc += acc_s[(size_t)r * D + d] * wgt;
            den += ml_s[2 * r + 1] * wgt;
        }
        const size_t h = (size_t)kvh * group + g;
        if (splits == 1) {
            out[(size_t)t * num_q_heads * D + h * D + d] = __float2bfloat16(den > 0.f ? acc / den : 0.f);
        } else {
            const size_t base = ((size_t)t * num_q_heads + h) * splits + split;
            part_acc[base * D + d] = acc;
            if (d == 0) {
                // Natural-log units, as the per-token kernel's partials (-inf stays -inf: an
                // empty split, which the combine skips).
                part_ml[base * 2] = m_max * LN2;
                part_ml[base * 2 + 1] = den;
            }
        }
    }
}

#define INSTANTIATE_ELEM(D, ELEM, FP8)                                                           \
    extern "C" __global__ void __launch_bounds__(DM_THREADS) decode_attention_mma_d##D##_##ELEM( \
        bf16* out, float* part_acc, float* part_ml, const bf16* qkv, int qkv_width,              \
        const bf16* k_cache, const bf16* v_cache, const unsigned* rows, const unsigned* tok_seq, \
        const unsigned* tok_visible, const unsigned* block_tables, int max_blocks,               \
        int block_size, int num_kv_heads, int group, float scale, int window, int splits,       \
        int split_len, const unsigned* plan) {                                                   \
        pdl_entry();                                                                             \
        decode_attention_mma_impl<D, FP8>(out, part_acc, part_ml, qkv, qkv_width, k_cache,      \
                                          v_cache, rows, tok_seq, tok_visible, block_tables,     \
                                          max_blocks, block_size, num_kv_heads, group, scale,    \
                                          window, splits, split_len, plan);                      \
    }
#define INSTANTIATE(D) INSTANTIATE_ELEM(D, bf16, false) INSTANTIATE_ELEM(D, fp8, true)
INSTANTIATE(64)
INSTANTIATE(128)
