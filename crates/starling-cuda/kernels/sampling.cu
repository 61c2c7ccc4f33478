// Token sampling next to the logits (CPU reference: starling-backend sampling::sample_row, the
// host sampler's own math; the canonical semantics are written out in
// starling-backend/src/sampling/mod.rs). Only a token id and a log-probability per row leave the
// GPU.
//
// One launch per step; THREADS-thread blocks, one or several per sampled row (the greedy
// passes split across a row's blocks, the rest in one: see sample_rows_f32). Per row:
//  1. the largest raw logit and its lowest id (greedy), and the first NaN / +inf (an error, as on
//     the host);
//  2. the log-normaliser (sum of exp in f64) for the raw log-probability of the chosen token;
//  3. sampled rows only: s = min(logit / temperature, FLT_MAX), M = max s, min-p floor
//     M + ln(min_p). Top-k and top-p each move a rank cutoff (key, id): a token is kept when its
//     order-preserving u32 key of s is above the cutoff key, or equal with an id at most the
//     cutoff id. Each cutoff is found by an MSB-first radix select, 8 bits a pass, over
//     shared-memory histograms (token counts for top-k, fixed-point weights for top-p), ties at
//     the final key resolved in id order. The draw then takes, in increasing id order, the first
//     kept token whose running weight exceeds u * total.
// Weights exp(s - M) come from exp_nonpositive, bit-identical to the host's (every step an
// explicitly rounded f32 operation, so no FMA contraction). Every sum that decides a token is an
// integer: weight * 2^44, rounded, in a u64, so shared-memory atomics and scans give the same
// answer in any order and results never vary between runs. What can differ from the host is
// summation rounding (the host sums f32 lanes) and the fixed-point rounding (a weight below 2^-45,
// a token over 31 nats below the best, counts as 0): float near-ties, which the parity test
// tells apart from real disagreements.

typedef unsigned long long u64;

#define THREADS 1024
#define WARPS 32
#define BINS 256
#define FULL_MASK 0xffffffffu
#define NO_TOKEN 0xffffffffu
#define NEG_INF (__int_as_float(0xff800000))
#define POS_INF (__int_as_float(0x7f800000))
#define F32_MAX (__int_as_float(0x7f7fffff))
// 2^44: a weight in [0, 1] becomes an integer of at most 2^44, and 2^19 of them fit a u64.
#define FIXED_ONE 17592186044416.0

// Words per row of the parameter array (backend/sampling.rs packs them):
// row, flags, top_k (0 = off), temperature, top_p, ln(min_p) (-inf = off) as f32 bits, then the
// uniform draw as the low and high words of an f64.
#define PARAM_WORDS 8
#define FLAG_GREEDY 1u
#define FLAG_TOP_P 2u
// Words per row of the output: status, token id, logprob bits, 0. A non-finite logit reports its
// token id and value bits instead.
#define OUT_WORDS 4
#define STATUS_OK 0u
#define STATUS_NON_FINITE 1u
#define STATUS_NO_CANDIDATE 2u

// vector_math::exp_nonpositive: exp(x) for x <= 0, 0 below -87 (and for -inf).
__device__ __forceinline__ float exp_nonpositive(float x) {
    const float clamped = fmaxf(x, -87.0f);
    const float magic = 12582912.0f;
    const float shifted = __fadd_rn(__fmul_rn(clamped, 1.44269504088896340736f), magic);
    const float n = __fsub_rn(shifted, magic);
    const int exponent = (int)(__float_as_uint(shifted) - __float_as_uint(magic));
    const float r =
        __fsub_rn(__fsub_rn(clamped, __fmul_rn(n, 0.6933594f)), __fmul_rn(n, -2.1219444e-4f));
    float p = 1.9875691e-4f;
    p = __fadd_rn(__fmul_rn(p, r), 1.3981999e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 8.333452e-3f);
    p = __fadd_rn(__fmul_rn(p, r), 4.1665796e-2f);
    p = __fadd_rn(__fmul_rn(p, r), 1.6666665e-1f);
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    const float mantissa = __fadd_rn(__fadd_rn(__fmul_rn(__fmul_rn(p, r), r), r), 1.0f);
    const float scale = __uint_as_float((unsigned)(exponent + 127) << 23);
    const float value = __fmul_rn(mantissa, scale);
    return x < -87.0f ? 0.0f : value;
}

