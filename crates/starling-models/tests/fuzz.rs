//! Fuzzing the loaders' parsers and the chat-template engine (issue 23) with the stable-Rust
//! mutation fuzzer in `starling-fuzz`: every seed of `fuzz/corpus/<target>` (regressions
//! included), then mutations for a bounded time (`STARLING_FUZZ_SECONDS`, default below). A
//! panic, or a case slower than 5 s, fails the test and saves the input. See fuzz/README.md.
//!
//! `write_seed_corpus` (ignored) regenerates the generated seeds.

mod common;

use std::path::{Path, PathBuf};
use std::time::Duration;

use candle_core::quantized::gguf_file::Value;
use candle_core::quantized::GgmlDType;
use common::{gguf_bytes, patterned};
use starling_fuzz::{Budget, Target, Verdict};
use starling_models::chat::{ChatMessage, ChatTemplate};

/// Mutation time per target in CI: four targets on two cores, about a minute in all.
const DEFAULT_SECONDS: u64 = 25;

fn corpus(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/corpus")
        .join(target)
}

/// Past findings of `target` (replayed every run, not mutated).
fn regressions(target: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fuzz/regressions")
        .join(target)
}

fn budget() -> Budget {
    Budget::from_env(Duration::from_secs(DEFAULT_SECONDS))
}

/// Target `name`: its corpus, its past findings, mutations with `dictionary` up to `max_len`
/// bytes.
fn target(name: &str, dictionary: &[&[u8]], max_len: usize) -> Target {
    Target::new(name, corpus(name))
        .regressions(regressions(name))
        .dictionary(dictionary)
        .max_len(max_len)
}

/// Runs `target` with what `parse` accepts as accepted; at least one seed must parse.
fn run_parser<E>(target: Target, parse: impl Fn(&[u8]) -> Result<(), E>) {
    let report = target.run(budget(), |bytes| match parse(bytes) {
        Ok(()) => Verdict::Accepted,
        Err(_) => Verdict::Rejected,
    });
    assert!(report.accepted > 0, "no seed parses: {report}");
}

#[test]
fn fuzz_gguf_header_metadata_and_tokenizer() {
    let dictionary: &[&[u8]] = &[
        b"GGUF",
        b"general.architecture",
        b"general.alignment",
        b"llama.block_count",
        b"llama.embedding_length",
        b"llama.attention.head_count",
        b"llama.attention.head_count_kv",
        b"llama.rope.scaling.type",
        b"llama.context_length",
        b"tokenizer.ggml.tokens",
        b"tokenizer.ggml.merges",
        b"tokenizer.ggml.model",
        b"tokenizer.chat_template",
        b"token_embd.weight",
        b"blk.0.attn_q.weight",
        b"qwen2",
        b"\x09\x00\x00\x00",
        b"\x08\x00\x00\x00",
        b"\x00\x00\x00\x00\x00\x00\x00\x80",
    ];
    run_parser(
        target("gguf", dictionary, 64 << 10),
        starling_models::fuzz::gguf,
    );
}

#[test]
fn fuzz_safetensors_header_and_tensors() {
    let dictionary: &[&[u8]] = &[
        b"{\"",
        b"\"dtype\":",
        b"\"shape\":",
        b"\"data_offsets\":",
        b"\"BF16\"",
        b"\"F16\"",
        b"\"F32\"",
        b"\"I64\"",
        b"\"__metadata__\"",
        b"18446744073709551615",
        b"[0,0]",
        b"\xff\xff\xff\xff\xff\xff\xff\x7f",
    ];
    run_parser(
        target("safetensors", dictionary, 64 << 10),
        starling_models::fuzz::safetensors,
    );
}

#[test]
fn fuzz_hf_config_json() {
    let dictionary: &[&[u8]] = &[
        b"\"model_type\"",
        b"\"llama\"",
        b"\"qwen2\"",
        b"\"rope_scaling\"",
        b"\"rope_parameters\"",
        b"\"rope_type\"",
        b"\"llama3\"",
        b"\"linear\"",
        b"\"factor\"",
        b"\"head_dim\"",
        b"\"num_key_value_heads\"",
        b"\"eos_token_id\"",
        b"null",
        b"-1",
        b"1e309",
        b"4294967296",
        b"18446744073709551616",
        b"[",
        b"{",
    ];
    let keys = [
        "model_type",
        "vocab_size",
        "hidden_size",
        "intermediate_size",
        "num_hidden_layers",
        "num_attention_heads",
        "num_key_value_heads",
        "head_dim",
        "rms_norm_eps",
        "rope_theta",
        "rope_scaling",
        "rope_parameters",
        "rope_type",
        "type",
        "factor",
        "low_freq_factor",
        "high_freq_factor",
        "original_max_position_embeddings",
        "max_position_embeddings",
        "tie_word_embeddings",
        "attention_bias",
        "bos_token_id",
        "eos_token_id",
        "llama3",
        "linear",
        "dynamic",
        "yarn",
    ];
    run_parser(
        target("hf_config", dictionary, 16 << 10).json(&keys),
        |bytes| starling_models::fuzz::hf_config(&String::from_utf8_lossy(bytes)),
    );
}

