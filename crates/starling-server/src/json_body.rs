//! The JSON body extractor of every POST route, whose failures are OpenAI errors: axum's own
//! `Json` answers 422 with plain text, which OpenAI clients cannot parse.
//!
//! A body must be declared `application/json` (415 otherwise: a browser can send `text/plain`
//! across origins without asking first, never JSON), arrive within the body-read timeout (408)
//! and stay under the size limit (413; the rest of the body is read and dropped, bounded, so the
//! client sees the answer instead of a reset). Malformed JSON and bodies of the wrong shape are
//! 400s; a wrong field is named in `param`.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{header, HeaderMap};
use futures_util::StreamExt;
use serde::de::DeserializeOwned;

use crate::api_error::ApiError;

/// Most bytes of an oversized body read (and dropped) before its 413, so the client gets the
/// answer rather than a connection reset; beyond it the connection is just closed.
const OVERSIZE_DRAIN_BYTES: usize = 64 << 20;
/// Most top-level fields tried one by one to find the one at fault when the parser cannot say.
const MAX_FIELDS_PROBED: usize = 64;
/// Largest body for which that search is run (each try copies the body).
const MAX_PROBED_BODY_BYTES: usize = 64 << 10;

/// Body limits the router attaches to each request (as a request extension).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BodyLimits {
    /// Largest body accepted, bytes.
    pub max_bytes: usize,
    /// Time for the whole body to arrive once the head is in.
    pub read_timeout: Duration,
}

impl Default for BodyLimits {
    fn default() -> Self {
        let limits = crate::connection::ConnectionLimits::default();
        BodyLimits {
            max_bytes: limits.max_body_bytes,
            read_timeout: limits.body_read_timeout,
        }
    }
}

/// The request body parsed as `T`.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, _state: &S) -> Result<Self, Self::Rejection> {
        check_content_type(req.headers())?;
        let limits = req
            .extensions()
            .get::<BodyLimits>()
            .copied()
            .unwrap_or_default();
        let bytes = tokio::time::timeout(limits.read_timeout, read_body(req, limits.max_bytes))
            .await
            .map_err(|_| {
                ApiError::request_timeout(format!(
                    "the request body did not arrive within {:?}",
                    limits.read_timeout
                ))
            })??;
        parse_json(&bytes).map(JsonBody)
    }
}

/// 415 unless the body is declared JSON (`application/json` or `application/*+json`).
fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let declared = headers
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .unwrap_or_default();
    let essence = declared
        .split(';')
        .next()
        .unwrap_or_default()
        .trim()
        .to_ascii_lowercase();
    let is_json = essence == "application/json"
        || (essence.starts_with("application/") && essence.ends_with("+json"));
    if is_json {
        Ok(())
    } else {
        Err(ApiError::unsupported_media_type(if declared.is_empty() {
            "no Content-Type".to_owned()
        } else {
            format!("Content-Type `{declared}`")
        }))
    }
}

/// The whole body, or a 413 once it passes `max_bytes` (after draining what follows, bounded).
async fn read_body(req: Request, max_bytes: usize) -> Result<Bytes, ApiError> {
    let declared_len = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    let too_large = ApiError::payload_too_large(max_bytes);
    let mut stream = req.into_body().into_data_stream();
    if declared_len.is_some_and(|len| len > OVERSIZE_DRAIN_BYTES as u64) {
        // Not worth reading: answer and let the connection close.
        return Err(too_large);
    }
    let mut body =
        Vec::with_capacity(declared_len.map_or(0, |len| len.min(max_bytes as u64) as usize));
    let mut seen = 0usize;
    while let Some(chunk) = stream.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::bad_request(format!("cannot read the request body: {e}"), None)
        })?;
        seen = seen.saturating_add(chunk.len());
        if seen > OVERSIZE_DRAIN_BYTES {
            return Err(too_large);
        }
        if seen <= max_bytes {
            body.extend_from_slice(&chunk);
        }
    }
    if seen > max_bytes {
        return Err(too_large);
    }
    Ok(Bytes::from(body))
}

