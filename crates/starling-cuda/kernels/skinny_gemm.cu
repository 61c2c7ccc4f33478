// Small-batch linear layers on the tensor cores: y[n, m] = x[n, k] · w[m, k]ᵀ (+ bias[m]) for
// GEMV_MAX_ROWS < n ≤ SKINNY_MAX_ROWS (kernels.rs), and the same fused with SwiGLU for the MLP's
// gate|up projection. CPU references: cpu::matmul (Backend::linear) and cpu::silu_mul after it
// (Backend::linear_swiglu's default); parity tests `linear_and_logits_match_cpu` and
// `linear_swiglu_matches_cpu` in crates/starling-cuda/tests/parity.rs.
//
// Why: a decode step of 3–32 sequences is still a stream over every weight, but cuBLAS tiles the
// narrow layers into fewer blocks than the GPU has SMs (H200, synthetic Qwen2.5-1.5B at 16 rows,
// kernel profile of 2026-12-03: the 2048×1536 QKV projection at 0.33 TB/s, 1536×1536 at 0.44),
// and leaves the bias and SwiGLU to separate launches.
//
// Layout: the weights are the mma's A operand (16 weight rows per block as its M rows), the input
// rows its B operand (8 per n-tile, NT tiles), so one mma.m16n8k16 covers 16 outputs × 8 input
// rows × 16 of k. K is read in 32-element chunks: per chunk each lane loads 16 contiguous bytes of
// each of its two weight rows and of each of its input rows, and feeds them to two mma's under one
// fixed permutation of k inside the chunk — lane q's logical k {2q, 2q+1, 2q+8, 2q+9} of the first
// mma are the chunk's physical 8q..8q+3, of the second 8q+4..8q+7 — the same for A and B, so the
// sum over k is unchanged and nothing is staged in shared memory. The block's SK_WARPS warps take
// interleaved chunks (together a contiguous 512 bytes of each row per round) and sum their
// accumulators through shared memory; the first warp adds the bias (or applies SwiGLU) and stores.
// SwiGLU blocks take 8 outputs: their gate rows as the mma's rows 0–7 and their up rows as rows
// 8–15, so each lane holds a gate and its up value side by side (kept in f32, as gemv.cu).
// Requires k % 32 == 0 (the host falls back to cuBLAS otherwise). The host prepends pdl.cuh and
// mma_common.cuh (mma_bf16).

#define SK_WARPS 8
// Chunks per warp with their loads in flight before the first mma of a round.
#define SK_UNROLL 4

template <int NT, bool SWIGLU>
__device__ __forceinline__ void skinny_gemm(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                            const bf16* __restrict__ bias, bf16* __restrict__ y,
                                            int k, int m, int n) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int g = lane >> 2, q = lane & 3;
    // This lane's two weight rows (clamped inside w: rows past the end compute, store nothing).
    const int j = SWIGLU ? blockIdx.x * 8 + g : blockIdx.x * 16 + g;
    const int row_lo = min(j, m - 1);
    const int row_hi = SWIGLU ? m + row_lo : min(j + 8, m - 1);
    const uint4* __restrict__ w_lo = reinterpret_cast<const uint4*>(w + (size_t)row_lo * k) + q;
    const uint4* __restrict__ w_hi = reinterpret_cast<const uint4*>(w + (size_t)row_hi * k) + q;
    const int chunks = k >> 5;
    pdl_entry();
    // This lane's input rows, one per n-tile (rows past n read as zeros).
    const uint4* xs[NT];
    bool x_valid[NT];
