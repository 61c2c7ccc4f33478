//! The points a campaign runs: which workload, how many requests, how they are paced, and
//! what context window the server needs. Pure data; the runner turns a [`Point`] into requests.

use std::fmt;

use serde::Serialize;

use crate::dataset::RandomSpec;
use crate::driver::Pacing;
use crate::error::BenchError;

/// The four campaigns.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum CampaignKind {
    /// Throughput and TTFT/TPOT p99 against concurrency.
    Concurrency,
    /// Status and throughput against context length (the server booted for each length).
    Context,
    /// Decode-dominated: TPOT p99 and KV use against `max_tokens`.
    LongGeneration,
    /// Scheduler efficiency under Poisson arrivals: the decode-batch histogram.
    Scheduler,
}

impl CampaignKind {
    /// Every campaign, in run order.
    pub const ALL: [CampaignKind; 4] = [
        CampaignKind::Concurrency,
        CampaignKind::LongGeneration,
        CampaignKind::Scheduler,
        CampaignKind::Context,
    ];

    /// The command-line and file name.
    pub fn name(self) -> &'static str {
        match self {
            CampaignKind::Concurrency => "concurrency",
            CampaignKind::Context => "context",
            CampaignKind::LongGeneration => "long-generation",
            CampaignKind::Scheduler => "scheduler",
        }
    }

    /// What a point's value means, for tables and plot axes.
    pub fn point_label(self) -> &'static str {
        match self {
            CampaignKind::Concurrency => "max concurrency",
            CampaignKind::Context => "context tokens",
            CampaignKind::LongGeneration => "max_tokens",
            CampaignKind::Scheduler => "request rate (req/s)",
        }
    }

    /// Parses `all` or a comma-separated list of names.
    pub fn parse_list(text: &str) -> Result<Vec<CampaignKind>, BenchError> {
        if text.trim() == "all" {
            return Ok(Self::ALL.to_vec());
        }
        let mut kinds = Vec::new();
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let kind = Self::ALL
                .into_iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| {
                    BenchError::Invalid(format!(
                        "unknown campaign `{name}` (known: all, {})",
                        Self::ALL.map(|k| k.name()).join(", ")
                    ))
                })?;
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
        if kinds.is_empty() {
            return Err(BenchError::Invalid("no campaign named".into()));
        }
        kinds.sort_by_key(|k| Self::ALL.iter().position(|a| a == k));
        Ok(kinds)
    }
}

impl fmt::Display for CampaignKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What the requests of a point look like.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "dataset", rename_all = "snake_case")]
pub enum Workload {
    /// vLLM's random dataset.
    Random {
        /// Mean prompt length, tokens.
        input_len_tokens: usize,
        /// Mean output length, tokens.
        output_len_tokens: usize,
        /// Relative half-width of the uniform length range.
        range_ratio: f64,
    },
    /// ShareGPT conversations (their first exchange), lengths from the server's tokenizer.
    Sharegpt {
        /// The ShareGPT JSON file; `None`: the cached chitchat conversion.
        file: Option<String>,
    },
}

impl Workload {
    /// Parses `random:IN:OUT[:RANGE]`, `sharegpt` or `sharegpt:FILE`.
    pub fn parse(text: &str) -> Result<Workload, BenchError> {
        let bad = || {
            BenchError::Invalid(format!(
                "workload `{text}`: expected random:IN:OUT[:RANGE], sharegpt or sharegpt:FILE"
            ))
        };
        let mut parts = text.trim().splitn(2, ':');
        match (parts.next(), parts.next()) {
            (Some("sharegpt"), None) => Ok(Workload::Sharegpt { file: None }),
            (Some("sharegpt"), Some(file)) if !file.is_empty() => Ok(Workload::Sharegpt {
                file: Some(file.to_owned()),
            }),
            (Some("random"), Some(rest)) => {
                let fields: Vec<&str> = rest.split(':').collect();
                if !(2..=3).contains(&fields.len()) {
                    return Err(bad());
                }
                let tokens = |s: &str| s.parse::<usize>().ok().filter(|&n| n > 0);
                let input = tokens(fields[0]).ok_or_else(bad)?;
                let output = tokens(fields[1]).ok_or_else(bad)?;
                let range_ratio = match fields.get(2) {
                    Some(r) => r
                        .parse::<f64>()
                        .ok()
                        .filter(|r| (0.0..1.0).contains(r))
                        .ok_or_else(bad)?,
                    None => 0.0,
                };
                Ok(Workload::Random {
                    input_len_tokens: input,
                    output_len_tokens: output,
                    range_ratio,
                })
            }
            _ => Err(bad()),
        }
    }

