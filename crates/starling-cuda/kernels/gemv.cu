// Small-batch linear layers as bandwidth-bound matrix-vector products: y[n, m] = x[n, k] · w[m, k]ᵀ
// (+ bias[m]) for n ≤ GEMV_MAX_ROWS (kernels.rs), and the same fused with SwiGLU for the MLP's
// gate|up projection. CPU references: cpu::matmul (Backend::linear / logits) and cpu::silu_mul
// after it (Backend::linear_swiglu's default); parity tests `linear_and_logits_match_cpu` and
// `linear_swiglu_matches_cpu` in crates/starling-cuda/tests/parity.rs.
//
// Decode at batch 1–2 reads every weight once per step and does almost no arithmetic per byte,
// so the layer is a stream over w: KSPLIT (1 or 2) warps per output column j (a row of w; two
// rows, gate and up, for SwiGLU), each a contiguous 1/KSPLIT of the row, each lane loading 16
// bytes (8 bf16) of each row per step with the loop unrolled so several loads are in flight, and
// the n input rows read through L1 (all warps of a block read the same x). The grid has one block
// per GEMV_WARPS / KSPLIT columns (no cap: a capped grid left some warps two columns and the rest
// one); the host picks KSPLIT per launch (`gemv_ksplit` in backend.rs) so the columns fill the
// resident warps in whole waves. Requires k % 8 == 0 (16-byte aligned rows); the backend falls
// back to cuBLAS otherwise.
// The host prepends pdl.cuh and bf16_vec.cuh (unpack8).

#define GEMV_WARPS 8
// Chunks of each row per lane in flight. Measured on the H200 (2026-11-29, llama2-7b and
// qwen2.5-7b decode steps at batch 1 and 2): 8 is as fast at batch 1 and 2–5% slower at batch 2,
// for both the plain and the SwiGLU kernel; 16 is slower at batch 1.
#define GEMV_UNROLL 4

// Requests the first `prefetch_bytes` (at most the `elems` bf16 from `start`) of a weight row into
// L2, one 128-byte line per lane at a time. The host passes GEMV_PREFETCH_BYTES (backend.rs): a
// few lines only, since larger prefetches measured slower.
__device__ __forceinline__ void prefetch_row(const uint4* __restrict__ start, int elems,
                                             int prefetch_bytes, int lane) {
    const char* bytes = reinterpret_cast<const char*>(start);
    prefetch_bytes = min(elems * 2, prefetch_bytes);
    for (int at = lane * 128; at < prefetch_bytes; at += 32 * 128) prefetch_l2(bytes + at);
}

// acc[r][n] = row r of w (R rows) · input row n of x (N rows) over chunks [c0, c1), summed over
// the warp (every lane gets the sums).
template <int N, int R>
__device__ __forceinline__ void dot_rows(const uint4* __restrict__ xs, const uint4* const* rows,
                                         int c0, int c1, int chunks, int lane,
                                         float (&acc)[R][N]) {
#pragma unroll
    for (int r = 0; r < R; r++)
#pragma unroll
        for (int n = 0; n < N; n++) acc[r][n] = 0.f;
#pragma unroll GEMV_UNROLL
    for (int c = c0 + lane; c < c1; c += 32) {
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

// One output column (R weight rows) per KSPLIT warps of the block, each warp a contiguous
// 1/KSPLIT of the k chunks; the block's parts are summed through shared memory, and the first
// warp of each column gets the total. Returns the column index (≥ m past the end: such a column
// computes a clamped row, stores nothing, but still takes part in the block barrier).
template <int N, int R, int KSPLIT>
__device__ __forceinline__ int column_dot(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                          int k, int m, int prefetch_bytes,
                                          const int (&row_of)[R], bool& first,
                                          float (&acc)[R][N]) {
    constexpr int COLUMNS = GEMV_WARPS / KSPLIT;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int part = warp % KSPLIT;
    const int j = blockIdx.x * COLUMNS + warp / KSPLIT;
    const int chunks = k >> 3;  // 8 bf16 per 16-byte chunk
    const int c0 = part * chunks / KSPLIT, c1 = (part + 1) * chunks / KSPLIT;
    const int jj = min(j, m - 1);
    const uint4* rows[R];
#pragma unroll
    for (int r = 0; r < R; r++)
        rows[r] = reinterpret_cast<const uint4*>(w + (size_t)(row_of[r] + jj) * k);
    // Weights are no kernel's output, so their first lines may be requested before pdl_entry():
    // while the preceding kernel (a norm, the attention) finishes, this grid's resident warps
    // already stream the start of their rows into L2 and keep DRAM busy.
    if (j < m) {
#pragma unroll
        for (int r = 0; r < R; r++)
            prefetch_row(rows[r] + c0, (c1 - c0) * 8, prefetch_bytes / R, lane);
    }
    pdl_entry();
    dot_rows<N, R>(reinterpret_cast<const uint4*>(x), rows, c0, c1, chunks, lane, acc);
    first = part == 0 && lane == 0;
    if (KSPLIT > 1) {
        __shared__ float parts[GEMV_WARPS][R * N];
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < R; r++)
#pragma unroll
                for (int n = 0; n < N; n++) parts[warp][r * N + n] = acc[r][n];
        }
        __syncthreads();
        if (first) {
#pragma unroll
            for (int p = 1; p < KSPLIT; p++)
#pragma unroll
                for (int r = 0; r < R; r++)
#pragma unroll
                    for (int n = 0; n < N; n++) acc[r][n] += parts[warp + p][r * N + n];
        }
    }
    return j;
}

