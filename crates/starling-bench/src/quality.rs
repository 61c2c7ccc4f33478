//! `starling bench quality`, the engine-free parts: the math (KL divergence of two log-softmax
//! rows, perplexity from token log-probabilities, means), the evaluation windows over held-out
//! text, pairing each compressed run's next-token distributions with the uncompressed ones as
//! they arrive, and the report.
//!
//! Each window is `context` tokens of prompt followed by `eval` tokens forced one by one
//! (teacher forcing); at every forced position the engine reports the full log-softmax row the
//! token was scored from. The uncompressed run is the reference `p`; a method's KL is the mean
//! over positions of KL(p ‖ q), in nats; perplexity is `exp(−mean log q(forced token))`.

use std::collections::HashMap;
use std::fmt::Write as _;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use crate::error::BenchError;

/// Arithmetic mean; `None` for no values.
pub fn mean(values: &[f64]) -> Option<f64> {
    (!values.is_empty()).then(|| values.iter().sum::<f64>() / values.len() as f64)
}

/// KL(p ‖ q) in nats of two distributions given as log-probabilities (log-softmax rows).
///
/// Terms where `p` is 0 (`−∞`) contribute nothing; a token `p` allows but `q` rules out makes the
/// divergence infinite. Summed in f64.
pub fn kl_divergence(log_p: &[f32], log_q: &[f32]) -> Result<f64, BenchError> {
    if log_p.len() != log_q.len() {
        return Err(BenchError::Invalid(format!(
            "KL of distributions over {} and {} tokens",
            log_p.len(),
            log_q.len()
        )));
    }
    let mut kl = 0.0f64;
    for (&lp, &lq) in log_p.iter().zip(log_q) {
        if lp == f32::NEG_INFINITY {
            continue;
        }
        let (lp, lq) = (lp as f64, lq as f64);
        kl += lp.exp() * (lp - lq);
    }
    // Rounding can leave a hair below zero for identical rows; KL is never negative.
    Ok(kl.max(0.0))
}

/// Perplexity of a sequence from its tokens' natural-log probabilities: `exp(−mean)`; `None`
/// for no tokens.
pub fn perplexity(token_logprobs: &[f64]) -> Option<f64> {
    mean(token_logprobs).map(|m| (-m).exp())
}

/// One evaluation window: the prompt and the tokens forced after it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EvalWindow {
    /// The prompt, `context` tokens.
    pub context_ids: Vec<u32>,
    /// The forced continuation, `eval` tokens.
    pub eval_ids: Vec<u32>,
}

/// `num_windows` consecutive, non-overlapping windows of `context_tokens + eval_tokens` from the
/// start of `ids`.
pub fn eval_windows(
    ids: &[u32],
    context_tokens: usize,
    eval_tokens: usize,
    num_windows: usize,
) -> Result<Vec<EvalWindow>, BenchError> {
    if context_tokens == 0 || eval_tokens == 0 || num_windows == 0 {
        return Err(BenchError::Invalid(
            "context tokens, eval tokens and the number of windows must all be at least 1".into(),
        ));
    }
    let span = context_tokens + eval_tokens;
    let fit = ids.len() / span;
    if fit < num_windows {
        return Err(BenchError::Invalid(format!(
            "the held-out text has {} tokens: {fit} windows of {context_tokens} + {eval_tokens} tokens fit, {num_windows} asked",
            ids.len()
        )));
    }
    Ok(ids
        .chunks_exact(span)
        .take(num_windows)
        .map(|w| EvalWindow {
            context_ids: w[..context_tokens].to_vec(),
            eval_ids: w[context_tokens..].to_vec(),
        })
        .collect())
}

/// Running sums of one stream (the reference or one method).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StreamSums {
    /// Sum of KL(reference ‖ this) over compared positions, nats.
    pub kl_sum: f64,
    /// Positions compared with the reference.
    pub kl_count: usize,
    /// Sum of the forced tokens' log-probabilities.
    pub logprob_sum: f64,
    /// Forced tokens scored.
    pub logprob_count: usize,
}

impl StreamSums {
    /// Adds another window's sums.
    pub fn add(&mut self, other: &StreamSums) {
        self.kl_sum += other.kl_sum;
        self.kl_count += other.kl_count;
        self.logprob_sum += other.logprob_sum;
        self.logprob_count += other.logprob_count;
    }

    /// Mean KL per compared position, nats.
    pub fn mean_kl(&self) -> Option<f64> {
        (self.kl_count > 0).then(|| self.kl_sum / self.kl_count as f64)
    }

