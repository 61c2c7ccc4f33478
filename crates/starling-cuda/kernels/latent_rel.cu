// The register-factor latent score kernel, opt-in beside the reconstruction kernel of latent.cu
// (CPU reference: starling-backend cpu::latent; parity in tests/parity/latent.rs runs every
// score kernel). The host prepends pdl.cuh, mma_common.cuh and latent_common.cuh.
//
// Same scores as latent_scores_d{D} (q·RoPE(B_h z + b_h, p) in log2 units, head-major per row,
// each head's split maximum), computed the other way round:
// - Keys are rebuilt transposed, Kᵀ = B_h·Zᵀ: B_h (dims × rank) is the A operand and stays in
//   registers for the whole block (each warp holds a slice of 32 dims: the pairs i and i + D/2
//   that RoPE turns together), the key-latent tile is the B operand. The reconstruction kernel
//   reloads B_h from shared memory for every 16 keys (36 ldmatrix per warp and tile, by count
//   more shared-memory time than mma time); here a key costs one ldmatrix per head in all.
// - RoPE relative to the tile's first position p0: the group's queries are rotated by −p0 once
//   per tile (shared memory), key j of the tile by R(j). Where the tile's keys sit at p0 + j
//   (every sequence never compacted), the lane's cos/sin of its fixed (key offset, frequency)
//   pairs live in registers, so the tile loop reads no table; a tile with other positions
//   (after compaction) rotates key j by R(p_j − p0) from the table. R(p0)·R(j) = R(p0 + j) up to
//   f32 rounding of the angles (the CPU reference rounds p·θ once).
// - Scores on the tensor cores: each rotated 8 × 8 block of Kᵀ becomes a B fragment by
//   movmatrix.trans and meets the rotated queries (A: 16 head rows × 16 dims); the warps'
//   partial sums over their dim slices meet in shared memory, reduced one tile later.
// Measured (H100, session 35; BENCHMARKS.md): 1.16–1.31× the reconstruction kernel at MHA batch
// 1, where the grid is starved, but 0.84–0.90× once it is full: removing that traffic did not
// pay for what this design adds (two barriers per 32 keys, the query rotation per tile, the
// cross-warp reduction through shared memory, 3 blocks of 168 registers per SM). Opt-in.
// Interleaved RoPE (pairs 2i, 2i + 1) is handled by reading B_h rows, the bias and the query in
// the NeoX order (logical dim i < D/2 ↔ stored 2i, i + D/2 ↔ 2i + 1): the score is a sum over
// dims, so any order both sides share gives it.
//
// Dynamic shared memory (geometry.rs latent_scores_rel_shared_bytes): B_h [D][RS] (the prologue
// only), the key-latent ring [LQ_STAGES][BN][RS], the rotated queries [2][16][D + 8], the
// positions ring [LQ_STAGES][BN], the partial scores [2][D/32][group][BN] f32 and the maxima.
#define LQ_THREADS 128
#define LQ_STAGES 4

// The 8 × 8 b16 matrix a warp holds in fragment layout (lane l: row l/4, columns 2(l%4) + {0,1}),
// transposed in the same layout.
__device__ __forceinline__ unsigned movmatrix_trans(unsigned x) {
    unsigned y;
    asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
    return y;
}

