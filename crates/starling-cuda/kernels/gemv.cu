// Small-batch linear layers as bandwidth-bound matrix-vector products: y[n, m] = x[n, k] · w[m, k]ᵀ
// (+ bias[m]) for n ≤ GEMV_MAX_ROWS (kernels.rs), and the same fused with SwiGLU for the MLP's
// gate|up projection. CPU references: cpu::matmul (Backend::linear / logits) and cpu::silu_mul
// after it (Backend::linear_swiglu's default); parity tests `linear_and_logits_match_cpu` and
// `linear_swiglu_matches_cpu` in crates/starling-cuda/tests/parity.rs.
//
// Decode at batch 1–2 reads every weight once per step and does almost no arithmetic per byte,
// so the layer is a stream over w: one warp per output column j (a row of w; two rows, gate and
// up, for SwiGLU), each lane loading 16 bytes (8 bf16) of each row per step with the loop
// unrolled so several loads are in flight, and the n input rows read through L1 (all warps of a
// block read the same x). The grid has a warp per output column (no cap): a capped grid left
// some warps two columns and the rest one. Requires k % 8 == 0 (16-byte aligned rows); the
// backend falls back to cuBLAS otherwise.
// The host prepends pdl.cuh and bf16_vec.cuh (unpack8).

#define GEMV_WARPS 8
// Bytes of its first weight row each warp requests into L2 before waiting on the preceding kernel
// (pdl.cuh). Every resident warp prefetches, so this bounds the early traffic at about
// 132 SMs × 64 warps × 2 KiB = 17 MiB, a third of the H200's L2.
#define GEMV_PREFETCH_BYTES 2048
// Chunks of each row per lane in flight. Measured on the H200 (2026-11-29, llama2-7b and
// qwen2.5-7b decode steps at batch 1 and 2): 8 is as fast at batch 1 and 2–5% slower at batch 2,
// for both the plain and the SwiGLU kernel; 16 is slower at batch 1.
#define GEMV_UNROLL 4

// Requests the first bytes of weight row `row` into L2 (one 128-byte line per lane).
__device__ __forceinline__ void prefetch_row(const bf16* __restrict__ row, int k, int lane) {
    const char* bytes = reinterpret_cast<const char*>(row);
    const int prefetch_bytes = min(k * 2, GEMV_PREFETCH_BYTES);
    for (int at = lane * 128; at < prefetch_bytes; at += 32 * 128) prefetch_l2(bytes + at);
}

// acc[r][n] = this lane's share of row r of w (R rows) · input row n of x (N rows); the caller
// sums over the warp.
template <int N, int R, int UNROLL>
__device__ __forceinline__ void dot_rows(const uint4* __restrict__ xs, const uint4* const* rows,
                                         int chunks, int lane, float (&acc)[R][N]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
#pragma unroll UNROLL
    for (int c = lane; c < chunks; c += 32) {
        uint4 wv[R];
        // Weights are read once: stream them past L1.
#pragma unroll
        for (int r = 0; r < R; r++) wv[r] = __ldcs(rows[r] + c);
#pragma unroll
        for (int n = 0; n < N; n++) {
            float xf[8];
            unpack8(__ldg(xs + (size_t)n * chunks + c), xf);
#pragma unroll
            for (int r = 0; r < R; r++) {
                float wf[8];
                unpack8(wv[r], wf);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r][n] = fmaf(wf[i], xf[i], acc[r][n]);
            }
        }
    }
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1)
                acc[r][n] += __shfl_xor_sync(0xffffffffu, acc[r][n], o);
}

template <int N, bool F32_OUT>
__device__ void gemv_impl(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          const bf16* __restrict__ bias, void* __restrict__ y, int k, int m) {
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int num_warps = gridDim.x * GEMV_WARPS;
    const int chunks = k >> 3;  // 8 bf16 per 16-byte chunk
    // Weights are no kernel's output, so their first lines may be requested before pdl_entry():
    // while the preceding kernel (a norm, the attention) finishes, this grid's resident warps
    // already stream the start of their first rows into L2 and keep DRAM busy.
    if (warp < m) prefetch_row(w + (size_t)warp * k, k, lane);
    pdl_entry();
    const uint4* xs = reinterpret_cast<const uint4*>(x);
    for (int j = warp; j < m; j += num_warps) {
        const uint4* row[1] = {reinterpret_cast<const uint4*>(w + (size_t)j * k)};
        float acc[1][N];
        dot_rows<N, 1, GEMV_UNROLL>(xs, row, chunks, lane, acc);
        if (lane == 0) {
            const float b = bias != nullptr ? __bfloat162float(bias[j]) : 0.f;
#pragma unroll
            for (int r = 0; r < N; r++) {
                const size_t at = (size_t)r * m + j;
                if (F32_OUT)
                    reinterpret_cast<float*>(y)[at] = acc[0][r] + b;
                else
                    reinterpret_cast<bf16*>(y)[at] = __float2bfloat16(acc[0][r] + b);
            }
        }
    }
}

// y[n, f] = silu(x · gateᵀ) * (x · upᵀ) for w = [gate; up] of [2f, k]: one warp per output
// column j, reading gate row j and up row f + j together. The gate and up values stay in f32
// (the unfused path rounds both to bf16 before silu_mul).
template <int N>
__device__ void gemv_swiglu_impl(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                 bf16* __restrict__ y, int k, int f) {
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int num_warps = gridDim.x * GEMV_WARPS;
    const int chunks = k >> 3;
    if (warp < f) {
        prefetch_row(w + (size_t)warp * k, k, lane);
        prefetch_row(w + (size_t)(f + warp) * k, k, lane);
    }
    pdl_entry();
    const uint4* xs = reinterpret_cast<const uint4*>(x);
    for (int j = warp; j < f; j += num_warps) {
        const uint4* rows[2] = {reinterpret_cast<const uint4*>(w + (size_t)j * k),
                                reinterpret_cast<const uint4*>(w + (size_t)(f + j) * k)};
        float acc[2][N];
        dot_rows<N, 2, GEMV_UNROLL>(xs, rows, chunks, lane, acc);
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < N; r++) {
                const float g = acc[0][r], u = acc[1][r];
                y[(size_t)r * f + j] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
            }
        }
    }
}

#define INSTANTIATE(N)                                                                          \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        gemv_n##N##_bf16(const bf16* x, const bf16* w, const bf16* bias, bf16* y, int k, int m) { \
        gemv_impl<N, false>(x, w, bias, y, k, m);                                              \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        gemv_n##N##_f32(const bf16* x, const bf16* w, const bf16* bias, float* y, int k, int m) { \
        gemv_impl<N, true>(x, w, bias, y, k, m);                                               \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32)                               \
        gemv_swiglu_n##N##_bf16(const bf16* x, const bf16* w, bf16* y, int k, int f) {          \
        gemv_swiglu_impl<N>(x, w, y, k, f);                                                    \
    }
// GEMV_MAX_ROWS in kernels.rs: more rows measured slower than cuBLAS.
INSTANTIATE(1)
INSTANTIATE(2)