    /// Perplexity of the forced tokens.
    pub fn perplexity(&self) -> Option<f64> {
        (self.logprob_count > 0).then(|| (-self.logprob_sum / self.logprob_count as f64).exp())
    }
}

/// Pairs one window's rows as they arrive, in any order: stream 0 is the reference, streams
/// `1..=compared` the methods. A reference row is kept only until every method has been compared
/// with it, and a method row only until its reference row arrives, so memory stays bounded by
/// how far the streams drift apart rather than by the window's length.
#[derive(Debug)]
pub struct WindowScorer {
    forced_ids: Vec<u32>,
    compared: usize,
    /// Reference rows by position, with how many methods still need them.
    reference: HashMap<usize, (Vec<f32>, usize)>,
    /// Method rows waiting for their reference row, by (stream, position).
    waiting: HashMap<(usize, usize), Vec<f32>>,
    sums: Vec<StreamSums>,
}

impl WindowScorer {
    /// A scorer for a window whose forced tokens are `forced_ids`, with `compared` methods.
    pub fn new(forced_ids: Vec<u32>, compared: usize) -> Self {
        WindowScorer {
            forced_ids,
            compared,
            reference: HashMap::new(),
            waiting: HashMap::new(),
            sums: vec![StreamSums::default(); compared + 1],
        }
    }

    /// Takes stream `stream`'s row for forced position `position`.
    pub fn push(
        &mut self,
        stream: usize,
        position: usize,
        row: Vec<f32>,
    ) -> Result<(), BenchError> {
        let token = *self.forced_ids.get(position).ok_or_else(|| {
            BenchError::Invalid(format!(
                "row for position {position} of a {}-token window",
                self.forced_ids.len()
            ))
        })?;
        let logprob = *row.get(token as usize).ok_or_else(|| {
            BenchError::Invalid(format!(
                "forced token {token} outside a {}-entry distribution",
                row.len()
            ))
        })?;
        let sums = self.sums.get_mut(stream).ok_or_else(|| {
            BenchError::Invalid(format!("stream {stream} of {}", self.compared + 1))
        })?;
        sums.logprob_sum += logprob as f64;
        sums.logprob_count += 1;
        if stream == 0 {
            let mut remaining = self.compared;
            for other in 1..=self.compared {
                if let Some(q) = self.waiting.remove(&(other, position)) {
                    self.compare(other, &row, &q)?;
                    remaining -= 1;
                }
            }
            if remaining > 0 {
                self.reference.insert(position, (row, remaining));
            }
        } else if let Some((p, remaining)) = self.reference.remove(&position) {
            self.compare(stream, &p, &row)?;
            if remaining > 1 {
                self.reference.insert(position, (p, remaining - 1));
            }
        } else {
            self.waiting.insert((stream, position), row);
        }
        Ok(())
    }

    fn compare(&mut self, stream: usize, p: &[f32], q: &[f32]) -> Result<(), BenchError> {
        let kl = kl_divergence(p, q)?;
        let sums = &mut self.sums[stream];
        sums.kl_sum += kl;
        sums.kl_count += 1;
        Ok(())
    }

    /// The window's sums per stream; an error when a method row never met its reference row.
    pub fn finish(self) -> Result<Vec<StreamSums>, BenchError> {
        if let Some(&(stream, position)) = self.waiting.keys().next() {
            return Err(BenchError::Invalid(format!(
                "stream {stream} reported position {position} but the reference never did"
            )));
        }
        Ok(self.sums)
    }
}

/// One method's figures over all windows.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityRow {
    /// The method label (`none`, `keydiff@0.5`).
    pub method: String,
    /// Every field of the compression config, as JSON.
    pub compression: Value,
    /// Mean KL(uncompressed ‖ this) per forced token, nats (`None` for the reference).
    pub mean_kl_nats: Option<f64>,
    /// Perplexity of the forced tokens.
    pub perplexity: Option<f64>,
    /// Forced tokens scored.
    pub scored_tokens: usize,
    /// Mean KV slots held at the end of a window, tokens.
    pub kv_tokens_final_mean: f64,
    /// The same, bytes (all layers).
    pub kv_bytes_final_mean: f64,
}

