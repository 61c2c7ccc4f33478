//! The campaign's markdown: a header naming the engines, their boots and the KV memory, then
//! one table per campaign with the engines side by side at each point.

use std::fmt::Write as _;

use super::plan::CampaignKind;
use super::results::{CampaignReport, PointRow, PointStatus};

/// A table cell: `|` and newlines would break the row.
fn cell(text: &str) -> String {
    text.replace('|', "\\|").replace(['\n', '\r'], " ")
}

fn ms_pair(median_ms: f64, p99_ms: f64) -> String {
    format!("{median_ms:.1} / {p99_ms:.1}")
}

/// Mean decode batch and batch-1 share: Starling's histogram, else vLLM's tokens per step.
fn decode_batch(row: &PointRow) -> (String, String) {
    match (&row.decode_batch, row.generated_tokens_per_step) {
        (Some(h), _) if h.observations > 0.0 => (
            format!("{:.2}", h.mean),
            format!("{:.1}%", 100.0 * h.first_bucket_share),
        ),
        (_, Some(per_step)) => (format!("{per_step:.2}†"), "n/a".into()),
        _ => ("n/a".into(), "n/a".into()),
    }
}

fn peak_kv(row: &PointRow) -> String {
    match &row.server {
        Some(s) if s.peak_kv_usage_pct > 0.0 => format!("{:.1}%", s.peak_kv_usage_pct),
        _ => "n/a".into(),
    }
}

/// The columns of one campaign's table, and a row's cells.
fn columns(kind: CampaignKind) -> &'static [&'static str] {
    match kind {
        CampaignKind::Concurrency => &[
            "req/s",
            "output tok/s",
            "TTFT p50 / p99 ms",
            "TPOT p50 / p99 ms",
            "peak KV",
            "preemptions",
            "mean decode batch",
        ],
        CampaignKind::Context => &[
            "total tok/s",
            "TTFT p50 / p99 ms",
            "E2EL p50 ms",
            "peak KV",
            "preemptions",
        ],
        CampaignKind::LongGeneration => &[
            "output tok/s",
            "TPOT p50 / p99 ms",
            "ITL p99 ms",
            "peak KV",
            "preemptions",
            "KV evicted blocks",
        ],
        CampaignKind::Scheduler => &[
            "output tok/s",
            "mean decode batch",
            "batch-1 steps",
            "tokens per step",
            "decode batch histogram",
        ],
    }
}

fn cells(kind: CampaignKind, row: &PointRow) -> Vec<String> {
    let (Some(m), Some(s)) = (&row.metrics, &row.server) else {
        return vec![String::new(); columns(kind).len()];
    };
    let (mean_batch, batch1) = decode_batch(row);
    match kind {
        CampaignKind::Concurrency => vec![
            format!("{:.2}", m.request_throughput),
            format!("{:.1}", m.output_throughput),
            ms_pair(m.ttft.median_ms, m.ttft.p99_ms),
            ms_pair(m.tpot.median_ms, m.tpot.p99_ms),
            peak_kv(row),
            format!("{}", s.preemptions),
            mean_batch,
        ],
        CampaignKind::Context => vec![
            format!("{:.1}", m.total_token_throughput),
            ms_pair(m.ttft.median_ms, m.ttft.p99_ms),
            format!("{:.1}", m.e2el.median_ms),
            peak_kv(row),
            format!("{}", s.preemptions),
        ],
        CampaignKind::LongGeneration => vec![
            format!("{:.1}", m.output_throughput),
            ms_pair(m.tpot.median_ms, m.tpot.p99_ms),
            format!("{:.1}", m.itl.p99_ms),
            peak_kv(row),
            format!("{}", s.preemptions),
            format!("{}", s.kv_evicted_blocks),
        ],
        CampaignKind::Scheduler => vec![
            format!("{:.1}", m.output_throughput),
            mean_batch,
            batch1,
            row.iteration_tokens
                .as_ref()
                .map_or("n/a".into(), |h| format!("{:.1}", h.mean)),
            row.decode_batch
                .as_ref()
                .map_or("n/a".into(), |h| h.compact()),
        ],
    }
}

/// One campaign's table.
pub fn campaign_table(report: &CampaignReport, kind: CampaignKind) -> String {
    let rows = report.rows_of(kind);
    let mut out = String::new();
    let extra = columns(kind);
    let _ = writeln!(
        out,
        "| workload | {} | engine | status | ok / failed | {} | detail |",
        kind.point_label(),
        extra.join(" | ")
    );
    let _ = writeln!(
        out,
        "|---|---:|---|---|---:|{}---|",
        "---:|".repeat(extra.len())
    );
    for row in rows {
        let ok_failed = row
            .metrics
            .as_ref()
            .map_or(String::new(), |m| format!("{} / {}", m.completed, m.failed));
        let _ = writeln!(
            out,
            "| {} | {} | {} | {} | {} | {} | {} |",
            row.workload_label,
            row.point.value,
            cell(&row.engine),
            row.status.text(),
            ok_failed,
            cells(kind, row).join(" | "),
            cell(row.detail.as_deref().unwrap_or("")),
        );
    }
    out
}

