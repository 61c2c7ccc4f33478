//! `starling`: fetch models, inspect them, generate text, benchmark, calibrate STAR-KV.

mod args;
mod bytes;
mod commands;
mod device;
mod session;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// Starling: an LLM serving engine built around KV-cache compression.
#[derive(Parser, Debug)]
#[command(name = "starling", version, about, propagate_version = true)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Fetch and list known models.
    Model(commands::model::ModelArgs),
    /// Print a model's architecture, size and KV-cache capacity.
    Info(commands::info::InfoArgs),
    /// Generate a completion, streamed to stdout.
    Generate(commands::generate::GenerateArgs),
    /// The main job: fetch the default model and run a few chat prompts through the batching
    /// engine plain, with token eviction and with STAR-KV latents on one KV budget; print the
    /// answers, the KV bytes each arm held and the blocks each leaves free.
    Demo(commands::demo::DemoArgs),
    /// Benchmarks.
    Bench(commands::bench::BenchArgs),
    /// Serve the OpenAI-compatible HTTP API.
    Serve(commands::serve::ServeArgs),
    /// Write STAR-KV checkpoints (low-rank K/V projections), one per rank profile.
    Calibrate(commands::calibrate::CalibrateArgs),
}

fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("STARLING_LOG")
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Model(a) => commands::model::run(a),
        Command::Info(a) => commands::info::run(a),
        Command::Generate(a) => commands::generate::run(a),
        Command::Demo(a) => commands::demo::run(a),
        Command::Bench(a) => commands::bench::run(a),
        Command::Serve(a) => commands::serve::run(a),
        Command::Calibrate(a) => commands::calibrate::run(a),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("error: {e:#}");
            ExitCode::FAILURE
        }
    }
}
