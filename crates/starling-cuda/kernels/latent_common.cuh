// Helpers shared by the latent kernel modules (latent.cu, latent_rot.cu). Not a module of its
// own: the host prepends it after fp8.cuh and mma_common.cuh (kernels.rs).
#include <cuda_fp16.h>

// A compile-time flag for generic lambdas (NVRTC has no <type_traits>).
template <bool B>
struct BoolTag {
    static constexpr bool value = B;
};

// 16-byte global → shared copy through L1 (zero-filled when invalid): for rows whose sectors
// are requested in two halves by one thread.
__device__ __forceinline__ void cp_async16_ca(bf16* dst, const bf16* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}

// 8-byte global → shared copy through L1 (zero-filled when invalid): a chunk of 8 elements of an
// fp8 latent row, which is only 8-byte aligned (stored ranks are multiples of 8 bytes, not 16).
__device__ __forceinline__ void cp_async8(void* dst, const void* src, bool valid) {
    const int n = valid ? 8 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}

// Eight e4m3 (one 8-byte chunk, the lowest byte first) as eight bf16 (one 16-byte chunk),
// exactly: every e4m3 value is a bf16 (fp8.cuh).
__device__ __forceinline__ uint4 e4m3x8_to_bf16(const uint2& v) {
    return make_uint4(e4m3x2_to_bf16x2((unsigned short)(v.x & 0xffffu)),
                      e4m3x2_to_bf16x2((unsigned short)(v.x >> 16)),
                      e4m3x2_to_bf16x2((unsigned short)(v.y & 0xffffu)),
                      e4m3x2_to_bf16x2((unsigned short)(v.y >> 16)));
}

// A latent plane's element `elem` as a byte pointer (fp8 planes are byte arrays passed as bf16*).
__device__ __forceinline__ const unsigned char* plane_bytes(const bf16* plane, size_t elem) {
    return reinterpret_cast<const unsigned char*>(plane) + elem;
}

// 4-byte global → shared copy (zero-filled when invalid).
__device__ __forceinline__ void cp_async4(void* dst, const void* src, bool valid) {
    const int n = valid ? 4 : 0;
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}

// A latent layer's split of the context (backend/latent_plan.rs): an eager launch passes the
// plan as `splits`/`split_len` with no plan words; a replay reads its layer shape's two plan
// words from the batch buffer (written per step by the host from the same function), the launch
// grid being sized for the bucket's bound.
__device__ __forceinline__ void latent_split(const unsigned* __restrict__ plan, int& splits,
                                             int& split_len) {
    if (plan != nullptr) {
        splits = (int)plan[0];
        split_len = (int)plan[1];
    }
}

// Bits of the slot's position (stored as two bf16 words: the row-moving kernels copy it as data).
__device__ __forceinline__ unsigned slot_position(const unsigned* __restrict__ positions,
                                                  unsigned slot) {
    return positions[slot];
}

// The parameter list of the latent score kernels that reconstruct keys (latent.cu
// latent_scores_d{D}_{elem}, latent_rel.cu latent_scores_rel_d{D}_k{KS}_bf16): the host pushes one
// list for both (backend/latent_scores.rs).
#define LATENT_SCORE_PARAMS                                                                      \
    float *scores, float *part_m, const bf16 *qkv, int qkv_width, const bf16 *key_plane,         \
        int key_width, const unsigned *pos_plane, const int *latent_heads, const bf16 *key_up,   \
        const bf16 *key_bias, const float2 *rope_table, int interleaved, int rs,                 \
        const unsigned *rows, const unsigned *tok_seq, const unsigned *tok_visible,              \
        const unsigned *score_offsets, const unsigned *block_tables, int max_blocks,             \
        int block_size, int num_kv_heads, int group, float scale, int splits, int split_len,     \
        const unsigned *plan
