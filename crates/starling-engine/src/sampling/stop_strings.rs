//! Stop-string matching over streamed text, across token boundaries.

/// What the matcher decided about the text received so far.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum StringMatch {
    /// No stop string completed; this text can be emitted now (possibly empty).
    Released(String),
    /// A stop string completed: emit `text` and end the sequence.
    Matched {
        /// Text before the stop string (or through it when the request includes it).
        text: String,
        /// The stop string that matched.
        stop: String,
    },
}

/// Holds back the tail of the output that could still grow into a stop string.
///
/// Invariant: `held` is the longest suffix of the output seen so far that is a proper prefix of
/// some stop string. Everything before it can never be part of a match, so it is released, and
/// every future match must start inside `held`.
#[derive(Debug, Clone)]
pub(super) struct StopStringMatcher {
    stops: Vec<String>,
    include_stop_in_output: bool,
    held: String,
}

impl StopStringMatcher {
    /// A matcher for `stops`; empty stop strings are ignored (validation rejects them).
    pub(super) fn new(stops: &[String], include_stop_in_output: bool) -> Self {
        StopStringMatcher {
            stops: stops.iter().filter(|s| !s.is_empty()).cloned().collect(),
            include_stop_in_output,
            held: String::new(),
        }
    }

    /// Appends a token's text. With `may_stop` false (below min_tokens) completed stop strings are
    /// ignored, but a possible beginning of one is still held back.
    pub(super) fn push(&mut self, new_text: &str, may_stop: bool) -> StringMatch {
        self.held.push_str(new_text);
        if may_stop {
            if let Some((start, end, stop)) = self.first_completed_match() {
                let emit_end = if self.include_stop_in_output {
                    end
                } else {
                    start
                };
                let text = self.held[..emit_end].to_string();
                let stop = stop.to_string();
                self.held.clear();
                return StringMatch::Matched { text, stop };
            }
        }
        let keep_from = self.partial_match_start();
        let released = self.held[..keep_from].to_string();
        self.held.drain(..keep_from);
        StringMatch::Released(released)
    }

    /// Releases whatever is held back (the sequence ended without a stop-string match).
    pub(super) fn take_held(&mut self) -> String {
        std::mem::take(&mut self.held)
    }

    /// The completed match that ends first (as if the text had arrived one character at a time,
    /// so the result does not depend on how the text was split into tokens); on equal ends the
    /// longer match, then the earlier-listed stop string.
    fn first_completed_match(&self) -> Option<(usize, usize, &str)> {
        let mut best: Option<(usize, usize, &str)> = None;
        for stop in &self.stops {
            if let Some(start) = self.held.find(stop.as_str()) {
                let end = start + stop.len();
                let better = best
                    .is_none_or(|(best_start, best_end, _)| (end, start) < (best_end, best_start));
                if better {
                    best = Some((start, end, stop));
                }
            }
        }
        best
    }

    /// Byte offset where the longest suffix of `held` that is a proper prefix of a stop string
    /// begins; `held.len()` when there is none.
    fn partial_match_start(&self) -> usize {
        let longest_stop = self.stops.iter().map(String::len).max().unwrap_or(0);
        // A proper prefix is shorter than its stop string, so older bytes cannot be in one.
        let earliest = self
            .held
            .len()
            .saturating_sub(longest_stop.saturating_sub(1));
        (earliest..self.held.len())
            .filter(|&start| self.held.is_char_boundary(start))
            .find(|&start| {
                let suffix = &self.held[start..];
                self.stops
                    .iter()
                    .any(|stop| stop.len() > suffix.len() && stop.starts_with(suffix))
            })
            .unwrap_or(self.held.len())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn matcher(stops: &[&str]) -> StopStringMatcher {
        let stops: Vec<String> = stops.iter().map(|s| s.to_string()).collect();
        StopStringMatcher::new(&stops, false)
    }

    fn released(text: &str) -> StringMatch {
        StringMatch::Released(text.to_string())
    }

    #[test]
    fn earliest_ending_match_wins_regardless_of_token_split() {
        let mut whole = matcher(&["abcd", "bc"]);
        let outcome = whole.push("xabcd", true);
        let expected = StringMatch::Matched {
            text: "xa".to_string(),
            stop: "bc".to_string(),
        };
        assert_eq!(outcome, expected);

        let mut split = matcher(&["abcd", "bc"]);
        assert_eq!(split.push("xa", true), released("x"));
        assert_eq!(
            split.push("bcd", true),
            StringMatch::Matched {
                text: "a".to_string(),
                stop: "bc".to_string(),
            }
        );
    }

    #[test]
    fn hold_back_respects_char_boundaries() {
        let mut multi_byte = matcher(&["é!"]);
        assert_eq!(multi_byte.push("café", true), released("caf"));
        assert_eq!(multi_byte.push("?", true), released("é?"));
        assert_eq!(multi_byte.take_held(), "");
    }

    #[test]
    fn include_stop_in_output_keeps_the_stop_string() {
        let stops = vec!["END".to_string()];
        let mut including = StopStringMatcher::new(&stops, true);
        let outcome = including.push("done END trailing", true);
        assert_eq!(
            outcome,
            StringMatch::Matched {
                text: "done END".to_string(),
                stop: "END".to_string()
            }
        );
    }
}
