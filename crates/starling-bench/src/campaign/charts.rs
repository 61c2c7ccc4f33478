//! The campaign's PNGs: one file per campaign (and per workload of the concurrency campaign),
//! panels side by side, one line per engine. Points without measurements (refused boots or
//! requests) are drawn as crosses on the x axis, so a refusal shows where it happened.

use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::plan::CampaignKind;
use super::results::{CampaignReport, PointRow};
use crate::error::BenchError;
use crate::plot::{draw_legend, linear_chart, plot_error, register_font, FONT_FAMILY};
use crate::stats::BenchmarkMetrics;

/// A figure a row gives one panel (`None`: not measured, or not exported by that server).
type Figure = fn(&PointRow) -> Option<f64>;

/// One panel: its caption, y axis and figure.
struct Panel {
    caption: &'static str,
    y_desc: &'static str,
    figure: Figure,
}

/// One engine's line on a panel.
struct EngineSeries<'a> {
    name: &'a str,
    /// Measured (point, figure) pairs.
    points: Vec<(f64, f64)>,
    /// Points without measurements, drawn as crosses on the axis.
    refused: Vec<f64>,
}

const PALETTE: [RGBColor; 6] = [
    RGBColor(31, 119, 180),
    RGBColor(214, 39, 40),
    RGBColor(44, 160, 44),
    RGBColor(148, 103, 189),
    RGBColor(255, 127, 14),
    RGBColor(23, 190, 207),
];

/// A row's client metrics, when it was measured.
fn m(row: &PointRow) -> Option<&BenchmarkMetrics> {
    row.metrics.as_ref().filter(|_| row.status.measured())
}

fn panels(kind: CampaignKind) -> Vec<Panel> {
    match kind {
        CampaignKind::Concurrency => vec![
            Panel {
                caption: "output throughput",
                y_desc: "tokens/s",
                figure: |r| m(r).map(|m| m.output_throughput),
            },
            Panel {
                caption: "TTFT p99",
                y_desc: "ms",
                figure: |r| m(r).map(|m| m.ttft.p99_ms),
            },
            Panel {
                caption: "TPOT p99",
                y_desc: "ms",
                figure: |r| m(r).map(|m| m.tpot.p99_ms),
            },
        ],
        CampaignKind::Context => vec![
            Panel {
                caption: "total throughput",
                y_desc: "tokens/s",
                figure: |r| m(r).map(|m| m.total_token_throughput),
            },
            Panel {
                caption: "TTFT p99",
                y_desc: "ms",
                figure: |r| m(r).map(|m| m.ttft.p99_ms),
            },
        ],
        CampaignKind::LongGeneration => vec![
            Panel {
                caption: "TPOT p99",
                y_desc: "ms",
                figure: |r| m(r).map(|m| m.tpot.p99_ms),
            },
            Panel {
                caption: "peak KV use",
                y_desc: "% of the pool",
                figure: |r| {
                    r.server
                        .filter(|s| r.status.measured() && s.peak_kv_usage_pct > 0.0)
                        .map(|s| s.peak_kv_usage_pct)
                },
            },
        ],
        CampaignKind::Scheduler => vec![
            Panel {
                caption: "mean decode batch",
                y_desc: "sequences per decode step",
                figure: |r| {
                    r.decode_batch
                        .as_ref()
                        .filter(|h| h.observations > 0.0)
                        .map(|h| h.mean)
                        .or(r.generated_tokens_per_step)
                },
            },
            Panel {
                caption: "output throughput",
                y_desc: "tokens/s",
                figure: |r| m(r).map(|m| m.output_throughput),
            },
        ],
    }
}

