//! Starling beside NVIDIA kvpress on the same NIAH prompts: `scripts/niah_kvpress.py` answers
//! the cells of a `prompts.json` with kvpress presses ([`KvpressAnswers`]); [`compare_with_kvpress`]
//! scores those answers with the same fact scorer and lines them up with Starling's cells by
//! method label and cell, with the KV bytes each system really held at the end of the run.
//! [`write_ratio_chart_png`] draws mean accuracy against the compression ratio for every method
//! and both systems.

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::Path;

use plotters::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::BenchError;
use crate::niah::grid::MethodSpec;
use crate::niah::heatmap::{mean_label, HeatmapGrid};
use crate::niah::report::NiahReport;
use crate::niah::score::{fact_score, NEEDLE_FACTS};
use crate::plot::{plot_error, register_font, FONT_FAMILY};
use crate::quality::mean;

/// One cell answered by kvpress.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvpressCell {
    /// The method label, as Starling's (`snapkv@0.75`, `none`).
    pub method: String,
    /// The cell's context length, tokens.
    pub context_tokens: usize,
    /// The needle depth, percent.
    pub depth_percent: f64,
    /// Prompt length kvpress saw (context + question), tokens.
    pub prompt_tokens: usize,
    /// The decoded answer.
    pub answer: String,
    /// The KV-cache bytes the model's cache tensors held at the end (all layers, K and V).
    pub kv_bytes_held: u64,
    /// Tokens per layer the cache held at the end (the largest layer).
    pub kv_tokens_held: usize,
    /// Why the cell has no answer, when the press failed.
    #[serde(default)]
    pub error: Option<String>,
}

/// The `kvpress_answers.json` document written by `scripts/niah_kvpress.py`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct KvpressAnswers {
    /// What produced it (library versions, presses and their settings, device).
    pub generator: serde_json::Value,
    /// Every cell of every press.
    pub cells: Vec<KvpressCell>,
}

/// One method of both systems.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ComparisonRow {
    /// The method label (`snapkv@0.75`).
    pub label: String,
    /// The method name (`snapkv`).
    pub method: String,
    /// Its compression ratio (0 for `none`).
    pub ratio: f64,
    /// Starling's mean fact score, `[0, 1]`.
    pub starling_accuracy: Option<f64>,
    /// kvpress's mean fact score over the cells it answered, `[0, 1]`.
    pub kvpress_accuracy: Option<f64>,
    /// Cells kvpress could not answer (the press failed).
    pub kvpress_failed_cells: usize,
    /// Mean KV bytes Starling's requests held at the end.
    pub starling_kv_bytes: Option<f64>,
    /// Mean KV bytes kvpress's caches held at the end.
    pub kvpress_kv_bytes: Option<f64>,
}

/// Every method label of `report` (in its order), with both systems' accuracy and KV bytes.
pub fn compare_with_kvpress(
    report: &NiahReport,
    kvpress: &KvpressAnswers,
) -> Result<Vec<ComparisonRow>, BenchError> {
    report
        .methods
        .iter()
        .map(|m| {
            let spec = MethodSpec::parse(&m.label)?;
            let theirs: Vec<&KvpressCell> = kvpress_cells(kvpress, &m.label).collect();
            let answered: Vec<f64> = theirs
                .iter()
                .filter(|c| c.error.is_none())
                .map(|c| fact_score(&c.answer, &NEEDLE_FACTS))
                .collect();
            let bytes: Vec<f64> = theirs
                .iter()
                .filter(|c| c.error.is_none())
                .map(|c| c.kv_bytes_held as f64)
                .collect();
            Ok(ComparisonRow {
                label: m.label.clone(),
                method: spec.name.clone(),
                ratio: spec.ratio,
                starling_accuracy: report.mean_of(&m.label, None, |c| c.fact_score),
                kvpress_accuracy: mean(&answered),
                kvpress_failed_cells: theirs.len() - answered.len(),
                starling_kv_bytes: report.mean_of(&m.label, None, |c| c.kv_bytes_final as f64),
                kvpress_kv_bytes: mean(&bytes),
            })
        })
        .collect()
}

/// kvpress's cells of one method label.
fn kvpress_cells<'a>(
    kvpress: &'a KvpressAnswers,
    label: &'a str,
) -> impl Iterator<Item = &'a KvpressCell> + 'a {
    kvpress.cells.iter().filter(move |c| c.method == label)
}

