//! JSON and markdown reports of one run and of a concurrency sweep.

use std::fmt::Write as _;

use serde::Serialize;

use crate::kernel_profile::{self, KernelProfileRow};
use crate::server_metrics::ServerFigures;
use crate::stats::{BenchmarkMetrics, LatencySummary};

/// Everything one run reports (the `--output-json` document).
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    /// Server URL.
    pub base_url: String,
    /// Model name sent.
    pub model: String,
    /// Dataset description (`random`, `sharegpt` or the file).
    pub dataset: String,
    /// Requests sent.
    pub num_prompts: usize,
    /// In-flight cap, if any.
    pub max_concurrency: Option<usize>,
    /// Poisson rate, if any (requests/s).
    pub request_rate: Option<f64>,
    /// Arrival and dataset seed.
    pub seed: u64,
    /// Client-side metrics.
    pub metrics: BenchmarkMetrics,
    /// Server-side figures.
    pub server: ServerFigures,
    /// Device time per launch site (only from a server started with `--kernel-profile`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_profile: Vec<KernelProfileRow>,
}

/// One row of a concurrency sweep.
#[derive(Debug, Clone, Serialize)]
pub struct SweepRow {
    /// The `--max-concurrency` of the run.
    pub concurrency: usize,
    /// Client-side metrics.
    pub metrics: BenchmarkMetrics,
    /// Server-side figures.
    pub server: ServerFigures,
    /// Device time per launch site (only from a server started with `--kernel-profile`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_profile: Vec<KernelProfileRow>,
}

fn latency_line(out: &mut String, name: &str, s: &LatencySummary) {
    let _ = writeln!(
        out,
        "| {name} mean / median / p99 (ms) | {:.2} / {:.2} / {:.2} |",
        s.mean_ms, s.median_ms, s.p99_ms
    );
}

/// The run as a markdown table.
pub fn markdown(report: &BenchReport) -> String {
    let m = &report.metrics;
    let s = &report.server;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "## Serving benchmark: {} on {}\n\ndataset {}, {} prompts, {}, seed {}\n",
        report.model,
        report.base_url,
        report.dataset,
        report.num_prompts,
        match (report.max_concurrency, report.request_rate) {
            (_, Some(rate)) => format!("request rate {rate}/s"),
            (Some(c), None) => format!("max concurrency {c}"),
            (None, None) => "unbounded".to_owned(),
        },
        report.seed
    );
    let _ = writeln!(out, "| metric | value |\n|---|---:|");
    let _ = writeln!(
        out,
        "| successful / failed requests | {} / {} |",
        m.completed, m.failed
    );
    let _ = writeln!(out, "| duration (s) | {:.2} |", m.duration_s);
    let _ = writeln!(
        out,
        "| input / output tokens | {} / {} |",
        m.total_input_tokens, m.total_output_tokens
    );
    let _ = writeln!(
        out,
        "| request throughput (req/s) | {:.3} |",
        m.request_throughput
    );
    let _ = writeln!(
        out,
        "| output token throughput (tok/s) | {:.2} |",
        m.output_throughput
    );
    let _ = writeln!(
        out,
        "| total token throughput (tok/s) | {:.2} |",
        m.total_token_throughput
    );
    latency_line(&mut out, "TTFT", &m.ttft);
    latency_line(&mut out, "TPOT", &m.tpot);
    latency_line(&mut out, "ITL", &m.itl);
    latency_line(&mut out, "E2EL", &m.e2el);
    if s.prefix_cache_queries_tokens > 0.0 {
        let _ = writeln!(
            out,
            "| prefix cache hit rate (tokens) | {:.1}% ({} of {}) |",
            s.prefix_cache_hit_rate_pct, s.prefix_cache_hits_tokens, s.prefix_cache_queries_tokens
        );
    }
    let _ = writeln!(out, "| mean decode batch | {:.2} |", s.mean_decode_batch);
    let _ = writeln!(
        out,
        "| decode steps at batch 1 | {:.1}% |",
        100.0 * s.batch1_step_share
    );
    let _ = writeln!(
        out,
        "| peak KV blocks | {} of {} ({:.1}%) |",
        s.peak_kv_blocks, s.kv_blocks_total, s.peak_kv_usage_pct
    );
    let _ = writeln!(out, "| preemptions | {} |", s.preemptions);
    let _ = writeln!(
        out,
        "| running while queued: mean / peak running | {:.2} / {} |",
        s.saturated_running_mean, s.peak_running
    );
    let _ = writeln!(
        out,
        "| KV evicted: tokens per layer / blocks | {} / {} |",
        s.kv_evicted_tokens, s.kv_evicted_blocks
    );
    let _ = writeln!(
        out,
        "| engine time compacting caches (s) | {:.3} |",
        s.kv_compression_s
    );
    out.push_str(&kernel_profile::markdown(
        &report.kernel_profile,
        m.duration_s,
    ));
    out
}

/// A sweep as one markdown table, one row per concurrency.
pub fn sweep_markdown(rows: &[SweepRow]) -> String {
    let mut out = String::from(
        "| concurrency | req/s | output tok/s | total tok/s | TTFT median / p99 ms | TPOT median / p99 ms | ITL median ms | E2EL median ms | mean decode batch | batch-1 steps | peak KV | preemptions | failed |\n\
         |---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for row in rows {
        let (m, s) = (&row.metrics, &row.server);
        let _ = writeln!(
            out,
            "| {} | {:.3} | {:.1} | {:.1} | {:.1} / {:.1} | {:.1} / {:.1} | {:.1} | {:.1} | {:.2} | {:.1}% | {:.1}% | {} | {} |",
            row.concurrency,
            m.request_throughput,
            m.output_throughput,
            m.total_token_throughput,
            m.ttft.median_ms,
            m.ttft.p99_ms,
            m.tpot.median_ms,
            m.tpot.p99_ms,
            m.itl.median_ms,
            m.e2el.median_ms,
            s.mean_decode_batch,
            100.0 * s.batch1_step_share,
            s.peak_kv_usage_pct,
            s.preemptions,
            m.failed
        );
    }
    for row in rows.iter().filter(|r| !r.kernel_profile.is_empty()) {
        let _ = write!(out, "\n#### Concurrency {}\n", row.concurrency);
        out.push_str(&kernel_profile::markdown(
            &row.kernel_profile,
            row.metrics.duration_s,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn markdown_tables_have_one_row_per_figure_and_per_run() {
        let report = BenchReport {
            base_url: "http://x".into(),
            model: "m".into(),
            dataset: "random".into(),
            num_prompts: 3,
            max_concurrency: Some(2),
            request_rate: None,
            seed: 0,
            metrics: BenchmarkMetrics {
                completed: 3,
                output_throughput: 12.5,
                ..BenchmarkMetrics::default()
            },
            server: ServerFigures::default(),
            kernel_profile: Vec::new(),
        };
        let text = markdown(&report);
        assert!(
            text.contains("| output token throughput (tok/s) | 12.50 |"),
            "{text}"
        );
        assert!(text.contains("max concurrency 2"));
        let rows = vec![
            SweepRow {
                concurrency: 1,
                metrics: report.metrics.clone(),
                server: report.server,
                kernel_profile: Vec::new(),
            },
            SweepRow {
                concurrency: 4,
                metrics: report.metrics.clone(),
                server: report.server,
                kernel_profile: Vec::new(),
            },
        ];
        let table = sweep_markdown(&rows);
        assert_eq!(table.lines().count(), 4, "{table}");
        assert!(table.lines().nth(3).unwrap().starts_with("| 4 |"));
    }
}
