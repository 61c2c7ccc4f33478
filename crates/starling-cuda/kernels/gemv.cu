// Small-batch linear layers as bandwidth-bound matrix-vector products: y[n, m] = x[n, k] · w[m, k]ᵀ
// (+ bias[m]) for n ≤ GEMV_MAX_ROWS (kernels.rs). CPU reference: cpu::matmul (Backend::linear / logits);
// parity test `linear_and_logits_match_cpu` in crates/starling-cuda/tests/parity.rs.
//
// Decode at batch 1–2 reads every weight once per step and does almost no arithmetic per byte,
// so the layer is a stream over w: one warp per output column j (a row of w), each lane loading
// 16 bytes (8 bf16) of that row per step with the loop unrolled so several loads are in flight,
// and the n input rows read through L1 (all warps of a block read the same x). Requires k % 8 == 0
// (16-byte aligned rows); the backend falls back to cuBLAS otherwise.
// The host prepends bf16_vec.cuh (unpack8).

#define GEMV_WARPS 8

template <int N, bool F32_OUT>
__device__ void gemv_impl(const bf16* __restrict__ x, const bf16* __restrict__ w,
                          const bf16* __restrict__ bias, void* __restrict__ y, int k, int m) {
    const int lane = threadIdx.x & 31;
    const int warp = blockIdx.x * GEMV_WARPS + (threadIdx.x >> 5);
    const int num_warps = gridDim.x * GEMV_WARPS;
    const int chunks = k >> 3;  // 8 bf16 per 16-byte chunk
    const uint4* xs = reinterpret_cast<const uint4*>(x);
    for (int j = warp; j < m; j += num_warps) {
        const uint4* row = reinterpret_cast<const uint4*>(w + (size_t)j * k);
        float acc[N];
#pragma unroll
        for (int r = 0; r < N; r++) acc[r] = 0.f;
#pragma unroll 4
        for (int c = lane; c < chunks; c += 32) {
            // Weights are read once: stream them past L1.
            const uint4 wv = __ldcs(row + c);
            float wf[8];
            unpack8(wv, wf);
#pragma unroll
            for (int r = 0; r < N; r++) {
                float xf[8];
                unpack8(__ldg(xs + (size_t)r * chunks + c), xf);
#pragma unroll
                for (int i = 0; i < 8; i++) acc[r] = fmaf(wf[i], xf[i], acc[r]);
            }
        }
#pragma unroll
        for (int r = 0; r < N; r++) {
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) acc[r] += __shfl_xor_sync(0xffffffffu, acc[r], o);
        }
        if (lane == 0) {
            const float b = bias != nullptr ? __bfloat162float(bias[j]) : 0.f;
#pragma unroll
            for (int r = 0; r < N; r++) {
                const size_t at = (size_t)r * m + j;
                if (F32_OUT)
                    reinterpret_cast<float*>(y)[at] = acc[r] + b;
                else
                    reinterpret_cast<bf16*>(y)[at] = __float2bfloat16(acc[r] + b);
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
    }
// GEMV_MAX_ROWS in kernels.rs: more rows measured slower than cuBLAS.
INSTANTIATE(1)
INSTANTIATE(2)
