//! Server-side figures from Prometheus `/metrics`: read before and after a run, and sampled
//! during it for the KV peak.

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use serde::Serialize;

use crate::client::StreamClient;
use crate::error::BenchError;

/// Metric values by name, summed over label sets.
pub type MetricValues = HashMap<String, f64>;

/// Parses the Prometheus text format (comments skipped, labels summed over).
pub fn parse_prometheus(text: &str) -> MetricValues {
    let mut values = MetricValues::new();
    for line in text
        .lines()
        .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
    {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let name = series.split('{').next().unwrap_or(series).trim();
        *values.entry(name.to_owned()).or_insert(0.0) += value;
    }
    values
}

/// Scheduler figures of one run, from counter deltas and the sampled KV peak.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize)]
pub struct ServerFigures {
    /// Sequences per decode step, averaged over the run's decode steps.
    pub mean_decode_batch: f64,
    /// Share of the run's decode steps that decoded one sequence.
    pub batch1_step_share: f64,
    /// Decode steps in the run.
    pub decode_steps: f64,
    /// Most KV blocks held during the run.
    pub peak_kv_blocks: f64,
    /// KV blocks in the pool.
    pub kv_blocks_total: f64,
    /// Peak occupancy in percent.
    pub peak_kv_usage_pct: f64,
    /// Preemptions during the run.
    pub preemptions: f64,
    /// Mean number of running requests over the samples taken while requests were waiting:
    /// how many requests the cache holds at once when demand exceeds it (the capacity figure
    /// token eviction is meant to raise). 0 when the server never queued.
    pub saturated_running_mean: f64,
    /// Most requests running at once among the samples.
    pub peak_running: f64,
    /// Tokens evicted per layer by KV compression during the run.
    pub kv_evicted_tokens: f64,
    /// KV blocks returned to the pool by eviction during the run.
    pub kv_evicted_blocks: f64,
    /// Seconds the engine spent compacting caches during the run.
    pub kv_compression_s: f64,
    /// Prompt tokens the prefix cache was asked about during the run (vLLM's
    /// `prefix_cache_queries`).
    pub prefix_cache_queries_tokens: f64,
    /// Of those, tokens found cached (`prefix_cache_hits`).
    pub prefix_cache_hits_tokens: f64,
    /// `hits / queries` in percent (0 when nothing was queried: caching off, or another
    /// server).
    pub prefix_cache_hit_rate_pct: f64,
}

/// What polling `/metrics` during a run saw.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Sampled {
    /// Largest `starling:kv_blocks_used`.
    pub peak_kv_blocks: f64,
    /// Largest `vllm:num_requests_running`.
    pub peak_running: f64,
    /// Sum and count of `vllm:num_requests_running` over samples with requests waiting.
    pub saturated_running_sum: f64,
    /// Samples with requests waiting.
    pub saturated_samples: u64,
    /// Largest `vllm:kv_cache_usage_perc` (0–1): the KV peak of a server without Starling's
    /// block gauges.
    pub peak_kv_usage_perc: f64,
}

impl Sampled {
    /// Adds one `/metrics` snapshot.
    pub fn add(&mut self, values: &MetricValues) {
        let running = get(values, "vllm:num_requests_running");
        self.peak_kv_blocks = self
            .peak_kv_blocks
            .max(get(values, "starling:kv_blocks_used"));
        self.peak_running = self.peak_running.max(running);
        self.peak_kv_usage_perc = self
            .peak_kv_usage_perc
            .max(get(values, "vllm:kv_cache_usage_perc"));
        if get(values, "vllm:num_requests_waiting") > 0.0 {
            self.saturated_running_sum += running;
            self.saturated_samples += 1;
        }
    }
}

fn get(values: &MetricValues, name: &str) -> f64 {
    values.get(name).copied().unwrap_or(0.0)
}

/// Figures of a run from the snapshots before and after it, and the largest
/// `starling:kv_blocks_used` sampled during it.
pub fn figures(before: &MetricValues, after: &MetricValues, sampled: Sampled) -> ServerFigures {
    let sampled_peak_blocks = sampled.peak_kv_blocks;
    let delta = |name: &str| get(after, name) - get(before, name);
    let decode_steps = delta("starling:decode_steps_total");
    let ratio = |x: f64| {
        if decode_steps > 0.0 {
            x / decode_steps
        } else {
            0.0
        }
    };
    // The server's all-time maximum is exact when this run raised it; otherwise sampling is
    // the best bound available.
    let max_name = "starling:kv_blocks_used_max";
    let peak_kv_blocks = if get(after, max_name) > get(before, max_name) {
        get(after, max_name)
    } else {
        sampled_peak_blocks
    };
    let kv_blocks_total = get(after, "starling:kv_blocks_total");
    let prefix_queries = delta("vllm:prefix_cache_queries_total");
    let prefix_hits = delta("vllm:prefix_cache_hits_total");
    ServerFigures {
        mean_decode_batch: ratio(delta("starling:decode_batch_size_sum")),
        batch1_step_share: ratio(delta("starling:decode_steps_batch1_total")),
        decode_steps,
        peak_kv_blocks,
        kv_blocks_total,
        peak_kv_usage_pct: if kv_blocks_total > 0.0 {
            100.0 * peak_kv_blocks / kv_blocks_total
        } else {
            // vLLM exports only the usage gauge.
            100.0 * sampled.peak_kv_usage_perc
        },
        preemptions: delta("vllm:num_preemptions_total"),
        saturated_running_mean: if sampled.saturated_samples > 0 {
            sampled.saturated_running_sum / sampled.saturated_samples as f64
        } else {
            0.0
        },
        peak_running: sampled.peak_running,
        kv_evicted_tokens: delta("starling:kv_evicted_tokens_total"),
        kv_evicted_blocks: delta("starling:kv_evicted_blocks_total"),
        kv_compression_s: delta("starling:kv_compression_seconds_total"),
        prefix_cache_queries_tokens: prefix_queries,
        prefix_cache_hits_tokens: prefix_hits,
        prefix_cache_hit_rate_pct: if prefix_queries > 0.0 {
            100.0 * prefix_hits / prefix_queries
        } else {
            0.0
        },
    }
}

