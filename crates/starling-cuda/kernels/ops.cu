// Elementwise and row-wise kernels of the CUDA backend. Each has a CPU reference in
// starling-backend/src/cpu (named in the comment above it) and a parity test in
// crates/starling-cuda/tests/parity.rs. Activations are bf16, arithmetic f32. The host prepends
// bf16_vec.cuh (unpack8, pack8) and fp8.cuh (the fp8 cache's conversions).

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
    pdl_entry();
    const size_t src = (size_t)ids[blockIdx.x] * d, dst = (size_t)blockIdx.x * d;
    if ((d & 7) == 0) {
        // 16-byte chunks (every model's hidden size): one round trip per chunk, not per bf16.
        const uint4* from = reinterpret_cast<const uint4*>(table + src);
        uint4* to = reinterpret_cast<uint4*>(out + dst);
        for (int c = threadIdx.x; c < (d >> 3); c += blockDim.x) to[c] = from[c];
        return;
    }
    for (int c = threadIdx.x; c < d; c += blockDim.x) out[dst + c] = table[src + c];
}

// Rows whose width is a multiple of 8 (every model here) take the vector path: one 16-byte chunk
// (8 bf16) per load, each thread holding its at most NORM_MAX_CHUNKS chunks in registers between the
// sum of squares and the scaling, so a row is read once. With one block of `d / 8` threads a row
// costs two dependent memory round trips; the scalar path (one bf16 per load, 16 per thread at
// d = 4096) measured 11.7 µs per batch-1 call on the H200, most of a decode step's non-GEMV time.
// The host launches min(1024, d / 8 rounded up to a warp) threads (backend.rs: row_chunk_threads).
#define NORM_MAX_CHUNKS 4

// Whether `d` takes the vector path with this block size.
__device__ __forceinline__ bool norm_vectorised(int d) {
    return (d & 7) == 0 && (d >> 3) <= NORM_MAX_CHUNKS * (int)blockDim.x;
}

// out = rms_norm(x) for one row (x += delta first, rounded to bf16, when ADD), vector path.
template <bool ADD>
__device__ void norm_row_vec(bf16* __restrict__ x, const bf16* __restrict__ delta,
                             const bf16* __restrict__ w, bf16* __restrict__ out, int d, float eps) {
    const int chunks = d >> 3;
    const size_t base = (size_t)blockIdx.x * d;
    uint4* xs = reinterpret_cast<uint4*>(x + base);
    // The weight does not depend on the sum: its loads go out with the row's, not after the
    // reduction (one memory round trip fewer per call).
    uint4 wv[NORM_MAX_CHUNKS];
#pragma unroll
    for (int k = 0; k < NORM_MAX_CHUNKS; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < chunks) wv[k] = reinterpret_cast<const uint4*>(w)[c];
    }
    float v[NORM_MAX_CHUNKS][8];
    float ss = 0.f;
#pragma unroll
    for (int k = 0; k < NORM_MAX_CHUNKS; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < chunks) {
            unpack8(xs[c], v[k]);
            if (ADD) {
                float dv[8];
                unpack8(reinterpret_cast<const uint4*>(delta + base)[c], dv);
#pragma unroll
                for (int i = 0; i < 8; i++) v[k][i] = __bfloat162float(__float2bfloat16(v[k][i] + dv[i]));
                xs[c] = pack8(v[k]);
            }
#pragma unroll
            for (int i = 0; i < 8; i++) ss += v[k][i] * v[k][i];
        }
    }
    const float inv = rsqrtf(block_sum(ss) / d + eps);
#pragma unroll
    for (int k = 0; k < NORM_MAX_CHUNKS; k++) {
        const int c = threadIdx.x + k * blockDim.x;
        if (c < chunks) {
            float wf[8], o[8];
            unpack8(wv[k], wf);
#pragma unroll
            for (int i = 0; i < 8; i++) o[i] = v[k][i] * inv * wf[i];
            reinterpret_cast<uint4*>(out + base)[c] = pack8(o);
        }
    }
}

// cpu::elementwise::rms_norm: one block per row.
// Launch bounds: the host may launch 1024 threads per row (row_chunk_threads), which caps the
// registers at 64 per thread; without the bound the register-cached vector path needs more and the
// launch fails.
extern "C" __global__ void __launch_bounds__(1024) rms_norm_bf16(const bf16* __restrict__ x, const bf16* __restrict__ w,
                                         bf16* __restrict__ out, int d, float eps) {
    pdl_entry();
    if (norm_vectorised(d)) {
        norm_row_vec<false>(const_cast<bf16*>(x), nullptr, w, out, d, eps);
        return;
    }
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
extern "C" __global__ void __launch_bounds__(1024) add_rms_norm_bf16(bf16* __restrict__ residual,
                                             const bf16* __restrict__ delta,
                                             const bf16* __restrict__ w, bf16* __restrict__ out,
                                             int d, float eps) {
    pdl_entry();
    if (norm_vectorised(d)) {
        norm_row_vec<true>(residual, delta, w, out, d, eps);
        return;
    }
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
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x)
        x[i] = __float2bfloat16(__bfloat162float(x[i]) + __bfloat162float(delta[i]));
}

