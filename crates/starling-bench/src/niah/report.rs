//! NIAH result records, their JSON document, and the markdown summary.

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::niah::grid::context_label;
use crate::quality::mean;

/// One run: one method on one (context length, depth) cell.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NiahCell {
    /// The method label (`none`, `keydiff@0.5`).
    pub method: String,
    /// The cell's context length (the prompt's exact length), tokens.
    pub context_tokens: usize,
    /// The needle's requested depth, percent of the haystack.
    pub depth_percent: f64,
    /// Prompt length actually sent, tokens (equals `context_tokens`).
    pub prompt_tokens: usize,
    /// Index in the prompt of the needle's first token.
    pub needle_token_index: usize,
    /// The prompt's last tokens kept out of compression under the context/question split (the
    /// question and the chat template's tail); 0 when the whole prompt was compressed.
    #[serde(default)]
    pub question_tokens: usize,
    /// The generated answer.
    pub answer: String,
    /// The generated token ids (end-of-sequence token included when one was generated).
    pub output_ids: Vec<u32>,
    /// `stop`, `length` or `abort`.
    pub finish_reason: String,
    /// Share of the needle's facts in the answer, `[0, 1]`.
    pub fact_score: f64,
    /// ROUGE-L recall of the needle in the answer, `[0, 1]`.
    pub rouge_l_recall: f64,
    /// Most KV slots the request held after any of its steps, tokens (a compression due in a
    /// step has already run when the step reports, so a transient inside a step is not seen).
    pub kv_tokens_peak: usize,
    /// KV slots held after the last step, tokens.
    pub kv_tokens_final: usize,
    /// Most bytes of cache blocks the request held after any of its steps (all layers and
    /// cache groups, partly filled blocks whole: a hybrid sliding-window model's windowed
    /// layers hold about one window).
    pub kv_bytes_peak: u64,
    /// Bytes of cache blocks held after the last step.
    pub kv_bytes_final: u64,
}

/// A method of the run and the full compression config it ran with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct MethodRun {
    /// The label (`keydiff@0.5`).
    pub label: String,
    /// Every field of the compression config, as JSON.
    pub compression: Value,
}

/// The whole run: the `niah_results.json` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct NiahReport {
    /// The model argument.
    pub model: String,
    /// Backend name.
    pub device: String,
    /// Context lengths, tokens, in the order given.
    pub contexts_tokens: Vec<usize>,
    /// Needle depths, percent, in the order given.
    pub depths_percent: Vec<f64>,
    /// Most tokens generated per answer.
    pub max_new_tokens: usize,
    /// KV-cache bytes per token (all layers) of the engine's layout.
    pub kv_bytes_per_token: u64,
    /// Set digest of the essays used (see `starling_hub::EssaySet::sha256`).
    pub essays_sha256: String,
    /// The needle.
    pub needle: String,
    /// The question.
    pub question: String,
    /// The protocol's name ([`crate::niah::NiahProtocol::name`]).
    #[serde(default = "crate::niah::hf_compare::whole_prompt")]
    pub protocol: String,
    /// The methods, in the order run.
    pub methods: Vec<MethodRun>,
    /// A model-level K/V compression every method ran on top of (a STAR-KV checkpoint and
    /// profile, `--kv-compression`), absent for the original model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model_compression: Option<Value>,
    /// The engine's KV cache (`starling_engine::CacheReport` as JSON: layout, bytes per token,
    /// blocks, longest context); absent in results written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<Value>,
    /// The same in one line, for the summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_summary: Option<String>,
    /// Every cell of every method.
    pub cells: Vec<NiahCell>,
}

