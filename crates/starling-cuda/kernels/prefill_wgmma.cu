// Tiled paged attention for prefill chunks on Hopper (sm_90a: wgmma), head_dim 128, bf16 cache.
// Computes what prefill_attention.cu computes (CPU reference: starling-backend
// cpu::attention::paged_attention), with the same launch arguments, tiles, split plan and output
// layout: the host runs this kernel in its place where the device is compute capability 9.0
// (kernels.rs loads the module for sm_90a only there).
//
// FlashAttention-3's schedule without TMA, warp-specialised: two consumer warpgroups (warps 0-7)
// of 64 query rows each (BM = 128 a block) run the products on warpgroup MMA (wgmma.mma_async),
// and a producer warpgroup (warps 8-11) only copies K/V tiles through the block table into a
// ring of stages handed over through mbarriers (see the kernel below). S = Q·Kᵀ (m64n64k16 or
// m64n128k16 × 8 k-steps) reads both operands from shared memory through descriptors, so
// neither Q nor K passes through registers (no ldmatrix); O += P·V (m64n128k16) takes P from the
// registers the softmax leaves it in (the accumulator layout of S is mma.sync's C fragment, so P
// packs into the A fragment exactly as in the mma.sync kernel) and V from shared memory. Scores
// and outputs stay in f32 registers; the online softmax, causal and window masks, tile key
// ranges and output write are prefill_common.cuh's, shared with the mma.sync kernel.
//
// Shared memory holds every tile in the 128-byte swizzled layout (wgmma_common.cuh, with the
// wgmma helpers: tile_chunk_offset): 8 consecutive threads copy one row's 128 contiguous bytes
// (coalesced), and wgmma reads it without bank conflicts. Nsight Compute on the H100 (session 29 → 30, MHA 4k): the unswizzled
// core-matrix layout this replaced moved 49% excess global sectors and 64% excess shared
// wavefronts; the swizzled kernel is 1.17-1.19x faster.

#define WG_BM 128        // query rows per block (host: PREFILL_TILE_ROWS)
#define WG_BN 64         // keys per host tile (host: PREFILL_TILE_KEYS): splits are multiples
#define WG_THREADS 256   // the two consumer warpgroups (host: PREFILL_WGMMA_THREADS)

// Row, chunk and destination byte of copy p by thread t of THREADS copying threads of an R-row
// tile: consecutive threads take consecutive chunks of one row (128 contiguous source bytes for
// 8 threads, one 128-byte destination row).
template <int D, int THREADS, int R>
struct WgTileCopy {
    int row, chunk, dst;
    __device__ __forceinline__ WgTileCopy(int t, int p) {
        constexpr int CPR = D / 8;
        static_assert(THREADS % CPR == 0, "a thread's chunk is the same in every copy");
        const int q = t + THREADS * p;
        row = q / CPR;
        chunk = q % CPR;
        dst = tile_chunk_offset<R>(row, chunk);
    }
};

// Copies this thread's share of the Q tile ([BM rows] of the block's tokens × group heads, rows
// past `rows` zero-filled) into q_s, as thread t of THREADS copying threads.
template <int D, int THREADS>
__device__ __forceinline__ void load_q_tile(unsigned char* q_s, const bf16* __restrict__ qkv,
                                            int qkv_width, int first, int rows, int group,
                                            int kvh, int t) {
    constexpr int Q_COPIES = WG_BM * D / 8 / THREADS;
#pragma unroll
    for (int p = 0; p < Q_COPIES; p++) {
        const WgTileCopy<D, THREADS, WG_BM> c(t, p);
        const bool valid = c.row < rows;
        const bf16* src = valid ? qkv + (size_t)(first + c.row / group) * qkv_width +
                                      (size_t)(kvh * group + c.row % group) * D + c.chunk * 8
                                : qkv;
        cp_async16(reinterpret_cast<bf16*>(q_s + c.dst), src, valid);
    }
}

