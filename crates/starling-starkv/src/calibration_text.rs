//! Which calibration tokens the model sees: fixed-length windows spread evenly over a token
//! stream (the essays not held out), so the statistics cover every part of the text, not only
//! its first essays, and the choice is a pure function of the stream and two numbers.

use crate::StarKvError;

/// `⌈total_tokens / window_tokens⌉` windows of exactly `window_tokens` ids each, taken from the
/// `⌊stream.len() / window_tokens⌋` non-overlapping chunks of `stream` at evenly spaced chunk
/// indices `⌊i · chunks / windows⌋` (so consecutive chunks when the text is just long enough).
pub fn calibration_windows(
    stream: &[u32],
    window_tokens: usize,
    total_tokens: usize,
) -> Result<Vec<Vec<u32>>, StarKvError> {
    if window_tokens == 0 || total_tokens == 0 {
        return Err(StarKvError::InvalidArgument(format!(
            "calibration needs tokens: {total_tokens} in windows of {window_tokens}"
        )));
    }
    let windows = total_tokens.div_ceil(window_tokens);
    let chunks = stream.len() / window_tokens;
    if windows > chunks {
        return Err(StarKvError::InvalidArgument(format!(
            "{windows} calibration windows of {window_tokens} tokens need {} tokens of text, \
             only {} are available",
            windows * window_tokens,
            stream.len()
        )));
    }
    Ok((0..windows)
        .map(|i| {
            let start = i * chunks / windows * window_tokens;
            stream[start..start + window_tokens].to_vec()
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_are_evenly_spaced_full_chunks() {
        let stream: Vec<u32> = (0..100).collect();
        // 10 chunks of 10, 3 windows: chunks 0, 3, 6.
        let windows = calibration_windows(&stream, 10, 25).unwrap();
        let starts: Vec<u32> = windows.iter().map(|w| w[0]).collect();
        assert_eq!(starts, vec![0, 30, 60]);
        assert!(windows.iter().all(|w| w.len() == 10));
        assert!(windows
            .iter()
            .all(|w| w.windows(2).all(|p| p[1] == p[0] + 1)));

        // Exactly enough text: every chunk, in order.
        let all = calibration_windows(&stream, 10, 100).unwrap();
        assert_eq!(all.concat(), stream);
    }

    #[test]
    fn too_little_text_and_empty_requests_are_errors() {
        let stream: Vec<u32> = (0..95).collect();
        let err = calibration_windows(&stream, 10, 100).unwrap_err();
        assert!(err.to_string().contains("only 95"), "{err}");
        assert!(calibration_windows(&stream, 0, 10).is_err());
        assert!(calibration_windows(&stream, 10, 0).is_err());
    }
}