impl NiahReport {
    /// The cells of one method.
    pub fn cells_of<'a>(&'a self, method: &'a str) -> impl Iterator<Item = &'a NiahCell> + 'a {
        self.cells.iter().filter(move |c| c.method == method)
    }

    /// The mean of `metric` over the cells of `method` (and of `context_tokens`, when given).
    pub fn mean_of(
        &self,
        method: &str,
        context_tokens: Option<usize>,
        metric: impl Fn(&NiahCell) -> f64,
    ) -> Option<f64> {
        let values: Vec<f64> = self
            .cells_of(method)
            .filter(|c| context_tokens.is_none_or(|n| c.context_tokens == n))
            .map(metric)
            .collect();
        mean(&values)
    }

    /// A table with one row per method and one column per context length plus the overall
    /// mean, each cell the mean of `metric` over the depths, formatted by `format`.
    pub fn table(
        &self,
        metric: impl Fn(&NiahCell) -> f64,
        format: impl Fn(f64) -> String,
    ) -> String {
        let mut out = String::from("| method |");
        for &n in &self.contexts_tokens {
            let _ = write!(out, " {} |", context_label(n));
        }
        out.push_str(" mean |\n|---|");
        out.push_str(&"---:|".repeat(self.contexts_tokens.len() + 1));
        out.push('\n');
        let cell = |v: Option<f64>| v.map_or_else(|| "–".to_owned(), &format);
        for method in &self.methods {
            let _ = write!(out, "| {} |", method.label);
            for &n in &self.contexts_tokens {
                let _ = write!(
                    out,
                    " {} |",
                    cell(self.mean_of(&method.label, Some(n), &metric))
                );
            }
            let _ = writeln!(
                out,
                " {} |",
                cell(self.mean_of(&method.label, None, &metric))
            );
        }
        out
    }

    /// The markdown summary: the settings, then accuracy (needle facts, %), ROUGE-L recall (%)
    /// and the KV cache held at the end of each run.
    pub fn markdown(&self) -> String {
        let percent = |v: f64| format!("{:.1}", 100.0 * v);
        let mut out = String::new();
        let depths: Vec<String> = self.depths_percent.iter().map(|d| d.to_string()).collect();
        let _ = writeln!(
            out,
            "## Needle in a haystack: {} on {}\n\ndepths {}%, greedy, at most {} new tokens, KV {} bytes/token, essays sha256 {}\n",
            self.model,
            self.device,
            depths.join(", "),
            self.max_new_tokens,
            self.kv_bytes_per_token,
            self.essays_sha256
        );
        if let Some(protocol) = crate::niah::NiahProtocol::from_name(&self.protocol) {
            let _ = writeln!(out, "{}\n", protocol.description());
        }
        if let Some(cache) = &self.kv_cache_summary {
            let _ = writeln!(out, "KV cache: {cache}\n");
        }
        if let Some(model) = &self.model_compression {
            let _ = writeln!(
                out,
                "Model K/V projections: `{model}` (every method runs on it)\n"
            );
        }
        let _ = writeln!(out, "Compression configs:\n");
        for method in &self.methods {
            let _ = writeln!(out, "- `{}`: `{}`", method.label, method.compression);
        }
        let _ = writeln!(
            out,
            "\n### Accuracy: needle facts found (%), mean over depths\n"
        );
        out.push_str(&self.table(|c| c.fact_score, percent));
        let _ = writeln!(
            out,
            "\n### ROUGE-L recall of the needle (%), mean over depths\n"
        );
        out.push_str(&self.table(|c| c.rouge_l_recall, percent));
        let _ = writeln!(
            out,
            "\n### KV cache held at the end of a run (MiB), mean over depths\n"
        );
        out.push_str(&self.table(
            |c| c.kv_bytes_final as f64 / (1024.0 * 1024.0),
            |v| format!("{v:.2}"),
        ));
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A cell of `method` with the given scores and KV figures.
    pub(crate) fn cell(
        method: &str,
        context: usize,
        depth: f64,
        fact: f64,
        rouge: f64,
    ) -> NiahCell {
        NiahCell {
            method: method.to_owned(),
            context_tokens: context,
            depth_percent: depth,
            prompt_tokens: context,
            needle_token_index: 0,
            question_tokens: 0,
            answer: String::new(),
            output_ids: Vec::new(),
            finish_reason: "stop".to_owned(),
            fact_score: fact,
            rouge_l_recall: rouge,
            kv_tokens_peak: context,
            kv_tokens_final: context,
            kv_bytes_peak: context as u64 * 1024,
            kv_bytes_final: context as u64 * 1024,
        }
    }

    pub(crate) fn report(cells: Vec<NiahCell>) -> NiahReport {
        NiahReport {
            model: "m".into(),
            device: "cpu".into(),
            contexts_tokens: vec![1024, 2048],
            depths_percent: vec![0.0, 100.0],
            max_new_tokens: 8,
            kv_bytes_per_token: 1024,
            essays_sha256: "abc".into(),
            needle: "n".into(),
            question: "q".into(),
            protocol: "context-question".into(),
            methods: vec![
                MethodRun {
                    label: "none".into(),
                    compression: serde_json::json!({"method": "none"}),
                },
                MethodRun {
                    label: "keydiff@0.5".into(),
                    compression: serde_json::json!({"method": "keydiff", "ratio": 0.5}),
                },
            ],
            model_compression: None,
            kv_cache: None,
            kv_cache_summary: Some("full K/V in f32: 1.00 KiB per token".into()),
            cells,
        }
    }

    #[test]
    fn table_rows_are_methods_and_columns_contexts_plus_mean() {
        let r = report(vec![
            cell("none", 1024, 0.0, 1.0, 1.0),
            cell("none", 1024, 100.0, 0.5, 0.0),
            cell("none", 2048, 0.0, 1.0, 1.0),
            cell("none", 2048, 100.0, 1.0, 1.0),
            cell("keydiff@0.5", 1024, 0.0, 0.0, 0.0),
            cell("keydiff@0.5", 1024, 100.0, 1.0 / 3.0, 0.0),
        ]);
        let table = r.table(|c| c.fact_score, |v| format!("{:.1}", 100.0 * v));
        let lines: Vec<&str> = table.lines().collect();
        assert_eq!(lines[0], "| method | 1k | 2k | mean |");
        assert_eq!(lines[1], "|---|---:|---:|---:|");
        // none: 1k (1 + 0.5)/2 = 75; 2k 100; all four cells 3.5/4 = 87.5.
        assert_eq!(lines[2], "| none | 75.0 | 100.0 | 87.5 |");
        // keydiff: 1k (0 + 1/3)/2 = 16.7; 2k has no cells.
        assert_eq!(lines[3], "| keydiff@0.5 | 16.7 | – | 16.7 |");
        let md = r.markdown();
        assert!(
            md.contains("`keydiff@0.5`: `{\"method\":\"keydiff\",\"ratio\":0.5}`"),
            "{md}"
        );
        assert!(md.contains("| none | 1.00 | 2.00 | 1.50 |"), "{md}");
        assert!(md.contains("they see the question"), "{md}");
        assert!(
            md.contains("KV cache: full K/V in f32: 1.00 KiB per token\n"),
            "{md}"
        );
    }

    #[test]
    fn the_report_round_trips_through_json() {
        let r = report(vec![cell("none", 1024, 50.0, 1.0, 0.5)]);
        let text = serde_json::to_string(&r).unwrap();
        let back: NiahReport = serde_json::from_str(&text).unwrap();
        assert_eq!(back, r);
    }
}
