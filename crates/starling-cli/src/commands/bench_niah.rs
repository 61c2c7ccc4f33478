//! `starling bench niah`: needle in a haystack over context lengths × depths × compression
//! methods, every cell of a method submitted at once to one engine (continuous batching).
//!
//! Prompts are built at the token level so every cell's prompt is exactly its context length:
//! the chat template is rendered around a placeholder, the two halves are tokenised, and the
//! haystack (essay tokens with the needle at its depth) fills the rest. `--dump-prompts` writes
//! those ids so `scripts/niah_hf.py` can run the very same prompts through HF transformers;
//! `--compare-hf` then lines up the `none` answers with HF's, cell by cell, and
//! `scripts/niah_kvpress.py` answers them with NVIDIA kvpress's presses, which
//! `--compare-kvpress` draws beside Starling's (heatmap pairs, accuracy against ratio, KV held).
//! `--protocol context-question` compresses only the context (kvpress's split).

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};
use clap::Args;
use starling_backend::Backend;
use starling_bench::niah::{
    agreement_markdown, check_depths, compare_with_hf, compare_with_kvpress, comparison_markdown,
    context_label, fact_score, kvpress_grid, messages, parse_context_tokens, parse_methods,
    rouge_l_recall, split_at_placeholder, write_heatmap_pair_png, write_heatmap_png,
    write_ratio_chart_png, HaystackSource, HeatmapGrid, HfAnswers, KvpressAnswers, MethodRun,
    MethodSpec, NiahCell, NiahProtocol, NiahReport, PromptCell, PromptDump, CONTEXT_PLACEHOLDER,
    NEEDLE, NEEDLE_FACTS, NEEDLE_INSERT, QUESTION,
};
use starling_engine::sampling::SamplingParams;
use starling_engine::{Engine, RequestOptions};
use starling_evict::CompressionConfig;
use starling_models::chat::{ChatMessage, ChatTemplate};
use starling_models::tokenizer::Tokenizer;

use super::bench_eval::{compression_for, essay_tokens, progress_bar, write_json, EssaysArg};
use crate::args::{EngineArgs, ModelArg};
use crate::device::{with_backend, BackendJob};
use crate::session::open_session;

/// `starling bench niah` flags.
#[derive(Args, Debug)]
pub struct NiahArgs {
    #[command(flatten)]
    model: ModelArg,
    /// Context lengths (whole prompts, chat template included), comma-separated: token counts or
    /// `k` = 1024 tokens (1k,4k,8k,16k,30k).
    #[arg(long, value_delimiter = ',', default_value = "1k,4k")]
    contexts: Vec<String>,
    /// Needle depths, percent of the haystack, comma-separated (11 by default, so a context
    /// length's mean is not four points).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "0,10,20,30,40,50,60,70,80,90,100"
    )]
    depths: Vec<f64>,
    /// Compression methods, comma-separated: `none` or `name@ratio` (ratio = share of tokens
    /// evicted), e.g. none,keydiff@0.5,snapkv@0.25,tova@0.75,streaming_llm@0.5.
    #[arg(long, value_delimiter = ',', default_value = "none")]
    methods: Vec<String>,
    /// What is compressed: `whole-prompt` (the whole prompt, as it is prefilled and while
    /// decoding) or `context-question` (kvpress's split: the context only, once the prompt is
    /// in; the question and the chat template's tail are kept, and SnapKV/TOVA score with the
    /// question's queries).
    #[arg(long, value_parser = parse_protocol, default_value = "whole-prompt")]
    protocol: NiahProtocol,
    /// Folder for niah_results.json, niah_summary.md and one heatmap PNG per method.
    #[arg(long)]
    output: PathBuf,
    /// Most tokens per answer (greedy).
    #[arg(long, default_value_t = 64)]
    max_new_tokens: usize,
    #[command(flatten)]
    essays: EssaysArg,
    /// Also write every cell's exact prompt token ids to prompts.json (for scripts/niah_hf.py).
    #[arg(long)]
    dump_prompts: bool,
    /// Write prompts.json and stop before running the engine.
    #[arg(long, requires = "dump_prompts")]
    prompts_only: bool,
    /// HF transformers' answers (hf_answers.json from scripts/niah_hf.py, made from this run's
    /// prompts.json): write the cell-by-cell agreement of the `none` method with them.
    #[arg(long)]
    compare_hf: Option<PathBuf>,
    /// NVIDIA kvpress's answers (kvpress_answers.json from scripts/niah_kvpress.py, made from
    /// this run's prompts.json): draw each method's heatmaps side by side, mean accuracy against
    /// ratio for both systems, and the KV bytes each held.
    #[arg(long)]
    compare_kvpress: Option<PathBuf>,
    /// An earlier run's niah_results.json: skip the engine and only write the summary, the
    /// heatmaps and the comparisons from it.
    #[arg(long, conflicts_with_all = ["dump_prompts", "compare_hf"])]
    results: Option<PathBuf>,
    #[command(flatten)]
    engine: EngineArgs,
}

