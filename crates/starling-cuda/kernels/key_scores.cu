// Eviction key scores computed next to the paged cache (CPU reference:
// starling-backend cpu::key_scores::key_scores, equal to starling-evict's KeyDiff and KNorm):
//   KNorm:   score_i = -|k_i|
//   KeyDiff: score_i = -cos(k_i, m), m = mean_j(k_j / |k_j|) (zero keys add nothing but count in
//            the mean; a zero denominator scores 0).
// KeyDiff takes three launches: per-chunk sums of unit keys (key_direction_partials_bf16), their
// fixed-order reduction to the mean and its norm (key_direction_mean), then the scores
// (key_scores_bf16, which alone does KNorm). No atomics, so results do not vary between runs.
//
// One CUDA block per (chunk of tokens, KV head), WARPS warps. A head row of D <= 256 bf16 is read
// as 16-byte vectors by LPR lanes (the smallest power of two with LPR * 8 >= D), so a warp covers
// 32 / LPR tokens per pass; the row's sums are reduced over its LPR lanes with xor shuffles
// (offsets below LPR stay inside the lane group). Every loop that contains a shuffle has a
// warp-uniform trip count; lanes past the sequence end carry zeros through it.
// The host prepends pdl.cuh, bf16_vec.cuh (bf16, unpack8), fp8.cuh and kv_elem.cuh (the fp8
// instantiations' element loads).

#define WARPS 8
#define MAX_HEAD_DIM 256

// Flat cache slot of a sequence's physical token t.
__device__ __forceinline__ size_t token_slot(const unsigned* __restrict__ table, int block_size,
                                             int t) {
    return (size_t)table[t / block_size] * block_size + t % block_size;
}

// Elements c0 .. c0+7 of the head row at element `row` of the key plane as f32, zeros past
// head_dim (FP8: a plane of e4m3 bytes, kv_elem.cuh). One vector load when head_dim is a multiple
// of 8 (the row then starts aligned), element loads otherwise.
template <bool FP8>
__device__ __forceinline__ void load8(const bf16* __restrict__ plane, size_t row, int c0,
                                      int head_dim, float* out) {
    if ((head_dim & 7) == 0) {
        if (c0 < head_dim) {
            // One vector load into a register first: unpacking on the dereference itself lets
            // the compiler split it into element loads.
            const uint4 raw = load_kv8<FP8>(plane, row + c0);
            unpack_kv8<FP8>(raw, out);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) out[e] = 0.f;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            out[e] = c0 + e < head_dim ? load_kv1<FP8>(plane, row + c0 + e) : 0.f;
    }
}

// Sum over the lpr lanes of one row's lane group (lpr a power of two <= 32, warp-uniform).
__device__ __forceinline__ float row_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Each scoring kernel reading the key plane is instantiated for both cache elements: NAME_bf16
// and NAME_fp8 call NAME_impl<FP8> with the same arguments.
#define KEY_PLANE_KERNEL(NAME, PARAMS, ARGS)                                                    \
    extern "C" __global__ void NAME##_bf16 PARAMS {                                             \
        pdl_entry();                                                                            \
        NAME##_impl<false> ARGS;                                                                \
    }                                                                                           \
    extern "C" __global__ void NAME##_fp8 PARAMS {                                              \
        pdl_entry();                                                                            \
        NAME##_impl<true> ARGS;                                                                 \
    }

