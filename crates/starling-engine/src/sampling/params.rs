//! Per-request sampling parameters, their defaults and their validation.

use serde::{Deserialize, Serialize};

use super::deserialize::{non_positive_as_none, one_or_many_strings};
use super::error::SamplingError;

use starling_backend::sampling::TokenFilter;
pub use starling_backend::sampling::GREEDY_TEMPERATURE_EPS;

/// Most top log-probabilities a request may ask for per token (the OpenAI limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// Allowed range of the OpenAI presence and frequency penalties.
const OPENAI_PENALTY_RANGE: (f32, f32) = (-2.0, 2.0);

/// How one request's tokens are chosen and when it stops.
///
/// Defaults are those of the OpenAI API as served by vLLM: plain sampling at temperature 1 with no
/// filtering, no penalties, no length limit beyond the context window. Deserialising a JSON object
/// fills every missing field with its default; `stop` accepts a string or a list of strings and
/// `top_k` accepts vLLM's `-1` (or `0`, or `null`) for "off".
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct SamplingParams {
    /// Softmax temperature; 0 (anything below [`GREEDY_TEMPERATURE_EPS`]) means greedy argmax.
    pub temperature: f32,
    /// Nucleus sampling: keep the smallest set of most likely tokens whose probability reaches this.
    pub top_p: f32,
    /// Keep only the k most likely tokens; `None` means no limit. Values above the vocabulary size
    /// are clamped to it.
    #[serde(deserialize_with = "non_positive_as_none")]
    pub top_k: Option<usize>,
    /// Drop tokens whose probability is below `min_p` times the most likely token's probability.
    pub min_p: f32,
    /// Hugging Face repetition penalty over prompt and output tokens: positive logits are divided by
    /// it, the others multiplied. 1 disables it.
    pub repetition_penalty: f32,
    /// OpenAI presence penalty, subtracted once from every token already in the output.
    pub presence_penalty: f32,
    /// OpenAI frequency penalty, subtracted once per earlier occurrence of the token in the output.
    pub frequency_penalty: f32,
    /// Seed of the request's own random stream; `None` lets the engine pick one.
    pub seed: Option<u64>,
    /// Most tokens to generate; `None` means up to the context window (see
    /// [`SamplingParams::resolve_max_tokens`]).
    pub max_tokens: Option<usize>,
    /// Tokens to generate before EOS, stop tokens or stop strings may end the sequence.
    pub min_tokens: usize,
    /// Strings that end generation; the matching string is not part of the output by default.
    #[serde(deserialize_with = "one_or_many_strings")]
    pub stop: Vec<String>,
    /// Token ids that end generation, in addition to the model's EOS tokens.
    pub stop_token_ids: Vec<u32>,
    /// Keep generating after the model's EOS token (benchmarks use this for fixed lengths).
    pub ignore_eos: bool,
    /// Number of top log-probabilities to return per token (at most [`MAX_TOP_LOGPROBS`]);
    /// `None` returns none.
    pub logprobs: Option<usize>,
    /// Drop special tokens when detokenising the output.
    pub skip_special_tokens: bool,
    /// Emit the matched stop string (or stop token text) instead of cutting it off (vLLM option).
    pub include_stop_str_in_output: bool,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            seed: None,
            max_tokens: None,
            min_tokens: 0,
            stop: Vec::new(),
            stop_token_ids: Vec::new(),
            ignore_eos: false,
            logprobs: None,
            skip_special_tokens: true,
            include_stop_str_in_output: false,
        }
    }
}

impl SamplingParams {
    /// Whether tokens are chosen by argmax rather than drawn at random.
    pub fn is_greedy(&self) -> bool {
        self.token_filter().is_greedy()
    }

    /// The knobs applied after penalties and masking (temperature, top-k, top-p, min-p).
    pub fn token_filter(&self) -> TokenFilter {
        TokenFilter {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
        }
    }

    /// The number of tokens the request may generate, given `room_tokens` left in the context
    /// window after its prompt.
    pub fn resolve_max_tokens(&self, room_tokens: usize) -> usize {
        self.max_tokens
            .map_or(room_tokens, |max| max.min(room_tokens))
    }

