//! Starling's tokenizer and chat templates against Hugging Face transformers, on real models.
//!
//! Fixtures come from scripts/make_tokenizer_fixtures.py. SmolLM2 is fetched into the model
//! cache when absent (CI fetches it beforehand); Qwen2.5-Coder-0.5B and Gemma-3-270M are checked
//! only when already cached (491 and 253 MB).

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::Deserialize;
use starling_hub::FetchOptions;
use starling_models::chat::{ChatMessage, ChatTemplate};
use starling_models::tokenizer::{IncrementalDecoder, Tokenizer};

#[derive(Deserialize)]
struct Fixture {
    alias: String,
    gguf_sha256: String,
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: Option<String>,
    cases: Vec<Case>,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct Case {
    text: String,
    ids: Vec<u32>,
    decoded: String,
    decoded_skip_special: String,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    rendered: String,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn load_fixture(alias: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(format!("{alias}.json"));
    let text = std::fs::read_to_string(&path).unwrap();
    let fixture: Fixture = serde_json::from_str(&text).unwrap();
    assert_eq!(fixture.alias, alias);
    let options = FetchOptions::from_env().unwrap();
    let source = options.registry.get(alias).unwrap();
    assert_eq!(
        fixture.gguf_sha256, source.sha256,
        "fixture was made from another file"
    );
    fixture
}

/// The cached GGUF for `alias`, fetching it when `fetch_if_missing`.
fn model_path(alias: &str, fetch_if_missing: bool) -> Option<PathBuf> {
    let options = FetchOptions::from_env().unwrap();
    let cached = options
        .registry
        .entries(&options.home)
        .into_iter()
        .find(|entry| entry.alias == alias)
        .and_then(|entry| entry.cached_path);
    match cached {
        Some(path) => Some(path),
        None if fetch_if_missing => Some(starling_hub::fetch(alias, &options).unwrap()),
        None => None,
    }
}

fn check_cases(tokenizer: &Tokenizer, fixture: &Fixture) {
    for case in &fixture.cases {
        let ids = tokenizer.encode(&case.text, true).unwrap();
        assert_eq!(ids, case.ids, "encode {:?}", case.text);
        assert_eq!(
            tokenizer.decode(&ids, false).unwrap(),
            case.decoded,
            "decode {:?}",
            case.text
        );
        assert_eq!(
            tokenizer.decode(&ids, true).unwrap(),
            case.decoded_skip_special,
            "decode skipping special {:?}",
            case.text
        );
    }
}

fn check_incremental_decoding(tokenizer: &Tokenizer, fixture: &Fixture) {
    for case in &fixture.cases {
        let mut decoder = IncrementalDecoder::new(false);
        let mut streamed = String::new();
        for id in &case.ids {
            let piece = decoder.push(tokenizer, *id).unwrap();
            assert!(
                !piece.contains('\u{FFFD}'),
                "half a character in {:?}",
                case.text
            );
            streamed.push_str(&piece);
        }
        streamed.push_str(&decoder.flush(tokenizer).unwrap());
        assert_eq!(streamed, case.decoded, "streamed {:?}", case.text);
    }
}

fn check_chats(tokenizer: &Tokenizer, fixture: &Fixture) {
    assert_eq!(tokenizer.bos_token(), fixture.bos_token.as_deref());
    assert_eq!(tokenizer.eos_token(), fixture.eos_token.as_deref());
    assert_eq!(tokenizer.chat_template(), fixture.chat_template.as_deref());
    let template = ChatTemplate::for_tokenizer(tokenizer).unwrap();
    for chat in &fixture.chats {
        let messages: Vec<ChatMessage> = chat
            .messages
            .iter()
            .map(|m| ChatMessage::new(&m.role, &m.content))
            .collect();
        let rendered = template
            .render(&messages, chat.add_generation_prompt)
            .unwrap();
        assert_eq!(rendered, chat.rendered);
    }
}

#[test]
fn smollm2_matches_transformers() {
    let fixture = load_fixture("smollm2-135m");
    let Some(path) = model_path("smollm2-135m", true) else {
        unreachable!("fetched above")
    };
    // Through candle's reader, as the model loader does.
    let mut file = std::fs::File::open(&path).unwrap();
    let content = candle_core::quantized::gguf_file::Content::read(&mut file).unwrap();
    let tokenizer = Tokenizer::from_gguf_metadata(&content.metadata).unwrap();

    assert_eq!(tokenizer.vocab_size(), 49_152);
    assert_eq!(tokenizer.bos_token_id(), Some(1));
    // <|im_end|> (the EOS the file names) first, then <|endoftext|>.
    assert_eq!(tokenizer.eos_token_ids(), [2, 0]);
    assert!(!tokenizer.prepends_bos());
    check_cases(&tokenizer, &fixture);
    check_incremental_decoding(&tokenizer, &fixture);
    check_chats(&tokenizer, &fixture);
}

#[test]
fn qwen2_5_coder_matches_transformers_when_cached() {
    let fixture = load_fixture("qwen2.5-coder-0.5b");
    let Some(path) = model_path("qwen2.5-coder-0.5b", false) else {
        // Written straight to stderr: the test harness captures `eprintln!` of passing tests,
        // and a silent skip would look like a pass.
        let _ = std::io::stderr().write_all(
            b"skipped: qwen2.5-coder-0.5b is not in the model cache; run `starling model fetch qwen2.5-coder-0.5b` to include this check\n",
        );
        return;
    };
    let tokenizer = Tokenizer::from_gguf_file(&path).unwrap();

    assert_eq!(tokenizer.vocab_size(), 151_936);
    // <|im_end|> first, then <|endoftext|>.
    assert_eq!(tokenizer.eos_token_ids(), [151_645, 151_643]);
    check_cases(&tokenizer, &fixture);
    check_incremental_decoding(&tokenizer, &fixture);
    check_chats(&tokenizer, &fixture);
}

/// Gemma-3's SentencePiece vocabulary (262,144 pieces, byte fallback, no space prefix) built from
/// the GGUF: transformers' ids and decodings on every fixture string, incremental decoding that
/// never splits a character. Checked when gemma3-270m is cached (253 MB; the HF parity test of
/// crates/starling-engine fetches it).
#[test]
fn gemma3_sentencepiece_matches_transformers_when_cached() {
    let fixture = load_fixture("gemma3-270m");
    let Some(path) = model_path("gemma3-270m", false) else {
        let _ = std::io::stderr()
            .write_all(b"skipped: gemma3-270m is not in the model cache; run `starling model fetch gemma3-270m` to include this check\n");
        return;
    };
    let tokenizer = Tokenizer::from_gguf_file(&path).unwrap();
    assert_eq!(tokenizer.vocab_size(), 262_144);
    assert_eq!(tokenizer.bos_token(), fixture.bos_token.as_deref());
    assert_eq!(tokenizer.eos_token(), fixture.eos_token.as_deref());
    check_cases(&tokenizer, &fixture);
    check_incremental_decoding(&tokenizer, &fixture);
}