/// One cell's prompt.
struct CellPrompt {
    context_tokens: usize,
    depth_percent: f64,
    ids: Vec<u32>,
    /// Index in `ids` of the needle's first token.
    needle_index: usize,
    /// The last tokens of `ids` after the haystack: the question and the chat template's tail.
    question_tokens: usize,
}

fn parse_protocol(text: &str) -> Result<NiahProtocol, String> {
    NiahProtocol::from_name(text).ok_or_else(|| {
        let names: Vec<&str> = NiahProtocol::ALL.iter().map(|p| p.name()).collect();
        format!("unknown protocol `{text}` (expected one of {names:?})")
    })
}

/// Runs `starling bench niah`.
pub fn run(args: NiahArgs) -> Result<()> {
    if args.max_new_tokens == 0 {
        bail!("--max-new-tokens must be at least 1");
    }
    if args.compare_hf.is_some() && !args.methods.iter().any(|m| m.trim() == "none") {
        bail!("--compare-hf compares the `none` method: include it in --methods");
    }
    if let Some(path) = &args.results {
        let text =
            std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
        let report: NiahReport = serde_json::from_str(&text)
            .with_context(|| format!("{} is not a niah_results.json document", path.display()))?;
        std::fs::create_dir_all(&args.output)
            .with_context(|| format!("creating {}", args.output.display()))?;
        return write_outputs(&report, report.markdown(), &args);
    }
    with_backend(args.engine.device, args)
}

impl BackendJob for NiahArgs {
    fn run<B: Backend + 'static>(self, backend: B) -> Result<()> {
        niah(backend, self)
    }
}

fn niah<B: Backend + 'static>(backend: B, args: NiahArgs) -> Result<()> {
    let contexts = args
        .contexts
        .iter()
        .map(|c| parse_context_tokens(c))
        .collect::<Result<Vec<_>, _>>()?;
    check_depths(&args.depths)?;
    let methods = parse_methods(&args.methods)?;
    let configs = methods
        .iter()
        .map(compression_for)
        .collect::<Result<Vec<_>>>()?;
    let essays = args.essays.load()?;
    let mut session = open_session(backend, &args.model, &args.engine)?;
    let max_len = session.engine.scheduler_config().max_model_len_tokens;
    if let Some(&too_long) = contexts
        .iter()
        .find(|&&n| n + args.max_new_tokens > max_len)
    {
        bail!(
            "context {too_long} + {} new tokens exceeds max_model_len {max_len}",
            args.max_new_tokens
        );
    }
    let prompts = build_prompts(
        &session.tokenizer,
        essays.standard_split().haystack,
        &contexts,
        &args.depths,
    )?;
    std::fs::create_dir_all(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let eos_token_ids = session.engine.model().config().eos_token_ids.clone();
    if args.dump_prompts {
        let dump = PromptDump {
            model: args.model.display_name(),
            max_new_tokens: args.max_new_tokens,
            eos_token_ids: eos_token_ids.clone(),
            protocol: args.protocol.name().to_owned(),
            cells: prompts
                .iter()
                .map(|p| PromptCell {
                    context_tokens: p.context_tokens,
                    depth_percent: p.depth_percent,
                    prompt_ids: p.ids.clone(),
                    question_tokens: p.question_tokens,
                })
                .collect(),
        };
        write_json(&args.output.join("prompts.json"), &dump)?;
        if args.prompts_only {
            eprintln!(
                "{} prompts written to {}",
                prompts.len(),
                args.output.join("prompts.json").display()
            );
            return Ok(());
        }
    }
    // Every layer's bytes of one token kept in full (a hybrid model's sizing counts one cache
    // group's layers per block; the cells report the blocks really held).
    let bytes_per_token = session.engine.cache_report().bytes_per_token;
    let mut cells = Vec::with_capacity(prompts.len() * methods.len());
    for (spec, config) in methods.iter().zip(&configs) {
        cells.extend(run_method(
            &mut session.engine,
            spec,
            config,
            &prompts,
            RunSettings {
                max_new_tokens: args.max_new_tokens,
                protocol: args.protocol,
            },
        )?);
    }
    let cache = session.engine.cache_report();
    let report = NiahReport {
        model: args.model.display_name(),
        device: session.engine.backend_name(),
        contexts_tokens: contexts,
        depths_percent: args.depths.clone(),
        max_new_tokens: args.max_new_tokens,
        kv_bytes_per_token: bytes_per_token,
        essays_sha256: essays.sha256(),
        needle: NEEDLE.to_owned(),
        question: QUESTION.to_owned(),
        protocol: args.protocol.name().to_owned(),
        methods: methods
            .iter()
            .zip(&configs)
            .map(|(spec, config)| MethodRun {
                label: spec.label(),
                compression: config.to_json(),
            })
            .collect(),
        model_compression: args
            .engine
            .kv_compression
            .star_kv()
            .map(|_| checkpoint_by_name(args.engine.kv_compression.to_json())),
        kv_cache: Some(serde_json::to_value(&cache)?),
        kv_cache_summary: Some(cache.to_string()),
        cells,
    };
    let mut markdown = report.markdown();
    if let Some(path) = &args.compare_hf {
        markdown.push('\n');
        markdown.push_str(&write_hf_agreement(
            &report,
            path,
            &eos_token_ids,
            &args.output,
        )?);
    }
    write_json(&args.output.join("niah_results.json"), &report)?;
    write_outputs(&report, markdown, &args)
}