// Bias of cpu::linear::linear: y[r, c] += b[c].
// With cols % 8 == 0 each thread adds 16-byte chunks (the host sizes the grid by chunks): a
// prefill chunk's bias is a stream over [tokens, cols], which the per-element loop, a 64-bit
// remainder per element, ran at a fifth of copy bandwidth (H200 kernel profile, 2026-12-03).
extern "C" __global__ void add_bias_bf16(bf16* __restrict__ y, const bf16* __restrict__ b,
                                         size_t rows, int cols) {
    pdl_entry();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((cols & 7) == 0) {
        const unsigned cols8 = (unsigned)cols >> 3;
        const size_t n8 = rows * cols8;
        uint4* y8 = reinterpret_cast<uint4*>(y);
        const uint4* b8 = reinterpret_cast<const uint4*>(b);
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += stride) {
            const unsigned c8 = n8 <= 0xffffffffu ? (unsigned)i % cols8 : (unsigned)(i % cols8);
            float yv[8], bv[8];
            unpack8(y8[i], yv);
            unpack8(b8[c8], bv);
#pragma unroll
            for (int e = 0; e < 8; e++) yv[e] += bv[e];
            y8[i] = pack8(yv);
        }
        return;
    }
    const size_t n = rows * cols;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        y[i] = __float2bfloat16(__bfloat162float(y[i]) + __bfloat162float(b[i % cols]));
}

// The gating activations of the MLP: silu (SwiGLU) and GELU's tanh approximation (GeGLU).
struct SiluAct {
    static __device__ __forceinline__ float apply(float g) { return g / (1.f + __expf(-g)); }
};
struct GeluTanhAct {
    // 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3))), PyTorch's gelu(approximate="tanh").
    static __device__ __forceinline__ float apply(float g) {
        return 0.5f * g * (1.f + tanhf(0.7978845608f * (g + 0.044715f * g * g * g)));
    }
};

// cpu::elementwise::silu_mul / gelu_tanh_mul: out[r, c] = act(gu[r, c]) * gu[r, f + c].
// With f % 8 == 0 each thread computes a 16-byte chunk of outputs from one chunk of gate and one
// of up (the host sizes the grid by chunks), as add_bias_bf16 and for the same reason.
template <typename Act>
__device__ void gated_mul_impl(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                               size_t rows, int f) {
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((f & 7) == 0) {
        const unsigned f8 = (unsigned)f >> 3;
        const size_t n8 = rows * f8;
        const uint4* gu8 = reinterpret_cast<const uint4*>(gate_up);
        uint4* out8 = reinterpret_cast<uint4*>(out);
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n8; i += stride) {
            size_t r, c8;
            if (n8 <= 0xffffffffu) {
                r = (unsigned)i / f8;
                c8 = (unsigned)i - (unsigned)r * f8;
            } else {
                r = i / f8;
                c8 = i % f8;
            }
            float g[8], u[8];
            unpack8(gu8[r * 2 * f8 + c8], g);
            unpack8(gu8[r * 2 * f8 + f8 + c8], u);
#pragma unroll
            for (int e = 0; e < 8; e++) g[e] = Act::apply(g[e]) * u[e];
            out8[i] = pack8(g);
        }
        return;
    }
    const size_t n = rows * f;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        const size_t r = i / f, c = i % f;
        const float g = __bfloat162float(gate_up[r * 2 * f + c]);
        const float u = __bfloat162float(gate_up[r * 2 * f + f + c]);
        out[i] = __float2bfloat16(Act::apply(g) * u);
    }
}

extern "C" __global__ void silu_mul_bf16(const bf16* __restrict__ gate_up, bf16* __restrict__ out,
                                         size_t rows, int f) {
    pdl_entry();
    gated_mul_impl<SiluAct>(gate_up, out, rows, f);
}

extern "C" __global__ void gelu_tanh_mul_bf16(const bf16* __restrict__ gate_up,
                                              bf16* __restrict__ out, size_t rows, int f) {
    pdl_entry();
    gated_mul_impl<GeluTanhAct>(gate_up, out, rows, f);
}

