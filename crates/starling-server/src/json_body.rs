//! A JSON body extractor whose failures are OpenAI 400 errors (axum's own `Json` answers 422
//! with plain text, which OpenAI clients cannot parse).

use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use serde::de::DeserializeOwned;

use crate::api_error::ApiError;

/// The request body parsed as `T`; malformed JSON and wrong types become 400s.
#[derive(Debug)]
pub struct JsonBody<T>(pub T);

impl<T, S> FromRequest<S> for JsonBody<T>
where
    T: DeserializeOwned,
    S: Send + Sync,
{
    type Rejection = ApiError;

    async fn from_request(req: Request, state: &S) -> Result<Self, Self::Rejection> {
        let bytes = Bytes::from_request(req, state).await.map_err(|e| {
            ApiError::bad_request(format!("cannot read the request body: {e}"), None)
        })?;
        parse_json(&bytes).map(JsonBody)
    }
}

/// Parses `bytes` as `T`, telling malformed JSON apart from a well-formed body of the wrong shape.
pub fn parse_json<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let what = match e.classify() {
            serde_json::error::Category::Syntax | serde_json::error::Category::Eof => {
                "malformed JSON"
            }
            _ => "invalid request body",
        };
        ApiError::bad_request(format!("{what}: {e}"), None)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(serde::Deserialize, Debug)]
    struct Shape {
        #[allow(dead_code)]
        n: u32,
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
}
