//! Cell-by-cell agreement of Starling's uncompressed answers with HF transformers'.
//!
//! `starling bench niah --dump-prompts` writes every cell's exact prompt token ids
//! ([`PromptDump`]); `scripts/niah_hf.py` runs them through transformers greedily and writes
//! [`HfAnswers`]; [`compare_with_hf`] lines both up by (context, depth).

use std::fmt::Write as _;

use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::niah::grid::context_label;
use crate::niah::report::NiahCell;
use crate::niah::score::{fact_score, rouge_l_recall, NEEDLE_FACTS};
use crate::niah::NEEDLE;

/// One cell's prompt, as sent to the engine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptCell {
    /// The cell's context length, tokens.
    pub context_tokens: usize,
    /// The needle depth, percent.
    pub depth_percent: f64,
    /// The exact prompt token ids (chat template applied).
    pub prompt_ids: Vec<u32>,
    /// The prompt's last tokens that form the question and the chat template's tail (what the
    /// context/question split keeps uncompressed); 0 in dumps written before it existed.
    #[serde(default)]
    pub question_tokens: usize,
}

/// The `prompts.json` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PromptDump {
    /// The model argument.
    pub model: String,
    /// Most tokens to generate per answer (the HF side uses the same).
    pub max_new_tokens: usize,
    /// Token ids that end an answer (not counted when comparing).
    pub eos_token_ids: Vec<u32>,
    /// The protocol's name ([`crate::niah::NiahProtocol::name`]).
    #[serde(default = "whole_prompt")]
    pub protocol: String,
    /// Every cell.
    pub cells: Vec<PromptCell>,
}

/// The protocol of documents written before the field existed.
pub(crate) fn whole_prompt() -> String {
    crate::niah::NiahProtocol::WholePrompt.name().to_owned()
}

/// One cell's HF answer.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfCell {
    /// The cell's context length, tokens.
    pub context_tokens: usize,
    /// The needle depth, percent.
    pub depth_percent: f64,
    /// Prompt length HF saw, tokens.
    pub prompt_tokens: usize,
    /// Generated ids (up to and excluding the first end-of-sequence token).
    pub output_ids: Vec<u32>,
    /// The decoded answer.
    pub answer: String,
}

/// The `hf_answers.json` document written by `scripts/niah_hf.py`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct HfAnswers {
    /// What produced it (library versions, dtype, device).
    pub generator: serde_json::Value,
    /// Every cell.
    pub cells: Vec<HfCell>,
}

/// One cell of the agreement table.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AgreementRow {
    /// Context length, tokens.
    pub context_tokens: usize,
    /// Needle depth, percent.
    pub depth_percent: f64,
    /// The generated ids are identical (end-of-sequence tokens aside).
    pub identical: bool,
    /// How many leading generated tokens agree.
    pub common_prefix_tokens: usize,
    /// Generated tokens, Starling / HF.
    pub output_tokens: (usize, usize),
    /// Needle facts found, Starling / HF, `[0, 1]`.
    pub fact_score: (f64, f64),
    /// ROUGE-L recall, Starling / HF, `[0, 1]`.
    pub rouge_l_recall: (f64, f64),
}

/// Lines up Starling's cells (one method, normally `none`) with HF's by (context, depth).
/// Every Starling cell must have an HF answer for the same prompt length; `eos_token_ids` are
/// dropped from the end of Starling's ids before comparing (HF's stop before them).
pub fn compare_with_hf(
    starling: &[&NiahCell],
    hf: &HfAnswers,
    eos_token_ids: &[u32],
) -> Result<Vec<AgreementRow>, BenchError> {
    starling
        .iter()
        .map(|cell| {
            let other = hf
                .cells
                .iter()
                .find(|h| {
                    h.context_tokens == cell.context_tokens && h.depth_percent == cell.depth_percent
                })
                .ok_or_else(|| {
                    BenchError::Invalid(format!(
                        "the HF answers have no cell for context {} depth {}",
                        cell.context_tokens, cell.depth_percent
                    ))
                })?;
            if other.prompt_tokens != cell.prompt_tokens {
                return Err(BenchError::Invalid(format!(
                    "context {} depth {}: HF saw a {}-token prompt, Starling {}; were the answers made from this run's prompts.json?",
                    cell.context_tokens, cell.depth_percent, other.prompt_tokens, cell.prompt_tokens
                )));
            }
            let mut ours: &[u32] = &cell.output_ids;
            while let Some((last, rest)) = ours.split_last() {
                if !eos_token_ids.contains(last) {
                    break;
                }
                ours = rest;
            }
            let common = ours
                .iter()
                .zip(&other.output_ids)
                .take_while(|(a, b)| a == b)
                .count();
            Ok(AgreementRow {
                context_tokens: cell.context_tokens,
                depth_percent: cell.depth_percent,
                identical: ours == other.output_ids.as_slice(),
                common_prefix_tokens: common,
                output_tokens: (ours.len(), other.output_ids.len()),
                fact_score: (cell.fact_score, fact_score(&other.answer, &NEEDLE_FACTS)),
                rouge_l_recall: (cell.rouge_l_recall, rouge_l_recall(NEEDLE, &other.answer)),
            })
        })
        .collect()
}

