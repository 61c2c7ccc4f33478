// fp8 e4m3 KV-cache elements (`--kv-cache-dtype fp8`; the reference is starling-backend's fp8.rs):
// written rounded to nearest-even and saturated to ±448, read back exactly (every e4m3 value is
// an f16 and a bf16). A cache plane of fp8 elements is a byte array of the bf16 plane's element
// indices: element i of the plane is byte i. The conversions are the hardware's (sm_89+); the
// host refuses an fp8 cache on older devices (CudaBackend::alloc_kv_cache_impl), where these
// helpers compile to zeros so the bf16 kernels of the same modules still build.
// The host prepends this file to the sources with fp8 instantiations (kernels.rs).
#if !defined(__CUDA_ARCH__) || __CUDA_ARCH__ >= 890
#define STARLING_FP8_CVT 1
#endif

// Two floats as two e4m3 bytes, `lo` in the low byte (one conversion instruction).
__device__ __forceinline__ unsigned short e4m3x2_from_floats(float lo, float hi) {
#ifdef STARLING_FP8_CVT
    unsigned short r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
#else
    return 0;
#endif
}

// One float as an e4m3 byte.
__device__ __forceinline__ unsigned char e4m3_from_float(float x) {
    return (unsigned char)(e4m3x2_from_floats(x, 0.f) & 0xff);
}

// Two e4m3 bytes (the low byte first) as two floats.
__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned short v) {
#ifdef STARLING_FP8_CVT
    float lo, hi;
    asm("{\n\t.reg .b32 h2;\n\t.reg .f16 a, b;\n\t"
        "cvt.rn.f16x2.e4m3x2 h2, %2;\n\t"
        "mov.b32 {a, b}, h2;\n\t"
        "cvt.f32.f16 %0, a;\n\t"
        "cvt.f32.f16 %1, b;\n\t}"
        : "=f"(lo), "=f"(hi)
        : "h"(v));
    return make_float2(lo, hi);
#else
    return make_float2(0.f, 0.f);
#endif
}

// Two e4m3 bytes as one bf16x2 register (the low byte in the low half), exactly.
__device__ __forceinline__ unsigned e4m3x2_to_bf16x2(unsigned short v) {
    const float2 f = e4m3x2_to_float2(v);
    unsigned r;
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(r) : "f"(f.y), "f"(f.x));
    return r;
}

// Eight e4m3 (one 8-byte load) as floats.
__device__ __forceinline__ void unpack8_e4m3(const uint2& v, float* f) {
#pragma unroll
    for (int i = 0; i < 4; i++) {
        const unsigned word = i < 2 ? v.x : v.y;
        const float2 p = e4m3x2_to_float2((unsigned short)(word >> (16 * (i & 1))));
        f[2 * i] = p.x;
        f[2 * i + 1] = p.y;
    }
}

// Eight floats as eight e4m3 (one 8-byte store).
__device__ __forceinline__ uint2 pack8_e4m3(const float* f) {
    uint2 v;
    v.x = (unsigned)e4m3x2_from_floats(f[0], f[1]) | ((unsigned)e4m3x2_from_floats(f[2], f[3]) << 16);
    v.y = (unsigned)e4m3x2_from_floats(f[4], f[5]) | ((unsigned)e4m3x2_from_floats(f[6], f[7]) << 16);
    return v;
}

// Sixteen e4m3 (one 16-byte chunk) as sixteen bf16 (two 16-byte chunks: elements 0..7, 8..15).
__device__ __forceinline__ void e4m3x16_to_bf16(const uint4& v, uint4& lo, uint4& hi) {
    const unsigned w[4] = {v.x, v.y, v.z, v.w};
    unsigned r[8];
#pragma unroll
    for (int i = 0; i < 8; i++) r[i] = e4m3x2_to_bf16x2((unsigned short)(w[i >> 1] >> (16 * (i & 1))));
    lo = make_uint4(r[0], r[1], r[2], r[3]);
    hi = make_uint4(r[4], r[5], r[6], r[7]);
}