/// The summary (with the kvpress comparison when asked), one heatmap per method, and with
/// `--compare-kvpress` the side-by-side heatmaps and the ratio chart.
fn write_outputs(report: &NiahReport, mut markdown: String, args: &NiahArgs) -> Result<()> {
    if let Some(path) = &args.compare_kvpress {
        markdown.push('\n');
        markdown.push_str(&write_kvpress_comparison(report, path, &args.output)?);
    }
    let summary = args.output.join("niah_summary.md");
    std::fs::write(&summary, &markdown)
        .with_context(|| format!("writing {}", summary.display()))?;
    for method in &report.methods {
        let spec = MethodSpec::parse(&method.label)?;
        let path = args
            .output
            .join(format!("heatmap_{}.png", spec.file_stem()));
        write_heatmap_png(report, &method.label, &path)?;
    }
    println!("{markdown}");
    eprintln!("results written to {}", args.output.display());
    Ok(())
}

/// Lines Starling's cells up with kvpress's; writes kvpress_comparison.{json,md}, one
/// `compare_<method>.png` heatmap pair per method and `accuracy_vs_ratio.png`; returns the
/// markdown.
fn write_kvpress_comparison(report: &NiahReport, path: &Path, output: &Path) -> Result<String> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let kvpress: KvpressAnswers = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a kvpress_answers.json document", path.display()))?;
    let rows = compare_with_kvpress(report, &kvpress)?;
    for method in &report.methods {
        let spec = MethodSpec::parse(&method.label)?;
        let mut ours = HeatmapGrid::of_report(report, &method.label);
        ours.title = format!("Starling {}", ours.title);
        let theirs = kvpress_grid(report, &kvpress, &method.label);
        let title = format!(
            "NIAH {} ({}): Starling | kvpress",
            method.label, report.protocol
        );
        let png = output.join(format!("compare_{}.png", spec.file_stem()));
        write_heatmap_pair_png(&title, &ours, &theirs, &png)?;
    }
    if rows.iter().any(|r| r.ratio > 0.0) {
        let title = format!(
            "NIAH accuracy vs compression ratio ({}, {}): Starling solid, kvpress dashed",
            report.model, report.protocol
        );
        write_ratio_chart_png(&rows, &title, &output.join("accuracy_vs_ratio.png"))?;
    }
    let doc = serde_json::json!({ "kvpress_generator": kvpress.generator, "rows": rows });
    write_json(&output.join("kvpress_comparison.json"), &doc)?;
    let markdown = comparison_markdown(&rows, &kvpress);
    let md_path = output.join("kvpress_comparison.md");
    std::fs::write(&md_path, &markdown)
        .with_context(|| format!("writing {}", md_path.display()))?;
    Ok(markdown)
}