// An unsigned key in the order of f32::total_cmp (higher key = higher value; -0 below +0).
__device__ __forceinline__ unsigned order_key(float v) {
    const unsigned b = __float_as_uint(v);
    return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The value whose order_key is `key`.
__device__ __forceinline__ float key_value(unsigned key) {
    return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// filters::scale_by_temperature.
__device__ __forceinline__ float scaled(float v, float temperature) {
    return fminf(__fdiv_rn(v, temperature), F32_MAX);
}

// Shared memory of one row's block.
struct Scratch {
    u64 sums[WARPS];
    double f64_sums[WARPS];
    float values[WARPS];
    unsigned ids[WARPS];
    u64 hist[BINS];
    unsigned chosen;
    unsigned digit;
    u64 above;
};

// What the filters decide about one row's tokens.
struct Row {
    const float* x;
    int vocab;
    float temperature;
    float max_scaled;
    float floor;
    // Tokens ranking at or above (cut_key, cut_id) are kept.
    unsigned cut_key;
    unsigned cut_id;
};

__device__ __forceinline__ bool eligible(const Row& r, float s) {
    return s >= r.floor && s > NEG_INF;
}

__device__ __forceinline__ bool kept(const Row& r, float s, unsigned key, unsigned id) {
    return eligible(r, s) && (key > r.cut_key || (key == r.cut_key && id <= r.cut_id));
}

// The weight exp(s - M) as a fixed-point integer.
__device__ __forceinline__ u64 fixed_weight(const Row& r, float s) {
    return __double2ull_rn((double)exp_nonpositive(__fsub_rn(s, r.max_scaled)) * FIXED_ONE);
}

__device__ __forceinline__ u64 warp_sum_u64(u64 v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_f64(double v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(FULL_MASK, v, o);
    return v;
}

// Block sums; every thread gets the result. Integer sums are exact; the f64 one always adds in
// the same tree, so it does not vary between runs either.
__device__ u64 block_sum_u64(u64 v, Scratch& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_u64(v);
    __syncthreads();  // earlier readers of sh.sums are done
    if (lane == 0) sh.sums[warp] = v;
    __syncthreads();
    return warp_sum_u64(sh.sums[lane]);
}

__device__ double block_sum_f64(double v, Scratch& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    v = warp_sum_f64(v);
    __syncthreads();
    if (lane == 0) sh.f64_sums[warp] = v;
    __syncthreads();
    return warp_sum_f64(sh.f64_sums[lane]);
}

__device__ unsigned block_min_u32(unsigned v, Scratch& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL_MASK, v, o));
    __syncthreads();
    if (lane == 0) sh.ids[warp] = v;
    __syncthreads();
    v = sh.ids[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_xor_sync(FULL_MASK, v, o));
    return v;
}

// (value, id) pairs: the larger value wins, the lower id on equal values (ranking::argmax).
__device__ __forceinline__ void keep_better(float& v, unsigned& id, float other_v,
                                            unsigned other_id) {
    if (other_v > v || (other_v == v && other_id < id)) {
        v = other_v;
        id = other_id;
    }
}

__device__ void block_argmax(float& v, unsigned& id, Scratch& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        keep_better(v, id, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, id, o));
    __syncthreads();
    if (lane == 0) {
        sh.values[warp] = v;
        sh.ids[warp] = id;
    }
    __syncthreads();
    v = sh.values[lane];
    id = sh.ids[lane];
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        keep_better(v, id, __shfl_xor_sync(FULL_MASK, v, o), __shfl_xor_sync(FULL_MASK, id, o));
}