/// Parses `bytes` as `T`: malformed JSON and well-formed bodies of the wrong shape are 400s with
/// distinct messages; the latter name the top-level field at fault in `param`.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    let value: serde_json::Value = serde_json::from_slice(bytes)
        .map_err(|e| ApiError::bad_request(format!("malformed JSON: {e}"), None))?;
    match serde_path_to_error::deserialize::<_, T>(&value) {
        Ok(parsed) => Ok(parsed),
        Err(e) => {
            let path = e.path().to_string();
            let error = e.into_inner();
            let field = top_level_field(&path)
                .or_else(|| missing_field(&error))
                .or_else(|| {
                    (bytes.len() <= MAX_PROBED_BODY_BYTES)
                        .then(|| probe_fields::<T>(&value))
                        .flatten()
                });
            let message = match (&field, path.as_str()) {
                (_, ".") | (None, _) => format!("invalid request body: {error}"),
                (Some(_), path) => format!("invalid request body: {path}: {error}"),
            };
            Err(ApiError::bad_request(message, field.as_deref()))
        }
    }
}

/// The first segment of a `serde_path_to_error` path (`messages[0].content` → `messages`).
fn top_level_field(path: &str) -> Option<String> {
    let first = path.split(['.', '[']).next()?;
    (!first.is_empty() && first != "?").then(|| first.to_owned())
}

/// The field named by serde's "missing field `x`".
fn missing_field(error: &serde_json::Error) -> Option<String> {
    let text = error.to_string();
    let rest = text.strip_prefix("missing field `")?;
    Some(rest.split('`').next()?.to_owned())
}

/// For errors inside flattened fields (where the parser loses the path): the one top-level
/// field whose removal lets the body parse.
fn probe_fields<T: DeserializeOwned>(value: &serde_json::Value) -> Option<String> {
    let object = value.as_object()?;
    object
        .keys()
        .take(MAX_FIELDS_PROBED)
        .find(|key| {
            let mut without = object.clone();
            without.remove(key.as_str());
            serde_json::from_value::<T>(serde_json::Value::Object(without)).is_ok()
        })
        .cloned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Inner {
        #[allow(dead_code)]
        temperature: Option<f32>,
    }

    #[derive(serde::Deserialize, Debug)]
    struct Shape {
        #[allow(dead_code)]
        n: u32,
        #[allow(dead_code)]
        list: Option<Vec<u32>>,
        #[allow(dead_code)]
        #[serde(flatten)]
        inner: Inner,
    }

    #[test]
    fn syntax_and_type_errors_are_400_with_distinct_messages() {
        let syntax = parse_json::<Shape>(b"{\"n\": ").unwrap_err();
        assert_eq!(syntax.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(
            syntax.message.starts_with("malformed JSON"),
            "{}",
            syntax.message
        );
        let types = parse_json::<Shape>(b"{\"n\": \"three\"}").unwrap_err();
        assert_eq!(types.status, axum::http::StatusCode::BAD_REQUEST);
        assert!(
            types.message.starts_with("invalid request body"),
            "{}",
            types.message
        );
        assert!(parse_json::<Shape>(b"{\"n\": 3}").is_ok());
    }

    #[test]
    fn type_errors_name_the_field_even_inside_flattened_structs() {
        let cases: [(&[u8], &str); 4] = [
            (b"{\"n\": \"three\"}", "n"),
            (b"{\"n\": 1, \"list\": [1, \"x\"]}", "list"),
            (b"{\"n\": 1, \"temperature\": \"hot\"}", "temperature"),
            (b"{\"list\": []}", "n"),
        ];
        for (body, field) in cases {
            let error = parse_json::<Shape>(body).unwrap_err();
            assert_eq!(error.param.as_deref(), Some(field), "{}", error.message);
        }
    }

    #[test]
    fn only_json_content_types_pass() {
        for (value, ok) in [
            ("application/json", true),
            ("Application/JSON; charset=utf-8", true),
            ("application/vnd.api+json", true),
            ("text/plain", false),
            ("application/x-www-form-urlencoded", false),
            ("", false),
        ] {
            let mut headers = HeaderMap::new();
            if !value.is_empty() {
                headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
            }
            assert_eq!(check_content_type(&headers).is_ok(), ok, "{value:?}");
        }
    }
}