/// Every (context, depth) cell's prompt: the rendered chat template's two halves around a
/// haystack that fills the context exactly.
fn build_prompts(
    tokenizer: &Tokenizer,
    haystack_essays: &[starling_hub::Essay],
    contexts: &[usize],
    depths: &[f64],
) -> Result<Vec<CellPrompt>> {
    let template = ChatTemplate::for_tokenizer(tokenizer)?;
    let chat: Vec<ChatMessage> = messages(CONTEXT_PLACEHOLDER)
        .into_iter()
        .map(|(role, content)| ChatMessage::new(role, content))
        .collect();
    let rendered = template
        .render(&chat, true)
        .context("rendering the chat template")?;
    let (before, after) = split_at_placeholder(&rendered)?;
    // The template already placed any BOS / special tokens.
    let prefix = tokenizer.encode(before, false)?;
    let suffix = tokenizer.encode(after, false)?;
    let needle_ids = tokenizer.encode(NEEDLE_INSERT, false)?;
    let period_ids = tokenizer.encode(".", false)?;
    let longest = contexts.iter().copied().max().unwrap_or(0);
    let text_ids = essay_tokens(tokenizer, haystack_essays, longest)?;
    let source = HaystackSource {
        text_ids: &text_ids,
        needle_ids: &needle_ids,
        period_ids: &period_ids,
    };
    let overhead = prefix.len() + suffix.len();
    let mut prompts = Vec::with_capacity(contexts.len() * depths.len());
    for &context_tokens in contexts {
        let Some(haystack_tokens) = context_tokens.checked_sub(overhead) else {
            bail!(
                "context {context_tokens} is shorter than the {overhead} tokens of chat template and question"
            );
        };
        for &depth_percent in depths {
            let haystack = source.build(haystack_tokens, depth_percent)?;
            let mut ids = Vec::with_capacity(context_tokens);
            ids.extend_from_slice(&prefix);
            ids.extend_from_slice(&haystack.ids);
            ids.extend_from_slice(&suffix);
            prompts.push(CellPrompt {
                context_tokens,
                depth_percent,
                ids,
                needle_index: prefix.len() + haystack.needle_start,
                question_tokens: suffix.len(),
            });
        }
    }
    Ok(prompts)
}

/// What is collected of one request while it runs.
#[derive(Default)]
struct RunState {
    answer: String,
    output_ids: Vec<u32>,
    kv_tokens_peak: usize,
    kv_tokens_final: usize,
    kv_bytes_peak: u64,
    kv_bytes_final: u64,
    finish_reason: Option<&'static str>,
}

/// What every method of a run shares.
#[derive(Clone, Copy)]
struct RunSettings {
    max_new_tokens: usize,
    protocol: NiahProtocol,
}

/// Submits every prompt with `config` at once, steps the engine until all finish, and scores
/// the answers.
fn run_method<B: Backend>(
    engine: &mut Engine<B>,
    spec: &MethodSpec,
    config: &CompressionConfig,
    prompts: &[CellPrompt],
    settings: RunSettings,
) -> Result<Vec<NiahCell>> {
    let RunSettings {
        max_new_tokens,
        protocol,
    } = settings;
    let params = SamplingParams {
        temperature: 0.0,
        max_tokens: Some(max_new_tokens),
        ..SamplingParams::default()
    };
    let mut index_of = HashMap::with_capacity(prompts.len());
    for (index, prompt) in prompts.iter().enumerate() {
        let options = RequestOptions {
            compression: Some(config.clone()),
            question_tokens: (protocol == NiahProtocol::ContextQuestion)
                .then_some(prompt.question_tokens),
            ..RequestOptions::default()
        };
        let id = engine.add_request_with(prompt.ids.clone(), params.clone(), options)?;
        index_of.insert(id, index);
    }
    let mut states: Vec<RunState> = prompts.iter().map(|_| RunState::default()).collect();
    let bar = progress_bar(prompts.len(), format!("niah {}", spec.label()));
    while engine.has_unfinished() {
        for out in engine.step()? {
            let Some(state) = index_of.get(&out.seq_id).map(|&i| &mut states[i]) else {
                continue;
            };
            state.answer.push_str(&out.text_delta);
            state.output_ids.extend(out.token_id);
            state.kv_tokens_peak = state.kv_tokens_peak.max(out.kv_physical_tokens);
            state.kv_tokens_final = out.kv_physical_tokens;
            state.kv_bytes_peak = state.kv_bytes_peak.max(out.kv_held_bytes);
            state.kv_bytes_final = out.kv_held_bytes;
            if let Some(finished) = out.finished {
                state.finish_reason = Some(finished.reason.as_str());
                bar.inc(1);
            }
        }
    }
    bar.finish_and_clear();
    let label = spec.label();
    prompts
        .iter()
        .zip(states)
        .map(|(prompt, state)| {
            let Some(finish_reason) = state.finish_reason else {
                bail!(
                    "{label}: the request for context {} depth {} never finished",
                    prompt.context_tokens,
                    prompt.depth_percent
                );
            };
            Ok(NiahCell {
                method: label.clone(),
                context_tokens: prompt.context_tokens,
                depth_percent: prompt.depth_percent,
                prompt_tokens: prompt.ids.len(),
                needle_token_index: prompt.needle_index,
                question_tokens: match protocol {
                    NiahProtocol::WholePrompt => 0,
                    NiahProtocol::ContextQuestion => prompt.question_tokens,
                },
                fact_score: fact_score(&state.answer, &NEEDLE_FACTS),
                rouge_l_recall: rouge_l_recall(NEEDLE, &state.answer),
                answer: state.answer,
                output_ids: state.output_ids,
                finish_reason: finish_reason.to_owned(),
                kv_tokens_peak: state.kv_tokens_peak,
                kv_tokens_final: state.kv_tokens_final,
                kv_bytes_peak: state.kv_bytes_peak,
                kv_bytes_final: state.kv_bytes_final,
            })
        })
        .collect()
}

