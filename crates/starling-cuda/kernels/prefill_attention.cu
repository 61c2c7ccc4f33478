// Tiled paged attention for prefill chunks (CPU reference: starling-backend
// cpu::attention::paged_attention; decode tokens use decode_attention.cu or attention.cu).
//
// FlashAttention-2 style. One block per (query tile, KV head, context split). A tile is up to
// 64 / group consecutive tokens of ONE sequence; its BM = 64 rows are (token, query head of the
// group) pairs, row r = token * group + head, so each K/V tile staged in shared memory serves
// every query head that shares the KV head (GQA: K/V read once per tile). Four warps own 16 rows
// each; S = Q·Kᵀ and O += P·V run on the tensor cores (mma.sync m16n8k16, bf16 in, f32
// accumulate) with an online softmax in f32 (log2 domain, exp2f). K/V tiles of BN = 64 keys come
// from the paged cache through the block table with 16-byte cp.async copies: V of tile i loads
// while S of tile i is computed, K of tile i+1 while P·V of tile i is. Shared rows are swizzled
// (16-byte chunk c of row r stored at c ^ (r & 7)) so ldmatrix reads are free of bank conflicts.
//
// Causality is the decode kernel's: row r sees the context positions below tok_visible of its
// token (physical lengths, so compacted caches work unchanged). With several splits each block
// covers keys [split * split_len, +split_len) and writes an unnormalised partial in the layout
// attention_combine_bf16 (attention.cu) merges, the same layout the decode kernels write.
//
// The helpers (cp.async, ldmatrix, mma.sync, swizzle, tile copies) are in mma_common.cuh, which
// the host prepends to this source.

#define BM 64        // query rows per block
#define BN 64        // keys per shared-memory tile
#define THREADS 128  // 4 warps x 16 rows

template <int D>
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
    int num_kv_heads, int group, float scale, int splits, int split_len) {
    constexpr int KS = D / 16;  // k-steps of S over the head dim
    constexpr int NT = BN / 8;  // 8-key column tiles of S
    constexpr int DT = D / 8;   // 8-wide column tiles of O
    constexpr int CPR = D / 8, RPP = THREADS / CPR, LPT = BN / RPP;
    static_assert(BM == BN, "Q is staged in the V buffer");

    __shared__ __align__(128) bf16 k_s[BN * D];
    __shared__ __align__(128) bf16 v_s[BN * D];
    __shared__ int warp_visible[THREADS / 32];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, split = blockIdx.z;
    const int first = (int)tiles[2 * blockIdx.x], count = (int)tiles[2 * blockIdx.x + 1];
    const int rows = count * group;
    const int num_q_heads = num_kv_heads * group;
    const unsigned* table = block_tables + (size_t)tok_seq[first] * max_blocks;

    // The tile's largest visible count bounds the key loop (block-uniform, so every thread runs
    // the same iterations and reaches every barrier).
    int vis = 0;
    for (int i = tid; i < count; i += THREADS) vis = max(vis, (int)tok_visible[first + i]);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) vis = max(vis, __shfl_xor_sync(0xffffffffu, vis, o));
    if (lane == 0) warp_visible[warp] = vis;
    __syncthreads();
    int tile_visible = 0;
#pragma unroll
    for (int w = 0; w < THREADS / 32; w++) tile_visible = max(tile_visible, warp_visible[w]);
    const int kv_start = split * split_len;
    const int kv_end = min(kv_start + split_len, tile_visible);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + BN - 1) / BN : 0;

    // This thread's two fragment rows: qr and qr + 8 of the warp's 16.
    const int qr = lane >> 2, qc = lane & 3;
    int row_end[2], row_t[2], row_h[2];
    bool row_ok[2];
#pragma unroll
    for (int i = 0; i < 2; i++) {
        const int r = warp * 16 + qr + 8 * i;
        row_ok[i] = r < rows;
        row_t[i] = first + r / group;
        row_h[i] = kvh * group + r % group;
        // A padding row sees nothing: every score is masked.
        row_end[i] = row_ok[i] ? min((int)tok_visible[row_t[i]], kv_end) : kv_start;
    }

    // Stage Q (in the V buffer) and the first K tile.
    const size_t slot_stride = (size_t)num_kv_heads * D, head_off = (size_t)kvh * D;
    {
        const int c = tid % CPR;
#pragma unroll
        for (int p = 0; p < BM / RPP; p++) {
            const int r = tid / CPR + p * RPP;
            const bool valid = r < rows;
            const bf16* src = valid ? qkv + (size_t)(first + r / group) * qkv_width +
                                          (size_t)(kvh * group + r % group) * D + c * 8
                                    : qkv;
            cp_async16(v_s + swz<D>(r, c), src, valid);
        }
    }
    unsigned slots[LPT];
    tile_slots<D, THREADS, BN>(slots, table, kv_start, kv_end, block_size);
    if (n_tiles > 0) load_tile<D, THREADS, BN>(k_s, k_cache, slots, slot_stride, head_off);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
    unsigned qf[KS][4];
