//! The small file written next to a verified model so later starts need not rehash it.
//!
//! Format: one line, `<sha256 hex> <size_bytes>`. The marker is trusted only when its hash equals
//! the registry's and both its size and the file's current size equal the registry's size; any
//! other state means "verify again" (or re-fetch on a size mismatch).

use std::fs;
use std::path::{Path, PathBuf};

use crate::HubError;

/// The marker path for a cached model file: `<file>.sha256`.
pub(crate) fn marker_path(model_path: &Path) -> PathBuf {
    let mut name = model_path.as_os_str().to_owned();
    name.push(".sha256");
    PathBuf::from(name)
}

/// True when the marker exists and vouches for exactly this hash and size.
pub(crate) fn marker_matches(model_path: &Path, sha256: &str, size_bytes: u64) -> bool {
    let Ok(text) = fs::read_to_string(marker_path(model_path)) else {
        return false;
    };
    let mut fields = text.split_whitespace();
    let (Some(hash), Some(size)) = (fields.next(), fields.next()) else {
        return false;
    };
    hash.eq_ignore_ascii_case(sha256) && size.parse::<u64>().ok() == Some(size_bytes)
}

/// Writes the marker atomically (temp file, then rename) so a crash never leaves half a marker.
pub(crate) fn write_marker(
    model_path: &Path,
    sha256: &str,
    size_bytes: u64,
) -> Result<(), HubError> {
    let marker = marker_path(model_path);
    let mut temp = marker.as_os_str().to_owned();
    temp.push(format!(".tmp-{}", std::process::id()));
    let temp = PathBuf::from(temp);
    fs::write(&temp, format!("{sha256} {size_bytes}\n"))
        .map_err(|e| HubError::io("write checksum marker", &temp, e))?;
    fs::rename(&temp, &marker).map_err(|e| {
        let _ = fs::remove_file(&temp);
        HubError::io("move checksum marker into place", &marker, e)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marker_round_trip_and_mismatches() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        assert!(!marker_matches(&model, "ab", 3));
        write_marker(&model, "ab", 3).unwrap();
        assert_eq!(marker_path(&model), dir.path().join("m.gguf.sha256"));
        assert!(marker_matches(&model, "ab", 3));
        assert!(marker_matches(&model, "AB", 3));
        assert!(!marker_matches(&model, "ab", 4));
        assert!(!marker_matches(&model, "cd", 3));
        fs::write(marker_path(&model), "garbage").unwrap();
        assert!(!marker_matches(&model, "ab", 3));
    }
}
