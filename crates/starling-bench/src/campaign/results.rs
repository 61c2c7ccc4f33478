//! What a campaign records: one row per engine and point (a refused boot or refused requests
//! are rows too), one record per server boot, and the document that holds them.

use serde::Serialize;

use super::engine::EngineSpec;
use super::histogram::HistogramSummary;
use super::plan::{CampaignKind, CampaignPlan, Point};
use crate::server_metrics::ServerFigures;
use crate::stats::BenchmarkMetrics;

/// How a point ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PointStatus {
    /// Every request succeeded.
    Ok,
    /// Some requests failed (see the row's detail).
    PartlyFailed,
    /// Every request failed: the server refused them (e.g. a prompt beyond its window).
    RequestsRefused,
    /// The server exited before answering `/health` (e.g. the KV budget cannot hold one
    /// sequence of the window).
    BootRefused,
    /// The server neither came up nor exited within the boot timeout.
    BootTimedOut,
    /// The run could not be measured (the server died, `/metrics` failed, the point timed out).
    Error,
    /// Not run: the campaign was interrupted.
    Skipped,
}

impl PointStatus {
    /// The words tables print.
    pub fn text(self) -> &'static str {
        match self {
            PointStatus::Ok => "ok",
            PointStatus::PartlyFailed => "partly failed",
            PointStatus::RequestsRefused => "requests refused",
            PointStatus::BootRefused => "boot refused",
            PointStatus::BootTimedOut => "boot timed out",
            PointStatus::Error => "error",
            PointStatus::Skipped => "skipped",
        }
    }

    /// Whether the row carries measurements.
    pub fn measured(self) -> bool {
        matches!(self, PointStatus::Ok | PointStatus::PartlyFailed)
    }
}

/// One engine at one point.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PointRow {
    /// The engine's name.
    pub engine: String,
    /// The point.
    #[serde(flatten)]
    pub point: Point,
    /// Workload label (as in tables).
    pub workload_label: String,
    /// How it ended.
    pub status: PointStatus,
    /// Why, when it did not end `ok` (first request error, the server's last log lines, …).
    pub detail: Option<String>,
    /// Client-side metrics, when measured.
    pub metrics: Option<BenchmarkMetrics>,
    /// Server-side figures from `/metrics` (zeros where the server exports no such series).
    pub server: Option<ServerFigures>,
    /// `starling:decode_batch_sequences` over the run (Starling only).
    pub decode_batch: Option<HistogramSummary>,
    /// `vllm:iteration_tokens_total` over the run: tokens per engine step (both engines).
    pub iteration_tokens: Option<HistogramSummary>,
    /// Generated tokens per engine step (`vllm:generation_tokens_total` over the iteration
    /// histogram's count): the decode batch as both engines can report it.
    pub generated_tokens_per_step: Option<f64>,
    /// Device time per launch site (a Starling engine started with `--kernel-profile`).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub kernel_profile: Vec<crate::kernel_profile::KernelProfileRow>,
}

impl PointRow {
    /// A row without measurements.
    pub fn unmeasured(
        engine: &str,
        point: &Point,
        status: PointStatus,
        detail: Option<String>,
    ) -> Self {
        PointRow {
            engine: engine.to_owned(),
            point: point.clone(),
            workload_label: point.workload.label(),
            status,
            detail,
            metrics: None,
            server: None,
            decode_batch: None,
            iteration_tokens: None,
            generated_tokens_per_step: None,
            kernel_profile: Vec::new(),
        }
    }
}

/// One server boot.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct BootRecord {
    /// The engine's name.
    pub engine: String,
    /// The command line run.
    pub command: String,
    /// Its context window, tokens.
    pub max_model_len_tokens: usize,
    /// `up`, or the refusal's status.
    pub status: PointStatus,
    /// Seconds from spawn to healthy (or to the refusal).
    pub boot_s: f64,
    /// The log file's name, in the output's `logs/`.
    pub log_file: String,
    /// The server's `/v1/models` answer (its model card; Starling's carries the KV cache).
    pub models: Option<serde_json::Value>,
    /// Cache figures the server exports on `/metrics` (Starling's `starling:kv_cache_*`,
    /// vLLM's `vllm:cache_config_info` labels), name → value.
    pub cache_metrics: serde_json::Map<String, serde_json::Value>,
    /// The log's last lines when it did not come up.
    pub log_tail: Option<String>,
}

/// The campaign's result document (`campaign.json`).
#[derive(Debug, Clone, Serialize)]
pub struct CampaignReport {
    /// Always `campaign`.
    pub bench: &'static str,
    /// When it started, UTC (`2026-12-02T10:00:00Z`).
    pub started_utc: String,
    /// The command that ran it.
    pub command: Vec<String>,
    /// KV-cache memory every engine was given (where its command takes it), bytes.
    pub kv_cache_memory_bytes: u64,
    /// The grids.
    pub plan: CampaignPlan,
    /// The engines.
    pub engines: Vec<EngineSpec>,
    /// Every boot.
    pub boots: Vec<BootRecord>,
    /// Every point of every engine.
    pub rows: Vec<PointRow>,
    /// Whether the run was cut short (the remaining points are `skipped`).
    pub interrupted: bool,
}

impl CampaignReport {
    /// The rows of one campaign, ordered by point then engine (so engines sit side by side at
    /// each point), the concurrency campaign's by workload first.
    pub fn rows_of(&self, kind: CampaignKind) -> Vec<&PointRow> {
        let engine_rank = |name: &str| self.engines.iter().position(|e| e.name == name);
        let mut rows: Vec<&PointRow> = self
            .rows
            .iter()
            .filter(|r| r.point.campaign == kind)
            .collect();
        let group = |row: &PointRow| match kind {
            CampaignKind::Concurrency => row.workload_label.clone(),
            _ => String::new(),
        };
        rows.sort_by(|a, b| {
            group(a)
                .cmp(&group(b))
                .then(a.point.value.total_cmp(&b.point.value))
                .then(engine_rank(&a.engine).cmp(&engine_rank(&b.engine)))
        });
        rows
    }
}