// CpuBackend::scale_inplace: x[i] *= factor (Gemma's embedding scale).
extern "C" __global__ void scale_bf16(bf16* __restrict__ x, size_t n, float factor) {
    pdl_entry();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride)
        x[i] = __float2bfloat16(__bfloat162float(x[i]) * factor);
}

// cpu::elementwise::rope_qk: rotate the first `rot_heads` heads (Q then K) of each fused QKV row.
// Grid (token, pair chunk): one thread per rotated pair, so a batch-1 step's 4,096 pairs (7B) run
// in parallel instead of 32 dependent rounds of one 128-thread block (13.7 µs measured).
extern "C" __global__ void rope_qk_bf16(bf16* __restrict__ qkv, const unsigned* __restrict__ positions,
                                        const float* __restrict__ inv_freq, int width, int rot_heads,
                                        int head_dim, int interleaved) {
    pdl_entry();
    const int half = head_dim / 2;
    const int idx = blockIdx.y * blockDim.x + threadIdx.x;
    if (idx >= rot_heads * half) return;
    const float pos = (float)positions[blockIdx.x];
    bf16* row = qkv + (size_t)blockIdx.x * width;
    const int h = idx / half, i = idx % half;
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    bf16* head = row + h * head_dim;
    const float x0 = __bfloat162float(head[a]), x1 = __bfloat162float(head[b]);
    head[a] = __float2bfloat16(x0 * c - x1 * s);
    head[b] = __float2bfloat16(x0 * s + x1 * c);
}

// Backend::rope_qk_write_kv (default: rope_qk, then write_kv): both in one launch. Grid (token,
// chunk of work items), one item per thread: a rotated Q pair, a rotated K pair (also stored into
// the token's cache slot), or a V pair copied into it. The values are rope_qk_bf16's and
// write_kv_bf16's exactly (same expressions, same roundings); padding rows (slot 0xffffffff) are
// rotated but write no cache slot, as there. An fp8 cache (FP8: byte planes, fp8.cuh) stores
// each rotated key rounded from its bf16 value, as write_kv_fp8 would from the rotated row (so
// the fused and the two-launch paths fill the cache alike).
template <bool FP8>
__device__ __forceinline__ void rope_write_kv_impl(bf16* __restrict__ qkv,
                                                   const unsigned* __restrict__ positions,
                                                   const float* __restrict__ inv_freq,
                                                   const unsigned* __restrict__ slots,
                                                   bf16* __restrict__ k_cache,
                                                   bf16* __restrict__ v_cache, int width,
                                                   int num_heads, int num_kv_heads, int head_dim,
                                                   int interleaved) {
    const int half = head_dim / 2;
    const int q_pairs = num_heads * half, k_pairs = num_kv_heads * half;
    const int kv_size = num_kv_heads * head_dim;
    const int idx = blockIdx.y * blockDim.x + threadIdx.x;
    if (idx >= q_pairs + k_pairs + kv_size / 2) return;
    const unsigned slot = slots[blockIdx.x];
    const bool store = slot != 0xffffffffu;
    bf16* row = qkv + (size_t)blockIdx.x * width;
    const int q_size = num_heads * head_dim;
    unsigned char* k_bytes = reinterpret_cast<unsigned char*>(k_cache);
    if (idx >= q_pairs + k_pairs) {
        if (!store) return;
        const int e = 2 * (idx - q_pairs - k_pairs);  // element of the V part (head_dim is even)
        const size_t dst = (size_t)slot * kv_size + e;
        const bf16 v0 = row[q_size + kv_size + e], v1 = row[q_size + kv_size + e + 1];
        if (FP8) {
            *reinterpret_cast<unsigned short*>(reinterpret_cast<unsigned char*>(v_cache) + dst) =
                e4m3x2_from_floats(__bfloat162float(v0), __bfloat162float(v1));
        } else {
            v_cache[dst] = v0;
            v_cache[dst + 1] = v1;
        }
        return;
    }
    const int h = idx / half, i = idx % half;  // heads 0.. num_heads - 1 are Q, then K
    const float pos = (float)positions[blockIdx.x];
    float s, c;
    sincosf(pos * inv_freq[i], &s, &c);
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    bf16* head = row + h * head_dim;
    const float x0 = __bfloat162float(head[a]), x1 = __bfloat162float(head[b]);
    const bf16 ra = __float2bfloat16(x0 * c - x1 * s), rb = __float2bfloat16(x0 * s + x1 * c);
    head[a] = ra;
    head[b] = rb;
    if (h >= num_heads && store) {
        const size_t dst = (size_t)slot * kv_size + (size_t)(h - num_heads) * head_dim;
        if (FP8) {
            k_bytes[dst + a] = e4m3_from_float(__bfloat162float(ra));
            k_bytes[dst + b] = e4m3_from_float(__bfloat162float(rb));
        } else {
            k_cache[dst + a] = ra;
            k_cache[dst + b] = rb;
        }
    }
}