// Issues this thread's copies of the K and V tiles of keys [kb, kb + BN) into k_dst (V one tile
// after it), as thread t of THREADS copying threads; rows past kv_end are zero-filled (0 · NaN
// would poison P·V).
template <int D, int THREADS, int BN>
__device__ __forceinline__ void load_kv_tile_pair(unsigned char* k_dst,
                                                  const bf16* __restrict__ k_cache,
                                                  const bf16* __restrict__ v_cache,
                                                  const unsigned* __restrict__ table,
                                                  int block_size, size_t slot_stride,
                                                  size_t head_off, int kb, int kv_end, int t) {
    constexpr int TILE_BYTES = BN * D * 2;
    constexpr int KV_COPIES = BN * D / 8 / THREADS;
    static_assert(KV_COPIES * THREADS * 8 == BN * D, "K/V copy geometry");
#pragma unroll
    for (int p = 0; p < KV_COPIES; p++) {
        const WgTileCopy<D, THREADS, BN> c(t, p);
        const int j = kb + c.row;
        const bool valid = j < kv_end;
        const size_t off =
            valid ? (size_t)paged_slot(table, j, block_size) * slot_stride + head_off + c.chunk * 8
                  : 0;
        cp_async16(reinterpret_cast<bf16*>(k_dst + c.dst), k_cache + off, valid);
        cp_async16(reinterpret_cast<bf16*>(k_dst + TILE_BYTES + c.dst), v_cache + off, valid);
    }
}

// S[64 x BN] = Q · Kᵀ for this warpgroup's 64 rows (Q at q_addr, its rows of a WG_BM-row tile;
// K at k_addr, BN 64 or 128 keys), issued, not waited for.
template <int D, int BN>
__device__ __forceinline__ void wgmma_scores(float (&s)[BN / 8][4], unsigned q_addr,
                                             unsigned k_addr) {
    static_assert(BN == 64 || BN == 128, "S is m64n64 or m64n128");
    static_assert(D == 128, "the swizzled layout is two 64-wide halves of d");
#pragma unroll
    for (int ks = 0; ks < D / 16; ks++) {
        const unsigned long long qd =
            wgmma_desc(q_addr + (ks / 4) * WG_BM * 128 + (ks % 4) * 32, 16, WG_SW_SBO);
        const unsigned long long kd =
            wgmma_desc(k_addr + (ks / 4) * BN * 128 + (ks % 4) * 32, 16, WG_SW_SBO);
        if constexpr (BN == 64) {
            if (ks == 0) wgmma_m64n64k16_ss<false>(s, qd, kd);
            else wgmma_m64n64k16_ss<true>(s, qd, kd);
        } else {
            if (ks == 0) wgmma_m64n128k16_ss<false>(s, qd, kd);
            else wgmma_m64n128k16_ss<true>(s, qd, kd);
        }
    }
}

