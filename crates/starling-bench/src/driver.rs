//! Sending a dataset at a fixed concurrency or a Poisson request rate.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use tokio::sync::Semaphore;

use crate::client::{RequestResult, StreamClient};
use crate::dataset::BenchRequest;
use crate::error::BenchError;
use crate::kernel_profile::{run_profile, KernelProfileRow};
use crate::server_metrics::{figures, parse_prometheus, sample_during_run, ServerFigures};
use crate::stats::{compute_metrics, BenchmarkMetrics};

/// How requests are released.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Pacing {
    /// All at once, at most this many in flight.
    Concurrency(usize),
    /// Poisson arrivals at this many requests per second (optionally capped in flight).
    Rate {
        /// Mean requests per second.
        per_s: f64,
        /// Most requests in flight.
        max_concurrency: Option<usize>,
    },
}

/// One benchmark run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    /// Release schedule.
    pub pacing: Pacing,
    /// Seed of the arrival process.
    pub seed: u64,
    /// Ask the server to ignore EOS so every request generates its full length.
    pub ignore_eos: bool,
    /// How often `/metrics` is sampled for the KV peak.
    pub metrics_period: Duration,
}

/// What a run measured.
#[derive(Debug, Clone)]
pub struct RunOutcome {
    /// Client-side metrics.
    pub metrics: BenchmarkMetrics,
    /// Server-side scheduler figures.
    pub server: ServerFigures,
    /// Device time per launch site during the run (empty unless the server profiles
    /// kernels: `starling serve --kernel-profile`).
    pub kernel_profile: Vec<KernelProfileRow>,
    /// Per-request results, in dataset order.
    pub results: Vec<RequestResult>,
}

/// Sends `requests` to the server behind `client` as `config` says and measures them.
pub async fn run_benchmark(
    client: &StreamClient,
    requests: &[BenchRequest],
    config: &RunConfig,
) -> Result<RunOutcome, BenchError> {
    let limit = match config.pacing {
        Pacing::Concurrency(0) => {
            return Err(BenchError::Invalid(
                "--max-concurrency must be at least 1".into(),
            ))
        }
        Pacing::Rate { per_s, .. } if !(per_s > 0.0 && per_s.is_finite()) => {
            return Err(BenchError::Invalid(format!(
                "--request-rate must be positive, got {per_s}"
            )))
        }
        Pacing::Concurrency(n) => n,
        Pacing::Rate {
            max_concurrency, ..
        } => max_concurrency.unwrap_or(Semaphore::MAX_PERMITS),
    };
    let before_text = client.get_text("/metrics").await?;
    let stop_sampling = Arc::new(AtomicBool::new(false));
    let sampler = tokio::spawn(sample_during_run(
        client.clone(),
        config.metrics_period,
        stop_sampling.clone(),
    ));
    let gate = Arc::new(Semaphore::new(limit));
    let mut rng = ChaCha8Rng::seed_from_u64(config.seed);
    let started = Instant::now();
    let mut tasks = Vec::with_capacity(requests.len());
    for request in requests {
        if let Pacing::Rate { per_s, .. } = config.pacing {
            // Exponential gaps: a Poisson process, vLLM's default burstiness of 1.
            let gap_s = -(1.0 - rng.gen::<f64>()).ln() / per_s;
            tokio::time::sleep(Duration::from_secs_f64(gap_s)).await;
        }
        let permit = gate
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| BenchError::Invalid(format!("concurrency gate closed: {e}")))?;
        let client = client.clone();
        let request = request.clone();
        let ignore_eos = config.ignore_eos;
        tasks.push(tokio::spawn(async move {
            let result = client.send(&request, ignore_eos).await;
            drop(permit);
            result
        }));
    }
    let mut results = Vec::with_capacity(tasks.len());
    for task in tasks {
        results.push(task.await.unwrap_or_else(|e| RequestResult {
            error: Some(format!("request task failed: {e}")),
            ..RequestResult::default()
        }));
    }
    let duration_s = started.elapsed().as_secs_f64();
    stop_sampling.store(true, Ordering::Relaxed);
    let sampled = sampler.await.unwrap_or_default();
    let after_text = client.get_text("/metrics").await?;
    let (before, after) = (
        parse_prometheus(&before_text),
        parse_prometheus(&after_text),
    );
    Ok(RunOutcome {
        metrics: compute_metrics(&results, duration_s),
        server: figures(&before, &after, sampled),
        kernel_profile: run_profile(&before_text, &after_text),
        results,
    })
}