// partials[chunk, h, :] = sum over the chunk's tokens of k / |k| (zero keys skipped).
template <bool FP8>
__device__ void key_direction_partials_impl(
    const bf16* __restrict__ k_cache, const unsigned* __restrict__ table, int block_size, int len,
    int num_kv_heads, int head_dim, int lpr, int tokens_per_block, float* __restrict__ partials) {
    __shared__ float warp_acc[WARPS][MAX_HEAD_DIM];
    const int chunk = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rpw = 32 / lpr, sub = lane / lpr, c0 = (lane % lpr) * 8;
    const int start = chunk * tokens_per_block, end = min(len, start + tokens_per_block);
    float acc[8];
#pragma unroll
    for (int e = 0; e < 8; e++) acc[e] = 0.f;
    for (int base = start + warp * rpw; base < end; base += WARPS * rpw) {
        const int t = base + sub;
        float k[8];
        if (t < end) {
            load8<FP8>(k_cache, (token_slot(table, block_size, t) * num_kv_heads + h) * head_dim,
                       c0, head_dim, k);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) k[e] = 0.f;
        }
        float ss = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) ss += k[e] * k[e];
        const float norm = sqrtf(row_sum(ss, lpr));
        if (norm > 0.f) {
#pragma unroll
            for (int e = 0; e < 8; e++) acc[e] += k[e] / norm;
        }
    }
    // Merge the warp's row groups (lanes with the same c0), then the warps, in a fixed order.
    for (int o = 16; o >= lpr; o >>= 1) {
#pragma unroll
        for (int e = 0; e < 8; e++) acc[e] += __shfl_xor_sync(0xffffffffu, acc[e], o);
    }
    if (sub == 0) {
#pragma unroll
        for (int e = 0; e < 8; e++)
            if (c0 + e < head_dim) warp_acc[warp][c0 + e] = acc[e];
    }
    __syncthreads();
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        float s = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) s += warp_acc[w][c];
        partials[((size_t)chunk * num_kv_heads + h) * head_dim + c] = s;
    }
}
KEY_PLANE_KERNEL(key_direction_partials,
                 (const bf16* __restrict__ k_cache, const unsigned* __restrict__ table,
                  int block_size, int len, int num_kv_heads, int head_dim, int lpr,
                  int tokens_per_block, float* __restrict__ partials),
                 (k_cache, table, block_size, len, num_kv_heads, head_dim, lpr, tokens_per_block,
                  partials))

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. blockDim.x a multiple of 32, <= 1024.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();  // a previous call's readers are done with `partial`
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x >> 5;
    return warp_sum(lane < nwarps ? partial[lane] : 0.f);
}

// mean[h, :] = (sum of the chunks' partials) / len and mean_norm[h] = |mean[h, :]|; one block per
// KV head.
extern "C" __global__ void key_direction_mean(const float* __restrict__ partials, int num_chunks,
                                              int num_kv_heads, int head_dim, int len,
                                              float* __restrict__ mean,
                                              float* __restrict__ mean_norm) {
    pdl_entry();
    const int h = blockIdx.x;
    float sq = 0.f;
    for (int c = threadIdx.x; c < head_dim; c += blockDim.x) {
        float s = 0.f;
        for (int chunk = 0; chunk < num_chunks; chunk++)
            s += partials[((size_t)chunk * num_kv_heads + h) * head_dim + c];
        const float m = s / (float)len;
        mean[h * head_dim + c] = m;
        sq += m * m;
    }
    const float total = block_sum(sq);
    if (threadIdx.x == 0) mean_norm[h] = sqrtf(total);
}

// scores[h, t]: -|k| (key_diff == 0) or -dot(k, m) / (|k| |m|), 0 when that denominator is 0
// (key_diff != 0; mean and mean_norm from key_direction_mean, unread otherwise).
template <bool FP8>
__device__ void key_scores_impl(const bf16* __restrict__ k_cache,
                                const unsigned* __restrict__ table, int block_size, int len,
                                int num_kv_heads, int head_dim, int lpr, int tokens_per_block,
                                const float* __restrict__ mean,
                                const float* __restrict__ mean_norm, int key_diff,
                                float* __restrict__ scores) {
    const int chunk = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rpw = 32 / lpr, sub = lane / lpr, c0 = (lane % lpr) * 8;
    const int start = chunk * tokens_per_block, end = min(len, start + tokens_per_block);
    float m[8];
#pragma unroll
    for (int e = 0; e < 8; e++)
        m[e] = key_diff && c0 + e < head_dim ? mean[h * head_dim + c0 + e] : 0.f;
    const float m_norm = key_diff ? mean_norm[h] : 0.f;
    for (int base = start + warp * rpw; base < end; base += WARPS * rpw) {
        const int t = base + sub;
        float k[8];
        if (t < end) {
            load8<FP8>(k_cache, (token_slot(table, block_size, t) * num_kv_heads + h) * head_dim,
                       c0, head_dim, k);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) k[e] = 0.f;
        }
        float ss = 0.f, dot = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) {
            ss += k[e] * k[e];
            dot += k[e] * m[e];
        }
        ss = row_sum(ss, lpr);
        dot = row_sum(dot, lpr);
        if (t < end && c0 == 0) {
            const float norm = sqrtf(ss);
            float score;
            if (key_diff) {
                const float denom = norm * m_norm;
                score = denom > 0.f ? -dot / denom : 0.f;
            } else {
                score = -norm;
            }
            scores[(size_t)h * len + t] = score;
        }
    }
}
KEY_PLANE_KERNEL(key_scores,
                 (const bf16* __restrict__ k_cache, const unsigned* __restrict__ table,
                  int block_size, int len, int num_kv_heads, int head_dim, int lpr,
                  int tokens_per_block, const float* __restrict__ mean,
                  const float* __restrict__ mean_norm, int key_diff, float* __restrict__ scores),
                 (k_cache, table, block_size, len, num_kv_heads, head_dim, lpr, tokens_per_block,
                  mean, mean_norm, key_diff, scores))

