//! `starling bench campaign`: the four serving campaigns against several engine command lines
//! on the same KV memory, with progress, into a dated result folder.

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use starling_bench::campaign::charts::write_campaign_pngs;
use starling_bench::campaign::markdown::campaign_markdown;
use starling_bench::campaign::stamp::utc_stamps;
use starling_bench::campaign::{
    run_campaign, BootRecord, CampaignKind, CampaignPlan, CampaignReport, EngineSpec, Observer,
    Point, PointRow, RequestCount, RunSettings, Workload,
};
use starling_bench::sharegpt;

use crate::bytes::parse_bytes;

/// `starling bench campaign` flags.
#[derive(Args, Debug)]
pub struct CampaignArgs {
    /// An engine as NAME=COMMAND (repeat for each): the shell command line that starts its
    /// OpenAI-compatible server, with `{port}` (required), `{kv_cache_memory_bytes}` and
    /// `{max_model_len}` filled in per boot. A command with `{max_model_len}` is booted once
    /// per context point; one without serves the context points at its own window.
    #[arg(long = "engine", required = true, value_parser = parse_engine)]
    engines: Vec<EngineSpec>,
    /// `all`, or some of concurrency,long-generation,scheduler,context.
    #[arg(long, default_value = "all", value_parser = parse_campaigns)]
    campaigns: std::vec::Vec<CampaignKind>,
    /// The results go into a new folder here named after the UTC start time.
    #[arg(long, default_value = "bench/results/campaigns")]
    output_root: PathBuf,
    /// KV-cache memory of every engine (`{kv_cache_memory_bytes}`), e.g. 1GiB.
    #[arg(long, value_parser = parse_bytes, default_value = "1GiB")]
    kv_cache_memory: u64,
    /// Context window of the servers outside the context campaign (`{max_model_len}`).
    #[arg(long, default_value_t = 8192)]
    max_model_len: usize,
    /// Seed of every dataset and of the arrivals (the same for every engine).
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// First port tried for the servers; each boot takes the next free one.
    #[arg(long, default_value_t = 8100)]
    base_port: u16,
    /// Seconds a server may take to answer /health (vLLM takes about 100).
    #[arg(long, default_value_t = 600)]
    boot_timeout_s: u64,
    /// Seconds one point may run before it is reported as an error.
    #[arg(long, default_value_t = 600)]
    point_timeout_s: u64,
    /// (a) Workloads: random:IN:OUT[:RANGE], sharegpt or sharegpt:FILE.
    #[arg(long, value_delimiter = ',', default_value = "random:1024:256", value_parser = parse_workload)]
    concurrency_workloads: Vec<Workload>,
    /// (a) Concurrency points.
    #[arg(long, value_delimiter = ',', default_value = "1,8,32,128")]
    concurrency_points: Vec<usize>,
    /// (a) Requests per unit of concurrency at each point…
    #[arg(long, default_value_t = 2)]
    requests_per_concurrency: usize,
    /// …at least this many…
    #[arg(long, default_value_t = 8)]
    min_requests: usize,
    /// …and at most this many.
    #[arg(long, default_value_t = 256)]
    max_requests: usize,
    /// (b) Context lengths (prompt + output), tokens.
    #[arg(long, value_delimiter = ',', default_value = "4096,16384,32768")]
    context_points: Vec<usize>,
    /// (b) Output tokens of each request.
    #[arg(long, default_value_t = 64)]
    context_output_tokens: usize,
    /// (b) Requests per point, all at once.
    #[arg(long, default_value_t = 2)]
    context_requests: usize,
    /// (c) max_tokens points.
    #[arg(long, value_delimiter = ',', default_value = "256,1024,4096")]
    long_generation_points: Vec<usize>,
    /// (c) Prompt length, tokens.
    #[arg(long, default_value_t = 128)]
    long_generation_input_tokens: usize,
    /// (c) Requests per point, all at once.
    #[arg(long, default_value_t = 8)]
    long_generation_requests: usize,
    /// (d) Poisson arrival rates, requests/s.
    #[arg(long, value_delimiter = ',', default_value = "4,16")]
    scheduler_rates: Vec<f64>,
    /// (d) Workload (random lengths spread by RANGE, or sharegpt).
    #[arg(long, default_value = "random:1024:256:0.5", value_parser = parse_workload)]
    scheduler_workload: Workload,
    /// (d) Requests per point.
    #[arg(long, default_value_t = 32)]
    scheduler_requests: usize,
}