// Inclusive prefix sum over the threads of the block, in thread order.
__device__ u64 block_inclusive_scan_u64(u64 v, Scratch& sh) {
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
        const u64 n = __shfl_up_sync(FULL_MASK, v, o);
        if (lane >= o) v += n;
    }
    __syncthreads();
    if (lane == 31) sh.sums[warp] = v;
    __syncthreads();
    if (warp == 0) {
        u64 t = sh.sums[lane];
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const u64 n = __shfl_up_sync(FULL_MASK, t, o);
            if (lane >= o) t += n;
        }
        sh.sums[lane] = t;
    }
    __syncthreads();
    return warp > 0 ? v + sh.sums[warp - 1] : v;
}

// Sum over the row of amount(s, key, id).
template <class Amount>
__device__ u64 row_total(const Row& r, Amount amount, Scratch& sh) {
    u64 total = 0;
    for (int i = threadIdx.x; i < r.vocab; i += THREADS) {
        const float s = scaled(r.x[i], r.temperature);
        total += amount(s, order_key(s), (unsigned)i);
    }
    return block_sum_u64(total, sh);
}

// MSB-first radix select: the key c at which the running amount, taken from the highest key
// down, first reaches `need` (1 <= need <= the row's total amount). On return `need` is what is
// left to take among the tokens whose key is exactly c. A pass histograms the next 8 bits of the
// keys that match the digits found so far; integer atomics, so the bins are exact.
template <class Amount>
__device__ unsigned radix_select(const Row& r, Amount amount, u64& need, Scratch& sh) {
    unsigned prefix = 0, mask = 0;
    for (int shift = 24; shift >= 0; shift -= 8) {
        for (int b = threadIdx.x; b < BINS; b += THREADS) sh.hist[b] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < r.vocab; i += THREADS) {
            const float s = scaled(r.x[i], r.temperature);
            const unsigned key = order_key(s);
            if ((key & mask) != prefix) continue;
            const u64 a = amount(s, key, (unsigned)i);
            if (a != 0) atomicAdd(&sh.hist[(key >> shift) & 0xffu], a);
        }
        __syncthreads();
        // Thread j holds bin BINS - 1 - j, so the scan runs from the highest bin down; exactly one
        // thread sees the running amount cross `need`.
        const u64 v = threadIdx.x < BINS ? sh.hist[BINS - 1 - threadIdx.x] : 0;
        const u64 through = block_inclusive_scan_u64(v, sh);
        if (threadIdx.x < BINS && through >= need && through - v < need) {
            sh.digit = BINS - 1 - threadIdx.x;
            sh.above = through - v;
        }
        __syncthreads();
        prefix |= sh.digit << shift;
        mask |= 0xffu << shift;
        need -= sh.above;
        __syncthreads();  // everyone has read digit and above before the next pass
    }
    return prefix;
}

// The token at which the running amount, in increasing id order, first exceeds `target`
// (target < the row's total amount). Each thread owns a contiguous run of ids; a scan of the
// runs' totals names the one run that holds the answer, and its thread walks it.
template <class Amount>
__device__ unsigned select_in_id_order(const Row& r, Amount amount, u64 target, Scratch& sh) {
    const int run = (r.vocab + THREADS - 1) / THREADS;
    const int begin = min(r.vocab, (int)threadIdx.x * run), end = min(r.vocab, begin + run);
    u64 mine = 0;
    for (int i = begin; i < end; i++) {
        const float s = scaled(r.x[i], r.temperature);
        mine += amount(s, order_key(s), (unsigned)i);
    }
    __syncthreads();  // readers of an earlier answer are done
    if (threadIdx.x == 0) sh.chosen = NO_TOKEN;
    const u64 through = block_inclusive_scan_u64(mine, sh);
    const u64 before = through - mine;
    if (before <= target && target < through) {
        u64 left = target - before;
        for (int i = begin; i < end; i++) {
            const float s = scaled(r.x[i], r.temperature);
            const u64 a = amount(s, order_key(s), (unsigned)i);
            if (left < a) {
                sh.chosen = (unsigned)i;
                break;
            }
            left -= a;
        }
    }
    __syncthreads();
    return sh.chosen;
}

