//! Tokenizer behaviour on a small synthetic byte-level vocabulary (no model file needed).

use std::collections::HashMap;

use candle_core::quantized::gguf_file::Value;

use super::*;

/// GPT-2's byte-to-unicode alphabet: printable Latin-1 bytes stand for themselves, the rest
/// are shifted to U+0100 onwards (so a space is `Ġ`, a newline `Ċ`).
fn byte_to_char(byte: u8) -> char {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    if printable(byte) {
        return char::from(byte);
    }
    let shifted = (0..byte).filter(|b| !printable(*b)).count() as u32;
    char::from_u32(256 + shifted).unwrap()
}

fn strings(items: &[String]) -> Value {
    Value::Array(items.iter().map(|s| Value::String(s.clone())).collect())
}

/// 256 byte tokens, then merged tokens, then control and user-defined tokens:
/// ids 256 "Ġh", 257 "Ġhi", 258 "<|im_start|>", 259 "<|im_end|>", 260 "<|endoftext|>",
/// 261 "<tool>".
fn metadata() -> HashMap<String, Value> {
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let mut types: Vec<Value> = vec![Value::I32(1); 256];
    for (text, kind) in [
        ("Ġh", 1),
        ("Ġhi", 1),
        ("<|im_start|>", 3),
        ("<|im_end|>", 3),
        ("<|endoftext|>", 3),
        ("<tool>", 4),
    ] {
        tokens.push(text.to_owned());
        types.push(Value::I32(kind));
    }
    HashMap::from([
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("gpt2".to_owned()),
        ),
        (
            "tokenizer.ggml.pre".to_owned(),
            Value::String("qwen2".to_owned()),
        ),
        ("tokenizer.ggml.tokens".to_owned(), strings(&tokens)),
        ("tokenizer.ggml.token_type".to_owned(), Value::Array(types)),
        (
            "tokenizer.ggml.merges".to_owned(),
            strings(&["Ġ h".to_owned(), "Ġh i".to_owned()]),
        ),
        ("tokenizer.ggml.bos_token_id".to_owned(), Value::U32(258)),
        ("tokenizer.ggml.eos_token_id".to_owned(), Value::U32(259)),
        (
            "tokenizer.ggml.padding_token_id".to_owned(),
            Value::U32(260),
        ),
        (
            "tokenizer.ggml.add_bos_token".to_owned(),
            Value::Bool(false),
        ),
        (
            "tokenizer.chat_template".to_owned(),
            Value::String("{{ messages[0]['content'] }}".to_owned()),
        ),
    ])
}

fn byte_id(byte: u8) -> u32 {
    u32::from(byte)
}

#[test]
fn encodes_merges_bytes_and_whole_special_tokens() {
    let tok = Tokenizer::from_gguf_metadata(&metadata()).unwrap();
    assert_eq!(tok.vocab_size(), 262);
    let ids = tok.encode("a hi<|im_end|><tool>", true).unwrap();
    assert_eq!(ids, [byte_id(b'a'), 257, 259, 261]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "a hi<|im_end|><tool>");
    // Control tokens are special and get skipped; user-defined ones are ordinary text.
    assert_eq!(tok.decode(&ids, true).unwrap(), "a hi<tool>");
    assert_eq!(tok.token_to_id("<|im_start|>"), Some(258));
    assert_eq!(tok.id_to_token(256).as_deref(), Some("Ġh"));
}

#[test]
fn special_tokens_and_template_come_from_metadata() {
    let tok = Tokenizer::from_gguf_metadata(&metadata()).unwrap();
    assert_eq!(tok.bos_token_id(), Some(258));
    assert_eq!(tok.bos_token(), Some("<|im_start|>"));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_ids(), [259, 260]);
    assert!(tok.is_end_of_generation(260));
    assert!(!tok.is_end_of_generation(258));
    assert_eq!(tok.pad_token_id(), Some(260));
    assert_eq!(tok.chat_template(), Some("{{ messages[0]['content'] }}"));
}

