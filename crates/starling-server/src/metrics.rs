//! Prometheus metrics with vLLM's names (plus `starling:` ones for figures vLLM lacks).
//!
//! The engine thread is the only writer: it records per-request latencies and per-step scheduler
//! figures; `/metrics` renders a snapshot under the same lock.

use std::fmt::Write as _;
use std::sync::{Mutex, MutexGuard};

use starling_backend::KernelSiteTime;
use starling_engine::scheduler::StepStats;
use starling_engine::{CacheReport, EngineStats};

mod histogram;
mod kernel_profile;

pub use histogram::Histogram;
use histogram::{
    DECODE_BATCH_BUCKETS, E2E_BUCKETS_S, ITERATION_TOKENS_BUCKETS, ITL_BUCKETS_S, TTFT_BUCKETS_S,
};

/// Everything `/metrics` reports.
#[derive(Debug, Clone)]
pub struct MetricsState {
    /// The engine's last load snapshot.
    pub stats: Option<EngineStats>,
    /// Prompt tokens of admitted requests.
    pub prompt_tokens_total: u64,
    /// Requests finished, by reason: stop, length, abort.
    pub finished_stop: u64,
    /// Requests that hit their length limit.
    pub finished_length: u64,
    /// Requests aborted (client gone, shutdown, a failed step).
    pub finished_abort: u64,
    /// Requests the engine ended with an error of their own (NaN logits, a failed compaction).
    pub finished_error: u64,
    /// Of those, requests ended by NaN or +inf logits.
    pub non_finite_requests_total: u64,
    /// Set (to the run of failures) while every recent request has failed on non-finite
    /// logits: the model, not a prompt, is at fault; `/health` answers 503 meanwhile.
    pub model_output_non_finite: Option<u64>,
    /// Requests refused by the engine at admission.
    pub rejected_total: u64,
    /// Steps that decoded at least one sequence.
    pub decode_steps_total: u64,
    /// Of those, steps that decoded exactly one sequence.
    pub decode_steps_batch1_total: u64,
    /// Sum of decoding sequences over decode steps (mean decode batch = this / decode steps).
    pub decode_batch_size_sum: u64,
    /// Highest number of KV blocks held after any step.
    pub kv_blocks_used_max: usize,
    /// Time to first token, seconds.
    pub ttft_s: Histogram,
    /// Time between consecutive tokens of a request, seconds.
    pub itl_s: Histogram,
    /// Arrival to last token, seconds.
    pub e2e_s: Histogram,
    /// Wall time of each engine step (schedule, forward, sampling, compression), seconds: the
    /// server's own step cost, to set against the TPOT clients see.
    pub step_s: Histogram,
    /// Tokens each step computed (prefill and decode), vLLM's `iteration_tokens_total`.
    pub iteration_tokens: Histogram,
    /// Sequences each decode step decoded (steps without a decode row are not observed).
    pub decode_batch_size: Histogram,
    /// The server-wide token-eviction policy, as JSON.
    pub kv_compression: Option<serde_json::Value>,
    /// What the KV cache is (layout, bytes per token, blocks, longest context).
    pub kv_cache: Option<CacheReport>,
    /// Device time per launch site while a kernel profile runs (`serve --kernel-profile`).
    pub kernel_profile: Vec<KernelSiteTime>,
}

impl Default for MetricsState {
    fn default() -> Self {
        MetricsState {
            stats: None,
            prompt_tokens_total: 0,
            finished_stop: 0,
            finished_length: 0,
            finished_abort: 0,
            finished_error: 0,
            non_finite_requests_total: 0,
            model_output_non_finite: None,
            rejected_total: 0,
            decode_steps_total: 0,
            decode_steps_batch1_total: 0,
            decode_batch_size_sum: 0,
            kv_blocks_used_max: 0,
            ttft_s: Histogram::new(TTFT_BUCKETS_S),
            itl_s: Histogram::new(ITL_BUCKETS_S),
            e2e_s: Histogram::new(E2E_BUCKETS_S),
            step_s: Histogram::new(ITL_BUCKETS_S),
            iteration_tokens: Histogram::new(ITERATION_TOKENS_BUCKETS),
            decode_batch_size: Histogram::new(DECODE_BATCH_BUCKETS),
            kv_compression: None,
            kv_cache: None,
            kernel_profile: Vec::new(),
        }
    }
}

