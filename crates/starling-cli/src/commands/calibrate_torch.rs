//! `starling calibrate --distill-backend torch`: threshold distillation and projection
//! refinement at the reference's scale (millions of tokens) by the PyTorch trainer
//! `scripts/starkv_distill_torch.py`, embedded in this binary and run by `--python` on its GPU.
//!
//! This process keeps every STAR-KV decision (`starling_starkv::distill::external`): it writes
//! the job (factors, calibration tokens, each profile's budget and starting thresholds), runs
//! the trainer once per profile and phase, streams its JSON step lines into the progress bar,
//! projects the returned thresholds onto the budget exactly and builds the checkpoints. A run
//! stopped by `--distill-time-limit-s` (or killed) resumes from the trainer's saved state when
//! the same command is run again: the job directory under the output is kept while the job is
//! unchanged.

use std::ffi::OsString;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use clap::Args;
use indicatif::ProgressBar;
use starling_models::chat::{ChatMessage, ChatTemplate};
use starling_models::tokenizer::Tokenizer;
use starling_models::RopeStyle;
use starling_starkv::checkpoint::StarKvCheckpoint;
use starling_starkv::distill::external::{
    BudgetControl, ExternalJob, JobModel, JobRefine, JobSettings, JobThresholds, RefineResult,
    ThresholdsResult, REFINE_RESULT, THRESHOLDS_RESULT,
};
use starling_starkv::distill::{distilled_checkpoint, DistillConfig};
use starling_starkv::threshold::ThresholdInit;
use starling_starkv::{BudgetTarget, CalibrationPlan, ModelFactors};

use super::calibrate::CalibrationModel;

/// The trainer, written into the job directory at each run.
const TRAINER_SOURCE: &str = include_str!("../../../../scripts/starkv_distill_torch.py");
const TRAINER_FILE: &str = "starkv_distill_torch.py";
/// An environment variable naming a trainer file to run instead of the embedded one (for
/// developing the trainer without rebuilding this binary; it must speak the same job format).
pub const TRAINER_OVERRIDE_ENV: &str = "STARLING_TORCH_TRAINER";
/// The trainer's exit status for "paused at the time limit, state saved".
const EXIT_PAUSED: i32 = 75;
/// The job directory under `--output`.
pub const JOB_DIR: &str = ".torch-job";

/// Where distillation and refinement run.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistillBackend {
    /// candle's CPU autograd in this process (`--distill-steps`, `--refine-steps`): small
    /// models, CI.
    Cpu,
    /// The embedded PyTorch trainer on `--python`'s GPU (`--distill-tokens`,
    /// `--refine-tokens`): millions of tokens of essays and chat conversations.
    Torch,
}

/// What the torch trainer is calibrated on.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum DistillText {
    /// The held-in essays, then chitchat conversations in the chat template
    /// (`--distill-chat-share`).
    EssaysAndChat,
    /// The held-in essays alone.
    Essays,
    /// The held-in essays, then the long prose (Shakespeare's works, ~1.3M tokens): ten times
    /// the essays' ~130k tokens, so two million training tokens see each window about once
    /// instead of ~15 times.
    EssaysAndProse,
    /// The essays and the prose, then chat conversations at `--distill-chat-share` of the whole.
    EssaysProseAndChat,
}

impl DistillText {
    /// Whether the long prose follows the essays.
    pub fn with_prose(self) -> bool {
        matches!(
            self,
            DistillText::EssaysAndProse | DistillText::EssaysProseAndChat
        )
    }

    /// Whether chat conversations follow the written text.
    pub fn with_chat(self) -> bool {
        matches!(
            self,
            DistillText::EssaysAndChat | DistillText::EssaysProseAndChat
        )
    }
}

/// `--distill-budget`: [`BudgetControl`] on the command line.
#[derive(clap::ValueEnum, Debug, Clone, Copy, PartialEq, Eq)]
pub enum BudgetArg {
    /// Every step at the budget exactly (one shift of every threshold logit).
    Projected,
    /// The CPU distiller's dual ascent on a budget price.
    Dual,
}

