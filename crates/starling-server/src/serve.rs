//! Running the router until a shutdown signal, then draining.

use std::future::Future;
use std::time::Duration;

use tokio::net::TcpListener;

use crate::engine_thread::ServerError;
use crate::routes::router;
use crate::state::AppState;

/// How shutdown behaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServeOptions {
    /// After the signal, how long in-flight requests may run before they are aborted (their
    /// streams then end with finish reason `abort`).
    pub shutdown_grace: Duration,
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            shutdown_grace: Duration::from_secs(30),
        }
    }
}

/// Serves `state` on `listener` until `shutdown` resolves; then stops accepting, lets in-flight
/// requests finish (aborting them after the grace period), and stops the engine thread.
pub async fn serve(
    listener: TcpListener,
    state: AppState,
    shutdown: impl Future<Output = ()> + Send + 'static,
    options: ServeOptions,
) -> Result<(), ServerError> {
    let engine = state.engine.clone();
    let grace_engine = engine.clone();
    let on_signal = async move {
        shutdown.await;
        tracing::info!(
            "shutting down: no new connections; in-flight requests get {:?}",
            options.shutdown_grace
        );
        tokio::spawn(async move {
            tokio::time::sleep(options.shutdown_grace).await;
            grace_engine.abort_all();
        });
    };
    axum::serve(listener, router(state))
        .with_graceful_shutdown(on_signal)
        .await?;
    // Joining the engine thread blocks; keep it off the async workers.
    tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .map_err(|e| ServerError::ThreadStart(format!("stopping the engine thread: {e}")))?;
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM.
pub async fn termination_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::error!("cannot listen for Ctrl-C: {e}");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let terminate = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut signal) => {
                signal.recv().await;
            }
            Err(e) => {
                tracing::error!("cannot listen for SIGTERM: {e}");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let terminate = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {},
        () = terminate => {},
    }
}
