//! Prometheus histograms read from `/metrics` text: one series' buckets, the change over a run,
//! and the summary the scheduler campaign reports (mean, share at the first bucket, counts).

use serde::Serialize;

/// One histogram as exposed: cumulative counts per upper bound (`+Inf` last), sum and count,
/// summed over label sets other than `le`.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct HistogramSnapshot {
    /// Upper bounds (`le`), ascending; the last is `f64::INFINITY`.
    pub bounds: Vec<f64>,
    /// Cumulative observations at or below each bound.
    pub cumulative: Vec<f64>,
    /// Sum of observations.
    pub sum: f64,
    /// Number of observations.
    pub count: f64,
}

/// The `le` label of a bucket line's label set.
fn le_label(labels: &str) -> Option<f64> {
    let start = labels.find("le=\"")? + 4;
    let end = labels[start..].find('"')? + start;
    match &labels[start..end] {
        "+Inf" => Some(f64::INFINITY),
        text => text.parse().ok(),
    }
}

/// Reads histogram `name` from Prometheus text; `None` when the server does not export it.
pub fn parse_histogram(text: &str, name: &str) -> Option<HistogramSnapshot> {
    let bucket = format!("{name}_bucket");
    let sum_name = format!("{name}_sum");
    let count_name = format!("{name}_count");
    let mut buckets: Vec<(f64, f64)> = Vec::new();
    let (mut sum, mut count, mut seen) = (0.0, 0.0, false);
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let Some((series, value)) = line.rsplit_once(' ') else {
            continue;
        };
        let Ok(value) = value.trim().parse::<f64>() else {
            continue;
        };
        let (series_name, labels) = match series.split_once('{') {
            Some((n, rest)) => (n.trim(), rest),
            None => (series.trim(), ""),
        };
        if series_name == bucket {
            let Some(le) = le_label(labels) else {
                continue;
            };
            match buckets.iter_mut().find(|(b, _)| *b == le) {
                Some((_, c)) => *c += value,
                None => buckets.push((le, value)),
            }
            seen = true;
        } else if series_name == sum_name {
            sum += value;
        } else if series_name == count_name {
            count += value;
        }
    }
    if !seen {
        return None;
    }
    buckets.sort_by(|a, b| a.0.total_cmp(&b.0));
    Some(HistogramSnapshot {
        bounds: buckets.iter().map(|b| b.0).collect(),
        cumulative: buckets.iter().map(|b| b.1).collect(),
        sum,
        count,
    })
}

impl HistogramSnapshot {
    /// What was observed between `before` and `self` (same bounds; a bucket `before` lacks
    /// counts from zero).
    pub fn since(&self, before: &HistogramSnapshot) -> HistogramSnapshot {
        let earlier = |bound: f64| {
            before
                .bounds
                .iter()
                .position(|&b| b == bound)
                .map_or(0.0, |i| before.cumulative[i])
        };
        HistogramSnapshot {
            bounds: self.bounds.clone(),
            cumulative: self
                .bounds
                .iter()
                .zip(&self.cumulative)
                .map(|(&b, &c)| (c - earlier(b)).max(0.0))
                .collect(),
            sum: self.sum - before.sum,
            count: self.count - before.count,
        }
    }

    /// The summary of these observations.
    pub fn summary(&self) -> HistogramSummary {
        let mut previous = 0.0;
        let buckets = self
            .bounds
            .iter()
            .zip(&self.cumulative)
            .map(|(&le, &cumulative)| {
                let count = cumulative - previous;
                previous = cumulative;
                HistogramBucket {
                    le: if le.is_finite() { Some(le) } else { None },
                    count,
                }
            })
            .collect::<Vec<_>>();
        let first = buckets.first().map_or(0.0, |b| b.count);
        HistogramSummary {
            observations: self.count,
            mean: if self.count > 0.0 {
                self.sum / self.count
            } else {
                0.0
            },
            first_bucket_share: if self.count > 0.0 {
                first / self.count
            } else {
                0.0
            },
            buckets,
        }
    }
}

