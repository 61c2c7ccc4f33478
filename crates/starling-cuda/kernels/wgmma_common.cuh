// Hopper warpgroup MMA (wgmma.mma_async, sm_90a) helpers shared by the Hopper kernels
// (prefill_wgmma.cu, latent_wgmma.cu). Not a module of its own: the host prepends it to theirs
// (kernels.rs), after mma_common.cuh (pack_bf16, smem_u32, cp.async).

// Accumulator operands of the products: r[N][4] (N = 8 for 64 columns, 16 for 128) with
// constraint C ("+f" read and written, "=f" written only), and their register lists in the
// instruction text.
#define WGMMA_ACC32_OPERANDS(C, r)                                                         \
    C(r[0][0]), C(r[0][1]), C(r[0][2]), C(r[0][3]), C(r[1][0]), C(r[1][1]), C(r[1][2]), \
    C(r[1][3]), C(r[2][0]), C(r[2][1]), C(r[2][2]), C(r[2][3]), C(r[3][0]), C(r[3][1]), \
    C(r[3][2]), C(r[3][3]), C(r[4][0]), C(r[4][1]), C(r[4][2]), C(r[4][3]), C(r[5][0]), \
    C(r[5][1]), C(r[5][2]), C(r[5][3]), C(r[6][0]), C(r[6][1]), C(r[6][2]), C(r[6][3]), \
    C(r[7][0]), C(r[7][1]), C(r[7][2]), C(r[7][3])
#define WGMMA_ACC32_REGS                                                               \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, " \
    "%18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WGMMA_ACC64_OPERANDS(C, r) WGMMA_ACC32_OPERANDS(C, r), WGMMA_ACC32_OPERANDS(C, (r + 8))
#define WGMMA_ACC64_REGS \
    "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, " \
    "%19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, " \
    "%36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, " \
    "%53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"

// S[64 x N] (+)= A · Bᵀ for this warpgroup, both operands from shared-memory descriptors
// (K-major): NAME<ACC>(s, desc_a, desc_b) for the m64nNk16 instruction SHAPE with NT = N / 8
// accumulator tiles (register list REGS, operands OPERANDS), the descriptors being operands
// DESCS and scale-d operand SCALE. s[j][v] is the accumulator of 8-key tile j, wgmma's per-warp
// layout being mma.sync's C fragment. ACC = false overwrites s (scale-d 0, an immediate turned
// into the predicate: s is neither zero-filled nor read, so it is not live across the key loop).
#define WGMMA_SS_PTX(SHAPE, REGS, DESCS, SCALE)                                             \
    "{\n.reg .pred p;\nsetp.ne.b32 p, " SCALE ", 0;\n"                                      \
    "wgmma.mma_async.sync.aligned." SHAPE ".f32.bf16.bf16 {" REGS "}, " DESCS ", p, 1, 1, 0, " \
    "0;\n}\n"
#define DEFINE_WGMMA_SS(NAME, SHAPE, NT, REGS, OPERANDS, DESCS, SCALE)                   \
    template <bool ACC>                                                                   \
    __device__ __forceinline__ void NAME(float(&s)[NT][4], unsigned long long desc_a,    \
                                         unsigned long long desc_b) {                     \
        if constexpr (ACC)                                                                \
            asm volatile(WGMMA_SS_PTX(SHAPE, REGS, DESCS, SCALE)                          \
                         : OPERANDS("+f", s)                                              \
                         : "l"(desc_a), "l"(desc_b), "n"(1));                             \
        else                                                                              \
            asm volatile(WGMMA_SS_PTX(SHAPE, REGS, DESCS, SCALE)                          \
                         : OPERANDS("=f", s)                                              \
                         : "l"(desc_a), "l"(desc_b), "n"(0));                             \
    }
DEFINE_WGMMA_SS(wgmma_m64n64k16_ss, "m64n64k16", 8, WGMMA_ACC32_REGS, WGMMA_ACC32_OPERANDS,
                "%32, %33", "%34")
