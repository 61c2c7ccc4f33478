//! vLLM `benchmark_serving` metrics from per-request results.

use serde::Serialize;

use crate::client::RequestResult;

/// Mean, median and 99th percentile of a latency, milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct LatencySummary {
    /// Mean, ms.
    pub mean_ms: f64,
    /// Median, ms.
    pub median_ms: f64,
    /// 99th percentile (linear interpolation, as numpy), ms.
    pub p99_ms: f64,
}

impl LatencySummary {
    /// Summary of `values_s` (seconds); all zero when empty, as vLLM reports.
    pub fn of_seconds(values_s: &[f64]) -> Self {
        if values_s.is_empty() {
            return LatencySummary::default();
        }
        let mut sorted: Vec<f64> = values_s.iter().map(|v| v * 1e3).collect();
        sorted.sort_by(f64::total_cmp);
        LatencySummary {
            mean_ms: sorted.iter().sum::<f64>() / sorted.len() as f64,
            median_ms: percentile(&sorted, 50.0),
            p99_ms: percentile(&sorted, 99.0),
        }
    }
}

/// numpy's default (linear) percentile of sorted values.
pub fn percentile(sorted: &[f64], pct: f64) -> f64 {
    match sorted.len() {
        0 => 0.0,
        1 => sorted[0],
        n => {
            let rank = pct / 100.0 * (n - 1) as f64;
            let low = rank.floor() as usize;
            let high = rank.ceil() as usize;
            sorted[low] + (sorted[high] - sorted[low]) * (rank - low as f64)
        }
    }
}

/// The figures vLLM's serving benchmark prints.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct BenchmarkMetrics {
    /// Requests that succeeded.
    pub completed: usize,
    /// Requests that failed.
    pub failed: usize,
    /// Wall time of the run, seconds.
    pub duration_s: f64,
    /// Prompt tokens of the successful requests.
    pub total_input_tokens: usize,
    /// Generated tokens of the successful requests.
    pub total_output_tokens: usize,
    /// Completed requests per second.
    pub request_throughput: f64,
    /// Generated tokens per second.
    pub output_throughput: f64,
    /// Prompt plus generated tokens per second.
    pub total_token_throughput: f64,
    /// Time to first token.
    pub ttft: LatencySummary,
    /// Time per output token after the first, per request.
    pub tpot: LatencySummary,
    /// Gaps between consecutive chunks, all requests pooled.
    pub itl: LatencySummary,
    /// End-to-end latency.
    pub e2el: LatencySummary,
}

/// vLLM's `calculate_metrics`.
pub fn compute_metrics(results: &[RequestResult], duration_s: f64) -> BenchmarkMetrics {
    let ok: Vec<&RequestResult> = results.iter().filter(|r| r.success).collect();
    let total_input_tokens: usize = ok.iter().map(|r| r.prompt_len_tokens).sum();
    let total_output_tokens: usize = ok.iter().map(|r| r.output_tokens).sum();
    let ttfts: Vec<f64> = ok.iter().map(|r| r.ttft_s).collect();
    let tpots: Vec<f64> = ok
        .iter()
        .filter(|r| r.output_tokens > 1)
        .map(|r| (r.latency_s - r.ttft_s) / (r.output_tokens - 1) as f64)
        .collect();
    let itls: Vec<f64> = ok.iter().flat_map(|r| r.itl_s.iter().copied()).collect();
    let e2els: Vec<f64> = ok.iter().map(|r| r.latency_s).collect();
    let per_s = |count: f64| {
        if duration_s > 0.0 {
            count / duration_s
        } else {
            0.0
        }
    };
    BenchmarkMetrics {
        completed: ok.len(),
        failed: results.len() - ok.len(),
        duration_s,
        total_input_tokens,
        total_output_tokens,
        request_throughput: per_s(ok.len() as f64),
        output_throughput: per_s(total_output_tokens as f64),
        total_token_throughput: per_s((total_input_tokens + total_output_tokens) as f64),
        ttft: LatencySummary::of_seconds(&ttfts),
        tpot: LatencySummary::of_seconds(&tpots),
        itl: LatencySummary::of_seconds(&itls),
        e2el: LatencySummary::of_seconds(&e2els),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles_interpolate_like_numpy() {
        let v = [1.0, 2.0, 3.0, 4.0];
        assert_eq!(percentile(&v, 50.0), 2.5);
        assert!((percentile(&v, 99.0) - 3.97).abs() < 1e-12);
        assert_eq!(percentile(&[5.0], 99.0), 5.0);
    }

    #[test]
    fn metrics_follow_vllm_definitions() {
        let ok = RequestResult {
            success: true,
            error: None,
            prompt_len_tokens: 10,
            output_tokens: 5,
            ttft_s: 0.2,
            itl_s: vec![0.1, 0.1, 0.1, 0.1],
            latency_s: 0.6,
        };
        let single = RequestResult {
            output_tokens: 1,
            itl_s: vec![],
            latency_s: 0.3,
            ttft_s: 0.3,
            ..ok.clone()
        };
        let failed = RequestResult {
            success: false,
            ..RequestResult::default()
        };
        let m = compute_metrics(&[ok, single, failed], 2.0);
        assert_eq!((m.completed, m.failed), (2, 1));
        assert_eq!((m.total_input_tokens, m.total_output_tokens), (20, 6));
        assert_eq!(m.request_throughput, 1.0);
        assert_eq!(m.output_throughput, 3.0);
        assert_eq!(m.total_token_throughput, 13.0);
        // TPOT only for requests with more than one token: (0.6 - 0.2) / 4 = 100 ms.
        assert!((m.tpot.mean_ms - 100.0).abs() < 1e-9);
        assert!((m.ttft.mean_ms - 250.0).abs() < 1e-9);
        assert!((m.itl.median_ms - 100.0).abs() < 1e-9);
        assert!((m.e2el.mean_ms - 450.0).abs() < 1e-9);
    }
}