#pragma unroll
    for (int t = 0; t < NT; t++) {
        const int r = t * 8 + g;
        x_valid[t] = r < n;
        xs[t] = reinterpret_cast<const uint4*>(x + (size_t)(x_valid[t] ? r : 0) * k) + q;
    }
    float acc[NT][4];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) acc[t][i] = 0.f;
    const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
    for (int c0 = warp; c0 < chunks; c0 += SK_WARPS * SK_UNROLL) {
        uint4 a_lo[SK_UNROLL], a_hi[SK_UNROLL], b[SK_UNROLL][NT];
#pragma unroll
        for (int u = 0; u < SK_UNROLL; u++) {
            const int c = c0 + u * SK_WARPS;  // warp-uniform: every lane takes the same branch
            const bool live = c < chunks;
            // Weights are read once: stream them past L1. Input rows are read by every block.
            a_lo[u] = live ? __ldcs(w_lo + 4 * c) : zero;
            a_hi[u] = live ? __ldcs(w_hi + 4 * c) : zero;
#pragma unroll
            for (int t = 0; t < NT; t++) b[u][t] = live && x_valid[t] ? __ldg(xs[t] + 4 * c) : zero;
        }
#pragma unroll
        for (int u = 0; u < SK_UNROLL; u++) {
            if (c0 + u * SK_WARPS >= chunks) break;
            const unsigned first[4] = {a_lo[u].x, a_hi[u].x, a_lo[u].y, a_hi[u].y};
            const unsigned second[4] = {a_lo[u].z, a_hi[u].z, a_lo[u].w, a_hi[u].w};
#pragma unroll
            for (int t = 0; t < NT; t++) {
                mma_bf16(acc[t], first, b[u][t].x, b[u][t].y);
                mma_bf16(acc[t], second, b[u][t].z, b[u][t].w);
            }
        }
    }
    __shared__ float parts[SK_WARPS][NT][4][32];
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) parts[warp][t][i][lane] = acc[t][i];
    __syncthreads();
    if (warp != 0) return;
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int i = 0; i < 4; i++) {
            float sum = 0.f;
#pragma unroll
            for (int p = 0; p < SK_WARPS; p++) sum += parts[p][t][i][lane];
            acc[t][i] = sum;
        }
    // acc[t][e] is (weight row g, input row t·8 + 2q + e), acc[t][2 + e] (weight row g + 8, same).
#pragma unroll
    for (int t = 0; t < NT; t++)
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = t * 8 + 2 * q + e;
            if (r >= n) continue;
            bf16* out = y + (size_t)r * m;
            if (SWIGLU) {
                const float gate = acc[t][e], up = acc[t][2 + e];
                if (j < m) out[j] = __float2bfloat16(gate / (1.f + __expf(-gate)) * up);
            } else {
                if (j < m)
                    out[j] = __float2bfloat16(acc[t][e] + (bias ? __bfloat162float(bias[j]) : 0.f));
                if (j + 8 < m)
                    out[j + 8] = __float2bfloat16(acc[t][2 + e] +
                                                  (bias ? __bfloat162float(bias[j + 8]) : 0.f));
            }
        }
}

// Kernel names: skinny_gemm_t{NT}_bf16 (blocks of 16 outputs, bias may be null) and
// skinny_gemm_swiglu_t{NT}_bf16 (blocks of 8 outputs of w = [gate; up], m = f), kernels.rs.
#define INSTANTIATE(NT)                                                                          \
    extern "C" __global__ void __launch_bounds__(SK_WARPS * 32) skinny_gemm_t##NT##_bf16(        \
        const bf16* x, const bf16* w, const bf16* bias, bf16* y, int k, int m, int n) {          \
        skinny_gemm<NT, false>(x, w, bias, y, k, m, n);                                          \
    }                                                                                            \
    extern "C" __global__ void __launch_bounds__(SK_WARPS * 32) skinny_gemm_swiglu_t##NT##_bf16( \
        const bf16* x, const bf16* w, bf16* y, int k, int f, int n) {                            \
        skinny_gemm<NT, true>(x, w, nullptr, y, k, f, n);                                        \
    }
// SKINNY_N_TILES in kernels.rs.
INSTANTIATE(1)
INSTANTIATE(2)
INSTANTIATE(4)
