//! Accepting and serving connections: HTTP/1.1 through hyper, with the server's timeouts and a
//! cap on open connections.
//!
//! - **Keep-alive (idle) timeout**: a connection that sends no byte of a request within it —
//!   after being accepted, or after its previous response — is closed.
//! - **Header-read timeout**: a request head must be complete within it, counted from the same
//!   moment (so a slow head gets longer than an idle connection, but not forever).
//! - **Body-read timeout**: enforced where bodies are read (`json_body`), answered with a 408.
//! - **Write-stall timeout**: a response write that makes no progress (the client stopped
//!   reading) fails the connection, which aborts its request.
//! - **Connection limit**: one connection over it is answered 503 (OpenAI body) and closed, so
//!   the file table never fills and the server keeps answering.
//!
//! Half-closed clients (`shutdown(SHUT_WR)` after the request) still get their answer.

mod io;
mod timer;

use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use hyper_util::rt::TokioIo;
use hyper_util::service::TowerToHyperService;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, OwnedSemaphorePermit, Semaphore};

use crate::api_error::ApiError;
use io::{ConnIo, ReadActivity};
use timer::IdleAwareTimer;

/// Connections the server reserves file descriptors for beyond its connection limit (model
/// files, logs, the engine's own needs).
const RESERVED_FDS: usize = 256;
/// Refusals (503 then close) in flight at once; a flood beyond this is dropped unanswered.
const MAX_CONCURRENT_REFUSALS: usize = 64;
/// How long writing a refusal may take.
const REFUSAL_TIMEOUT: Duration = Duration::from_secs(1);
/// Pause after a failed `accept` (e.g. out of file descriptors) before trying again.
const ACCEPT_ERROR_PAUSE: Duration = Duration::from_millis(50);

/// Per-connection and per-request limits of the HTTP server.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// Most connections open at once; one more is answered 503 and closed.
    pub max_connections: usize,
    /// How long a connection may wait without a byte of a new request before it is closed.
    pub keep_alive_timeout: Duration,
    /// How long a request head may take to arrive in full, from when the connection is ready
    /// for it (accepted, or its previous response sent).
    pub header_read_timeout: Duration,
    /// How long a request body may take to arrive in full once its head is in; then 408.
    pub body_read_timeout: Duration,
    /// How long writing a response may make no progress before the connection is dropped.
    pub write_stall_timeout: Duration,
    /// Largest request body accepted; larger ones get 413.
    pub max_body_bytes: usize,
}

impl Default for ConnectionLimits {
    /// uvicorn's (so vLLM's) 5-second keep-alive, nginx-like header/body/write allowances, a 2 MiB
    /// body limit and the process's file limit less a reserve.
    fn default() -> Self {
        ConnectionLimits {
            max_connections: default_max_connections(),
            keep_alive_timeout: Duration::from_secs(5),
            header_read_timeout: Duration::from_secs(10),
            body_read_timeout: Duration::from_secs(30),
            write_stall_timeout: Duration::from_secs(60),
            max_body_bytes: 2 << 20,
        }
    }
}

/// The soft open-file limit less [`RESERVED_FDS`] (at least 16), or 1024 where it is unknown.
pub fn default_max_connections() -> usize {
    match open_file_limit() {
        Some(limit) => limit.saturating_sub(RESERVED_FDS).max(16),
        None => 1024,
    }
}

/// The soft limit on open files (`RLIMIT_NOFILE`), when there is a finite one.
#[cfg(unix)]
fn open_file_limit() -> Option<usize> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit only writes the struct it is given, which lives for the call.
    let status = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) };
    if status != 0 || limit.rlim_cur == libc::RLIM_INFINITY {
        return None;
    }
    usize::try_from(limit.rlim_cur).ok()
}

#[cfg(not(unix))]
fn open_file_limit() -> Option<usize> {
    None
}