// P (the softmax's S) as the A fragments of P·V: S's accumulators of two 8-key tiles are P's A
// fragment of 16 keys.
template <int BN>
__device__ __forceinline__ void pack_p(unsigned (&a)[BN / 16][4], const float (&s)[BN / 8][4]) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++) {
        a[kk][0] = pack_bf16(s[2 * kk][0], s[2 * kk][1]);
        a[kk][1] = pack_bf16(s[2 * kk][2], s[2 * kk][3]);
        a[kk][2] = pack_bf16(s[2 * kk + 1][0], s[2 * kk + 1][1]);
        a[kk][3] = pack_bf16(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
}

// O[64 x D] += P · V for this warpgroup (V at v_addr, MN-major), issued, not waited for.
template <int D, int BN>
__device__ __forceinline__ void wgmma_pv(float (&o)[16][4], const unsigned (&a)[BN / 16][4],
                                         unsigned v_addr) {
#pragma unroll
    for (int kk = 0; kk < BN / 16; kk++)
        wgmma_m64n128k16_rs(o, a[kk], wgmma_desc(v_addr + 2048 * kk, BN * 128, WG_SW_SBO));
}

// The launch arguments the kernel takes (prefill_attention.cu's), as parameters of the kernel
// (R empty) and of its implementation (R __restrict__), and as the arguments passed from one to
// the other.
#define WG_PREFILL_PARAMS(R)                                                                     \
    bf16 *R out, float *R part_acc, float *R part_ml, const bf16 *R qkv, int qkv_width,          \
        const bf16 *R k_cache, const bf16 *R v_cache, const unsigned *R tiles,                  \
        const unsigned *R tok_seq, const unsigned *R tok_visible, const unsigned *R block_tables, \
        int max_blocks, int block_size, int num_kv_heads, int group, float scale, int window,   \
        int splits, int split_len
#define WG_PREFILL_ARGS                                                                        \
    out, part_acc, part_ml, qkv, qkv_width, k_cache, v_cache, tiles, tok_seq, tok_visible,     \
        block_tables, max_blocks, block_size, num_kv_heads, group, scale, window, splits,       \
        split_len

// ---------------------------------------------------------------------------------------------
// The kernel: two consumer warpgroups of 64 rows (warps 0-7) and a third, producer warpgroup
// (warps 8-11) that only copies K/V tiles into the ring. Stages are handed over through mbarriers instead of
// block-wide barriers, so the two consumers run free of each other and of the copies: each
// issues the next tile's S = Q·Kᵀ and the previous tile's O += P·V back to back, and computes
// the next P's exponentials while the P·V runs (one S and one P in registers: 32 + 16 beside
// O's 64). The producer hands registers to the consumers (setmaxnreg); one block per SM.
//
// Hand-over: each producer thread's copies of a stage arrive on the stage's `full` barrier as
// they land (cp.async.mbarrier.arrive.noinc: all 128 producer threads, the producer never
// waits for its own copies, as FlashAttention-3's paged cp.async path); a consumer waits on
// `full`, fences the stage into the async proxy (fence.proxy.async: cp.async writes through
// the generic proxy, wgmma reads through the async one) and issues its wgmma, and arrives on the
// stage's `empty` barrier (all 256 consumer threads) once its last wgmma reading it has
// completed; the producer waits on `empty` before refilling the stage. (Measured on the H100,
// session 29: this hand-over is 3-6% faster than the producer waiting for its own copies a few
// tiles behind and arriving itself.)

#define WS_PRODUCERS 128      // the producer warpgroup's threads
#define WS_CONSUMERS 256      // the consumer warpgroups' threads (WG_THREADS)
#define WS_THREADS 384        // host: PREFILL_WGMMA_WS_THREADS
#define WS_BN 64              // keys per K/V tile: 64 or 128 (S is m64n64 or m64n128)
#define WS_STAGES 4           // (K, V) tile pairs in the ring (6: 1.010–1.016× slower, s34/s35)
#define WS_RING_BYTES 196608  // host: PREFILL_WGMMA_WS_RING_BYTES (with Q: 224 KiB, one block)
#define WS_PRODUCER_REGS 40   // setmaxnreg: 128 × 40 + 256 × 232 ≤ 64K registers of an SM
#define WS_CONSUMER_REGS 232
// 1: the two consumers take turns issuing their products (named barriers 2 and 3, as
// FlashAttention-3's inter-warpgroup "ping-pong"), so one's exponentials run under the other's
// products; 0: each issues as soon as its operands are ready.
#define WS_PINGPONG 1
// The tiles start at the first 1024-byte boundary (the swizzle's atoms) inside these spare bytes.
#define WS_ALIGN_PAD 1024     // host: PREFILL_WGMMA_WS_ALIGN_PAD

static_assert(WS_CONSUMERS == WG_THREADS && WS_THREADS == WS_CONSUMERS + WS_PRODUCERS,
              "warp-specialised geometry");
// Tiles of WS_BN keys over splits that are multiples of the host's 64-key tiles: a split's last
// tile may be partial (masked), never shared with the next split.
static_assert(WS_BN % WG_BN == 0, "whole host tiles per kernel tile");
static_assert(WS_STAGES * 2 * WS_BN * 128 * 2 <= WS_RING_BYTES, "the ring fits what the host gives");
static_assert(WS_ALIGN_PAD >= 1024 - 128, "room to align the tiles to 1024 bytes");

__device__ __forceinline__ void mbar_init(unsigned addr, unsigned count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(addr), "r"(count) : "memory");
}
// Arrives (release: this thread's prior writes are visible to threads that observe the phase).
__device__ __forceinline__ void mbar_arrive(unsigned addr) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(addr) : "memory");
}
// Arrives on the barrier (without raising its pending count) once every cp.async this thread
// has issued so far has landed.
__device__ __forceinline__ void mbar_arrive_on_copies(unsigned addr) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(addr) : "memory");
}
// Waits (acquire) until the barrier's phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(unsigned addr, unsigned parity) {
    unsigned done;
    do {
        asm volatile(
            "{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
            "selp.u32 %0, 1, 0, p;\n}\n"
            : "=r"(done)
            : "r"(addr), "r"(parity)
            : "memory");
    } while (!done);
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_dec() {
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
template <int REGS>
__device__ __forceinline__ void setmaxnreg_inc() {
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(REGS));
}
// The consumer warpgroups alone (named barrier 1; 0 is __syncthreads').
__device__ __forceinline__ void consumers_sync() {
    asm volatile("bar.sync 1, %0;\n" ::"n"(WS_CONSUMERS) : "memory");
}

