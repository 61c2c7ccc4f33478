//! The compression configuration, parsed from vLLM-style JSON
//! (`{"method":"keydiff","ratio":0.5}`) per server and overridable per request.
//!
//! Two kinds share the `--kv-compression` flag ([`KvCompression`]): token eviction
//! ([`CompressionConfig`], per request) and STAR-KV (`{"method":"star_kv","checkpoint":DIR,
//! "rank_profile":"balanced"}`, [`StarKvSelection`]), alone or together
//! (`{"star_kv":{...},"eviction":{...}}`). STAR-KV changes what the model caches, so it is fixed
//! when the engine loads the model; a request can never select it
//! ([`CompressionConfig::from_value`], the per-request parser, refuses it), but it may choose
//! its own eviction on top of it.

use std::fmt;
use std::path::PathBuf;

use serde_json::{Map, Value};

use crate::select::keep_count;
use crate::EvictError;

/// Which scorer ranks tokens for eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CompressionMethod {
    /// No eviction.
    None,
    /// KeyDiff: evict keys most similar to the mean key direction.
    KeyDiff,
    /// KNorm: evict the keys of largest L2 norm.
    KNorm,
    /// StreamingLLM: keep attention sinks and the most recent tokens.
    StreamingLlm,
    /// Seeded uniform scores (a control).
    Random,
    /// SnapKV: attention of the last prompt queries, max-pooled.
    SnapKv,
    /// TOVA: attention of the newest query, averaged over every head of the layer (all heads
    /// keep the same tokens).
    Tova,
}

impl CompressionMethod {
    /// Every method, in the order their names are listed in errors.
    pub const ALL: [CompressionMethod; 7] = [
        Self::None,
        Self::KeyDiff,
        Self::KNorm,
        Self::StreamingLlm,
        Self::Random,
        Self::SnapKv,
        Self::Tova,
    ];

    /// The JSON / CLI name.
    pub fn name(self) -> &'static str {
        match self {
            Self::None => "none",
            Self::KeyDiff => "keydiff",
            Self::KNorm => "knorm",
            Self::StreamingLlm => "streaming_llm",
            Self::Random => "random",
            Self::SnapKv => "snapkv",
            Self::Tova => "tova",
        }
    }

    /// The method of a JSON / CLI name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|m| m.name() == name)
    }
}

impl fmt::Display for CompressionMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How (and whether) a sequence's KV cache is compressed by token eviction.
#[derive(Clone, Debug, PartialEq)]
pub struct CompressionConfig {
    /// The scorer.
    pub method: CompressionMethod,
    /// Share of the unprotected tokens evicted, in `[0, 1)`.
    pub ratio: f64,
    /// Leading tokens (attention sinks) never evicted.
    pub sink_tokens: usize,
    /// Most recent tokens never evicted.
    pub window_tokens: usize,
    /// During decoding, re-compress back to the target ratio every this many new tokens.
    pub every_n_tokens: usize,
    /// Seed of the `random` scorer.
    pub seed: u64,
    /// Whether each KV head of a full layer keeps its own tokens (kvpress's default), or every
    /// head the same ones (the heads' scores averaged). A STAR-KV latent layer always keeps the
    /// same tokens for every head: they share one value latent.
    pub head_wise: bool,
}

impl Default for CompressionConfig {
    /// No eviction, with the documented defaults for the other fields.
    fn default() -> Self {
        Self {
            method: CompressionMethod::None,
            ratio: 0.0,
            sink_tokens: 4,
            window_tokens: 32,
            every_n_tokens: 64,
            seed: 0,
            head_wise: true,
        }
    }
}

const FIELDS: [&str; 7] = [
    "method",
    "ratio",
    "sink_tokens",
    "window_tokens",
    "every_n_tokens",
    "seed",
    "head_wise",
];

/// The `method` name of STAR-KV in `--kv-compression` JSON.
pub const STAR_KV_METHOD: &str = "star_kv";

