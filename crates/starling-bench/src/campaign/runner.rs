//! Runs a campaign plan against each engine in turn: boots its server from the command line,
//! runs the points through the `bench serve` driver, turns refusals into rows, and stops the
//! server before the next engine starts (so engines never share the GPU).

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use tokio::sync::watch;

use super::engine::{BootParams, EngineSpec};
use super::histogram::parse_histogram;
use super::plan::{CampaignPlan, Point, Workload};
use super::results::{BootRecord, PointRow, PointStatus};
use super::server::{BootOutcome, ServerProcess};
use crate::client::StreamClient;
use crate::dataset::{random_requests, BenchRequest};
use crate::driver::{run_benchmark, RunConfig};
use crate::error::BenchError;
use crate::server_metrics::parse_prometheus;
use crate::sharegpt;

/// Longest detail kept in a row (first request error, log lines).
const DETAIL_CHARS: usize = 600;

/// How the runner starts servers and bounds each step.
#[derive(Debug, Clone)]
pub struct RunSettings {
    /// KV-cache memory every engine gets (`{kv_cache_memory_bytes}`), bytes.
    pub kv_cache_memory_bytes: u64,
    /// First port tried; each boot takes the next free one.
    pub base_port: u16,
    /// Longest a server may take to answer `/health`.
    pub boot_timeout: Duration,
    /// Longest one point may run.
    pub point_timeout: Duration,
    /// Where the servers' logs go.
    pub logs_dir: PathBuf,
    /// The ShareGPT file a `sharegpt` workload without a file uses.
    pub default_sharegpt: Option<PathBuf>,
    /// How often `/metrics` is sampled during a point.
    pub metrics_period: Duration,
}

/// What the runner reports as it goes (the CLI draws progress and rewrites its files).
pub trait Observer {
    /// A server is being started.
    fn booting(&mut self, engine: &str, max_model_len_tokens: usize);
    /// A boot ended (up or refused).
    fn booted(&mut self, record: &BootRecord);
    /// A point is starting.
    fn point_started(&mut self, engine: &str, point: &Point);
    /// A point has its row.
    fn point_done(&mut self, row: &PointRow);
}

/// A server that is up, with what the points need from it.
struct Live {
    server: ServerProcess,
    max_model_len_tokens: usize,
    client: StreamClient,
}

/// Runs `plan` on every engine; returns whether it was interrupted by `stop` (the remaining
/// points are then reported as skipped).
pub async fn run_campaign(
    plan: &CampaignPlan,
    engines: &[EngineSpec],
    settings: &RunSettings,
    observer: &mut dyn Observer,
    mut stop: watch::Receiver<bool>,
) -> bool {
    let mut runner = Runner {
        plan,
        settings,
        next_port: settings.base_port,
        boots: 0,
    };
    let points = plan.points();
    let mut interrupted = false;
    for engine in engines {
        if interrupted {
            skip_all(engine, &points, observer);
            continue;
        }
        interrupted = runner
            .run_engine(engine, &points, observer, &mut stop)
            .await;
    }
    interrupted
}

fn skip_all(engine: &EngineSpec, points: &[Point], observer: &mut dyn Observer) {
    for point in points {
        observer.point_done(&PointRow::unmeasured(
            &engine.name,
            point,
            PointStatus::Skipped,
            Some("interrupted".into()),
        ));
    }
}

/// Runs `future` unless `stop` is (or becomes) set.
async fn unless_stopped<F: Future>(
    stop: &mut watch::Receiver<bool>,
    future: F,
) -> Option<F::Output> {
    if *stop.borrow() {
        return None;
    }
    let stopped = async {
        if stop.wait_for(|stopped| *stopped).await.is_err() {
            // No one can stop the run any more: never.
            std::future::pending::<()>().await;
        }
    };
    tokio::select! {
        output = future => Some(output),
        () = stopped => None,
    }
}

fn truncate(text: &str) -> String {
    if text.chars().count() <= DETAIL_CHARS {
        return text.to_owned();
    }
    let kept: String = text.chars().take(DETAIL_CHARS).collect();
    format!("{kept}…")
}

struct Runner<'a> {
    plan: &'a CampaignPlan,
    settings: &'a RunSettings,
    next_port: u16,
    boots: usize,
}