// Ping-pong turns: consumer warpgroup wg waits for its turn (barrier 2 + wg: its own 128 threads
// sync, the other warpgroup's 128 arrive) before issuing a tile's products, and hands the turn
// to the other after. Both issue n_tiles + 1 times; warpgroup 1 gives warpgroup 0 the first
// turn and skips its own last hand-over, so every barrier phase completes.
__device__ __forceinline__ void ws_turn_wait(int wg) {
    if (WS_PINGPONG) asm volatile("bar.sync %0, %1;\n" ::"r"(2 + wg), "n"(WS_CONSUMERS) : "memory");
}
__device__ __forceinline__ void ws_turn_pass(int wg, bool last) {
    if (WS_PINGPONG && !(wg == 1 && last))
        asm volatile("bar.arrive %0, %1;\n" ::"r"(3 - wg), "n"(WS_CONSUMERS) : "memory");
}

// One key tile's softmax on S (raw scores → P, m, l, corr), masked where the tile is not wholly
// visible to this warp's rows.
template <int NT>
__device__ __forceinline__ void ws_softmax(float (&s)[1][NT][4], float (&m)[1][2],
                                           float (&l)[1][2], float (&corr)[1][2],
                                           const PrefillTile<1>& tile, int window, int kb, int qc,
                                           float scale_log2) {
    auto keep = [&](int mt, int i, float c) { corr[mt][i] = c; };
    if (kb >= tile.warp_full_start && kb + NT * 8 <= tile.warp_full_end)
        online_softmax_scores<false, 1, NT>(s, m, l, tile.row_visible, tile.kv_end, window, kb,
                                            qc, scale_log2, keep);
    else
        online_softmax_scores<true, 1, NT>(s, m, l, tile.row_visible, tile.kv_end, window, kb,
                                           qc, scale_log2, keep);
}