/// The agreement as markdown: a summary line, then one row per cell.
pub fn agreement_markdown(rows: &[AgreementRow]) -> String {
    let identical = rows.iter().filter(|r| r.identical).count();
    let same_facts = rows
        .iter()
        .filter(|r| r.fact_score.0 == r.fact_score.1)
        .count();
    let mut out = format!(
        "### Starling `none` vs HF transformers, same prompt ids, greedy\n\n\
         {identical} of {} cells generate identical tokens; {same_facts} of {} score the same needle facts.\n\n\
         | context | depth % | identical | common prefix | tokens (Starling / HF) | facts % (Starling / HF) | ROUGE-L % (Starling / HF) |\n\
         |---:|---:|:---:|---:|---:|---:|---:|\n",
        rows.len(),
        rows.len()
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} / {} | {:.0} / {:.0} | {:.0} / {:.0} |",
            context_label(r.context_tokens),
            r.depth_percent,
            if r.identical { "yes" } else { "no" },
            r.common_prefix_tokens,
            r.output_tokens.0,
            r.output_tokens.1,
            100.0 * r.fact_score.0,
            100.0 * r.fact_score.1,
            100.0 * r.rouge_l_recall.0,
            100.0 * r.rouge_l_recall.1
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::niah::report::tests::cell;

    fn hf_cell(context: usize, depth: f64, ids: Vec<u32>, answer: &str) -> HfCell {
        HfCell {
            context_tokens: context,
            depth_percent: depth,
            prompt_tokens: context,
            output_ids: ids,
            answer: answer.to_owned(),
        }
    }

    #[test]
    fn agreement_strips_eos_and_counts_the_common_prefix() {
        let mut a = cell("none", 1024, 0.0, 1.0, 1.0);
        a.output_ids = vec![5, 6, 7, 2];
        let mut b = cell("none", 1024, 50.0, 0.0, 0.0);
        b.output_ids = vec![5, 9, 9];
        let hf = HfAnswers {
            generator: serde_json::json!({}),
            cells: vec![
                hf_cell(1024, 50.0, vec![5, 6], "Visit Dolores Park"),
                hf_cell(1024, 0.0, vec![5, 6, 7], NEEDLE),
            ],
        };
        let rows = compare_with_hf(&[&a, &b], &hf, &[2]).unwrap();
        assert!(rows[0].identical);
        assert_eq!(rows[0].common_prefix_tokens, 3);
        assert_eq!(rows[0].output_tokens, (3, 3));
        assert_eq!(rows[0].fact_score, (1.0, 1.0));
        assert!(!rows[1].identical);
        assert_eq!(rows[1].common_prefix_tokens, 1);
        assert!((rows[1].fact_score.1 - 1.0 / 3.0).abs() < 1e-12);
        let md = agreement_markdown(&rows);
        assert!(
            md.contains("1 of 2 cells generate identical tokens"),
            "{md}"
        );
        assert!(
            md.contains("| 1k | 0 | yes | 3 | 3 / 3 | 100 / 100 | 100 / 100 |"),
            "{md}"
        );
    }

    #[test]
    fn missing_or_mismatched_cells_are_errors() {
        let a = cell("none", 1024, 0.0, 1.0, 1.0);
        let empty = HfAnswers {
            generator: serde_json::json!({}),
            cells: vec![],
        };
        assert!(compare_with_hf(&[&a], &empty, &[]).is_err());
        let mut other = hf_cell(1024, 0.0, vec![], "");
        other.prompt_tokens = 1000;
        let hf = HfAnswers {
            generator: serde_json::json!({}),
            cells: vec![other],
        };
        let err = compare_with_hf(&[&a], &hf, &[]).unwrap_err();
        assert!(err.to_string().contains("1000-token prompt"), "{err}");
    }
}
