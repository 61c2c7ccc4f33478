//! Starling's OpenAI-compatible HTTP server.
//!
//! - [`engine_thread`]: the engine runs on its own OS thread; requests and aborts reach it
//!   through a channel, and each request's outputs come back on its own tokio channel.
//! - [`routes`]: axum handlers for `/v1/completions`, `/v1/chat/completions`, `/v1/models`,
//!   `/health`, `/metrics`, `/tokenize`, `/detokenize`.
//! - [`connection`]: the accept loop (HTTP/1.1 through hyper) with its timeouts and connection
//!   limit; [`access`]: API keys, allowed origins and hosts; [`json_body`]: body limits.
//! - [`metrics`]: Prometheus counters, gauges and histograms with vLLM's names.
//! - [`serve`]: runs the router until a shutdown signal, then drains and stops the engine;
//!   [`serve_options`]: what both it and the router are configured by.
#![deny(missing_docs)]

pub mod access;
pub mod api_error;
pub mod connection;
pub mod engine_thread;
pub mod json_body;
pub mod metrics;
pub mod protocol;
pub mod routes;
pub mod serve;
pub mod serve_options;
pub mod state;

pub use access::{AccessPolicy, AllowedOrigins};
pub use api_error::ApiError;
pub use connection::ConnectionLimits;
pub use engine_thread::{EngineHandle, EngineInfo, ServerError};
pub use routes::router;
pub use serve::{serve, termination_signal};
pub use serve_options::ServeOptions;
pub use state::{AppState, ModelInfo};