// Temperature, min-p, top-k, top-p and the draw (sampling::choose_token without the greedy
// branch); `best` is the largest raw logit.
__device__ unsigned sample_filtered(const float* x, int vocab, const unsigned* p, float best,
                                    Scratch& sh) {
    Row r;
    r.x = x;
    r.vocab = vocab;
    r.temperature = __uint_as_float(p[3]);
    // Division and fminf are monotone, so the largest scaled logit is the scaled largest.
    r.max_scaled = scaled(best, r.temperature);
    r.floor = __fadd_rn(r.max_scaled, __uint_as_float(p[5]));
    r.cut_key = 0;  // below every eligible key: all kept
    r.cut_id = NO_TOKEN;
    const unsigned top_k = p[2];
    const float top_p = __uint_as_float(p[4]);
    const double uniform = __hiloint2double((int)p[7], (int)p[6]);

    if (top_k != 0) {
        auto count = [&](float s, unsigned, unsigned) -> u64 { return eligible(r, s) ? 1 : 0; };
        const u64 allowed = row_total(r, count, sh);
        if (allowed > top_k) {
            u64 need = top_k;
            const unsigned key = radix_select(r, count, need, sh);
            // The k-th token is the need-th, in id order, of those whose key is exactly `key`.
            auto tie = [&](float s, unsigned k, unsigned) -> u64 {
                return k == key && eligible(r, s) ? 1 : 0;
            };
            r.cut_id = select_in_id_order(r, tie, need - 1, sh);
            r.cut_key = key;
        }
    }

    auto mass = [&](float s, unsigned key, unsigned id) -> u64 {
        return kept(r, s, key, id) ? fixed_weight(r, s) : 0;
    };
    if (p[1] & FLAG_TOP_P) {
        // The top token weighs 2^44 and is always kept, so the total is positive.
        const u64 total = row_total(r, mass, sh);
        const double wanted = ceil((double)top_p * (double)total);
        u64 need = wanted < 1.0 ? 1 : (wanted >= (double)total ? total : (u64)wanted);
        const unsigned key = radix_select(r, mass, need, sh);
        // Tokens tied at `key` weigh the same: the nucleus ends at the ceil(need / weight)-th of
        // them in id order (the weight is positive: their bin reached need >= 1).
        const u64 weight = fixed_weight(r, key_value(key));
        const u64 ties = (need + weight - 1) / weight;
        auto tie = [&](float s, unsigned k, unsigned id) -> u64 {
            return k == key && kept(r, s, k, id) ? 1 : 0;
        };
        const unsigned cut_id = select_in_id_order(r, tie, ties - 1, sh);
        r.cut_key = key;
        r.cut_id = cut_id;
    }

    const u64 total = row_total(r, mass, sh);
    u64 target = __double2ull_rz(uniform * (double)total);
    if (target >= total) target = total - 1;
    return select_in_id_order(r, mass, target, sh);
}

// 16-byte chunks of a row each thread has in flight in the greedy passes (max and normaliser).
// One block scans a whole row, so the row's bytes in flight are what bound it: the per-element
// loop (one 4-byte load per thread at a time, from L2 after the LM head) took 70-83 µs a row on
// the H200 for a 151,936-token vocabulary (kernel profile, 2026-12-03).
#define ROW_UNROLL 4

// Whether a row can be read in 16-byte chunks (its start aligned, its length a multiple of 4).
__device__ __forceinline__ bool row_in_chunks(const float* x, int vocab) {
    return (vocab & 3) == 0 && (reinterpret_cast<size_t>(x) & 15) == 0;
}