/// The fields only STAR-KV takes.
const STAR_KV_FIELDS: [&str; 4] = ["checkpoint", "rank_profile", "factors", "cache"];

/// The keys of the composed form `{"star_kv":{...},"eviction":{...}}`.
const COMPOSED_FIELDS: [&str; 2] = ["star_kv", "eviction"];

fn invalid(field: &'static str, reason: impl Into<String>) -> EvictError {
    EvictError::InvalidField {
        field,
        reason: reason.into(),
    }
}

fn read_count(map: &Map<String, Value>, field: &'static str) -> Result<Option<u64>, EvictError> {
    match map.get(field) {
        None => Ok(None),
        Some(v) => v
            .as_u64()
            .map(Some)
            .ok_or_else(|| invalid(field, format!("expected a non-negative integer, got {v}"))),
    }
}

fn read_usize(map: &Map<String, Value>, field: &'static str) -> Result<Option<usize>, EvictError> {
    read_count(map, field)?
        .map(|n| usize::try_from(n).map_err(|_| invalid(field, format!("{n} is too large"))))
        .transpose()
}

/// Parses `--kv-compression` / request-field JSON text.
fn parse_json(text: &str) -> Result<Value, EvictError> {
    serde_json::from_str(text).map_err(|e| EvictError::Json(e.to_string()))
}

/// The configuration's JSON object (anything else is an error naming what came instead).
fn json_object(value: &Value) -> Result<&Map<String, Value>, EvictError> {
    value
        .as_object()
        .ok_or_else(|| EvictError::Json(format!("expected an object, got {value}")))
}

impl CompressionConfig {
    /// Parses and validates a JSON object such as `{"method":"keydiff","ratio":0.5}`; omitted
    /// fields take their defaults (`ratio` 0, `sink_tokens` 4, `window_tokens` 32,
    /// `every_n_tokens` 64, `seed` 0). Unknown fields are errors, so typos are not ignored.
    pub fn from_json(text: &str) -> Result<Self, EvictError> {
        Self::from_value(&parse_json(text)?)
    }