/// Compares the `none` cells with HF's answers; writes hf_agreement.{json,md} and returns the
/// markdown.
fn write_hf_agreement(
    report: &NiahReport,
    hf_path: &Path,
    eos_token_ids: &[u32],
    output: &Path,
) -> Result<String> {
    let text = std::fs::read_to_string(hf_path)
        .with_context(|| format!("reading {}", hf_path.display()))?;
    let hf: HfAnswers = serde_json::from_str(&text)
        .with_context(|| format!("{} is not an hf_answers.json document", hf_path.display()))?;
    let ours: Vec<&NiahCell> = report.cells_of("none").collect();
    let rows = compare_with_hf(&ours, &hf, eos_token_ids)?;
    let identical = rows.iter().filter(|r| r.identical).count();
    eprintln!(
        "HF agreement: {identical} of {} cells identical ({})",
        rows.len(),
        rows.iter()
            .filter(|r| !r.identical)
            .map(|r| format!("{}@{}%", context_label(r.context_tokens), r.depth_percent))
            .collect::<Vec<_>>()
            .join(", ")
    );
    let doc = serde_json::json!({ "hf_generator": hf.generator, "rows": rows });
    write_json(&output.join("hf_agreement.json"), &doc)?;
    let markdown = agreement_markdown(&rows);
    let path = output.join("hf_agreement.md");
    std::fs::write(&path, &markdown).with_context(|| format!("writing {}", path.display()))?;
    Ok(markdown)
}

/// A `--kv-compression` JSON value as result files record it: every `checkpoint` path replaced
/// by the directory's name (results leave the machine; the manifest identifies the weights).
fn checkpoint_by_name(mut value: serde_json::Value) -> serde_json::Value {
    if let Some(map) = value.as_object_mut() {
        for (key, field) in map.iter_mut() {
            match (key.as_str(), field.as_str()) {
                ("checkpoint", Some(path)) => {
                    let name = std::path::Path::new(path)
                        .file_name()
                        .map_or_else(|| path.to_owned(), |n| n.to_string_lossy().into_owned());
                    *field = serde_json::Value::from(name);
                }
                _ => *field = checkpoint_by_name(field.take()),
            }
        }
    }
    value
}

#[cfg(test)]
mod tests {
    use super::checkpoint_by_name;

    #[test]
    fn result_files_name_a_checkpoint_by_its_directory() {
        let flat = serde_json::json!({"method": "star_kv", "checkpoint": "/data/ck/balanced", "rank_profile": "balanced"});
        assert_eq!(checkpoint_by_name(flat)["checkpoint"], "balanced");
        let composed = serde_json::json!({
            "star_kv": {"checkpoint": "runs/qwen-ck", "rank_profile": "balanced"},
            "eviction": {"method": "keydiff", "ratio": 0.5}
        });
        let named = checkpoint_by_name(composed);
        assert_eq!(named["star_kv"]["checkpoint"], "qwen-ck");
        assert_eq!(named["eviction"]["ratio"], 0.5);
    }
}
