//! `starling bench kernels` and `starling bench decode`: GPU measurements (CUDA backend). Each
//! result file records the copy bandwidth measured in the same run, so figures are ratios to a
//! ceiling taken on the same card at the same time.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Args;
use starling_backend::sampling::{RowSamplingParams, TokenFilter};
use starling_backend::{
    AttentionDims, BackendCore, DecodeGraphConfig, DecodeStep, DeviceSampling, GraphCapture,
};
use starling_cuda::bench::{
    attention_meta, bench_attention, bench_attention_in, bench_compaction, bench_kv_write,
    bench_kv_write_in, bench_latent_attention, bench_latent_attention_in, bench_latent_write,
    bench_latent_write_in, copy_bandwidth_tb_s, fill_cache, LatentAttentionRow, LatentRanks,
};
use starling_cuda::CudaBackend;
use starling_models::llama::{ForwardOptions, LlamaModel};
use starling_models::preset;

/// `starling bench kernels` flags.
#[derive(Args, Debug)]
pub struct KernelsArgs {
    /// Write the rows as JSON here.
    #[arg(long)]
    output: Option<PathBuf>,
    /// Smaller grid (for a quick check).
    #[arg(long)]
    quick: bool,
    /// Only the STAR-KV latent rows (each still beside its dense row): for profiling them.
    #[arg(long)]
    latent_only: bool,
    /// Only causal prefill with TFLOP/s: whole prompts (query = context, 4k–24k tokens) and
    /// the last 8k chunk of 16k and 24k prompts, the shapes of a serving step's prefill: compare with `scripts/bench/prefill_baseline.py`
    /// (FA2, and vLLM's FA3 where vLLM is installed).
    #[arg(long, conflicts_with = "latent_only")]
    prompt_prefill: bool,
    /// Only the projection GEMMs of `--gemm-model` at 1 to 8192 rows, as serving runs them
    /// (bias included): one call from an idle stream and calls issued back to back.
    /// `STARLING_GEMM_BIAS_EPILOGUE_MAX_ROWS` says up to which row count the bias goes in the
    /// cuBLASLt epilogue.
    #[arg(long, conflicts_with_all = ["latent_only", "prompt_prefill"])]
    gemm: bool,
    /// The synthetic preset whose projections `--gemm` times.
    #[arg(long, default_value = "qwen2.5-coder-1.5b")]
    gemm_model: String,
}

/// (batch, context tokens, query tokens) of `bench kernels --prompt-prefill`: one and two 4k
/// prompts (the 8,192-token steps of the serving campaigns), long prompts whole, and the last
/// 8,192-token chunk of a 16k and a 24k prompt (what a serving step with chunked prefill
/// attends: queries over the earlier chunks' cached keys as well as their own).
const PROMPT_PREFILL_POINTS: [(usize, usize, usize); 6] = [
    (1, 4096, 4096),
    (2, 4096, 4096),
    (1, 16384, 16384),
    (1, 24576, 24576),
    (1, 16384, 8192),
    (1, 24576, 8192),
];

/// `starling bench decode` flags.
#[derive(Args, Debug)]
pub struct DecodeArgs {
    /// Synthetic model presets (real shapes, random weights made on the GPU).
    #[arg(long, value_delimiter = ',', default_value = "llama2-7b,qwen2.5-7b")]
    models: Vec<String>,
    /// Batch sizes.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,64,128,256")]
    batch_sizes: Vec<usize>,
    /// Context lengths (tokens already in the cache per sequence).
    #[arg(long, value_delimiter = ',', default_value = "512,2048")]
    contexts: Vec<usize>,
    /// Most KV-cache memory to use for one point; larger points are skipped.
    #[arg(long, default_value = "100GiB", value_parser = crate::bytes::parse_bytes)]
    kv_budget: u64,
    /// Timed steps per point (after 3 warm-up steps).
    #[arg(long, default_value_t = 10)]
    steps: usize,
    /// Write the rows as JSON here.
    #[arg(long)]
    output: Option<PathBuf>,
}

