//! `starling serve`: the OpenAI-compatible HTTP server.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use clap::Args;
use starling_models::chat::ChatTemplate;
use starling_server::{
    AccessPolicy, AppState, ConnectionLimits, EngineHandle, ModelInfo, ServeOptions, ServerError,
};

use crate::args::{EngineArgs, ModelArg};
use crate::bytes::parse_bytes;
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;
use starling_backend::Backend;

/// The environment variable vLLM reads an API key from when `--api-key` is not given.
const API_KEY_ENV: &str = "VLLM_API_KEY";
/// Exit status after a forced shutdown (128 + SIGINT, as a shell reports an interrupted job).
const FORCED_EXIT_CODE: i32 = 130;

/// `starling serve` flags (vLLM's names where vLLM has the flag).
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
    /// The model name clients use; default: the --model alias, or the model file's (directory's)
    /// name — never its path.
    #[arg(long)]
    served_model_name: Option<String>,
    /// After SIGTERM/SIGINT, seconds in-flight requests may run before they are aborted; a
    /// second signal exits at once.
    #[arg(long, default_value_t = 30)]
    shutdown_grace_s: u64,
    /// API keys: every /v1 request must send `Authorization: Bearer <one of them>` (health,
    /// metrics and tokenize stay open, as in vLLM). Default: $VLLM_API_KEY, if set.
    #[arg(long, num_args = 1..)]
    api_key: Vec<String>,
    /// Browser origins allowed to call the server (`scheme://host:port`; `*` for any, vLLM's
    /// default). Default: none — cross-origin browser requests get 403.
    #[arg(long, num_args = 1..)]
    allowed_origins: Vec<String>,
    /// Host names (or name:port) the server answers to; others get 403, which stops DNS
    /// rebinding. Default: any.
    #[arg(long, num_args = 1..)]
    allowed_hosts: Vec<String>,
    /// Most connections open at once; more get 503. Default: the open-file limit less 256.
    #[arg(long)]
    max_connections: Option<usize>,
    /// Seconds an idle connection is kept open waiting for a request (vLLM's name).
    #[arg(long, default_value_t = 5.0)]
    timeout_keep_alive: f64,
    /// Seconds a request head may take to arrive.
    #[arg(long, default_value_t = 10.0)]
    header_read_timeout_s: f64,
    /// Seconds a request body may take to arrive (then 408).
    #[arg(long, default_value_t = 30.0)]
    body_read_timeout_s: f64,
    /// Seconds a response may wait on a client that reads nothing before it is dropped.
    #[arg(long, default_value_t = 60.0)]
    write_stall_timeout_s: f64,
    /// Largest request body (then 413), e.g. 2MiB.
    #[arg(long, value_parser = parse_bytes, default_value = "2MiB")]
    max_request_body: u64,
    /// Prompt tokens of the synthetic request run before the first client's (a full step and a
    /// decode step, then forgotten), so no client pays the device's first-use costs; 0 skips it.
    /// Default: one step's budget (--max-num-batched-tokens) on a GPU, 0 on the CPU.
    #[arg(long)]
    warm_up_tokens: Option<usize>,
    #[command(flatten)]
    engine: EngineArgs,
}

impl ServeArgs {
    /// The keys `--api-key` gives, else `$VLLM_API_KEY`'s (vLLM's precedence).
    fn api_keys(&self) -> Vec<String> {
        if !self.api_key.is_empty() {
            return self.api_key.clone();
        }
        std::env::var(API_KEY_ENV)
            .ok()
            .filter(|k| !k.is_empty())
            .into_iter()
            .collect()
    }

