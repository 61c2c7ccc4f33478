//! OpenAI-shaped error responses: `{"error": {"message", "type", "param", "code"}}`.

use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde::Serialize;
use starling_engine::scheduler::SchedulerError;
use starling_engine::EngineError;

/// An error returned to an API client, with its HTTP status.
#[derive(Debug, Clone, PartialEq)]
pub struct ApiError {
    /// HTTP status of the response.
    pub status: StatusCode,
    /// Human-readable explanation.
    pub message: String,
    /// OpenAI error type, e.g. `invalid_request_error`.
    pub error_type: &'static str,
    /// The request field at fault, when there is one.
    pub param: Option<String>,
    /// A machine-readable code, e.g. `model_not_found`.
    pub code: Option<&'static str>,
}

/// The JSON body of an error.
#[derive(Debug, Serialize)]
pub struct ErrorBody {
    /// The error itself.
    pub error: ErrorDetail,
}

/// The fields of an OpenAI error object.
#[derive(Debug, Serialize)]
pub struct ErrorDetail {
    /// Human-readable explanation.
    pub message: String,
    /// OpenAI error type.
    #[serde(rename = "type")]
    pub error_type: &'static str,
    /// The request field at fault.
    pub param: Option<String>,
    /// Machine-readable code.
    pub code: Option<&'static str>,
}

impl ApiError {
    /// A 400 `invalid_request_error` about `param` (if any).
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            message: message.into(),
            error_type: "invalid_request_error",
            param: param.map(str::to_owned),
            code: None,
        }
    }

    /// A 404 for a model this server does not serve.
    pub fn model_not_found(requested: &str, served: &str) -> Self {
        ApiError {
            status: StatusCode::NOT_FOUND,
            message: format!(
                "The model `{requested}` does not exist; this server serves `{served}`."
            ),
            error_type: "invalid_request_error",
            param: Some("model".into()),
            code: Some("model_not_found"),
        }
    }

    /// A 500 for a failure of the server itself (never for load or a bad request).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::INTERNAL_SERVER_ERROR,
            message: message.into(),
            error_type: "internal_server_error",
            param: None,
            code: None,
        }
    }

    /// A 503 while the engine is shutting down.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message: message.into(),
            error_type: "service_unavailable",
            param: None,
            code: None,
        }
    }

    /// Maps an engine refusal: request-level problems are 400s naming the field when known.
    pub fn from_engine(error: &EngineError) -> Self {
        match error {
            EngineError::Sampling(e) => ApiError::bad_request(e.to_string(), e.field()),
            EngineError::InvalidRequest(message) => ApiError::bad_request(message, None),
            EngineError::Scheduler(
                e @ (SchedulerError::PromptTooLong { .. }
                | SchedulerError::PromptExceedsCache { .. }
                | SchedulerError::PeakExceedsCache { .. }
                | SchedulerError::EmptyPrompt(_)),
            ) => ApiError::bad_request(e.to_string(), Some("prompt")),
            other => ApiError::internal(format!("engine error: {other}")),
        }
    }

    /// The JSON body clients receive.
    pub fn body(&self) -> ErrorBody {
        ErrorBody {
            error: ErrorDetail {
                message: self.message.clone(),
                error_type: self.error_type,
                param: self.param.clone(),
                code: self.code,
            },
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        (self.status, axum::Json(self.body())).into_response()
    }
}