/// Writes the campaign's PNGs into `dir`; returns their paths.
pub fn write_campaign_pngs(
    report: &CampaignReport,
    dir: &Path,
) -> Result<Vec<PathBuf>, BenchError> {
    let mut written = Vec::new();
    for &kind in &report.plan.campaigns {
        let rows = report.rows_of(kind);
        let mut workloads: Vec<&str> = rows.iter().map(|r| r.workload_label.as_str()).collect();
        workloads.dedup();
        // The concurrency campaign draws each workload apart; the others have one axis.
        let groups: Vec<(String, Vec<&PointRow>)> = if kind == CampaignKind::Concurrency {
            workloads
                .iter()
                .map(|w| {
                    let of: Vec<&PointRow> = rows
                        .iter()
                        .copied()
                        .filter(|r| r.workload_label == *w)
                        .collect();
                    (format!("{}-{w}", kind.name()), of)
                })
                .collect()
        } else {
            vec![(kind.name().to_owned(), rows)]
        };
        for (name, rows) in groups {
            if rows.is_empty() {
                continue;
            }
            let path = dir.join(format!("{name}.png"));
            draw(report, kind, &name, &rows, &path)?;
            written.push(path);
        }
    }
    Ok(written)
}

fn draw(
    report: &CampaignReport,
    kind: CampaignKind,
    title: &str,
    rows: &[&PointRow],
    path: &Path,
) -> Result<(), BenchError> {
    register_font()?;
    let panels = panels(kind);
    let width = 520 * panels.len() as u32;
    let root = BitMapBackend::new(path, (width, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root.titled(title, (FONT_FAMILY, 22)).map_err(plot_error)?;
    let areas = root.split_evenly((1, panels.len()));
    let max_x = rows
        .iter()
        .map(|r| r.point.value)
        .fold(0.0, f64::max)
        .max(1.0)
        * 1.05;
    for (panel, area) in panels.iter().zip(areas.iter()) {
        let series: Vec<EngineSeries> = report
            .engines
            .iter()
            .map(|e| {
                let mine = rows.iter().filter(|r| r.engine == e.name);
                let points = mine
                    .clone()
                    .filter_map(|r| (panel.figure)(r).map(|y| (r.point.value, y)))
                    .collect();
                let refused = mine
                    .filter(|r| !r.status.measured())
                    .map(|r| r.point.value)
                    .collect();
                EngineSeries {
                    name: &e.name,
                    points,
                    refused,
                }
            })
            .collect();
        let max_y = series
            .iter()
            .flat_map(|s| s.points.iter().map(|p| p.1))
            .fold(0.0, f64::max)
            .max(1e-9)
            * 1.15;
        let mut chart = linear_chart(
            area,
            panel.caption,
            (max_x, max_y),
            (kind.point_label(), panel.y_desc),
            13,
        )?;
        for (
            i,
            EngineSeries {
                name,
                points,
                refused,
            },
        ) in series.into_iter().enumerate()
        {
            let color = PALETTE[i % PALETTE.len()];
            chart
                .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
                .map_err(plot_error)?
                .label(name)
                .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
            chart
                .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
                .map_err(plot_error)?;
            chart
                .draw_series(
                    refused
                        .iter()
                        .map(|&x| Cross::new((x, 0.0), 7, color.stroke_width(3))),
                )
                .map_err(plot_error)?;
        }
        draw_legend(&mut chart, 13)?;
    }
    root.present().map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_png_per_campaign_and_concurrency_workload() {
        let report = crate::campaign::fixture::report();
        let dir = tempfile::tempdir().unwrap();
        let written = write_campaign_pngs(&report, dir.path()).unwrap();
        let names: Vec<String> = written
            .iter()
            .map(|p| p.file_name().unwrap().to_string_lossy().into_owned())
            .collect();
        assert_eq!(
            names,
            [
                "concurrency-random-16x4.png",
                "long-generation.png",
                "scheduler.png",
                "context.png"
            ]
        );
        for path in &written {
            let bytes = std::fs::read(path).unwrap();
            assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
            assert!(bytes.len() > 5_000, "{}: {}", path.display(), bytes.len());
        }
    }
}
