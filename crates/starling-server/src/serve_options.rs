//! [`ServeOptions`]: how the server accepts, limits and shuts down. A leaf module: the router
//! (`routes`) reads its limits and access policy, `serve` its drain, and neither imports the
//! other's module for it.

use std::time::Duration;

use crate::access::AccessPolicy;
use crate::connection::ConnectionLimits;

/// How the server accepts, limits and shuts down.
#[derive(Debug, Clone, PartialEq)]
pub struct ServeOptions {
    /// After the first signal, how long in-flight requests may run before they are aborted
    /// (their streams then end with finish reason `abort`).
    pub shutdown_grace: Duration,
    /// Timeouts, the connection limit and the body limit.
    pub limits: ConnectionLimits,
    /// API keys, allowed origins and hosts.
    pub access: AccessPolicy,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            shutdown_grace: Duration::from_secs(30),
            limits: ConnectionLimits::default(),
            access: AccessPolicy::default(),
        }
    }
}
