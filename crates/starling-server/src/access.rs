//! Who may use the server: API keys (vLLM's `--api-key` / `VLLM_API_KEY` semantics), browser
//! origins (CORS) and `Host` headers (DNS rebinding).
//!
//! - **API keys.** When any is set, every path under `/v1` needs `Authorization: Bearer <key>`,
//!   as in vLLM's `AuthenticationMiddleware`: `/health`, `/metrics`, `/tokenize`, `/detokenize`
//!   and CORS preflights (`OPTIONS`) stay open. Keys are compared as SHA-256 digests in constant
//!   time, so neither their content nor their length leaks through timing.
//! - **Origins.** A browser sends `Origin` on cross-origin requests. One that is not the
//!   server's own origin must be in `--allowed-origins` (`*` allows any, vLLM's default);
//!   otherwise it gets a 403 — a web page cannot make a local server generate. Allowed origins
//!   get CORS headers, and their preflights a 204.
//! - **Hosts.** With `--allowed-hosts`, a `Host` header outside the list gets a 403: a page that
//!   rebinds its own domain to 127.0.0.1 sends its own name as `Host`.

use axum::extract::{Request, State};
use axum::http::header::{self, HeaderMap, HeaderValue};
use axum::http::{Method, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use sha2::{Digest, Sha256};

use crate::api_error::ApiError;

/// Paths under this prefix need the API key (vLLM's rule).
const GUARDED_PREFIX: &str = "/v1";
/// How long browsers may cache a preflight answer, seconds.
const PREFLIGHT_MAX_AGE_S: u32 = 600;

/// Which browser origins may call the server.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum AllowedOrigins {
    /// None but the server's own (the default).
    #[default]
    SameOriginOnly,
    /// Any origin (`*`, vLLM's default).
    Any,
    /// These origins (`scheme://host[:port]`, compared without case).
    List(Vec<String>),
}

/// The server's access rules; the default lets every client in without a key and refuses
/// cross-origin browser requests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AccessPolicy {
    api_key_digests: Vec<[u8; 32]>,
    origins: AllowedOrigins,
    hosts: Option<Vec<String>>,
}

impl AccessPolicy {
    /// Rules from the command-line values: keys (empty: no key needed; empty strings are
    /// ignored), origins (`*` for any) and hosts (empty: any; names or `name:port`).
    pub fn new(api_keys: &[String], allowed_origins: &[String], allowed_hosts: &[String]) -> Self {
        let origins = if allowed_origins.iter().any(|o| o.trim() == "*") {
            AllowedOrigins::Any
        } else if allowed_origins.is_empty() {
            AllowedOrigins::SameOriginOnly
        } else {
            AllowedOrigins::List(
                allowed_origins
                    .iter()
                    .map(|o| normalize_origin(o))
                    .collect(),
            )
        };
        let hosts = (!allowed_hosts.is_empty()).then(|| {
            allowed_hosts
                .iter()
                .map(|h| h.trim().to_ascii_lowercase())
                .collect()
        });
        AccessPolicy {
            api_key_digests: api_keys
                .iter()
                .filter(|k| !k.is_empty())
                .map(|k| digest(k))
                .collect(),
            origins,
            hosts,
        }
    }

    /// Whether a key is needed on `/v1`.
    pub fn requires_api_key(&self) -> bool {
        !self.api_key_digests.is_empty()
    }

    /// Checks the request's `Host`, then its `Origin` and key; `Ok` carries the origin to echo
    /// in CORS headers, if any.
    fn check(
        &self,
        method: &Method,
        path: &str,
        headers: &HeaderMap,
    ) -> Result<Option<HeaderValue>, ApiError> {
        let host = headers
            .get(header::HOST)
            .and_then(|h| h.to_str().ok())
            .unwrap_or_default();
        if let Some(hosts) = &self.hosts {
            if !host_allowed(hosts, host) {
                return Err(ApiError::forbidden(
                    "the Host header names a host this server does not serve (see --allowed-hosts)",
                ));
            }
        }
        let cors_origin = match headers.get(header::ORIGIN) {
            None => None,
            Some(origin) => {
                let text = origin.to_str().unwrap_or_default();
                if is_same_origin(text, host) {
                    None
                } else if self.origin_allowed(text) {
                    Some(origin.clone())
                } else {
                    return Err(ApiError::forbidden(
                        "cross-origin requests from this origin are not allowed (see \
                         --allowed-origins)",
                    ));
                }
            }
        };
        if *method != Method::OPTIONS && path.starts_with(GUARDED_PREFIX) && self.requires_api_key()
        {
            let presented = headers
                .get(header::AUTHORIZATION)
                .and_then(|h| h.to_str().ok())
                .and_then(bearer_token);
            let accepted = presented.is_some_and(|key| {
                let presented = digest(key);
                // Every digest is compared, so timing says nothing about which one matched.
                self.api_key_digests
                    .iter()
                    .fold(false, |ok, d| ok | constant_time_eq(d, &presented))
            });
            if !accepted {
                return Err(ApiError::unauthorized());
            }
        }
        Ok(cors_origin)
    }

    fn origin_allowed(&self, origin: &str) -> bool {
        match &self.origins {
            AllowedOrigins::SameOriginOnly => false,
            AllowedOrigins::Any => true,
            AllowedOrigins::List(list) => {
                let origin = normalize_origin(origin);
                list.contains(&origin)
            }
        }
    }
}