/// Accepts connections on `listener` and serves `app` on each until `draining` turns true; then
/// stops accepting, lets every open connection finish its request and returns.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    app: Router,
    limits: ConnectionLimits,
    mut draining: watch::Receiver<bool>,
) {
    let slots = Arc::new(Semaphore::new(limits.max_connections));
    let refusals = Arc::new(Semaphore::new(MAX_CONCURRENT_REFUSALS));
    // Every connection task holds a receiver; `closed()` resolves when all are gone.
    let (open_tx, open_rx) = watch::channel(());
    loop {
        let accepted = tokio::select! {
            accepted = listener.accept() => accepted,
            _ = draining.wait_for(|d| *d) => break,
        };
        let stream = match accepted {
            Ok((stream, _peer)) => stream,
            Err(e) => {
                // Out of descriptors or a connection reset before accept: keep serving.
                tracing::warn!("accept failed: {e}");
                tokio::time::sleep(ACCEPT_ERROR_PAUSE).await;
                continue;
            }
        };
        match slots.clone().try_acquire_owned() {
            Ok(slot) => {
                let connection = Connection {
                    app: app.clone(),
                    limits,
                    draining: draining.clone(),
                    _slot: slot,
                    _open: open_rx.clone(),
                };
                tokio::spawn(connection.serve(stream));
            }
            Err(_) => {
                if let Ok(permit) = refusals.clone().try_acquire_owned() {
                    tokio::spawn(refuse(stream, limits.max_connections, permit));
                }
            }
        }
    }
    drop(open_rx);
    drop(listener);
    open_tx.closed().await;
}

/// One accepted connection and what it holds while it lives.
struct Connection {
    app: Router,
    limits: ConnectionLimits,
    draining: watch::Receiver<bool>,
    _slot: OwnedSemaphorePermit,
    _open: watch::Receiver<()>,
}

impl Connection {
    async fn serve(mut self, stream: TcpStream) {
        if let Err(e) = stream.set_nodelay(true) {
            tracing::debug!("TCP_NODELAY: {e}");
        }
        let activity = Arc::new(ReadActivity::default());
        let io = TokioIo::new(ConnIo::new(
            stream,
            activity.clone(),
            self.limits.write_stall_timeout,
        ));
        let mut builder = hyper::server::conn::http1::Builder::new();
        builder
            .timer(IdleAwareTimer::new(
                activity,
                self.limits.keep_alive_timeout,
            ))
            .header_read_timeout(self.limits.header_read_timeout)
            .half_close(true)
            .keep_alive(true);
        let service = TowerToHyperService::new(self.app.clone());
        let connection = builder.serve_connection(io, service);
        tokio::pin!(connection);
        let mut drain_started = false;
        loop {
            tokio::select! {
                result = connection.as_mut() => {
                    if let Err(e) = result {
                        tracing::debug!("connection ended: {e}");
                    }
                    return;
                }
                _ = self.draining.wait_for(|d| *d), if !drain_started => {
                    drain_started = true;
                    connection.as_mut().graceful_shutdown();
                }
            }
        }
    }
}

/// Answers a connection over the limit with a 503 and closes it. The request is read and
/// dropped until the client closes (bounded): closing with unread bytes would send a reset,
/// which can destroy the answer before the client reads it.
async fn refuse(mut stream: TcpStream, max_connections: usize, _permit: OwnedSemaphorePermit) {
    let error = ApiError::unavailable(format!(
        "too many connections: the server is at its limit of {max_connections}; retry shortly"
    ));
    let body = serde_json::to_string(&error.body()).unwrap_or_default();
    let response = format!(
        "HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\n\
         content-length: {}\r\nretry-after: 1\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    let exchange = async {
        stream.write_all(response.as_bytes()).await?;
        stream.shutdown().await?;
        let mut sink = [0u8; 1024];
        while stream.read(&mut sink).await? > 0 {}
        Ok::<(), std::io::Error>(())
    };
    match tokio::time::timeout(REFUSAL_TIMEOUT, exchange).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => tracing::debug!("refusing a connection: {e}"),
        Err(_) => tracing::debug!("refusing a connection: the client did not close"),
    }
}
