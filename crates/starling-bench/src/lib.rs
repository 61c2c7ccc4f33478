//! The `starling bench serve` client and `starling bench campaign` ([`campaign`]): datasets, request drivers, vLLM-style serving metrics,
//! server-side figures from `/metrics`, reports and plots; and the engine-free parts of
//! `starling bench niah` ([`niah`]) and `starling bench quality` ([`quality`]).
//!
//! Definitions follow vLLM's `benchmark_serving`: TTFT is the time to the first streamed chunk,
//! TPOT is `(latency − TTFT) / (output tokens − 1)` per request, ITL is every gap between
//! consecutive chunks, E2EL is the whole request; throughputs divide by the run's wall time.
#![deny(missing_docs)]

pub mod campaign;
pub mod client;
pub mod dataset;
pub mod driver;
pub mod error;
pub mod kernel_profile;
pub mod multi_turn;
pub mod niah;
pub mod plot;
pub mod quality;
pub mod report;
pub mod server_metrics;
pub mod sharegpt;
pub mod stats;

pub use client::{RequestResult, StreamClient};
pub use dataset::{BenchPrompt, BenchRequest, PrefixRepetitionSpec, RandomSpec};
pub use driver::{run_benchmark, Pacing, RunConfig, RunOutcome};
pub use error::BenchError;
pub use report::{BenchReport, SweepRow};
pub use stats::{BenchmarkMetrics, LatencySummary};
