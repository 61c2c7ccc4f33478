//! The axum router and its handlers.

mod chat;
mod completions;
mod generation;
mod info;
mod sse;

use axum::routing::{get, post};
use axum::Router;

use crate::state::AppState;

/// All endpoints, ready to serve.
pub fn router(state: AppState) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::create))
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .fallback(info::not_found)
        .with_state(state)
}
