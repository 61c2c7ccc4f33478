//! Function names, each used once in [`kernel_modules`](super::kernel_modules) and once in
//! [`Kernels::load`](super::Kernels::load).

pub(super) const GATHER_ROWS: &str = "gather_rows_bf16";
pub(super) const RMS_NORM: &str = "rms_norm_bf16";
pub(super) const ADD_RMS_NORM: &str = "add_rms_norm_bf16";
pub(super) const RMS_NORM_HEADS: &str = "rms_norm_heads_bf16";
pub(super) const ADD_INPLACE: &str = "add_inplace_bf16";
pub(super) const ADD_BIAS: &str = "add_bias_bf16";
pub(super) const SILU_MUL: &str = "silu_mul_bf16";
pub(super) const GELU_TANH_MUL: &str = "gelu_tanh_mul_bf16";
pub(super) const SCALE: &str = "scale_bf16";
pub(super) const ROPE_QK: &str = "rope_qk_bf16";
pub(super) const WRITE_KV: &str = "write_kv";
pub(super) const ROPE_WRITE_KV: &str = "rope_write_kv";
pub(super) const FILL_NORMAL: &str = "fill_normal_bf16";
pub(super) const ATTENTION_COMBINE: &str = "attention_combine_bf16";
pub(super) const COPY_KV_BLOCKS: &str = "copy_kv_blocks_bf16";
pub(super) const GATHER_PAGED_ROWS: &str = "gather_paged_rows_bf16";
pub(super) const SCATTER_PAGED_ROWS: &str = "scatter_paged_rows_bf16";
pub(super) const GATHER_KEPT_ROWS: &str = "gather_kept_rows_bf16";
pub(super) const SELECT_KEPT_TOKENS: &str = "select_kept_tokens";
pub(super) const KEY_DIRECTION_PARTIALS: &str = "key_direction_partials";
pub(super) const KEY_DIRECTION_MEAN: &str = "key_direction_mean";
pub(super) const KEY_SCORES: &str = "key_scores";
pub(super) const WINDOW_SOFTMAX_PARTIALS: &str = "window_softmax_partials";
pub(super) const WINDOW_SOFTMAX_COMBINE: &str = "window_softmax_combine";
pub(super) const WINDOW_ATTENTION_MASS: &str = "window_attention_mass";
/// The `elem` instantiation of a kernel instantiated per cache element (`base_bf16`,
/// `base_fp8`).
pub(super) fn by_elem(base: &str, elem: super::CacheElem) -> String {
    format!("{base}_{}", elem.suffix())
}
pub(super) const WINDOW_POOL_SCORES: &str = "window_pool_scores";
pub(super) const SAMPLE_ROWS: &str = "sample_rows_f32";
/// Per cache element (`by_elem`).
pub(super) const ROPE_Q_WRITE_LATENTS: &str = "rope_q_write_latents";
pub(super) const LATENT_ROPE_TABLE: &str = "latent_rope_table_f32";
pub(super) const LATENT_COMBINE: &str = "latent_combine_bf16";
pub(super) const LATENT_VALUE_OUT: &str = "latent_value_out_bf16";
/// Per cache element (`by_elem`).
pub(super) const LATENT_GATHER_ROWS: &str = "latent_gather_rows";
pub(super) const LATENT_GATHER_POSITIONS: &str = "latent_gather_positions";
pub(super) const LATENT_FINISH_KV: &str = "latent_finish_kv_bf16";

/// The latent score instantiation for head width `d` and the latent cache's element.
pub(super) fn latent_scores(d: usize, elem: super::CacheElem) -> String {
    format!("latent_scores_d{d}_{}", elem.suffix())
}

/// The Hopper (wgmma) latent score instantiation (head width 128) for the cache's element.
pub(super) fn latent_scores_wg(elem: super::CacheElem) -> String {
    format!("latent_scores_wg_d128_{}", elem.suffix())
}

/// The rotary-absorbed latent score instantiation for head width `d`, `ks` k-steps and `mt`
/// m-tiles per warp.
pub(super) fn latent_scores_rot(d: usize, ks: usize, mt: usize) -> String {
    format!("latent_scores_rot_d{d}_k{ks}_m{mt}_bf16")
}

/// The register-factor latent score instantiation for head width `d` and `ks` k-steps.
pub(super) fn latent_scores_rel(d: usize, ks: usize) -> String {
    format!("latent_scores_rel_d{d}_k{ks}_bf16")
}

/// The latent value instantiation for `mt` m-tiles of 16 query heads and the latent cache's
/// element.
pub(super) fn latent_values(mt: usize, elem: super::CacheElem) -> String {
    format!("latent_values_mt{mt}_{}", elem.suffix())
}

/// The attention instantiation for head width `d`, group bound `g` and cache element.
pub(super) fn attention(d: usize, g: usize, elem: super::CacheElem) -> String {
    format!("paged_attention_d{d}_g{g}_{}", elem.suffix())
}

/// The tiled prefill attention instantiation for head width `d` and cache element.
pub(super) fn prefill_attention(d: usize, elem: super::CacheElem) -> String {
    format!("prefill_attention_d{d}_{}", elem.suffix())
}

/// The Hopper (wgmma) tiled prefill kernel, warp-specialised (producer warpgroup, mbarrier
/// hand-over): head width 128, bf16 cache.
pub(super) const PREFILL_WGMMA_WS: &str = "prefill_wgmma_ws_d128_bf16";

/// The matrix-vector instantiation for `n` input rows, one output kind and `ksplit` warps per
/// output column.
pub(super) fn gemv(n: usize, kind: super::GemvKind, ksplit: usize) -> String {
    match kind {
        super::GemvKind::Bf16 => format!("gemv_n{n}_k{ksplit}_bf16"),
        super::GemvKind::F32 => format!("gemv_n{n}_k{ksplit}_f32"),
        super::GemvKind::SwiGlu => format!("gemv_swiglu_n{n}_k{ksplit}_bf16"),
    }
}

/// The tensor-core decode attention instantiation for head width `d` and cache element.
pub(super) fn decode_attention_mma(d: usize, elem: super::CacheElem) -> String {
    format!("decode_attention_mma_d{d}_{}", elem.suffix())
}