// ---- Observation-window scores (SnapKV, TOVA). CPU reference: starling-backend
// cpu::key_scores::window_scores (equal to starling-evict's SnapKV scorer). For KV head h, the
// R = window * group query rows r = j * group + g (query head h * group + g of window token j, at
// physical position len - window + j) each take a causal softmax over the keys they see; token i
// collects the sum of those weights; tokens before the window are then max-pooled, window tokens
// score +inf. Four launches, no atomics (the same results every run):
//   window_softmax_partials_bf16: per (row, tile of WS_TILE tokens) the tile's max logit and
//     sum of exp(logit - max);
//   window_softmax_combine:       per row the global max M and denominator S (fixed-order merge);
//   window_attention_mass_bf16:   per token sum_r exp(logit - M_r) / S_r;
//   window_pool_scores:           the pooling and the +inf window.
// The first and third launches compute each logit with the same code in the same order, so
// exp(logit - M) never exceeds 1. A block holds one tile of keys as f32 in shared memory (rows
// padded to head_dim + 1 words, so the 32 lanes, one token each, read distinct banks) and each
// warp walks query rows WS_ROWS at a time; queries are f32 in global memory, read by every lane
// of a warp at the same address (a broadcast).

#define WS_TILE 32
#define WS_ROWS 4
// NVRTC has no math.h macros: IEEE infinities by bit pattern.
#define WS_INF (__int_as_float(0x7f800000))
#define WS_NEG_INF (__int_as_float(0xff800000))

// The block's tile of keys (tokens t0 .. t0 + WS_TILE) of KV head h, zeros past len.
template <bool FP8>
__device__ __forceinline__ void load_key_tile(const bf16* __restrict__ k_cache,
                                              const unsigned* __restrict__ table, int block_size,
                                              int len, int num_kv_heads, int head_dim, int h,
                                              int t0, float* __restrict__ ks) {
    const int stride = head_dim + 1;
    for (int idx = threadIdx.x; idx < WS_TILE * head_dim; idx += blockDim.x) {
        const int t = idx / head_dim, c = idx % head_dim, tok = t0 + t;
        ks[t * stride + c] =
            tok < len ? load_kv1<FP8>(k_cache,
                                      (token_slot(table, block_size, tok) * num_kv_heads + h) *
                                              head_dim + c)
                      : 0.f;
    }
    __syncthreads();
}

