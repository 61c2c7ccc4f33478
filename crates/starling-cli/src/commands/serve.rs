//! `starling serve`: the OpenAI-compatible HTTP server.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use starling_models::chat::ChatTemplate;
use starling_server::{AppState, EngineHandle, ModelInfo, ServeOptions};

use crate::args::{EngineArgs, ModelArg};
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;
use starling_backend::Backend;

/// `starling serve` flags (vLLM's names).
#[derive(Args, Debug)]
pub struct ServeArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// Port to listen on (0 picks a free one, printed at start).
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The model name clients use; default: the --model argument.
    #[arg(long)]
    served_model_name: Option<String>,
    /// After SIGTERM/SIGINT, seconds in-flight requests may run before they are aborted.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `starling serve` until SIGINT/SIGTERM.
pub fn run(args: ServeArgs) -> Result<()> {
    with_backend(args.engine.device, args)
}

impl BackendJob for ServeArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        serve(backend, self)
    }
}

fn serve<B: Backend + 'static>(backend: B, args: ServeArgs) -> Result<()> {
    let session = open_session(backend, &args.model, &args.engine)?;
    let chat_template = match ChatTemplate::for_tokenizer(&session.tokenizer) {
        Ok(template) => Some(Arc::new(template)),
        Err(e) => {
            tracing::warn!("chat template unusable, /v1/chat/completions will refuse: {e}");
            None
        }
    };
    let model = ModelInfo {
        served_name: args
            .served_model_name
            .clone()
            .unwrap_or_else(|| args.model.model.clone()),
        root: session.path.display().to_string(),
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let tokenizer = session.tokenizer;
    let engine = session.engine;
    let handle = EngineHandle::spawn(move || Ok(engine))?;
    let info = handle.info();
    let state = AppState {
        engine: handle,
        tokenizer,
        chat_template,
        model: Arc::new(model),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        // The engine thread does the heavy work; HTTP needs little.
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    runtime.block_on(async move {
        let address = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("binding {address}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "serving {} on http://{local} (max_model_len {} tokens, {} KV blocks of {} tokens)",
            state.model.served_name,
            info.max_model_len_tokens,
            info.kv_blocks_total,
            info.block_size_tokens
        );
        let options = ServeOptions {
            shutdown_grace: Duration::from_secs(args.shutdown_grace_s),
        };
        starling_server::serve(
            listener,
            state,
            starling_server::termination_signal(),
            options,
        )
        .await
        .context("serving")
    })?;
    eprintln!("server stopped");
    Ok(())
}
