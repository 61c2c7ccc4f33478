//! A model's projections timed alone, through the path serving takes (`ModelOps::linear`:
//! GEMV for small batches, else cuBLAS or cuBLASLt, the bias fused or in a launch of its own).
//!
//! Why alone: a serving run's per-launch profile brackets each cuBLAS call with events on the
//! stream, and when the stream runs dry while the host is inside cuBLAS those events span host
//! time too (session 33: the QKV GEMM read 222–331 µs a launch there, while removing its bias
//! epilogue did not move TTFT). Each row has two times: one call issued to an idle stream (the
//! host's work in cuBLAS included, as a profile sees it) and the per-call time of
//! [`PIPELINED_CALLS`] calls issued back to back (the host runs ahead, so this is the device's
//! time unless the host is slower than the kernel).

use starling_backend::ModelOps;

use super::time_ms;
use crate::{CudaBackend, CudaError};

/// Calls issued back to back for the pipelined time.
pub const PIPELINED_CALLS: usize = 10;

/// One projection of a model: `y[rows, out] = x[rows, in] · wᵀ (+ bias)`.
#[derive(Debug, Clone, Copy)]
pub struct Projection<'a> {
    /// What it is (`qkv`, `o`, `gate_up`, `down`).
    pub name: &'a str,
    /// Output features.
    pub out_features: usize,
    /// Input features.
    pub in_features: usize,
    /// Whether the model has a bias on it (Qwen2's QKV).
    pub bias: bool,
}

/// One timed projection at one row count.
#[derive(Debug, Clone, serde::Serialize)]
pub struct GemmRow {
    /// The projection's name.
    pub name: String,
    /// Rows (tokens of the step).
    pub rows: usize,
    /// Output features.
    pub out_features: usize,
    /// Input features.
    pub in_features: usize,
    /// Whether a bias was added.
    pub bias: bool,
    /// Median milliseconds of one call issued to an idle stream (host work inside it included).
    pub single_call_ms: f64,
    /// Median milliseconds a call of [`PIPELINED_CALLS`] issued back to back.
    pub pipelined_ms: f64,
    /// 2 · rows · out · in over the pipelined time.
    pub achieved_tflops: f64,
}

/// Times `projection` at `rows` rows through `ModelOps::linear` (random bf16 operands).
pub fn bench_projection(
    backend: &CudaBackend,
    projection: Projection<'_>,
    rows: usize,
) -> Result<GemmRow, CudaError> {
    let Projection {
        name,
        out_features,
        in_features,
        bias,
    } = projection;
    let x = backend.random_bf16(vec![rows, in_features], 21, 1.0, 0.0)?;
    let w = backend.random_bf16(vec![out_features, in_features], 22, 0.02, 0.0)?;
    let b = if bias {
        Some(backend.random_bf16(vec![out_features], 23, 0.1, 0.0)?)
    } else {
        None
    };
    let call = || -> Result<(), CudaError> {
        backend.linear(&x, &w, b.as_ref())?;
        Ok(())
    };
    let single_call_ms = time_ms(backend, 3, 20, call)?;
    let pipelined_ms = time_ms(backend, 1, 10, || {
        (0..PIPELINED_CALLS).try_for_each(|_| call())
    })? / PIPELINED_CALLS as f64;
    let flops = 2.0 * (rows * out_features * in_features) as f64;
    Ok(GemmRow {
        name: name.to_string(),
        rows,
        out_features,
        in_features,
        bias,
        single_call_ms,
        pipelined_ms,
        achieved_tflops: flops / (pipelined_ms * 1e-3) / 1e12,
    })
}
