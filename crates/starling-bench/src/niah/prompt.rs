//! The needle, the question and the chat messages around the haystack.
//!
//! Wording of the original test's OpenAI provider (system message, then the context, then the
//! question with "Don't give information outside the document or repeat your findings"). The
//! original sends context and question as two consecutive user messages; here they are one user
//! message (context, blank line, question) because some chat templates refuse two user turns in a
//! row. The caller renders the messages with the model's chat template, with
//! [`CONTEXT_PLACEHOLDER`] standing for the haystack, and splits the result with
//! [`split_at_placeholder`] so the haystack's token ids can be placed between the two halves
//! exactly.

use crate::error::BenchError;

/// The needle (kvpress and the original test).
pub const NEEDLE: &str =
    "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";

/// The text inserted into the haystack: the needle after a space, so that placed after a period
/// it reads as its own sentence (the original joins it to the period: `day.The best`).
pub const NEEDLE_INSERT: &str =
    " The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";

/// The retrieval question.
pub const QUESTION: &str = "What is the best thing to do in San Francisco?";

/// The original test's system message.
pub const SYSTEM_PROMPT: &str =
    "You are a helpful AI bot that answers questions for a user. Keep your response short and direct";

/// What the original test appends to the question.
const QUESTION_SUFFIX: &str = "Don't give information outside the document or repeat your findings";

/// Stands for the haystack while the chat template is rendered; chosen so that no template or
/// essay contains it.
pub const CONTEXT_PLACEHOLDER: &str = "\u{1}STARLING_NIAH_CONTEXT\u{1}";

/// Which part of a NIAH prompt is compressed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum NiahProtocol {
    /// The whole prompt is compressed as it is prefilled (chat template, haystack and
    /// question alike), and again while decoding.
    #[default]
    WholePrompt,
    /// kvpress's context/question split: the context (system prompt and haystack) is compressed
    /// once it is in; the question and the chat template's tail are never evicted.
    ContextQuestion,
}

impl NiahProtocol {
    /// Every protocol.
    pub const ALL: [NiahProtocol; 2] = [Self::WholePrompt, Self::ContextQuestion];

    /// The name in flags and result files.
    pub fn name(self) -> &'static str {
        match self {
            Self::WholePrompt => "whole-prompt",
            Self::ContextQuestion => "context-question",
        }
    }

    /// The protocol of a name.
    pub fn from_name(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|p| p.name() == name)
    }

    /// One paragraph for reports: what is compressed, and what the question-aware scorers see.
    pub fn description(self) -> &'static str {
        match self {
            Self::WholePrompt => concat!(
                "Protocol `whole-prompt`: the whole prompt (chat template, haystack and question) ",
                "is compressed as its chunks are prefilled and again every `every_n_tokens` while ",
                "decoding; SnapKV's observation window is the prompt's last `window_tokens` tokens, ",
                "which hold the question."
            ),
            Self::ContextQuestion => concat!(
                "Protocol `context-question` (kvpress's split): only the context (system prompt and ",
                "haystack) is compressed, once, when the prompt is in; the question and the chat ",
                "template's tail are never evicted, nor are generated tokens. Starling's SnapKV and ",
                "TOVA score with the question's queries, so they see the question (kvpress's ",
                "SnapKV and TOVA score with the context's own last tokens)."
            ),
        }
    }
}

/// A chat message as (role, content), for the caller's chat template.
pub type Message = (&'static str, String);

/// The messages of one test with `context` as the haystack (pass [`CONTEXT_PLACEHOLDER`] to get
/// a template to split).
pub fn messages(context: &str) -> Vec<Message> {
    vec![
        ("system", SYSTEM_PROMPT.to_owned()),
        ("user", format!("{context}\n\n{QUESTION} {QUESTION_SUFFIX}")),
    ]
}

/// Splits a rendered prompt at the placeholder into the text before and after the haystack.
pub fn split_at_placeholder(rendered: &str) -> Result<(&str, &str), BenchError> {
    let mut parts = rendered.split(CONTEXT_PLACEHOLDER);
    match (parts.next(), parts.next(), parts.next()) {
        (Some(before), Some(after), None) => Ok((before, after)),
        _ => Err(BenchError::Invalid(format!(
            "the rendered chat prompt must contain the context placeholder exactly once, found {} times",
            rendered.matches(CONTEXT_PLACEHOLDER).count()
        ))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_needle_insert_is_the_needle_after_a_space() {
        assert_eq!(NEEDLE_INSERT.strip_prefix(' '), Some(NEEDLE));
    }

    #[test]
    fn messages_put_the_question_after_the_context() {
        let m = messages("HAY");
        assert_eq!(m[0], ("system", SYSTEM_PROMPT.to_owned()));
        assert_eq!(m[1].0, "user");
        assert_eq!(
            m[1].1,
            "HAY\n\nWhat is the best thing to do in San Francisco? Don't give information outside the document or repeat your findings"
        );
    }

    #[test]
    fn protocols_round_trip_their_names() {
        for p in NiahProtocol::ALL {
            assert_eq!(NiahProtocol::from_name(p.name()), Some(p));
        }
        assert_eq!(NiahProtocol::from_name("question"), None);
        assert!(NiahProtocol::ContextQuestion
            .description()
            .contains("see the question"));
    }

    #[test]
    fn split_needs_exactly_one_placeholder() {
        let rendered = format!("<s>user: {CONTEXT_PLACEHOLDER} question</s>");
        assert_eq!(
            split_at_placeholder(&rendered).unwrap(),
            ("<s>user: ", " question</s>")
        );
        assert!(split_at_placeholder("no placeholder").is_err());
        let twice = format!("{CONTEXT_PLACEHOLDER}{CONTEXT_PLACEHOLDER}");
        assert!(split_at_placeholder(&twice).is_err());
    }
}