// ROW_UNROLL chunks of 4 logits from chunk c0 on, THREADS apart (-inf past `chunks`, which adds
// nothing to a max and exp_nonpositive(-inf) = 0 to a sum).
__device__ __forceinline__ void load_chunks(const float4* __restrict__ x4, int c0, int chunks,
                                            float4 (&v)[ROW_UNROLL]) {
#pragma unroll
    for (int u = 0; u < ROW_UNROLL; u++) {
        const int c = c0 + u * THREADS;
        v[u] = c < chunks ? x4[c] : make_float4(NEG_INF, NEG_INF, NEG_INF, NEG_INF);
    }
}

// One block's share of a row's greedy passes: the largest logit of ids [begin, end) with its
// lowest id, the first non-finite id, and Σ exp(x - best) over the share (in f64).
struct RowPart {
    double sum;
    float best;
    unsigned best_id;
    unsigned bad_id;
    unsigned pad;
};

// The greedy passes over ids [begin, end) of row x, by the whole block (every thread gets the
// results). `chunked`: begin is a multiple of 4 and the row starts 16-byte aligned.
__device__ RowPart scan_share(const float* __restrict__ x, int begin, int end, bool chunked,
                              Scratch& sh) {
    float best = NEG_INF;
    unsigned best_id = NO_TOKEN, bad_id = NO_TOKEN;
    // Ids rise along a thread's loop (also in the chunked form: chunk c holds ids 4c..4c+3), so
    // a strict > keeps its lowest id of a value.
    auto consider = [&](float v, unsigned id) {
        if (isnan(v) || v == POS_INF) {
            bad_id = min(bad_id, id);
        } else if (v > best) {
            best = v;
            best_id = id;
        }
    };
    const float4* x4 = reinterpret_cast<const float4*>(x);
    const int c_begin = begin >> 2, c_end = (end + 3) >> 2;
    if (chunked) {
        for (int c0 = c_begin + threadIdx.x; c0 < c_end; c0 += THREADS * ROW_UNROLL) {
            float4 v[ROW_UNROLL];
            load_chunks(x4, c0, c_end, v);
#pragma unroll
            for (int u = 0; u < ROW_UNROLL; u++) {
                const unsigned id = 4u * (unsigned)(c0 + u * THREADS);
                consider(v[u].x, id);
                consider(v[u].y, id + 1);
                consider(v[u].z, id + 2);
                consider(v[u].w, id + 3);
            }
        }
    } else {
        for (int i = begin + threadIdx.x; i < end; i += THREADS) consider(x[i], (unsigned)i);
    }
    bad_id = block_min_u32(bad_id, sh);
    block_argmax(best, best_id, sh);
    double sum = 0.0;
    if (bad_id == NO_TOKEN && best_id != NO_TOKEN) {
        if (chunked) {
            for (int c0 = c_begin + threadIdx.x; c0 < c_end; c0 += THREADS * ROW_UNROLL) {
                float4 v[ROW_UNROLL];
                load_chunks(x4, c0, c_end, v);
#pragma unroll
                for (int u = 0; u < ROW_UNROLL; u++)
                    sum += (double)exp_nonpositive(__fsub_rn(v[u].x, best)) +
                           (double)exp_nonpositive(__fsub_rn(v[u].y, best)) +
                           (double)exp_nonpositive(__fsub_rn(v[u].z, best)) +
                           (double)exp_nonpositive(__fsub_rn(v[u].w, best));
            }
        } else {
            for (int i = begin + threadIdx.x; i < end; i += THREADS)
                sum += (double)exp_nonpositive(__fsub_rn(x[i], best));
        }
        sum = block_sum_f64(sum, sh);
    }
    return RowPart{sum, best, best_id, bad_id, 0u};
}

