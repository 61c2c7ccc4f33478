// What the two decode attention kernels share (attention.cu: per token, any group;
// decode_attention.cu: tensor cores, grouped heads): the host launches either with the same
// arguments (backend/attention.rs), so they take one parameter list, and both read a replayed
// step's split plan the same way. The host prepends this file to both sources (kernels.rs).
//
// Parameters, in launch order:
//   out           [T, Hq*D] bf16 (splits == 1)
//   part_acc      [T, Hq, splits, D] f32 (splits > 1), part_ml [T, Hq, splits, 2] f32
//   qkv           [T, qkv_width] bf16, the fused projection (Q part read)
//   k_cache, v_cache   the layer's paged planes
//   rows          the query token of each blockIdx.x
//   tok_seq       sequence of each query token; tok_visible: context positions each one sees
//   block_tables  [sequences, max_blocks]
//   window        a sliding-window layer's reach (a token seeing `visible` keys attends to keys
//                 [visible - window, visible)); 0: the whole context
//   plan          null, or {splits, split_len} on the device (a replayed step)
#define DECODE_ATTENTION_PARAMS                                                                  \
    bf16* __restrict__ out, float* __restrict__ part_acc, float* __restrict__ part_ml,           \
        const bf16* __restrict__ qkv, int qkv_width, const bf16* __restrict__ k_cache,           \
        const bf16* __restrict__ v_cache, const unsigned* __restrict__ rows,                     \
        const unsigned* __restrict__ tok_seq, const unsigned* __restrict__ tok_visible,          \
        const unsigned* __restrict__ block_tables, int max_blocks, int block_size,               \
        int num_kv_heads, int group, float scale, int window, int splits, int split_len,         \
        const unsigned* __restrict__ plan

// The first key a token seeing `visible` keys attends to (0 without a window). A split covers
// keys [first + split * split_len, +split_len): the plan sized splits for the whole visible
// length, so a window only leaves the later splits empty.
__device__ __forceinline__ int window_first_key(int visible, int window) {
    return window > 0 ? max(0, visible - window) : 0;
}

// A replayed decode step (CUDA graph) launches the bucket's largest split count and reads this
// step's plan from `plan`; eager launches pass the plan by value and a null pointer. False for a
// split the step does not use: its block leaves at once (whole blocks, before any barrier).
__device__ __forceinline__ bool decode_split_in_plan(const unsigned* plan, int& splits,
                                                     int& split_len) {
    if (plan != nullptr) {
        splits = (int)plan[0];
        split_len = (int)plan[1];
        if ((int)blockIdx.z >= splits) return false;
    }
    return true;
}
