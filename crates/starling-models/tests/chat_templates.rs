//! The chat templates embedded in SmolLM2 and Qwen2.5-Coder, rendered as transformers renders
//! them (fixtures from scripts/make_tokenizer_fixtures.py; no model file needed), and Qwen3's
//! with its `enable_thinking` kwarg (fixture from scripts/make_qwen3_chat_fixture.py).

use std::collections::BTreeMap;
use std::path::Path;

use serde::Deserialize;
use starling_models::chat::{
    ChatMessage, ChatTemplate, ChatTemplateError, CHATML_FALLBACK_TEMPLATE,
};

#[derive(Deserialize)]
struct Fixture {
    bos_token: Option<String>,
    eos_token: Option<String>,
    chat_template: String,
    chats: Vec<Chat>,
}

#[derive(Deserialize)]
struct Chat {
    messages: Vec<Message>,
    add_generation_prompt: bool,
    /// Extra template variables (only in the Qwen3 fixture).
    #[serde(default)]
    chat_template_kwargs: BTreeMap<String, serde_json::Value>,
    rendered: String,
}

#[derive(Deserialize)]
struct Message {
    role: String,
    content: String,
}

fn fixture(alias: &str) -> Fixture {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/tokenizer")
        .join(format!("{alias}.json"));
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn messages(chat: &Chat) -> Vec<ChatMessage> {
    chat.messages
        .iter()
        .map(|m| ChatMessage::new(&m.role, &m.content))
        .collect()
}

fn check_renders(alias: &str) {
    let fixture = fixture(alias);
    let template = ChatTemplate::new(
        &fixture.chat_template,
        fixture.bos_token.as_deref().unwrap_or_default(),
        fixture.eos_token.as_deref().unwrap_or_default(),
    )
    .unwrap();
    assert!(!fixture.chats.is_empty());
    for chat in &fixture.chats {
        let rendered = template
            .render(&messages(chat), chat.add_generation_prompt)
            .unwrap();
        assert_eq!(rendered, chat.rendered, "{alias}");
    }
}

#[test]
fn smollm2_template_renders_like_transformers() {
    check_renders("smollm2-135m");
}

#[test]
fn qwen2_5_template_renders_like_transformers() {
    check_renders("qwen2.5-coder-0.5b");
}

/// Qwen3's template with thinking on (the default), explicitly on and off: off ends the
/// generation prompt with an empty think block, and earlier turns' reasoning is dropped.
#[test]
fn qwen3_template_renders_thinking_on_and_off_like_transformers() {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/qwen3.json");
    let fixture: Fixture = serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let template = ChatTemplate::new(
        &fixture.chat_template,
        "",
        fixture.eos_token.as_deref().unwrap_or_default(),
    )
    .unwrap();
    let mut thinking_off = 0;
    for chat in &fixture.chats {
        let rendered = template
            .render_with_kwargs(
                &messages(chat),
                chat.add_generation_prompt,
                &chat.chat_template_kwargs,
            )
            .unwrap();
        assert_eq!(rendered, chat.rendered, "{:?}", chat.chat_template_kwargs);
        if chat.chat_template_kwargs.get("enable_thinking") == Some(&serde_json::json!(false)) {
            assert!(
                rendered.ends_with("<think>\n\n</think>\n\n"),
                "{rendered:?}"
            );
            thinking_off += 1;
        }
    }
    assert!(
        thinking_off >= 2,
        "the fixture exercises enable_thinking = false"
    );
    // Without the kwarg the same conversation renders differently: the kwarg is what matters.
    let chat = &fixture.chats[2];
    assert_ne!(
        template.render(&messages(chat), true).unwrap(),
        chat.rendered
    );
}

#[test]
fn reserved_template_kwargs_are_refused() {
    let template = ChatTemplate::new(CHATML_FALLBACK_TEMPLATE, "", "").unwrap();
    let kwargs = BTreeMap::from([("messages".to_owned(), serde_json::json!([]))]);
    let err = template
        .render_with_kwargs(&[ChatMessage::user("hi")], true, &kwargs)
        .unwrap_err();
    assert!(
        matches!(&err, ChatTemplateError::ReservedKwarg { name } if name == "messages"),
        "{err}"
    );
}

#[test]
fn chatml_fallback_matches_smollm2_when_a_system_message_is_given() {
    // SmolLM2's template only adds a default system prompt; with one given, plain ChatML and
    // the model's template agree.
    let fixture = fixture("smollm2-135m");
    let chat = fixture
        .chats
        .iter()
        .find(|chat| chat.messages[0].role == "system")
        .unwrap();
    let fallback = ChatTemplate::new(CHATML_FALLBACK_TEMPLATE, "", "").unwrap();
    assert_eq!(
        fallback.render(&messages(chat), true).unwrap(),
        chat.rendered
    );
}

/// r23 (found while writing the chat-template fuzz target): nested `range(100000)` loops ran
/// for hours on the thread rendering the prompt; a render now stops at its instruction budget.
#[test]
fn r23_unbounded_loops_stop_at_the_render_budget() {
    let source = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("../../fuzz/regressions/chat_template/nested-ranges.jinja"),
    )
    .unwrap();
    let template = ChatTemplate::new(&source, "", "").unwrap();
    let started = std::time::Instant::now();
    let err = template
        .render(&[ChatMessage::user("hi")], true)
        .unwrap_err();
    assert!(
        matches!(err, ChatTemplateError::TooExpensive { .. }),
        "{err}"
    );
    assert!(started.elapsed() < std::time::Duration::from_secs(5));
}

/// r23: a template could write a prompt of any size (100 MB and more from one short message);
/// renders past `MAX_RENDERED_BYTES` are refused.
#[test]
fn r23_output_without_bound_is_refused() {
    for name in ["output-without-bound.jinja", "string-repeat.jinja"] {
        let source = std::fs::read_to_string(
            Path::new(env!("CARGO_MANIFEST_DIR"))
                .join("../../fuzz/regressions/chat_template")
                .join(name),
        )
        .unwrap();
        let template = ChatTemplate::new(&source, "<s>", "").unwrap();
        let err = template
            .render(&[ChatMessage::user("some words")], true)
            .unwrap_err();
        assert!(
            matches!(err, ChatTemplateError::TooExpensive { .. }),
            "{name}: {err}"
        );
    }
}