    /// A short name for tables and file names (`random-1024x256`, `sharegpt`).
    pub fn label(&self) -> String {
        match self {
            Workload::Random {
                input_len_tokens,
                output_len_tokens,
                range_ratio,
            } if *range_ratio > 0.0 => {
                format!("random-{input_len_tokens}x{output_len_tokens}-r{range_ratio}")
            }
            Workload::Random {
                input_len_tokens,
                output_len_tokens,
                ..
            } => format!("random-{input_len_tokens}x{output_len_tokens}"),
            Workload::Sharegpt { .. } => "sharegpt".to_owned(),
        }
    }

    /// The random dataset's parameters (`None` for ShareGPT).
    pub fn random_spec(&self) -> Option<RandomSpec> {
        match *self {
            Workload::Random {
                input_len_tokens,
                output_len_tokens,
                range_ratio,
            } => Some(RandomSpec {
                input_len_tokens,
                output_len_tokens,
                range_ratio,
            }),
            Workload::Sharegpt { .. } => None,
        }
    }
}

/// How many requests a concurrency point sends: `per_concurrency × concurrency`, kept within
/// `[min, max]`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct RequestCount {
    /// Requests per unit of concurrency.
    pub per_concurrency: usize,
    /// Fewest requests at a point.
    pub min: usize,
    /// Most requests at a point.
    pub max: usize,
}

impl RequestCount {
    /// Requests at `concurrency`.
    pub fn at(self, concurrency: usize) -> usize {
        (self.per_concurrency * concurrency).clamp(self.min.max(1), self.max.max(self.min.max(1)))
    }
}

/// Every campaign's grid and workload.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CampaignPlan {
    /// Campaigns to run, in run order.
    pub campaigns: Vec<CampaignKind>,
    /// Context window of the servers outside the context campaign, tokens.
    pub max_model_len_tokens: usize,
    /// Seed of every dataset and of the arrivals.
    pub seed: u64,
    /// (a) workloads, each run at every concurrency.
    pub concurrency_workloads: Vec<Workload>,
    /// (a) concurrency points.
    pub concurrency_points: Vec<usize>,
    /// (a) requests per point.
    pub concurrency_requests: RequestCount,
    /// (b) context lengths (prompt + output), tokens.
    pub context_points_tokens: Vec<usize>,
    /// (b) output tokens of each request.
    pub context_output_tokens: usize,
    /// (b) requests per point, all in flight at once.
    pub context_requests: usize,
    /// (c) `max_tokens` points.
    pub long_generation_points_tokens: Vec<usize>,
    /// (c) prompt length, tokens.
    pub long_generation_input_tokens: usize,
    /// (c) requests per point, all in flight at once.
    pub long_generation_requests: usize,
    /// (d) Poisson arrival rates, requests/s.
    pub scheduler_rates_per_s: Vec<f64>,
    /// (d) workload.
    pub scheduler_workload: Workload,
    /// (d) requests per point.
    pub scheduler_requests: usize,
}

/// One measured point of one campaign.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Point {
    /// Its campaign.
    pub campaign: CampaignKind,
    /// Its requests' shape.
    pub workload: Workload,
    /// The point's value on the campaign's axis ([`CampaignKind::point_label`]).
    pub value: f64,
    /// Requests sent.
    pub num_requests: usize,
    /// How they are released.
    #[serde(skip)]
    pub pacing: Pacing,
    /// The context window this point needs the server booted with, when the engine's command
    /// takes it (`{max_model_len}`); `None`: the campaign's shared server.
    pub boot_max_model_len_tokens: Option<usize>,
}

