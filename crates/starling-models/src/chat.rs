//! Rendering chat conversations into prompts with the model's own Jinja chat template.
//!
//! Hugging Face templates are written for Python's Jinja2 as transformers configures it, so the
//! environment here mirrors that: `trim_blocks` and `lstrip_blocks` on, Python string/dict
//! methods (`.strip()`, `.startswith()`, `.items()`...) through minijinja-contrib's `pycompat`,
//! `raise_exception(msg)`, `strftime_now(fmt)` (UTC), and a `tojson` that writes what Python's
//! `json.dumps(..., ensure_ascii=False)` writes. Templates see `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (always none for now) and any
//! extra template kwargs the caller passes ([`ChatTemplate::render_with_kwargs`]: transformers'
//! `apply_chat_template(**kwargs)`, vLLM's `chat_template_kwargs`, e.g. Qwen3's
//! `enable_thinking`).
//!
//! A model without a template gets [`CHATML_FALLBACK_TEMPLATE`] (see [`ChatTemplate::for_tokenizer`]).

mod python_json;
mod strftime;

use std::collections::BTreeMap;

use minijinja::{Environment, ErrorKind, Value};
use serde::Serialize;

use crate::tokenizer::Tokenizer;

/// The name the single template is registered under inside its environment.
const TEMPLATE_NAME: &str = "chat";

/// The variables every render sets; a template kwarg may not replace them.
pub const RESERVED_TEMPLATE_VARIABLES: &[&str] = &[
    "messages",
    "add_generation_prompt",
    "bos_token",
    "eos_token",
    "tools",
];

/// Prefix marking errors raised by the template itself through `raise_exception`.
const RAISED_PREFIX: &str = "raise_exception: ";

/// Instructions one render may run. Real templates take tens per message, so this allows
/// conversations far longer than any request body; a template that loops without bound (nested
/// `range(100000)` loops ran for hours) stops with an error instead of holding its thread.
pub const RENDER_FUEL: u64 = 10_000_000;

/// Longest prompt one render may write (far beyond any context window's worth of text).
pub const MAX_RENDERED_BYTES: usize = 16 << 20;

/// Plain ChatML, used when a model ships no chat template. It adds no system prompt and no
/// BOS; SmolLM2 and Qwen2.5 use this turn format, so for them it differs from their own
/// templates only by their default system message.
pub const CHATML_FALLBACK_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

/// One turn of a conversation.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (templates may accept others, e.g. `tool`).
    pub role: String,
    /// The text of the turn.
    pub content: String,
}

impl ChatMessage {
    /// A message with any role.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }

    /// A `system` message.
    pub fn system(content: impl Into<String>) -> Self {
        Self::new("system", content)
    }

    /// A `user` message.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }

    /// An `assistant` message.
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new("assistant", content)
    }
}

/// What went wrong with a chat template.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ChatTemplateError {
    /// The template does not parse.
    #[error("chat template has a syntax error: {message}")]
    Syntax {
        /// minijinja's description, with the line.
        message: String,
    },
    /// The template called `raise_exception` (it rejects this conversation).
    #[error("chat template rejected the conversation: {message}")]
    Raised {
        /// The template's own message.
        message: String,
    },
    /// Rendering failed for another reason (unknown filter, bad operation...).
    #[error("chat template failed to render: {message}")]
    Render {
        /// minijinja's description, with the line.
        message: String,
    },
    /// A template kwarg has the name of a variable every render sets
    /// ([`RESERVED_TEMPLATE_VARIABLES`]).
    #[error("chat template kwarg `{name}` is reserved (it is set from the request itself)")]
    ReservedKwarg {
        /// The kwarg's name.
        name: String,
    },
    /// Rendering needed more than [`RENDER_FUEL`] instructions or wrote more than
    /// [`MAX_RENDERED_BYTES`].
    #[error("chat template exceeded its render budget: {message}")]
    TooExpensive {
        /// Which limit, and where.
        message: String,
    },
}