    fn options(&self) -> Result<ServeOptions> {
        let seconds = |value: f64, flag: &str| {
            Duration::try_from_secs_f64(value)
                .ok()
                .filter(|d| !d.is_zero())
                .with_context(|| format!("--{flag} must be a positive number of seconds"))
        };
        let defaults = ConnectionLimits::default();
        Ok(ServeOptions {
            shutdown_grace: Duration::from_secs(self.shutdown_grace_s),
            limits: ConnectionLimits {
                max_connections: self.max_connections.unwrap_or(defaults.max_connections),
                keep_alive_timeout: seconds(self.timeout_keep_alive, "timeout-keep-alive")?,
                header_read_timeout: seconds(self.header_read_timeout_s, "header-read-timeout-s")?,
                body_read_timeout: seconds(self.body_read_timeout_s, "body-read-timeout-s")?,
                write_stall_timeout: seconds(self.write_stall_timeout_s, "write-stall-timeout-s")?,
                max_body_bytes: usize::try_from(self.max_request_body)
                    .context("--max-request-body is too large")?,
            },
            access: AccessPolicy::new(&self.api_keys(), &self.allowed_origins, &self.allowed_hosts),
        })
    }
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

/// The name clients see by default: an alias as given, a path by its last component (without
/// `.gguf`), so no path on the server reaches a client.
fn default_served_name(model_arg: &str) -> String {
    let path = Path::new(model_arg);
    if path.components().count() <= 1 && !path.exists() {
        return model_arg.to_owned();
    }
    let name = if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"))
    {
        path.file_stem()
    } else {
        path.file_name()
    };
    name.map_or_else(|| "model".to_owned(), |n| n.to_string_lossy().into_owned())
}

fn serve<B: Backend + 'static>(backend: B, mut args: ServeArgs) -> Result<()> {
    let options = args.options()?;
    // vLLM serves with prefix caching unless told otherwise.
    args.engine.prefix_caching_by_default = true;
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
            .unwrap_or_else(|| default_served_name(&args.model.model)),
        created_unix_s: std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_secs()),
    };
    let tokenizer = session.tokenizer;
    let mut engine = session.engine;
    let warm_up_tokens = args
        .warm_up_tokens
        .unwrap_or_else(|| engine.default_warm_up_tokens());
    if warm_up_tokens > 0 {
        let w = engine
            .warm_up(warm_up_tokens)
            .context("warming up the engine (--warm-up-tokens 0 skips it)")?;
        eprintln!(
            "warm-up: {} prompt tokens in {} steps, {:.0} ms",
            w.prompt_tokens,
            w.steps,
            w.elapsed.as_secs_f64() * 1e3
        );
    }
    eprintln!(
        "prefix caching: {}",
        if engine.prefix_caching_enabled() {
            "on (--no-enable-prefix-caching turns it off)"
        } else {
            "off (--enable-prefix-caching turns it on)"
        }
    );
    let handle = EngineHandle::spawn(move || Ok(engine))?;
    let info = handle.info();
    // The layout it runs, its blocks and the longest context it boots: what an operator sizing
    // a deployment (or comparing a compressed one) needs first.
    eprintln!("KV cache: {}", handle.cache_report());
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
    let served = runtime.block_on(async move {
        let address = format!("{}:{}", args.host, args.port);
        let listener = tokio::net::TcpListener::bind(&address)
            .await
            .with_context(|| format!("binding {address}"))?;
        let local = listener.local_addr()?;
        eprintln!(
            "serving {} on http://{local} (max_model_len {} tokens, {} KV blocks of {} tokens{})",
            state.model.served_name,
            info.max_model_len_tokens,
            info.kv_blocks_total,
            info.block_size_tokens,
            if options.access.requires_api_key() {
                "; /v1 needs an API key"
            } else {
                ""
            }
        );
        Ok::<_, anyhow::Error>(
            starling_server::serve(
                listener,
                state,
                starling_server::termination_signal,
                options,
            )
            .await,
        )
    })?;
    match served {
        Ok(()) => {
            eprintln!("server stopped");
            Ok(())
        }
        Err(ServerError::ForcedShutdown) => {
            eprintln!("error: forced shutdown: a second signal arrived while draining");
            // In-flight requests and the engine thread are abandoned, not joined.
            std::process::exit(FORCED_EXIT_CODE);
        }
        Err(e) => Err(e).context("serving"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_names_never_hold_a_path() {
        assert_eq!(default_served_name("smollm2-135m"), "smollm2-135m");
        assert_eq!(
            default_served_name("/srv/models/Qwen2.5-7B.Q4_K.gguf"),
            "Qwen2.5-7B.Q4_K"
        );
        assert_eq!(default_served_name("./weights/llama-3-8b/"), "llama-3-8b");
        assert_eq!(default_served_name("/"), "model");
    }
}
