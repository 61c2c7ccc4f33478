//! `starling bench campaign`: the serving campaigns in one command, against several engine
//! configurations (Starling's arms, vLLM, …) on the same KV memory.
//!
//! Each engine is a command line ([`EngineSpec`]); the runner boots it ([`server`]), runs the
//! points of four campaigns through the `bench serve` driver — (a) concurrency, (b) context
//! length (one boot per length when the command takes `{max_model_len}`), (c) long generation,
//! (d) scheduler efficiency under Poisson arrivals — and stops it before the next engine. A
//! boot the server refuses, or requests it refuses, is a row saying so ([`PointStatus`]).
//! [`markdown`] and [`charts`] write the tables and PNGs of a [`CampaignReport`].

pub mod charts;
pub mod engine;
#[cfg(test)]
mod fixture;
pub mod histogram;
pub mod markdown;
pub mod plan;
pub mod results;
pub mod runner;
pub mod server;
pub mod stamp;

pub use engine::EngineSpec;
pub use plan::{CampaignKind, CampaignPlan, Point, RequestCount, Workload};
pub use results::{BootRecord, CampaignReport, PointRow, PointStatus};
pub use runner::{run_campaign, Observer, RunSettings};