impl Runner<'_> {
    /// Every point on one engine; `true` when interrupted.
    async fn run_engine(
        &mut self,
        engine: &EngineSpec,
        points: &[Point],
        observer: &mut dyn Observer,
        stop: &mut watch::Receiver<bool>,
    ) -> bool {
        let mut live: Option<Live> = None;
        let mut refused: HashMap<usize, (PointStatus, String)> = HashMap::new();
        for (index, point) in points.iter().enumerate() {
            let window = match point.boot_max_model_len_tokens {
                Some(len) if engine.takes_max_model_len() => len,
                _ => self.plan.max_model_len_tokens,
            };
            if let Some(current) = &mut live {
                if current.max_model_len_tokens != window || !current.server.is_running() {
                    current.server.stop().await;
                    live = None;
                }
            }
            if live.is_none() {
                if let Some((status, detail)) = refused.get(&window) {
                    let row =
                        PointRow::unmeasured(&engine.name, point, *status, Some(detail.clone()));
                    observer.point_done(&row);
                    continue;
                }
                observer.booting(&engine.name, window);
                let Some(boot) = unless_stopped(stop, self.boot(engine, window)).await else {
                    skip_all(engine, &points[index..], observer);
                    return true;
                };
                let (booted, record) = boot;
                observer.booted(&record);
                match booted {
                    Some(up) => live = Some(up),
                    None => {
                        let detail = record.log_tail.clone().unwrap_or_default();
                        refused.insert(window, (record.status, detail.clone()));
                        observer.point_done(&PointRow::unmeasured(
                            &engine.name,
                            point,
                            record.status,
                            Some(detail),
                        ));
                        continue;
                    }
                }
            }
            let Some(current) = &live else { continue };
            observer.point_started(&engine.name, point);
            let measured = unless_stopped(stop, self.measure(&engine.name, current, point)).await;
            let Some(row) = measured else {
                if let Some(mut current) = live.take() {
                    current.server.stop().await;
                }
                skip_all(engine, &points[index..], observer);
                return true;
            };
            observer.point_done(&row);
        }
        if let Some(mut current) = live {
            current.server.stop().await;
        }
        false
    }

    /// The next port nothing listens on.
    fn free_port(&mut self) -> u16 {
        loop {
            let port = self.next_port;
            self.next_port = self.next_port.checked_add(1).unwrap_or(1024);
            if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
                return port;
            }
        }
    }

    /// Boots `engine` at `window`; the server when it came up, and the boot's record.
    async fn boot(&mut self, engine: &EngineSpec, window: usize) -> (Option<Live>, BootRecord) {
        let port = self.free_port();
        self.boots += 1;
        let log_file = format!("{:02}-{}-{window}.log", self.boots, engine.name);
        let command = engine.render(BootParams {
            port,
            max_model_len_tokens: window,
            kv_cache_memory_bytes: self.settings.kv_cache_memory_bytes,
        });
        let mut record = BootRecord {
            engine: engine.name.clone(),
            command: command.clone(),
            max_model_len_tokens: window,
            status: PointStatus::Ok,
            boot_s: 0.0,
            log_file: log_file.clone(),
            models: None,
            cache_metrics: serde_json::Map::new(),
            log_tail: None,
        };
        let started = Instant::now();
        let server =
            match ServerProcess::spawn(&command, port, &self.settings.logs_dir.join(&log_file)) {
                Ok(server) => server,
                Err(e) => {
                    record.status = PointStatus::BootRefused;
                    record.log_tail = Some(format!("could not start: {e}"));
                    return (None, record);
                }
            };
        let outcome = server.wait_until_up(self.settings.boot_timeout).await;
        record.boot_s = started.elapsed().as_secs_f64();
        let server = match outcome {
            BootOutcome::Up(server) => server,
            BootOutcome::Exited { status, log_tail } => {
                record.status = PointStatus::BootRefused;
                record.log_tail = Some(truncate(&format!("exited ({status}): {log_tail}")));
                return (None, record);
            }
            BootOutcome::TimedOut { log_tail } => {
                record.status = PointStatus::BootTimedOut;
                record.log_tail = Some(truncate(&format!(
                    "no /health answer within {:.0} s: {log_tail}",
                    self.settings.boot_timeout.as_secs_f64()
                )));
                return (None, record);
            }
        };
        let probe = StreamClient::new(&server.base_url, "");
        let models: Option<serde_json::Value> = probe
            .get_text("/v1/models")
            .await
            .ok()
            .and_then(|t| serde_json::from_str(&t).ok());
        if let Ok(text) = probe.get_text("/metrics").await {
            record.cache_metrics = cache_metrics(&text);
        }
        let model = models
            .as_ref()
            .and_then(|m| m["data"][0]["id"].as_str())
            .unwrap_or_default()
            .to_owned();
        record.models = models;
        let client = StreamClient::new(&server.base_url, &model);
        (
            Some(Live {
                server,
                max_model_len_tokens: window,
                client,
            }),
            record,
        )
    }

    async fn requests(&self, live: &Live, point: &Point) -> Result<Vec<BenchRequest>, BenchError> {
        match &point.workload {
            Workload::Random { .. } => {
                let spec = point.workload.random_spec().ok_or_else(|| {
                    BenchError::Invalid("a random workload without lengths".into())
                })?;
                random_requests(point.num_requests, spec, self.plan.seed)
            }
            Workload::Sharegpt { file } => {
                let path = match file {
                    Some(file) => PathBuf::from(file),
                    None => self.settings.default_sharegpt.clone().ok_or_else(|| {
                        BenchError::Invalid("no ShareGPT file for the sharegpt workload".into())
                    })?,
                };
                let pairs = sharegpt::load_pairs(&path)?;
                sharegpt::sample_requests(
                    pairs,
                    point.num_requests,
                    self.plan.seed,
                    &live.client,
                    live.max_model_len_tokens,
                )
                .await
            }
        }
    }

    /// One point on a live server.
    async fn measure(&self, engine: &str, live: &Live, point: &Point) -> PointRow {
        let error_row =
            |e: String| PointRow::unmeasured(engine, point, PointStatus::Error, Some(truncate(&e)));
        let requests = match self.requests(live, point).await {
            Ok(requests) => requests,
            Err(e) => return error_row(format!("building the requests: {e}")),
        };
        let before = match live.client.get_text("/metrics").await {
            Ok(text) => text,
            Err(e) => return error_row(format!("reading /metrics: {e}")),
        };
        let config = RunConfig {
            pacing: point.pacing,
            seed: self.plan.seed,
            ignore_eos: true,
            metrics_period: self.settings.metrics_period,
        };
        let run = tokio::time::timeout(
            self.settings.point_timeout,
            run_benchmark(&live.client, &requests, &config),
        )
        .await;
        let outcome = match run {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(e)) => return error_row(e.to_string()),
            Err(_) => {
                return error_row(format!(
                    "the point ran past {:.0} s",
                    self.settings.point_timeout.as_secs_f64()
                ))
            }
        };
        let after = live.client.get_text("/metrics").await.unwrap_or_default();
        let histogram = |name: &str| {
            let later = parse_histogram(&after, name)?;
            let earlier = parse_histogram(&before, name).unwrap_or_default();
            Some(later.since(&earlier).summary())
        };
        let iteration_tokens = histogram("vllm:iteration_tokens_total");
        let generated = parse_prometheus(&after)
            .get("vllm:generation_tokens_total")
            .copied()
            .unwrap_or(0.0)
            - parse_prometheus(&before)
                .get("vllm:generation_tokens_total")
                .copied()
                .unwrap_or(0.0);
        let generated_tokens_per_step = iteration_tokens
            .as_ref()
            .filter(|h| h.observations > 0.0)
            .map(|h| generated / h.observations);
        let m = &outcome.metrics;
        let first_error = outcome.results.iter().find_map(|r| r.error.clone());
        let status = match (m.completed, m.failed) {
            (_, 0) => PointStatus::Ok,
            (0, _) => PointStatus::RequestsRefused,
            _ => PointStatus::PartlyFailed,
        };
        PointRow {
            engine: engine.to_owned(),
            point: point.clone(),
            workload_label: point.workload.label(),
            status,
            detail: first_error.map(|e| truncate(&e)),
            metrics: Some(outcome.metrics),
            server: Some(outcome.server),
            decode_batch: histogram("starling:decode_batch_sequences"),
            iteration_tokens,
            generated_tokens_per_step,
            kernel_profile: outcome.kernel_profile,
        }
    }
}