template <int D, int BN, int STAGES>
__device__ void prefill_wgmma_ws_impl(
    WG_PREFILL_PARAMS(__restrict__)) {
    constexpr int NT = BN / 8;
    constexpr int DT = D / 8;
    constexpr int TILE_BYTES = BN * D * 2;
    static_assert(DT == 16, "O is m64n128");

    // Q [BM rows], then stage s of the ring: K at 2s tiles, V at 2s + 1 (host:
    // prefill_wgmma_ws_shared_bytes), from the first 1024-byte boundary (the swizzle's atoms).
    extern __shared__ __align__(128) unsigned char smem_raw[];
    __shared__ __align__(8) unsigned long long full_bar[STAGES], empty_bar[STAGES];
    unsigned char* q_s = smem_raw + ((1024 - (smem_u32(smem_raw) & 1023)) & 1023);
    unsigned char* ring = q_s + WG_BM * D * 2;
    const unsigned q_addr = smem_u32(q_s), ring_addr = smem_u32(ring);
    const unsigned full_addr = smem_u32(full_bar), empty_addr = smem_u32(empty_bar);

    const int tid = threadIdx.x;
    const int kvh = blockIdx.y, split = blockIdx.z;
    if (tid == 0) {
#pragma unroll
        for (int s = 0; s < STAGES; s++) {
            mbar_init(full_addr + 8 * s, WS_PRODUCERS);
            mbar_init(empty_addr + 8 * s, WS_CONSUMERS);
        }
    }
    // prefill_tile's block-wide barrier also publishes the initialised mbarriers.
    const PrefillTile<1> tile = prefill_tile<WS_THREADS, WS_THREADS / 32, 1, BN>(
        tiles, tok_seq, tok_visible, block_tables, max_blocks, group, window, split, split_len);
    const int n_tiles = tile.n_tiles, kv_start = tile.kv_start;

    if (tid >= WS_CONSUMERS) {
        // Producer: copy tile it into stage it % STAGES once the consumers have released the
        // tile that stage held; its copies arrive on the stage's `full` barrier as they land.
        setmaxnreg_dec<WS_PRODUCER_REGS>();
        const int t = tid - WS_CONSUMERS;
        const size_t slot_stride = (size_t)num_kv_heads * D, head_off = (size_t)kvh * D;
        for (int it = 0; it < n_tiles; it++) {
            const int st = it % STAGES;
            if (it >= STAGES) mbar_wait(empty_addr + 8 * st, ((it / STAGES) - 1) & 1);
            load_kv_tile_pair<D, WS_PRODUCERS, BN>(ring + 2 * st * TILE_BYTES, k_cache, v_cache,
                                                   tile.table, block_size, slot_stride, head_off,
                                                   kv_start + it * BN, tile.kv_end, t);
            mbar_arrive_on_copies(full_addr + 8 * st);
        }
        cp_async_wait<0>();  // (no copy may land after the block exits)
        return;
    }

    // Consumers.
    setmaxnreg_inc<WS_CONSUMER_REGS>();
    const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2, qc = lane & 3;
    load_q_tile<D, WS_CONSUMERS>(q_s, qkv, qkv_width, tile.first, tile.rows, group, kvh, tid);
    cp_async_commit();
    cp_async_wait<0>();
    fence_proxy_async_shared();
    consumers_sync();  // every consumer's share of Q has landed

    float o[1][DT][4];
#pragma unroll
    for (int dt = 0; dt < DT; dt++) o[0][dt][0] = o[0][dt][1] = o[0][dt][2] = o[0][dt][3] = 0.f;
    float m[1][2] = {{NEG_INF, NEG_INF}}, l[1][2] = {{0.f, 0.f}}, corr[1][2];
    const float scale_log2 = scale * LOG2E;
    // This warpgroup's 64 rows: 64 rows of 128 bytes in (in each half of d).
    const unsigned q_wg_addr = q_addr + wg * 64 * 128;
    auto k_addr = [&](int it) { return ring_addr + 2 * (it % STAGES) * TILE_BYTES; };

    if (n_tiles > 0) {
        float s[1][NT][4];
        unsigned a[BN / 16][4];
        if (WS_PINGPONG && wg == 1)
            asm volatile("bar.arrive 2, %0;\n" ::"n"(WS_CONSUMERS) : "memory");
        // Tile 0's scores and P (O is still zero: nothing to rescale).
        mbar_wait(full_addr, 0);
        fence_proxy_async_shared();  // the landed copies, into the async proxy
        ws_turn_wait(wg);
        wgmma_fence();
        wgmma_scores<D, BN>(s[0], opaque(q_wg_addr), k_addr(0));
        wgmma_commit();
        ws_turn_pass(wg, false);
        wgmma_wait<0>();
        wgmma_fence_operands(s[0]);
        ws_softmax(s, m, l, corr, tile, window, kv_start, qc, scale_log2);
        pack_p<BN>(a, s[0]);
        for (int it = 1; it < n_tiles; it++) {
            mbar_wait(full_addr + 8 * (it % STAGES), (it / STAGES) & 1);
            fence_proxy_async_shared();  // the landed copies, into the async proxy
            ws_turn_wait(wg);
            wgmma_fence();
            wgmma_scores<D, BN>(s[0], opaque(q_wg_addr), k_addr(it));  // tile it's S ...
            wgmma_commit();
            wgmma_pv<D, BN>(o[0], a, k_addr(it - 1) + TILE_BYTES);  // ... and tile it - 1's P·V
            wgmma_commit();
            ws_turn_pass(wg, false);
            wgmma_wait<1>();  // S has landed; P·V runs on under the exponentials
            wgmma_fence_operands(s[0]);
            ws_softmax(s, m, l, corr, tile, window, kv_start + it * BN, qc, scale_log2);
            wgmma_wait<0>();
            wgmma_fence_operands(o[0]);
            wgmma_fence_operands(a);
            mbar_arrive(empty_addr + 8 * ((it - 1) % STAGES));  // tile it - 1 is read
            rescale_rows<1, DT>(o, corr);
            pack_p<BN>(a, s[0]);
        }
        ws_turn_wait(wg);
        wgmma_fence();
        wgmma_pv<D, BN>(o[0], a, k_addr(n_tiles - 1) + TILE_BYTES);
        wgmma_commit();
        ws_turn_pass(wg, true);
        wgmma_wait<0>();
        wgmma_fence_operands(o[0]);
        wgmma_fence_operands(a);
    }

    prefill_write_rows<1, DT>(o, m, l, tile.first, tile.rows, group, kvh, num_kv_heads * group,
                              splits, split, out, part_acc, part_ml);
}

extern "C" __global__ void __launch_bounds__(WS_THREADS, 1) prefill_wgmma_ws_d128_bf16(
    WG_PREFILL_PARAMS()) {
    pdl_entry();
    prefill_wgmma_ws_impl<128, WS_BN, WS_STAGES>(WG_PREFILL_ARGS);
}