// Logits of up to WS_ROWS query rows (r0 .. r0 + WS_ROWS, those below `rows`) for the lane's key
// row `k` of the tile; rows past `rows` give 0 (callers mask them). Query row r of head h:
// queries[(j * num_kv_heads * group + h * group + g) * head_dim], j = r / group, g = r % group.
__device__ __forceinline__ void window_logits(const float* __restrict__ queries,
                                              const float* __restrict__ k, int head_dim,
                                              int num_kv_heads, int group, int h, int r0,
                                              int rows, float scale, float* out) {
    const float* q[WS_ROWS];
#pragma unroll
    for (int u = 0; u < WS_ROWS; u++) {
        const int r = min(r0 + u, rows - 1);  // a valid address; the result is masked
        const int j = r / group, g = r % group;
        q[u] = queries + ((size_t)j * num_kv_heads * group + (size_t)h * group + g) * head_dim;
    }
    float acc[WS_ROWS];
#pragma unroll
    for (int u = 0; u < WS_ROWS; u++) acc[u] = 0.f;
    if ((head_dim & 3) == 0) {
        // Rows of a multiple of 4 floats start 16-byte aligned: one vector load of each query
        // row per 4 channels (the kernel is bound by loads, not multiply-adds).
        for (int c = 0; c < head_dim; c += 4) {
            const float k0 = k[c], k1 = k[c + 1], k2 = k[c + 2], k3 = k[c + 3];
#pragma unroll
            for (int u = 0; u < WS_ROWS; u++) {
                const float4 qv = *reinterpret_cast<const float4*>(q[u] + c);
                acc[u] = fmaf(qv.x, k0, acc[u]);
                acc[u] = fmaf(qv.y, k1, acc[u]);
                acc[u] = fmaf(qv.z, k2, acc[u]);
                acc[u] = fmaf(qv.w, k3, acc[u]);
            }
        }
    } else {
        for (int c = 0; c < head_dim; c++) {
            const float kc = k[c];
#pragma unroll
            for (int u = 0; u < WS_ROWS; u++) acc[u] = fmaf(q[u][c], kc, acc[u]);
        }
    }
#pragma unroll
    for (int u = 0; u < WS_ROWS; u++) out[u] = acc[u] * scale;
}

