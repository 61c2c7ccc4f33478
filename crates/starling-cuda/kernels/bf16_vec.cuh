// 16-byte bf16 vector helpers shared by the row kernels (ops.cu), the matrix-vector kernels
// (gemv.cu), the per-token attention kernel (attention.cu) and the key scores (key_scores.cu): the
// host prepends this file to those sources (kernels.rs `kernel_source!`), since NVRTC compiles one
// source string per module.
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;

// Eight bf16 (one 16-byte load) as floats.
__device__ __forceinline__ void unpack8(const uint4& v, float* f) {
    const __nv_bfloat162* h = reinterpret_cast<const __nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const float2 p = __bfloat1622float2(h[i]);
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

// Eight floats rounded to bf16, as one 16-byte store.
__device__ __forceinline__ uint4 pack8(const float* f) {
    uint4 v;
    __nv_bfloat162* h = reinterpret_cast<__nv_bfloat162*>(&v);
#pragma unroll
    for (int i = 0; i < 4; i++) h[i] = __floats2bfloat162_rn(f[2 * i], f[2 * i + 1]);
    return v;
}

