// The rotary-absorbed latent score kernel (one query head per KV head), opt-in beside the
// reconstruction kernel of latent.cu (CPU reference: starling-backend cpu::latent; parity in
// tests/parity/latent.rs runs both). The host prepends pdl.cuh, mma_common.cuh and
// latent_common.cuh.

// Scores of one (decode row, head, context split) of a layer with one query head per KV head
// (MHA), RoPE absorbed into the query instead of applied to reconstructed keys. With the pair
// (a, b) of frequency i, q·RoPE(k, p) = Σ_i cos(pθ_i)·α_i + sin(pθ_i)·β_i, where
// α_i = q_a k_a + q_b k_b and β_i = q_b k_a − q_a k_b are linear in the latent z (k = B_h z + b_h):
// [α | β] = z·M + (α0 | β0), M built once per block from B_h and the (scaled) query. So a key
// costs one mma row of M (as reconstructing it did) and two FMAs per frequency, with no
// rotation, no bias add and no second Q·K product.
//
// Positions are taken relative to the split's first key (p0): the query is rotated by −p0
// before M is built, so a key at p0 + j needs cos/sin of j. Where an m-tile's 16 keys sit at
// p0 + j..p0 + j + 15 (every sequence never compacted), that is cs(j)·cs(Δ): cs(j) is one table
// row per m-tile whose address is known in advance, staged into shared memory with the key
// latents (cp.async), and cs(Δ) of the lane's two rows lives in registers for the whole block.
// Other m-tiles (after compaction) read each key's table entry and multiply by cs(p0)*. The
// first version read positions and table entries from global memory inside the tile loop: it
// ran at the reconstruction kernel's speed; the tile loop now issues no global load on the fast
// path. Measured on the H200 (MHA 32 × 128, rank 64): 5–11% faster than reconstructing at batch
// ≥ 16, still 0.66× the dense kernel: Nsight shows it issue- and occupancy-bound (66 warp
// instructions per key and head, of which 4 are mma; 3 warps per scheduler at 158 registers
// and 66 KB of shared memory), not bound by bytes or by the tensor cores.
//
// Dynamic shared memory: M as [D][RS] bf16 (column n = 2i + {0: α, 1: β}; RS = 16·KS + 8), the
// key-latent ring [LR_STAGES][64·MT][RS], the positions ring [LR_STAGES][64·MT], the table-row
// ring [LR_STAGES][4·MT][D/2] float2, cs(p0) [D/2] float2, α0/β0 (f32 [D]) and the warps' maxima.
#define LR_THREADS 128
#define LR_STAGES 2

__device__ __forceinline__ float2 cmul(float2 a, float2 b) {
    return make_float2(a.x * b.x - a.y * b.y, a.x * b.y + a.y * b.x);
}