    /// As [`from_json`](Self::from_json), from an already parsed JSON value (a request body's
    /// field). This is the per-request parser: `star_kv` is refused (it changes the model, see
    /// [`KvCompression`]), as are its `checkpoint` and `rank_profile` fields.
    pub fn from_value(value: &Value) -> Result<Self, EvictError> {
        let map = json_object(value)?;
        if map.get("method").and_then(Value::as_str) == Some(STAR_KV_METHOD) {
            return Err(invalid(
                "method",
                "star_kv replaces the model's K/V projections, so it is chosen when the engine \
                 loads the model (--kv-compression), not per request",
            ));
        }
        if let Some(field) = STAR_KV_FIELDS.into_iter().find(|f| map.contains_key(*f)) {
            return Err(invalid(field, "only method star_kv takes it"));
        }
        if let Some(unknown) = map.keys().find(|k| !FIELDS.contains(&k.as_str())) {
            return Err(EvictError::Json(format!(
                "unknown field `{unknown}` (expected one of {FIELDS:?})"
            )));
        }
        let defaults = Self::default();
        let method = match map.get("method") {
            None => return Err(invalid("method", "missing")),
            Some(v) => {
                let name = v
                    .as_str()
                    .ok_or_else(|| invalid("method", format!("expected a string, got {v}")))?;
                CompressionMethod::from_name(name).ok_or_else(|| {
                    let names: Vec<&str> =
                        CompressionMethod::ALL.iter().map(|m| m.name()).collect();
                    invalid(
                        "method",
                        format!("unknown method `{name}` (expected one of {names:?})"),
                    )
                })?
            }
        };
        let ratio = match map.get("ratio") {
            None => defaults.ratio,
            Some(v) => v
                .as_f64()
                .ok_or_else(|| invalid("ratio", format!("expected a number, got {v}")))?,
        };
        let config = Self {
            method,
            ratio,
            sink_tokens: read_usize(map, "sink_tokens")?.unwrap_or(defaults.sink_tokens),
            window_tokens: read_usize(map, "window_tokens")?.unwrap_or(defaults.window_tokens),
            every_n_tokens: read_usize(map, "every_n_tokens")?.unwrap_or(defaults.every_n_tokens),
            seed: read_count(map, "seed")?.unwrap_or(defaults.seed),
            head_wise: match map.get("head_wise") {
                None => defaults.head_wise,
                Some(v) => v.as_bool().ok_or_else(|| {
                    invalid("head_wise", format!("expected true or false, got {v}"))
                })?,
            },
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks the ranges: `ratio` finite in `[0, 1)`, `every_n_tokens` at least 1.
    pub fn validate(&self) -> Result<(), EvictError> {
        if !(self.ratio.is_finite() && (0.0..1.0).contains(&self.ratio)) {
            return Err(invalid(
                "ratio",
                format!(
                    "{} is outside [0, 1) (the share of tokens evicted)",
                    self.ratio
                ),
            ));
        }
        if self.every_n_tokens == 0 {
            return Err(invalid("every_n_tokens", "must be at least 1"));
        }
        Ok(())
    }

    /// Whether any token is ever evicted (`none` or ratio 0 mean no).
    pub fn evicts(&self) -> bool {
        self.method != CompressionMethod::None && self.ratio > 0.0
    }

    /// Tokens a sequence of `n_tokens` physical tokens keeps after compression (all of them
    /// when [`evicts`](Self::evicts) is false).
    pub fn keep_tokens(&self, n_tokens: usize) -> usize {
        if !self.evicts() {
            return n_tokens;
        }
        keep_count(n_tokens, self.ratio, self.sink_tokens, self.window_tokens)
    }

    /// The configuration as a JSON object (every field, for metrics and result files).
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "method": self.method.name(),
            "ratio": self.ratio,
            "sink_tokens": self.sink_tokens,
            "window_tokens": self.window_tokens,
            "every_n_tokens": self.every_n_tokens,
            "seed": self.seed,
            "head_wise": self.head_wise,
        })
    }
}

/// A STAR-KV checkpoint to run the model with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StarKvSelection {
    /// The directory `starling calibrate --output` wrote (one sub-directory per profile), or a
    /// single profile's checkpoint directory.
    pub checkpoint: PathBuf,
    /// The rank profile's name (`aggressive`, `balanced`, `conservative`; checked against the
    /// checkpoint when it loads).
    pub rank_profile: String,
    /// Which of the checkpoint's factors to apply (`"factors"`, default both): keys or values
    /// alone are ablations that show which side of a profile costs the quality.
    pub factors: StarKvFactors,
    /// What the cache holds (`"cache"`, default `latent`).
    pub cache: StarKvCache,
}

/// How a STAR-KV checkpoint runs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StarKvCache {
    /// The cache stores the latents: the bytes the profile saves become blocks (the method).
    #[default]
    Latent,
    /// The reference path: K/V weights replaced by their low-rank reconstructions, full K/V
    /// cached. Same outputs (the oracle of the latent path), no memory saved.
    Reference,
}

impl StarKvCache {
    /// The name in `--kv-compression` JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Latent => "latent",
            Self::Reference => "reference",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Latent, Self::Reference]
            .into_iter()
            .find(|c| c.name() == name)
    }
}

/// The sides of a STAR-KV checkpoint a run applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum StarKvFactors {
    /// Keys and values low-rank (the method).
    #[default]
    Both,
    /// Only the keys low-rank; values whole.
    Keys,
    /// Only the values low-rank; keys whole.
    Values,
}

