// The parts of the tiled prefill kernels that do not depend on how the two products are
// computed: prefill_attention.cu (mma.sync, sm_80+) and prefill_wgmma.cu (Hopper wgmma) share
// them. Both lay a tile's rows out alike (row = token * group + head of the group, 16 rows a
// warp, MT m-tiles of 16 a warp), both hold scores and outputs in mma.sync's C fragment per
// 8-column tile (which is also wgmma's accumulator layout per warp), and both write the output
// or the partials attention_combine_bf16 (attention.cu) merges. Not a kernel module of its own:
// the host prepends it to both sources (kernels.rs), after mma_common.cuh.

// One key tile's online-softmax update of this thread's rows, scores only: S (raw scores) becomes
// P, the running max m (log2 units, scaled) and this lane's share of the sum l move on, and
// corr[mt][i] is the factor the row's output accumulators must be scaled by before P·V adds to
// them, handed to row_done(mt, i, corr) as each row is finished (so that a kernel can compute
// P while the previous tile's P·V still runs, and keep the factors for later, or rescale at
// once without holding them: the mma.sync kernel's registers are that tight). The scale is
// folded into the exponent (one FFMA per score) and the max taken on raw scores (the scale is
// positive). With MASK, keys at or past a row's end, or before its window's start, score -inf.
template <bool MASK, int MT, int NT, typename RowDone>
__device__ __forceinline__ void online_softmax_scores(float (&s)[MT][NT][4], float (&m)[MT][2],
                                                      float (&l)[MT][2],
                                                      const int (&row_visible)[MT][2],
                                                      int kv_end, int window, int kb, int qc,
                                                      float scale_log2, RowDone row_done) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            // The row's keys: [its window's start, min(visible, the split's end)). Derived here
            // from the visible count rather than kept per row (registers are the budget).
            const int row_end = min(row_visible[mt][i], kv_end);
            const int row_start = window > 0 ? row_visible[mt][i] - window : 0;
            float mx = NEG_INF;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const int key = kb + nt * 8 + 2 * qc + e;
                    if (MASK && (key >= row_end || key < row_start))
                        s[mt][nt][2 * i + e] = NEG_INF;
                    mx = fmaxf(mx, s[mt][nt][2 * i + e]);
                }
            }
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float m_new = fmaxf(m[mt][i], mx * scale_log2);
            // Nothing seen yet: any finite base keeps exp2(-inf - base) = 0 (no NaN).
            const float base = m_new == NEG_INF ? 0.f : m_new;
            const float corr = fast_exp2(m[mt][i] - base);
            m[mt][i] = m_new;
            float sum = 0.f;
#pragma unroll
            for (int nt = 0; nt < NT; nt++) {
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float p = fast_exp2(fmaf(s[mt][nt][2 * i + e], scale_log2, -base));
                    s[mt][nt][2 * i + e] = p;
                    sum += p;
                }
            }
            l[mt][i] = l[mt][i] * corr + sum;  // this lane's share; the quad sums at the end
            row_done(mt, i, corr);
        }
    }
}

// Scales row i (0: the fragment's upper 8 rows, 1: the lower) of this thread's m-tile mt of O.
template <int MT, int DT>
__device__ __forceinline__ void rescale_row(float (&o)[MT][DT][4], int mt, int i, float corr) {
#pragma unroll
    for (int dt = 0; dt < DT; dt++) {
        o[mt][dt][2 * i] *= corr;
        o[mt][dt][2 * i + 1] *= corr;
    }
}

// Scales each of this thread's rows of O by its factor kept from online_softmax_scores.
template <int MT, int DT>
__device__ __forceinline__ void rescale_rows(float (&o)[MT][DT][4], const float (&corr)[MT][2]) {
#pragma unroll
    for (int mt = 0; mt < MT; mt++)
#pragma unroll
        for (int i = 0; i < 2; i++) rescale_row<MT, DT>(o, mt, i, corr[mt][i]);
}