/// The cache figures a server exports: Starling's `starling:kv_cache_*` gauges and the labels
/// of vLLM's `vllm:cache_config_info` (block counts, block size, dtype, memory settings).
pub fn cache_metrics(text: &str) -> serde_json::Map<String, serde_json::Value> {
    let mut out = serde_json::Map::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        if let Some(labels) = line
            .strip_prefix("vllm:cache_config_info{")
            .and_then(|rest| rest.rsplit_once('}'))
            .map(|(labels, _)| labels)
        {
            for pair in labels.split("\",") {
                if let Some((key, value)) = pair.split_once("=\"") {
                    let value = value.trim_end_matches('"');
                    out.insert(format!("vllm:{}", key.trim()), value.into());
                }
            }
        } else if line.starts_with("starling:kv_cache_") {
            if let Some((name, value)) = line.rsplit_once(' ') {
                if let Ok(v) = value.parse::<f64>() {
                    let name = name.split('{').next().unwrap_or(name);
                    out.insert(name.to_owned(), v.into());
                }
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_figures_come_from_either_servers_metrics() {
        let vllm = "# HELP vllm:cache_config_info x\nvllm:cache_config_info{block_size=\"16\",\
                    num_gpu_blocks=\"2340\",kv_cache_memory_bytes=\"1073741824\",engine=\"0\"} 1.0\n";
        let m = cache_metrics(vllm);
        assert_eq!(m["vllm:num_gpu_blocks"], "2340");
        assert_eq!(m["vllm:kv_cache_memory_bytes"], "1073741824");
        assert_eq!(m["vllm:engine"], "0");
        let starling = "starling:kv_cache_bytes_per_token 28672\n\
                        starling:kv_cache_capacity_tokens 37440\nstarling:kv_blocks_used 3\n";
        let m = cache_metrics(starling);
        assert_eq!(m["starling:kv_cache_capacity_tokens"], 37440.0);
        assert!(!m.contains_key("starling:kv_blocks_used"));
    }

    #[test]
    fn long_details_are_cut() {
        let long = "x".repeat(DETAIL_CHARS + 10);
        assert_eq!(truncate(&long).chars().count(), DETAIL_CHARS + 1);
        assert_eq!(truncate("short"), "short");
    }
}