/// A compiled chat template with the special-token texts it is rendered with.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    bos_token: String,
    eos_token: String,
}

impl ChatTemplate {
    /// Compiles `source`; `bos_token`/`eos_token` are the texts templates see (pass "" when a
    /// model has none).
    pub fn new(source: &str, bos_token: &str, eos_token: &str) -> Result<Self, ChatTemplateError> {
        let mut env = Environment::new();
        env.set_fuel(Some(RENDER_FUEL));
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime::strftime_now);
        env.add_filter("tojson", python_json::tojson);
        env.add_template_owned(TEMPLATE_NAME, source.to_owned())
            .map_err(|e| ChatTemplateError::Syntax {
                message: describe(&e),
            })?;
        Ok(ChatTemplate {
            env,
            bos_token: bos_token.to_owned(),
            eos_token: eos_token.to_owned(),
        })
    }

    /// The tokenizer's template, or [`CHATML_FALLBACK_TEMPLATE`] when the model has none.
    pub fn for_tokenizer(tokenizer: &Tokenizer) -> Result<Self, ChatTemplateError> {
        let source = tokenizer
            .chat_template()
            .unwrap_or(CHATML_FALLBACK_TEMPLATE);
        Self::new(
            source,
            tokenizer.bos_token().unwrap_or_default(),
            tokenizer.eos_token().unwrap_or_default(),
        )
    }

    /// Renders the conversation; with `add_generation_prompt` the prompt ends where the
    /// assistant's reply should start.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatTemplateError> {
        self.render_with_kwargs(messages, add_generation_prompt, &BTreeMap::new())
    }

    /// [`ChatTemplate::render`] with extra top-level template variables (`kwargs`), as
    /// transformers' `apply_chat_template(..., **kwargs)` passes them: Qwen3 reads
    /// `enable_thinking` (false: the generation prompt ends with an empty think block). A kwarg
    /// named like a variable the render sets is refused
    /// ([`ChatTemplateError::ReservedKwarg`]).
    pub fn render_with_kwargs(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        kwargs: &BTreeMap<String, serde_json::Value>,
    ) -> Result<String, ChatTemplateError> {
        if let Some(name) = kwargs
            .keys()
            .find(|k| RESERVED_TEMPLATE_VARIABLES.contains(&k.as_str()))
        {
            return Err(ChatTemplateError::ReservedKwarg { name: name.clone() });
        }
        let template =
            self.env
                .get_template(TEMPLATE_NAME)
                .map_err(|e| ChatTemplateError::Render {
                    message: describe(&e),
                })?;
        let context = minijinja::context! {
            messages => Value::from_serialize(messages),
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
            tools => Value::from(()),
            ..Value::from_serialize(kwargs)
        };
        let mut rendered = BoundedBuffer::default();
        let result = template
            .render_captured_to(context, &mut rendered)
            .map(drop);
        if rendered.overflowed {
            return Err(ChatTemplateError::TooExpensive {
                message: format!("the prompt is longer than {MAX_RENDERED_BYTES} bytes"),
            });
        }
        result.map_err(classify_render_error)?;
        String::from_utf8(rendered.bytes).map_err(|e| ChatTemplateError::Render {
            message: format!("the rendered prompt is not UTF-8: {e}"),
        })
    }
}

/// Render output that refuses to grow past [`MAX_RENDERED_BYTES`].
#[derive(Default)]
struct BoundedBuffer {
    bytes: Vec<u8>,
    overflowed: bool,
}

impl std::io::Write for BoundedBuffer {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        if self.bytes.len() + buf.len() > MAX_RENDERED_BYTES {
            self.overflowed = true;
            return Err(std::io::Error::other("render output limit"));
        }
        self.bytes.extend_from_slice(buf);
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// `raise_exception(message)`: lets a template refuse a conversation, as in transformers.
fn raise_exception(message: String) -> Result<String, minijinja::Error> {
    Err(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("{RAISED_PREFIX}{message}"),
    ))
}