// Whether the key at token `tok` is seen by query row r (window token j = r / group).
__device__ __forceinline__ bool window_visible(int tok, int r, int rows, int group, int len,
                                               int window) {
    return r < rows && tok < len && tok <= len - window + r / group;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

// partials[(h * rows + r) * num_tiles + tile] = (max logit, sum exp(logit - max)) over the tile's
// visible keys; (-inf, 0) when the row sees none of them. Grid (num_tiles, num_kv_heads),
// WARPS * 32 threads.
template <bool FP8>
__device__ void window_softmax_partials_impl(
    const bf16* __restrict__ k_cache, const unsigned* __restrict__ table, int block_size, int len,
    int num_kv_heads, int head_dim, int group, int window, const float* __restrict__ queries,
    float scale, int num_tiles, float2* __restrict__ partials) {
    __shared__ float ks[WS_TILE * (MAX_HEAD_DIM + 1)];
    const int tile = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = window * group, t0 = tile * WS_TILE, tok = t0 + lane;
    load_key_tile<FP8>(k_cache, table, block_size, len, num_kv_heads, head_dim, h, t0, ks);
    const float* k = ks + lane * (head_dim + 1);
    for (int r0 = warp * WS_ROWS; r0 < rows; r0 += WARPS * WS_ROWS) {
        float l[WS_ROWS];
        window_logits(queries, k, head_dim, num_kv_heads, group, h, r0, rows, scale, l);
#pragma unroll
        for (int u = 0; u < WS_ROWS; u++) {
            const int r = r0 + u;
            const bool seen = window_visible(tok, r, rows, group, len, window);
            const float m = warp_max(seen ? l[u] : WS_NEG_INF);
            const float e = seen ? expf(l[u] - m) : 0.f;
            const float s = warp_sum(e);
            if (lane == 0 && r < rows)
                partials[((size_t)h * rows + r) * num_tiles + tile] = make_float2(m, s);
        }
    }
}
KEY_PLANE_KERNEL(window_softmax_partials,
                 (const bf16* __restrict__ k_cache, const unsigned* __restrict__ table,
                  int block_size, int len, int num_kv_heads, int head_dim, int group, int window,
                  const float* __restrict__ queries, float scale, int num_tiles,
                  float2* __restrict__ partials),
                 (k_cache, table, block_size, len, num_kv_heads, head_dim, group, window, queries,
                  scale, num_tiles, partials))

// stats[h * rows + r] = (M, S): the row's max logit and softmax denominator over all tiles. One
// warp per row, WARPS rows per block; lanes stride the tiles, then merge in a fixed order.
extern "C" __global__ void window_softmax_combine(const float2* __restrict__ partials,
                                                  int num_tiles, int total_rows,
                                                  float2* __restrict__ stats) {
    pdl_entry();
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int row = blockIdx.x * WARPS + warp;
    if (row >= total_rows) return;  // warp-uniform
    const float2* p = partials + (size_t)row * num_tiles;
    float m = WS_NEG_INF;
    for (int t = lane; t < num_tiles; t += 32) m = fmaxf(m, p[t].x);
    float s = 0.f;
    for (int t = lane; t < num_tiles; t += 32)
        if (p[t].y > 0.f) s += p[t].y * expf(p[t].x - m);
    const float big = warp_max(m);
    const float scaled = s > 0.f ? s * expf(m - big) : 0.f;
    const float total = warp_sum(scaled);
    if (lane == 0) stats[row] = make_float2(big, total);
}

// mass[h * len + tok] = sum over the rows that see tok of exp(logit - M_r) / S_r. Same grid as
// window_softmax_partials_bf16.
template <bool FP8>
__device__ void window_attention_mass_impl(
    const bf16* __restrict__ k_cache, const unsigned* __restrict__ table, int block_size, int len,
    int num_kv_heads, int head_dim, int group, int window, const float* __restrict__ queries,
    float scale, const float2* __restrict__ stats, float* __restrict__ mass) {
    __shared__ float ks[WS_TILE * (MAX_HEAD_DIM + 1)];
    __shared__ float warp_mass[WARPS][WS_TILE];
    const int tile = blockIdx.x, h = blockIdx.y;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int rows = window * group, t0 = tile * WS_TILE, tok = t0 + lane;
    load_key_tile<FP8>(k_cache, table, block_size, len, num_kv_heads, head_dim, h, t0, ks);
    const float* k = ks + lane * (head_dim + 1);
    float acc = 0.f;
    for (int r0 = warp * WS_ROWS; r0 < rows; r0 += WARPS * WS_ROWS) {
        float l[WS_ROWS];
        window_logits(queries, k, head_dim, num_kv_heads, group, h, r0, rows, scale, l);
#pragma unroll
        for (int u = 0; u < WS_ROWS; u++) {
            const int r = r0 + u;
            if (window_visible(tok, r, rows, group, len, window)) {
                const float2 st = stats[(size_t)h * rows + r];
                acc += expf(l[u] - st.x) / st.y;
            }
        }
    }
    warp_mass[warp][lane] = acc;
    __syncthreads();
    if (warp == 0 && tok < len) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < WARPS; w++) total += warp_mass[w][lane];
        mass[(size_t)h * len + tok] = total;
    }
}
KEY_PLANE_KERNEL(window_attention_mass,
                 (const bf16* __restrict__ k_cache, const unsigned* __restrict__ table,
                  int block_size, int len, int num_kv_heads, int head_dim, int group, int window,
                  const float* __restrict__ queries, float scale, const float2* __restrict__ stats,
                  float* __restrict__ mass),
                 (k_cache, table, block_size, len, num_kv_heads, head_dim, group, window, queries,
                  scale, stats, mass))

// scores[h * len + i]: the max of mass over the pool around i clipped to the len - window tokens
// before the window, or +inf for window tokens. Grid-stride over num_kv_heads * len.
extern "C" __global__ void window_pool_scores(const float* __restrict__ mass, int len,
                                              int num_kv_heads, int window, int pool_kernel,
                                              float* __restrict__ scores) {
    pdl_entry();
    const int prefix = len - window, half = pool_kernel / 2;
    const size_t total = (size_t)num_kv_heads * len;
    for (size_t idx = (size_t)blockIdx.x * blockDim.x + threadIdx.x; idx < total;
         idx += (size_t)gridDim.x * blockDim.x) {
        const int i = (int)(idx % len);
        if (i >= prefix) {
            scores[idx] = WS_INF;
            continue;
        }
        const float* row = mass + (idx - i);
        const int lo = max(0, i - half), hi = min(prefix, i + half + 1);
        float best = WS_NEG_INF;
        for (int t = lo; t < hi; t++) best = fmaxf(best, row[t]);
        scores[idx] = best;
    }
}
