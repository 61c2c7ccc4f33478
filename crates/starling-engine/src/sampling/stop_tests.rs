//! StopChecker behaviour on streamed tokens.

use super::*;

const EOS: u32 = 2;
const NO_LIMIT: usize = 1_000;

fn checker(params: &SamplingParams, max_output_tokens: usize) -> StopChecker {
    StopChecker::new(params, &[EOS], max_output_tokens)
}

fn with_stop(stops: &[&str]) -> SamplingParams {
    SamplingParams {
        stop: stops.iter().map(|s| s.to_string()).collect(),
        ..SamplingParams::default()
    }
}

/// Feeds `(token, text)` pairs and returns the streamed text of each update.
fn stream(checker: &mut StopChecker, tokens: &[(u32, &str)]) -> Vec<String> {
    tokens
        .iter()
        .map(|&(token_id, text)| checker.push(token_id, text).text)
        .collect()
}

fn stopped_by(stop_match: StopMatch) -> Option<Finished> {
    Some(Finished {
        reason: FinishReason::Stop,
        stop_match: Some(stop_match),
    })
}

#[test]
fn stop_string_split_across_three_tokens_is_cut_off() {
    let mut stops = checker(&with_stop(&["STOP"]), NO_LIMIT);
    let emitted = stream(
        &mut stops,
        &[(10, "Hello S"), (11, "TO"), (12, "P and more")],
    );
    assert_eq!(emitted, vec!["Hello ", "", ""]);
    assert_eq!(
        stops.finished().cloned(),
        stopped_by(StopMatch::StopString("STOP".to_string()))
    );
    assert_eq!(stops.flush(), "");
}

#[test]
fn held_back_text_is_released_when_the_match_fails() {
    let mut stops = checker(&with_stop(&["STOP"]), NO_LIMIT);
    let emitted = stream(&mut stops, &[(10, "a ST"), (11, "O"), (12, "OP!")]);
    assert_eq!(emitted, vec!["a ", "", "STOOP!"]);
    assert_eq!(stops.finished(), None);
}

#[test]
fn stop_string_inside_one_token_emits_text_before_it() {
    let mut stops = checker(&with_stop(&["\n\n", "###"]), NO_LIMIT);
    let update = stops.push(10, "end.###\n\nrest");
    assert_eq!(update.text, "end.");
    assert_eq!(
        update.finished,
        stopped_by(StopMatch::StopString("###".to_string()))
    );
    // Further pushes emit nothing and repeat the finish.
    let after = stops.push(11, "more");
    assert_eq!(after.text, "");
    assert_eq!(after.finished, update.finished);
    assert_eq!(stops.generated_tokens(), 1);
}

#[test]
fn eos_stops_without_emitting_its_text_unless_ignored() {
    let mut stops = checker(&with_stop(&["STOP"]), NO_LIMIT);
    // The held "ST" is released because the sequence ended by EOS, not by the stop string.
    assert_eq!(stream(&mut stops, &[(10, "x ST")]), vec!["x "]);
    let update = stops.push(EOS, "</s>");
    assert_eq!(update.text, "ST");
    assert_eq!(update.finished, stopped_by(StopMatch::EosToken));

    let ignoring = SamplingParams {
        ignore_eos: true,
        ..SamplingParams::default()
    };
    let mut ignores = checker(&ignoring, NO_LIMIT);
    let update = ignores.push(EOS, "</s>");
    assert_eq!(update.text, "</s>");
    assert_eq!(update.finished, None);
}

#[test]
fn stop_token_ids_report_which_id() {
    let params = SamplingParams {
        stop_token_ids: vec![42],
        ..SamplingParams::default()
    };
    let mut stops = checker(&params, NO_LIMIT);
    assert_eq!(stops.push(10, "a").finished, None);
    let update = stops.push(42, "<|im_end|>");
    assert_eq!(update.text, "");
    assert_eq!(update.finished, stopped_by(StopMatch::StopTokenId(42)));
}

#[test]
fn include_stop_str_in_output_emits_stop_token_text() {
    let params = SamplingParams {
        stop_token_ids: vec![42],
        include_stop_str_in_output: true,
        ..SamplingParams::default()
    };
    let mut stops = checker(&params, NO_LIMIT);
    assert_eq!(stops.push(42, "<|im_end|>").text, "<|im_end|>");
}

#[test]
fn min_tokens_suppresses_every_stop_until_reached() {
    let params = SamplingParams {
        min_tokens: 3,
        stop_token_ids: vec![42],
        ..with_stop(&["!"])
    };
    let mut stops = checker(&params, NO_LIMIT);
    let first = stops.push(EOS, "A");
    let second = stops.push(42, "!");
    assert_eq!((first.text.as_str(), first.finished), ("A", None));
    assert_eq!((second.text.as_str(), second.finished), ("!", None));
    // The third token reaches min_tokens, so its stop string ends the sequence.
    let third = stops.push(10, "b!");
    assert_eq!(third.text, "b");
    assert_eq!(
        third.finished,
        stopped_by(StopMatch::StopString("!".to_string()))
    );
}

#[test]
fn max_tokens_finishes_with_length_and_releases_held_text() {
    let mut stops = checker(&with_stop(&["STOP"]), 2);
    assert_eq!(stops.push(10, "a").finished, None);
    let last = stops.push(11, " ST");
    assert_eq!(last.text, " ST");
    assert_eq!(
        last.finished,
        Some(Finished {
            reason: FinishReason::Length,
            stop_match: None
        })
    );
    assert_eq!(FinishReason::Length.as_str(), "length");
}

#[test]
fn stop_on_the_last_allowed_token_reports_stop_not_length() {
    let mut stops = checker(&SamplingParams::default(), 1);
    assert_eq!(
        stops.push(EOS, "").finished,
        stopped_by(StopMatch::EosToken)
    );
}

#[test]
fn flush_releases_held_text_on_abort() {
    let mut stops = checker(&with_stop(&["STOP"]), NO_LIMIT);
    assert_eq!(stops.push(10, "so S").text, "so ");
    assert_eq!(stops.flush(), "S");
    assert_eq!(stops.flush(), "");
}

#[test]
fn finish_reason_serialises_as_openai_string() {
    let json = serde_json::to_string(&FinishReason::Stop).unwrap();
    assert_eq!(json, "\"stop\"");
    assert_eq!(FinishReason::Abort.as_str(), "abort");
}