#pragma unroll
    for (int ks = 0; ks < KS; ks++)
        ldmatrix_x4(qf[ks], v_s + swz<D>(warp * 16 + (lane & 15), 2 * ks + (lane >> 4)));
    __syncthreads();  // Q is in registers before the first V tile overwrites it

    float o[DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[dt][0] = o[dt][1] = o[dt][2] = o[dt][3] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};
    const float scale_log2 = scale * LOG2E;

    for (int it = 0; it < n_tiles; it++) {
        const int kb = kv_start + it * BN;
        load_tile<D, THREADS, BN>(v_s, v_cache, slots, slot_stride, head_off);
        cp_async_commit();
        cp_async_wait<1>();  // K of this tile has landed; V may still be in flight
        __syncthreads();

        float s[NT][4];
#pragma unroll
        for (int nt = 0; nt < NT; nt++) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
        for (int ks = 0; ks < KS; ks++) {
#pragma unroll
            for (int np = 0; np < NT / 2; np++) {
                unsigned b[4];
                ldmatrix_x4(b, k_s + swz<D>(np * 16 + (lane & 7) + ((lane >> 4) << 3),
                                            2 * ks + ((lane >> 3) & 1)));
                mma_bf16(s[2 * np], qf[ks], b[0], b[1]);
                mma_bf16(s[2 * np + 1], qf[ks], b[2], b[3]);
            }
        }
        __syncthreads();  // every warp has read this K tile: prefetch the next one over it
        if (it + 1 < n_tiles) {
            tile_slots<D, THREADS, BN>(slots, table, kb + BN, kv_end, block_size);
            load_tile<D, THREADS, BN>(k_s, k_cache, slots, slot_stride, head_off);
        }
        cp_async_commit();  // possibly empty: keeps the group count uniform for the waits

        // Online softmax per row (each row's 64 scores are spread over a quad of lanes).
#pragma unroll
        for (int i = 0; i < 2; i++) {
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb + nt * 8 + 2 * qc + e;
                    const float v = key < row_end[i] ? s[nt][2 * i + e] * scale_log2 : NEG_INF;
                    s[nt][2 * i + e] = v;
                    mx = fmaxf(mx, v);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[i], mx);
            // Nothing seen yet: any finite base keeps exp2f(-inf - base) = 0 (no NaN).
            const float base = m_new == NEG_INF ? 0.f : m_new;
            const float corr = exp2f(m[i] - base);
            m[i] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = exp2f(s[nt][2 * i + e] - base);
                    s[nt][2 * i + e] = p;
                    sum += p;
                }
            }
            l[i] = l[i] * corr + sum;  // this lane's share; the quad is summed at the end
#pragma unroll
            for (int dt = 0; dt < DT; dt++) {
                o[dt][2 * i] *= corr;
                o[dt][2 * i + 1] *= corr;
            }
        }

        cp_async_wait<1>();  // V of this tile has landed (the K prefetch may be in flight)
        __syncthreads();
        // O += P·V: S's accumulator fragments of two 8-key tiles are P's A fragment.
#pragma unroll
        for (int kk = 0; kk < BN / 16; kk++) {
            const unsigned a[4] = {pack_bf16(s[2 * kk][0], s[2 * kk][1]),
                                   pack_bf16(s[2 * kk][2], s[2 * kk][3]),
                                   pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]),
                                   pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3])};
#pragma unroll
            for (int dp = 0; dp < DT / 2; dp++) {
                unsigned b[4];
                ldmatrix_x4_trans(b, v_s + swz<D>(kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3),
                                                  2 * dp + (lane >> 4)));
                mma_bf16(o[2 * dp], a, b[0], b[1]);
                mma_bf16(o[2 * dp + 1], a, b[2], b[3]);
            }
        }
        __syncthreads();  // every warp has read this V tile before the next one is copied over it
    }

#pragma unroll
    for (int i = 0; i < 2; i++) {
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 1);
        l[i] += __shfl_xor_sync(0xffffffffu, l[i], 2);
    }
#pragma unroll
    for (int i = 0; i < 2; i++) {
        if (!row_ok[i]) continue;  // padding rows belong to no token: write nothing
        const size_t t = (size_t)row_t[i], h = (size_t)row_h[i];
        if (splits == 1) {
            const float inv = l[i] > 0.f ? 1.f / l[i] : 0.f;
            bf16* dst = out + t * num_q_heads * D + h * D + 2 * qc;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                    __floats2bfloat162_rn(o[dt][2 * i] * inv, o[dt][2 * i + 1] * inv);
        } else {
            const size_t base = (t * num_q_heads + h) * splits + split;
            float* dst = part_acc + base * D + 2 * qc;
#pragma unroll
            for (int dt = 0; dt < DT; dt++)
                *reinterpret_cast<float2*>(dst + dt * 8) = make_float2(o[dt][2 * i], o[dt][2 * i + 1]);
            if (qc == 0) {
                // The combine works in natural-log units, as the decode kernel's partials.
                part_ml[base * 2] = m[i] * LN2;
                part_ml[base * 2 + 1] = l[i];
            }
        }
    }
}

#define INSTANTIATE(D)                                                                          \
    extern "C" __global__ void __launch_bounds__(THREADS, 2) prefill_attention_d##D##_bf16(     \
        bf16* out, float* part_acc, float* part_ml, const bf16* qkv, int qkv_width,             \
        const bf16* k_cache, const bf16* v_cache, const unsigned* tiles, const unsigned* tok_seq, \
        const unsigned* tok_visible, const unsigned* block_tables, int max_blocks,              \
        int block_size, int num_kv_heads, int group, float scale, int splits, int split_len) {  \
        prefill_attention_impl<D>(out, part_acc, part_ml, qkv, qkv_width, k_cache, v_cache,   \
                                  tiles, tok_seq, tok_visible, block_tables, max_blocks,        \
                                  block_size, num_kv_heads, group, scale, splits, split_len);   \
    }
INSTANTIATE(64)
INSTANTIATE(128)
