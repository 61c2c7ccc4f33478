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
// The host prepends pdl.cuh and bf16_vec.cuh (bf16, unpack8).

#define WARPS 8
#define MAX_HEAD_DIM 256

// Flat cache slot of a sequence's physical token t.
__device__ __forceinline__ size_t token_slot(const unsigned* __restrict__ table, int block_size,
                                             int t) {
    return (size_t)table[t / block_size] * block_size + t % block_size;
}

// Elements c0 .. c0+7 of a head row as f32, zeros past head_dim. 16-byte load when head_dim is a
// multiple of 8 (the row then starts 16-byte aligned), element loads otherwise.
__device__ __forceinline__ void load8(const bf16* __restrict__ row, int c0, int head_dim,
                                      float* out) {
    if ((head_dim & 7) == 0) {
        if (c0 < head_dim) {
            // One 16-byte load into a register first: unpack8 on the dereference itself lets
            // the compiler split it into eight 2-byte loads.
            const uint4 raw = *reinterpret_cast<const uint4*>(row + c0);
            unpack8(raw, out);
        } else {
#pragma unroll
            for (int e = 0; e < 8; e++) out[e] = 0.f;
        }
    } else {
#pragma unroll
        for (int e = 0; e < 8; e++)
            out[e] = c0 + e < head_dim ? __bfloat162float(row[c0 + e]) : 0.f;
    }
}

// Sum over the lpr lanes of one row's lane group (lpr a power of two <= 32, warp-uniform).
__device__ __forceinline__ float row_sum(float v, int lpr) {
    for (int o = lpr >> 1; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// partials[chunk, h, :] = sum over the chunk's tokens of k / |k| (zero keys skipped).
extern "C" __global__ void key_direction_partials_bf16(
    const bf16* __restrict__ k_cache, const unsigned* __restrict__ table, int block_size, int len,
    int num_kv_heads, int head_dim, int lpr, int tokens_per_block, float* __restrict__ partials) {
    pdl_entry();
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
            load8(k_cache + (token_slot(table, block_size, t) * num_kv_heads + h) * head_dim, c0,
                  head_dim, k);
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
extern "C" __global__ void key_scores_bf16(const bf16* __restrict__ k_cache,
                                           const unsigned* __restrict__ table, int block_size,
                                           int len, int num_kv_heads, int head_dim, int lpr,
                                           int tokens_per_block, const float* __restrict__ mean,
                                           const float* __restrict__ mean_norm, int key_diff,
                                           float* __restrict__ scores) {
    pdl_entry();
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
            load8(k_cache + (token_slot(table, block_size, t) * num_kv_heads + h) * head_dim, c0,
                  head_dim, k);
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
