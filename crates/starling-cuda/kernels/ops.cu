// Elementwise and row-wise kernels of the CUDA backend. Each has a CPU reference in
// starling-backend/src/cpu (named in the comment above it) and a parity test in
// crates/starling-cuda/tests/parity.rs. Activations are bf16, arithmetic f32.
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;

__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// Sum over the block; every thread gets the result. blockDim.x must be a multiple of 32, <= 1024.
__device__ float block_sum(float v) {
    __shared__ float partial[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum(v);
    __syncthreads();
    if (lane == 0) partial[warp] = v;
    __syncthreads();
    const int nwarps = blockDim.x >> 5;
    float t = lane < nwarps ? partial[lane] : 0.f;
    return warp_sum(t);
}

// cpu::elementwise::embedding / gather_rows: out[r] = table[ids[r]].
extern "C" __global__ void gather_rows_bf16(const bf16* __restrict__ table,
                                            const unsigned* __restrict__ ids,
                                            bf16* __restrict__ out, int d) {
    const size_t src = (size_t)ids[blockIdx.x] * d, dst = (size_t)blockIdx.x * d;
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[dst + c] = table[src + c];
}

// cpu::elementwise::rms_norm: one block per row.
extern "C" __global__ void rms_norm_bf16(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                         bf16* __restrict__ out, int d, float eps) {
    const size_t base = (size_t)blockIdx.x * d;
    float ss = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float v = __bfloat162float(x[base + c]);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / d + eps);
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        out[base + c] = __float2bfloat16(__bfloat162float(x[base + c]) * inv * __bfloat162float(w[c]));
}

// CpuBackend::add_rms_norm: residual += delta (rounded to bf16, as a bf16 model stores it), then
// out = rms_norm(residual). One block per row.
extern "C" __global__ void add_rms_norm_bf16(bf16* __restrict__ residual,
                                             const bf16* __restrict__ delta,
                                             const bf16* __restrict__ w, bf16* __restrict__ out,
                                             int d, float eps) {
    const size_t base = (size_t)blockIdx.x * d;
    float ss = 0.f;
    for (int c = threadIdx.x; c < d; c += blockDim.x) {
        bf16 r = __float2bfloat16(__bfloat162float(residual[base + c]) +
                                  __bfloat162float(delta[base + c]));
        residual[base + c] = r;
        float v = __bfloat162float(r);
        ss += v * v;
    }
    const float inv = rsqrtf(block_sum(ss) / d + eps);
    for (int c = threadIdx.x; c < d; c += blockDim.x)
        out[base + c] =
            __float2bfloat16(__bfloat162float(residual[base + c]) * inv * __bfloat162float(w[c]));
}

// cpu::elementwise::add_inplace.
extern "C" __global__ void add_inplace_bf16(bf16* __restrict__ x, const bf16* __restrict__ delta,
                                            size_t n) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(delta[i]));
}

// Bias of cpu::linear::linear: y[r, c] += b[c].
extern "C" __global__ void add_bias_bf16(bf16* __restrict__ y, const bf16* __restrict__ b,
                                         size_t rows, int cols) {
    const size_t n = rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(b[i % cols]));
}

// cpu::elementwise::silu_mul: out[r, c] = silu(gu[r, c]) * gu[r, f + c].
extern "C" __global__ void silu_mul_bf16(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                         size_t rows, int f) {
    const size_t n = rows * f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const size_t r = i / f, c = i % f;
        const float g = __bfloat162float(gate_up[r * 2 * f + c]);
        const float u = __bfloat162float(gate_up[r * 2 * f + f + c]);
        out[i] = __float2bfloat16(g / (1.f + __expf(-g)) * u);
    }
}

// cpu::elementwise::rope_qk: rotate the first `rot_heads` heads (Q then K) of each fused QKV row.
// One block per token.
extern "C" __global__ void rope_qk_bf16(bf16* __restrict__ qkv, const unsigned* __restrict__ positions,
                                        const float* __restrict__ inv_freq, int width, int rot_heads,
                                        int head_dim, int interleaved) {
    const int half = head_dim / 2;
    const float pos = (float)positions[blockIdx.x];
    bf16* row = qkv + (size_t)blockIdx.x * width;
    for (int idx = threadIdx.x; idx < rot_heads * half; idx += blockDim.x) {
        const int h = idx / half, i = idx % half;
        float s, c;
        sincosf(pos * inv_freq[i], &s, &c);
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
        bf16* head = row + h * head_dim;
        const float x0 = __bfloat162float(head[a]), x1 = __bfloat162float(head[b]);
        head[a] = __float2bfloat16(x0 * c - x1 * s);
        head[b] = __float2bfloat16(x0 * s + x1 * c);
    }
}

// cpu::attention::CpuKvCache::write: K and V parts of each QKV row to its cache slot.
extern "C" __global__ void write_kv_bf16(const bf16* __restrict__ qkv, const unsigned* __restrict__ slots,
                                         bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                         int width, int q_size, int kv_size) {
    const unsigned slot = slots[blockIdx.x];
    // The padding rows of a replayed decode step (CUDA graph bucket) carry this slot: they own
    // no cache slot, so they write nothing.
    if (slot == 0xffffffffu) return;
    const bf16* row = qkv + (size_t)blockIdx.x * width;
    const size_t dst = (size_t)slot * kv_size;
    for (int c = threadIdx.x; c < kv_size; c += blockDim.x) {
        k_cache[dst + c] = row[q_size + c];
        v_cache[dst + c] = row[q_size + kv_size + c];
    }
}

// Deterministic N(0, std) filler for synthetic weights (Box-Muller on a counter hash), so
// performance runs need no host weights. Not a CPU-referenced op: values only need the right scale.
__device__ __forceinline__ unsigned long long mix64(unsigned long long z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
}
extern "C" __global__ void fill_normal_bf16(bf16* __restrict__ out, size_t n, unsigned long long seed,
                                            float std, float mean) {
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const unsigned long long h = mix64(seed ^ mix64(i + 0x9e3779b97f4a7c15ULL));
        const float u1 = ((h >> 40) + 1.f) / 16777217.f, u2 = ((h & 0xffffff) + 0.5f) / 16777216.f;
        out[i] = __float2bfloat16(mean + std * sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2));
    }
}
