//! Running the router until a shutdown signal, then draining; a second signal forces the end.

use std::future::Future;

use tokio::net::TcpListener;
use tokio::sync::watch;

use crate::connection::accept_loop;
use crate::engine_thread::ServerError;
use crate::routes::router;
use crate::serve_options::ServeOptions;
use crate::state::AppState;

/// Serves `state` on `listener` until the first future `signals` makes resolves; then stops
/// accepting, lets in-flight requests finish (aborting them after the grace period), stops the
/// engine thread and returns `Ok`. If the second future `signals` makes resolves before the
/// drain is over, returns [`ServerError::ForcedShutdown`] at once (the caller should exit).
pub async fn serve<S, F>(
    listener: TcpListener,
    state: AppState,
    mut signals: S,
    options: ServeOptions,
) -> Result<(), ServerError>
where
    S: FnMut() -> F,
    F: Future<Output = ()> + Send + 'static,
{
    let engine = state.engine.clone();
    let app = router(state, &options);
    let (draining_tx, draining_rx) = watch::channel(false);
    let accepting = accept_loop(listener, app, options.limits, draining_rx);
    tokio::pin!(accepting);
    let first = signals();
    tokio::select! {
        () = &mut accepting => {}
        () = first => {
            tracing::info!(
                "shutting down: no new connections; in-flight requests get {:?} (a second signal \
                 forces exit)",
                options.shutdown_grace
            );
            let _ = draining_tx.send(true);
            let grace_engine = engine.clone();
            let grace = options.shutdown_grace;
            tokio::spawn(async move {
                tokio::time::sleep(grace).await;
                grace_engine.abort_all();
            });
            let second = signals();
            tokio::select! {
                () = &mut accepting => {}
                () = second => {
                    tracing::warn!("second signal: forcing exit without draining");
                    engine.abort_all();
                    return Err(ServerError::ForcedShutdown);
                }
            }
        }
    }
    // Joining the engine thread blocks; keep it off the async workers.
    tokio::task::spawn_blocking(move || engine.shutdown())
        .await
        .map_err(|e| ServerError::ThreadStart(format!("stopping the engine thread: {e}")))?;
    Ok(())
}

/// Resolves on SIGINT (Ctrl-C) or, on Unix, SIGTERM. Each call waits for a new signal, so
/// [`serve`] can take this function itself as its `signals`.
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