/// The middleware enforcing `policy` on every request (routes and 404s alike).
pub async fn enforce(
    State(policy): State<std::sync::Arc<AccessPolicy>>,
    request: Request,
    next: Next,
) -> Response {
    let cors_origin = match policy.check(request.method(), request.uri().path(), request.headers())
    {
        Ok(origin) => origin,
        Err(error) => return error.into_response(),
    };
    let Some(origin) = cors_origin else {
        return next.run(request).await;
    };
    if request.method() == Method::OPTIONS {
        return preflight(&origin, request.headers());
    }
    let mut response = next.run(request).await;
    let headers = response.headers_mut();
    headers.insert(header::ACCESS_CONTROL_ALLOW_ORIGIN, origin);
    headers.append(header::VARY, HeaderValue::from_static("origin"));
    response
}

/// A CORS preflight's answer for an allowed origin.
fn preflight(origin: &HeaderValue, request_headers: &HeaderMap) -> Response {
    let allow_headers = request_headers
        .get(header::ACCESS_CONTROL_REQUEST_HEADERS)
        .cloned()
        .unwrap_or_else(|| HeaderValue::from_static("authorization, content-type"));
    (
        StatusCode::NO_CONTENT,
        [
            (header::ACCESS_CONTROL_ALLOW_ORIGIN, origin.clone()),
            (
                header::ACCESS_CONTROL_ALLOW_METHODS,
                HeaderValue::from_static("GET, POST, OPTIONS"),
            ),
            (header::ACCESS_CONTROL_ALLOW_HEADERS, allow_headers),
            (
                header::ACCESS_CONTROL_MAX_AGE,
                HeaderValue::from(PREFLIGHT_MAX_AGE_S),
            ),
            (header::VARY, HeaderValue::from_static("origin")),
        ],
    )
        .into_response()
}

fn digest(key: &str) -> [u8; 32] {
    Sha256::digest(key.as_bytes()).into()
}

fn constant_time_eq(a: &[u8; 32], b: &[u8; 32]) -> bool {
    a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The token of `Bearer <token>` (scheme without case, as vLLM reads it).
fn bearer_token(value: &str) -> Option<&str> {
    let (scheme, token) = value.split_once(' ')?;
    scheme.eq_ignore_ascii_case("bearer").then_some(token)
}

/// `scheme://host[:port]` lower-cased, without a trailing slash.
fn normalize_origin(origin: &str) -> String {
    origin.trim().trim_end_matches('/').to_ascii_lowercase()
}

/// Whether `origin` is `http(s)://` followed by exactly the request's `Host`.
fn is_same_origin(origin: &str, host: &str) -> bool {
    let origin = normalize_origin(origin);
    let host = host.to_ascii_lowercase();
    !host.is_empty()
        && ["http://", "https://"]
            .iter()
            .any(|scheme| origin.strip_prefix(scheme) == Some(host.as_str()))
}

/// Whether `host` (a `Host` header: `name`, `name:port`, `[v6]:port`) is in `allowed`, whose
/// entries match the name alone or the name with its port.
fn host_allowed(allowed: &[String], host: &str) -> bool {
    let host = host.trim().to_ascii_lowercase();
    let name = host_name(&host);
    allowed.iter().any(|a| *a == host || *a == name)
}

/// The name part of a `Host` value.
fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        // [::1]:8000 → ::1 (allowed lists may write it with or without brackets).
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.bytes().all(|b| b.is_ascii_digit()) => name,
        _ => host,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn headers(pairs: &[(&'static str, &str)]) -> HeaderMap {
        let mut map = HeaderMap::new();
        for (name, value) in pairs {
            map.insert(*name, HeaderValue::from_str(value).unwrap());
        }
        map
    }

    #[test]
    fn keys_guard_v1_only_and_compare_exactly() {
        let policy = AccessPolicy::new(&["k1".into(), "".into()], &[], &[]);
        let get = Method::GET;
        assert!(policy.check(&get, "/v1/models", &headers(&[])).is_err());
        assert!(policy.check(&get, "/health", &headers(&[])).is_ok());
        assert!(policy
            .check(&Method::OPTIONS, "/v1/models", &headers(&[]))
            .is_ok());
        for (value, ok) in [
            ("Bearer k1", true),
            ("BEARER k1", true),
            ("Bearer k", false),
            ("Bearer k1 ", false),
            ("k1", false),
            ("Bearer  k1", false),
        ] {
            let result = policy.check(&get, "/v1/models", &headers(&[("authorization", value)]));
            assert_eq!(result.is_ok(), ok, "{value:?}");
        }
        // An empty key is no key.
        assert!(!AccessPolicy::new(&["".into()], &[], &[]).requires_api_key());
    }

    #[test]
    fn hosts_match_with_or_without_port() {
        let allowed = vec![
            "localhost".to_owned(),
            "127.0.0.1".to_owned(),
            "::1".to_owned(),
            "api.example:443".to_owned(),
        ];
        for (host, ok) in [
            ("localhost:8000", true),
            ("LOCALHOST", true),
            ("127.0.0.1:1", true),
            ("[::1]:8000", true),
            ("api.example:443", true),
            ("api.example:80", false),
            ("evil.example:8000", false),
            ("", false),
        ] {
            assert_eq!(host_allowed(&allowed, host), ok, "{host:?}");
        }
    }

    #[test]
    fn same_origin_is_not_cross_origin() {
        assert!(is_same_origin("http://127.0.0.1:8000", "127.0.0.1:8000"));
        assert!(is_same_origin("https://LocalHost:1/", "localhost:1"));
        assert!(!is_same_origin("http://127.0.0.1:8001", "127.0.0.1:8000"));
        assert!(!is_same_origin("null", ""));
        let policy = AccessPolicy::new(&[], &["https://App.Example/".into()], &[]);
        assert!(policy.origin_allowed("https://app.example"));
        assert!(!policy.origin_allowed("https://app.example.evil"));
        assert!(AccessPolicy::new(&[], &["*".into()], &[]).origin_allowed("null"));
    }
}
