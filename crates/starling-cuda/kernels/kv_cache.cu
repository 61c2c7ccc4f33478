// KV-cache management kernels: whole-block copies, one sequence's rows gathered out of the paged
// cache or scattered back into it, and the gather half of eviction compaction. CPU references in
// starling-backend/src/cpu (named above each kernel); parity tests in tests/parity.rs.
//
// Cache layout (one plane: keys, values, or a latent layer's positions as two bf16 words per
// slot): [num_slots, row_elems] bf16, slot = block * block_size + offset, so a block is one
// contiguous run of block_size * row_elems elements (row_elems = num_kv_heads * head_dim for a
// full layer's K or V). Rows are moved as 16-byte vectors (8 bf16) whenever the row width allows it; cudarc
// allocations are 256-byte aligned, so a width that is a multiple of 8 keeps every vector aligned.
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;

// Flat cache slot of a sequence's physical token t.
__device__ __forceinline__ size_t token_slot(const unsigned* __restrict__ table, int block_size,
                                             size_t t) {
    return (size_t)table[t / block_size] * block_size + t % block_size;
}

// cpu::kv_transfer::copy_kv_blocks: block pairs[2p + 1] = block pairs[2p] of one plane; one CUDA
// block per pair (the host launches once per plane). The host has checked that no destination is
// a source and destinations are distinct, so pairs are independent (no __restrict__: source and
// destination are disjoint runs of the same buffer).
extern "C" __global__ void copy_kv_blocks_bf16(bf16* cache, const unsigned* __restrict__ pairs,
                                               size_t block_elems) {
    pdl_entry();
    const size_t src = (size_t)pairs[2 * blockIdx.x] * block_elems;
    const size_t dst = (size_t)pairs[2 * blockIdx.x + 1] * block_elems;
    if ((block_elems & 7) == 0) {
        const uint4* s = reinterpret_cast<const uint4*>(cache + src);
        uint4* d = reinterpret_cast<uint4*>(cache + dst);
        for (size_t i = threadIdx.x; i < block_elems / 8; i += blockDim.x) d[i] = s[i];
    } else {
        for (size_t i = threadIdx.x; i < block_elems; i += blockDim.x) cache[dst + i] = cache[src + i];
    }
}

// cpu::kv_transfer::gather_kv (and cpu::compact::read_keys): out[t, :] = cache[slot(t), :] for the
// sequence's physical tokens t < len; row_elems = num_kv_heads * head_dim. Grid-stride over
// 16-byte vectors.
extern "C" __global__ void gather_paged_rows_bf16(const bf16* __restrict__ cache,
                                                  const unsigned* __restrict__ table,
                                                  int block_size, bf16* __restrict__ out,
                                                  size_t len, int row_elems) {
    pdl_entry();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((row_elems & 7) == 0) {
        const size_t vpr = row_elems / 8;
        const uint4* src = reinterpret_cast<const uint4*>(cache);
        uint4* dst = reinterpret_cast<uint4*>(out);
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len * vpr; i += stride)
            dst[i] = src[token_slot(table, block_size, i / vpr) * vpr + i % vpr];
    } else {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len * row_elems;
             i += stride)
            out[i] = cache[token_slot(table, block_size, i / row_elems) * row_elems + i % row_elems];
    }
}

// cpu::kv_transfer::scatter_kv (and the scatter half of cpu::compact::compact_kv):
// cache[slot(t), :] = rows[t, :] for t < len. The host has checked that the blocks of tokens
// 0..len are distinct, so no two threads write one element.
extern "C" __global__ void scatter_paged_rows_bf16(bf16* __restrict__ cache,
                                                   const unsigned* __restrict__ table,
                                                   int block_size, const bf16* __restrict__ rows,
                                                   size_t len, int row_elems) {
    pdl_entry();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    if ((row_elems & 7) == 0) {
        const size_t vpr = row_elems / 8;
        const uint4* src = reinterpret_cast<const uint4*>(rows);
        uint4* dst = reinterpret_cast<uint4*>(cache);
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len * vpr; i += stride)
            dst[token_slot(table, block_size, i / vpr) * vpr + i % vpr] = src[i];
    } else {
        for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < len * row_elems;
             i += stride)
            cache[token_slot(table, block_size, i / row_elems) * row_elems + i % row_elems] = rows[i];
    }
}

// Gather half of cpu::compact::compact_kv: out[i, h, :] = cache[slot(keep[h * count + i]), h, :],
// the i-th kept row of list h, for i < count; a row is num_kv_heads segments of head_dim (a full
// layer: one list per head; a latent layer: one list, one segment of the whole row). Compaction then scatters `out` to physical tokens
// 0..count with scatter_paged_rows_bf16; going through this scratch copy (a second launch on the
// same stream) makes it correct when kept source slots overlap their destinations.
extern "C" __global__ void gather_kept_rows_bf16(const bf16* __restrict__ cache,
                                                 const unsigned* __restrict__ table, int block_size,
                                                 const unsigned* __restrict__ keep,
                                                 bf16* __restrict__ out, size_t count,
                                                 int num_kv_heads, int head_dim) {
    pdl_entry();
    const size_t stride = (size_t)gridDim.x * blockDim.x;
    const bool vec = (head_dim & 7) == 0;
    // Units per head row: 16-byte vectors when the head width allows, else single elements.
    const size_t upr = vec ? head_dim / 8 : head_dim;
    const size_t n = count * num_kv_heads * upr;
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += stride) {
        const size_t c = i % upr, r = i / upr;  // r = kept row * num_kv_heads + head
        const size_t h = r % num_kv_heads, k = r / num_kv_heads;
        const size_t slot = token_slot(table, block_size, keep[h * count + k]);
        const size_t src = (slot * num_kv_heads + h) * upr + c;
        if (vec)
            reinterpret_cast<uint4*>(out)[i] = reinterpret_cast<const uint4*>(cache)[src];
        else
            out[i] = cache[src];
    }
}