impl From<BudgetArg> for BudgetControl {
    fn from(arg: BudgetArg) -> Self {
        match arg {
            BudgetArg::Projected => BudgetControl::Projected,
            BudgetArg::Dual => BudgetControl::Dual,
        }
    }
}

/// The flags of the torch backend.
#[derive(Args, Debug, Clone)]
pub struct TorchArgs {
    /// Where distillation and refinement run: `cpu` (candle's autograd in this process, for
    /// small models and CI) or `torch` (the embedded PyTorch trainer run by `--python`, on its
    /// GPU: calibration text is the held-in essays plus the chitchat conversations in the
    /// model's chat template; `--distill-tokens`, `--refine-tokens`).
    #[arg(long, value_enum, default_value_t = DistillBackend::Cpu)]
    pub distill_backend: DistillBackend,
    /// torch: calibration tokens per profile for the thresholds (0: keep `--strategy`'s ranks).
    #[arg(long, default_value_t = 2_097_152)]
    pub distill_tokens: u64,
    /// torch: calibration tokens per profile for refining the kept projections afterwards
    /// (0: none).
    #[arg(long, default_value_t = 0)]
    pub refine_tokens: u64,
    /// torch: windows per optimisation step (each `--distill-window-tokens` long).
    #[arg(long, default_value_t = 2)]
    pub distill_batch_windows: usize,
    /// torch: the Python interpreter that has torch, transformers and safetensors (and the
    /// `gguf` package for a GGUF model).
    #[arg(long, default_value = "python3")]
    pub python: OsString,
    /// torch: the calibration text: the held-in essays and the chitchat conversations in the
    /// model's chat template (a general mix), the essays alone (the domain of the held-out
    /// perplexity), the essays and the long prose (ten times more written text, fetched like
    /// the essays), or all three.
    #[arg(long, value_enum, default_value_t = DistillText::EssaysAndChat)]
    pub distill_text: DistillText,
    /// torch, `--distill-text essays-and-chat` or `essays-prose-and-chat`: the share of the
    /// calibration tokens that are chat conversations (taken in file order until the share is
    /// reached; 1: all of them).
    #[arg(long, default_value_t = 0.5)]
    pub distill_chat_share: f64,
    /// torch: how the threshold phase holds the budget: `dual` (the CPU distiller's Lagrangian
    /// price by dual ascent; over hundreds of steps its soft rank swings around the budget) or
    /// `projected` (every step at the budget exactly, by one shift of every threshold logit and
    /// the KL gradient's component along the soft rank's removed; learning rate
    /// cosine-decayed). On SmolLM2 at 64 steps dual was the better of the two (BENCHMARKS.md,
    /// session 21); the GPU comparison at hundreds of steps is still to be run.
    #[arg(long, value_enum, default_value_t = BudgetArg::Dual)]
    pub distill_budget: BudgetArg,
    /// torch: take windows in file order (essays first) instead of a seeded shuffle per
    /// epoch: the CPU distiller's order, for checking the two backends against each other.
    #[arg(long)]
    pub distill_in_file_order: bool,
    /// torch: pause after this many seconds of this command (every trainer run, profile and
    /// phase together, model loading included), state saved: run the same command again to
    /// resume; 0: no limit.
    #[arg(long, default_value_t = 0)]
    pub distill_time_limit_s: u64,
}

/// Tokens per window of the torch trainer when `--distill-window-tokens` is not given.
pub const DEFAULT_TORCH_WINDOW_TOKENS: usize = 4096;
/// The torch refinement's default step size (relative to each matrix's RMS entry, cosine-decayed
/// to a tenth): hundreds of steps, so smaller than the CPU's few-step default.
pub const DEFAULT_TORCH_REFINE_LR: f64 = 1e-3;