fn parse_engine(text: &str) -> Result<EngineSpec, String> {
    EngineSpec::parse(text).map_err(|e| e.to_string())
}

fn parse_campaigns(text: &str) -> Result<Vec<CampaignKind>, String> {
    CampaignKind::parse_list(text).map_err(|e| e.to_string())
}

fn parse_workload(text: &str) -> Result<Workload, String> {
    Workload::parse(text).map_err(|e| e.to_string())
}

impl CampaignArgs {
    fn plan(&self) -> CampaignPlan {
        CampaignPlan {
            campaigns: self.campaigns.clone(),
            max_model_len_tokens: self.max_model_len,
            seed: self.seed,
            concurrency_workloads: self.concurrency_workloads.clone(),
            concurrency_points: self.concurrency_points.clone(),
            concurrency_requests: RequestCount {
                per_concurrency: self.requests_per_concurrency,
                min: self.min_requests,
                max: self.max_requests,
            },
            context_points_tokens: self.context_points.clone(),
            context_output_tokens: self.context_output_tokens,
            context_requests: self.context_requests,
            long_generation_points_tokens: self.long_generation_points.clone(),
            long_generation_input_tokens: self.long_generation_input_tokens,
            long_generation_requests: self.long_generation_requests,
            scheduler_rates_per_s: self.scheduler_rates.clone(),
            scheduler_workload: self.scheduler_workload.clone(),
            scheduler_requests: self.scheduler_requests,
        }
    }

    /// Whether a campaign in the plan uses the cached ShareGPT conversion.
    fn needs_cached_sharegpt(&self, plan: &CampaignPlan) -> bool {
        let cached = |w: &Workload| matches!(w, Workload::Sharegpt { file: None });
        (plan.campaigns.contains(&CampaignKind::Concurrency)
            && plan.concurrency_workloads.iter().any(cached))
            || (plan.campaigns.contains(&CampaignKind::Scheduler)
                && cached(&plan.scheduler_workload))
    }
}

/// Progress on the terminal, and the result files rewritten after every point (a run cut
/// short still leaves its rows).
struct Recorder {
    report: CampaignReport,
    dir: PathBuf,
    bar: ProgressBar,
}

impl Recorder {
    fn write(&self) -> Result<()> {
        let json = self.dir.join("campaign.json");
        std::fs::write(&json, serde_json::to_string_pretty(&self.report)?)
            .with_context(|| format!("writing {}", json.display()))?;
        let md = self.dir.join("campaign.md");
        std::fs::write(&md, campaign_markdown(&self.report))
            .with_context(|| format!("writing {}", md.display()))?;
        Ok(())
    }

    fn write_or_warn(&self) {
        if let Err(e) = self.write() {
            self.say(&format!("warning: {e:#}"));
        }
    }

    /// A line above the bar (on stderr even where the bar is hidden, as in a device log).
    fn say(&self, line: &str) {
        self.bar.suspend(|| eprintln!("{line}"));
    }
}

impl Observer for Recorder {
    fn booting(&mut self, engine: &str, max_model_len_tokens: usize) {
        self.bar.set_message(format!(
            "{engine}: booting at {max_model_len_tokens} tokens"
        ));
    }

    fn booted(&mut self, record: &BootRecord) {
        let outcome = match &record.log_tail {
            None => format!("up in {:.1} s", record.boot_s),
            Some(tail) => format!(
                "{} ({})",
                record.status.text(),
                tail.lines().last().unwrap_or_default()
            ),
        };
        self.say(&format!(
            "{}: {} at {} tokens",
            record.engine, outcome, record.max_model_len_tokens
        ));
        self.report.boots.push(record.clone());
        self.write_or_warn();
    }