/// Splits template-raised errors and exhausted budgets from other render failures.
fn classify_render_error(error: minijinja::Error) -> ChatTemplateError {
    if error.kind() == ErrorKind::OutOfFuel {
        return ChatTemplateError::TooExpensive {
            message: format!(
                "more than {RENDER_FUEL} instructions ({})",
                describe(&error)
            ),
        };
    }
    // The raise may be wrapped (e.g. inside an include or macro); look through the chain.
    let mut current: Option<&(dyn std::error::Error + 'static)> = Some(&error);
    while let Some(err) = current {
        if let Some(jinja) = err.downcast_ref::<minijinja::Error>() {
            if let Some(message) = jinja.detail().and_then(|d| d.strip_prefix(RAISED_PREFIX)) {
                return ChatTemplateError::Raised {
                    message: message.to_owned(),
                };
            }
        }
        current = err.source();
    }
    ChatTemplateError::Render {
        message: describe(&error),
    }
}

/// minijinja's message plus the template line, when known.
fn describe(error: &minijinja::Error) -> String {
    match error.line() {
        Some(line) => format!("{error} (template line {line})"),
        None => error.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn render(source: &str, messages: &[ChatMessage]) -> Result<String, ChatTemplateError> {
        ChatTemplate::new(source, "<s>", "</s>")?.render(messages, true)
    }

    #[test]
    fn fallback_is_chatml() {
        let out = render(
            CHATML_FALLBACK_TEMPLATE,
            &[ChatMessage::system("Be brief."), ChatMessage::user("Hi")],
        )
        .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn python_methods_special_tokens_and_block_trimming_work() {
        let source = "{{ bos_token }}\n{% for m in messages %}\n  {{ m.role.upper() }}:{{ m.content.strip() }}{% if m.content.startswith(' ') %}!{% endif %}|\n{% endfor %}\n{{ eos_token }}";
        let out = render(source, &[ChatMessage::user("  padded ")]).unwrap();
        // Same output as Python Jinja2 with trim_blocks and lstrip_blocks (checked by hand).
        assert_eq!(out, "<s>\n  USER:padded!|\n</s>");
    }

    #[test]
    fn tojson_matches_python_json_dumps() {
        let source = "{{ messages[0] | tojson }}|{{ messages[0] | tojson(indent=2) }}";
        let out = render(source, &[ChatMessage::user("é \"q\" <b>\n")]).unwrap();
        assert_eq!(
            out,
            "{\"role\": \"user\", \"content\": \"é \\\"q\\\" <b>\\n\"}|{\n  \"role\": \"user\",\n  \"content\": \"é \\\"q\\\" <b>\\n\"\n}"
        );
    }

    #[test]
    fn raise_exception_is_a_typed_error() {
        let source = "{% if messages[0].role != 'user' %}{{ raise_exception('first must be user') }}{% endif %}";
        let err = render(source, &[ChatMessage::assistant("x")]).unwrap_err();
        match err {
            ChatTemplateError::Raised { message } => assert_eq!(message, "first must be user"),
            other => panic!("unexpected {other:?}"),
        }
    }

    #[test]
    fn syntax_and_render_errors_are_typed() {
        let err = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(err, ChatTemplateError::Syntax { .. }), "{err}");
        let err = render("{{ messages | no_such_filter }}", &[]).unwrap_err();
        assert!(matches!(err, ChatTemplateError::Render { .. }), "{err}");
        assert!(err.to_string().contains("no_such_filter"), "{err}");
    }

    #[test]
    fn tools_is_none_and_strftime_now_renders_a_year() {
        let out = render(
            "{% if tools %}T{% else %}N{% endif %}{{ strftime_now('%Y') }}",
            &[],
        )
        .unwrap();
        assert!(out.starts_with('N'), "{out}");
        let year: u32 = out[1..].parse().unwrap();
        assert!(year >= 2024, "{out}");
    }
}