template <int D, int KS, int MT>
__device__ void latent_scores_rot_impl(
    float* __restrict__ scores, float* __restrict__ part_m, const bf16* __restrict__ qkv,
    int qkv_width, const bf16* __restrict__ key_plane, int key_width,
    const unsigned* __restrict__ pos_plane, const int* __restrict__ latent_heads,
    const bf16* __restrict__ key_up, const bf16* __restrict__ key_bias,
    const float2* __restrict__ rope_table, int interleaved, const unsigned* __restrict__ rows,
    const unsigned* __restrict__ tok_seq, const unsigned* __restrict__ tok_visible,
    const unsigned* __restrict__ score_offsets, const unsigned* __restrict__ block_tables,
    int max_blocks, int block_size, int num_heads, float scale, int splits, int split_len,
    const unsigned* __restrict__ plan) {
    latent_split(plan, splits, split_len);
    if ((int)blockIdx.z >= splits) return;
    constexpr int HALF = D / 2;
    constexpr int NP = D / 16;      // n-pairs of 16 columns (8 frequencies) of M
    constexpr int NF = 2 * NP;      // frequencies of each lane (i = 8p + 4nn + q4)
    constexpr int BN = 64 * MT;     // keys per tile
    constexpr int MTB = BN / 16;    // m-tiles per tile
    constexpr int RS = 16 * KS + 8; // row stride (bf16): rows in distinct banks for ldmatrix
    constexpr int CPR = 2 * KS;     // 16-byte chunks per latent row
    constexpr int TCH = HALF / 2;   // 16-byte chunks per table row
    extern __shared__ __align__(128) unsigned char smem_raw[];
    bf16* m_s = reinterpret_cast<bf16*>(smem_raw);                            // [D][RS]
    bf16* z_ring = m_s + D * RS;                                              // [ST][BN][RS]
    float2* base_ring = reinterpret_cast<float2*>(z_ring + LR_STAGES * BN * RS);  // [ST][MTB][HALF]
    float2* cs0_s = base_ring + LR_STAGES * MTB * HALF;                       // [HALF]
    unsigned* pos_ring = reinterpret_cast<unsigned*>(cs0_s + HALF);           // [ST][BN]
    float* ab0_s = reinterpret_cast<float*>(pos_ring + LR_STAGES * BN);       // [D]
    float* max_s = ab0_s + D;                                                 // [4]

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, q4 = lane & 3;
    const int i_row = blockIdx.x, h = blockIdx.y, split = blockIdx.z;
    const int t = (int)rows[i_row];
    const int offset = latent_heads[2 * h], rank = latent_heads[2 * h + 1];
    const int kv_start = split * split_len;
    const int kv_end = min((int)tok_visible[t], kv_start + split_len);
    const int n_tiles = kv_end > kv_start ? (kv_end - kv_start + BN - 1) / BN : 0;
    const unsigned* table = block_tables + (size_t)tok_seq[t] * max_blocks;
    const int visible = (int)tok_visible[t];
    float* row_scores = scores + (size_t)score_offsets[i_row] * num_heads;

    auto load_tile = [&](int tile, int stage) {
        bf16* z = z_ring + stage * BN * RS;
        unsigned* pos = pos_ring + stage * BN;
        float2* base = base_ring + stage * MTB * HALF;
        for (int k = tid; k < BN * CPR; k += LR_THREADS) {
            const int r = k / CPR, c = k % CPR;
            const int j = kv_start + tile * BN + r;
            const bool valid = j < kv_end && 8 * c < rank;
            const bf16* src = key_plane;
            if (valid) src = key_plane + (size_t)paged_slot(table, j, block_size) * key_width +
                             offset + 8 * c;
            cp_async16(z + r * RS + 8 * c, src, valid);
        }
        for (int r = tid; r < BN; r += LR_THREADS) {
            const int j = kv_start + tile * BN + r;
            const bool valid = j < kv_end;
            cp_async4(pos + r, valid ? pos_plane + paged_slot(table, j, block_size) : pos_plane,
                      valid);
        }
        // cs of the m-tiles' first relative positions: table rows tile·BN + 16m.
        for (int k = tid; k < MTB * TCH; k += LR_THREADS) {
            const int m = k / TCH, c = k % TCH;
            const int rel = tile * BN + 16 * m;
            const bool valid = kv_start + rel < kv_end;
            const float2* src = valid ? rope_table + (size_t)rel * HALF + 2 * c : rope_table;
            cp_async16(reinterpret_cast<bf16*>(base + m * HALF + 2 * c),
                       reinterpret_cast<const bf16*>(src), valid);
        }
    };
#pragma unroll
    for (int s = 0; s < LR_STAGES - 1; s++) {
        if (s < n_tiles) load_tile(s, s);
        cp_async_commit();
    }

    // The split's first position, cs(p0) for the slow path, then M and α0/β0 from B_h, b_h and
    // the query rotated by −p0 and scaled to log2 units (zero past the rank).
    const unsigned p0 =
        kv_start < kv_end ? slot_position(pos_plane, paged_slot(table, kv_start, block_size)) : 0u;
    for (int i = tid; i < HALF; i += LR_THREADS) cs0_s[i] = rope_table[(size_t)p0 * HALF + i];
    const bf16* q = qkv + (size_t)t * qkv_width + (size_t)h * D;
    const float qscale = scale * LOG2E;
    auto rotated_query = [&](int i, float& qa, float& qb) {
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + HALF;
        const float x = __bfloat162float(q[a]) * qscale, y = __bfloat162float(q[b]) * qscale;
        const float2 cs = rope_table[(size_t)p0 * HALF + i];
        qa = x * cs.x + y * cs.y;   // R(p0)ᵀ q
        qb = y * cs.x - x * cs.y;
    };
    for (int k = tid; k < D * CPR; k += LR_THREADS) {
        const int n = k / CPR, c = k % CPR;
        const int i = n >> 1;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + HALF;
        float qa, qb;
        rotated_query(i, qa, qb);
        uint4 out = make_uint4(0u, 0u, 0u, 0u);
        if (8 * c < rank) {
            const uint4 ua = *reinterpret_cast<const uint4*>(key_up + (size_t)a * key_width + offset + 8 * c);
            const uint4 ub = *reinterpret_cast<const uint4*>(key_up + (size_t)b * key_width + offset + 8 * c);
            const bf16* ea = reinterpret_cast<const bf16*>(&ua);
            const bf16* eb = reinterpret_cast<const bf16*>(&ub);
            bf16* eo = reinterpret_cast<bf16*>(&out);
#pragma unroll
            for (int e = 0; e < 8; e++) {
                const float x = __bfloat162float(ea[e]), y = __bfloat162float(eb[e]);
                eo[e] = __float2bfloat16((n & 1) ? qb * x - qa * y : qa * x + qb * y);
            }
        }
        *reinterpret_cast<uint4*>(m_s + n * RS + 8 * c) = out;
    }
    for (int n = tid; n < D; n += LR_THREADS) {
        const int i = n >> 1;
        const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + HALF;
        float qa, qb;
        rotated_query(i, qa, qb);
        float ba = 0.f, bb = 0.f;
        if (key_bias != nullptr) {
            ba = __bfloat162float(key_bias[h * D + a]);
            bb = __bfloat162float(key_bias[h * D + b]);
        }
        ab0_s[n] = (n & 1) ? qb * ba - qa * bb : qa * ba + qb * bb;
    }
    // cs(Δ) of this lane's rows (Δ = g and g + 8 of every m-tile) at its frequencies, as half2:
    // 32 registers instead of 64 (the f32 pairs spilled), at 2.4e-4 relative error — an eighth
    // of a bf16 key's rounding.
    __half2 r_lo[NF], r_hi[NF];
#pragma unroll
    for (int f = 0; f < NF; f++) {
        const int i = 8 * (f >> 1) + 4 * (f & 1) + q4;
        r_lo[f] = __float22half2_rn(rope_table[g * HALF + i]);
        r_hi[f] = __float22half2_rn(rope_table[(g + 8) * HALF + i]);
    }
    float run_max = NEG_INF;

    for (int it = 0; it < n_tiles; it++) {
        cp_async_wait<LR_STAGES - 2>();
        __syncthreads();  // the tile (and, at it = 0, M, α0/β0 and cs(p0)) visible to every warp
        {
            const int next = it + LR_STAGES - 1;
            if (next < n_tiles) load_tile(next, next % LR_STAGES);
            cp_async_commit();
        }
        const int stage = it % LR_STAGES;
        const bf16* z = z_ring + stage * BN * RS;
        const unsigned* pos = pos_ring + stage * BN;
        const float2* base = base_ring + stage * MTB * HALF;
        unsigned a[MT][KS][4];
        bool consec[MT];
        int j_lo[MT];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
            const int wk = (warp * MT + mt) * 16;
#pragma unroll
            for (int ks = 0; ks < KS; ks++)
                ldmatrix_x4(a[mt][ks], z + (wk + (lane & 15)) * RS + 16 * ks + 8 * (lane >> 4));
            j_lo[mt] = kv_start + it * BN + wk + g;
            const int jh = j_lo[mt] + 8;
            const unsigned want = p0 + (unsigned)(j_lo[mt] - kv_start);
            consec[mt] = __all_sync(0xffffffffu, (j_lo[mt] >= kv_end || pos[wk + g] == want) &&
                                                     (jh >= kv_end || pos[wk + g + 8] == want + 8));
        }
        float sc[MT][2];
#pragma unroll
        for (int mt = 0; mt < MT; mt++) sc[mt][0] = sc[mt][1] = 0.f;
        // The frequency loop, compiled once per path: under a per-m-tile branch the compiler
        // predicated both paths into every iteration (the slow path's address arithmetic made
        // the integer pipe the busiest one).
        auto frequencies = [&](auto fast_path) {
            constexpr bool FAST = decltype(fast_path)::value;
#pragma unroll
            for (int p = 0; p < NP; p++) {
                float acc[MT][2][4];
#pragma unroll
                for (int nn = 0; nn < 2; nn++) {
                    const int n0 = 2 * (8 * p + 4 * nn + q4);
                    const float al = ab0_s[n0], be = ab0_s[n0 + 1];
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        acc[mt][nn][0] = acc[mt][nn][2] = al;
                        acc[mt][nn][1] = acc[mt][nn][3] = be;
                    }
                }
#pragma unroll
                for (int ks = 0; ks < KS; ks++) {
                    unsigned b[4];
                    ldmatrix_x4(b, m_s + (16 * p + (lane & 7) + ((lane >> 4) << 3)) * RS +
                                       16 * ks + 8 * ((lane >> 3) & 1));
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        mma_bf16(acc[mt][0], a[mt][ks], b[0], b[1]);
                        mma_bf16(acc[mt][1], a[mt][ks], b[2], b[3]);
                    }
                }
#pragma unroll
                for (int nn = 0; nn < 2; nn++) {
                    const int f = 2 * p + nn, i = 8 * p + 4 * nn + q4;
                    float2 c0 = cs0_s[i];
                    c0.y = -c0.y;
#pragma unroll
                    for (int mt = 0; mt < MT; mt++) {
                        float2 cl, ch;
                        if (FAST) {
                            const float2 bs = base[(warp * MT + mt) * HALF + i];
                            cl = cmul(bs, __half22float2(r_lo[f]));
                            ch = cmul(bs, __half22float2(r_hi[f]));
                        } else {
                            // cs(p − p0) = cs(p)·cs(p0)* for keys wherever they sit.
                            const int wk = (warp * MT + mt) * 16;
                            const unsigned pl = j_lo[mt] < kv_end ? pos[wk + g] : p0;
                            const unsigned ph = j_lo[mt] + 8 < kv_end ? pos[wk + g + 8] : p0;
                            cl = cmul(rope_table[(size_t)pl * HALF + i], c0);
                            ch = cmul(rope_table[(size_t)ph * HALF + i], c0);
                        }
                        sc[mt][0] = fmaf(cl.x, acc[mt][nn][0], fmaf(cl.y, acc[mt][nn][1], sc[mt][0]));
                        sc[mt][1] = fmaf(ch.x, acc[mt][nn][2], fmaf(ch.y, acc[mt][nn][3], sc[mt][1]));
                    }
                }
            }
        };
        bool all_consec = true;