/// `written_ids` (the essays' tokens, perhaps with the prose's) followed by chitchat
/// conversations rendered in the model's chat template (the trainer shuffles windows, so they
/// mix), and the name of the chat source. Conversations are taken in file order until the chat
/// is `chat_share` of the whole (all 4,017 of them are ~3.7M tokens, 96% of a mix beside ~130k
/// essay tokens; that mix distilled 29 points worse on held-out essays than the essays alone,
/// BENCHMARKS.md session 20).
pub fn chat_corpus_tokens(
    tokenizer: &Tokenizer,
    written_ids: &[u32],
    chat_share: f64,
) -> Result<(Vec<u32>, String)> {
    let options = starling_hub::FetchOptions::from_env()?;
    let path = starling_bench::sharegpt::ensure_cached(&options.home, &options.python)?;
    let conversations = starling_bench::sharegpt::load_exchanges(&path)?;
    let template = ChatTemplate::for_tokenizer(tokenizer).context("the model's chat template")?;
    let chat_budget = chat_tokens_for_share(written_ids.len(), chat_share);
    let mut ids = written_ids.to_vec();
    let mut used = 0;
    for (index, exchanges) in conversations.iter().enumerate() {
        if ids.len() - written_ids.len() >= chat_budget {
            break;
        }
        let messages: Vec<ChatMessage> = exchanges
            .iter()
            .flat_map(|(user, reply)| [ChatMessage::user(user), ChatMessage::assistant(reply)])
            .collect();
        let text = template
            .render(&messages, false)
            .with_context(|| format!("rendering conversation {index}"))?;
        ids.extend(
            tokenizer
                .encode(&text, false)
                .with_context(|| format!("tokenising conversation {index}"))?,
        );
        used += 1;
    }
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    );
    let chat_tokens = ids.len() - written_ids.len();
    Ok((
        ids,
        format!(
            "{name} ({used} of {} conversations, {chat_tokens} tokens)",
            conversations.len()
        ),
    ))
}

