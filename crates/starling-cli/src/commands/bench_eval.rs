//! What `bench niah` and `bench quality` share: the essays, compression methods as configs,
//! essay text as token ids, and the progress bar.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use clap::Args;
use indicatif::{ProgressBar, ProgressStyle};
use starling_bench::niah::MethodSpec;
use starling_evict::CompressionConfig;
use starling_hub::{fetch_essays, Essay, EssaySet, EssaySource, FetchOptions};
use starling_models::tokenizer::Tokenizer;

/// Where the Paul Graham essays come from.
#[derive(Args, Debug, Clone)]
pub struct EssaysArg {
    /// A folder of `*.txt` essays to use instead of the fetched Paul Graham essays (e.g. a copy
    /// carried to a machine without network access). Its digest is recorded in the results.
    #[arg(long)]
    pub essays_dir: Option<PathBuf>,
}

impl EssaysArg {
    /// The essays: from `--essays-dir`, or fetched (and verified) into the cache.
    pub fn load(&self) -> Result<EssaySet> {
        let Some(dir) = &self.essays_dir else {
            return Ok(fetch_essays(&FetchOptions::from_env()?)?);
        };
        let set = EssaySet::from_dir(dir)?;
        let official = EssaySource::paul_graham();
        if set.sha256() != official.sha256 {
            eprintln!(
                "note: {} is not the published essay set ({} files, digest {}); results are not comparable with runs on it",
                dir.display(),
                set.len(),
                set.sha256()
            );
        }
        Ok(set)
    }
}

/// The compression config of a method spec (`none`, `keydiff@0.5`), validated.
pub fn compression_for(spec: &MethodSpec) -> Result<CompressionConfig> {
    CompressionConfig::from_value(&spec.to_json())
        .with_context(|| format!("method `{}`", spec.label()))
}

/// Essay text as token ids: the essays in order, each followed by a blank line, tokenised one by
/// one (no special tokens) until at least `min_tokens` ids are collected or the essays run out.
pub fn essay_tokens(
    tokenizer: &Tokenizer,
    essays: &[Essay],
    min_tokens: usize,
) -> Result<Vec<u32>> {
    let mut ids = Vec::with_capacity(min_tokens);
    for essay in essays {
        if ids.len() >= min_tokens {
            break;
        }
        let text = format!("{}\n\n", essay.text.trim_end());
        ids.extend(
            tokenizer
                .encode(&text, false)
                .with_context(|| format!("tokenising essay {}", essay.name))?,
        );
    }
    Ok(ids)
}

/// A bar over `len` requests, drawn on stderr when it is a terminal.
pub fn progress_bar(len: usize, message: String) -> ProgressBar {
    let bar = ProgressBar::new(len as u64);
    // The template is a constant; should it ever fail to parse, the default style is fine.
    if let Ok(style) =
        ProgressStyle::with_template("{msg} [{bar:30}] {pos}/{len} requests ({elapsed}, eta {eta})")
    {
        bar.set_style(style.progress_chars("=> "));
    }
    bar.set_message(message);
    bar
}

/// Writes `value` as pretty JSON.
pub fn write_json(path: &Path, value: &impl serde::Serialize) -> Result<()> {
    std::fs::write(path, serde_json::to_string_pretty(value)?)
        .with_context(|| format!("writing {}", path.display()))
}
