// Paged causal attention (CPU reference: starling-backend cpu::attention::paged_attention).
//
// One block per (query token, KV head, context split); `rows` lists the tokens this launch
// serves (the decode tokens of a batch whose prefill chunks go to prefill_attention.cu, or all of
// them). The block holds the G query heads that
// share the KV head, so every K/V row is read once per group (GQA-aware). Rows are read as 16-byte
// vectors by D/8 lanes, several rows per warp and UNROLL passes in flight per lane; scores use an
// online softmax per head. Warps are merged in shared memory; with several splits
// (flash-decoding, for long contexts at small batch) each split writes an unnormalised partial
// and attention_combine_bf16 merges them.
// The host prepends pdl.cuh, bf16_vec.cuh (bf16, unpack8), fp8.cuh and kv_elem.cuh (the cache
// element loads of both dtypes) and decode_common.cuh (the parameter list and split-plan read
// shared with decode_attention.cu).

#define WARPS 4
// NVRTC has no math.h: -inf by its bit pattern.
#define NEG_INF (__int_as_float(0xff800000))

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Row layout: a K or V row of D bf16 is read as D/8 16-byte vectors by LPR = D/8 consecutive
// lanes, so one warp covers RPW = 32/LPR context positions at once, and each lane issues UNROLL
// positions' loads before any arithmetic (memory-level parallelism is what decode needs).
#define UNROLL 2


// FP8: the planes hold e4m3 bytes (kv_elem.cuh), eight per lane and row (8-byte loads).
template <int D, int MAX_GROUP, bool FP8>
__device__ void paged_attention_impl(DECODE_ATTENTION_PARAMS) {
    constexpr int LPR = D / 8;       // lanes per row
    if (!decode_split_in_plan(plan, splits, split_len)) return;
    constexpr int RPW = 32 / LPR;    // rows per warp pass
    const int t = (int)rows[blockIdx.x], kvh = blockIdx.y, split = blockIdx.z;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int sub = lane / LPR, sl = lane % LPR;  // row within the pass, lane within the row
    const int num_q_heads = num_kv_heads * group;
    const int visible = (int)tok_visible[t];
    const int start = window_first_key(visible, window) + split * split_len;
    const int end = min(visible, start + split_len);
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;

    // This lane's 8 query elements of each head in the group, pre-scaled.
    float q[MAX_GROUP][8];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g < group) {
            const uint4 raw = *reinterpret_cast<const uint4*>(
                qkv + (size_t)t * qkv_width + (kvh * group + g) * D + sl * 8);
            unpack8(raw, q[g]);
#pragma unroll
            for (int e = 0; e < 8; e++) q[g][e] *= scale;
        }
    }
    float acc[MAX_GROUP][8];
    float m[MAX_GROUP], l[MAX_GROUP];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        m[g] = NEG_INF;
        l[g] = 0.f;
#pragma unroll
        for (int e = 0; e < 8; e++) acc[g][e] = 0.f;
    }
    const size_t head_off = (size_t)kvh * D + sl * 8;
    const int stride = WARPS * RPW;
    // The loop bound is per warp (not per row) so that every lane runs the same iterations:
    // the shuffles below need all 32 lanes.
    for (int jw = start + warp * RPW; jw < end; jw += stride * UNROLL) {
        uint4 kr[UNROLL], vr[UNROLL];
        bool valid[UNROLL];
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            const int j = jw + sub + u * stride;
            valid[u] = j < end;
            if (valid[u]) {
                const size_t slot = (size_t)table[j / block_size] * block_size + j % block_size;
                const size_t off = slot * num_kv_heads * D + head_off;
                kr[u] = load_kv8<FP8>(k_cache, off);
                vr[u] = load_kv8<FP8>(v_cache, off);
            }
        }
#pragma unroll
        for (int u = 0; u < UNROLL; u++) {
            // Every lane of a row agrees on `valid`, and shuffles stay within the row's lanes,
            // but all 32 lanes must take part in each shuffle: compute, then mask the update.
            float k[8], v[8];
            unpack_kv8<FP8>(kr[u], k);
            unpack_kv8<FP8>(vr[u], v);
#pragma unroll
            for (int g = 0; g < MAX_GROUP; g++) {
                if (g < group) {
                    float dot = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; e++) dot += q[g][e] * k[e];
#pragma unroll
                    for (int o = LPR / 2; o > 0; o >>= 1) dot += __shfl_xor_sync(0xffffffffu, dot, o);
                    if (valid[u]) {
                        const float m_new = fmaxf(m[g], dot);
                        const float corr = __expf(m[g] - m_new);
                        const float p = __expf(dot - m_new);
                        l[g] = l[g] * corr + p;
#pragma unroll
                        for (int e = 0; e < 8; e++) acc[g][e] = acc[g][e] * corr + p * v[e];
                        m[g] = m_new;
                    }
                }
            }
        }
    }
    // Merge the RPW row-states of the warp (lanes with equal `sl` hold the same elements).
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g < group) {
#pragma unroll
            for (int o = LPR; o < 32; o <<= 1) {
                const float m_o = __shfl_xor_sync(0xffffffffu, m[g], o);
                const float l_o = __shfl_xor_sync(0xffffffffu, l[g], o);
                const float m_new = fmaxf(m[g], m_o);
                const float s_me = (m[g] == NEG_INF) ? 0.f : __expf(m[g] - m_new);
                const float s_o = (m_o == NEG_INF) ? 0.f : __expf(m_o - m_new);
#pragma unroll
                for (int e = 0; e < 8; e++) {
                    const float a_o = __shfl_xor_sync(0xffffffffu, acc[g][e], o);
                    acc[g][e] = acc[g][e] * s_me + a_o * s_o;
                }
                l[g] = l[g] * s_me + l_o * s_o;
                m[g] = m_new;
            }
        }
    }
    // Merge the warps in shared memory, one head at a time.
    __shared__ float ml_s[WARPS][MAX_GROUP][2];
    __shared__ float acc_s[WARPS][D];
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g < group && lane == 0) {
            ml_s[warp][g][0] = m[g];
            ml_s[warp][g][1] = l[g];
        }
    }
    __syncthreads();
