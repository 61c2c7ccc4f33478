//! Token sampling and stop conditions.
//!
//! - [`SamplingParams`]: a request's knobs (OpenAI/vLLM semantics and defaults) and their validation.
//! - [`Sampler`]: logits → [`SampledToken`] (penalties, min_tokens, temperature, min-p, top-k,
//!   top-p, draw), with raw log-probabilities. The math after penalties and masking is
//!   `starling_backend::sampling`, shared with the backends' device-side sampling op.
//! - [`SequenceRng`]: the random stream each sequence owns, so seeded requests are reproducible
//!   whatever else is batched with them.
//! - [`StopChecker`]: per-sequence EOS / stop token / stop string / length detection and the
//!   hold-back of text that may turn into a stop string.

mod deserialize;
mod error;
mod logprobs;
mod params;
mod penalties;
mod rng;
mod sampler;
mod stop;
mod stop_strings;

#[cfg(test)]
mod sampler_tests;
#[cfg(test)]
mod stop_tests;

pub use error::SamplingError;
pub use params::{SamplingParams, GREEDY_TEMPERATURE_EPS, MAX_TOP_LOGPROBS};
pub use rng::SequenceRng;
pub use sampler::{log_softmax, SampledToken, Sampler, SamplingContext};
pub use stop::{FinishReason, Finished, StopChecker, StopMatch, StopUpdate};