template <int N, bool F32_OUT, int KSPLIT>
__device__ void gemv_impl(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          const bf16* __restrict__ bias, void* __restrict__ y, int k, int m,
                          int prefetch_bytes) {
    const int row_of[1] = {0};
    bool first;
    float acc[1][N];
    const int j = column_dot<N, 1, KSPLIT>(x, w, k, m, prefetch_bytes, row_of, first, acc);
    if (first && j < m) {
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

// y[n, f] = silu(x · gateᵀ) * (x · upᵀ) for w = [gate; up] of [2f, k]: gate row j and up row
// f + j read together. The gate and up values stay in f32 (the unfused path rounds both to bf16
// before silu_mul).
template <int N, int KSPLIT>
__device__ void gemv_swiglu_impl(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                 bf16* __restrict__ y, int k, int f, int prefetch_bytes) {
    const int row_of[2] = {0, f};
    bool first;
    float acc[2][N];
    const int j = column_dot<N, 2, KSPLIT>(x, w, k, f, prefetch_bytes, row_of, first, acc);
    if (first && j < f) {
#pragma unroll
        for (int r = 0; r < N; r++) {
            const float g = acc[0][r], u = acc[1][r];
            y[(size_t)r * f + j] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
        }
    }
}

// Kernel names: gemv_n{N}_k{KSPLIT}_{bf16,f32} and gemv_swiglu_n{N}_k{KSPLIT}_bf16 (kernels.rs).
#define INSTANTIATE(N, KS)                                                                      \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_n##N##_k##KS##_bf16(     \
        const bf16* x, const bf16* w, const bf16* bias, bf16* y, int k, int m, int prefetch) {  \
        gemv_impl<N, false, KS>(x, w, bias, y, k, m, prefetch);                                 \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_n##N##_k##KS##_f32(      \
        const bf16* x, const bf16* w, const bf16* bias, float* y, int k, int m, int prefetch) { \
        gemv_impl<N, true, KS>(x, w, bias, y, k, m, prefetch);                                  \
    }                                                                                           \
    extern "C" __global__ void __launch_bounds__(GEMV_WARPS * 32) gemv_swiglu_n##N##_k##KS##_bf16( \
        const bf16* x, const bf16* w, bf16* y, int k, int f, int prefetch) {                    \
        gemv_swiglu_impl<N, KS>(x, w, y, k, f, prefetch);                                       \
    }
// GEMV_MAX_ROWS in kernels.rs: more rows measured slower than cuBLAS. KSPLIT 1 or 2: see
// GEMV_KSPLITS in kernels.rs.
INSTANTIATE(1, 1)
INSTANTIATE(1, 2)
INSTANTIATE(2, 1)
INSTANTIATE(2, 2)
