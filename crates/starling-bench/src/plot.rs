//! The concurrency-sweep PNG: output throughput, and median TTFT / TPOT, against concurrency.
//!
//! Text is drawn with a font shipped in the crate (DejaVu Sans Mono, free license beside it in
//! `assets/`), so no system font or fontconfig is needed.

use std::path::Path;

use plotters::coord::types::RangedCoordf64;
use plotters::coord::Shift;
use plotters::prelude::*;

use crate::error::BenchError;
use crate::report::SweepRow;

const FONT: &[u8] = include_bytes!("../assets/DejaVuSansMono.ttf");
/// The family name the shipped font is registered under.
pub(crate) const FONT_FAMILY: &str = "sans-serif";

/// A plotting error as a [`BenchError`].
pub(crate) fn plot_error(e: impl std::fmt::Display) -> BenchError {
    BenchError::Plot(e.to_string())
}

/// Registers the shipped font as [`FONT_FAMILY`] (registering twice is harmless).
pub(crate) fn register_font() -> Result<(), BenchError> {
    // The font is compiled in, so this cannot meet a bad file.
    plotters::style::register_font(FONT_FAMILY, FontStyle::Normal, FONT)
        .map_err(|_| BenchError::Plot("the shipped font does not parse".into()))
}

/// A chart whose axes run from 0 to `max_x` and `max_y`, captioned, with its labelled mesh drawn:
/// the frame every line chart of the bench reports shares.
pub(crate) fn linear_chart<'a, DB: DrawingBackend + 'a>(
    area: &'a DrawingArea<DB, Shift>,
    caption: &str,
    (max_x, max_y): (f64, f64),
    (x_desc, y_desc): (&str, &str),
    label_px: u32,
) -> Result<ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>, BenchError> {
    let mut chart = ChartBuilder::on(area)
        .caption(caption, (FONT_FAMILY, 18))
        .margin(15)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..max_x, 0.0..max_y)
        .map_err(plot_error)?;
    chart
        .configure_mesh()
        .x_desc(x_desc)
        .y_desc(y_desc)
        .label_style((FONT_FAMILY, label_px))
        .draw()
        .map_err(plot_error)?;
    Ok(chart)
}

/// The legend of a chart's labelled series, on a translucent white box.
pub(crate) fn draw_legend<'a, DB: DrawingBackend + 'a>(
    chart: &mut ChartContext<'a, DB, Cartesian2d<RangedCoordf64, RangedCoordf64>>,
    label_px: u32,
) -> Result<(), BenchError> {
    chart
        .configure_series_labels()
        .label_font((FONT_FAMILY, label_px))
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(plot_error)
}

/// Writes the sweep plot to `path` (PNG, 1200×500).
pub fn write_sweep_png(rows: &[SweepRow], title: &str, path: &Path) -> Result<(), BenchError> {
    if rows.is_empty() {
        return Err(BenchError::Invalid(
            "nothing to plot: the sweep has no rows".into(),
        ));
    }
    register_font()?;
    let root = BitMapBackend::new(path, (1200, 500)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_error)?;
    let root = root.titled(title, (FONT_FAMILY, 22)).map_err(plot_error)?;
    let (left, right) = root.split_horizontally(600);
    let max_x = rows.iter().map(|r| r.concurrency).max().unwrap_or(1) as f64 * 1.05;

    let throughput: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.concurrency as f64, r.metrics.output_throughput))
        .collect();
    let max_tput = throughput.iter().map(|p| p.1).fold(0.0, f64::max).max(1e-9) * 1.1;
    let mut chart = linear_chart(
        &left,
        "output throughput",
        (max_x, max_tput),
        ("max concurrency", "tokens/s"),
        14,
    )?;
    chart
        .draw_series(LineSeries::new(throughput.clone(), BLUE.stroke_width(2)))
        .map_err(plot_error)?;
    chart
        .draw_series(throughput.iter().map(|&p| Circle::new(p, 4, BLUE.filled())))
        .map_err(plot_error)?;

    let ttft: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.concurrency as f64, r.metrics.ttft.median_ms))
        .collect();
    let tpot: Vec<(f64, f64)> = rows
        .iter()
        .map(|r| (r.concurrency as f64, r.metrics.tpot.median_ms))
        .collect();
    let max_ms = ttft
        .iter()
        .chain(&tpot)
        .map(|p| p.1)
        .fold(0.0, f64::max)
        .max(1e-9)
        * 1.1;
    let mut chart = linear_chart(
        &right,
        "median latency",
        (max_x, max_ms),
        ("max concurrency", "ms"),
        14,
    )?;
    for (points, color, name) in [(ttft, RED, "TTFT"), (tpot, GREEN, "TPOT")] {
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))
            .map_err(plot_error)?
            .label(name)
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 20, y)], color));
        chart
            .draw_series(points.iter().map(|&p| Circle::new(p, 4, color.filled())))
            .map_err(plot_error)?;
    }
    draw_legend(&mut chart, 14)?;
    root.present().map_err(plot_error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::server_metrics::ServerFigures;
    use crate::stats::{BenchmarkMetrics, LatencySummary};

    #[test]
    fn writes_a_png() {
        let row = |c: usize, tput: f64| SweepRow {
            concurrency: c,
            metrics: BenchmarkMetrics {
                output_throughput: tput,
                ttft: LatencySummary {
                    mean_ms: 1.0,
                    median_ms: 10.0 * c as f64,
                    p99_ms: 1.0,
                },
                tpot: LatencySummary {
                    mean_ms: 1.0,
                    median_ms: 5.0 + c as f64,
                    p99_ms: 1.0,
                },
                ..BenchmarkMetrics::default()
            },
            server: ServerFigures::default(),
            kernel_profile: Vec::new(),
        };
        let dir = std::env::temp_dir().join(format!("starling-plot-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("sweep.png");
        write_sweep_png(
            &[row(1, 20.0), row(4, 60.0), row(8, 90.0)],
            "test sweep",
            &path,
        )
        .unwrap();
        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(&bytes[..8], b"\x89PNG\r\n\x1a\n");
        assert!(
            bytes.len() > 5_000,
            "a real picture, not an empty canvas: {}",
            bytes.len()
        );
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
