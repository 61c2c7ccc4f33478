//! The axum router and its handlers.

mod chat;
mod completions;
mod generation;
mod info;
mod response;
mod sse;

use std::sync::Arc;

use axum::extract::Request;
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Extension, Router};

use crate::access;
use crate::api_error::ApiError;
use crate::json_body::BodyLimits;
use crate::serve_options::ServeOptions;
use crate::state::AppState;

/// All endpoints, behind the access checks of `options` and with its body limits.
pub fn router(state: AppState, options: &ServeOptions) -> Router {
    let body_limits = BodyLimits {
        max_bytes: options.limits.max_body_bytes,
        read_timeout: options.limits.body_read_timeout,
    };
    Router::new()
        .route("/v1/completions", post(completions::create))
        .route("/v1/chat/completions", post(chat::create))
        .route("/v1/models", get(info::models))
        .route("/health", get(info::health))
        .route("/metrics", get(info::metrics))
        .route("/tokenize", post(info::tokenize))
        .route("/detokenize", post(info::detokenize))
        .fallback(info::not_found)
        .layer(middleware::from_fn(openai_error_bodies))
        .layer(Extension(body_limits))
        .layer(middleware::from_fn_with_state(
            Arc::new(options.access.clone()),
            access::enforce,
        ))
        .with_state(state)
}

/// Gives every error response without a JSON body (axum's 405 for a wrong method, say) OpenAI's
/// error shape, keeping its headers (`Allow`).
async fn openai_error_bodies(request: Request, next: Next) -> Response {
    let method = request.method().clone();
    let path = request.uri().path().to_owned();
    let response = next.run(request).await;
    let status = response.status();
    let is_json = response
        .headers()
        .get(header::CONTENT_TYPE)
        .is_some_and(|v| v.as_bytes().starts_with(b"application/json"));
    if !(status.is_client_error() || status.is_server_error()) || is_json {
        return response;
    }
    let (mut parts, _) = response.into_parts();
    let error = if status == StatusCode::METHOD_NOT_ALLOWED {
        let allowed = parts
            .headers
            .get(header::ALLOW)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .to_owned();
        ApiError::for_status(
            status,
            format!("method {method} is not allowed on {path}; allowed: {allowed}"),
        )
        .with_code("method_not_allowed")
    } else {
        ApiError::for_status(status, "")
    };
    let body = error.into_response().into_body();
    parts.headers.remove(header::CONTENT_LENGTH);
    parts.headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    Response::from_parts(parts, body)
}
