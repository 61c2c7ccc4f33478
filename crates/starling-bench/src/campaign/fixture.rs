//! A small campaign report for the tests of the table and plot writers: two engines at every
//! point of [`small_plan`], one boot refused at the 512-token context point.

use super::engine::EngineSpec;
use super::histogram::HistogramSummary;
use super::plan::tests::small_plan;
use super::results::{CampaignReport, PointRow, PointStatus};
use crate::server_metrics::ServerFigures;
use crate::stats::BenchmarkMetrics;

pub(crate) fn report() -> CampaignReport {
    let plan = small_plan();
    let points = plan.points();
    let mut rows = Vec::new();
    for engine in ["b-engine", "a-engine"] {
        for point in &points {
            let mut row = PointRow::unmeasured(engine, point, PointStatus::Ok, None);
            row.metrics = Some(BenchmarkMetrics {
                completed: point.num_requests,
                output_throughput: 10.0,
                ..BenchmarkMetrics::default()
            });
            row.server = Some(ServerFigures::default());
            if engine == "a-engine" {
                row.decode_batch = Some(HistogramSummary {
                    observations: 4.0,
                    mean: 2.5,
                    first_bucket_share: 0.25,
                    buckets: vec![],
                });
            } else {
                row.generated_tokens_per_step = Some(3.0);
            }
            rows.push(row);
        }
    }
    let refused = points.iter().find(|p| p.value == 512.0).unwrap();
    rows.retain(|r| !(r.engine == "a-engine" && r.point == *refused));
    rows.push(PointRow::unmeasured(
        "a-engine",
        refused,
        PointStatus::BootRefused,
        Some("error: 512 tokens | do not fit".into()),
    ));
    CampaignReport {
        bench: "campaign",
        started_utc: "2026-12-02T10:00:00Z".into(),
        command: vec!["starling".into()],
        kv_cache_memory_bytes: 1 << 20,
        plan,
        engines: ["b-engine", "a-engine"]
            .map(|name| EngineSpec {
                name: name.into(),
                command: "serve --port {port}".into(),
            })
            .to_vec(),
        boots: vec![],
        rows,
        interrupted: false,
    }
}