/// The whole document.
pub fn campaign_markdown(report: &CampaignReport) -> String {
    let mut out = String::new();
    let _ = writeln!(
        out,
        "# Serving campaigns, {}\n\nKV-cache memory {} bytes ({:.2} GiB) for every engine whose \
         command takes it; context window {} tokens outside the context campaign; seed {}; \
         every request ignores EOS.{}\n",
        report.started_utc,
        report.kv_cache_memory_bytes,
        report.kv_cache_memory_bytes as f64 / f64::from(1u32 << 30),
        report.plan.max_model_len_tokens,
        report.plan.seed,
        if report.interrupted {
            " **Interrupted: the points not reached are `skipped`.**"
        } else {
            ""
        }
    );
    let _ = writeln!(out, "Command: `{}`\n", cell(&report.command.join(" ")));
    let _ = writeln!(out, "| engine | boots | command |\n|---|---|---|");
    for engine in &report.engines {
        let boots: Vec<String> = report
            .boots
            .iter()
            .filter(|b| b.engine == engine.name)
            .map(|b| {
                format!(
                    "{} at {} tokens ({:.0} s)",
                    if b.status == PointStatus::Ok {
                        "up"
                    } else {
                        b.status.text()
                    },
                    b.max_model_len_tokens,
                    b.boot_s
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "| {} | {} | `{}` |",
            cell(&engine.name),
            boots.join(", "),
            cell(&engine.command)
        );
    }
    for &kind in &report.plan.campaigns {
        let _ = writeln!(out, "\n## {} campaign\n", kind.name());
        out.push_str(&campaign_table(report, kind));
    }
    for row in report.rows.iter().filter(|r| !r.kernel_profile.is_empty()) {
        let _ = write!(out, "\n## {} at {}\n", row.engine, row.workload_label);
        out.push_str(&crate::kernel_profile::markdown(
            &row.kernel_profile,
            row.metrics.as_ref().map_or(0.0, |m| m.duration_s),
        ));
    }
    let used_fallback = report.rows.iter().any(|r| {
        r.generated_tokens_per_step.is_some()
            && r.decode_batch
                .as_ref()
                .is_none_or(|h| h.observations == 0.0)
    });
    if used_fallback {
        out.push_str(
            "\n† no decode-batch histogram on this server: generated tokens per engine step \
         (`vllm:generation_tokens_total` over `vllm:iteration_tokens_total`'s count) instead.\n",
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::campaign::fixture::report;

    #[test]
    fn each_campaign_has_a_row_per_engine_and_point_with_engines_side_by_side() {
        let report = report();
        for kind in CampaignKind::ALL {
            let table = campaign_table(&report, kind);
            let points = report
                .plan
                .points()
                .iter()
                .filter(|p| p.campaign == kind)
                .count();
            assert_eq!(table.lines().count(), 2 + 2 * points, "{kind}:\n{table}");
            let body: Vec<&str> = table.lines().skip(2).collect();
            // Engines in the order given, at each point.
            assert!(
                body[0].contains("| b-engine |") && body[1].contains("| a-engine |"),
                "{table}"
            );
            let header_cells = table.lines().next().unwrap().matches('|').count();
            for line in &body {
                assert_eq!(
                    line.matches('|').count() - line.matches("\\|").count(),
                    header_cells,
                    "{line}"
                );
            }
        }
        let context = campaign_table(&report, CampaignKind::Context);
        let values: Vec<&str> = context
            .lines()
            .skip(2)
            .map(|l| l.split(" | ").nth(1).unwrap())
            .collect();
        assert_eq!(
            values,
            ["64", "64", "512", "512"],
            "by point, not by label: {context}"
        );
        let refused = context
            .lines()
            .find(|l| l.contains("boot refused"))
            .unwrap();
        assert!(refused.contains("| 512 | a-engine |"), "{refused}");
        assert!(refused.contains("512 tokens \\| do not fit"), "{refused}");
        let scheduler = campaign_table(&report, CampaignKind::Scheduler);
        assert!(scheduler.contains("| 2.50 | 25.0% |"), "{scheduler}");
        assert!(scheduler.contains("| 3.00† | n/a |"), "{scheduler}");
        let doc = campaign_markdown(&report);
        assert_eq!(doc.matches("campaign\n\n| workload").count(), 4, "{doc}");
        assert!(
            doc.contains("† no decode-batch histogram"),
            "b-engine used it: {doc}"
        );
    }
}