/// `starling bench compaction` flags.
#[derive(Args, Debug)]
pub struct CompactionArgs {
    /// Physical tokens of the compacted sequence.
    #[arg(long, value_delimiter = ',', default_value = "4096,32768")]
    tokens: Vec<usize>,
    /// Eviction ratio (KeyDiff).
    #[arg(long, default_value_t = 0.5)]
    ratio: f64,
    /// Timed runs per path (after 3 warm-up runs).
    #[arg(long, default_value_t = 20)]
    iters: usize,
    /// Write the rows as JSON here.
    #[arg(long)]
    output: Option<PathBuf>,
}

/// Runs `starling bench compaction`: one layer's KeyDiff compaction per KV shape and length,
/// selected on the host (scores copied back, as before session 23) and on the device.
pub fn compaction(args: CompactionArgs) -> Result<()> {
    if !(0.0..1.0).contains(&args.ratio) || args.iters == 0 {
        bail!("need 0 <= --ratio < 1 and --iters >= 1");
    }
    let gpu = gpu()?;
    println!(
        "device {}; one layer, KeyDiff@{}, wall ms (median of {})",
        gpu.name(),
        args.ratio,
        args.iters
    );
    println!(
        "\n| KV heads x dim | tokens | kept | host path: issued / done | device path: issued / done | select kernel | done, host / device |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    // Qwen2.5-Coder-1.5B, qwen2.5-7b, an 8-KV-head GQA model, the prior work's MHA shape.
    let shapes = [(2usize, 128usize), (4, 128), (8, 128), (32, 128)];
    let mut rows = Vec::new();
    for (nkv, hd) in shapes {
        for &tokens in &args.tokens {
            let r = bench_compaction(&gpu, nkv, hd, tokens, args.ratio, args.iters)?;
            println!(
                "| {nkv}x{hd} | {tokens} | {} | {:.3} / {:.3} | {:.3} / {:.3} | {:.3} | {:.2} |",
                r.kept_tokens,
                r.host_path_issue_ms,
                r.host_path_total_ms,
                r.device_path_issue_ms,
                r.device_path_total_ms,
                r.select_kernel_ms,
                r.host_path_total_ms / r.device_path_total_ms
            );
            rows.push(r);
        }
    }
    write_json(
        &args.output,
        serde_json::json!({ "bench": "compaction", "device": gpu.name(), "ratio": args.ratio, "rows": rows }),
    )
}

fn gpu() -> Result<CudaBackend> {
    CudaBackend::new(0).context("the GPU benchmarks need a CUDA device")
}

/// Writes `doc` to `path` when one is given.
pub(crate) fn write_json(path: &Option<PathBuf>, doc: serde_json::Value) -> Result<()> {
    if let Some(path) = path {
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// Runs `starling bench kernels`.
pub fn kernels(args: KernelsArgs) -> Result<()> {
    let gpu = gpu()?;
    if args.gemm {
        return crate::commands::bench_gemm::projections(&gpu, &args.gemm_model, &args.output);
    }
    let copy_tb_s = copy_bandwidth_tb_s(&gpu, 4 << 30)?;
    println!(
        "device {}; copy bandwidth {copy_tb_s:.2} TB/s (read + write)",
        gpu.name()
    );
    let shapes = [
        (
            "MHA 32x128",
            AttentionDims {
                cache_group: 0,
                window_tokens: None,
                num_heads: 32,
                num_kv_heads: 32,
                head_dim: 128,
                scale: 0.088,
            },
        ),
        (
            "GQA 32/8x128",
            AttentionDims {
                cache_group: 0,
                window_tokens: None,
                num_heads: 32,
                num_kv_heads: 8,
                head_dim: 128,
                scale: 0.088,
            },
        ),
    ];
    if args.prompt_prefill {
        return prompt_prefill(&gpu, &shapes, &args.output);
    }
    let mut decode_points: Vec<(usize, usize)> = Vec::new();
    let seqs: &[usize] = if args.quick {
        &[1024, 8192]
    } else {
        &[1024, 2048, 4096, 8192]
    };
    let batches: &[usize] = if args.quick { &[1, 64] } else { &[1, 16, 64] };
    for &s in seqs {
        for &b in batches {
            decode_points.push((b, s));
        }
    }
    // A lone long request (where the split plan's bound binds) and a memory-bound batch.
    decode_points.extend([(1, 32768), (20, 32768)]);
    let mut rows = Vec::new();
    let mut writes = Vec::new();
    let mut fp8 = Fp8Rows::default();
    if !args.latent_only {
        dense_kernels(
            &gpu,
            copy_tb_s,
            &shapes,
            &decode_points,
            &mut rows,
            &mut writes,
        )?;
        fp8_kernels(&gpu, &shapes, &decode_points, &mut fp8)?;
    }
    let latent = latent_kernels(&gpu, &decode_points, args.quick)?;
    let fp8_latent = fp8_latent_kernels(&gpu, &decode_points, &latent.bf16)?;
    let (latent_rows, latent_writes) = (latent.rows, latent.writes);
    write_json(
        &args.output,
        serde_json::json!({
            "bench": "kernels",
            "device": gpu.name(),
            "copy_tb_s": copy_tb_s,
            "attention": rows,
            "kv_write": writes,
            "fp8_attention": fp8.attention,
            "fp8_kv_write": fp8.writes,
            "latent_attention": latent_rows,
            "latent_write": latent_writes,
            "fp8_latent_attention": fp8_latent.attention,
            "fp8_latent_write": fp8_latent.writes,
        }),
    )
}

/// `--prompt-prefill`: whole prompts attended causally from an empty context, for each dense
/// shape and Qwen2.5-Coder-1.5B's heads, at [`PROMPT_PREFILL_POINTS`].
fn prompt_prefill(
    gpu: &CudaBackend,
    shapes: &[(&str, AttentionDims)],
    output: &Option<PathBuf>,
) -> Result<()> {
    let qwen = AttentionDims {
        num_heads: 12,
        num_kv_heads: 2,
        ..shapes[0].1
    };
    let mut all: Vec<(&str, AttentionDims)> = shapes.to_vec();
    all.push(("Qwen 12/2x128", qwen));
    let kernel = gpu.prefill_kernel_name(qwen.head_dim);
    println!(
        "Tiled prefill kernel: {}",
        kernel.as_deref().unwrap_or("none (decode kernels)")
    );
    println!("| shape | batch | context tokens | query tokens | ms | TFLOP/s |");
    println!("|---|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for (label, dims) in all {
        for (batch, tokens, query) in PROMPT_PREFILL_POINTS {
            let r = bench_attention(gpu, dims, batch, tokens, query)?;
            println!(
                "| {label} | {batch} | {tokens} | {query} | {:.4} | {:.0} |",
                r.median_ms, r.achieved_tflops
            );
            rows.push(serde_json::json!({ "shape": label, "row": r }));
        }
    }
    write_json(
        output,
        serde_json::json!({
            "bench": "kernels_prompt_prefill",
            "device": gpu.name(),
            "prefill_kernel": kernel.as_deref(),
            "rows": rows,
        }),
    )
}

/// The dense rows: paged attention at every decode point and prefill chunk, and the KV write
/// against a copy of the same bytes.
fn dense_kernels(
    gpu: &CudaBackend,
    copy_tb_s: f64,
    shapes: &[(&str, AttentionDims)],
    decode_points: &[(usize, usize)],
    rows: &mut Vec<serde_json::Value>,
    writes: &mut Vec<serde_json::Value>,
) -> Result<()> {
    println!("| kind | shape | batch | seq | query | ms | KV GB | TB/s | % of copy |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut emit = |label: &str, r: starling_cuda::bench::AttentionRow| {
        println!(
            "| {} | {label} | {} | {} | {} | {:.4} | {:.3} | {:.2} | {:.0}% |",
            r.kind,
            r.batch,
            r.seq_tokens,
            r.query_tokens,
            r.median_ms,
            r.kv_bytes as f64 / 1e9,
            r.achieved_tb_s,
            100.0 * r.achieved_tb_s / copy_tb_s
        );
        rows.push(serde_json::json!({ "shape": label, "row": r }));
    };
    for &(label, dims) in shapes {
        for &(b, s) in decode_points {
            emit(label, bench_attention(gpu, dims, b, s, 1)?);
        }
        for &s in &[8192usize, 32768] {
            for &b in &[1usize, 4] {
                for &chunk in &[128usize, 512] {
                    emit(label, bench_attention(gpu, dims, b, s, chunk)?);
                }
            }
        }
    }
    println!("\n| KV write tokens | kv width | write ms | copy ms | write / copy |");
    println!("|---:|---:|---:|---:|---:|");
    for &(label, dims) in shapes {
        for &tokens in &[16usize, 512, 8192, 65536] {
            let r = bench_kv_write(gpu, dims, tokens)?;
            println!(
                "| {} ({label}) | {} | {:.4} | {:.4} | {:.2} |",
                r.tokens, r.kv_width, r.write_ms, r.copy_ms, r.ratio_to_copy
            );
            writes.push(serde_json::json!({ "shape": label, "row": r }));
        }
    }
    Ok(())
}

/// The fp8 cache's rows (`--kv-cache-dtype fp8`), each beside the bf16 row of the same point
/// timed right before it.
#[derive(Default)]
struct Fp8Rows {
    attention: Vec<serde_json::Value>,
    writes: Vec<serde_json::Value>,
}

/// Paged attention and the KV write over an fp8 cache against bf16, at every decode point and
/// one prefill chunk per shape.
fn fp8_kernels(
    gpu: &CudaBackend,
    shapes: &[(&str, AttentionDims)],
    decode_points: &[(usize, usize)],
    out: &mut Fp8Rows,
) -> Result<()> {
    use starling_kv::CacheDtype;
    println!("\n| fp8 vs bf16 | shape | batch | seq | query | bf16 ms | fp8 ms | bf16 / fp8 |");
    println!("|---|---|---:|---:|---:|---:|---:|---:|");
    for &(label, dims) in shapes {
        let points = decode_points
            .iter()
            .map(|&(b, s)| (b, s, 1))
            .chain([(1, 8192, 512), (4, 32768, 512)]);
        for (b, s, q) in points {
            let bf16 = bench_attention_in(gpu, dims, b, s, q, CacheDtype::BF16)?;
            let fp8 = bench_attention_in(gpu, dims, b, s, q, CacheDtype::Fp8)?;
            let speedup = bf16.median_ms / fp8.median_ms;
            println!(
                "| {} | {label} | {b} | {s} | {q} | {:.4} | {:.4} | {speedup:.2} |",
                fp8.kind, bf16.median_ms, fp8.median_ms
            );
            out.attention.push(serde_json::json!({
                "shape": label, "bf16": bf16, "fp8": fp8, "speedup_vs_bf16": speedup,
            }));
        }
        for tokens in [16usize, 8192] {
            let bf16 = bench_kv_write_in(gpu, dims, tokens, CacheDtype::BF16)?;
            let fp8 = bench_kv_write_in(gpu, dims, tokens, CacheDtype::Fp8)?;
            println!(
                "| write | {label} | | {tokens} | | {:.4} | {:.4} | {:.2} |",
                bf16.write_ms,
                fp8.write_ms,
                bf16.write_ms / fp8.write_ms
            );
            out.writes
                .push(serde_json::json!({ "shape": label, "bf16": bf16, "fp8": fp8 }));
        }
    }
    Ok(())
}

/// One STAR-KV latent layer shape of the kernel bench.
struct LatentShape {
    label: String,
    /// The dense shape of the same heads, as the FA2 baseline names it.
    dense_label: &'static str,
    dims: AttentionDims,
    ranks: LatentRanks,
    hidden_size: usize,
}

/// The latent shapes the issue names: the prior work's MHA shape at half its K/V bytes, and
/// Qwen2.5-Coder-1.5B at its balanced checkpoint's ranks and its aggressive profile's.
fn latent_shapes() -> Result<Vec<LatentShape>> {
    let mha = AttentionDims {
        cache_group: 0,
        window_tokens: None,
        num_heads: 32,
        num_kv_heads: 32,
        head_dim: 128,
        scale: 0.088,
    };
    let qwen = preset("qwen2.5-coder-1.5b")?;
    let qwen_dims = AttentionDims {
        cache_group: 0,
        window_tokens: None,
        num_heads: qwen.num_attention_heads,
        num_kv_heads: qwen.num_kv_heads,
        head_dim: qwen.head_dim,
        scale: 1.0 / (qwen.head_dim as f32).sqrt(),
    };
    // The aggressive profile's ranks from its budget (uniform over the compressed layers);
    // no GPU-distilled aggressive checkpoint exists at the current 30% share.
    let shape = starling_starkv::KvShape::of(&qwen);
    let keep = starling_starkv::UncompressedLayers::reference(qwen.num_layers);
    let budget = starling_starkv::CacheBudget::new(
        &shape,
        starling_starkv::RankProfile::Aggressive.target(),
        &keep,
    )?;
    let aggressive = starling_starkv::uniform_allocation(&shape, &budget, &keep)?
        .cache_layout(starling_kv::CacheDtype::BF16)
        .layers
        .into_iter()
        .find_map(|layer| match layer {
            starling_kv::LayerLayout::LowRank {
                key_rank_per_head,
                value_rank,
                ..
            } => Some(LatentRanks {
                key_rank_per_head,
                value_rank,
            }),
            starling_kv::LayerLayout::Full { .. } => None,
        })
        .context("the aggressive profile compresses no layer")?;
    Ok(vec![
        LatentShape {
            label: "MHA 32x128 latent k64/head v2048".to_owned(),
            dense_label: "MHA 32x128",
            dims: mha,
            ranks: LatentRanks {
                key_rank_per_head: vec![64; 32],
                value_rank: 2048,
            },
            hidden_size: 4096,
        },
        // The median stored ranks over the compressed layers of the GPU-distilled balanced
        // checkpoint (bench/results/gpu/starkv_qwen1_5b_2026-11-30_s7/manifest_kd_balanced.json).
        LatentShape {
            label: "Qwen1.5B 12/2x128 latent balanced".to_owned(),
            dense_label: "Qwen 12/2x128",
            dims: qwen_dims,
            ranks: LatentRanks {
                key_rank_per_head: vec![96, 96],
                value_rank: 256,
            },
            hidden_size: qwen.hidden_size,
        },
        LatentShape {
            label: format!(
                "Qwen1.5B 12/2x128 latent aggressive k{:?} v{}",
                aggressive.key_rank_per_head, aggressive.value_rank
            ),
            dense_label: "Qwen 12/2x128",
            dims: qwen_dims,
            ranks: aggressive,
            hidden_size: qwen.hidden_size,
        },
    ])
}

/// The latent rows of `bench kernels`: their JSON, and each attention row by (shape label,
/// batch, seq, query) for the fp8 comparison, which sets its fp8 rows beside them.
struct LatentRows {
    rows: Vec<serde_json::Value>,
    writes: Vec<serde_json::Value>,
    bf16: std::collections::HashMap<(String, usize, usize, usize), LatentAttentionRow>,
}

/// Latent attention (decode points and prefill chunks) and latent projection + write, each
/// beside the dense kernel of the same shape.
fn latent_kernels(
    gpu: &CudaBackend,
    decode_points: &[(usize, usize)],
    quick: bool,
) -> Result<LatentRows> {
    println!(
        "\n| latent shape | kind | batch | seq | query | latent ms | dense ms | latent / dense speed | byte ratio |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    let mut writes = Vec::new();
    let mut bf16 = std::collections::HashMap::new();
    let prefill_points: &[(usize, usize, usize)] = if quick {
        &[(1, 8192, 512)]
    } else {
        &[
            (1, 8192, 512),
            (4, 8192, 512),
            (1, 32768, 512),
            (4, 8192, 128),
        ]
    };
    let shapes = latent_shapes()?;
    for shape in &shapes {
        let points = decode_points
            .iter()
            .map(|&(b, s)| (b, s, 1))
            .chain(prefill_points.iter().copied());
        for (batch, seq, query) in points {
            let r = bench_latent_attention(gpu, shape.dims, &shape.ranks, batch, seq, query)?;
            println!(
                "| {} | {} | {batch} | {seq} | {query} | {:.4} | {:.4} | {:.2}× | {:.2}× |",
                shape.label,
                r.latent.kind,
                r.latent.median_ms,
                r.dense.median_ms,
                r.speedup_vs_dense,
                r.byte_ratio
            );
            rows.push(serde_json::json!({
                "shape": shape.label, "dense_shape": shape.dense_label,
                "ranks": shape.ranks, "row": r,
            }));
            bf16.insert((shape.label.clone(), batch, seq, query), r);
        }
    }
    println!("\n| latent shape | tokens | latent proj + write ms | dense proj + write ms | latent / dense time |");
    println!("|---|---:|---:|---:|---:|");
    for shape in &shapes {
        for &tokens in &[1usize, 16, 512, 8192] {
            let r = bench_latent_write(gpu, shape.dims, &shape.ranks, shape.hidden_size, tokens)?;
            println!(
                "| {} | {tokens} | {:.4} | {:.4} | {:.2} |",
                shape.label, r.latent_ms, r.dense_ms, r.ratio_to_dense
            );
            writes
                .push(serde_json::json!({ "shape": shape.label, "ranks": shape.ranks, "row": r }));
        }
    }
    Ok(LatentRows { rows, writes, bf16 })
}

/// The fp8 latent cache's rows (`--kv-cache-dtype fp8` with STAR-KV): latent attention at every
/// decode point and one prefill chunk, and the latent projection + write, each beside the bf16
/// latent row of the same point — the one `latent_kernels` timed (`bf16`: both caches filled by
/// the latent write, same contents), else timed here.
fn fp8_latent_kernels(
    gpu: &CudaBackend,
    decode_points: &[(usize, usize)],
    bf16_rows: &std::collections::HashMap<(String, usize, usize, usize), LatentAttentionRow>,
) -> Result<Fp8Rows> {
    use starling_kv::CacheDtype;
    println!(
        "\n| fp8 vs bf16 latents | shape | batch | seq | query | bf16 ms | fp8 ms | bf16 / fp8 | fp8 vs dense speed |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|");
    let mut out = Fp8Rows::default();
    for shape in latent_shapes()? {
        let (label, dims, ranks) = (&shape.label, shape.dims, &shape.ranks);
        let points = decode_points
            .iter()
            .map(|&(b, s)| (b, s, 1))
            .chain([(1, 8192, 512)]);
        for (b, s, q) in points {
            let bf16 = match bf16_rows.get(&(label.clone(), b, s, q)) {
                Some(row) => row.clone(),
                None => bench_latent_attention_in(gpu, dims, ranks, b, s, q, CacheDtype::BF16)?,
            };
            let fp8 = bench_latent_attention_in(gpu, dims, ranks, b, s, q, CacheDtype::Fp8)?;
            let speedup = bf16.latent.median_ms / fp8.latent.median_ms;
            println!(
                "| {} | {label} | {b} | {s} | {q} | {:.4} | {:.4} | {speedup:.2} | {:.2}× |",
                fp8.latent.kind, bf16.latent.median_ms, fp8.latent.median_ms, fp8.speedup_vs_dense
            );
            out.attention.push(serde_json::json!({
                "shape": label, "ranks": ranks, "bf16": bf16, "fp8": fp8,
                "speedup_vs_bf16": speedup,
            }));
        }
        for tokens in [16usize, 8192] {
            let bf16 = bench_latent_write_in(
                gpu,
                dims,
                ranks,
                shape.hidden_size,
                tokens,
                CacheDtype::BF16,
            )?;
            let fp8 = bench_latent_write_in(
                gpu,
                dims,
                ranks,
                shape.hidden_size,
                tokens,
                CacheDtype::Fp8,
            )?;
            println!(
                "| write | {label} | | {tokens} | | {:.4} | {:.4} | {:.2} | |",
                bf16.latent_ms,
                fp8.latent_ms,
                bf16.latent_ms / fp8.latent_ms
            );
            out.writes.push(
                serde_json::json!({ "shape": label, "ranks": ranks, "bf16": bf16, "fp8": fp8 }),
            );
        }
    }
    Ok(out)
}

/// Runs `starling bench decode`.
pub fn decode(args: DecodeArgs) -> Result<()> {
    if args.steps == 0 {
        bail!("--steps must be at least 1");
    }
    let gpu = gpu()?;
    let copy_tb_s = copy_bandwidth_tb_s(&gpu, 4 << 30)?;
    println!(
        "device {}; copy bandwidth {copy_tb_s:.2} TB/s (read + write)",
        gpu.name()
    );
    println!(
        "| model | batch | context | eager ms | graph ms | graph tokens/s | roofline ms | eager % of roofline | graph % of roofline |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    let mut rows = Vec::new();
    for name in &args.models {
        let config = preset(name)?;
        let started = Instant::now();
        let model = LlamaModel::synthetic(&gpu, &config, 1)?;
        gpu.synchronize()?;
        let build_ms = started.elapsed().as_secs_f64() * 1e3;
        let embed_bytes = (config.vocab_size * config.hidden_size * 2) as u64;
        // Every weight is read once per step, except the embedding table when it is not also the
        // LM head (only the batch's rows are gathered).
        let weight_bytes = config.num_params() * 2
            - if config.tie_word_embeddings {
                0
            } else {
                embed_bytes
            };
        let kv_bytes_per_token = config.kv_bytes_per_token(2) as u64;
        for &ctx in &args.contexts {
            for &batch in &args.batch_sizes {
                let kv_total = kv_bytes_per_token * (batch * (ctx + 1)) as u64;
                if kv_total > args.kv_budget {
                    println!(
                        "| {name} | {batch} | {ctx} | skipped: KV {:.0} GB > budget | | | | | |",
                        kv_total as f64 / 1e9
                    );
                    continue;
                }
                let block_size = 16;
                // One new token per sequence after `ctx` cached ones.
                let mut meta = attention_meta(batch, ctx + 1, 1, block_size);
                // A hybrid model's windowed layers read tables of their own (every slot kept
                // here: the kernels read only the window).
                let groups = model.cache_groups().num_groups();
                let blocks_per_group = batch * (ctx + 1).div_ceil(block_size);
                meta.replicate_groups(groups, blocks_per_group);
                let num_blocks = groups * blocks_per_group;
                let mut caches = model.alloc_kv_caches(&gpu, num_blocks, block_size)?;
                for (l, c) in caches.iter_mut().enumerate() {
                    fill_cache(&gpu, c, l as u64)?;
                }
                let ids: Vec<u32> = (0..batch as u32)
                    .map(|i| (i * 7919) % config.vocab_size as u32)
                    .collect();
                // Greedy rows sampled where the logits are, as the engine's decode steps do.
                let greedy: Vec<RowSamplingParams> = (0..batch as u32)
                    .map(|row| RowSamplingParams {
                        row,
                        filter: TokenFilter {
                            temperature: 0.0,
                            top_k: None,
                            top_p: 1.0,
                            min_p: 0.0,
                        },
                        uniform: 0.0,
                    })
                    .collect();
                let mut times = Vec::with_capacity(args.steps);
                for i in 0..args.steps + 3 {
                    let t = Instant::now();
                    let prepared = gpu.prepare_batch(&meta, num_blocks)?;
                    let options = ForwardOptions::default();
                    let logits = model
                        .forward(&gpu, &ids, &meta, &prepared, &mut caches, options)
                        .map_err(|e| anyhow::anyhow!("eager step: {e}"))?
                        .into_device()
                        .ok_or_else(|| anyhow::anyhow!("eager step: no logits rows"))?;
                    let tokens = gpu.sample_rows(&logits, &greedy)?;
                    std::hint::black_box(&tokens);
                    if i >= 3 {
                        times.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                let step_ms = median(&mut times);
                // The same step replayed from a CUDA graph (recorded during the warm-up steps).
                let graph_config = DecodeGraphConfig {
                    max_num_seqs: batch,
                    max_model_len_tokens: ctx + 1,
                    block_size_tokens: block_size,
                    num_cache_blocks: num_blocks,
                    query_heads_per_kv_head: config.num_attention_heads / config.num_kv_heads,
                    num_kv_heads: config.num_kv_heads,
                    head_dim: config.head_dim,
                };
                let mut graphs = gpu
                    .decode_graphs(&graph_config)?
                    .context("the CUDA backend offers no decode graphs")?;
                let mut forward = model.device_forward();
                let mut graph_times = Vec::with_capacity(args.steps);
                for i in 0..args.steps + 3 {
                    let t = Instant::now();
                    let step = DecodeStep {
                        token_ids: &ids,
                        meta: &meta,
                    };
                    let logits = graphs
                        .run(&gpu, step, &mut caches, forward.as_mut())?
                        .context("the decode step was not replayed")?;
                    let tokens = gpu.sample_rows(&logits, &greedy)?;
                    std::hint::black_box(&tokens);
                    if i >= 3 {
                        graph_times.push(t.elapsed().as_secs_f64() * 1e3);
                    }
                }
                let graph_ms = median(&mut graph_times);
                let kv_read = kv_bytes_per_token * (batch * (ctx + 1)) as u64;
                let roofline_ms = (weight_bytes + kv_read) as f64 / (copy_tb_s * 1e12) * 1e3;
                println!(
                    "| {name} | {batch} | {ctx} | {step_ms:.3} | {graph_ms:.3} | {:.0} | {roofline_ms:.3} | {:.0}% | {:.0}% |",
                    batch as f64 / (graph_ms * 1e-3),
                    100.0 * roofline_ms / step_ms,
                    100.0 * roofline_ms / graph_ms
                );
                rows.push(serde_json::json!({
                    "model": name, "batch": batch, "context_tokens": ctx,
                    "step_ms": step_ms, "tokens_per_s": batch as f64 / (step_ms * 1e-3),
                    "graph_step_ms": graph_ms,
                    "graph_tokens_per_s": batch as f64 / (graph_ms * 1e-3),
                    "weight_bytes": weight_bytes, "kv_bytes_read": kv_read,
                    "roofline_ms": roofline_ms, "fraction_of_roofline": roofline_ms / step_ms,
                    "graph_fraction_of_roofline": roofline_ms / graph_ms,
                    "model_build_ms": build_ms,
                }));
            }
        }
    }
    write_json(
        &args.output,
        serde_json::json!({
            "bench": "decode",
            "device": gpu.name(),
            "copy_tb_s": copy_tb_s,
            "note": "eager step = prepare_batch + forward + f32 logits to host; graph step = one input copy + CUDA graph replay + the same logits copy; synthetic bf16 weights",
            "rows": rows,
        }),
    )
}

/// The median of timings (sorted in place).
fn median(times: &mut [f64]) -> f64 {
    times.sort_by(f64::total_cmp);
    times[times.len() / 2]
}