template <int D, int KS>
__device__ void latent_scores_rel_impl(
    float* __restrict__ scores, float* __restrict__ part_m, const bf16* __restrict__ qkv,
    int qkv_width, const bf16* __restrict__ key_plane, int key_width,
    const unsigned* __restrict__ pos_plane, const int* __restrict__ latent_heads,
    const bf16* __restrict__ key_up, const bf16* __restrict__ key_bias,
    const float2* __restrict__ rope_table, int interleaved, const unsigned* __restrict__ rows,
    const unsigned* __restrict__ tok_seq, const unsigned* __restrict__ tok_visible,
    const unsigned* __restrict__ score_offsets, const unsigned* __restrict__ block_tables,
    int max_blocks, int block_size, int num_kv_heads, int group, float scale, int splits,
    int split_len, const unsigned* __restrict__ plan) {
    latent_split(plan, splits, split_len);
    if ((int)blockIdx.z >= splits) return;
    constexpr int HALF = D / 2;
    constexpr int WD = D / 32;                  // warps across the dims (32 each)
    constexpr int WK = 4 / WD;                  // warps across the keys (32 each)
    constexpr int BN = 32 * WK;                 // keys per tile
    constexpr int MTH = HALF / 16;              // m-tiles of 16 dims in each half
    constexpr int RS = 16 * KS + 8;             // latent row stride (bf16): distinct banks
    constexpr int CPR = 2 * KS;                 // 16-byte chunks per latent row
    constexpr int QS = D + 8;                   // rotated-query row stride (bf16)
    constexpr int TPR = LQ_THREADS / BN;        // threads per key row of a tile copy
    constexpr int KMAX = 16 * BN / LQ_THREADS;  // (head, key) reduction items per thread
    static_assert(WD * WK == 4 && KS % 2 == 0 && BN * TPR == LQ_THREADS, "geometry");
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* b_s = reinterpret_cast<bf16*>(smem_raw);                       // [D][RS]
    bf16* z_ring = b_s + D * RS;                                         // [ST][BN][RS]
    bf16* q_s = z_ring + LQ_STAGES * BN * RS;                            // [2][16][QS]
    unsigned* pos_ring = reinterpret_cast<unsigned*>(q_s + 2 * 16 * QS);  // [ST][BN]
    float* red = reinterpret_cast<float*>(pos_ring + LQ_STAGES * BN);    // [2][WD][group][BN]
    float* max_s = red + 2 * WD * group * BN;                            // [4][KMAX]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q4 = lane & 3;
    const int wd = warp % WD, wk = warp / WD;
    const int i_row = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z;
    const int t = (int)rows[i_row];
    const int num_q_heads = num_kv_heads * group;
    const int offset = latent_heads[2 * kvh], rank = latent_heads[2 * kvh + 1];
    const int kv_start = split * split_len;
    const int kv_end = min((int)tok_visible[t], kv_start + split_len);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + BN - 1) / BN : 0;
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;
    const int visible = (int)tok_visible[t];
    float* row_scores = scores + (size_t)score_offsets[i_row] * num_q_heads;
    const bf16* q_row = qkv + (size_t)t * qkv_width + (size_t)kvh * group * D;
    // Logical dim m (m and m + HALF rotate together) → the stored dim.
    auto stored = [&](int m) {
        return interleaved ? (m < HALF ? 2 * m : 2 * (m - HALF) + 1) : m;
    };

    // B_h in logical row order, zero past the rank (the k-steps cover 16·KS).
    for (int k = tid; k < D * CPR; k += LQ_THREADS) {
        const int m = k / CPR, c = k % CPR;
        const bool valid = 8 * c < rank;
        cp_async16(b_s + m * RS + 8 * c,
                   valid ? key_up + (size_t)stored(m) * key_width + offset + 8 * c : key_up, valid);
    }
    cp_async_commit();
    auto load_tile = [&](int tile, int stage) {
        const int r = tid / TPR;
        const int j = kv_start + tile * BN + r;
        const bool in = j < kv_end;
        const unsigned slot = in ? paged_slot(table, j, block_size) : 0u;
        const size_t row = (size_t)slot * key_width + offset;
        bf16* z = z_ring + ((size_t)stage * BN + r) * RS;
        for (int c = tid % TPR; c < CPR; c += TPR) {
            const bool valid = in && 8 * c < rank;
            cp_async16_ca(z + 8 * c, valid ? key_plane + row + 8 * c : key_plane, valid);
        }
        if (tid % TPR == 0)
            cp_async4(pos_ring + stage * BN + r, in ? pos_plane + slot : pos_plane, in);
    };
#pragma unroll
    for (int s = 0; s < LQ_STAGES - 1; s++) {
        if (s < n_tiles) load_tile(s, s);
        cp_async_commit();
    }
    // Query rows past the group stay zero in both buffers.
    for (int k = tid; k < 2 * 16 * QS; k += LQ_THREADS)
        if ((k / QS) % 16 >= group) q_s[k] = __float2bfloat16(0.f);

    // The warp's two m-tiles (dims 16·wd.. and HALF + 16·wd..): B_h fragments for every k-step,
    // the bias of the lane's four dims, and cos/sin of its (key offset, frequency) pairs.
    const int mt[2] = {wd, wd + MTH};
    float bias[2][2];
    float2 rj[4][2][2];  // [n-tile][row g / g + 8][key 2·q4 + c]
#pragma unroll
    for (int e = 0; e < 2; e++) {
        const int i = 16 * wd + g + 8 * e;
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++)
            bias[h2][e] = key_bias != nullptr
                              ? __bfloat162float(key_bias[kvh * D + stored(i + h2 * HALF)])
                              : 0.f;