#pragma unroll
        for (int mt = 0; mt < MT; mt++) all_consec = all_consec && consec[mt];
        if (all_consec) {
            frequencies(BoolTag<true>());
        } else {
            frequencies(BoolTag<false>());
        }
        // Each row's sum over the frequencies of its four lanes; lane q4 == 0 stores it.
#pragma unroll
        for (int mt = 0; mt < MT; mt++) {
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = sc[mt][e];
                v += __shfl_xor_sync(0xffffffffu, v, 1);
                v += __shfl_xor_sync(0xffffffffu, v, 2);
                const int j = j_lo[mt] + 8 * e;
                if (j < kv_end) {
                    if (q4 == 0) row_scores[(size_t)h * visible + j] = v;
                    run_max = fmaxf(run_max, v);
                }
            }
        }
    }
#pragma unroll
    for (int o = 1; o < 32; o <<= 1)
        run_max = fmaxf(run_max, __shfl_xor_sync(0xffffffffu, run_max, o));
    cp_async_wait<0>();
    if (lane == 0) max_s[warp] = run_max;
    __syncthreads();
    if (tid == 0) {
        float m = NEG_INF;
#pragma unroll
        for (int w = 0; w < LR_THREADS / 32; w++) m = fmaxf(m, max_s[w]);
        part_m[((size_t)i_row * num_heads + h) * splits + split] = m;
    }
}