impl CampaignPlan {
    /// Checks the grids: every campaign asked for has points, and every length is positive.
    pub fn validate(&self) -> Result<(), BenchError> {
        let invalid = |m: String| Err(BenchError::Invalid(m));
        for &kind in &self.campaigns {
            let empty = match kind {
                CampaignKind::Concurrency => {
                    self.concurrency_points.is_empty() || self.concurrency_workloads.is_empty()
                }
                CampaignKind::Context => self.context_points_tokens.is_empty(),
                CampaignKind::LongGeneration => self.long_generation_points_tokens.is_empty(),
                CampaignKind::Scheduler => self.scheduler_rates_per_s.is_empty(),
            };
            if empty {
                return invalid(format!("the {kind} campaign has no points"));
            }
        }
        if self.concurrency_points.contains(&0) {
            return invalid("concurrency points must be at least 1".into());
        }
        if let Some(&len) = self
            .context_points_tokens
            .iter()
            .find(|&&len| len <= self.context_output_tokens)
        {
            return invalid(format!(
                "context point {len} leaves no prompt after {} output tokens",
                self.context_output_tokens
            ));
        }
        if self.long_generation_points_tokens.contains(&0)
            || self.long_generation_input_tokens == 0
            || self.context_output_tokens == 0
        {
            return invalid("token counts must be at least 1".into());
        }
        if self
            .scheduler_rates_per_s
            .iter()
            .any(|r| !(r.is_finite() && *r > 0.0))
        {
            return invalid("request rates must be positive".into());
        }
        if self.context_requests == 0
            || self.long_generation_requests == 0
            || self.scheduler_requests == 0
        {
            return invalid("every campaign needs at least one request per point".into());
        }
        Ok(())
    }

