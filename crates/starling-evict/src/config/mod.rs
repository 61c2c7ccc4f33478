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
//!
//! Every JSON form is a serde-derived struct with unknown fields denied, read through [`decode`]:
//! the names of methods, fields and enum values come from the derives, so an error names the
//! valid ones and a new method or field cannot be left out of the parser.

use std::fmt;
use std::path::PathBuf;

use serde::de::{DeserializeOwned, Deserializer};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::fields::struct_fields;
use crate::EvictError;
use starling_backend::keep::keep_count;

/// Which scorer ranks tokens for eviction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum CompressionMethod {
    /// No eviction.
    #[serde(rename = "none")]
    None,
    /// KeyDiff: evict keys most similar to the mean key direction.
    #[serde(rename = "keydiff")]
    KeyDiff,
    /// KNorm: evict the keys of largest L2 norm.
    #[serde(rename = "knorm")]
    KNorm,
    /// StreamingLLM: keep attention sinks and the most recent tokens.
    #[serde(rename = "streaming_llm")]
    StreamingLlm,
    /// Seeded uniform scores (a control).
    #[serde(rename = "random")]
    Random,
    /// SnapKV: attention of the last prompt queries, max-pooled.
    #[serde(rename = "snapkv")]
    SnapKv,
    /// TOVA: attention of the newest query, averaged over every head of the layer (all heads
    /// keep the same tokens).
    #[serde(rename = "tova")]
    Tova,
}

impl CompressionMethod {
    /// Every method, in the order their names are listed in errors (the parser does not use
    /// it: `every_method_round_trips` checks it against the enum).
    pub const ALL: [CompressionMethod; 7] = [
        Self::None,
        Self::KeyDiff,
        Self::KNorm,
        Self::StreamingLlm,
        Self::Random,
        Self::SnapKv,
        Self::Tova,
    ];

    /// The JSON / CLI name (the serde name).
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
        Self::deserialize(serde::de::value::StrDeserializer::<serde::de::value::Error>::new(name))
            .ok()
    }
}

impl fmt::Display for CompressionMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How (and whether) a sequence's KV cache is compressed by token eviction.
///
/// Its JSON form is the struct itself: omitted fields take [`Default`]'s values, except
/// `method`, which [`CompressionConfig::from_value`] requires.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
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

/// The `method` name of STAR-KV in `--kv-compression` JSON.
pub const STAR_KV_METHOD: &str = "star_kv";

fn invalid(field: &'static str, reason: impl Into<String>) -> EvictError {
    EvictError::InvalidField {
        field,
        reason: reason.into(),
    }
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

/// Reads `value` as the JSON form `T`, the one place every form is checked: an error inside one
/// of `T`'s fields (a wrong type, an unknown method) is [`EvictError::InvalidField`] naming that
/// field; an unknown field, which serde reports with the valid ones, is [`EvictError::Json`].
fn decode<T: DeserializeOwned>(value: &Value) -> Result<T, EvictError> {
    serde_path_to_error::deserialize::<_, T>(value).map_err(|e| {
        let path = e.path().to_string();
        let first = path.split(['.', '[']).next().unwrap_or_default();
        let error = e.into_inner().to_string();
        match struct_fields::<T>().iter().find(|f| **f == first) {
            // serde says "unknown variant `h2o`, expected one of …"; a user typed a method.
            Some(field) if *field == "method" => invalid(
                field,
                error.replacen("unknown variant", "unknown method", 1),
            ),
            Some(field) => invalid(field, error),
            None => EvictError::Json(error),
        }
    })
}

/// A field that, when present, must hold a value: `null` is an error, not "absent".
fn present<'de, D: Deserializer<'de>, T: Deserialize<'de>>(d: D) -> Result<Option<T>, D::Error> {
    T::deserialize(d).map(Some)
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
        // A STAR-KV field here is a misplaced setting, not a typo: say so by name.
        let eviction_fields = struct_fields::<Self>();
        if let Some(field) = struct_fields::<StarKvJson>()
            .iter()
            .find(|f| !eviction_fields.contains(f) && map.contains_key(**f))
        {
            return Err(invalid(field, "only method star_kv takes it"));
        }
        let config: Self = decode(value)?;
        if !map.contains_key("method") {
            return Err(invalid("method", "missing"));
        }
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
        // Plain fields only (numbers, a bool, a unit enum): serializing cannot fail.
        serde_json::to_value(self).unwrap_or(Value::Null)
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
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum StarKvCache {
    /// The cache stores the latents: the bytes the profile saves become blocks (the method).
    #[default]
    Latent,
    /// The reference path: K/V weights replaced by their low-rank reconstructions, full K/V
    /// cached. Same outputs (the oracle of the latent path), no memory saved.
    Reference,
}

impl StarKvCache {
    /// The name in `--kv-compression` JSON (the serde name).
    pub fn name(self) -> &'static str {
        match self {
            Self::Latent => "latent",
            Self::Reference => "reference",
        }
    }
}