// One key tile's whole online-softmax update: online_softmax_scores, each row of O rescaled as
// soon as its factor is known.
template <bool MASK, int MT, int NT, int DT>
__device__ __forceinline__ void online_softmax_tile(float (&s)[MT][NT][4], float (&o)[MT][DT][4],
                                                    float (&m)[MT][2], float (&l)[MT][2],
                                                    const int (&row_visible)[MT][2], int kv_end,
                                                    int window, int kb, int qc, float scale_log2) {
    online_softmax_scores<MASK, MT, NT>(
        s, m, l, row_visible, kv_end, window, kb, qc, scale_log2,
        [&](int mt, int i, float corr) { rescale_row<MT, DT>(o, mt, i, corr); });
}

// The keys a query tile's block covers: [kv_start, kv_end) of its split. The tile's largest
// visible count bounds the key loop, and under a window its smallest one's window start begins
// it (block-uniform, so every thread runs the same iterations and reaches every barrier).
template <int THREADS, int WARPS>
__device__ __forceinline__ void prefill_tile_keys(const unsigned* __restrict__ tok_visible,
                                                  int first, int count, int window, int split,
                                                  int split_len, int& kv_start, int& kv_end) {
    __shared__ int warp_visible[WARPS], warp_visible_min[WARPS];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    int vis = 0, vis_min = 0x7fffffff;
    for (int i = tid; i < count; i += THREADS) {
        vis = max(vis, (int)tok_visible[first + i]);
        vis_min = min(vis_min, (int)tok_visible[first + i]);
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        vis = max(vis, __shfl_xor_sync(0xffffffffu, vis, o));
        vis_min = min(vis_min, __shfl_xor_sync(0xffffffffu, vis_min, o));
    }
    if (lane == 0) warp_visible[warp] = vis, warp_visible_min[warp] = vis_min;
    __syncthreads();
    int tile_visible = 0, tile_visible_min = 0x7fffffff;
#pragma unroll
    for (int w = 0; w < WARPS; w++) {
        tile_visible = max(tile_visible, warp_visible[w]);
        tile_visible_min = min(tile_visible_min, warp_visible_min[w]);
    }
    const int tile_first_key = window > 0 ? max(0, tile_visible_min - window) : 0;
    kv_start = tile_first_key + split * split_len;
    kv_end = min(kv_start + split_len, tile_visible);
}

// This thread's fragment rows (qr and qr + 8 of each of the warp's MT m-tiles) and their visible
// counts (a padding row sees nothing, 0: every score is masked), and the keys visible to every
// real row of the warp, [warp_full_start, warp_full_end): tiles wholly inside skip the mask
// (padding rows' outputs are never written, so they need none).
template <int MT>
__device__ __forceinline__ void prefill_row_bounds(const unsigned* __restrict__ tok_visible,
                                                   int first, int rows, int group, int kv_end,
                                                   int window, int (&row_visible)[MT][2],
                                                   int& warp_full_start, int& warp_full_end) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, qr = lane >> 2;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = (warp * MT + mt) * 16 + qr + 8 * i;
            row_visible[mt][i] = r < rows ? (int)tok_visible[first + r / group] : 0;
        }
    }
    warp_full_end = 0x7fffffff, warp_full_start = 0;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = (warp * MT + mt) * 16 + qr + 8 * i;
            if (r < rows) {
                warp_full_end = min(warp_full_end, min(row_visible[mt][i], kv_end));
                if (window > 0)
                    warp_full_start = max(warp_full_start, row_visible[mt][i] - window);
            }
        }
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) {
        warp_full_end = min(warp_full_end, __shfl_xor_sync(0xffffffffu, warp_full_end, o));
        warp_full_start = max(warp_full_start, __shfl_xor_sync(0xffffffffu, warp_full_start, o));
    }
}

