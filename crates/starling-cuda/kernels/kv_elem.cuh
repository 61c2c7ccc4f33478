// Eight consecutive cache elements of a K or V plane, for the kernels instantiated for both
// cache element types (attention.cu, key_scores.cu): `FP8` planes hold one e4m3 byte per element
// (fp8.cuh), others bf16. `elem` is the element index in the plane (bf16 units for both), a
// multiple of 8. The host prepends bf16_vec.cuh and fp8.cuh before this file.

// The raw bytes of elements elem..elem+7: a 16-byte bf16 vector, or 8 fp8 bytes in .x/.y.
template <bool FP8>
__device__ __forceinline__ uint4 load_kv8(const bf16* __restrict__ plane, size_t elem) {
    if (FP8) {
        const uint2 r =
            *reinterpret_cast<const uint2*>(reinterpret_cast<const unsigned char*>(plane) + elem);
        return make_uint4(r.x, r.y, 0u, 0u);
    }
    return *reinterpret_cast<const uint4*>(plane + elem);
}

// What load_kv8 read, as eight floats.
template <bool FP8>
__device__ __forceinline__ void unpack_kv8(const uint4& raw, float* f) {
    if (FP8)
        unpack8_e4m3(make_uint2(raw.x, raw.y), f);
    else
        unpack8(raw, f);
}

// One element of a plane as a float (the scalar paths of widths that are not multiples of 8).
template <bool FP8>
__device__ __forceinline__ float load_kv1(const bf16* __restrict__ plane, size_t elem) {
    if (FP8) {
        const unsigned char b = reinterpret_cast<const unsigned char*>(plane)[elem];
        return e4m3x2_to_float2((unsigned short)b).x;
    }
    return __bfloat162float(plane[elem]);
}