impl StarKvFactors {
    /// The name in `--kv-compression` JSON.
    pub fn name(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Keys => "keys",
            Self::Values => "values",
        }
    }

    fn from_name(name: &str) -> Option<Self> {
        [Self::Both, Self::Keys, Self::Values]
            .into_iter()
            .find(|f| f.name() == name)
    }
}

/// The engine-wide `--kv-compression` setting: STAR-KV (what the cache stores), token eviction
/// (which tokens it keeps), or both.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvCompression {
    /// A STAR-KV checkpoint the model runs with; `None` caches full K/V.
    pub star_kv: Option<StarKvSelection>,
    /// The eviction policy of requests that do not choose their own (default: none).
    pub eviction: CompressionConfig,
}

impl KvCompression {
    /// Parses `--kv-compression` JSON: `{"method":"star_kv","checkpoint":DIR,
    /// "rank_profile":NAME}` (both fields required; optional `factors` and `cache`, nothing
    /// else), any eviction config [`CompressionConfig::from_json`] accepts, or both as
    /// `{"star_kv":{"checkpoint":DIR,...},"eviction":{"method":...}}` (either key optional).
    pub fn from_json(text: &str) -> Result<Self, EvictError> {
        Self::from_value(&parse_json(text)?)
    }

    /// As [`from_json`](Self::from_json), from a parsed value.
    pub fn from_value(value: &Value) -> Result<Self, EvictError> {
        let map = json_object(value)?;
        if COMPOSED_FIELDS.iter().any(|k| map.contains_key(*k)) {
            if let Some(unknown) = map.keys().find(|k| !COMPOSED_FIELDS.contains(&k.as_str())) {
                return Err(EvictError::Json(format!(
                    "unknown field `{unknown}` beside star_kv/eviction (expected one of \
                     {COMPOSED_FIELDS:?})"
                )));
            }
            let star_kv = match map.get("star_kv") {
                None => None,
                Some(v) => Some(StarKvSelection::from_map(json_object(v)?)?),
            };
            let eviction = match map.get("eviction") {
                None => CompressionConfig::default(),
                Some(v) => CompressionConfig::from_value(v)?,
            };
            return Ok(Self { star_kv, eviction });
        }
        if map.get("method").and_then(Value::as_str) != Some(STAR_KV_METHOD) {
            return Ok(Self {
                star_kv: None,
                eviction: CompressionConfig::from_value(value)?,
            });
        }
        Ok(Self {
            star_kv: Some(StarKvSelection::from_map(map)?),
            eviction: CompressionConfig::default(),
        })
    }

    /// Whether this setting changes the model itself (STAR-KV), so that it can only be chosen
    /// when the model is loaded, never per request.
    pub fn requires_model_reload(&self) -> bool {
        self.star_kv.is_some()
    }

    /// The token-eviction policy the engine applies to requests that do not choose their own.
    pub fn eviction(&self) -> CompressionConfig {
        self.eviction.clone()
    }

    /// The STAR-KV selection, if any.
    pub fn star_kv(&self) -> Option<&StarKvSelection> {
        self.star_kv.as_ref()
    }

    /// The setting as a JSON object (what [`from_value`](Self::from_value) reads back): the
    /// flat form of whichever part is set, the composed form when both are.
    pub fn to_json(&self) -> Value {
        match (&self.star_kv, self.eviction.evicts()) {
            (None, _) => self.eviction.to_json(),
            (Some(s), false) if self.eviction == CompressionConfig::default() => s.to_json(),
            (Some(s), _) => {
                let mut star_kv = s.to_json();
                if let Some(map) = star_kv.as_object_mut() {
                    map.remove("method");
                }
                serde_json::json!({ "star_kv": star_kv, "eviction": self.eviction.to_json() })
            }
        }
    }
}