/// Shared metrics; cheap to lock (the engine thread holds it for microseconds per step).
#[derive(Debug, Default)]
pub struct Metrics {
    state: Mutex<MetricsState>,
}

impl Metrics {
    /// Locks the state for an update or a read. A panic elsewhere while holding the lock
    /// leaves plain counters behind, which are still worth reporting.
    pub fn lock(&self) -> MutexGuard<'_, MetricsState> {
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records the engine's state after a step (`step` is `None` when nothing ran).
    pub fn record_step(&self, stats: EngineStats, step: Option<StepStats>) {
        let mut state = self.lock();
        if let Some(step) = step {
            if step.num_decode_tokens > 0 {
                state.decode_steps_total += 1;
                state.decode_batch_size_sum += step.num_decode_tokens as u64;
                if step.num_decode_tokens == 1 {
                    state.decode_steps_batch1_total += 1;
                }
                state
                    .decode_batch_size
                    .observe(step.num_decode_tokens as f64);
            }
            if step.num_scheduled_tokens > 0 {
                state
                    .iteration_tokens
                    .observe(step.num_scheduled_tokens as f64);
            }
            state.kv_blocks_used_max = state.kv_blocks_used_max.max(step.num_blocks_in_use);
        }
        state.stats = Some(stats);
    }

    /// Renders the Prometheus text exposition; `model_name` labels the vLLM series.
    pub fn render(&self, model_name: &str) -> String {
        let state = self.lock().clone();
        render_state(&state, model_name)
    }
}