    fn point_started(&mut self, engine: &str, point: &Point) {
        self.bar.set_message(format!(
            "{engine}: {} {} = {} ({} requests)",
            point.campaign,
            point.workload.label(),
            point.value,
            point.num_requests
        ));
    }

    fn point_done(&mut self, row: &PointRow) {
        self.bar.inc(1);
        let measured = row.metrics.as_ref().filter(|_| row.status.measured());
        let figures = measured.map_or(String::new(), |m| {
            format!(
                ": {:.1} output tok/s, TTFT p99 {:.0} ms, TPOT p99 {:.1} ms",
                m.output_throughput, m.ttft.p99_ms, m.tpot.p99_ms
            )
        });
        self.say(&format!(
            "{} {} {} {}: {}{figures}",
            row.engine,
            row.point.campaign,
            row.workload_label,
            row.point.value,
            row.status.text()
        ));
        self.report.rows.push(row.clone());
        self.write_or_warn();
    }
}

/// Runs `starling bench campaign`.
pub fn run(args: CampaignArgs) -> Result<()> {
    let plan = args.plan();
    plan.validate()?;
    let mut names: Vec<&str> = args.engines.iter().map(|e| e.name.as_str()).collect();
    names.sort_unstable();
    if names.windows(2).any(|w| w[0] == w[1]) {
        bail!("engine names must differ: {}", names.join(", "));
    }
    for engine in args.engines.iter().filter(|e| !e.takes_kv_memory()) {
        eprintln!(
            "warning: engine `{}` does not take {{kv_cache_memory_bytes}}: its KV memory is whatever its command sets",
            engine.name
        );
    }
    let default_sharegpt = if args.needs_cached_sharegpt(&plan) {
        let options = starling_hub::FetchOptions::from_env()?;
        Some(sharegpt::ensure_cached(&options.home, &options.python)?)
    } else {
        None
    };
    let (started_utc, folder) = utc_stamps(SystemTime::now());
    let dir = args.output_root.join(folder);
    let logs_dir = dir.join("logs");
    std::fs::create_dir_all(&logs_dir)
        .with_context(|| format!("creating {}", logs_dir.display()))?;
    let total_points = (plan.points().len() * args.engines.len()) as u64;
    let bar = ProgressBar::new(total_points);
    bar.set_style(
        ProgressStyle::with_template("[{elapsed_precise}] {bar:30} {pos}/{len} points  {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar()),
    );
    let mut recorder = Recorder {
        report: CampaignReport {
            bench: "campaign",
            started_utc,
            command: std::env::args().collect(),
            kv_cache_memory_bytes: args.kv_cache_memory,
            plan: plan.clone(),
            engines: args.engines.clone(),
            boots: Vec::new(),
            rows: Vec::new(),
            interrupted: false,
        },
        dir: dir.clone(),
        bar,
    };
    recorder.write()?;
    let settings = RunSettings {
        kv_cache_memory_bytes: args.kv_cache_memory,
        base_port: args.base_port,
        boot_timeout: Duration::from_secs(args.boot_timeout_s),
        point_timeout: Duration::from_secs(args.point_timeout_s),
        logs_dir,
        default_sharegpt,
        metrics_period: Duration::from_millis(100),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    let interrupted = runtime.block_on(async {
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            if wait_for_signal().await {
                let _ = stop_tx.send(true);
            }
        });
        run_campaign(&plan, &args.engines, &settings, &mut recorder, stop_rx).await
    });
    recorder.bar.finish_and_clear();
    recorder.report.interrupted = interrupted;
    recorder.write()?;
    let pngs = write_campaign_pngs(&recorder.report, &dir)?;
    println!("{}", campaign_markdown(&recorder.report));
    eprintln!(
        "results in {} (campaign.json, campaign.md, {} plots, logs/)",
        dir.display(),
        pngs.len()
    );
    if interrupted {
        bail!("interrupted; the rows so far are in {}", dir.display());
    }
    Ok(())
}

/// Resolves on SIGINT or SIGTERM (`false` if neither can be listened for).
async fn wait_for_signal() -> bool {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        return false;
    };
    tokio::select! {
        _ = interrupt.recv() => true,
        _ = terminate.recv() => true,
    }
}