/// One bucket's own (not cumulative) observations.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct HistogramBucket {
    /// Upper bound; `None` for `+Inf`.
    pub le: Option<f64>,
    /// Observations in `(previous bound, le]`.
    pub count: f64,
}

/// What a run's observations of one histogram come to.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct HistogramSummary {
    /// Observations (e.g. decode steps).
    pub observations: f64,
    /// Mean observed value (e.g. sequences per decode step).
    pub mean: f64,
    /// Share of observations in the first bucket (for the decode batch, `le = 1`: steps that
    /// decoded one sequence).
    pub first_bucket_share: f64,
    /// Per-bucket counts.
    pub buckets: Vec<HistogramBucket>,
}

impl HistogramSummary {
    /// The buckets as `≤1:3 ≤2:0 … >512:0`, skipping empty ones (for markdown).
    pub fn compact(&self) -> String {
        let parts: Vec<String> = self
            .buckets
            .iter()
            .filter(|b| b.count > 0.0)
            .map(|b| match b.le {
                Some(le) => format!("≤{le}:{}", b.count),
                None => format!("more:{}", b.count),
            })
            .collect();
        if parts.is_empty() {
            "none".to_owned()
        } else {
            parts.join(" ")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = "# HELP h x\n# TYPE h histogram\n\
        h_bucket{model_name=\"m\",le=\"1\"} 2\nh_bucket{model_name=\"m\",le=\"4\"} 3\n\
        h_bucket{model_name=\"m\",le=\"+Inf\"} 3\nh_sum{model_name=\"m\"} 5\nh_count{model_name=\"m\"} 3\n";
    const AFTER: &str = "h_bucket{model_name=\"m\",le=\"1\"} 4\nh_bucket{model_name=\"m\",le=\"4\"} 9\n\
        h_bucket{model_name=\"m\",le=\"+Inf\"} 10\nh_sum{model_name=\"m\"} 45\nh_count{model_name=\"m\"} 10\n\
        other_bucket{le=\"1\"} 100\n";

    #[test]
    fn parses_buckets_and_ignores_other_series() {
        let h = parse_histogram(AFTER, "h").unwrap();
        assert_eq!(h.bounds, vec![1.0, 4.0, f64::INFINITY]);
        assert_eq!(h.cumulative, vec![4.0, 9.0, 10.0]);
        assert_eq!((h.sum, h.count), (45.0, 10.0));
        assert_eq!(parse_histogram(AFTER, "missing"), None);
    }

    #[test]
    fn the_change_over_a_run_summarises_into_mean_share_and_counts() {
        let before = parse_histogram(BEFORE, "h").unwrap();
        let after = parse_histogram(AFTER, "h").unwrap();
        let run = after.since(&before).summary();
        assert_eq!(run.observations, 7.0);
        assert!((run.mean - 40.0 / 7.0).abs() < 1e-12);
        assert!((run.first_bucket_share - 2.0 / 7.0).abs() < 1e-12);
        let counts: Vec<f64> = run.buckets.iter().map(|b| b.count).collect();
        assert_eq!(counts, vec![2.0, 4.0, 1.0]);
        assert_eq!(run.buckets[2].le, None);
        assert_eq!(run.compact(), "≤1:2 ≤4:4 more:1");
        let empty = before.since(&before).summary();
        assert_eq!((empty.mean, empty.first_bucket_share), (0.0, 0.0));
        assert_eq!(empty.compact(), "none");
    }

    #[test]
    fn label_sets_other_than_le_are_summed() {
        let text = "h_bucket{e=\"0\",le=\"1\"} 1\nh_bucket{e=\"1\",le=\"1\"} 2\n\
                    h_bucket{e=\"0\",le=\"+Inf\"} 1\nh_bucket{e=\"1\",le=\"+Inf\"} 5\n\
                    h_sum{e=\"0\"} 1\nh_sum{e=\"1\"} 9\nh_count{e=\"0\"} 1\nh_count{e=\"1\"} 5\n";
        let h = parse_histogram(text, "h").unwrap();
        assert_eq!(h.cumulative, vec![3.0, 6.0]);
        assert_eq!((h.sum, h.count), (10.0, 6.0));
    }
}