/// Reads `/metrics` once.
pub async fn snapshot(client: &StreamClient) -> Result<MetricValues, BenchError> {
    Ok(parse_prometheus(&client.get_text("/metrics").await?))
}

/// Polls `/metrics` every `period` until `stop` is set (see [`Sampled`]).
pub async fn sample_during_run(
    client: StreamClient,
    period: Duration,
    stop: Arc<AtomicBool>,
) -> Sampled {
    let mut sampled = Sampled::default();
    while !stop.load(Ordering::Relaxed) {
        if let Ok(values) = snapshot(&client).await {
            sampled.add(&values);
        }
        tokio::time::sleep(period).await;
    }
    sampled
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_labels_comments_and_sums_series() {
        let text = "# HELP x y\nvllm:request_success_total{finished_reason=\"stop\"} 3\n\
                    vllm:request_success_total{finished_reason=\"length\"} 4\nstarling:kv_blocks_used 7\n";
        let v = parse_prometheus(text);
        assert_eq!(v["vllm:request_success_total"], 7.0);
        assert_eq!(v["starling:kv_blocks_used"], 7.0);
    }

    #[test]
    fn figures_use_counter_deltas_and_the_best_peak() {
        let before: MetricValues = [
            ("starling:decode_steps_total", 10.0),
            ("starling:decode_batch_size_sum", 10.0),
            ("starling:decode_steps_batch1_total", 10.0),
            ("starling:kv_blocks_used_max", 50.0),
            ("vllm:num_preemptions_total", 1.0),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let mut after = before.clone();
        after.insert("starling:decode_steps_total".into(), 20.0);
        after.insert("starling:decode_batch_size_sum".into(), 50.0);
        after.insert("starling:decode_steps_batch1_total".into(), 12.0);
        after.insert("starling:kv_blocks_total".into(), 100.0);
        after.insert("vllm:num_preemptions_total".into(), 4.0);
        let sampled = |peak_kv_blocks| Sampled {
            peak_kv_blocks,
            ..Sampled::default()
        };
        let f = figures(&before, &after, sampled(30.0));
        assert_eq!(f.mean_decode_batch, 4.0);
        assert_eq!(f.batch1_step_share, 0.2);
        assert_eq!(f.peak_kv_blocks, 30.0, "the old maximum is not this run's");
        assert_eq!(f.peak_kv_usage_pct, 30.0);
        assert_eq!(f.preemptions, 3.0);
        after.insert("starling:kv_blocks_used_max".into(), 80.0);
        assert_eq!(figures(&before, &after, sampled(30.0)).peak_kv_blocks, 80.0);
        assert_eq!(f.saturated_running_mean, 0.0, "never queued");
        assert_eq!(f.prefix_cache_hit_rate_pct, 0.0, "nothing queried");
        after.insert("vllm:prefix_cache_queries_total".into(), 400.0);
        after.insert("vllm:prefix_cache_hits_total".into(), 300.0);
        let f = figures(&before, &after, sampled(30.0));
        assert_eq!(f.prefix_cache_hits_tokens, 300.0);
        assert_eq!(f.prefix_cache_hit_rate_pct, 75.0);
    }

    #[test]
    fn saturated_concurrency_counts_only_samples_with_a_queue() {
        let mut s = Sampled::default();
        for (running, waiting, blocks) in [(4.0, 0.0, 10.0), (6.0, 3.0, 40.0), (8.0, 1.0, 30.0)] {
            let values: MetricValues = [
                ("vllm:num_requests_running", running),
                ("vllm:num_requests_waiting", waiting),
                ("starling:kv_blocks_used", blocks),
            ]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v))
            .collect();
            s.add(&values);
        }
        let f = figures(&MetricValues::new(), &MetricValues::new(), s);
        assert_eq!(f.saturated_running_mean, 7.0);
        assert_eq!(f.peak_running, 8.0);
        assert_eq!(f.peak_kv_blocks, 40.0);
    }

    #[test]
    fn a_server_without_block_gauges_reports_its_sampled_usage_gauge() {
        let mut s = Sampled::default();
        for usage in [0.25, 0.75, 0.5] {
            let values: MetricValues = [("vllm:kv_cache_usage_perc".to_owned(), usage)]
                .into_iter()
                .collect();
            s.add(&values);
        }
        let f = figures(&MetricValues::new(), &MetricValues::new(), s);
        assert_eq!(f.peak_kv_usage_pct, 75.0);
        assert_eq!(f.kv_blocks_total, 0.0);
    }
}
