//! `starling demo`: the README's main job. A few chat prompts go through the engine together
//! (continuous batching), then the answers and the KV-cache figures are printed.

use std::collections::HashMap;
use std::time::Instant;

use anyhow::Result;
use clap::Args;
use starling_engine::sampling::SamplingParams;
use starling_kv::format_bytes;

use crate::args::{EngineArgs, ModelArg};
use crate::commands::generate::encode_prompt;
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;
use starling_backend::Backend;

const PROMPTS: [&str; 4] = [
    "What is the capital of France?",
    "Write a haiku about the sea.",
    "In one sentence, why do language models cache keys and values?",
    "Name three primary colors.",
];

/// `starling demo` flags.
#[derive(Args, Debug)]
pub struct DemoArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Most tokens per answer.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    #[command(flatten)]
    engine: EngineArgs,
}

/// Runs `starling demo`.
pub fn run(args: DemoArgs) -> Result<()> {
    with_backend(args.engine.device, args)
}

impl BackendJob for DemoArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        demo(backend, self)
    }
}

fn demo<B: Backend + 'static>(backend: B, args: DemoArgs) -> Result<()> {
    let mut session = open_session(backend, &args.model, &args.engine)?;
    println!("device: {}", session.engine.backend_name());
    println!(
        "model: {} (loaded in {} ms)",
        session.path.display(),
        session.load_ms
    );
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(args.max_tokens),
        ..SamplingParams::default()
    };
    let mut order = Vec::new();
    let mut answers = HashMap::new();
    let started = Instant::now();
    for prompt in PROMPTS {
        let ids = encode_prompt(&session, prompt, true, None)?;
        let id = session.engine.add_request(ids, params.clone())?;
        order.push((id, prompt));
        answers.insert(id, String::new());
    }
    let (mut peak_blocks, mut peak_batch, mut generated) = (0usize, 0usize, 0usize);
    while session.engine.has_unfinished() {
        for out in session.engine.step()? {
            if let Some(failure) = &out.error {
                anyhow::bail!("{}", failure.message);
            }
            generated += usize::from(out.token_id.is_some());
            if let Some(text) = answers.get_mut(&out.seq_id) {
                text.push_str(&out.text_delta);
            }
        }
        if let Some(step) = session.engine.stats().last_step {
            peak_blocks = peak_blocks.max(step.num_blocks_in_use);
            peak_batch = peak_batch.max(step.batch_size);
        }
    }
    let elapsed_s = started.elapsed().as_secs_f64();
    for (id, prompt) in &order {
        println!("\n> {prompt}\n{}", answers[id].trim());
    }
    let pf = session.engine.preflight();
    let stats = session.engine.stats();
    let max_len = pf.sizing.capacity_tokens() as f64 / pf.max_concurrency.max(f64::MIN_POSITIVE);
    println!(
        "\nKV cache: {} budget, {} per token → {} blocks × {} tokens ({} tokens); max concurrency {:.2} at {:.0} tokens; peak use {} blocks ({:.2}%), peak batch {}, preemptions {}",
        format_bytes(pf.sizing.total_bytes()),
        format_bytes(pf.sizing.bytes_per_token),
        pf.sizing.num_blocks,
        pf.sizing.block_size_tokens,
        pf.sizing.capacity_tokens(),
        pf.max_concurrency,
        max_len,
        peak_blocks,
        100.0 * peak_blocks as f64 / pf.sizing.num_blocks.max(1) as f64,
        peak_batch,
        stats.num_preemptions,
    );
    println!(
        "throughput: {} requests, {} tokens generated in {:.2} s ({:.1} tokens/s, {} steps)",
        order.len(),
        generated,
        elapsed_s,
        generated as f64 / elapsed_s,
        stats.counters.steps
    );
    Ok(())
}
