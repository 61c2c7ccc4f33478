//! `starling bench serve`: the serving benchmark client against a running server.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::{bail, Context, Result};
use clap::Args;
use starling_bench::dataset::{prefix_repetition_requests, random_requests};
use starling_bench::report::{markdown, sweep_markdown};
use starling_bench::{
    plot, run_benchmark, sharegpt, BenchReport, BenchRequest, Pacing, PrefixRepetitionSpec,
    RandomSpec, RunConfig, StreamClient, SweepRow,
};
use starling_engine::CacheReport;

/// `starling bench serve` flags (vLLM benchmark_serving names).
#[derive(Args, Debug)]
pub struct BenchServeArgs {
    /// The server.
    #[arg(long, default_value = "http://127.0.0.1:8000")]
    base_url: String,
    /// Model name for the request bodies; default: the server's first model.
    #[arg(long)]
    model: Option<String>,
    /// `random`, `prefix_repetition` (vLLM's: random prefixes shared by several requests, for
    /// prefix caching; the report gives the server's prefix-cache hit rate), `sharegpt`
    /// (chitchat-dataset, fetched and converted once into $STARLING_HOME/datasets/),
    /// `sharegpt_multiturn` (its conversations turn by turn, each prompt the transcript so far:
    /// prefix caching across turns), or a ShareGPT JSON file.
    #[arg(long, default_value = "random")]
    dataset: String,
    /// Requests per run.
    #[arg(long, default_value_t = 100)]
    num_prompts: usize,
    /// Most requests in flight (all released at once).
    #[arg(long, conflicts_with = "request_rate")]
    max_concurrency: Option<usize>,
    /// Poisson arrival rate, requests/s.
    #[arg(long)]
    request_rate: Option<f64>,
    /// Seed of the dataset sampling and the arrivals.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Random dataset: mean prompt length, tokens.
    #[arg(long, default_value_t = 1024)]
    random_input_len: usize,
    /// Random dataset: mean output length, tokens.
    #[arg(long, default_value_t = 128)]
    random_output_len: usize,
    /// Random dataset: lengths uniform in [len·(1−r), len·(1+r)].
    #[arg(long, default_value_t = 0.0)]
    random_range_ratio: f64,
    /// Prefix-repetition dataset: tokens of each shared prefix.
    #[arg(long, default_value_t = 256)]
    prefix_repetition_prefix_len: usize,
    /// Prefix-repetition dataset: tokens of each request's own suffix.
    #[arg(long, default_value_t = 256)]
    prefix_repetition_suffix_len: usize,
    /// Prefix-repetition dataset: distinct prefixes (requests spread evenly over them).
    #[arg(long, default_value_t = 10)]
    prefix_repetition_num_prefixes: usize,
    /// Prefix-repetition dataset: output length, tokens.
    #[arg(long, default_value_t = 128)]
    prefix_repetition_output_len: usize,
    /// Multi-turn dataset: turns kept per conversation (requests come from
    /// num_prompts / turns conversations).
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(usize))]
    multi_turn_max_turns: usize,
    /// Generate the full output length even past EOS.
    #[arg(long)]
    ignore_eos: bool,
    /// Run once per concurrency (e.g. 1,4,8,16), print the table and plot it.
    #[arg(long, value_delimiter = ',', conflicts_with_all = ["max_concurrency", "request_rate"])]
    sweep_concurrency: Vec<usize>,
    /// In a sweep, run this many requests per unit of concurrency at each level (the first
    /// `N × concurrency` of the dataset) instead of all `--num-prompts` at every level.
    #[arg(long, requires = "sweep_concurrency")]
    sweep_prompts_per_concurrency: Option<usize>,
    /// Write the results as JSON here.
    #[arg(long)]
    output_json: Option<PathBuf>,
    /// Write the markdown table here.
    #[arg(long)]
    output_md: Option<PathBuf>,
    /// The sweep plot (PNG).
    #[arg(long, default_value = "bench_serve_sweep.png")]
    output_png: PathBuf,
}

/// Runs `starling bench serve`.
pub fn run(args: BenchServeArgs) -> Result<()> {
    if args.num_prompts == 0 {
        bail!("--num-prompts must be at least 1");
    }
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?
        .block_on(run_async(args))
}