#[test]
fn add_bos_token_prepends_bos_only_with_special_tokens() {
    let mut md = metadata();
    md.insert("tokenizer.ggml.add_bos_token".to_owned(), Value::Bool(true));
    let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
    assert!(tok.prepends_bos());
    assert_eq!(tok.encode("a", true).unwrap(), [258, byte_id(b'a')]);
    assert_eq!(tok.encode("a", false).unwrap(), [byte_id(b'a')]);
}

#[test]
fn unknown_models_pre_tokenizers_and_scoreless_sentencepiece_are_refused_clearly() {
    let mut md = metadata();
    md.insert(
        "tokenizer.ggml.model".to_owned(),
        Value::String("rwkv".to_owned()),
    );
    let err = Tokenizer::from_gguf_metadata(&md).unwrap_err();
    assert!(matches!(err, TokenizerError::Unsupported { .. }), "{err}");
    assert!(err.to_string().contains("`rwkv`"), "{err}");

    // A SentencePiece vocabulary needs its scores (they are its merge order).
    let mut md = metadata();
    md.insert(
        "tokenizer.ggml.model".to_owned(),
        Value::String("llama".to_owned()),
    );
    let err = Tokenizer::from_gguf_metadata(&md).unwrap_err();
    assert!(err.to_string().contains("tokenizer.ggml.scores"), "{err}");

    let mut md = metadata();
    md.insert(
        "tokenizer.ggml.pre".to_owned(),
        Value::String("mystery".to_owned()),
    );
    let err = Tokenizer::from_gguf_metadata(&md).unwrap_err();
    assert!(
        matches!(err, TokenizerError::UnknownPreTokenizer { .. }),
        "{err}"
    );
}

/// A tiny SentencePiece vocabulary: spaces become `▁`, pairs join by their piece's score,
/// a character without a piece falls back to its UTF-8 bytes, and decoding undoes all three.
#[test]
fn sentencepiece_vocabularies_merge_by_score_and_fall_back_to_bytes() {
    let mut pieces: Vec<(String, f32, i64)> = vec![
        ("<unk>".into(), 0.0, 2),
        ("<s>".into(), 0.0, 3),
        ("\u{2581}".into(), -1.0, 1),
        ("a".into(), -2.0, 1),
        ("b".into(), -3.0, 1),
        ("ab".into(), -4.0, 1),
        ("\u{2581}ab".into(), -5.0, 1),
        ("\u{2581}a".into(), -6.0, 1),
    ];
    pieces.extend((0..=255u8).map(|b| (format!("<0x{b:02X}>"), 0.0, 6)));
    let id = |text: &str| pieces.iter().position(|p| p.0 == text).unwrap() as u32;
    let md: HashMap<String, Value> = HashMap::from([
        (
            "tokenizer.ggml.model".to_owned(),
            Value::String("llama".into()),
        ),
        (
            "tokenizer.ggml.tokens".to_owned(),
            Value::Array(pieces.iter().map(|p| Value::String(p.0.clone())).collect()),
        ),
        (
            "tokenizer.ggml.scores".to_owned(),
            Value::Array(pieces.iter().map(|p| Value::F32(p.1)).collect()),
        ),
        (
            "tokenizer.ggml.token_type".to_owned(),
            Value::Array(pieces.iter().map(|p| Value::I32(p.2 as i32)).collect()),
        ),
        ("tokenizer.ggml.bos_token_id".to_owned(), Value::U32(1)),
        ("tokenizer.ggml.unknown_token_id".to_owned(), Value::U32(0)),
        ("tokenizer.ggml.add_bos_token".to_owned(), Value::Bool(true)),
        (
            "tokenizer.ggml.add_space_prefix".to_owned(),
            Value::Bool(false),
        ),
    ]);
    let tok = Tokenizer::from_gguf_metadata(&md).unwrap();
    // "ab" (-4) joins before "▁a" (-6) could: "ab ab" is ab, ▁ab.
    let ids = tok.encode("ab ab", true).unwrap();
    assert_eq!(ids, [1, id("ab"), id("\u{2581}ab")]);
    assert_eq!(tok.decode(&ids[1..], false).unwrap(), "ab ab");
    // "é" has no piece: its two UTF-8 bytes.
    let ids = tok.encode("a\u{e9}", false).unwrap();
    assert_eq!(ids, [id("a"), id("<0xC3>"), id("<0xA9>")]);
    assert_eq!(tok.decode(&ids, false).unwrap(), "a\u{e9}");
}