/// The sides of a STAR-KV checkpoint a run applies.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
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
    /// The name in `--kv-compression` JSON (the serde name).
    pub fn name(self) -> &'static str {
        match self {
            Self::Both => "both",
            Self::Keys => "keys",
            Self::Values => "values",
        }
    }
}

/// The one value `method` takes in a STAR-KV selection.
#[derive(Deserialize)]
enum StarKvMethod {
    #[serde(rename = "star_kv")]
    StarKv,
}

/// The JSON form of a [`StarKvSelection`] (`method`, when present, must be `star_kv`).
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct StarKvJson {
    #[serde(default, rename = "method")]
    _method: Option<StarKvMethod>,
    #[serde(default, deserialize_with = "present")]
    checkpoint: Option<String>,
    #[serde(default, deserialize_with = "present")]
    rank_profile: Option<String>,
    #[serde(default)]
    factors: StarKvFactors,
    #[serde(default)]
    cache: StarKvCache,
}

/// The composed form `{"star_kv":{...},"eviction":{...},"kv_dtype":"auto"}`, every key
/// optional.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ComposedJson {
    #[serde(default, deserialize_with = "present")]
    star_kv: Option<Value>,
    #[serde(default, deserialize_with = "present")]
    eviction: Option<Value>,
    #[serde(default)]
    kv_dtype: KvCacheDtype,
}

/// The element type the KV cache stores (vLLM's `--kv-cache-dtype`).
///
/// `auto` holds the model's activation dtype (bf16 on CUDA, f32 on the CPU reference), dense K/V
/// and STAR-KV latents alike. `fp8` stores full K/V as 8-bit floats (e4m3: 4 exponent bits, 3
/// mantissa bits, largest finite 448; vLLM's `fp8` / `fp8_e4m3`, with its default scale of 1),
/// half the bytes of bf16: values are rounded to nearest-even when written, larger magnitudes
/// saturate to ±448, and the attention kernels read them back exactly; with a STAR-KV
/// checkpoint the latents are stored so too (both backends; CUDA needs sm_89+). `int8` stores
/// symmetric 8-bit integers with one half-precision scale per vector and token (each KV head's
/// key and value row; each key latent and the value latent), so large offsets such as Qwen2's
/// key biases cost no precision. `int4` stores symmetric 4-bit integers (−7..=7, two per byte)
/// with a half-precision scale per group of 32 elements of each such vector. Both are CPU
/// reference only so far.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KvCacheDtype {
    /// The backend's native activation dtype.
    #[default]
    Auto,
    /// 8-bit float e4m3 (one byte per element), scale 1.
    #[serde(alias = "fp8_e4m3")]
    Fp8,
    /// Symmetric int8 with a half-precision scale per vector and token.
    Int8,
    /// Symmetric int4 with a half-precision scale per group of 32 elements of a vector.
    Int4,
}

impl KvCacheDtype {
    /// The name in JSON and on the command line (the serde name).
    pub fn name(self) -> &'static str {
        match self {
            Self::Auto => "auto",
            Self::Fp8 => "fp8",
            Self::Int8 => "int8",
            Self::Int4 => "int4",
        }
    }
}

/// The engine-wide KV-cache compression, the one value `Engine::new` consumes: what the cache
/// stores per token (the layout: full K/V, or a STAR-KV checkpoint's latents), which tokens it
/// keeps (token eviction, the default of requests that do not choose their own), and the
/// element type it stores them in. Parsed from `--kv-compression` JSON
/// ([`from_json`](Self::from_json)) and checked by [`validate`](Self::validate), the one place
/// its ranges are checked.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct KvCompression {
    /// The layout: a STAR-KV checkpoint the model runs with; `None` caches full K/V.
    pub star_kv: Option<StarKvSelection>,
    /// The eviction policy of requests that do not choose their own (default: none).
    pub eviction: CompressionConfig,
    /// The cache's element type.
    pub kv_dtype: KvCacheDtype,
}

