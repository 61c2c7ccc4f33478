//! A serving run's per-kernel breakdown (the seed's torch.profiler table: calls, share, time
//! per call) from the server's kernel-profile counters (`starling serve --kernel-profile`):
//! `starling:kernel_gpu_seconds_total` and `starling:kernel_launches_total` per `site`, read
//! before and after the run and diffed, so the table is this run's launches only.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

/// Device seconds per launch site.
const SECONDS: &str = "starling:kernel_gpu_seconds_total";
/// Launches per launch site.
const LAUNCHES: &str = "starling:kernel_launches_total";

/// One launch site's share of a run.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct KernelProfileRow {
    /// Kernel function name, or `cublas:<op> <m>x<k>`.
    pub site: String,
    /// Launches during the run.
    pub launches: u64,
    /// Device time of those launches, milliseconds.
    pub gpu_ms: f64,
    /// Share of the run's profiled device time, percent.
    pub share_pct: f64,
    /// Mean device time per launch, microseconds.
    pub mean_us: f64,
}

/// `(seconds, launches)` per site in a `/metrics` text.
fn sites(text: &str) -> BTreeMap<String, (f64, f64)> {
    let mut out: BTreeMap<String, (f64, f64)> = BTreeMap::new();
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let Some((name, labels)) = series.split_once('{') else {
            continue;
        };
        let is_seconds = match name {
            SECONDS => true,
            LAUNCHES => false,
            _ => continue,
        };
        let Some(site) = labels
            .strip_prefix("site=\"")
            .and_then(|rest| rest.strip_suffix("\"}"))
        else {
            continue;
        };
        let site = site.replace("\\\"", "\"").replace("\\\\", "\\");
        let entry = out.entry(site).or_default();
        if is_seconds {
            entry.0 += value;
        } else {
            entry.1 += value;
        }
    }
    out
}

/// This run's rows, longest first: `after` minus `before` per site. Empty when the server
/// keeps no kernel profile (another server, or one started without `--kernel-profile`).
pub fn run_profile(before: &str, after: &str) -> Vec<KernelProfileRow> {
    let before = sites(before);
    let deltas: Vec<(String, f64, u64)> = sites(after)
        .into_iter()
        .filter_map(|(site, (seconds, launches))| {
            let (s0, l0) = before.get(&site).copied().unwrap_or_default();
            let launches = (launches - l0).max(0.0).round() as u64;
            (launches > 0).then(|| (site, (seconds - s0).max(0.0), launches))
        })
        .collect();
    let total_s: f64 = deltas.iter().map(|(_, s, _)| s).sum();
    let mut rows: Vec<KernelProfileRow> = deltas
        .into_iter()
        .map(|(site, seconds, launches)| KernelProfileRow {
            site,
            launches,
            gpu_ms: seconds * 1e3,
            share_pct: if total_s > 0.0 {
                100.0 * seconds / total_s
            } else {
                0.0
            },
            mean_us: seconds * 1e6 / launches as f64,
        })
        .collect();
    rows.sort_by(|a, b| b.gpu_ms.total_cmp(&a.gpu_ms).then(a.site.cmp(&b.site)));
    rows
}

/// The rows as a markdown table, with the profiled device time against the run's wall time
/// (`duration_s`): what is left is host time between launches (scheduling, sampling,
/// tokenising) and launch gaps. Empty for no rows.
pub fn markdown(rows: &[KernelProfileRow], duration_s: f64) -> String {
    if rows.is_empty() {
        return String::new();
    }
    let total_ms: f64 = rows.iter().map(|r| r.gpu_ms).sum();
    let launches: u64 = rows.iter().map(|r| r.launches).sum();
    let mut out = String::new();
    let _ = writeln!(
        out,
        "\n### Device time per launch site\n\n{total_ms:.1} ms of device time in {launches} \
         launches over {:.1} s of wall time ({:.1}% busy; launches timed one at a time, decode \
         steps eager)\n",
        duration_s,
        if duration_s > 0.0 {
            total_ms / (10.0 * duration_s)
        } else {
            0.0
        }
    );
    let _ = writeln!(
        out,
        "| site | launches | device ms | share | µs per launch |\n|---|---:|---:|---:|---:|"
    );
    for r in rows {
        let _ = writeln!(
            out,
            "| `{}` | {} | {:.2} | {:.1}% | {:.2} |",
            r.site, r.launches, r.gpu_ms, r.share_pct, r.mean_us
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# HELP x\nstarling:kernel_gpu_seconds_total{site=\"rms_norm\"} 0.5\n\
        starling:kernel_launches_total{site=\"rms_norm\"} 100\n\
        starling:kernel_gpu_seconds_total{site=\"idle\"} 1\n\
        starling:kernel_launches_total{site=\"idle\"} 4\nvllm:x 3\n";

    #[test]
    fn a_run_is_the_difference_of_two_scrapes_longest_first() {
        let after = format!(
            "{}starling:kernel_gpu_seconds_total{{site=\"cublas:gemm 4096x4096\"}} 0.003\n\
             starling:kernel_launches_total{{site=\"cublas:gemm 4096x4096\"}} 3\n",
            BEFORE.replace("} 0.5", "} 0.501").replace("} 100", "} 110")
        );
        let rows = run_profile(BEFORE, &after);
        assert_eq!(
            rows.len(),
            2,
            "a site with no launches in the run is left out"
        );
        assert_eq!(rows[0].site, "cublas:gemm 4096x4096");
        assert_eq!(rows[0].launches, 3);
        assert!((rows[0].gpu_ms - 3.0).abs() < 1e-9);
        assert!((rows[0].mean_us - 1000.0).abs() < 1e-6);
        assert!((rows[1].gpu_ms - 1.0).abs() < 1e-6, "0.501 - 0.5 s");
        assert_eq!(rows[1].launches, 10);
        assert!((rows[0].share_pct + rows[1].share_pct - 100.0).abs() < 1e-9);
        let md = markdown(&rows, 2.0);
        assert!(md.contains("4.0 ms of device time in 13 launches"), "{md}");
        assert!(
            md.contains("| `rms_norm` | 10 | 1.00 | 25.0% | 100.00 |"),
            "{md}"
        );
    }

    #[test]
    fn a_server_without_a_profile_gives_no_rows() {
        assert!(run_profile("vllm:x 1\n", "vllm:x 2\n").is_empty());
        assert!(markdown(&[], 1.0).is_empty());
    }
}
