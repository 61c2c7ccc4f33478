// Per-head RMSNorm in place (Qwen3's q/k norm), bf16 in and out, f32 arithmetic. CPU reference:
// starling-backend/src/cpu/head_norm.rs (rms_norm_heads); parity test in tests/parity.rs. The host
// prepends bf16_vec.cuh (the bf16 typedef). Host side: src/backend/head_norm.rs.

// Warps per block; each warp normalises one head of one row. A head is at most 32 * 8 = 256 wide
// (HEAD_NORM_MAX_DIM on the host), so a lane keeps its at most 8 elements in registers and the
// head is read once.
#define HEAD_NORM_WARPS 4
#define HEAD_NORM_PER_LANE 8

__device__ __forceinline__ float head_warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Grid: (rows, ceil(num_heads / HEAD_NORM_WARPS)); rows on x, which allows 2^31 - 1 of them.
// Head h of row r is columns [first_col + h * head_dim, + head_dim) of a row `width` wide.
extern "C" __global__ void rms_norm_heads_bf16(bf16* __restrict__ x, const bf16* __restrict__ w,
                                               int width, int first_col, int num_heads,
                                               int head_dim, float eps) {
    pdl_entry();
    const int lane = threadIdx.x & 31;
    const int head = blockIdx.y * HEAD_NORM_WARPS + (threadIdx.x >> 5);
    // The whole warp shares `head`, so it leaves together and the shuffles below see full warps.
    if (head >= num_heads) return;
    bf16* h = x + (size_t)blockIdx.x * width + first_col + (size_t)head * head_dim;
    float v[HEAD_NORM_PER_LANE];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < HEAD_NORM_PER_LANE; k++) {
        const int c = lane + 32 * k;
        v[k] = c < head_dim ? __bfloat162float(h[c]) : 0.f;
        ss += v[k] * v[k];
    }
    const float inv = rsqrtf(head_warp_sum(ss) / head_dim + eps);
#pragma unroll
    for (int k = 0; k < HEAD_NORM_PER_LANE; k++) {
        const int c = lane + 32 * k;
        if (c < head_dim) h[c] = __float2bfloat16(v[k] * inv * __bfloat162float(w[c]));
    }
}