/// Conversations each fuzzed template is rendered with.
fn conversations() -> Vec<Vec<ChatMessage>> {
    vec![
        vec![ChatMessage::user("Hello")],
        vec![
            ChatMessage::system("You are terse."),
            ChatMessage::user("2 + 2?"),
            ChatMessage::assistant("4"),
            ChatMessage::user("{{ and }} and {% raw %} \u{0} \u{1f600}"),
        ],
        vec![ChatMessage::new("tool", ""), ChatMessage::new("", "x")],
        Vec::new(),
    ]
}

#[test]
fn fuzz_chat_templates() {
    let dictionary: &[&[u8]] = &[
        b"{%",
        b"%}",
        b"{{",
        b"}}",
        b"{% for message in messages %}",
        b"{% endfor %}",
        b"{% if add_generation_prompt %}",
        b"{% endif %}",
        b"message['content']",
        b"message.role",
        b"| tojson",
        b"| trim",
        b"raise_exception('no')",
        b"strftime_now('%Y-%m-%d %H:%M:%S %z %Z %j %%')",
        b"range(",
        b"loop.index0",
        b"{% macro m(x) %}{{ m(x) }}{% endmacro %}",
        b"{% set ns = namespace(a=1) %}",
        b".startswith(",
        b".split(",
        b" * 100000",
        b"bos_token",
    ];
    let target = target("chat_template", dictionary, 8 << 10);
    let conversations = conversations();
    let report = target.run(budget(), |bytes| {
        let source = String::from_utf8_lossy(bytes);
        let Ok(template) = ChatTemplate::new(&source, "<s>", "</s>") else {
            return Verdict::Rejected;
        };
        let mut accepted = Verdict::Rejected;
        for (i, messages) in conversations.iter().enumerate() {
            if template.render(messages, i % 2 == 0).is_ok() {
                accepted = Verdict::Accepted;
            }
        }
        accepted
    });
    assert!(report.accepted > 0, "no seed renders: {report}");
}