impl StarKvSelection {
    /// Reads a selection's fields (`method`, when present, must be `star_kv`).
    fn from_map(map: &Map<String, Value>) -> Result<Self, EvictError> {
        match map.get("method") {
            None => {}
            Some(Value::String(m)) if m == STAR_KV_METHOD => {}
            Some(v) => return Err(invalid("method", format!("expected \"star_kv\", got {v}"))),
        }
        if let Some(unknown) = map
            .keys()
            .find(|k| k.as_str() != "method" && !STAR_KV_FIELDS.contains(&k.as_str()))
        {
            return Err(EvictError::Json(format!(
                "unknown field `{unknown}` for star_kv (expected method, checkpoint, \
                 rank_profile, factors, cache)"
            )));
        }
        let text_field = |field: &'static str| -> Result<String, EvictError> {
            match map.get(field) {
                None => Err(invalid(field, "star_kv needs it")),
                Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
                Some(v) => Err(invalid(
                    field,
                    format!("expected a non-empty string, got {v}"),
                )),
            }
        };
        let factors = match map.get("factors") {
            None => StarKvFactors::Both,
            Some(Value::String(name)) => StarKvFactors::from_name(name)
                .ok_or_else(|| invalid("factors", "expected \"both\", \"keys\" or \"values\""))?,
            Some(v) => return Err(invalid("factors", format!("expected a string, got {v}"))),
        };
        let cache = match map.get("cache") {
            None => StarKvCache::Latent,
            Some(Value::String(name)) => StarKvCache::from_name(name)
                .ok_or_else(|| invalid("cache", "expected \"latent\" or \"reference\""))?,
            Some(v) => return Err(invalid("cache", format!("expected a string, got {v}"))),
        };
        Ok(Self {
            checkpoint: PathBuf::from(text_field("checkpoint")?),
            rank_profile: text_field("rank_profile")?,
            factors,
            cache,
        })
    }

    /// The selection in the flat `--kv-compression` form.
    pub fn to_json(&self) -> Value {
        serde_json::json!({
            "method": STAR_KV_METHOD,
            "checkpoint": self.checkpoint.to_string_lossy(),
            "rank_profile": self.rank_profile,
            "factors": self.factors.name(),
            "cache": self.cache.name(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field_of(text: &str) -> Option<&'static str> {
        match CompressionConfig::from_json(text) {
            Err(EvictError::InvalidField { field, .. }) => Some(field),
            _ => None,
        }
    }

    #[test]
    fn parses_with_defaults() {
        let c = CompressionConfig::from_json(r#"{"method":"keydiff","ratio":0.5}"#).unwrap();
        assert_eq!(c.method, CompressionMethod::KeyDiff);
        assert_eq!(c.ratio, 0.5);
        assert_eq!(
            (c.sink_tokens, c.window_tokens, c.every_n_tokens, c.seed),
            (4, 32, 64, 0)
        );
        assert!(c.evicts());
    }

    #[test]
    fn parses_every_field_and_round_trips() {
        let text = r#"{"method":"random","ratio":0.75,"sink_tokens":0,"window_tokens":8,
                       "every_n_tokens":16,"seed":7}"#;
        let c = CompressionConfig::from_json(text).unwrap();
        assert_eq!(c.method, CompressionMethod::Random);
        assert_eq!(
            (c.sink_tokens, c.window_tokens, c.every_n_tokens, c.seed),
            (0, 8, 16, 7)
        );
        assert_eq!(CompressionConfig::from_value(&c.to_json()).unwrap(), c);
    }

    #[test]
    fn every_method_name_parses() {
        for m in CompressionMethod::ALL {
            let c = CompressionConfig::from_json(&format!(r#"{{"method":"{m}"}}"#)).unwrap();
            assert_eq!(c.method, m);
        }
    }

    #[test]
    fn none_or_ratio_zero_does_not_evict() {
        let none = CompressionConfig::from_json(r#"{"method":"none","ratio":0.5}"#).unwrap();
        let zero = CompressionConfig::from_json(r#"{"method":"keydiff","ratio":0}"#).unwrap();
        for c in [none, zero] {
            assert!(!c.evicts());
            assert_eq!(c.keep_tokens(1000), 1000);
        }
    }

    #[test]
    fn errors_name_the_field() {
        assert_eq!(field_of(r#"{"ratio":0.5}"#), Some("method"));
        assert_eq!(field_of(r#"{"method":"h2o"}"#), Some("method"));
        assert_eq!(field_of(r#"{"method":3}"#), Some("method"));
        assert_eq!(
            field_of(r#"{"method":"keydiff","ratio":1.0}"#),
            Some("ratio")
        );
        assert_eq!(
            field_of(r#"{"method":"keydiff","ratio":-0.1}"#),
            Some("ratio")
        );
        assert_eq!(
            field_of(r#"{"method":"keydiff","ratio":"0.5"}"#),
            Some("ratio")
        );
        assert_eq!(
            field_of(r#"{"method":"knorm","sink_tokens":-1}"#),
            Some("sink_tokens")
        );
        assert_eq!(
            field_of(r#"{"method":"knorm","window_tokens":1.5}"#),
            Some("window_tokens")
        );
        assert_eq!(
            field_of(r#"{"method":"knorm","every_n_tokens":0}"#),
            Some("every_n_tokens")
        );
        assert_eq!(field_of(r#"{"method":"random","seed":"x"}"#), Some("seed"));
    }

    #[test]
    fn malformed_json_and_unknown_fields_are_errors() {
        for text in [
            "",
            "[1]",
            "{\"method\":",
            r#"{"method":"keydiff","ratoi":0.5}"#,
        ] {
            assert!(matches!(
                CompressionConfig::from_json(text),
                Err(EvictError::Json(_))
            ));
        }
    }

    #[test]
    fn star_kv_parses_at_startup_and_is_refused_per_request() {
        let text = r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":"balanced"}"#;
        let setting = KvCompression::from_json(text).unwrap();
        assert!(setting.requires_model_reload());
        assert!(!setting.eviction().evicts());
        assert_eq!(setting.eviction(), CompressionConfig::default());
        let selection = setting.star_kv().unwrap();
        assert_eq!(selection.checkpoint, PathBuf::from("/ck"));
        assert_eq!(selection.rank_profile, "balanced");
        assert_eq!(
            KvCompression::from_value(&setting.to_json()).unwrap(),
            setting
        );

        match CompressionConfig::from_json(text) {
            Err(EvictError::InvalidField { field, reason }) => {
                assert_eq!(field, "method");
                assert!(reason.contains("not per request"), "{reason}");
            }
            other => panic!("per-request star_kv accepted: {other:?}"),
        }
    }

    #[test]
    fn star_kv_factors_default_to_both_and_round_trip() {
        let base = r#""method":"star_kv","checkpoint":"/ck","rank_profile":"balanced""#;
        let factors = |text: &str| {
            KvCompression::from_json(text)
                .map(|s| s.star_kv().map(|sel| sel.factors))
                .map_err(|e| e.to_string())
        };
        assert_eq!(
            factors(&format!("{{{base}}}")),
            Ok(Some(StarKvFactors::Both))
        );
        for f in [
            StarKvFactors::Both,
            StarKvFactors::Keys,
            StarKvFactors::Values,
        ] {
            let text = format!(r#"{{{base},"factors":"{}"}}"#, f.name());
            let setting = KvCompression::from_json(&text).unwrap();
            assert_eq!(setting.star_kv().map(|s| s.factors), Some(f));
            assert_eq!(
                KvCompression::from_value(&setting.to_json()).unwrap(),
                setting
            );
        }
        for bad in [r#""factors":"k""#, r#""factors":1"#] {
            let err = factors(&format!("{{{base},{bad}}}")).unwrap_err();
            assert!(err.contains("factors"), "{err}");
        }
        // Eviction methods refuse it, as the other star_kv fields.
        assert!(KvCompression::from_json(r#"{"method":"keydiff","factors":"keys"}"#).is_err());
    }

    #[test]
    fn star_kv_needs_both_fields_and_other_methods_refuse_them() {
        let field = |text: &str| match KvCompression::from_json(text) {
            Err(EvictError::InvalidField { field, .. }) => Some(field),
            _ => None,
        };
        assert_eq!(
            field(r#"{"method":"star_kv","rank_profile":"balanced"}"#),
            Some("checkpoint")
        );
        assert_eq!(
            field(r#"{"method":"star_kv","checkpoint":"/ck"}"#),
            Some("rank_profile")
        );
        assert_eq!(
            field(r#"{"method":"star_kv","checkpoint":"","rank_profile":"balanced"}"#),
            Some("checkpoint")
        );
        assert_eq!(
            field(r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":7}"#),
            Some("rank_profile")
        );
        assert_eq!(
            field(r#"{"method":"keydiff","ratio":0.5,"checkpoint":"/ck"}"#),
            Some("checkpoint")
        );
        assert_eq!(
            field(r#"{"method":"none","rank_profile":"balanced"}"#),
            Some("rank_profile")
        );
        assert!(matches!(
            KvCompression::from_json(
                r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":"b","ratio":0.5}"#
            ),
            Err(EvictError::Json(_))
        ));
    }

    #[test]
    fn star_kv_and_eviction_compose() {
        let text = r#"{"star_kv":{"checkpoint":"/ck","rank_profile":"balanced"},
                       "eviction":{"method":"keydiff","ratio":0.5}}"#;
        let setting = KvCompression::from_json(text).unwrap();
        assert!(setting.requires_model_reload());
        assert_eq!(setting.eviction().method, CompressionMethod::KeyDiff);
        let selection = setting.star_kv().unwrap();
        assert_eq!(selection.cache, StarKvCache::Latent);
        assert_eq!(
            KvCompression::from_value(&setting.to_json()).unwrap(),
            setting
        );
        let reference = KvCompression::from_json(
            r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":"balanced","cache":"reference"}"#,
        )
        .unwrap();
        assert_eq!(reference.star_kv().unwrap().cache, StarKvCache::Reference);
        assert_eq!(
            KvCompression::from_value(&reference.to_json()).unwrap(),
            reference
        );
        // Either half alone, and the errors name what is wrong.
        let only_eviction =
            KvCompression::from_json(r#"{"eviction":{"method":"knorm","ratio":0.25}}"#).unwrap();
        assert!(only_eviction.star_kv().is_none());
        for bad in [
            r#"{"star_kv":{"checkpoint":"/ck","rank_profile":"b"},"ratio":0.5}"#,
            r#"{"star_kv":{"method":"keydiff","checkpoint":"/ck","rank_profile":"b"}}"#,
            r#"{"star_kv":{"checkpoint":"/ck","rank_profile":"b","cache":"dense"}}"#,
            r#"{"eviction":{"method":"star_kv","checkpoint":"/ck","rank_profile":"b"}}"#,
            r#"{"star_kv":7}"#,
        ] {
            assert!(KvCompression::from_json(bad).is_err(), "{bad}");
        }
        // A request cannot pick the cache path either.
        assert!(CompressionConfig::from_json(r#"{"method":"none","cache":"latent"}"#).is_err());
    }

    #[test]
    fn eviction_settings_parse_as_before() {
        let text = r#"{"method":"keydiff","ratio":0.5}"#;
        let setting = KvCompression::from_json(text).unwrap();
        assert!(!setting.requires_model_reload());
        assert!(setting.star_kv().is_none());
        assert_eq!(
            setting.eviction(),
            CompressionConfig::from_json(text).unwrap()
        );
        assert_eq!(
            KvCompression::default().eviction(),
            CompressionConfig::default()
        );
    }
}
