//! `starling generate`: one prompt, streamed to stdout.

use std::io::Write;
use std::time::Instant;

use anyhow::{Context, Result};
use clap::Args;
use starling_engine::sampling::SamplingParams;
use starling_models::tokenizer::Tokenizer;

use crate::args::{EngineArgs, ModelArg};
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;
use starling_backend::Backend;

/// Sampling flags (OpenAI / vLLM semantics and defaults).
#[derive(Args, Debug, Clone)]
pub struct SamplingArgs {
    /// Most tokens to generate.
    #[arg(long, default_value_t = 128)]
    pub max_tokens: usize,
    /// Softmax temperature; 0 is greedy.
    #[arg(long, default_value_t = 1.0)]
    pub temperature: f32,
    /// Nucleus sampling mass.
    #[arg(long, default_value_t = 1.0)]
    pub top_p: f32,
    /// Keep only the k most likely tokens (0: off).
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    /// Drop tokens below min_p × the top probability.
    #[arg(long, default_value_t = 0.0)]
    pub min_p: f32,
    /// HF repetition penalty (1: off).
    #[arg(long, default_value_t = 1.0)]
    pub repetition_penalty: f32,
    /// OpenAI presence penalty.
    #[arg(long, default_value_t = 0.0)]
    pub presence_penalty: f32,
    /// OpenAI frequency penalty.
    #[arg(long, default_value_t = 0.0)]
    pub frequency_penalty: f32,
    /// Seed for reproducible sampling.
    #[arg(long)]
    pub seed: Option<u64>,
    /// Stop strings (repeatable).
    #[arg(long)]
    pub stop: Vec<String>,
    /// Keep going past the end-of-sequence token.
    #[arg(long)]
    pub ignore_eos: bool,
}

impl SamplingArgs {
    /// The request parameters these flags describe.
    pub fn to_params(&self) -> SamplingParams {
        SamplingParams {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: (self.top_k > 0).then_some(self.top_k),
            min_p: self.min_p,
            repetition_penalty: self.repetition_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            max_tokens: Some(self.max_tokens),
            stop: self.stop.clone(),
            ignore_eos: self.ignore_eos,
            ..SamplingParams::default()
        }
    }
}

/// `starling generate` flags.
#[derive(Args, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    model: ModelArg,
    /// The prompt.
    #[arg(long, short = 'p')]
    prompt: String,
    /// Wrap the prompt as a user message in the model's chat template.
    #[arg(long)]
    chat: bool,
    /// System message (with --chat).
    #[arg(long, requires = "chat")]
    system: Option<String>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Encodes `prompt`, rendering it through the chat template first when `chat` is set.
pub fn encode_prompt(
    tokenizer: &Tokenizer,
    prompt: &str,
    chat: bool,
    system: Option<&str>,
) -> Result<Vec<u32>> {
    if !chat {
        return Ok(tokenizer.encode(prompt, true)?);
    }
    let mut messages = Vec::new();
    if let Some(system) = system {
        messages.push(starling_models::chat::ChatMessage::new("system", system));
    }
    messages.push(starling_models::chat::ChatMessage::new("user", prompt));
    let template = starling_models::chat::ChatTemplate::for_tokenizer(tokenizer)?;
    let text = template
        .render(&messages, true)
        .context("rendering the chat template")?;
    // The template already placed any BOS / special tokens.
    Ok(tokenizer.encode(&text, false)?)
}

/// Runs `starling generate`.
pub fn run(args: GenerateArgs) -> Result<()> {
    with_backend(args.engine.device, args)
}

impl BackendJob for GenerateArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        generate(backend, self)
    }
}

fn generate<B: Backend + 'static>(backend: B, args: GenerateArgs) -> Result<()> {
    let mut session = open_session(backend, &args.model, &args.engine)?;
    let ids = encode_prompt(
        &session.tokenizer,
        &args.prompt,
        args.chat,
        args.system.as_deref(),
    )?;
    let started = Instant::now();
    let id = session
        .engine
        .add_request(ids.clone(), args.sampling.to_params())?;
    let mut stdout = std::io::stdout().lock();
    if !args.chat {
        write!(stdout, "{}", args.prompt)?;
    }
    let mut first_token_ms = None;
    let mut generated = 0usize;
    let mut finish = None;
    while session.engine.has_unfinished() {
        for out in session.engine.step()? {
            if out.seq_id != id {
                continue;
            }
            if let Some(failure) = &out.error {
                anyhow::bail!("{}", failure.message);
            }
            if out.token_id.is_some() {
                generated += 1;
                first_token_ms.get_or_insert(started.elapsed().as_secs_f64() * 1e3);
            }
            write!(stdout, "{}", out.text_delta)?;
            stdout.flush()?;
            if let Some(f) = out.finished {
                finish = Some(f);
            }
        }
    }
    writeln!(stdout)?;
    let total_ms = started.elapsed().as_secs_f64() * 1e3;
    let ttft = first_token_ms.unwrap_or(total_ms);
    let decode_tps = if generated > 1 {
        (generated - 1) as f64 / ((total_ms - ttft) / 1e3)
    } else {
        0.0
    };
    eprintln!(
        "[{} prompt tokens, {} generated, finish: {}; TTFT {:.0} ms, decode {:.1} tokens/s, model loaded in {} ms]",
        ids.len(),
        generated,
        finish.map_or("none".to_string(), |f| format!(
            "{}{}",
            f.reason.as_str(),
            f.stop_match.map_or(String::new(), |m| format!(" ({m:?})"))
        )),
        ttft,
        decode_tps,
        session.load_ms
    );
    Ok(())
}