async fn run_async(args: BenchServeArgs) -> Result<()> {
    let probe = StreamClient::new(&args.base_url, "");
    let models = probe.get_text("/v1/models").await?;
    let model = match &args.model {
        Some(m) => m.clone(),
        None => serde_json::from_str::<serde_json::Value>(&models)?["data"][0]["id"]
            .as_str()
            .context("the server lists no model; pass --model")?
            .to_owned(),
    };
    // The cache the server runs (Starling's `/v1/models` extension; absent from other
    // servers), recorded with the results.
    let kv_cache = server_cache(&models);
    let client = StreamClient::new(&args.base_url, &model);
    let requests = load_dataset(&args, &client).await?;
    let mut doc = serde_json::Map::new();
    let mut md = String::new();
    if args.sweep_concurrency.is_empty() {
        let pacing = match (args.request_rate, args.max_concurrency) {
            (Some(per_s), cap) => Pacing::Rate {
                per_s,
                max_concurrency: cap,
            },
            (None, Some(c)) => Pacing::Concurrency(c),
            (None, None) => Pacing::Concurrency(args.num_prompts),
        };
        let outcome = run_benchmark(&client, &requests, &run_config(&args, pacing)).await?;
        let report = BenchReport {
            base_url: args.base_url.clone(),
            model: model.clone(),
            dataset: args.dataset.clone(),
            num_prompts: args.num_prompts,
            max_concurrency: args.max_concurrency,
            request_rate: args.request_rate,
            seed: args.seed,
            metrics: outcome.metrics,
            server: outcome.server,
            kernel_profile: outcome.kernel_profile,
        };
        md = markdown(&report);
        doc.insert("run".into(), serde_json::to_value(&report)?);
        report_failures(&outcome.results);
    } else {
        let mut rows = Vec::new();
        for &concurrency in &args.sweep_concurrency {
            let level = match args.sweep_prompts_per_concurrency {
                Some(per) => &requests[..(per * concurrency).clamp(1, requests.len())],
                None => &requests[..],
            };
            eprintln!("concurrency {concurrency}: {} requests…", level.len());
            let config = run_config(&args, Pacing::Concurrency(concurrency));
            let outcome = run_benchmark(&client, level, &config).await?;
            report_failures(&outcome.results);
            rows.push(SweepRow {
                concurrency,
                metrics: outcome.metrics,
                server: outcome.server,
                kernel_profile: outcome.kernel_profile,
            });
        }
        md.push_str(&format!(
            "## Concurrency sweep: {model}, dataset {}, {} prompts, seed {}\n\n",
            args.dataset, args.num_prompts, args.seed
        ));
        md.push_str(&sweep_markdown(&rows));
        let title = format!(
            "{model}: {} prompts from {}",
            args.num_prompts, args.dataset
        );
        plot::write_sweep_png(&rows, &title, &args.output_png)?;
        eprintln!("plot written to {}", args.output_png.display());
        doc.insert("sweep".into(), serde_json::to_value(&rows)?);
    }
    if let Some(report) = kv_cache
        .as_ref()
        .and_then(|v| serde_json::from_value::<CacheReport>(v.clone()).ok())
    {
        md.push_str(&format!("\nServer KV cache: {report}\n"));
    }
    println!("{md}");
    if let Some(path) = &args.output_md {
        std::fs::write(path, &md).with_context(|| format!("writing {}", path.display()))?;
    }
    if let Some(path) = &args.output_json {
        doc.insert("bench".into(), "serve".into());
        doc.insert("model".into(), model.into());
        doc.insert("dataset".into(), args.dataset.clone().into());
        if let Some(cache) = kv_cache {
            doc.insert("kv_cache".into(), cache);
        }
        std::fs::write(path, serde_json::to_string_pretty(&doc)?)
            .with_context(|| format!("writing {}", path.display()))?;
    }
    Ok(())
}

/// The served model's `kv_cache` field from a `/v1/models` answer, if the server sent one.
fn server_cache(models: &str) -> Option<serde_json::Value> {
    let value: serde_json::Value = serde_json::from_str(models).ok()?;
    let cache = value["data"][0].get("kv_cache")?;
    (!cache.is_null()).then(|| cache.clone())
}

fn run_config(args: &BenchServeArgs, pacing: Pacing) -> RunConfig {
    RunConfig {
        pacing,
        seed: args.seed,
        ignore_eos: args.ignore_eos,
        metrics_period: Duration::from_millis(100),
    }
}

async fn load_dataset(args: &BenchServeArgs, client: &StreamClient) -> Result<Vec<BenchRequest>> {
    if args.dataset == "random" {
        let spec = RandomSpec {
            input_len_tokens: args.random_input_len,
            output_len_tokens: args.random_output_len,
            range_ratio: args.random_range_ratio,
        };
        return Ok(random_requests(args.num_prompts, spec, args.seed)?);
    }
    if args.dataset == "prefix_repetition" {
        let spec = PrefixRepetitionSpec {
            num_prefixes: args.prefix_repetition_num_prefixes,
            prefix_len_tokens: args.prefix_repetition_prefix_len,
            suffix_len_tokens: args.prefix_repetition_suffix_len,
            output_len_tokens: args.prefix_repetition_output_len,
        };
        return Ok(prefix_repetition_requests(
            args.num_prompts,
            spec,
            args.seed,
        )?);
    }
    let multi_turn = args.dataset == "sharegpt_multiturn";
    let path = if args.dataset == "sharegpt" || multi_turn {
        let options = starling_hub::FetchOptions::from_env()?;
        sharegpt::ensure_cached(&options.home, &options.python)?
    } else {
        PathBuf::from(&args.dataset)
    };
    let max_model_len = client.max_model_len().await?;
    if multi_turn {
        let conversations = sharegpt::load_exchanges(&path)?;
        return Ok(starling_bench::multi_turn::multi_turn_requests(
            conversations,
            args.num_prompts,
            args.seed,
            args.multi_turn_max_turns,
            client,
            max_model_len,
        )
        .await?);
    }
    let pairs = sharegpt::load_pairs(&path)?;
    Ok(
        sharegpt::sample_requests(pairs, args.num_prompts, args.seed, client, max_model_len)
            .await?,
    )
}

fn report_failures(results: &[starling_bench::RequestResult]) {
    let failed: Vec<_> = results.iter().filter_map(|r| r.error.as_deref()).collect();
    if let Some(first) = failed.first() {
        eprintln!("{} requests failed; first error: {first}", failed.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_servers_cache_comes_from_its_model_card_when_it_sends_one() {
        let starling = r#"{"object":"list","data":[{"id":"m","max_model_len":64,
            "kv_cache":{"kind":"latent","num_blocks":12}}]}"#;
        let cache = server_cache(starling).unwrap();
        assert_eq!(cache["kind"], "latent");
        assert_eq!(cache["num_blocks"], 12);
        // vLLM and other servers send no such field.
        assert_eq!(
            server_cache(r#"{"object":"list","data":[{"id":"m"}]}"#),
            None
        );
        assert_eq!(server_cache("not json"), None);
    }
}