/// `essay_ids` followed by the long prose's tokens ([`starling_hub::fetch_prose`], fetched and
/// verified on first use), and a description of the prose source for the manifest. The prose
/// is tokenised a line at a time (newlines kept), so no single encode call holds 5 MB.
pub fn prose_corpus_tokens(tokenizer: &Tokenizer, essay_ids: &[u32]) -> Result<(Vec<u32>, String)> {
    let options = starling_hub::FetchOptions::from_env()?;
    let prose = starling_hub::fetch_prose(&options).context("fetching the long prose")?;
    let mut ids = essay_ids.to_vec();
    for piece in prose.essays() {
        for (index, line) in piece.text.split_inclusive('\n').enumerate() {
            ids.extend(
                tokenizer
                    .encode(line, false)
                    .with_context(|| format!("tokenising {} line {}", piece.name, index + 1))?,
            );
        }
    }
    let prose_tokens = ids.len() - essay_ids.len();
    Ok((
        ids,
        format!(
            "{} (set sha256 {}, {prose_tokens} tokens)",
            prose
                .essays()
                .iter()
                .map(|e| e.name.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            prose.sha256()
        ),
    ))
}

/// Chat tokens that make `share` of a corpus beside `essay_tokens` essay tokens (`usize::MAX`
/// for a share of 1: every conversation).
pub fn chat_tokens_for_share(essay_tokens: usize, share: f64) -> usize {
    if share >= 1.0 {
        return usize::MAX;
    }
    (essay_tokens as f64 * share / (1.0 - share)).ceil() as usize
}

/// The run-wide settings of a job besides the torch flags.
pub struct JobKnobs {
    /// Tokens per window.
    pub window_tokens: usize,
    /// Refinement step size.
    pub refine_lr: f64,
    /// The thresholds' optimiser settings (learning rate, sharpness, dual rate, start price).
    pub thresholds: DistillConfig,
    /// Seed of the window order.
    pub seed: u64,
    /// The allocation the thresholds start from.
    pub init: ThresholdInit,
}

/// One prepared job: its directory and how to run the trainer.
pub struct TorchRunner {
    /// When `--distill-time-limit-s` runs out (`None`: no limit).
    deadline: Option<Instant>,
    job: ExternalJob,
    dir: PathBuf,
    script: PathBuf,
    args: TorchArgs,
}

impl TorchRunner {
    /// Writes the job for `profiles` (name and target) into `output/`[`JOB_DIR`] (kept as it
    /// is when it already holds this job: a resumed run).
    pub fn prepare(
        model: &CalibrationModel<'_>,
        factors: &ModelFactors,
        text_ids: &[u32],
        profiles: &[(String, BudgetTarget)],
        output: &Path,
        knobs: &JobKnobs,
        args: &TorchArgs,
    ) -> Result<Self> {
        let started = Instant::now();
        let defaults = &knobs.thresholds;
        let settings = JobSettings {
            window_tokens: knobs.window_tokens,
            batch_windows: args.distill_batch_windows,
            shuffle: !args.distill_in_file_order,
            seed: knobs.seed,
            thresholds: JobThresholds {
                tokens: args.distill_tokens,
                learning_rate: defaults.learning_rate,
                sharpness: defaults.sharpness,
                dual_rate: defaults.dual_rate,
                initial_multiplier: defaults.initial_multiplier,
                budget: args.distill_budget.into(),
            },
            refine: JobRefine {
                tokens: args.refine_tokens,
                learning_rate: knobs.refine_lr,
            },
            init: knobs.init,
        };
        let job_model = JobModel {
            path: model.path.display().to_string(),
            weights_sha256: model.identity.to_owned(),
            key_rows_interleaved: model.config.rope.style == RopeStyle::Interleaved,
        };
        let (job, files) = ExternalJob::new(job_model, factors, text_ids, profiles, &settings)
            .context("preparing the torch distillation job")?;
        let dir = output.join(JOB_DIR);
        let resumed = job.write(&dir, &files)?;
        if resumed {
            eprintln!("resuming the torch distillation job in {}", dir.display());
        }
        let script = dir.join(TRAINER_FILE);
        let source = match std::env::var_os(TRAINER_OVERRIDE_ENV) {
            Some(path) => {
                let path = PathBuf::from(path);
                eprintln!(
                    "the torch trainer is {} ({TRAINER_OVERRIDE_ENV})",
                    path.display()
                );
                std::fs::read_to_string(&path).with_context(|| {
                    format!("reading {} ({TRAINER_OVERRIDE_ENV})", path.display())
                })?
            }
            None => TRAINER_SOURCE.to_owned(),
        };
        std::fs::write(&script, source).with_context(|| format!("writing {}", script.display()))?;
        let limit = args.distill_time_limit_s;
        Ok(Self {
            deadline: (limit > 0).then(|| started + Duration::from_secs(limit)),
            job,
            dir,
            script,
            args: args.clone(),
        })
    }

    /// The profile's distilled checkpoint and its summary line (the trainer runs unless its
    /// result is already in the job directory).
    pub fn thresholds(
        &self,
        name: &str,
        model: &CalibrationModel<'_>,
        factors: &ModelFactors,
        plan: &CalibrationPlan,
        bar: &ProgressBar,
    ) -> Result<(StarKvCheckpoint, String)> {
        let out = self.dir.join(name);
        if !out.join(THRESHOLDS_RESULT).is_file() {
            self.run_trainer("thresholds", name, None, bar)?;
        }
        let result = ThresholdsResult::read(&out)?;
        let (outcome, report) = result.outcome(&self.job, name, factors)?;
        let mut plan = plan.clone();
        plan.calibration.window_tokens = result.window_tokens as u64;
        let checkpoint = distilled_checkpoint(
            model.config,
            model.identity,
            factors,
            &plan,
            &outcome,
            &report,
        )?;
        let (first, last) = first_and_last(result.steps.iter().map(|s| s.kl));
        let line = format!(
            "{name:<13} distilled on torch: {} steps × {} windows × {} tokens ({} tokens), KL {first:.4} → {last:.4} nats/token, {:.0} tokens/s",
            result.steps.len(),
            result.batch_windows,
            result.window_tokens,
            result.tokens_seen,
            tokens_per_s(result.tokens_seen, result.steps.iter().map(|s| s.elapsed_ms)),
        );
        Ok((checkpoint, line))
    }

    /// `checkpoint` with projections refined by the trainer, and its summary line.
    pub fn refine(
        &self,
        name: &str,
        checkpoint: StarKvCheckpoint,
        bar: &ProgressBar,
    ) -> Result<(StarKvCheckpoint, String)> {
        let out = self.dir.join(name);
        if !out.join(REFINE_RESULT).is_file() {
            // The trainer reads the unrefined projections (f32) from a checkpoint folder.
            let unrefined = out.join("unrefined");
            checkpoint
                .save(&unrefined)
                .with_context(|| format!("writing {}", unrefined.display()))?;
            self.run_trainer("refine", name, Some(&unrefined), bar)?;
        }
        let result = RefineResult::read(&out)?;
        let refined = result.apply(&out, checkpoint)?;
        let (first, last) = first_and_last(result.steps.iter().map(|s| s.kl));
        let line = format!(
            "{name:<13} refined on torch: {} steps ({} tokens), KL {first:.4} → {last:.4} nats/token, {:.0} tokens/s",
            result.steps.len(),
            result.tokens_seen,
            tokens_per_s(result.tokens_seen, result.steps.iter().map(|s| s.elapsed_ms)),
        );
        Ok((refined, line))
    }

    fn run_trainer(
        &self,
        phase: &str,
        profile: &str,
        checkpoint: Option<&Path>,
        bar: &ProgressBar,
    ) -> Result<()> {
        // What is left of the command's time limit (0: none); none left is a pause too.
        let remaining_s = match self.deadline {
            None => 0,
            Some(deadline) => {
                let left = deadline.saturating_duration_since(Instant::now()).as_secs();
                if left == 0 {
                    bail!(
                        "paused before {phase} of profile {profile}: --distill-time-limit-s is used up; run the same command again to resume (state in {})",
                        self.dir.display()
                    );
                }
                left
            }
        };
        let mut command = Command::new(&self.args.python);
        command
            .arg(&self.script)
            .arg(phase)
            .arg("--job")
            .arg(&self.dir)
            .arg("--profile")
            .arg(profile)
            .arg("--time-limit-s")
            .arg(remaining_s.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        if let Some(dir) = checkpoint {
            command.arg("--checkpoint").arg(dir);
        }
        bar.set_message(format!("{profile}: {phase} on torch: loading the model"));
        let mut child = command.spawn().with_context(|| {
            format!(
                "starting {} (--python): it needs torch, transformers and safetensors",
                self.args.python.to_string_lossy()
            )
        })?;
        if let Some(stdout) = child.stdout.take() {
            for line in BufReader::new(stdout).lines() {
                let line = line.context("reading the trainer's output")?;
                match serde_json::from_str::<serde_json::Value>(&line) {
                    Ok(record) => bar.set_message(progress_message(profile, &record)),
                    Err(_) => bar.println(line),
                }
            }
        }
        let status = child.wait().context("waiting for the trainer")?;
        match status.code() {
            Some(0) => Ok(()),
            Some(EXIT_PAUSED) => bail!(
                "the torch trainer paused ({phase}, profile {profile}) at --distill-time-limit-s; its state is in {}: run the same command again to resume",
                self.dir.display()
            ),
            _ => bail!("the torch trainer failed ({phase}, profile {profile}): {status}"),
        }
    }
}

/// The first and last of `kls` (NaN for none).
fn first_and_last(mut kls: impl Iterator<Item = f64>) -> (f64, f64) {
    let first = kls.next().unwrap_or(f64::NAN);
    (first, kls.last().unwrap_or(first))
}

/// Tokens per second over steps that took `elapsed_ms` each.
fn tokens_per_s(tokens: u64, elapsed_ms: impl Iterator<Item = u64>) -> f64 {
    let ms: u64 = elapsed_ms.sum();
    if ms == 0 {
        return 0.0;
    }
    tokens as f64 * 1000.0 / ms as f64
}

/// The bar's message for one of the trainer's JSON lines.
fn progress_message(profile: &str, record: &serde_json::Value) -> String {
    let phase = record["phase"].as_str().unwrap_or("?");
    if phase == "loaded" {
        return format!(
            "{profile}: the trainer loaded the model in {} s (factors reproduce its K/V weights to {:.2e})",
            record["seconds"], record["factor_error"].as_f64().unwrap_or(f64::NAN)
        );
    }
    format!(
        "{profile}: {phase} step {}/{} KL {:.4} ({} tokens)",
        record["step"].as_u64().map_or(0, |s| s + 1),
        record["steps"],
        record["kl"].as_f64().unwrap_or(f64::NAN),
        record["tokens_seen"],
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progress_lines_read_the_trainers_records() {
        let step: serde_json::Value = serde_json::from_str(
            r#"{"phase":"thresholds","steps":10,"tokens_seen":8192,"step":0,"kl":0.25}"#,
        )
        .unwrap();
        assert_eq!(
            progress_message("balanced", &step),
            "balanced: thresholds step 1/10 KL 0.2500 (8192 tokens)"
        );
        let loaded: serde_json::Value =
            serde_json::from_str(r#"{"phase":"loaded","seconds":3.5,"factor_error":0.001}"#)
                .unwrap();
        assert!(progress_message("b", &loaded).contains("3.5 s"));
        assert_eq!(tokens_per_s(1000, [250, 250].into_iter()), 2000.0);
        assert_eq!(tokens_per_s(1000, std::iter::empty()), 0.0);
    }

    #[test]
    fn the_chat_share_caps_the_conversations_beside_the_essays() {
        assert_eq!(chat_tokens_for_share(1000, 0.5), 1000);
        assert_eq!(chat_tokens_for_share(1000, 0.75), 3000);
        assert_eq!(chat_tokens_for_share(1000, 0.0), 0);
        assert_eq!(chat_tokens_for_share(1000, 1.0), usize::MAX);
    }

    #[test]
    fn each_calibration_text_names_its_parts_on_the_command_line() {
        use clap::ValueEnum;
        let parts = |name: &str| {
            let text = DistillText::from_str(name, false).unwrap();
            (text.with_prose(), text.with_chat())
        };
        assert_eq!(parts("essays"), (false, false));
        assert_eq!(parts("essays-and-chat"), (false, true));
        assert_eq!(parts("essays-and-prose"), (true, false));
        assert_eq!(parts("essays-prose-and-chat"), (true, true));
        assert!(DistillText::from_str("prose", false).is_err());
    }

    #[test]
    fn the_embedded_trainer_speaks_this_job_format() {
        let format = starling_starkv::distill::external::JOB_FORMAT;
        assert!(TRAINER_SOURCE.contains(&format!("job.get(\"format\") != {format}")));
        assert!(TRAINER_SOURCE.contains(&format!("EXIT_PAUSED = {EXIT_PAUSED}")));
        // The budget control by the name serde gives it.
        let projected = serde_json::to_string(&BudgetControl::Projected).unwrap_or_default();
        assert!(TRAINER_SOURCE.contains(&format!("== {projected}")));
        for file in [THRESHOLDS_RESULT, REFINE_RESULT] {
            assert!(TRAINER_SOURCE.contains(file), "{file}");
        }
    }
}