DEFINE_WGMMA_SS(wgmma_m64n128k16_ss, "m64n128k16", 16, WGMMA_ACC64_REGS, WGMMA_ACC64_OPERANDS,
                "%64, %65", "%66")

// O[64 x 128] += P · V for this warpgroup: P in registers (a[0..3], mma.sync's A fragment of this
// warp's 16 rows), V from a shared-memory descriptor, MN-major (rows are keys with d contiguous:
// imm-trans-b 1).
__device__ __forceinline__ void wgmma_m64n128k16_rs(float (&o)[16][4], const unsigned (&a)[4],
                                                    unsigned long long desc_b) {
    asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n"
                 "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WGMMA_ACC64_REGS
                 "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n"
                 : WGMMA_ACC64_OPERANDS("+f", o)
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "n"(1));
}

__device__ __forceinline__ void wgmma_fence() {
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_commit() {
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}
// Waits until at most N of this warpgroup's committed wgmma groups are pending (in order).
template <int N>
__device__ __forceinline__ void wgmma_wait() {
    asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory");
}
// Keeps the compiler from moving reads or writes of an accumulator across the waits above (they
// name no registers): each accumulator is "redefined" here, after the wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(float (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+f"(r[i][e])::"memory");
}
// The same for A fragments in registers, which a wgmma reads until it completes: they stay
// live, and unwritten, until after the wait.
template <int N>
__device__ __forceinline__ void wgmma_fence_operands(unsigned (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(r[i][e])::"memory");
}
// Makes this thread's completed generic-proxy writes to shared memory (cp.async) visible to the
// async proxy (wgmma operand reads).
__device__ __forceinline__ void fence_proxy_async_shared() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// x, opaque to the compiler: descriptors built from it inside the key loop are computed there,
// not hoisted out of it and held in registers across it (16 of Q's alone).
__device__ __forceinline__ unsigned opaque(unsigned x) {
    asm volatile("" : "+r"(x));
    return x;
}

// A shared-memory matrix descriptor of the 128-byte swizzled layout: start address, leading and
// stride byte offsets (each in 16-byte units), base offset 0 (the tiles start 1024-byte aligned)
// and layout type 1 (the 128-byte swizzle) in bits 62-63.
__device__ __forceinline__ unsigned long long wgmma_desc(unsigned addr, unsigned lbo,
                                                         unsigned sbo) {
    return (unsigned long long)((addr & 0x3ffff) >> 4) |
           ((unsigned long long)(lbo >> 4) << 16) | ((unsigned long long)(sbo >> 4) << 32) |
           (1ull << 62);
}

// The 128-byte swizzled layout: a [R rows][128] bf16 tile is two column halves of 64 elements
// (d 0-63, then 64-127, the second R · 128 bytes in), each R rows of 128 bytes, and 16-byte chunk
// c (0-7) of row r sits at r · 128 + (c ^ r % 8) · 16 in its half (the hardware's Swizzle<3,4,3>
// on 1024-byte-aligned atoms of 8 rows). K-major operands (Q, K): stride byte offset 1024 (the
// next 8 rows), leading offset unused; k-step ks starts (ks / 4) · R · 128 + (ks % 4) · 32 bytes
// in. V, the MN-major operand of P·V (rows are keys, d contiguous): leading byte offset R · 128
// (the next 64 of d), stride byte offset 1024 (the next 8 keys); k-step kk starts 2048 · kk in.
// (Swapping V's two offsets fails the parity test: session 30.)
#define WG_SW_SBO 1024

// Byte offset of 16-byte chunk c16 (0-15) of row r in an R-row tile.
template <int R>
__device__ __forceinline__ int tile_chunk_offset(int r, int c16) {
    return (c16 >> 3) * R * 128 + r * 128 + (((c16 & 7) ^ (r & 7)) << 4);
}