    /// Every point of the campaigns asked for, in run order (the context campaign, which may
    /// reboot servers, last).
    pub fn points(&self) -> Vec<Point> {
        let mut points = Vec::new();
        for &kind in &self.campaigns {
            match kind {
                CampaignKind::Concurrency => {
                    for workload in &self.concurrency_workloads {
                        for &c in &self.concurrency_points {
                            points.push(Point {
                                campaign: kind,
                                workload: workload.clone(),
                                value: c as f64,
                                num_requests: self.concurrency_requests.at(c),
                                pacing: Pacing::Concurrency(c),
                                boot_max_model_len_tokens: None,
                            });
                        }
                    }
                }
                CampaignKind::Context => {
                    for &len in &self.context_points_tokens {
                        points.push(Point {
                            campaign: kind,
                            workload: Workload::Random {
                                input_len_tokens: len - self.context_output_tokens,
                                output_len_tokens: self.context_output_tokens,
                                range_ratio: 0.0,
                            },
                            value: len as f64,
                            num_requests: self.context_requests,
                            pacing: Pacing::Concurrency(self.context_requests),
                            boot_max_model_len_tokens: Some(len),
                        });
                    }
                }
                CampaignKind::LongGeneration => {
                    for &max_tokens in &self.long_generation_points_tokens {
                        points.push(Point {
                            campaign: kind,
                            workload: Workload::Random {
                                input_len_tokens: self.long_generation_input_tokens,
                                output_len_tokens: max_tokens,
                                range_ratio: 0.0,
                            },
                            value: max_tokens as f64,
                            num_requests: self.long_generation_requests,
                            pacing: Pacing::Concurrency(self.long_generation_requests),
                            boot_max_model_len_tokens: None,
                        });
                    }
                }
                CampaignKind::Scheduler => {
                    for &rate in &self.scheduler_rates_per_s {
                        points.push(Point {
                            campaign: kind,
                            workload: self.scheduler_workload.clone(),
                            value: rate,
                            num_requests: self.scheduler_requests,
                            pacing: Pacing::Rate {
                                per_s: rate,
                                max_concurrency: None,
                            },
                            boot_max_model_len_tokens: None,
                        });
                    }
                }
            }
        }
        points
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn small_plan() -> CampaignPlan {
        CampaignPlan {
            campaigns: CampaignKind::ALL.to_vec(),
            max_model_len_tokens: 256,
            seed: 3,
            concurrency_workloads: vec![Workload::parse("random:16:4").unwrap()],
            concurrency_points: vec![1, 4],
            concurrency_requests: RequestCount {
                per_concurrency: 2,
                min: 3,
                max: 6,
            },
            context_points_tokens: vec![64, 512],
            context_output_tokens: 4,
            context_requests: 2,
            long_generation_points_tokens: vec![8, 16],
            long_generation_input_tokens: 8,
            long_generation_requests: 2,
            scheduler_rates_per_s: vec![50.0],
            scheduler_workload: Workload::parse("random:16:4:0.5").unwrap(),
            scheduler_requests: 4,
        }
    }

    #[test]
    fn workloads_parse_and_name_themselves() {
        let w = Workload::parse("random:1024:256").unwrap();
        assert_eq!(w.label(), "random-1024x256");
        assert_eq!(w.random_spec().unwrap().output_len_tokens, 256);
        let w = Workload::parse("random:1024:256:0.5").unwrap();
        assert_eq!(w.label(), "random-1024x256-r0.5");
        assert_eq!(
            Workload::parse("sharegpt").unwrap(),
            Workload::Sharegpt { file: None }
        );
        assert_eq!(
            Workload::parse("sharegpt:d.json").unwrap(),
            Workload::Sharegpt {
                file: Some("d.json".into())
            }
        );
        for bad in [
            "random",
            "random:0:4",
            "random:4",
            "random:4:4:1.5",
            "zipf",
            "",
        ] {
            assert!(Workload::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn campaign_lists_parse_in_run_order() {
        assert_eq!(
            CampaignKind::parse_list("all").unwrap(),
            CampaignKind::ALL.to_vec()
        );
        assert_eq!(
            CampaignKind::parse_list("context,concurrency,context").unwrap(),
            vec![CampaignKind::Concurrency, CampaignKind::Context]
        );
        assert!(CampaignKind::parse_list("speed").is_err());
        assert!(CampaignKind::parse_list(",").is_err());
    }

    #[test]
    fn request_counts_scale_with_concurrency_within_bounds() {
        let count = RequestCount {
            per_concurrency: 2,
            min: 8,
            max: 100,
        };
        assert_eq!(count.at(1), 8);
        assert_eq!(count.at(16), 32);
        assert_eq!(count.at(128), 100);
    }

    #[test]
    fn points_cover_every_campaign_and_only_context_points_boot_their_own_window() {
        let plan = small_plan();
        plan.validate().unwrap();
        let points = plan.points();
        let of = |kind| points.iter().filter(|p| p.campaign == kind).count();
        assert_eq!(of(CampaignKind::Concurrency), 2);
        assert_eq!(of(CampaignKind::Context), 2);
        assert_eq!(of(CampaignKind::LongGeneration), 2);
        assert_eq!(of(CampaignKind::Scheduler), 1);
        assert_eq!(points.last().unwrap().campaign, CampaignKind::Context);
        for p in &points {
            assert_eq!(
                p.boot_max_model_len_tokens.is_some(),
                p.campaign == CampaignKind::Context
            );
        }
        let context = points
            .iter()
            .find(|p| p.campaign == CampaignKind::Context && p.value == 512.0)
            .unwrap();
        let spec = context.workload.random_spec().unwrap();
        assert_eq!(spec.input_len_tokens + spec.output_len_tokens, 512);
        assert_eq!(points[1].num_requests, 6, "2 × 4 concurrency, capped at 6");
        assert_eq!(points[1].pacing, Pacing::Concurrency(4));
    }

    #[test]
    fn bad_grids_are_refused() {
        let mut plan = small_plan();
        plan.context_points_tokens = vec![4];
        assert!(plan.validate().is_err(), "no room for a prompt");
        let mut plan = small_plan();
        plan.scheduler_rates_per_s = vec![0.0];
        assert!(plan.validate().is_err());
        let mut plan = small_plan();
        plan.concurrency_points.clear();
        assert!(plan.validate().is_err());
        plan.campaigns = vec![CampaignKind::Context];
        assert!(plan.validate().is_ok(), "an unused grid may be empty");
    }
}
