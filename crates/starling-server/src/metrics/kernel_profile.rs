//! The kernel profile as Prometheus counters: device seconds and launches per launch site,
//! cumulative since the profile started, so a client diffs two scrapes to get one workload's
//! table (`starling bench serve --kernel-profile`).

use std::fmt::Write as _;

use starling_backend::KernelSiteTime;

use super::escape_label;

/// Device time per launch site.
pub const KERNEL_SECONDS: &str = "starling:kernel_gpu_seconds_total";
/// Launches per launch site.
pub const KERNEL_LAUNCHES: &str = "starling:kernel_launches_total";

/// Appends both counter families; nothing when no profile runs.
pub(super) fn render(out: &mut String, sites: &[KernelSiteTime]) {
    if sites.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP {KERNEL_SECONDS} Device time of the launches of one site (a kernel, or a cuBLAS \
         call by weight shape), timed by events around each launch.\n# TYPE {KERNEL_SECONDS} counter"
    );
    for site in sites {
        let seconds = site.gpu_time_ns as f64 * 1e-9;
        let label = escape_label(&site.site);
        let _ = writeln!(out, "{KERNEL_SECONDS}{{site=\"{label}\"}} {seconds}");
    }
    let _ = writeln!(
        out,
        "# HELP {KERNEL_LAUNCHES} Launches of one site timed by the kernel profile.\n# TYPE {KERNEL_LAUNCHES} counter"
    );
    for site in sites {
        let label = escape_label(&site.site);
        let _ = writeln!(
            out,
            "{KERNEL_LAUNCHES}{{site=\"{label}\"}} {}",
            site.launches
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_site_is_one_sample_of_each_family_and_nothing_without_a_profile() {
        let mut out = String::new();
        render(&mut out, &[]);
        assert!(out.is_empty());
        let sites = [
            KernelSiteTime {
                site: "cublas:gemm 4096x4096".into(),
                launches: 3,
                gpu_time_ns: 1_500_000,
            },
            KernelSiteTime {
                site: "rms_norm".into(),
                launches: 7,
                gpu_time_ns: 2_000,
            },
        ];
        render(&mut out, &sites);
        assert!(out
            .contains("starling:kernel_gpu_seconds_total{site=\"cublas:gemm 4096x4096\"} 0.0015"));
        assert!(out.contains("starling:kernel_launches_total{site=\"rms_norm\"} 7"));
        assert_eq!(out.matches("# TYPE").count(), 2);
    }
}