impl KvCompression {
    /// Parses `--kv-compression` JSON: `{"method":"star_kv","checkpoint":DIR,
    /// "rank_profile":NAME}` (both fields required; optional `factors` and `cache`, nothing
    /// else), any eviction config [`CompressionConfig::from_json`] accepts, or the composed
    /// form `{"star_kv":{"checkpoint":DIR,...},"eviction":{"method":...},"kv_dtype":"auto"}`
    /// (every key optional). The result is [validated](Self::validate).
    pub fn from_json(text: &str) -> Result<Self, EvictError> {
        Self::from_value(&parse_json(text)?)
    }

    /// As [`from_json`](Self::from_json), from a parsed value.
    pub fn from_value(value: &Value) -> Result<Self, EvictError> {
        let map = json_object(value)?;
        if struct_fields::<ComposedJson>()
            .iter()
            .any(|k| map.contains_key(*k))
        {
            let composed: ComposedJson = decode(value)?;
            let star_kv = composed
                .star_kv
                .as_ref()
                .map(StarKvSelection::from_value)
                .transpose()?;
            let eviction = composed
                .eviction
                .as_ref()
                .map(CompressionConfig::from_value)
                .transpose()?
                .unwrap_or_default();
            let setting = Self {
                star_kv,
                eviction,
                kv_dtype: composed.kv_dtype,
            };
            setting.validate()?;
            return Ok(setting);
        }
        let setting = if map.get("method").and_then(Value::as_str) != Some(STAR_KV_METHOD) {
            Self {
                eviction: CompressionConfig::from_value(value)?,
                ..Self::default()
            }
        } else {
            Self {
                star_kv: Some(StarKvSelection::from_value(value)?),
                ..Self::default()
            }
        };
        setting.validate()?;
        Ok(setting)
    }

    /// Checks every part: the eviction policy's ranges ([`CompressionConfig::validate`]) and a
    /// STAR-KV selection's non-empty checkpoint and profile. `Engine::new` calls it on what it
    /// is given, so a setting built in code is held to what the parser enforces.
    pub fn validate(&self) -> Result<(), EvictError> {
        self.eviction.validate()?;
        if let Some(selection) = &self.star_kv {
            if selection.checkpoint.as_os_str().is_empty() {
                return Err(invalid("checkpoint", "expected a non-empty path"));
            }
            if selection.rank_profile.is_empty() {
                return Err(invalid("rank_profile", "expected a non-empty string"));
            }
        }
        Ok(())
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
    /// flat form of whichever part is set, the composed form (with its `kv_dtype`) when both
    /// are.
    pub fn to_json(&self) -> Value {
        let composed = |star_kv: Option<Value>| {
            let mut map = Map::new();
            if let Some(mut star_kv) = star_kv {
                if let Some(fields) = star_kv.as_object_mut() {
                    fields.remove("method");
                }
                map.insert("star_kv".into(), star_kv);
            }
            map.insert("eviction".into(), self.eviction.to_json());
            map.insert("kv_dtype".into(), Value::from(self.kv_dtype.name()));
            Value::Object(map)
        };
        // `auto` is the flat forms' default: a quantised dtype takes the composed form.
        match &self.star_kv {
            _ if self.kv_dtype != KvCacheDtype::Auto => {
                composed(self.star_kv.as_ref().map(StarKvSelection::to_json))
            }
            None => self.eviction.to_json(),
            Some(s) if self.eviction == CompressionConfig::default() => s.to_json(),
            Some(s) => composed(Some(s.to_json())),
        }
    }
}

impl StarKvSelection {
    /// Reads a selection from its JSON form (`StarKvJson`): `checkpoint` and `rank_profile`
    /// required and non-empty.
    fn from_value(value: &Value) -> Result<Self, EvictError> {
        json_object(value)?;
        let json: StarKvJson = decode(value)?;
        let text = |field: &'static str, v: Option<String>| match v {
            None => Err(invalid(field, "star_kv needs it")),
            Some(s) if s.is_empty() => Err(invalid(field, "expected a non-empty string")),
            Some(s) => Ok(s),
        };
        Ok(Self {
            checkpoint: PathBuf::from(text("checkpoint", json.checkpoint)?),
            rank_profile: text("rank_profile", json.rank_profile)?,
            factors: json.factors,
            cache: json.cache,
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
mod tests;