fn render_state(state: &MetricsState, model_name: &str) -> String {
    let labels = format!("model_name=\"{}\"", escape_label(model_name));
    let mut out = String::with_capacity(8192);
    let stats = state.stats;
    let running = stats.map_or(0, |s| s.num_running);
    let waiting = stats.map_or(0, |s| s.num_waiting);
    let total = stats.map_or(0, |s| s.kv_blocks_total);
    let free = stats.map_or(0, |s| s.kv_blocks_free);
    let used = total.saturating_sub(free);
    let usage = if total == 0 {
        0.0
    } else {
        used as f64 / total as f64
    };
    let counters = stats.map(|s| s.counters).unwrap_or_default();
    let mut metric = |name: &str, kind: &str, help: &str, value: String, labels: &str| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name}{{{labels}}} {value}"
        );
    };
    metric(
        "vllm:num_requests_running",
        "gauge",
        "Requests being computed.",
        running.to_string(),
        &labels,
    );
    metric(
        "vllm:num_requests_waiting",
        "gauge",
        "Requests queued (new or preempted).",
        waiting.to_string(),
        &labels,
    );
    metric(
        "vllm:kv_cache_usage_perc",
        "gauge",
        "KV-cache usage; 1 means 100 percent.",
        usage.to_string(),
        &labels,
    );
    metric(
        "vllm:num_preemptions_total",
        "counter",
        "Preemptions so far.",
        stats.map_or(0, |s| s.num_preemptions).to_string(),
        &labels,
    );
    metric(
        "vllm:prompt_tokens_total",
        "counter",
        "Prompt tokens of admitted requests.",
        state.prompt_tokens_total.to_string(),
        &labels,
    );
    metric(
        "vllm:generation_tokens_total",
        "counter",
        "Generated tokens.",
        counters.generation_tokens.to_string(),
        &labels,
    );
    let prefix = stats.map(|s| s.prefix_cache).unwrap_or_default();
    metric(
        "vllm:prefix_cache_queries_total",
        "counter",
        "Prefix-cache queries, in tokens: the tokens each admitted request knew.",
        prefix.queries_tokens.to_string(),
        &labels,
    );
    metric(
        "vllm:prefix_cache_hits_total",
        "counter",
        "Prefix-cache hits, in tokens: queried tokens found cached (not computed).",
        prefix.hits_tokens.to_string(),
        &labels,
    );
    let _ = writeln!(
        out,
        "# HELP vllm:request_success_total Finished requests, by finish reason.\n# TYPE vllm:request_success_total counter"
    );
    for (reason, count) in [
        ("stop", state.finished_stop),
        ("length", state.finished_length),
        ("abort", state.finished_abort),
        ("error", state.finished_error),
    ] {
        let _ = writeln!(
            out,
            "vllm:request_success_total{{{labels},finished_reason=\"{reason}\"}} {count}"
        );
    }
    let mut metric = |name: &str, kind: &str, help: &str, value: String| {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} {kind}\n{name} {value}"
        );
    };
    metric(
        "starling:kv_blocks_used",
        "gauge",
        "KV blocks held.",
        used.to_string(),
    );
    metric(
        "starling:kv_blocks_free",
        "gauge",
        "KV blocks free.",
        free.to_string(),
    );
    metric(
        "starling:kv_blocks_total",
        "gauge",
        "KV blocks in the pool.",
        total.to_string(),
    );
    metric(
        "starling:kv_blocks_used_max",
        "gauge",
        "Most KV blocks held after any step since start.",
        state.kv_blocks_used_max.to_string(),
    );
    metric(
        "starling:prefix_caching_enabled",
        "gauge",
        "1 when automatic prefix caching is on (--enable-prefix-caching, the default).",
        u8::from(prefix.enabled).to_string(),
    );
    metric(
        "starling:prefix_cache_queries_requests_total",
        "counter",
        "Requests (and recomputes after preemption) admitted through the prefix cache.",
        prefix.queries_requests.to_string(),
    );
    metric(
        "starling:prefix_cache_hit_blocks_total",
        "counter",
        "KV blocks reused from the prefix cache.",
        prefix.hits_blocks.to_string(),
    );
    metric(
        "starling:prefix_cache_evicted_blocks_total",
        "counter",
        "Cached free KV blocks evicted from the prefix cache to serve an allocation.",
        prefix.evicted_blocks.to_string(),
    );
    metric(
        "starling:prefix_cache_blocks",
        "gauge",
        "KV blocks registered in the prefix cache (free or held).",
        prefix.cached_blocks.to_string(),
    );
    metric(
        "starling:steps_total",
        "counter",
        "Engine steps run.",
        counters.steps.to_string(),
    );
    metric(
        "starling:prefill_tokens_total",
        "counter",
        "Prompt and recomputed tokens run through the model.",
        counters.prefill_tokens.to_string(),
    );
    metric(
        "starling:decode_steps_total",
        "counter",
        "Steps that decoded at least one sequence.",
        state.decode_steps_total.to_string(),
    );
    metric(
        "starling:decode_steps_batch1_total",
        "counter",
        "Steps that decoded exactly one sequence.",
        state.decode_steps_batch1_total.to_string(),
    );
    metric("starling:decode_batch_size_sum", "counter", "Sum over decode steps of sequences decoded (divide by starling:decode_steps_total for the mean).", state.decode_batch_size_sum.to_string());
    metric(
        "starling:kv_compressions_total",
        "counter",
        "Token-eviction compactions (one per request per compression, all layers).",
        counters.compressions.to_string(),
    );
    metric(
        "starling:kv_evicted_tokens_total",
        "counter",
        "Tokens evicted per layer, summed over compactions.",
        counters.evicted_tokens.to_string(),
    );
    metric(
        "starling:kv_evicted_blocks_total",
        "counter",
        "KV blocks returned to the pool by eviction.",
        counters.evicted_blocks.to_string(),
    );
    metric(
        "starling:kv_compaction_forked_blocks_total",
        "counter",
        "Cached or shared KV blocks copied into private ones before a compaction (the prefix cache keeps the originals).",
        counters.forked_blocks.to_string(),
    );
    metric(
        "starling:kv_compression_seconds_total",
        "counter",
        "Wall time the engine spent compacting caches (scoring, selection, compaction).",
        format!("{:.6}", counters.compression_micros as f64 / 1e6),
    );
    metric(
        "starling:non_finite_logits_requests_total",
        "counter",
        "Requests ended because the model produced NaN or +inf logits for them.",
        state.non_finite_requests_total.to_string(),
    );
    metric(
        "starling:model_output_non_finite",
        "gauge",
        "1 while every recent request has failed on non-finite logits (the model is broken).",
        u8::from(state.model_output_non_finite.is_some()).to_string(),
    );
    metric(
        "starling:requests_rejected_total",
        "counter",
        "Requests the engine refused at admission.",
        state.rejected_total.to_string(),
    );
    if let Some(config) = &state.kv_compression {
        let field = |name: &str| {
            config.get(name).map_or(String::new(), |v| match v {
                serde_json::Value::String(s) => s.clone(),
                other => other.to_string(),
            })
        };
        let _ = writeln!(
            out,
            "# HELP starling:kv_compression_info The server-wide token-eviction policy (requests may override it).\n# TYPE starling:kv_compression_info gauge\nstarling:kv_compression_info{{method=\"{}\",ratio=\"{}\",sink_tokens=\"{}\",window_tokens=\"{}\",every_n_tokens=\"{}\"}} 1",
            escape_label(&field("method")),
            escape_label(&field("ratio")),
            escape_label(&field("sink_tokens")),
            escape_label(&field("window_tokens")),
            escape_label(&field("every_n_tokens")),
        );
    }
    if let Some(cache) = &state.kv_cache {
        render_cache(&mut out, cache);
    }
    state.ttft_s.render(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Time to first token.",
        &labels,
    );
    state.itl_s.render(
        &mut out,
        "vllm:inter_token_latency_seconds",
        "Time between consecutive output tokens.",
        &labels,
    );
    state.step_s.render(
        &mut out,
        "starling:engine_step_seconds",
        "Wall time of one engine step.",
        &labels,
    );
    state.e2e_s.render(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Arrival to last token.",
        &labels,
    );
    state.iteration_tokens.render(
        &mut out,
        "vllm:iteration_tokens_total",
        "Histogram of number of tokens per engine_step.",
        &labels,
    );
    state.decode_batch_size.render(
        &mut out,
        // Not `starling:decode_batch_size`: its `_sum` would collide with the counter of that
        // name (one sample name in two families, which Prometheus refuses and scrapers add up).
        "starling:decode_batch_sequences",
        "Sequences decoded per decode step.",
        &labels,
    );
    kernel_profile::render(&mut out, &state.kernel_profile);
    out
}