/// A micro llama (or qwen2) GGUF: 1 layer, width 32, 12 byte-level BPE tokens with merges and a
/// chat template, Q8_0 matrices: a seed small enough that mutations land in the header.
fn micro_gguf(architecture: &str) -> Vec<u8> {
    let tokens: Vec<&str> = vec![
        "<|endoftext|>",
        "<|im_start|>",
        "<|im_end|>",
        "a",
        "b",
        "c",
        "ab",
        "abc",
        "Ġ",
        "Ġa",
        "\n",
        "Ċ",
    ];
    let (d, heads, kv_heads, ffn, vocab) = (32usize, 4usize, 2usize, 64usize, tokens.len());
    let head_dim = d / heads;
    let key = |suffix: &str| format!("{architecture}.{suffix}");
    let metadata: Vec<(String, Value)> = vec![
        (
            "general.architecture".into(),
            Value::String(architecture.into()),
        ),
        (key("block_count"), Value::U32(1)),
        (key("embedding_length"), Value::U32(d as u32)),
        (key("feed_forward_length"), Value::U32(ffn as u32)),
        (key("attention.head_count"), Value::U32(heads as u32)),
        (key("attention.head_count_kv"), Value::U32(kv_heads as u32)),
        (key("attention.layer_norm_rms_epsilon"), Value::F32(1e-5)),
        (key("rope.freq_base"), Value::F32(10_000.0)),
        (key("context_length"), Value::U32(128)),
        ("tokenizer.ggml.model".into(), Value::String("gpt2".into())),
        ("tokenizer.ggml.pre".into(), Value::String("smollm".into())),
        (
            "tokenizer.ggml.tokens".into(),
            Value::Array(tokens.iter().map(|t| Value::String((*t).into())).collect()),
        ),
        (
            "tokenizer.ggml.token_type".into(),
            Value::Array(
                (0..vocab)
                    .map(|i| Value::I32(if i < 3 { 3 } else { 1 }))
                    .collect(),
            ),
        ),
        (
            "tokenizer.ggml.merges".into(),
            Value::Array(vec![
                Value::String("a b".into()),
                Value::String("ab c".into()),
                Value::String("Ġ a".into()),
            ]),
        ),
        ("tokenizer.ggml.bos_token_id".into(), Value::U32(1)),
        ("tokenizer.ggml.eos_token_id".into(), Value::U32(2)),
        (
            "tokenizer.chat_template".into(),
            Value::String(starling_models::chat::CHATML_FALLBACK_TEMPLATE.into()),
        ),
    ];
    let q = heads * head_dim;
    let kv = kv_heads * head_dim;
    let mut specs: Vec<(String, Vec<usize>, GgmlDType)> = vec![
        ("token_embd.weight".into(), vec![vocab, d], GgmlDType::F16),
        ("output_norm.weight".into(), vec![d], GgmlDType::F32),
        ("blk.0.attn_norm.weight".into(), vec![d], GgmlDType::F32),
        ("blk.0.attn_q.weight".into(), vec![q, d], GgmlDType::Q8_0),
        ("blk.0.attn_k.weight".into(), vec![kv, d], GgmlDType::Q8_0),
        ("blk.0.attn_v.weight".into(), vec![kv, d], GgmlDType::Q8_0),
        (
            "blk.0.attn_output.weight".into(),
            vec![d, q],
            GgmlDType::Q8_0,
        ),
        ("blk.0.ffn_norm.weight".into(), vec![d], GgmlDType::F32),
        (
            "blk.0.ffn_gate.weight".into(),
            vec![ffn, d],
            GgmlDType::Q8_0,
        ),
        ("blk.0.ffn_up.weight".into(), vec![ffn, d], GgmlDType::Q8_0),
        (
            "blk.0.ffn_down.weight".into(),
            vec![d, ffn],
            GgmlDType::Q8_0,
        ),
    ];
    if architecture == "qwen2" {
        specs.push(("output.weight".into(), vec![vocab, d], GgmlDType::Q8_0));
        specs.push(("blk.0.attn_q.bias".into(), vec![q], GgmlDType::F32));
        specs.push(("blk.0.attn_k.bias".into(), vec![kv], GgmlDType::F32));
        specs.push(("blk.0.attn_v.bias".into(), vec![kv], GgmlDType::F32));
    }
    gguf_bytes(&metadata, &patterned(specs))
}

/// A safetensors shard of small bf16, f16 and f32 tensors.
fn micro_safetensors() -> Vec<u8> {
    use safetensors::tensor::{Dtype, TensorView};
    let f32_data: Vec<u8> = (0..12)
        .flat_map(|i| (i as f32 * 0.5).to_le_bytes())
        .collect();
    let f16_data: Vec<u8> = (0..8u16).flat_map(|i| (0x3c00 + i).to_le_bytes()).collect();
    let bf16_data: Vec<u8> = (0..6u16).flat_map(|i| (0x3f80 + i).to_le_bytes()).collect();
    let views = vec![
        (
            "model.norm.weight",
            TensorView::new(Dtype::F32, vec![3, 4], &f32_data).unwrap(),
        ),
        (
            "model.layers.0.mlp.up_proj.weight",
            TensorView::new(Dtype::F16, vec![2, 4], &f16_data).unwrap(),
        ),
        (
            "lm_head.weight",
            TensorView::new(Dtype::BF16, vec![6], &bf16_data).unwrap(),
        ),
    ];
    safetensors::serialize(views, None).unwrap()
}

/// Regenerates the generated seeds under fuzz/corpus (the JSON and template seeds are
/// hand-written or copied from fixtures; see fuzz/README.md).
#[test]
#[ignore = "writes fuzz/corpus; run by hand when the seed formats change"]
fn write_seed_corpus() {
    let write = |target: &str, name: &str, bytes: &[u8]| {
        let dir = corpus(target);
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join(name), bytes).unwrap();
    };
    write("gguf", "micro-llama.gguf", &micro_gguf("llama"));
    write("gguf", "micro-qwen2.gguf", &micro_gguf("qwen2"));
    write("safetensors", "micro.safetensors", &micro_safetensors());
    for alias in ["smollm2-135m", "qwen2.5-coder-0.5b"] {
        let fixture: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(
                Path::new(env!("CARGO_MANIFEST_DIR"))
                    .join("tests/fixtures/tokenizer")
                    .join(format!("{alias}.json")),
            )
            .unwrap(),
        )
        .unwrap();
        let source = fixture["chat_template"].as_str().unwrap();
        write(
            "chat_template",
            &format!("{alias}.jinja"),
            source.as_bytes(),
        );
    }
    write(
        "chat_template",
        "chatml-fallback.jinja",
        starling_models::chat::CHATML_FALLBACK_TEMPLATE.as_bytes(),
    );
}