/// The `quality.json` document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct QualityReport {
    /// The model argument.
    pub model: String,
    /// Backend name.
    pub device: String,
    /// Prompt tokens per window.
    pub context_tokens: usize,
    /// Forced tokens per window.
    pub eval_tokens: usize,
    /// Windows.
    pub num_windows: usize,
    /// KV-cache bytes per token (all layers).
    pub kv_bytes_per_token: u64,
    /// Set digest of the essays used.
    pub essays_sha256: String,
    /// The uncompressed reference run.
    pub reference: QualityRow,
    /// The methods, in the order given.
    pub rows: Vec<QualityRow>,
    /// The engine's KV cache (`starling_engine::CacheReport` as JSON: layout, bytes per token,
    /// blocks, longest context); absent in reports written before it was recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache: Option<serde_json::Value>,
    /// The same in one line, for the summary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kv_cache_summary: Option<String>,
}

impl QualityReport {
    /// The markdown summary: settings, then one row for the reference and one per method.
    pub fn markdown(&self) -> String {
        let mut out = format!(
            "## KV-compression quality: {} on {}\n\n\
             {} windows of {} held-out prompt tokens + {} forced tokens; KL(uncompressed ‖ method) of next-token distributions, perplexity of the forced tokens; KV {} bytes/token; essays sha256 {}\n\n\
             | method | config | mean KL (nats/token) | perplexity | Δ perplexity | KV held (tokens) | KV held (MiB) |\n\
             |---|---|---:|---:|---:|---:|---:|\n",
            self.model,
            self.device,
            self.num_windows,
            self.context_tokens,
            self.eval_tokens,
            self.kv_bytes_per_token,
            self.essays_sha256
        );
        if let Some(cache) = &self.kv_cache_summary {
            // Before the table: the layout every row ran on.
            let table = out.find("| method |").unwrap_or(out.len());
            out.insert_str(table, &format!("KV cache: {cache}\n\n"));
        }
        let reference_ppl = self.reference.perplexity;
        for row in std::iter::once(&self.reference).chain(&self.rows) {
            let kl = row
                .mean_kl_nats
                .map_or_else(|| "(reference)".to_owned(), |v| format!("{v:.5}"));
            let ppl = row
                .perplexity
                .map_or_else(|| "–".to_owned(), |v| format!("{v:.3}"));
            let delta = match (row.perplexity, reference_ppl) {
                (Some(p), Some(r)) => format!("{:+.3}", p - r),
                _ => "–".to_owned(),
            };
            let _ = writeln!(
                out,
                "| {} | `{}` | {kl} | {ppl} | {delta} | {:.1} | {:.2} |",
                row.method,
                row.compression,
                row.kv_tokens_final_mean,
                row.kv_bytes_final_mean / (1024.0 * 1024.0)
            );
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ln(values: &[f64]) -> Vec<f32> {
        values.iter().map(|v| v.ln() as f32).collect()
    }

    #[test]
    fn mean_and_perplexity_of_hand_computed_values() {
        assert_eq!(mean(&[]), None);
        assert_eq!(mean(&[1.0, 2.0, 6.0]), Some(3.0));
        // Tokens with probabilities 1/2 and 1/8: mean ln = −2 ln 2 → perplexity 4.
        let lp = [0.5f64.ln(), 0.125f64.ln()];
        assert!((perplexity(&lp).unwrap() - 4.0).abs() < 1e-12);
        assert_eq!(perplexity(&[]), None);
    }

    #[test]
    fn kl_of_hand_computed_distributions() {
        // p = (1/2, 1/2), q = (1/4, 3/4): KL = ½ln2 + ½ln(2/3) = ½ ln(4/3) ≈ 0.143841.
        let p = ln(&[0.5, 0.5]);
        let q = ln(&[0.25, 0.75]);
        let expected = 0.5 * (4.0f64 / 3.0).ln();
        assert!((kl_divergence(&p, &q).unwrap() - expected).abs() < 1e-6);
        assert_eq!(kl_divergence(&p, &p).unwrap(), 0.0);
        // p rules a token out: its term vanishes. p = (1, 0), q = (1/2, 1/2): KL = ln 2.
        let p = vec![0.0f32, f32::NEG_INFINITY];
        let q = ln(&[0.5, 0.5]);
        assert!((kl_divergence(&p, &q).unwrap() - 2f64.ln()).abs() < 1e-6);
        // q rules out a token p allows: infinite.
        assert_eq!(kl_divergence(&q, &p).unwrap(), f64::INFINITY);
        assert!(kl_divergence(&p, &[0.0]).is_err());
    }

    #[test]
    fn windows_are_consecutive_and_refuse_short_text() {
        let ids: Vec<u32> = (0..23).collect();
        let w = eval_windows(&ids, 4, 3, 3).unwrap();
        assert_eq!(w.len(), 3);
        assert_eq!(w[0].context_ids, [0, 1, 2, 3]);
        assert_eq!(w[0].eval_ids, [4, 5, 6]);
        assert_eq!(w[2].context_ids, [14, 15, 16, 17]);
        assert_eq!(w[2].eval_ids, [18, 19, 20]);
        let err = eval_windows(&ids, 4, 3, 4).unwrap_err();
        assert!(err.to_string().contains("3 windows"), "{err}");
        assert!(eval_windows(&ids, 0, 3, 1).is_err());
    }

    #[test]
    fn the_scorer_pairs_rows_in_any_order() {
        let p = ln(&[0.5, 0.5]);
        let q = ln(&[0.25, 0.75]);
        let kl = 0.5 * (4.0f64 / 3.0).ln();
        // Forced tokens: position 0 → token 1, position 1 → token 0.
        let mut scorer = WindowScorer::new(vec![1, 0], 2);
        // Method 1 arrives before the reference at position 0; method 2 after it.
        scorer.push(1, 0, q.clone()).unwrap();
        scorer.push(0, 0, p.clone()).unwrap();
        scorer.push(2, 0, p.clone()).unwrap();
        scorer.push(0, 1, p.clone()).unwrap();
        scorer.push(1, 1, q.clone()).unwrap();
        scorer.push(2, 1, q.clone()).unwrap();
        assert!(
            scorer.reference.is_empty(),
            "every reference row was released"
        );
        let sums = scorer.finish().unwrap();
        assert_eq!(sums[0].kl_count, 0);
        assert!((sums[1].mean_kl().unwrap() - kl).abs() < 1e-6);
        assert!((sums[2].mean_kl().unwrap() - kl / 2.0).abs() < 1e-6);
        // Method 1 scored the forced tokens at 3/4 then 1/4: perplexity = 1/sqrt(3/16).
        let expected = 1.0 / (0.75f64 * 0.25).sqrt();
        assert!((sums[1].perplexity().unwrap() - expected).abs() < 1e-5);
        assert!((sums[0].perplexity().unwrap() - 2.0).abs() < 1e-5);
    }

    #[test]
    fn unmatched_or_bad_rows_are_errors() {
        let p = ln(&[0.5, 0.5]);
        let mut scorer = WindowScorer::new(vec![1], 1);
        scorer.push(1, 0, p.clone()).unwrap();
        assert!(scorer.finish().is_err());
        let mut scorer = WindowScorer::new(vec![1], 1);
        assert!(scorer.push(0, 5, p.clone()).is_err());
        assert!(scorer.push(3, 0, p.clone()).is_err());
        let mut scorer = WindowScorer::new(vec![7], 1);
        assert!(scorer.push(0, 0, p).is_err());
    }

    #[test]
    fn markdown_has_the_reference_then_one_row_per_method() {
        let row = |method: &str, kl: Option<f64>, ppl: f64| QualityRow {
            method: method.into(),
            compression: serde_json::json!({"method": method}),
            mean_kl_nats: kl,
            perplexity: Some(ppl),
            scored_tokens: 10,
            kv_tokens_final_mean: 100.0,
            kv_bytes_final_mean: 2.0 * 1024.0 * 1024.0,
        };
        let report = QualityReport {
            model: "m".into(),
            device: "cpu".into(),
            context_tokens: 90,
            eval_tokens: 10,
            num_windows: 1,
            kv_bytes_per_token: 1,
            essays_sha256: "abc".into(),
            reference: row("none", None, 10.0),
            rows: vec![row("keydiff", Some(0.0123456), 10.5)],
            kv_cache: None,
            kv_cache_summary: Some("full K/V in f32: 1 B per token".into()),
        };
        let md = report.markdown();
        let lines: Vec<&str> = md.lines().filter(|l| l.starts_with("| ")).collect();
        assert_eq!(lines.len(), 3, "{md}");
        assert!(
            lines[1].starts_with("| none |") && lines[1].contains("(reference)"),
            "{md}"
        );
        assert!(
            lines[2].contains("| 0.01235 | 10.500 | +0.500 | 100.0 | 2.00 |"),
            "{md}"
        );
        assert!(
            md.contains("KV cache: full K/V in f32: 1 B per token\n\n| method |"),
            "{md}"
        );
    }
}
