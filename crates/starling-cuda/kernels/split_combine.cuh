// The merge of flash-decoding splits, shared by attention_combine_bf16 (attention.cu) and
// latent_combine_bf16 (latent.cu); CPU reference: the unsplit attention itself (starling-backend
// cpu::attention), which every split parity test compares against.
//
// One block of COMBINE_THREADS threads merges the splits of one output vector:
//   out[c] = Σ_s e^(m_s − M) acc_s[c] / Σ_s e^(m_s − M) l_s,  M = max_s m_s  (2^ for BASE2),
// and writes zeros where no split saw a key. A split that saw no key has m_s = −inf and weight 0,
// whatever its acc row holds (it is never multiplied in, so stale scratch cannot become NaN).
//
// Why this shape: the first combine let every thread walk all splits in order with a branch per
// split (two dependent L2 loads each), 18.9 µs a launch at 64 splits on an H100 (FA3's combine:
// 4.5 µs). Here the maximum and the denominator are block reductions, the weights sit in shared
// memory, and the splits are dealt out over groups of threads whose loads are independent
// (16-byte vectors where the width allows), summed across groups in shared memory at the end.

#ifndef NEG_INF
#define NEG_INF (__int_as_float(0xff800000))
#endif
#define COMBINE_THREADS 256

// Block-wide max or sum of one float a thread; every thread gets the result. `scratch` holds
// one float a warp; the trailing barrier lets the caller reuse it at once.
__device__ __forceinline__ float combine_block_reduce(float v, bool is_max, float* scratch) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        const float other = __shfl_xor_sync(0xffffffffu, v, o);
        v = is_max ? fmaxf(v, other) : v + other;
    }
    if (lane == 0) scratch[warp] = v;
    __syncthreads();
    float total = scratch[0];
    for (int w = 1; w < COMBINE_THREADS / 32; w++)
        total = is_max ? fmaxf(total, scratch[w]) : total + scratch[w];
    __syncthreads();
    return total;
}

template <bool BASE2>
__device__ __forceinline__ float combine_exp(float x) {
    return BASE2 ? exp2f(x) : __expf(x);
}

// `acc`: the splits' unnormalised rows, `width` floats apart; `m` / `l`: the splits' running
// maximum and sum, `ml_stride` floats apart (2 where they are interleaved). Call from every
// thread of a COMBINE_THREADS block.
template <bool BASE2>
__device__ void combine_splits(bf16* __restrict__ out, const float* __restrict__ acc,
                               const float* __restrict__ m, const float* __restrict__ l,
                               int ml_stride, int splits, int width) {
    __shared__ float scratch[COMBINE_THREADS / 32];
    __shared__ float weight[COMBINE_THREADS];
    __shared__ float4 partial[COMBINE_THREADS];
    const int tid = threadIdx.x;
    float mx = NEG_INF;
    for (int s = tid; s < splits; s += COMBINE_THREADS) mx = fmaxf(mx, m[(size_t)s * ml_stride]);
    mx = combine_block_reduce(mx, true, scratch);
    float den = 0.f;
    for (int s = tid; s < splits; s += COMBINE_THREADS) {
        const float ms = m[(size_t)s * ml_stride];
        if (ms != NEG_INF) den += combine_exp<BASE2>(ms - mx) * l[(size_t)s * ml_stride];
    }
    den = combine_block_reduce(den, false, scratch);
    const float inv_den = den > 0.f ? 1.f / den : 0.f;
    // Units of work a lane: 4-column vectors where width and both pointers allow, else columns.
    const bool vec = (width % 4 == 0) && (((size_t)acc & 15) == 0) && (((size_t)out & 7) == 0);
    const int units = vec ? width / 4 : width;
    int lanes = 1;
    while (lanes < units && lanes < COMBINE_THREADS) lanes *= 2;
    const int groups = COMBINE_THREADS / lanes;
    const int lane = tid % lanes, group = tid / lanes;
    for (int u0 = 0; u0 < units; u0 += lanes) {
        const int u = u0 + lane;
        float4 sum = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int s0 = 0; s0 < splits; s0 += COMBINE_THREADS) {
            const int chunk = min(COMBINE_THREADS, splits - s0);
            if (tid < chunk) {
                const float ms = m[(size_t)(s0 + tid) * ml_stride];
                weight[tid] = ms == NEG_INF ? 0.f : combine_exp<BASE2>(ms - mx);
            }
            __syncthreads();
            if (u < units) {
#pragma unroll 4
                for (int s = group; s < chunk; s += groups) {
                    const float w = weight[s];
                    const float* row = acc + (size_t)(s0 + s) * width;
                    if (vec) {
                        const float4 a = reinterpret_cast<const float4*>(row)[u];
                        // A zero weight selects 0 rather than multiplying: stale rows may hold NaN.
                        sum.x += w == 0.f ? 0.f : w * a.x;
                        sum.y += w == 0.f ? 0.f : w * a.y;
                        sum.z += w == 0.f ? 0.f : w * a.z;
                        sum.w += w == 0.f ? 0.f : w * a.w;
                    } else {
                        const float a = row[u];
                        sum.x += w == 0.f ? 0.f : w * a;
                    }
                }
            }
            __syncthreads();
        }
        partial[tid] = sum;
        __syncthreads();
        if (group == 0 && u < units) {
            float4 total = sum;
            for (int g = 1; g < groups; g++) {
                const float4 p = partial[g * lanes + lane];
                total.x += p.x;
                total.y += p.y;
                total.z += p.z;
                total.w += p.w;
            }
            if (vec) {
                __nv_bfloat162* o2 = reinterpret_cast<__nv_bfloat162*>(out + 4 * u);
                o2[0] = __floats2bfloat162_rn(total.x * inv_den, total.y * inv_den);
                o2[1] = __floats2bfloat162_rn(total.z * inv_den, total.w * inv_den);
            } else {
                out[u] = __float2bfloat16(total.x * inv_den);
            }
        }
        __syncthreads();
    }
}