/// The KV cache's layout as an info series (labels), and its sizes as gauges.
fn render_cache(out: &mut String, cache: &CacheReport) {
    let mut labels = vec![
        ("kind", cache.kind.name().to_owned()),
        ("dtype", cache.dtype.clone()),
        ("num_layers", cache.num_layers.to_string()),
        ("latent_layers", cache.latent_layers.to_string()),
    ];
    if let Some(ranks) = &cache.latent_ranks {
        labels.extend([
            (
                "key_rank_per_head_min",
                ranks.key_rank_per_head_min.to_string(),
            ),
            (
                "key_rank_per_head_max",
                ranks.key_rank_per_head_max.to_string(),
            ),
            ("value_rank_min", ranks.value_rank_min.to_string()),
            ("value_rank_max", ranks.value_rank_max.to_string()),
        ]);
    }
    if let Some(star_kv) = &cache.star_kv {
        labels.extend([
            ("star_kv_profile", star_kv.profile.clone()),
            ("star_kv_checkpoint", star_kv.checkpoint_name.clone()),
            ("star_kv_factors", star_kv.factors.clone()),
        ]);
    }
    let labels: Vec<String> = labels
        .iter()
        .map(|(name, value)| format!("{name}=\"{}\"", escape_label(value)))
        .collect();
    let _ = writeln!(
        out,
        "# HELP starling:kv_cache_info The KV-cache layout: full K/V or latents (STAR-KV, or synthetic without a checkpoint), their ranks and checkpoint.\n# TYPE starling:kv_cache_info gauge\nstarling:kv_cache_info{{{}}} 1",
        labels.join(",")
    );
    for (name, help, value) in [
        (
            "starling:kv_cache_bytes_per_token",
            "KV-cache bytes one token occupies across all layers.",
            cache.bytes_per_token,
        ),
        (
            "starling:kv_cache_full_bytes_per_token",
            "What one token would occupy as full K/V (the plain model's cache).",
            cache.full_bytes_per_token,
        ),
        (
            "starling:kv_cache_block_size_tokens",
            "Token slots per KV block.",
            cache.block_size_tokens as u64,
        ),
        (
            "starling:kv_cache_capacity_tokens",
            "Token slots in the KV pool.",
            cache.capacity_tokens as u64,
        ),
        (
            "starling:kv_cache_latent_layers",
            "Layers whose cache stores latents.",
            cache.latent_layers as u64,
        ),
        (
            "starling:kv_cache_longest_context_tokens",
            "The longest single sequence the pool holds (within the model's window).",
            cache.longest_context_tokens as u64,
        ),
    ] {
        let _ = writeln!(
            out,
            "# HELP {name} {help}\n# TYPE {name} gauge\n{name} {value}"
        );
    }
}

