//! The depth × context-length heatmap of one method's NIAH accuracy (PNG).
//!
//! Cells are coloured from red (no fact found) through yellow to green (every fact found), with
//! the score printed in each; a cell with no run is grey. Depth 0% is the top row, as in the
//! original test's plots.

use std::path::Path;

use plotters::coord::Shift;
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};

use crate::error::BenchError;
use crate::niah::grid::context_label;
use crate::niah::report::NiahReport;
use crate::plot::{plot_error, register_font, FONT_FAMILY};

/// Colour of a score in `[0, 1]`: red → yellow → green.
pub fn score_color(score: f64) -> RGBColor {
    let s = score.clamp(0.0, 1.0);
    let lerp = |a: f64, b: f64, t: f64| (a + (b - a) * t).round() as u8;
    // Anchors: red (215, 48, 39), yellow (254, 224, 139), green (26, 152, 80).
    if s < 0.5 {
        let t = s / 0.5;
        RGBColor(
            lerp(215.0, 254.0, t),
            lerp(48.0, 224.0, t),
            lerp(39.0, 139.0, t),
        )
    } else {
        let t = (s - 0.5) / 0.5;
        RGBColor(
            lerp(254.0, 26.0, t),
            lerp(224.0, 152.0, t),
            lerp(139.0, 80.0, t),
        )
    }
}

/// One heatmap: a title and a fact score (or none) per (context, depth) cell.
pub struct HeatmapGrid<'a> {
    /// The caption.
    pub title: String,
    /// Context lengths, tokens (columns, left to right).
    pub contexts: &'a [usize],
    /// Needle depths, percent (rows, top to bottom).
    pub depths: &'a [f64],
    /// `scores[i * depths.len() + j]`: the mean score of context `i`, depth `j`.
    pub scores: Vec<Option<f64>>,
}

impl<'a> HeatmapGrid<'a> {
    /// `method`'s cells of `report`, titled with the method, the model and its mean.
    pub fn of_report(report: &'a NiahReport, method: &str) -> Self {
        let mean = report.mean_of(method, None, |c| c.fact_score);
        Self::from_cells(
            format!("{method}: {} ({})", report.model, mean_label(mean)),
            &report.contexts_tokens,
            &report.depths_percent,
            |n, depth| {
                report
                    .cells_of(method)
                    .filter(|c| c.context_tokens == n && c.depth_percent == depth)
                    .map(|c| c.fact_score)
                    .collect()
            },
        )
    }

    /// A grid whose cell `(n, depth)` is the mean of `scores_at(n, depth)` (none when empty).
    pub fn from_cells(
        title: String,
        contexts: &'a [usize],
        depths: &'a [f64],
        scores_at: impl Fn(usize, f64) -> Vec<f64>,
    ) -> Self {
        let scores = contexts
            .iter()
            .flat_map(|&n| depths.iter().map(move |&d| (n, d)))
            .map(|(n, d)| crate::quality::mean(&scores_at(n, d)))
            .collect();
        Self {
            title,
            contexts,
            depths,
            scores,
        }
    }
}

/// "mean 87.5%", or "no runs".
pub fn mean_label(mean: Option<f64>) -> String {
    mean.map_or_else(
        || "no runs".to_owned(),
        |m| format!("mean {:.1}%", 100.0 * m),
    )
}

