//! The cumulative Prometheus histogram of `/metrics` and the bucket bounds of its series.

use std::fmt::Write as _;

/// vLLM's bucket bounds for time to first token, seconds.
pub(super) const TTFT_BUCKETS_S: &[f64] = &[
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];
/// vLLM's bucket bounds for inter-token latency, seconds.
pub(super) const ITL_BUCKETS_S: &[f64] = &[
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
];
/// vLLM's bucket bounds for end-to-end request latency, seconds.
pub(super) const E2E_BUCKETS_S: &[f64] = &[
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0, 1920.0, 7680.0,
];

/// vLLM's bucket bounds for `vllm:iteration_tokens_total`, tokens per engine step.
pub(super) const ITERATION_TOKENS_BUCKETS: &[f64] = &[
    1.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 2048.0, 4096.0, 8192.0, 16384.0,
];
/// Bucket bounds for `starling:decode_batch_sequences`: powers of two, as the CUDA-graph buckets.
pub(super) const DECODE_BATCH_BUCKETS: &[f64] =
    &[1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0];

/// A cumulative Prometheus histogram.
#[derive(Debug, Clone)]
pub struct Histogram {
    bounds: &'static [f64],
    /// Observations per bucket (not cumulative; the last entry is +Inf).
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    pub(super) fn new(bounds: &'static [f64]) -> Self {
        Histogram {
            bounds,
            counts: vec![0; bounds.len() + 1],
            sum: 0.0,
            count: 0,
        }
    }

    /// Adds one observation.
    pub fn observe(&mut self, value: f64) {
        let bucket = self
            .bounds
            .iter()
            .position(|&b| value <= b)
            .unwrap_or(self.bounds.len());
        self.counts[bucket] += 1;
        self.sum += value;
        self.count += 1;
    }

    /// Observations so far.
    pub fn count(&self) -> u64 {
        self.count
    }

    pub(super) fn render(&self, out: &mut String, name: &str, help: &str, labels: &str) {
        let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} histogram");
        let mut cumulative = 0;
        for (i, count) in self.counts.iter().enumerate() {
            cumulative += count;
            let le = self
                .bounds
                .get(i)
                .map_or_else(|| "+Inf".to_owned(), |b| b.to_string());
            let _ = writeln!(out, "{name}_bucket{{{labels},le=\"{le}\"}} {cumulative}");
        }
        let _ = writeln!(out, "{name}_sum{{{labels}}} {}", self.sum);
        let _ = writeln!(out, "{name}_count{{{labels}}} {}", self.count);
    }
}