#pragma unroll
        for (int nt = 0; nt < 4; nt++)
#pragma unroll
            for (int c = 0; c < 2; c++)
                rj[nt][e][c] = rope_table[(size_t)(32 * wk + 8 * nt + 2 * q4 + c) * HALF + i];
    }
    cp_async_wait<LQ_STAGES - 1>();
    __syncthreads();
    unsigned af[2][KS][4];
#pragma unroll
    for (int h2 = 0; h2 < 2; h2++)
#pragma unroll
        for (int ks = 0; ks < KS; ks++)
            ldmatrix_x4(af[h2][ks], b_s + (16 * mt[h2] + (lane & 15)) * RS + 16 * ks +
                                        8 * (lane >> 4));

    const float scale_log2 = scale * LOG2E;
    float mx[KMAX];
#pragma unroll
    for (int k = 0; k < KMAX; k++) mx[k] = NEG_INF;
    // Tile `tile`'s scores: the warps' partial sums (buffer b) added, scaled, stored.
    auto reduce = [&](int tile, int b) {
        const float* rb = red + (size_t)b * WD * group * BN;
#pragma unroll
        for (int k = 0; k < KMAX; k++) {
            const int idx = tid + LQ_THREADS * k;
            const int h = idx / BN, jj = idx % BN;
            const int j = kv_start + tile * BN + jj;
            if (h < group && j < kv_end) {
                float v = 0.f;
#pragma unroll
                for (int w = 0; w < WD; w++) v += rb[(w * group + h) * BN + jj];
                v *= scale_log2;
                row_scores[(size_t)(kvh * group + h) * visible + j] = v;
                mx[k] = fmaxf(mx[k], v);
            }
        }
    };

    for (int it = 0; it < n_tiles; it++) {
        const int stage = it % LQ_STAGES, buf = it & 1;
        cp_async_wait<LQ_STAGES - 2>();
        __syncthreads();
        {
            const int next = it + LQ_STAGES - 1;
            if (next < n_tiles) load_tile(next, next % LQ_STAGES);
            cp_async_commit();
        }
        if (it > 0) reduce(it - 1, buf ^ 1);
        const unsigned* pos = pos_ring + stage * BN;
        const unsigned p0 = pos[0];
        // The group's queries rotated by −p0: R(p0)ᵀ q, in logical dim order.
        bf16* qb = q_s + buf * 16 * QS;
        for (int k = tid; k < group * HALF; k += LQ_THREADS) {
            const int h = k / HALF, i = k % HALF;
            const float x = __bfloat162float(q_row[h * D + stored(i)]);
            const float y = __bfloat162float(q_row[h * D + stored(i + HALF)]);
            const float2 cs = rope_table[(size_t)p0 * HALF + i];
            qb[h * QS + i] = __float2bfloat16(x * cs.x + y * cs.y);
            qb[h * QS + i + HALF] = __float2bfloat16(y * cs.x - x * cs.y);
        }
        bool in_order = true;
        if (tid < BN) {
            const int j = kv_start + it * BN + tid;
            in_order = j >= kv_end || pos[tid] == p0 + (unsigned)tid;
        }
        const bool consecutive = __syncthreads_and(in_order);

        unsigned qa[2][4];
#pragma unroll
        for (int h2 = 0; h2 < 2; h2++)
            ldmatrix_x4(qa[h2], qb + (lane & 15) * QS + 16 * mt[h2] + 8 * (lane >> 4));
        // Kᵀ of the warp's 32 keys over its 32 dims: [m-tile][n-tile of 8 keys][fragment].
        const bf16* z = z_ring + ((size_t)stage * BN + 32 * wk) * RS;
        float acc[2][4][4];
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
#pragma unroll
            for (int e = 0; e < 4; e++) acc[0][nt][e] = acc[1][nt][e] = 0.f;
#pragma unroll
            for (int kp = 0; kp < KS / 2; kp++) {
                unsigned b[4];
                ldmatrix_x4(b, z + (8 * nt + (lane & 7)) * RS + 32 * kp + 8 * (lane >> 3));
                mma_bf16(acc[0][nt], af[0][2 * kp], b[0], b[1]);
                mma_bf16(acc[1][nt], af[1][2 * kp], b[0], b[1]);
                mma_bf16(acc[0][nt], af[0][2 * kp + 1], b[2], b[3]);
                mma_bf16(acc[1][nt], af[1][2 * kp + 1], b[2], b[3]);
            }
        }
        // Bias, then R(j) (or R(p_j − p0)) on each (dim i, dim i + HALF) pair.
        auto rotate = [&](int nt, int e4, float2 cs) {
            const int e = e4 >> 1;
            const float x0 = acc[0][nt][e4] + bias[0][e], x1 = acc[1][nt][e4] + bias[1][e];
            acc[0][nt][e4] = x0 * cs.x - x1 * cs.y;
            acc[1][nt][e4] = x0 * cs.y + x1 * cs.x;
        };
        if (consecutive) {
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e4 = 0; e4 < 4; e4++) rotate(nt, e4, rj[nt][e4 >> 1][e4 & 1]);
        } else {
#pragma unroll
            for (int nt = 0; nt < 4; nt++)
#pragma unroll
                for (int e4 = 0; e4 < 4; e4++) {
                    const int d = (int)(pos[32 * wk + 8 * nt + 2 * q4 + (e4 & 1)] - p0);
                    float2 cs = rope_table[(size_t)(d < 0 ? -d : d) * HALF + 16 * wd + g +
                                           8 * (e4 >> 1)];
                    if (d < 0) cs.y = -cs.y;
                    rotate(nt, e4, cs);
                }
        }
        // Partial scores [head][key] over the warp's dims: Q'·Kᵀ, Kᵀ's 8 × 8 blocks transposed
        // into B fragments.
        float* rb = red + ((size_t)buf * WD + wd) * group * BN;
