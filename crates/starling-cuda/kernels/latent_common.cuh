// Helpers shared by the latent kernel modules (latent.cu, latent_rot.cu). Not a module of its
// own: the host prepends it after fp8.cuh and mma_common.cuh (kernels.rs).
#include <cuda_fp16.h>

// A compile-time flag for generic lambdas (NVRTC has no <type_traits>).
template <bool B>
struct BoolTag {
    static constexpr bool value = B;
};

// 16-byte global → shared copy through L1 (zero-filled when invalid): for rows whose sectors
// are requested in two halves by one thread.
__device__ __forceinline__ void cp_async16_ca(bf16* dst, const bf16* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}

// 8-byte global → shared copy through L1 (zero-filled when invalid): a chunk of 8 elements of an
// fp8 latent row, which is only 8-byte aligned (stored ranks are multiples of 8 bytes, not 16).
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
    const int n = valid ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}

// Eight e4m3 (one 8-byte chunk, the lowest byte first) as eight bf16 (one 16-byte chunk),
// exactly: every e4m3 value is a bf16 (fp8.cuh).
__device__ __forceinline__ uint4 e4m3x8_to_bf16(const uint2& v) {
    return make_uint4(e4m3x2_to_bf16x2((unsigned short)(v.x & 0xffffu)),
                      e4m3x2_to_bf16x2((unsigned short)(v.x >> 16)),
                      e4m3x2_to_bf16x2((unsigned short)(v.y & 0xffffu)),
                      e4m3x2_to_bf16x2((unsigned short)(v.y >> 16)));
}

// A latent plane's element `elem` as a byte pointer (fp8 planes are byte arrays passed as bf16*).
__device__ __forceinline__ const unsigned char* plane_bytes(const bf16* plane, size_t elem) {
    return reinterpret_cast<const unsigned char*>(plane) + elem;
}

// 4-byte global → shared copy (zero-filled when invalid).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}

// A latent layer's split of the context (backend/latent_plan.rs): an eager launch passes the
// plan as `splits`/`split_len` with no plan words; a replay reads its layer shape's two plan
// words from the batch buffer (written per step by the host from the same function), the launch
// grid being sized for the bucket's bound.
__device__ __forceinline__ void latent_split(const unsigned* __restrict__ plan, int& splits,
                                             int& split_len) {
    if (plan != nullptr) {
        splits = (int)plan[0];
        split_len = (int)plan[1];
    }
}

// Bits of the slot's position (stored as two bf16 words: the row-moving kernels copy it as data).
__device__ __forceinline__ unsigned slot_position(const unsigned* __restrict__ positions,
                                                  unsigned slot) {
    return positions[slot];
}

// The group's queries of decode row t as the B operand of Kᵀ·Q (mma.sync m16n8k16): column n =
// head n of KV head kvh's group (zero past the group), k = the head dim (this lane: g = lane/4,
// q4 = lane%4).
template <int D>
__device__ __forceinline__ void load_group_queries(unsigned (&qb)[D / 16][2],
                                                   const bf16* __restrict__ qkv, int qkv_width,
                                                   int t, int kvh, int group, int g, int q4) {
    const bool ok = g < group;
    const bf16* q = qkv + (size_t)t * qkv_width + (size_t)(kvh * group + (ok ? g : 0)) * D;
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        qb[ks][0] = ok ? *reinterpret_cast<const unsigned*>(q + 16 * ks + 2 * q4) : 0u;
        qb[ks][1] = ok ? *reinterpret_cast<const unsigned*>(q + 16 * ks + 8 + 2 * q4) : 0u;
    }
}

// cos/sin of one key's position at frequency f: the table row of the position (COMPOSED false:
// `hi` is that row), or the table row of p − p mod LO (`hi`) rotated by the row of p mod LO
// (`lo`, in shared memory): a tile's keys share a few `hi` rows (latent.cu LS_ROPE_SPLIT).
template <bool COMPOSED>
struct RopeRow {
    const float2* hi;
    const float2* lo;
    __device__ __forceinline__ float2 at(int f) const {
        const float2 h = hi[f];
        if (!COMPOSED) return h;
        const float2 l = lo[f];
        return make_float2(h.x * l.x - h.y * l.y, h.y * l.x + h.x * l.y);
    }
};

// Bias, then RoPE at each row's position (cs0: this lane's row g, cs1: row g + 8), on a pass of
// a reconstructed key tile held as mma.sync C fragments (head width NT·8): acc[i], i < PT, is
// column tile pass·PT + i of the first half of the head dim, acc[PT + i] its partner NT/2 +
// pass·PT + i (neox pairs frequency f with f + D/2; interleaved pairs neighbouring columns, in
// whichever tile). One pass (PT = NT/2) is the whole row, acc[nt] = column tile nt.
template <int NT, int PT, bool COMPOSED>
__device__ __forceinline__ void bias_rope_keys(float (&acc)[2 * PT][4], int pass,
                                               const float* bias_s,
                                               const RopeRow<COMPOSED>& cs0,
                                               const RopeRow<COMPOSED>& cs1, int interleaved,
                                               int q4) {
    constexpr int HALF = NT * 4;
    if (interleaved) {
#pragma unroll
        for (int i = 0; i < 2 * PT; i++) {
            const int nt = (i < PT ? 0 : NT / 2 - PT) + pass * PT + i;
            const int col = nt * 8 + 2 * q4, f = col / 2;
            const float b0 = bias_s[col], b1 = bias_s[col + 1];
            const float2 r0 = cs0.at(f), r1 = cs1.at(f);
            float x0 = acc[i][0] + b0, x1 = acc[i][1] + b1;
            acc[i][0] = x0 * r0.x - x1 * r0.y;
            acc[i][1] = x0 * r0.y + x1 * r0.x;
            x0 = acc[i][2] + b0;
            x1 = acc[i][3] + b1;
            acc[i][2] = x0 * r1.x - x1 * r1.y;
            acc[i][3] = x0 * r1.y + x1 * r1.x;
        }
    } else {
#pragma unroll
        for (int i = 0; i < PT; i++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                // Frequency f of column tile pass·PT + i; its partner f + HALF.
                const int f = (pass * PT + i) * 8 + 2 * q4 + e;
                const float ba = bias_s[f], bb = bias_s[f + HALF];
                const float2 r0 = cs0.at(f), r1 = cs1.at(f);
                float x0 = acc[i][e] + ba, x1 = acc[PT + i][e] + bb;
                acc[i][e] = x0 * r0.x - x1 * r0.y;
                acc[PT + i][e] = x0 * r0.y + x1 * r0.x;
                x0 = acc[i][e + 2] + ba;
                x1 = acc[PT + i][e + 2] + bb;
                acc[i][e + 2] = x0 * r1.x - x1 * r1.y;
                acc[PT + i][e + 2] = x0 * r1.y + x1 * r1.x;
            }
        }
    }
}