/// kvpress's heatmap of one method label on `report`'s grid.
pub fn kvpress_grid<'a>(
    report: &'a NiahReport,
    kvpress: &KvpressAnswers,
    label: &str,
) -> HeatmapGrid<'a> {
    let cells: Vec<&KvpressCell> = kvpress_cells(kvpress, label)
        .filter(|c| c.error.is_none())
        .collect();
    let scores: Vec<f64> = cells
        .iter()
        .map(|c| fact_score(&c.answer, &NEEDLE_FACTS))
        .collect();
    HeatmapGrid::from_cells(
        format!("kvpress {label} ({})", mean_label(mean(&scores))),
        &report.contexts_tokens,
        &report.depths_percent,
        |n, depth| {
            cells
                .iter()
                .filter(|c| c.context_tokens == n && c.depth_percent == depth)
                .map(|c| fact_score(&c.answer, &NEEDLE_FACTS))
                .collect()
        },
    )
}

/// The comparison as markdown: accuracy and KV bytes held per method, both systems.
pub fn comparison_markdown(rows: &[ComparisonRow], kvpress: &KvpressAnswers) -> String {
    let percent =
        |v: Option<f64>| v.map_or_else(|| "–".to_owned(), |v| format!("{:.1}", 100.0 * v));
    let mib = |v: Option<f64>| {
        v.map_or_else(
            || "–".to_owned(),
            |v| format!("{:.2}", v / (1024.0 * 1024.0)),
        )
    };
    let mut out = format!(
        "### Starling vs NVIDIA kvpress, same prompt ids, greedy\n\n\
         kvpress: `{}`. Both answers are scored by the same fact scorer. KV held: the cache \
         each system really held at the end of a run (Starling: the request's physical slots; \
         kvpress: the sizes of its cache tensors; a press that masks instead of gathering \
         would show no saving here).\n\n\
         | method | Starling % | kvpress % | Starling − kvpress | Starling KV MiB | kvpress KV MiB | kvpress failed cells |\n\
         |---|---:|---:|---:|---:|---:|---:|\n",
        kvpress.generator
    );
    for r in rows {
        let gap = match (r.starling_accuracy, r.kvpress_accuracy) {
            (Some(a), Some(b)) => format!("{:+.1}", 100.0 * (a - b)),
            _ => "–".to_owned(),
        };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {gap} | {} | {} | {} |",
            r.label,
            percent(r.starling_accuracy),
            percent(r.kvpress_accuracy),
            mib(r.starling_kv_bytes),
            mib(r.kvpress_kv_bytes),
            r.kvpress_failed_cells
        );
    }
    out
}

/// One system's figure of a comparison row.
type Pick = fn(&ComparisonRow) -> Option<f64>;

