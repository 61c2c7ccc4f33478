//! OpenAI-shaped error responses: `{"error": {"message", "type", "param", "code"}}`, for every
//! status the server returns.

use axum::http::{header, HeaderValue, StatusCode};
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
    /// An error of `status` and `error_type` without a param or code.
    pub fn new(status: StatusCode, error_type: &'static str, message: impl Into<String>) -> Self {
        ApiError {
            status,
            message: message.into(),
            error_type,
            param: None,
            code: None,
        }
    }

    /// The same error with a machine-readable code.
    pub fn with_code(mut self, code: &'static str) -> Self {
        self.code = Some(code);
        self
    }

    /// A 400 `invalid_request_error` about `param` (if any).
    pub fn bad_request(message: impl Into<String>, param: Option<&str>) -> Self {
        ApiError {
            param: param.map(str::to_owned),
            ..ApiError::new(StatusCode::BAD_REQUEST, "invalid_request_error", message)
        }
    }

    /// A 401 for a missing or wrong API key.
    pub fn unauthorized() -> Self {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "invalid_request_error",
            "missing or incorrect API key: send `Authorization: Bearer <key>`",
        )
        .with_code("invalid_api_key")
    }

    /// A 403: the request's origin or host is not allowed.
    pub fn forbidden(message: impl Into<String>) -> Self {
        ApiError::new(StatusCode::FORBIDDEN, "permission_error", message).with_code("forbidden")
    }

    /// A 404 for a model this server does not serve.
    pub fn model_not_found(requested: &str, served: &str) -> Self {
        ApiError {
            param: Some("model".into()),
            ..ApiError::new(
                StatusCode::NOT_FOUND,
                "invalid_request_error",
                format!("The model `{requested}` does not exist; this server serves `{served}`."),
            )
            .with_code("model_not_found")
        }
    }

    /// A 408: the body did not arrive in time.
    pub fn request_timeout(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::REQUEST_TIMEOUT,
            "invalid_request_error",
            message,
        )
        .with_code("request_timeout")
    }

    /// A 413: the body is larger than `max_bytes`.
    pub fn payload_too_large(max_bytes: usize) -> Self {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body is too large: the limit is {max_bytes} bytes"),
        )
        .with_code("request_too_large")
    }

    /// A 415: the body is not declared JSON (`what` says what it was declared as).
    pub fn unsupported_media_type(what: String) -> Self {
        ApiError::new(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "invalid_request_error",
            format!("the request body must be JSON, sent as `Content-Type: application/json` (got {what})"),
        )
        .with_code("unsupported_media_type")
    }

    /// A 500 for a failure of the server itself (never for load or a bad request).
    pub fn internal(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal_server_error",
            message,
        )
    }

    /// A 503 while the engine is shutting down, or the server is at its connection limit.
    pub fn unavailable(message: impl Into<String>) -> Self {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "service_unavailable",
            message,
        )
    }

    /// An error for any other `status` (a 405 from routing, say), with a message from its
    /// reason phrase when `message` is empty.
    pub fn for_status(status: StatusCode, message: impl Into<String>) -> Self {
        let message = message.into();
        let message = if message.is_empty() {
            status.canonical_reason().unwrap_or("error").to_lowercase()
        } else {
            message
        };
        let error_type = if status.is_server_error() {
            "internal_server_error"
        } else {
            "invalid_request_error"
        };
        ApiError::new(status, error_type, message)
    }

    /// Maps an engine refusal: request-level problems are 400s naming the field when known.
    pub fn from_engine(error: &EngineError) -> Self {
        match error {
            EngineError::Sampling(e) if e.is_parameter_error() => {
                ApiError::bad_request(e.to_string(), e.field())
            }
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
        let challenge = self.status == StatusCode::UNAUTHORIZED;
        let mut response = (self.status, axum::Json(self.body())).into_response();
        if challenge {
            response
                .headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
        }
        response
    }
}
