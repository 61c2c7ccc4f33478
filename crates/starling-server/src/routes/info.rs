//! The small endpoints: models, health, metrics, tokenize, detokenize, and the 404 fallback.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use super::chat::encode_chat;
use super::generation::prepare;
use crate::api_error::ApiError;
use crate::json_body::JsonBody;
use crate::protocol::tokenize::{
    DetokenizeRequest, DetokenizeResponse, ModelCard, ModelList, TokenizeRequest, TokenizeResponse,
};
use crate::state::AppState;

/// `GET /v1/models`: the one served model.
pub async fn models(State(state): State<AppState>) -> Json<ModelList> {
    Json(ModelList {
        object: "list".into(),
        data: vec![ModelCard {
            id: state.model.served_name.clone(),
            object: "model".into(),
            created: state.model.created_unix_s,
            owned_by: "starling".into(),
            root: state.model.served_name.clone(),
            max_model_len: state.engine.info().max_model_len_tokens,
            // A report of plain numbers and names always serializes; were it ever not to, the
            // card is still worth sending.
            kv_cache: serde_json::to_value(state.engine.cache_report()).ok(),
        }],
    })
}

/// `GET /health`: 200 while the server runs; 503 once the model has produced non-finite logits
/// for every request for a while (its weights are probably corrupt), so a load balancer stops
/// sending it work.
pub async fn health(State(state): State<AppState>) -> Response {
    match state.engine.metrics().lock().model_output_non_finite {
        None => StatusCode::OK.into_response(),
        Some(streak) => ApiError::unavailable(format!(
            "the model produces non-finite logits (NaN or +inf): the last {streak} requests it \
             ran all failed on them; its weights are probably corrupt"
        ))
        .with_code("model_output_non_finite")
        .into_response(),
    }
}

/// `GET /metrics`: Prometheus text.
pub async fn metrics(State(state): State<AppState>) -> Response {
    let text = state.engine.metrics().render(&state.model.served_name);
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `POST /tokenize`: a prompt or a conversation to token ids.
pub async fn tokenize(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<TokenizeRequest>,
) -> Result<Json<TokenizeResponse>, ApiError> {
    state.check_model(request.model.as_deref())?;
    let worker_state = state.clone();
    let tokens = prepare(move || match (request.prompt, request.messages) {
        (Some(prompt), None) => worker_state
            .tokenizer
            .encode(&prompt, request.add_special_tokens.unwrap_or(true))
            .map_err(|e| ApiError::bad_request(format!("cannot tokenize: {e}"), Some("prompt"))),
        (None, Some(messages)) => encode_chat(
            &worker_state,
            &messages,
            request.add_generation_prompt.unwrap_or(true),
            &request.chat_template_kwargs.unwrap_or_default(),
        ),
        _ => Err(ApiError::bad_request(
            "give exactly one of `prompt` and `messages`",
            None,
        )),
    })
    .await?;
    Ok(Json(TokenizeResponse {
        count: tokens.len(),
        max_model_len: state.engine.info().max_model_len_tokens,
        tokens,
    }))
}

/// `POST /detokenize`: token ids to text.
pub async fn detokenize(
    State(state): State<AppState>,
    JsonBody(request): JsonBody<DetokenizeRequest>,
) -> Result<Json<DetokenizeResponse>, ApiError> {
    state.check_model(request.model.as_deref())?;
    super::generation::check_token_ids(&state, &request.tokens, "tokens")?;
    let prompt = state
        .tokenizer
        .decode(&request.tokens, false)
        .map_err(|e| ApiError::bad_request(format!("cannot detokenize: {e}"), Some("tokens")))?;
    Ok(Json(DetokenizeResponse { prompt }))
}

/// Any other path: an OpenAI-shaped 404.
pub async fn not_found() -> ApiError {
    ApiError::for_status(StatusCode::NOT_FOUND, "no such endpoint").with_code("not_found")
}