#pragma unroll
        for (int nt = 0; nt < 4; nt++) {
            float s[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
            for (int h2 = 0; h2 < 2; h2++) {
                const unsigned b0 = movmatrix_trans(pack_bf16(acc[h2][nt][0], acc[h2][nt][1]));
                const unsigned b1 = movmatrix_trans(pack_bf16(acc[h2][nt][2], acc[h2][nt][3]));
                mma_bf16(s, qa[h2], b0, b1);
            }
            const int kk = 32 * wk + 8 * nt + 2 * q4;
            if (g < group) *reinterpret_cast<float2*>(rb + g * BN + kk) = make_float2(s[0], s[1]);
            if (g + 8 < group)
                *reinterpret_cast<float2*>(rb + (g + 8) * BN + kk) = make_float2(s[2], s[3]);
        }
    }
    __syncthreads();
    if (n_tiles > 0) reduce(n_tiles - 1, (n_tiles - 1) & 1);
    cp_async_wait<0>();
    // Each head's maximum over the split: item idx = tid + 128·k is head idx / BN, so a head's
    // items are BN / 32 whole warps of one k.
#pragma unroll
    for (int k = 0; k < KMAX; k++) {
#pragma unroll
        for (int o = 16; o > 0; o >>= 1)
            mx[k] = fmaxf(mx[k], __shfl_xor_sync(0xffffffffu, mx[k], o));
        if (lane == 0) max_s[warp * KMAX + k] = mx[k];
    }
    __syncthreads();
    if (tid < group) {
        const int k = tid * BN / LQ_THREADS, w0 = (tid * BN % LQ_THREADS) / 32;
        float m = NEG_INF;
        for (int w = w0; w < w0 + BN / 32; w++) m = fmaxf(m, max_s[w * KMAX + k]);
        part_m[((size_t)i_row * num_q_heads + kvh * group + tid) * splits + split] = m;
    }
}

// latent_scores_d{D}'s parameter list (`rs` is 16·KS + 8 here, fixed by the instantiation).
#define INSTANTIATE_REL(D, KS)                                                                  \
    extern "C" __global__ void __launch_bounds__(LQ_THREADS)                                     \
        latent_scores_rel_d##D##_k##KS##_bf16(LATENT_SCORE_PARAMS) {                             \
        pdl_entry();                                                                             \
        (void)rs;                                                                                \
        latent_scores_rel_impl<D, KS>(scores, part_m, qkv, qkv_width, key_plane, key_width,     \
                                      pos_plane, latent_heads, key_up, key_bias, rope_table,    \
                                      interleaved, rows, tok_seq, tok_visible, score_offsets,   \
                                      block_tables, max_blocks, block_size, num_kv_heads, group, \
                                      scale, splits, split_len, plan);                           \
    }
INSTANTIATE_REL(64, 2)
INSTANTIATE_REL(64, 4)
INSTANTIATE_REL(128, 4)
INSTANTIATE_REL(128, 8)