// Sᵀ[16 keys × 8 heads] += K · Qᵀ over a pass's k-steps (layout of bias_rope_keys): the key
// accumulators, packed to bf16, are the A fragments (k-step ks covers column tiles 2ks and
// 2ks + 1), the group's queries (load_group_queries) the B fragments.
template <int NT, int PT>
__device__ __forceinline__ void score_keys(float (&s)[4], const float (&acc)[2 * PT][4], int pass,
                                           const unsigned (&qb)[NT / 2][2]) {
#pragma unroll
    for (int m = 0; m < PT; m++) {
        const int i = 2 * (m % (PT / 2)) + (m < PT / 2 ? 0 : PT);
        const int ks = (i < PT ? 0 : NT / 2 - PT) / 2 + (pass * PT + i) / 2;
        const unsigned a[4] = {pack_bf16(acc[i][0], acc[i][1]), pack_bf16(acc[i][2], acc[i][3]),
                               pack_bf16(acc[i + 1][0], acc[i + 1][1]),
                               pack_bf16(acc[i + 1][2], acc[i + 1][3])};
        mma_bf16(s, a, qb[ks][0], qb[ks][1]);
    }
}

// One tile's Sᵀ fragment of this lane (s[0], s[1]: key j0, heads 2q4, 2q4 + 1; s[2], s[3]: key
// j0 + 8): scaled to log2 units and written head-major into the row's scores ([head][visible]),
// keys past kv_end as −∞ into the running maxima only.
__device__ __forceinline__ void store_tile_scores(float* __restrict__ row_scores, const float (&s)[4],
                                                  int j0, int kv_end, int kvh, int group,
                                                  int q4, int visible, float scale_log2,
                                                  float (&run_max)[2]) {
#pragma unroll
    for (int e = 0; e < 4; e++) {
        const int j = e < 2 ? j0 : j0 + 8, h = 2 * q4 + (e & 1);
        const float v = j < kv_end ? s[e] * scale_log2 : NEG_INF;
        if (j < kv_end && h < group)
            row_scores[(size_t)(kvh * group + h) * visible + j] = v;
        run_max[e & 1] = fmaxf(run_max[e & 1], v);
    }
}

// Each head's maximum over the split, to part_m [rows, Hq, splits]: over the lanes that share
// q4, then over the block's WARPS warps through max_s [WARPS][8]. Every thread of the block
// calls it (it holds a barrier).
template <int WARPS>
__device__ __forceinline__ void store_split_maxima(float* __restrict__ part_m, float* max_s,
                                                   float (&run_max)[2], int i_row,
                                                   int num_q_heads, int kvh, int group,
                                                   int splits, int split) {
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int e = 0; e < 2; e++) {
#pragma unroll
        for (int o = 4; o < 32; o <<= 1)
            run_max[e] = fmaxf(run_max[e], __shfl_xor_sync(0xffffffffu, run_max[e], o));
    }
    if ((lane >> 2) == 0) {
        max_s[warp * 8 + 2 * (lane & 3)] = run_max[0];
        max_s[warp * 8 + 2 * (lane & 3) + 1] = run_max[1];
    }
    __syncthreads();
    if (tid < group) {
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < WARPS; w++) m = fmaxf(m, max_s[w * 8 + tid]);
        part_m[((size_t)i_row * num_q_heads + kvh * group + tid) * splits + split] = m;
    }
}

// The parameter list of the latent score kernels that reconstruct keys (latent.cu
// latent_scores_d{D}_{elem}, latent_rel.cu latent_scores_rel_d{D}_k{KS}_bf16): the host pushes one
// list for both (backend/latent_scores.rs).
#define LATENT_SCORE_PARAMS                                                                      \
    float *scores, float *part_m, const bf16 *qkv, int qkv_width, const bf16 *key_plane,         \
        int key_width, const unsigned *pos_plane, const int *latent_heads, const bf16 *key_up,   \
        const bf16 *key_bias, const float2 *rope_table, int interleaved, int rs,                 \
        const unsigned *rows, const unsigned *tok_seq, const unsigned *tok_visible,              \
        const unsigned *score_offsets, const unsigned *block_tables, int max_blocks,             \
        int block_size, int num_kv_heads, int group, float scale, int splits, int split_len,     \
        const unsigned *plan
