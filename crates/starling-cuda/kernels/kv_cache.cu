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

// starling-backend keep::KeepPlan::keep_lists: the indices each list of one layer's compaction
// keeps, from scores[heads, n] (f32, as key_scores / window_scores leave them), written ascending
// as keep[list * count + k], relative to the first rewritten slot `skip` (every slot before it is
// kept in place). One CUDA block of SELECT_THREADS threads per list.
//
// Tokens before `first` and from `end` on are kept. Among the candidates c = first .. end (r =
// c - first, C = end - first) those with r < sinks or r + window >= C are protected; of the
// others the best `room` by rank key are kept: the score's bits made monotone (NaN as -inf)
// above the reversed relative index, so keys are unique, a larger key is a better token and
// equal scores favour the lower index, exactly as the host's rank_key. The room-th largest key
// is found by a radix select of up to 8 passes (8 bits a pass, a shared 256-bin histogram of the
// keys still matching the prefix chosen so far; it stops once every key under the chosen prefix
// is kept), then one ordered pass (warp ballots and a scan of
// the warps' counts) writes the kept tokens from `skip` on. Layer-wide plans rank every list by
// the mean of the heads' scores, summed in head order and then divided, as the host does, so
// the means are bit-identical. O(passes x C x heads) reads, no atomics on the output.
#define SELECT_THREADS 1024
#define SELECT_WARPS (SELECT_THREADS / 32)

__device__ __forceinline__ float plan_score(const float* __restrict__ scores, int n, int heads,
                                            int list, int layer_wide, int i) {
    if (!layer_wide) return scores[(size_t)list * n + i];
    float m = 0.f;
    for (int h = 0; h < heads; h++) m += scores[(size_t)h * n + i];
    return m / (float)heads;
}

__device__ __forceinline__ unsigned long long rank_key(float score, int r) {
    // NaN ranks lowest (as -inf); `score != score` holds only for NaN.
    const unsigned bits = score != score ? 0xff800000u : __float_as_uint(score);
    const unsigned monotone = (bits & 0x80000000u) ? ~bits : (bits | 0x80000000u);
    return ((unsigned long long)monotone << 32) | (unsigned long long)(0xffffffffu - (unsigned)r);
}

extern "C" __global__ void select_kept_tokens(const float* __restrict__ scores, int n, int heads,
                                              int layer_wide, int first, int end, int sinks,
                                              int window, int room, int skip,
                                              unsigned* __restrict__ keep, int count) {
    pdl_entry();
    __shared__ unsigned hist[256];
    __shared__ unsigned long long s_prefix;
    __shared__ unsigned s_remaining;
    __shared__ int s_settled;
    __shared__ unsigned warp_counts[SELECT_WARPS];
    __shared__ unsigned warp_offsets[SELECT_WARPS];
    __shared__ unsigned s_total;
    const int list = blockIdx.x;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int C = end - first;
    // Protected: the first `sinks` and the last `window` candidates.
    const int protected_count = min(sinks + window, C);
    const int others = C - protected_count;
    const bool none = room <= 0, all = room >= others;
    unsigned long long threshold = 0;
    if (!none && !all) {
        unsigned long long prefix = 0;
        unsigned remaining = (unsigned)room;
        for (int shift = 56; shift >= 0; shift -= 8) {
            for (int d = threadIdx.x; d < 256; d += blockDim.x) hist[d] = 0;
            __syncthreads();
            const unsigned long long mask = shift == 56 ? 0ull : (~0ull << (shift + 8));
            for (int r = threadIdx.x; r < C; r += blockDim.x) {
                if (r < sinks || r + window >= C) continue;
                const unsigned long long k =
                    rank_key(plan_score(scores, n, heads, list, layer_wide, first + r), r);
                if ((k & mask) == prefix) atomicAdd(&hist[(k >> shift) & 255], 1u);
            }
            __syncthreads();
            if (threadIdx.x == 0) {
                // The digit holding the remaining-th largest key (digit 0 when no higher one
                // does: the keys matching the prefix number at least `remaining`).
                unsigned above = 0;
                int d = 255;
                for (; d > 0; d--) {
                    if (above + hist[d] >= remaining) break;
                    above += hist[d];
                }
                s_remaining = remaining - above;
                s_prefix = prefix | ((unsigned long long)d << shift);
                // Every key under the chosen prefix is kept: the prefix (lower bits zero) is
                // the threshold, with no further pass (distinct scores settle after the four
                // passes over the score's bits).
                s_settled = hist[d] == remaining - above;
            }
            __syncthreads();
            prefix = s_prefix;
            remaining = s_remaining;
            if (s_settled) break;
        }
        // Keys are unique: after the last pass the room-th largest is the one left; after a
        // settled pass, the prefix bounds exactly the `room` largest from below.
        threshold = prefix;
    }
    unsigned base = 0;
    for (int t0 = skip; t0 < n; t0 += blockDim.x) {
        const int i = t0 + threadIdx.x;
        bool kept = false;
        if (i < n) {
            if (i < first || i >= end) {
                kept = true;
            } else {
                const int r = i - first;
                kept = r < sinks || r + window >= C ||
                       (!none && (all || rank_key(plan_score(scores, n, heads, list, layer_wide, i),
                                                  r) >= threshold));
            }
        }
        const unsigned ballot = __ballot_sync(0xffffffffu, kept);
        if (lane == 0) warp_counts[warp] = __popc(ballot);
        __syncthreads();
        if (warp == 0) {
            const unsigned mine = lane < SELECT_WARPS ? warp_counts[lane] : 0u;
            unsigned v = mine;
            for (int o = 1; o < 32; o <<= 1) {
                const unsigned t = __shfl_up_sync(0xffffffffu, v, o);
                if (lane >= o) v += t;
            }
            if (lane < SELECT_WARPS) warp_offsets[lane] = v - mine;
            if (lane == 31) s_total = v;
        }
        __syncthreads();
        if (kept) {
            const unsigned pos = base + warp_offsets[warp] + __popc(ballot & ((1u << lane) - 1u));
            // The host checked that the plan keeps exactly `count` from `skip` on.
            if (pos < (unsigned)count) keep[(size_t)list * count + pos] = (unsigned)(i - skip);
        }
        base += s_total;
        __syncthreads();
    }
}
