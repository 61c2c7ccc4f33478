//! The JSON forms of the compression config: what parses, to what, and what each error names.

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

#[test]
fn every_method_round_trips() {
    // Exhaustive, so a new method does not compile until it has a place here; the loop then
    // fails until `ALL` lists it at that place. Parsing itself goes through the derive.
    fn position(m: CompressionMethod) -> usize {
        match m {
            CompressionMethod::None => 0,
            CompressionMethod::KeyDiff => 1,
            CompressionMethod::KNorm => 2,
            CompressionMethod::StreamingLlm => 3,
            CompressionMethod::Random => 4,
            CompressionMethod::SnapKv => 5,
            CompressionMethod::Tova => 6,
        }
    }
    for (i, m) in CompressionMethod::ALL.into_iter().enumerate() {
        assert_eq!(position(m), i, "{m} out of place in ALL");
        assert_eq!(CompressionMethod::from_name(m.name()), Some(m));
        assert_eq!(serde_json::to_value(m).unwrap(), Value::from(m.name()));
        let config = CompressionConfig {
            method: m,
            ratio: 0.25,
            ..CompressionConfig::default()
        };
        assert_eq!(
            CompressionConfig::from_value(&config.to_json()).unwrap(),
            config
        );
        let setting = KvCompression {
            eviction: config,
            ..KvCompression::default()
        };
        assert_eq!(
            KvCompression::from_value(&setting.to_json()).unwrap(),
            setting
        );
    }
    assert_eq!(CompressionMethod::from_name("h2o"), None);
}

