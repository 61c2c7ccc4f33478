//! `starling bench kernels --gemm`: a model's projection GEMMs timed alone, at the row counts
//! of decode batches and prefill chunks, through the path serving takes (see
//! `starling_cuda::bench::gemm` for why a profile of a serving run cannot say this).

use std::path::PathBuf;

use anyhow::Result;
use starling_backend::BackendCore;
use starling_cuda::bench::{bench_projection, Projection, PIPELINED_CALLS};
use starling_cuda::CudaBackend;
use starling_models::{preset, ModelConfig};

/// Rows of the timed calls: decode batches (GEMV below 32 rows), a large batch, prefill chunks.
const GEMM_ROWS: [usize; 5] = [1, 16, 256, 2048, 8192];

/// The projections of one layer of `c`, as the model's weights are laid out (Q, K and V in one
/// matrix; gate and up in one).
fn layer_projections(c: &ModelConfig) -> [Projection<'static>; 4] {
    let q_width = c.num_attention_heads * c.head_dim;
    let qkv_width = (c.num_attention_heads + 2 * c.num_kv_heads) * c.head_dim;
    [
        Projection {
            name: "qkv",
            out_features: qkv_width,
            in_features: c.hidden_size,
            bias: c.attention_bias,
        },
        Projection {
            name: "o",
            out_features: c.hidden_size,
            in_features: q_width,
            bias: false,
        },
        Projection {
            name: "gate_up",
            out_features: 2 * c.intermediate_size,
            in_features: c.hidden_size,
            bias: false,
        },
        Projection {
            name: "down",
            out_features: c.hidden_size,
            in_features: c.intermediate_size,
            bias: false,
        },
    ]
}

/// Times every projection of the preset `model` at [`GEMM_ROWS`] and prints a table.
pub fn projections(gpu: &CudaBackend, model: &str, output: &Option<PathBuf>) -> Result<()> {
    let projections = layer_projections(&preset(model)?);
    // `None`: no row limit (usize::MAX, the default).
    let epilogue = Some(gpu.bias_epilogue_max_rows()).filter(|&n| n != usize::MAX);
    let epilogue_rows = match epilogue {
        None => "at every row count".to_string(),
        Some(n) => format!("up to {n} rows"),
    };
    println!(
        "{model}'s projections on {}; bias in the cuBLASLt epilogue {epilogue_rows}",
        gpu.name()
    );
    println!(
        "| projection | out x in | bias | rows | one call from idle ms | pipelined ms ({PIPELINED_CALLS} calls) | TFLOP/s |"
    );
    println!("|---|---|---|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for p in projections {
        for n in GEMM_ROWS {
            let r = bench_projection(gpu, p, n)?;
            println!(
                "| {} | {}x{} | {} | {n} | {:.4} | {:.4} | {:.0} |",
                r.name,
                r.out_features,
                r.in_features,
                if r.bias { "yes" } else { "no" },
                r.single_call_ms,
                r.pipelined_ms,
                r.achieved_tflops
            );
            rows.push(r);
        }
    }
    super::bench_gpu::write_json(
        output,
        serde_json::json!({
            "bench": "kernels_gemm",
            "device": gpu.name(),
            "model": model,
            "bias_epilogue_max_rows": epilogue,
            "rows": rows,
        }),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn qwen_projections_have_the_served_shapes() {
        // The sites of a serving profile of Qwen2.5-Coder-1.5B: cublas:gemm 2048x1536 (QKV, with
        // its bias), 1536x1536, 17920x1536, 1536x8960.
        let shapes: Vec<_> = layer_projections(&preset("qwen2.5-coder-1.5b").unwrap())
            .iter()
            .map(|p| (p.name, p.out_features, p.in_features, p.bias))
            .collect();
        assert_eq!(
            shapes,
            [
                ("qkv", 2048, 1536, true),
                ("o", 1536, 1536, false),
                ("gate_up", 17920, 1536, false),
                ("down", 1536, 8960, false),
            ]
        );
        // Llama has no QKV bias and four times as many query as KV heads.
        let llama = layer_projections(&preset("llama3-8b").unwrap());
        assert_eq!((llama[0].out_features, llama[0].bias), (6144, false));
    }
}