// A block's query tile (block x of the host's tile list: first token and token count, rows =
// tokens × group), its sequence's block table, the keys its split covers and this thread's row
// bounds: the setup both prefill kernels start with.
template <int MT>
struct PrefillTile {
    int first, rows;
    const unsigned* table;
    int kv_start, kv_end, n_tiles;
    int row_visible[MT][2];
    int warp_full_start, warp_full_end;
};

template <int THREADS, int WARPS, int MT, int BN>
__device__ __forceinline__ PrefillTile<MT> prefill_tile(
    const unsigned* __restrict__ tiles, const unsigned* __restrict__ tok_seq,
    const unsigned* __restrict__ tok_visible, const unsigned* __restrict__ block_tables,
    int max_blocks, int group, int window, int split, int split_len) {
    PrefillTile<MT> t;
    // The host lists tiles with the most context first (AttentionRows), so the heaviest blocks
    // start in the first wave and light ones fill the tail.
    t.first = (int)tiles[2 * blockIdx.x];
    const int count = (int)tiles[2 * blockIdx.x + 1];
    t.rows = count * group;
    t.table = block_tables + (size_t)tok_seq[t.first] * max_blocks;
    prefill_tile_keys<THREADS, WARPS>(tok_visible, t.first, count, window, split, split_len,
                                      t.kv_start, t.kv_end);
    t.n_tiles = t.kv_end > t.kv_start ? (t.kv_end - t.kv_start + BN - 1) / BN : 0;
    prefill_row_bounds<MT>(tok_visible, t.first, t.rows, group, t.kv_end, window, t.row_visible,
                           t.warp_full_start, t.warp_full_end);
    return t;
}

// Writes this thread's rows: normalised bf16 output with one split, else the unnormalised
// partial (f32 accumulators, then the max in natural-log units and the sum, as the decode
// kernels' partials) for attention_combine_bf16. Sums each row's quad of lane shares first.
template <int MT, int DT>
__device__ __forceinline__ void prefill_write_rows(
    const float (&o)[MT][DT][4], const float (&m)[MT][2], float (&l)[MT][2], int first, int rows,
    int group, int kvh, int num_q_heads, int splits, int split, bf16* __restrict__ out,
    float* __restrict__ part_acc, float* __restrict__ part_ml) {
    constexpr int D = DT * 8;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, qr = lane >> 2, qc = lane & 3;
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 1);
            l[mt][i] += __shfl_xor_sync(0xffffffffu, l[mt][i], 2);
        }
    }
#pragma unroll
    for (int mt = 0; mt < MT; mt++) {
#pragma unroll
        for (int i = 0; i < 2; i++) {
            const int r = (warp * MT + mt) * 16 + qr + 8 * i;
            if (r >= rows) continue;  // padding rows belong to no token: write nothing
            const size_t t = (size_t)(first + r / group), h = (size_t)(kvh * group + r % group);
            if (splits == 1) {
                const float inv = l[mt][i] > 0.f ? 1.f / l[mt][i] : 0.f;
                bf16* dst = out + t * num_q_heads * D + h * D + 2 * qc;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    *reinterpret_cast<__nv_bfloat162*>(dst + dt * 8) =
                        __floats2bfloat162_rn(o[mt][dt][2 * i] * inv, o[mt][dt][2 * i + 1] * inv);
            } else {
                const size_t base = (t * num_q_heads + h) * splits + split;
                float* dst = part_acc + base * D + 2 * qc;
#pragma unroll
                for (int dt = 0; dt < DT; dt++)
                    *reinterpret_cast<float2*>(dst + dt * 8) =
                        make_float2(o[mt][dt][2 * i], o[mt][dt][2 * i + 1]);
                if (qc == 0) {
                    // The combine works in natural-log units, as the decode kernel's partials.
                    part_ml[base * 2] = m[mt][i] * LN2;
                    part_ml[base * 2 + 1] = l[mt][i];
                }
            }
        }
    }
}