#define ROPE_WRITE_KV(ELEM, FP8)                                                                \
    extern "C" __global__ void rope_write_kv_##ELEM(                                            \
        bf16* __restrict__ qkv, const unsigned* __restrict__ positions,                         \
        const float* __restrict__ inv_freq, const unsigned* __restrict__ slots,                 \
        bf16* __restrict__ k_cache, bf16* __restrict__ v_cache, int width, int num_heads,       \
        int num_kv_heads, int head_dim, int interleaved) {                                      \
        pdl_entry();                                                                            \
        rope_write_kv_impl<FP8>(qkv, positions, inv_freq, slots, k_cache, v_cache, width,       \
                                num_heads, num_kv_heads, head_dim, interleaved);                \
    }
ROPE_WRITE_KV(bf16, false)
ROPE_WRITE_KV(fp8, true)

// cpu::attention::CpuKvCache::write: K and V parts of each QKV row to its cache slot.
extern "C" __global__ void write_kv_bf16(const bf16* __restrict__ qkv, const unsigned* __restrict__ slots,
                                         bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                         int width, int q_size, int kv_size) {
    pdl_entry();
    const unsigned slot = slots[blockIdx.x];
    // The padding rows of a replayed decode step (CUDA graph bucket) carry this slot: they own
    // no cache slot, so they write nothing.
    if (slot == 0xffffffffu) return;
    const bf16* row = qkv + (size_t)blockIdx.x * width;
    const size_t dst = (size_t)slot * kv_size;
    if (((width | q_size | kv_size) & 7) == 0) {
        // 16-byte chunks (every model here): one round trip per chunk instead of one per bf16.
        const uint4* src = reinterpret_cast<const uint4*>(row + q_size);
        uint4* k = reinterpret_cast<uint4*>(k_cache + dst);
        uint4* v = reinterpret_cast<uint4*>(v_cache + dst);
        const int chunks = kv_size >> 3;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            k[c] = src[c];
            v[c] = src[chunks + c];
        }
        return;
    }
    for (int c = threadIdx.x; c < kv_size; c += blockDim.x) {
        k_cache[dst + c] = row[q_size + c];
        v_cache[dst + c] = row[q_size + kv_size + c];
    }
}

// write_kv_bf16 into an fp8 cache (byte planes, fp8.cuh): each 8-element chunk of the row's K
// and V parts rounded to e4m3 and stored as 8 bytes.
extern "C" __global__ void write_kv_fp8(const bf16* __restrict__ qkv, const unsigned* __restrict__ slots,
                                        bf16* __restrict__ k_cache, bf16* __restrict__ v_cache,
                                        int width, int q_size, int kv_size) {
    pdl_entry();
    const unsigned slot = slots[blockIdx.x];
    if (slot == 0xffffffffu) return;  // a replayed step's padding row (write_kv_bf16)
    const bf16* row = qkv + (size_t)blockIdx.x * width;
    unsigned char* k = reinterpret_cast<unsigned char*>(k_cache) + (size_t)slot * kv_size;
    unsigned char* v = reinterpret_cast<unsigned char*>(v_cache) + (size_t)slot * kv_size;
    if (((width | q_size | kv_size) & 7) == 0) {
        const uint4* src = reinterpret_cast<const uint4*>(row + q_size);
        const int chunks = kv_size >> 3;
        for (int c = threadIdx.x; c < chunks; c += blockDim.x) {
            float f[8];
            unpack8(src[c], f);
            reinterpret_cast<uint2*>(k)[c] = pack8_e4m3(f);
            unpack8(src[chunks + c], f);
            reinterpret_cast<uint2*>(v)[c] = pack8_e4m3(f);
        }
        return;
    }
    for (int c = threadIdx.x; c < kv_size; c += blockDim.x) {
        k[c] = e4m3_from_float(__bfloat162float(row[q_size + c]));
        v[c] = e4m3_from_float(__bfloat162float(row[q_size + kv_size + c]));
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
    pdl_entry();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n;
         i += (size_t)gridDim.x * blockDim.x) {
        const unsigned long long h = mix64(seed ^ mix64(i + 0x9e3779b97f4a7c15ULL));
        const float u1 = ((h >> 40) + 1.f) / 16777217.f, u2 = ((h & 0xffffff) + 0.5f) / 16777216.f;
        out[i] = __float2bfloat16(mean + std * sqrtf(-2.f * __logf(u1)) * __cosf(6.2831853f * u2));
    }
}