#pragma unroll
    for (int g = 0; g < MAX_GROUP; g++) {
        if (g >= group) break;
        float m_max = NEG_INF;
        for (int w = 0; w < WARPS; w++) m_max = fmaxf(m_max, ml_s[w][g][0]);
        const float my_scale = (m[g] == NEG_INF) ? 0.f : __expf(m[g] - m_max);
        if (sub == 0) {
#pragma unroll
            for (int e = 0; e < 8; e++) acc_s[warp][sl * 8 + e] = acc[g][e] * my_scale;
        }
        __syncthreads();
        float l_sum = 0.f;
        for (int w = 0; w < WARPS; w++) {
            const float mw = ml_s[w][g][0];
            if (mw != NEG_INF) l_sum += ml_s[w][g][1] * __expf(mw - m_max);
        }
        const int h = kvh * group + g;
        for (int d = threadIdx.x; d < D; d += blockDim.x) {
            float a = 0.f;
            for (int w = 0; w < WARPS; w++) a += acc_s[w][d];
            if (splits == 1) {
                out[(size_t)t * num_q_heads * D + h * D + d] =
                    __float2bfloat16(l_sum > 0.f ? a / l_sum : 0.f);
            } else {
                part_acc[(((size_t)t * num_q_heads + h) * splits + split) * D + d] = a;
            }
        }
        if (splits > 1 && threadIdx.x == 0) {
            float* ml = part_ml + (((size_t)t * num_q_heads + h) * splits + split) * 2;
            ml[0] = m_max;
            ml[1] = l_sum;
        }
        __syncthreads();
    }
}

// One kernel per head width D, per bound G on the query heads sharing a KV head (the host
// picks the smallest G >= the model's group) and per cache element (bf16, fp8): the per-head
// state lives in registers, so an MHA model must not pay for 8 heads' worth of them.
#define INSTANTIATE_ELEM(D, G, ELEM, FP8)                                                        \
    extern "C" __global__ void __launch_bounds__(WARPS * 32)                                    \
        paged_attention_d##D##_g##G##_##ELEM(                                                   \
            bf16* out, float* part_acc, float* part_ml, const bf16* qkv, int qkv_width,         \
            const bf16* k_cache, const bf16* v_cache, const unsigned* rows,                     \
            const unsigned* tok_seq, const unsigned* tok_visible, const unsigned* block_tables, \
            int max_blocks, int block_size, int num_kv_heads, int group, float scale,           \
            int window, int splits, int split_len, const unsigned* plan) {                      \
        pdl_entry();                                                                            \
        paged_attention_impl<D, G, FP8>(out, part_acc, part_ml, qkv, qkv_width, k_cache,        \
                                        v_cache, rows, tok_seq, tok_visible, block_tables,      \
                                        max_blocks, block_size, num_kv_heads, group, scale,     \
                                        window, splits, split_len, plan);                       \
    }
#define INSTANTIATE(D, G) INSTANTIATE_ELEM(D, G, bf16, false) INSTANTIATE_ELEM(D, G, fp8, true)
#define INSTANTIATE_GROUPS(D) INSTANTIATE(D, 1) INSTANTIATE(D, 2) INSTANTIATE(D, 4) INSTANTIATE(D, 8)
INSTANTIATE_GROUPS(64)
INSTANTIATE_GROUPS(128)
INSTANTIATE_GROUPS(256)

// Merges the splits of one (token, head): grid (T, Hq), block = COMBINE_THREADS
// (split_combine.cuh). `plan` as above: a replayed step whose plan has one split wrote `out`
// directly, so there is nothing to merge.
extern "C" __global__ void attention_combine_bf16(bf16* __restrict__ out,
                                                  const float* __restrict__ part_acc,
                                                  const float* __restrict__ part_ml, int num_q_heads,
                                                  int splits, int head_dim,
                                                  const unsigned* __restrict__ plan) {
    pdl_entry();
    if (plan != nullptr) {
        splits = (int)plan[0];
        if (splits <= 1) return;
    }
    const int t = blockIdx.x, h = blockIdx.y;
    const size_t base = ((size_t)t * num_q_heads + h) * splits;
    combine_splits<false>(out + ((size_t)t * num_q_heads + h) * head_dim,
                          part_acc + base * head_dim, part_ml + base * 2, part_ml + base * 2 + 1,
                          2, splits, head_dim);
}