#[test]
fn unknown_methods_and_fields_name_the_valid_ones() {
    let error = |text: &str| KvCompression::from_json(text).unwrap_err().to_string();
    let names = |msg: &str, valid: &[&str]| {
        for v in valid {
            assert!(msg.contains(&format!("`{v}`")), "{v} not in: {msg}");
        }
    };
    let msg = error(r#"{"method":"h2o"}"#);
    assert!(
        msg.contains("`h2o`") && msg.contains("unknown method"),
        "{msg}"
    );
    names(&msg, &CompressionMethod::ALL.map(CompressionMethod::name));
    let msg = error(r#"{"method":"keydiff","ratoi":0.5}"#);
    assert!(msg.contains("`ratoi`"), "{msg}");
    names(
        &msg,
        &[
            "method",
            "ratio",
            "sink_tokens",
            "window_tokens",
            "every_n_tokens",
            "seed",
            "head_wise",
        ],
    );
    let msg = error(r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":"b","ratio":0.5}"#);
    names(
        &msg,
        &["method", "checkpoint", "rank_profile", "factors", "cache"],
    );
    let msg = error(r#"{"star_kv":{"checkpoint":"/ck","rank_profile":"b"},"ratio":0.5}"#);
    names(&msg, &["star_kv", "eviction"]);
    let msg = error(r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":"b","cache":"x"}"#);
    names(&msg, &["latent", "reference"]);
    let msg = error(r#"{"method":"star_kv","checkpoint":"/ck","rank_profile":"b","factors":"x"}"#);
    names(&msg, &["both", "keys", "values"]);
}

#[test]
fn null_is_not_an_omitted_field() {
    for (text, want) in [
        (r#"{"method":"keydiff","ratio":null}"#, "ratio"),
        (r#"{"method":null}"#, "method"),
        (r#"{"method":"knorm","head_wise":null}"#, "head_wise"),
    ] {
        assert_eq!(field_of(text), Some(want), "{text}");
    }
    for text in [
        r#"{"method":"star_kv","checkpoint":null,"rank_profile":"b"}"#,
        r#"{"star_kv":null}"#,
        r#"{"eviction":null}"#,
    ] {
        assert!(KvCompression::from_json(text).is_err(), "{text}");
    }
}

#[test]
fn kv_dtype_is_auto_unless_named_and_an_unknown_dtype_names_the_valid_one() {
    let flat = KvCompression::from_json(r#"{"method":"keydiff","ratio":0.5}"#).unwrap();
    assert_eq!(flat.kv_dtype, KvCacheDtype::Auto);
    let composed = KvCompression::from_json(
        r#"{"eviction":{"method":"knorm","ratio":0.25},"kv_dtype":"auto"}"#,
    )
    .unwrap();
    assert_eq!(composed.kv_dtype, KvCacheDtype::Auto);
    assert_eq!(composed.eviction().method, CompressionMethod::KNorm);
    assert_eq!(
        KvCompression::from_value(&composed.to_json()).unwrap(),
        composed
    );
    for bad in ["int2", "bf16", "fp8_e5m2"] {
        let text = format!(r#"{{"kv_dtype":"{bad}"}}"#);
        let err = KvCompression::from_json(&text).unwrap_err().to_string();
        assert!(
            err.contains(bad) && err.contains("auto") && err.contains("fp8"),
            "{err}"
        );
    }
    // fp8 (vLLM's name, and its alias fp8_e4m3) composes with eviction and round-trips.
    for name in ["fp8", "fp8_e4m3"] {
        let text =
            format!(r#"{{"eviction":{{"method":"keydiff","ratio":0.5}},"kv_dtype":"{name}"}}"#);
        let fp8 = KvCompression::from_json(&text).unwrap();
        assert_eq!(fp8.kv_dtype, KvCacheDtype::Fp8, "{name}");
        assert_eq!(KvCompression::from_value(&fp8.to_json()).unwrap(), fp8);
    }
    assert_eq!(KvCacheDtype::Fp8.name(), "fp8");
    // int8 (a scale per vector) likewise, alone and with latents.
    for text in [
        r#"{"eviction":{"method":"keydiff","ratio":0.5},"kv_dtype":"int8"}"#,
        r#"{"star_kv":{"checkpoint":"ck","rank_profile":"removed-50pct"},"kv_dtype":"int8"}"#,
    ] {
        let int8 = KvCompression::from_json(text).unwrap();
        assert_eq!(int8.kv_dtype, KvCacheDtype::Int8, "{text}");
        assert_eq!(KvCompression::from_value(&int8.to_json()).unwrap(), int8);
    }
    assert_eq!(KvCacheDtype::Int8.name(), "int8");
    let int4 = KvCompression::from_json(
        r#"{"star_kv":{"checkpoint":"ck","rank_profile":"removed-50pct"},"kv_dtype":"int4"}"#,
    )
    .unwrap();
    assert_eq!(int4.kv_dtype, KvCacheDtype::Int4);
    assert_eq!(KvCompression::from_value(&int4.to_json()).unwrap(), int4);
    assert_eq!(KvCacheDtype::Int4.name(), "int4");
    // ... and with STAR-KV latents (fp8 latents; which backend stores them is the backend's
    // check at allocation).
    let latents = KvCompression::from_json(
        r#"{"star_kv":{"checkpoint":"ck","rank_profile":"balanced"},"kv_dtype":"fp8"}"#,
    )
    .unwrap();
    assert_eq!(latents.kv_dtype, KvCacheDtype::Fp8);
    assert_eq!(
        KvCompression::from_value(&latents.to_json()).unwrap(),
        latents
    );
    // The flat eviction form is also the per-request one, where a dtype makes no sense.
    assert!(KvCompression::from_json(r#"{"method":"keydiff","kv_dtype":"auto"}"#).is_err());
}

#[test]
fn validate_holds_a_setting_built_in_code_to_what_the_parser_enforces() {
    let mut setting = KvCompression::default();
    assert!(setting.validate().is_ok());
    setting.eviction.ratio = 1.5;
    assert!(matches!(
        setting.validate(),
        Err(EvictError::InvalidField { field: "ratio", .. })
    ));
    setting.eviction = CompressionConfig::default();
    setting.star_kv = Some(StarKvSelection {
        checkpoint: PathBuf::new(),
        rank_profile: "balanced".into(),
        factors: StarKvFactors::Both,
        cache: StarKvCache::Latent,
    });
    assert!(matches!(
        setting.validate(),
        Err(EvictError::InvalidField {
            field: "checkpoint",
            ..
        })
    ));
}