/// Writes the heatmap of `method`'s fact scores to `path` (PNG, 900×600).
pub fn write_heatmap_png(report: &NiahReport, method: &str, path: &Path) -> Result<(), BenchError> {
    let mut grid = HeatmapGrid::of_report(report, method);
    grid.title = format!("NIAH {}", grid.title);
    register_font()?;
    let root = BitMapBackend::new(path, (900, 600)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    draw_heatmap(&root, &grid)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Writes two heatmaps side by side under one title (PNG, 1800×640): the same grid of two
/// systems or methods.
pub fn write_heatmap_pair_png(
    title: &str,
    left: &HeatmapGrid<'_>,
    right: &HeatmapGrid<'_>,
    path: &Path,
) -> Result<(), BenchError> {
    register_font()?;
    let root = BitMapBackend::new(path, (1800, 640)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root.titled(title, (FONT_FAMILY, 22)).map_err(plot_error)?;
    let (a, b) = root.split_horizontally(900);
    draw_heatmap(&a, left)?;
    draw_heatmap(&b, right)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

/// Draws one grid on `area`.
fn draw_heatmap<DB: DrawingBackend>(
    area: &DrawingArea<DB, Shift>,
    grid: &HeatmapGrid<'_>,
) -> Result<(), BenchError> {
    let (contexts, depths) = (grid.contexts, grid.depths);
    if contexts.is_empty()
        || depths.is_empty()
        || grid.scores.len() != contexts.len() * depths.len()
    {
        return Err(BenchError::Invalid(
            "nothing to plot: no context length or no depth".into(),
        ));
    }
    let (nx, ny) = (contexts.len(), depths.len());
    // Cell (i, j) spans [i − 0.5, i + 0.5] so the integer label positions are cell centres.
    let mut chart = ChartBuilder::on(area)
        .caption(&grid.title, (FONT_FAMILY, 20))
        .margin(15)
        .x_label_area_size(50)
        .y_label_area_size(70)
        .build_cartesian_2d(-0.5..nx as f64 - 0.5, -0.5..ny as f64 - 0.5)
        .map_err(plot_error)?;
    let x_label =
        |v: &f64| index_label(*v, nx).map_or_else(String::new, |i| context_label(contexts[i]));
    // Row 0 (top) is the first depth: flip the y index.
    let y_label = |v: &f64| {
        index_label(*v, ny).map_or_else(String::new, |i| format!("{}", depths[ny - 1 - i]))
    };
    chart
        .configure_mesh()
        .disable_mesh()
        .x_labels(nx)
        .y_labels(ny)
        .x_label_formatter(&x_label)
        .y_label_formatter(&y_label)
        .x_desc("context length (tokens)")
        .y_desc("needle depth (%)")
        .label_style((FONT_FAMILY, 14))
        .draw()
        .map_err(plot_error)?;
    let cells: Vec<(f64, f64, Option<f64>)> = (0..nx)
        .flat_map(|i| (0..ny).map(move |j| (i, j)))
        .map(|(i, j)| (i as f64, (ny - 1 - j) as f64, grid.scores[i * ny + j]))
        .collect();
    chart
        .draw_series(cells.iter().map(|&(x, y, score)| {
            let color = score.map_or(RGBColor(200, 200, 200), score_color);
            Rectangle::new([(x - 0.5, y - 0.5), (x + 0.5, y + 0.5)], color.filled())
        }))
        .map_err(plot_error)?;
    let centred = TextStyle::from((FONT_FAMILY, 16).into_font())
        .color(&BLACK)
        .pos(Pos::new(HPos::Center, VPos::Center));
    chart
        .draw_series(cells.iter().map(|&(x, y, score)| {
            let text = score.map_or_else(|| "–".to_owned(), |s| format!("{:.0}", 100.0 * s));
            Text::new(text, (x, y), centred.clone())
        }))
        .map_err(plot_error)?;
    Ok(())
}

/// The cell index a tick at `v` labels, when it sits on a cell centre inside `0..count`.
fn index_label(v: f64, count: usize) -> Option<usize> {
    let rounded = v.round();
    ((v - rounded).abs() < 1e-6 && rounded >= 0.0 && (rounded as usize) < count)
        .then_some(rounded as usize)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::niah::report::tests::{cell, report};

    #[test]
    fn colours_run_from_red_through_yellow_to_green() {
        assert_eq!(score_color(0.0), RGBColor(215, 48, 39));
        assert_eq!(score_color(0.5), RGBColor(254, 224, 139));
        assert_eq!(score_color(1.0), RGBColor(26, 152, 80));
        assert_eq!(score_color(7.0), score_color(1.0));
    }

    #[test]
    fn tick_labels_only_on_cell_centres() {
        assert_eq!(index_label(2.0, 3), Some(2));
        assert_eq!(index_label(0.5, 3), None);
        assert_eq!(index_label(3.0, 3), None);
        assert_eq!(index_label(-1.0, 3), None);
    }

    #[test]
    fn writes_a_png() {
        let r = report(vec![
            cell("none", 1024, 0.0, 1.0, 1.0),
            cell("none", 1024, 100.0, 0.0, 0.0),
            cell("none", 2048, 0.0, 2.0 / 3.0, 0.5),
        ]);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("heat.png");
        write_heatmap_png(&r, "none", &path).unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(bytes.len() > 5_000, "a real picture: {}", bytes.len());
        let (a, b) = (
            HeatmapGrid::of_report(&r, "none"),
            HeatmapGrid::of_report(&r, "keydiff@0.5"),
        );
        assert_eq!(a.scores, vec![Some(1.0), Some(0.0), Some(2.0 / 3.0), None]);
        assert_eq!(b.scores, vec![None; 4]);
        let pair = dir.path().join("pair.png");
        write_heatmap_pair_png("two", &a, &b, &pair).unwrap();
        assert!(std::fs::read(&pair).unwrap().len() > 5_000);
    }
}