#[test]
fn incremental_decoder_holds_back_split_characters() {
    let tok = Tokenizer::from_gguf_metadata(&metadata()).unwrap();
    // "é" is two bytes and "😀" four; with a byte vocabulary each byte is its own token.
    let ids = tok.encode("é hi😀", false).unwrap();
    assert_eq!(ids.len(), 2 + 1 + 4);
    let mut decoder = IncrementalDecoder::new(false);
    let pieces: Vec<String> = ids
        .iter()
        .map(|id| decoder.push(&tok, *id).unwrap())
        .collect();
    assert_eq!(pieces, ["", "é", " hi", "", "", "", "😀"]);
    assert_eq!(decoder.flush(&tok).unwrap(), "");
}

#[test]
fn incremental_decoder_flush_returns_a_truncated_character() {
    let tok = Tokenizer::from_gguf_metadata(&metadata()).unwrap();
    let first_byte_of_e_acute = 0xC3;
    let mut decoder = IncrementalDecoder::new(false);
    assert_eq!(decoder.push(&tok, byte_id(b'a')).unwrap(), "a");
    assert_eq!(
        decoder.push(&tok, byte_id(first_byte_of_e_acute)).unwrap(),
        ""
    );
    assert_eq!(decoder.flush(&tok).unwrap(), "\u{FFFD}");
}

#[test]
fn incremental_decoder_skips_special_tokens_and_uses_context() {
    let tok = Tokenizer::from_gguf_metadata(&metadata()).unwrap();
    let mut decoder = IncrementalDecoder::with_context(&[byte_id(b'x')], true);
    assert_eq!(decoder.push(&tok, 257).unwrap(), " hi");
    assert_eq!(decoder.push(&tok, 259).unwrap(), "");
    assert_eq!(decoder.push(&tok, byte_id(b'!')).unwrap(), "!");
}

#[test]
fn hf_dir_round_trip_with_configs() {
    let gguf_tok = Tokenizer::from_gguf_metadata(&metadata()).unwrap();
    let dir = tempfile::tempdir().unwrap();
    gguf_tok
        .inner
        .save(dir.path().join("tokenizer.json"), false)
        .unwrap();
    std::fs::write(
        dir.path().join("tokenizer_config.json"),
        r#"{"bos_token": {"content": "<|im_start|>"}, "eos_token": "<|im_end|>",
            "add_bos_token": true,
            "chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}"#,
    )
    .unwrap();
    std::fs::write(
        dir.path().join("generation_config.json"),
        r#"{"eos_token_id": [259, 97]}"#,
    )
    .unwrap();

    let tok = Tokenizer::from_hf_dir(dir.path()).unwrap();
    assert_eq!(tok.bos_token_id(), Some(258));
    assert_eq!(tok.eos_token(), Some("<|im_end|>"));
    assert_eq!(tok.eos_token_ids(), [259, 97, 260]);
    assert_eq!(tok.chat_template(), Some("D"));
    // The saved tokenizer.json has no BOS post-processor, so BOS is added by hand.
    assert_eq!(tok.encode("a hi", true).unwrap(), [258, byte_id(b'a'), 257]);

    std::fs::write(dir.path().join("chat_template.jinja"), "J").unwrap();
    assert_eq!(
        Tokenizer::from_hf_dir(dir.path()).unwrap().chat_template(),
        Some("J")
    );
}

#[test]
fn hf_dir_without_tokenizer_json_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let err = Tokenizer::from_hf_dir(dir.path()).unwrap_err();
    assert!(err.to_string().contains("tokenizer.json"), "{err}");
}