// The row's totals from its `splits` shares (in share order, so every run adds alike): the best
// logit and its lowest id, the first non-finite id, and Σ exp(x - best) with each share's sum
// rescaled from its own best to the row's. Read past L1: other blocks wrote the shares.
__device__ RowPart combine_shares(const RowPart* __restrict__ shares, int splits) {
    RowPart total{0.0, NEG_INF, NO_TOKEN, NO_TOKEN, 0u};
    for (int s = 0; s < splits; s++) {
        const float b = __ldcg(&shares[s].best);
        const unsigned id = __ldcg(&shares[s].best_id);
        total.bad_id = min(total.bad_id, __ldcg(&shares[s].bad_id));
        if (id != NO_TOKEN) keep_better(total.best, total.best_id, b, id);
    }
    if (total.bad_id != NO_TOKEN || total.best_id == NO_TOKEN) return total;
    for (int s = 0; s < splits; s++) {
        if (__ldcg(&shares[s].best_id) == NO_TOKEN) continue;
        const double scale = exp((double)__ldcg(&shares[s].best) - (double)total.best);
        total.sum += __ldcg(&shares[s].sum) * scale;
    }
    return total;
}

// sampling::sample_row for each row of `params`: see the top of this file. Grid (rows, splits):
// with one split a row's block does everything; with more, block (row, s) scans the s-th share
// of the row's ids for the greedy passes (max, normaliser), writes it to `shares`, and the last
// of the row's blocks to finish (counted in `done`, zeroed by the host) combines them and goes
// on alone (status, greedy token or the filtered draw over the whole row, log-probability).
// Splitting spreads a row's exp pass, about 16 µs of arithmetic on one SM for a 151,936-token
// vocabulary, over several SMs.
extern "C" __global__ void __launch_bounds__(THREADS)
    sample_rows_f32(const float* __restrict__ logits, int vocab,
                    const unsigned* __restrict__ params, unsigned* __restrict__ out,
                    RowPart* __restrict__ shares, unsigned* __restrict__ done) {
    pdl_entry();
    __shared__ Scratch sh;
    __shared__ RowPart row_total;
    __shared__ bool last;
    const unsigned* p = params + (size_t)blockIdx.x * PARAM_WORDS;
    const float* x = logits + (size_t)p[0] * vocab;
    unsigned* o = out + (size_t)blockIdx.x * OUT_WORDS;
    const int splits = gridDim.y;
    const bool chunked = row_in_chunks(x, vocab);
    // Shares of whole chunks, so each starts 16-byte aligned.
    const int share = ((vocab + splits - 1) / splits + 3) & ~3;
    const int begin = min((int)blockIdx.y * share, vocab), end = min(begin + share, vocab);
    RowPart part = scan_share(x, begin, end, chunked, sh);
    if (splits > 1) {
        RowPart* mine = shares + (size_t)blockIdx.x * splits;
        if (threadIdx.x == 0) {
            mine[blockIdx.y] = part;
            __threadfence();
            last = atomicAdd(&done[blockIdx.x], 1u) == (unsigned)splits - 1;
        }
        __syncthreads();
        if (!last) return;
        __threadfence();
        if (threadIdx.x == 0) row_total = combine_shares(mine, splits);
        __syncthreads();
        part = row_total;
    }
    const float best = part.best;
    if (part.bad_id != NO_TOKEN) {
        if (threadIdx.x == 0) {
            o[0] = STATUS_NON_FINITE;
            o[1] = part.bad_id;
            o[2] = __float_as_uint(x[part.bad_id]);
            o[3] = 0;
        }
        return;
    }
    if (part.best_id == NO_TOKEN) {  // every logit is -inf
        if (threadIdx.x == 0) {
            o[0] = STATUS_NO_CANDIDATE;
            o[1] = 0;
            o[2] = 0;
            o[3] = 0;
        }
        return;
    }
    const float log_normalizer = __fadd_rn(best, __double2float_rn(log(part.sum)));

    const unsigned token =
        (p[1] & FLAG_GREEDY) ? part.best_id : sample_filtered(x, vocab, p, best, sh);
    if (threadIdx.x == 0) {
        o[0] = STATUS_OK;
        o[1] = token;
        o[2] = __float_as_uint(__fsub_rn(x[token], log_normalizer));
        o[3] = 0;
    }
}