/// Escapes a Prometheus label value (backslash, quote, newline).
fn escape_label(value: &str) -> String {
    value
        .replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn histogram_buckets_are_cumulative_and_inf_holds_everything() {
        let mut h = Histogram::new(&[0.1, 1.0]);
        for v in [0.05, 0.5, 0.7, 3.0] {
            h.observe(v);
        }
        let mut out = String::new();
        h.render(&mut out, "x", "help", "a=\"b\"");
        assert!(out.contains("x_bucket{a=\"b\",le=\"0.1\"} 1\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"1\"} 3\n"), "{out}");
        assert!(out.contains("x_bucket{a=\"b\",le=\"+Inf\"} 4\n"), "{out}");
        assert!(out.contains("x_count{a=\"b\"} 4\n"), "{out}");
    }

    #[test]
    fn a_star_kv_cache_is_reported_with_its_ranks_and_checkpoint() {
        use starling_engine::engine::{CacheKind, LatentRankSummary, StarKvInfo};
        let metrics = Metrics::default();
        metrics.lock().kv_cache = Some(CacheReport {
            kind: CacheKind::Latent,
            dtype: "bf16".into(),
            bytes_per_token: 20_000,
            full_bytes_per_token: 23_040,
            block_size_tokens: 16,
            num_blocks: 100,
            capacity_tokens: 1600,
            cache_groups: 1,
            cache_bytes: 32_000_000,
            num_layers: 30,
            latent_layers: 27,
            latent_ranks: Some(LatentRankSummary {
                key_rank_per_head_min: 40,
                key_rank_per_head_max: 64,
                value_rank_min: 96,
                value_rank_max: 192,
            }),
            max_model_len_tokens: 1024,
            max_concurrency: 1.56,
            longest_context_tokens: 1600,
            star_kv: Some(StarKvInfo {
                profile: "balanced".into(),
                cache: "latent".into(),
                factors: "both".into(),
                checkpoint_name: "ckpt \"1\"".into(),
                compressed_layers: 27,
                kv_bytes_per_token_compressed: 19_584,
                kv_bytes_per_token_original: 23_040,
                checkpoint_identity: String::new(),
            }),
        });
        let text = metrics.render("m");
        assert!(
            text.contains(
                "starling:kv_cache_info{kind=\"latent\",dtype=\"bf16\",num_layers=\"30\",\
                 latent_layers=\"27\",key_rank_per_head_min=\"40\",key_rank_per_head_max=\"64\",\
                 value_rank_min=\"96\",value_rank_max=\"192\",star_kv_profile=\"balanced\",\
                 star_kv_checkpoint=\"ckpt \\\"1\\\"\",star_kv_factors=\"both\"} 1\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("starling:kv_cache_bytes_per_token 20000\n"),
            "{text}"
        );
        assert!(
            text.contains("starling:kv_cache_latent_layers 27\n"),
            "{text}"
        );
        assert!(
            text.contains("starling:kv_cache_longest_context_tokens 1600\n"),
            "{text}"
        );
    }

    #[test]
    fn prefix_cache_counters_use_vllms_names_in_tokens() {
        let metrics = Metrics::default();
        let stats = EngineStats {
            num_running: 0,
            num_waiting: 0,
            kv_blocks_total: 10,
            kv_blocks_free: 10,
            num_preemptions: 0,
            counters: Default::default(),
            last_step: None,
            prefix_cache: starling_engine::PrefixCacheCounters {
                enabled: true,
                queries_requests: 3,
                queries_tokens: 300,
                hits_tokens: 128,
                hits_blocks: 8,
                evicted_blocks: 2,
                cached_blocks: 5,
            },
        };
        metrics.record_step(stats, None);
        let text = metrics.render("m");
        for line in [
            "# TYPE vllm:prefix_cache_queries_total counter
",
            "vllm:prefix_cache_queries_total{model_name=\"m\"} 300\n",
            "vllm:prefix_cache_hits_total{model_name=\"m\"} 128\n",
            "starling:prefix_caching_enabled 1\n",
            "starling:prefix_cache_hit_blocks_total 8\n",
            "starling:prefix_cache_evicted_blocks_total 2\n",
            "starling:prefix_cache_blocks 5\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
    }

    /// Two running, one waiting, 4 of 10 blocks free, 3 preemptions.
    fn busy_engine() -> EngineStats {
        EngineStats {
            num_running: 2,
            num_waiting: 1,
            kv_blocks_total: 10,
            kv_blocks_free: 4,
            num_preemptions: 3,
            counters: Default::default(),
            last_step: None,
            prefix_cache: Default::default(),
        }
    }

    #[test]
    fn every_sample_belongs_to_one_metric_family() {
        let metrics = Metrics::default();
        metrics.record_step(
            busy_engine(),
            Some(StepStats {
                num_decode_tokens: 2,
                num_scheduled_tokens: 2,
                ..StepStats::default()
            }),
        );
        let text = metrics.render("m");
        let mut families: std::collections::HashMap<&str, &str> = Default::default();
        for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
            let mut parts = line["# TYPE ".len()..].split_whitespace();
            let (name, kind) = (parts.next().unwrap(), parts.next().unwrap());
            assert!(
                families.insert(name, kind).is_none(),
                "{name} declared twice"
            );
        }
        for line in text
            .lines()
            .filter(|l| !l.starts_with('#') && !l.is_empty())
        {
            let sample = line.split(['{', ' ']).next().unwrap();
            let owners: Vec<&str> = families
                .iter()
                .filter(|(name, kind)| {
                    **name == sample
                        || (**kind == "histogram"
                            && ["_bucket", "_sum", "_count"]
                                .iter()
                                .any(|suffix| sample.strip_suffix(suffix) == Some(**name)))
                })
                .map(|(name, _)| *name)
                .collect();
            assert_eq!(owners.len(), 1, "{sample}: families {owners:?}");
        }
    }

    #[test]
    fn decode_batch_figures_count_only_decode_steps() {
        let metrics = Metrics::default();
        let stats = busy_engine();
        let step = |decode, blocks| StepStats {
            num_decode_tokens: decode,
            num_scheduled_tokens: decode + 5,
            num_blocks_in_use: blocks,
            ..StepStats::default()
        };
        metrics.record_step(stats, Some(step(0, 2)));
        metrics.record_step(stats, Some(step(1, 7)));
        metrics.record_step(stats, Some(step(3, 6)));
        let text = metrics.render("m\"x");
        assert!(text.contains("starling:decode_steps_total 2\n"), "{text}");
        assert!(
            text.contains("starling:decode_steps_batch1_total 1\n"),
            "{text}"
        );
        assert!(
            text.contains("starling:decode_batch_size_sum 4\n"),
            "{text}"
        );
        assert!(text.contains("starling:kv_blocks_used 6\n"), "{text}");
        // The decode-batch histogram sees the two decode steps (1 and 3), the iteration one
        // every step that ran tokens (5, 6 and 8).
        for line in [
            "starling:decode_batch_sequences_bucket{model_name=\"m\\\"x\",le=\"1\"} 1\n",
            "starling:decode_batch_sequences_bucket{model_name=\"m\\\"x\",le=\"2\"} 1\n",
            "starling:decode_batch_sequences_bucket{model_name=\"m\\\"x\",le=\"4\"} 2\n",
            "starling:decode_batch_sequences_count{model_name=\"m\\\"x\"} 2\n",
            "starling:decode_batch_sequences_sum{model_name=\"m\\\"x\"} 4\n",
            "vllm:iteration_tokens_total_bucket{model_name=\"m\\\"x\",le=\"1\"} 0\n",
            "vllm:iteration_tokens_total_bucket{model_name=\"m\\\"x\",le=\"8\"} 3\n",
            "vllm:iteration_tokens_total_sum{model_name=\"m\\\"x\"} 19\n",
        ] {
            assert!(text.contains(line), "{line:?} missing from\n{text}");
        }
        assert!(text.contains("starling:kv_blocks_used_max 7\n"), "{text}");
        assert!(
            text.contains("vllm:kv_cache_usage_perc{model_name=\"m\\\"x\"} 0.6\n"),
            "{text}"
        );
        assert!(
            text.contains("vllm:num_preemptions_total{model_name=\"m\\\"x\"} 3\n"),
            "{text}"
        );
    }
}
