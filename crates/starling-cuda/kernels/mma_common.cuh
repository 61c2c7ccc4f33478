// Tensor-core helpers shared by the tiled attention kernels (prefill_attention.cu,
// decode_attention.cu). Not a kernel module of its own: the host prepends it to each of those
// sources (kernels.rs), since NVRTC compiles one source string per module.
#include <cuda_bf16.h>
typedef __nv_bfloat16 bf16;

// NVRTC has no math.h: -inf by its bit pattern.
#define NEG_INF (__int_as_float(0xff800000))
#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define NO_SLOT 0xffffffffu

// Element offset of 16-byte chunk `c` of row `r` in a swizzled [rows][D] bf16 tile (chunk c of
// row r stored at c ^ (r & 7), so ldmatrix reads are free of bank conflicts).
template <int D>
__device__ __forceinline__ int swz(int r, int c) {
    return r * D + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ unsigned smem_u32(const void* p) {
    return (unsigned)__cvta_generic_to_shared(p);
}

// 16-byte global → shared copy; an invalid source writes zeros (src-size 0 reads nothing), so
// rows past the end of the context hold finite values (0 · NaN would poison P·V).
__device__ __forceinline__ void cp_async16(bf16* dst, const bf16* src, bool valid) {
    const int n = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_u32(dst)), "l"(src),
                 "r"(n));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
// Waits until at most N of this thread's committed groups are still in flight.
template <int N>
__device__ __forceinline__ void cp_async_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(unsigned* r, const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(unsigned* r, const bf16* p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_u32(p)));
}

// c[16x8] += a[16x16] · b[16x8] (bf16 operands, f32 accumulators, PTX fragment layouts).
__device__ __forceinline__ void mma_bf16(float* c, const unsigned* a, unsigned b0, unsigned b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats as one bf16x2 register, `lo` in the low half (the lower column of a fragment).
__device__ __forceinline__ unsigned pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<unsigned*>(&v);
}

// A tile of KEYS key rows of D bf16 is copied by NTHREADS threads, one 16-byte chunk per copy:
// CPR chunks per row, RPP rows per pass, LPT passes (rows) per thread.
template <int D, int NTHREADS, int KEYS>
struct TileCopy {
    static constexpr int CPR = D / 8;
    static constexpr int RPP = NTHREADS / CPR;
    static constexpr int LPT = KEYS / RPP;
    static_assert(NTHREADS % CPR == 0 && KEYS % RPP == 0, "tile copy geometry");
};

// The cache slot of context position j: block_size is a power of two in every engine
// configuration (16 by default), where a shift and a mask replace the integer division and
// remainder (about 40 ALU instructions per key row and thread, a fifth of the tiled prefill
// kernel's instructions before this path); other sizes divide.
__device__ __forceinline__ unsigned paged_slot(const unsigned* __restrict__ table, int j,
                                               int block_size) {
    if ((block_size & (block_size - 1)) == 0) {
        const int shift = __ffs(block_size) - 1;
        return (table[j >> shift] << shift) | (unsigned)(j & (block_size - 1));
    }
    return table[j / block_size] * (unsigned)block_size + j % block_size;
}

// 2^x in one MUFU instruction (flushes results below 2^-126 to zero, which the softmax weights
// can spare); exp2f adds denormal handling around the same instruction.
__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

// The cache slots of the key rows this thread copies for the tile starting at key `kb`
// (NO_SLOT past `end`). Computed once per tile and used for both the K and the V copy.
template <int D, int NTHREADS, int KEYS>
__device__ __forceinline__ void tile_slots(unsigned* slots, const unsigned* __restrict__ table,
                                           int kb, int end, int block_size) {
    typedef TileCopy<D, NTHREADS, KEYS> G;
#pragma unroll
    for (int p = 0; p < G::LPT; p++) {
        const int j = kb + threadIdx.x / G::CPR + p * G::RPP;
        slots[p] = j < end ? paged_slot(table, j, block_size) : NO_SLOT;
    }
}

// Issues the copies of one K or V tile (this thread's rows, one 16-byte chunk each).
template <int D, int NTHREADS, int KEYS>
__device__ __forceinline__ void load_tile(bf16* s, const bf16* __restrict__ cache,
                                          const unsigned* slots, size_t slot_stride,
                                          size_t head_off) {
    typedef TileCopy<D, NTHREADS, KEYS> G;
    const int c = threadIdx.x % G::CPR;
#pragma unroll
    for (int p = 0; p < G::LPT; p++) {
        const int r = threadIdx.x / G::CPR + p * G::RPP;
        const bool valid = slots[p] != NO_SLOT;
        const bf16* src = valid ? cache + (size_t)slots[p] * slot_stride + head_off + c * 8 : cache;
        cp_async16(s + swz<D>(r, c), src, valid);
    }
}

// fp8 caches (fp8.cuh, prepended before this file): a K or V tile of KEYS rows of D e4m3 bytes is
// staged unswizzled ([KEYS][D] bytes) by 16-byte cp.async copies, D / 16 per row, then each thread
// converts the chunks it copied into the swizzled bf16 tile the mma loops read (every e4m3 value
// is a bf16: the conversion is exact). TileCopy<D / 2, ...> is the copy geometry (a row of D bytes
// is D / 2 bf16 words), so tile_slots<D / 2, ...> gives these copies' slots. `slot_stride` and
// `head_off` count elements, which are bytes here.
template <int D, int NTHREADS, int KEYS>
__device__ __forceinline__ void load_tile_fp8(unsigned char* s, const bf16* __restrict__ cache,
                                              const unsigned* slots, size_t slot_stride,
                                              size_t head_off) {
    typedef TileCopy<D / 2, NTHREADS, KEYS> G;
    const int c = threadIdx.x % G::CPR;
    const unsigned char* bytes = reinterpret_cast<const unsigned char*>(cache);
#pragma unroll
    for (int p = 0; p < G::LPT; p++) {
        const int r = threadIdx.x / G::CPR + p * G::RPP;
        const bool valid = slots[p] != NO_SLOT;
        const unsigned char* src =
            valid ? bytes + (size_t)slots[p] * slot_stride + head_off + c * 16 : bytes;
        cp_async16(reinterpret_cast<bf16*>(s + r * D + c * 16), reinterpret_cast<const bf16*>(src),
                   valid);
    }
}

// This thread's chunks of a staged fp8 tile (load_tile_fp8, whose copies must have landed:
// cp_async_wait) as bf16 in the swizzled tile `dst`. Rows past the context were zero-filled.
template <int D, int NTHREADS, int KEYS>
__device__ __forceinline__ void convert_tile_fp8(bf16* dst, const unsigned char* s) {
    typedef TileCopy<D / 2, NTHREADS, KEYS> G;
    const int c = threadIdx.x % G::CPR;
#pragma unroll
    for (int p = 0; p < G::LPT; p++) {
        const int r = threadIdx.x / G::CPR + p * G::RPP;
        uint4 lo, hi;
        e4m3x16_to_bf16(*reinterpret_cast<const uint4*>(s + r * D + c * 16), lo, hi);
        *reinterpret_cast<uint4*>(dst + swz<D>(r, 2 * c)) = lo;
        *reinterpret_cast<uint4*>(dst + swz<D>(r, 2 * c + 1)) = hi;
    }
}