#define INSTANTIATE_SCORES_ROT(D, KS, MT)                                                        \
    extern "C" __global__ void __launch_bounds__(LR_THREADS)                                     \
        latent_scores_rot_d##D##_k##KS##_m##MT##_bf16(                                           \
            float* scores, float* part_m, const bf16* qkv, int qkv_width, const bf16* key_plane, \
            int key_width, const unsigned* pos_plane, const int* latent_heads,                   \
            const bf16* key_up, const bf16* key_bias, const float2* rope_table, int interleaved, \
            const unsigned* rows, const unsigned* tok_seq, const unsigned* tok_visible,          \
            const unsigned* score_offsets, const unsigned* block_tables, int max_blocks,         \
            int block_size, int num_heads, float scale, int splits, int split_len,               \
            const unsigned* plan) {                                                     \
        pdl_entry();                                                                             \
        latent_scores_rot_impl<D, KS, MT>(scores, part_m, qkv, qkv_width, key_plane, key_width,  \
                                          pos_plane, latent_heads, key_up, key_bias, rope_table, \
                                          interleaved, rows, tok_seq, tok_visible,               \
                                          score_offsets, block_tables, max_blocks, block_size,   \
                                          num_heads, scale, splits, split_len, plan);            \
    }
INSTANTIATE_SCORES_ROT(64, 2, 2)
INSTANTIATE_SCORES_ROT(64, 4, 2)
INSTANTIATE_SCORES_ROT(128, 4, 2)
INSTANTIATE_SCORES_ROT(128, 8, 2)