    /// Checks every parameter against its allowed range for a model producing `vocab_size` logits.
    ///
    /// An oversized `top_k` is not an error: the sampler clamps it to the vocabulary.
    pub fn validate(&self, vocab_size: usize) -> Result<(), SamplingError> {
        if !(self.temperature.is_finite() && self.temperature >= 0.0) {
            return Err(out_of_range("temperature", "[0, inf)", self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(out_of_range("top_p", "(0, 1]", self.top_p));
        }
        if !(self.min_p >= 0.0 && self.min_p <= 1.0) {
            return Err(out_of_range("min_p", "[0, 1]", self.min_p));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(out_of_range(
                "repetition_penalty",
                "(0, inf)",
                self.repetition_penalty,
            ));
        }
        let (penalty_min, penalty_max) = OPENAI_PENALTY_RANGE;
        if !(self.presence_penalty >= penalty_min && self.presence_penalty <= penalty_max) {
            return Err(out_of_range(
                "presence_penalty",
                "[-2, 2]",
                self.presence_penalty,
            ));
        }
        if !(self.frequency_penalty >= penalty_min && self.frequency_penalty <= penalty_max) {
            return Err(out_of_range(
                "frequency_penalty",
                "[-2, 2]",
                self.frequency_penalty,
            ));
        }
        if let Some(top_n) = self.logprobs {
            if top_n > MAX_TOP_LOGPROBS {
                return Err(SamplingError::OutOfRange {
                    field: "logprobs",
                    allowed: "[0, 20]",
                    value: top_n as f64,
                });
            }
        }
        if let Some(max_tokens) = self.max_tokens {
            if max_tokens == 0 {
                return Err(SamplingError::OutOfRange {
                    field: "max_tokens",
                    allowed: "[1, inf)",
                    value: 0.0,
                });
            }
            if self.min_tokens > max_tokens {
                return Err(SamplingError::MinTokensAboveMaxTokens {
                    min_tokens: self.min_tokens,
                    max_tokens,
                });
            }
        }
        if self.stop.iter().any(String::is_empty) {
            return Err(SamplingError::EmptyStopString);
        }
        if let Some(&token_id) = self
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= vocab_size)
        {
            return Err(SamplingError::StopTokenOutOfVocab {
                token_id,
                vocab_size,
            });
        }
        Ok(())
    }
}

fn out_of_range(field: &'static str, allowed: &'static str, value: f32) -> SamplingError {
    SamplingError::OutOfRange {
        field,
        allowed,
        value: f64::from(value),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const VOCAB: usize = 100;

    fn field_of(params: SamplingParams) -> Option<&'static str> {
        params.validate(VOCAB).err().and_then(|e| e.field())
    }

    #[test]
    fn defaults_are_valid_and_match_openai() {
        let params = SamplingParams::default();
        assert_eq!(params.validate(VOCAB), Ok(()));
        assert_eq!(params.temperature, 1.0);
        assert_eq!(params.top_p, 1.0);
        assert!(params.skip_special_tokens);
        assert!(!params.is_greedy());
    }

    #[test]
    fn each_invalid_field_is_named() {
        let base = SamplingParams::default;
        let cases: Vec<(SamplingParams, &str)> = vec![
            (
                SamplingParams {
                    temperature: -0.1,
                    ..base()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    temperature: f32::NAN,
                    ..base()
                },
                "temperature",
            ),
            (
                SamplingParams {
                    top_p: 0.0,
                    ..base()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    top_p: 1.01,
                    ..base()
                },
                "top_p",
            ),
            (
                SamplingParams {
                    min_p: -0.01,
                    ..base()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    min_p: 1.5,
                    ..base()
                },
                "min_p",
            ),
            (
                SamplingParams {
                    repetition_penalty: 0.0,
                    ..base()
                },
                "repetition_penalty",
            ),
            (
                SamplingParams {
                    presence_penalty: 2.5,
                    ..base()
                },
                "presence_penalty",
            ),
            (
                SamplingParams {
                    frequency_penalty: -2.1,
                    ..base()
                },
                "frequency_penalty",
            ),
            (
                SamplingParams {
                    logprobs: Some(21),
                    ..base()
                },
                "logprobs",
            ),
            (
                SamplingParams {
                    max_tokens: Some(0),
                    ..base()
                },
                "max_tokens",
            ),
            (
                SamplingParams {
                    max_tokens: Some(4),
                    min_tokens: 5,
                    ..base()
                },
                "min_tokens",
            ),
            (
                SamplingParams {
                    stop: vec![String::new()],
                    ..base()
                },
                "stop",
            ),
            (
                SamplingParams {
                    stop_token_ids: vec![100],
                    ..base()
                },
                "stop_token_ids",
            ),
        ];
        for (params, field) in cases {
            assert_eq!(field_of(params.clone()), Some(field), "{params:?}");
        }
    }

    #[test]
    fn error_message_names_field_and_range() {
        let params = SamplingParams {
            top_p: 1.5,
            ..SamplingParams::default()
        };
        let message = params.validate(VOCAB).unwrap_err().to_string();
        assert_eq!(message, "top_p must be in (0, 1], got 1.5");
    }

    #[test]
    fn boundary_values_are_accepted_and_large_top_k_is_not_an_error() {
        let params = SamplingParams {
            temperature: 0.0,
            top_p: 1.0,
            min_p: 1.0,
            presence_penalty: -2.0,
            frequency_penalty: 2.0,
            logprobs: Some(20),
            max_tokens: Some(3),
            min_tokens: 3,
            top_k: Some(1_000_000),
            stop_token_ids: vec![99],
            ..SamplingParams::default()
        };
        assert_eq!(params.validate(VOCAB), Ok(()));
        assert!(params.is_greedy());
    }

    #[test]
    fn resolve_max_tokens_caps_by_room() {
        let unlimited = SamplingParams::default();
        assert_eq!(unlimited.resolve_max_tokens(500), 500);
        let limited = SamplingParams {
            max_tokens: Some(16),
            ..SamplingParams::default()
        };
        assert_eq!(limited.resolve_max_tokens(500), 16);
        assert_eq!(limited.resolve_max_tokens(10), 10);
    }

    #[test]
    fn deserialises_openai_shapes() {
        let params: SamplingParams = serde_json::from_str(
            r#"{"temperature": 0.5, "stop": "\n\n", "top_k": -1, "seed": 7, "max_tokens": 32}"#,
        )
        .unwrap();
        assert_eq!(params.temperature, 0.5);
        assert_eq!(params.stop, vec!["\n\n".to_string()]);
        assert_eq!(params.top_k, None);
        assert_eq!(params.seed, Some(7));
        assert_eq!(params.max_tokens, Some(32));
        assert_eq!(params.top_p, 1.0);

        let list: SamplingParams =
            serde_json::from_str(r#"{"stop": ["a", "b"], "top_k": 5}"#).unwrap();
        assert_eq!(list.stop, vec!["a".to_string(), "b".to_string()]);
        assert_eq!(list.top_k, Some(5));

        let nulls: SamplingParams =
            serde_json::from_str(r#"{"stop": null, "top_k": null}"#).unwrap();
        assert!(nulls.stop.is_empty());
        assert_eq!(nulls.top_k, None);
    }
}
