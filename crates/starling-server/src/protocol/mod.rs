//! OpenAI request and response bodies, and their translation to engine parameters.

pub mod chat;
pub mod common;
pub mod completion;
pub mod tokenize;

pub use common::{PromptInput, SamplingFields, StreamOptions, Usage};