/// Mean accuracy (left) and mean KV MiB held (right) against compression ratio, one line per
/// method and system (Starling solid with circles, kvpress dashed with triangles, one colour per
/// method); each line starts at ratio 0 from its system's `none` (PNG, 1800×700).
pub fn write_ratio_chart_png(
    rows: &[ComparisonRow],
    title: &str,
    path: &Path,
) -> Result<(), BenchError> {
    let methods: BTreeSet<&str> = rows
        .iter()
        .filter(|r| r.method != "none" && r.ratio > 0.0)
        .map(|r| r.method.as_str())
        .collect();
    if methods.is_empty() {
        return Err(BenchError::Invalid(
            "nothing to plot: no compressed method in the comparison".into(),
        ));
    }
    register_font()?;
    let root = BitMapBackend::new(path, (1800, 700)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root.titled(title, (FONT_FAMILY, 20)).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(1000);
    let accuracy: [(&str, Pick); 2] = [
        ("Starling", |r| r.starling_accuracy.map(|a| 100.0 * a)),
        ("kvpress", |r| r.kvpress_accuracy.map(|a| 100.0 * a)),
    ];
    let mib = 1024.0 * 1024.0;
    let kv: [(&str, Pick); 2] = [
        ("Starling", |r| {
            r.starling_kv_bytes.map(|b| b / (1024.0 * 1024.0))
        }),
        ("kvpress", |r| {
            r.kvpress_kv_bytes.map(|b| b / (1024.0 * 1024.0))
        }),
    ];
    let top_kv = rows
        .iter()
        .flat_map(|r| [r.starling_kv_bytes, r.kvpress_kv_bytes])
        .flatten()
        .fold(0.0, f64::max)
        / mib;
    ratio_panel(
        &left,
        rows,
        &methods,
        &accuracy,
        ("NIAH accuracy (% of needle facts)", 105.0),
        SeriesLabelPosition::LowerLeft,
    )?;
    ratio_panel(
        &right,
        rows,
        &methods,
        &kv,
        (
            "KV cache held at the end (MiB, mean)",
            top_kv.max(1e-3) * 1.1,
        ),
        SeriesLabelPosition::UpperRight,
    )?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// One panel of [`write_ratio_chart_png`]: `systems`' figure against the ratio, per method.
fn ratio_panel<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    rows: &[ComparisonRow],
    methods: &BTreeSet<&str>,
    systems: &[(&str, Pick); 2],
    (y_desc, y_max): (&str, f64),
    legend: SeriesLabelPosition,
) -> Result<(), BenchError> {
    let none = rows.iter().find(|r| r.method == "none");
    let max_ratio = rows.iter().map(|r| r.ratio).fold(0.0, f64::max).max(0.1);
    let mut chart = ChartBuilder::on(area)
        .margin(20)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.02..max_ratio + 0.02, 0.0..y_max)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc("compression ratio (share of tokens evicted)")
        .y_desc(y_desc)
        .label_style((FONT_FAMILY, 14))
        .draw()
        .map_err(plot_error)?;
    let palette = [
        RGBColor(31, 119, 180),
        RGBColor(255, 127, 14),
        RGBColor(44, 160, 44),
        RGBColor(214, 39, 40),
        RGBColor(148, 103, 189),
        RGBColor(140, 86, 75),
        RGBColor(227, 119, 194),
        RGBColor(127, 127, 127),
    ];
    for (k, method) in methods.iter().enumerate() {
        let color = palette[k % palette.len()];
        for &(system, pick) in systems {
            let mut points: Vec<(f64, f64)> = none
                .and_then(pick)
                .map(|v| (0.0, v))
                .into_iter()
                .chain(
                    rows.iter()
                        .filter(|r| r.method == *method && r.ratio > 0.0)
                        .filter_map(|r| pick(r).map(|v| (r.ratio, v))),
                )
                .collect();
            points.sort_by(|a, b| a.0.total_cmp(&b.0));
            if points.is_empty() {
                continue;
            }
            let label = format!("{method} ({system})");
            if system == "Starling" {
                chart
                    .draw_series(LineSeries::new(points.clone(), color.stroke_width(3)))
                    .map_err(plot_error)?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(3))
                    });
                chart
                    .draw_series(points.iter().map(|&p| Circle::new(p, 5, color.filled())))
                    .map_err(plot_error)?;
            } else {
                chart
                    .draw_series(DashedLineSeries::new(
                        points.clone(),
                        8,
                        5,
                        color.stroke_width(2),
                    ))
                    .map_err(plot_error)?
                    .label(label)
                    .legend(move |(x, y)| {
                        PathElement::new(vec![(x, y), (x + 8, y)], color.stroke_width(2))
                    });
                chart
                    .draw_series(
                        points
                            .iter()
                            .map(|&p| TriangleMarker::new(p, 6, color.filled())),
                    )
                    .map_err(plot_error)?;
            }
        }
    }
    chart
        .configure_series_labels()
        .position(legend)
        .label_font((FONT_FAMILY, 13))
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::niah::report::tests::{cell, report};
    use crate::niah::NEEDLE;

    fn kv_cell(method: &str, depth: f64, answer: &str, error: Option<&str>) -> KvpressCell {
        KvpressCell {
            method: method.into(),
            context_tokens: 1024,
            depth_percent: depth,
            prompt_tokens: 1024,
            answer: answer.into(),
            kv_bytes_held: 2048,
            kv_tokens_held: 512,
            error: error.map(str::to_owned),
        }
    }

    #[test]
    fn kvpress_answers_are_scored_and_lined_up_by_label() {
        let r = report(vec![
            cell("none", 1024, 0.0, 1.0, 1.0),
            cell("none", 1024, 100.0, 1.0, 1.0),
            cell("keydiff@0.5", 1024, 0.0, 0.5, 0.5),
            cell("keydiff@0.5", 1024, 100.0, 0.5, 0.5),
        ]);
        let kv = KvpressAnswers {
            generator: serde_json::json!({"kvpress": "0.5.5"}),
            cells: vec![
                kv_cell("none", 0.0, NEEDLE, None),
                kv_cell("none", 100.0, NEEDLE, None),
                kv_cell("keydiff@0.5", 0.0, "no idea", None),
                kv_cell("keydiff@0.5", 100.0, "", Some("press failed")),
            ],
        };
        let rows = compare_with_kvpress(&r, &kv).unwrap();
        assert_eq!(rows.len(), 2);
        assert_eq!(rows[0].kvpress_accuracy, Some(1.0));
        assert_eq!((rows[1].method.as_str(), rows[1].ratio), ("keydiff", 0.5));
        assert_eq!(rows[1].starling_accuracy, Some(0.5));
        assert_eq!(rows[1].kvpress_accuracy, Some(0.0));
        assert_eq!(rows[1].kvpress_failed_cells, 1);
        assert_eq!(rows[1].kvpress_kv_bytes, Some(2048.0));
        let md = comparison_markdown(&rows, &kv);
        assert!(md.contains("| keydiff@0.5 | 50.0 | 0.0 | +50.0 |"), "{md}");
        let grid = kvpress_grid(&r, &kv, "keydiff@0.5");
        assert_eq!(grid.scores, vec![Some(0.0), None, None, None]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ratio.png");
        write_ratio_chart_png(&rows, "test", &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 5_000);
        assert!(write_ratio_chart_png(&rows[..1], "none only", &path).is_err());
    }
}
