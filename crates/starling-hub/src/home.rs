//! Where the cache lives.

use std::ffi::OsString;
use std::path::{Path, PathBuf};

use crate::HubError;

/// Environment variable naming the cache root; overrides `$HOME/.cache/starling`.
pub const STARLING_HOME_ENV: &str = "STARLING_HOME";

/// The cache root: `starling_home` when set and non-empty, else `<home>/.cache/starling`.
///
/// Takes the two environment values as arguments (rather than reading the environment) so that
/// callers and tests decide where they come from; [`crate::FetchOptions::from_env`] passes the
/// real `STARLING_HOME` and `HOME`.
pub fn resolve_home(
    starling_home: Option<OsString>,
    home: Option<OsString>,
) -> Result<PathBuf, HubError> {
    if let Some(dir) = starling_home.filter(|value| !value.is_empty()) {
        return Ok(PathBuf::from(dir));
    }
    match home.filter(|value| !value.is_empty()) {
        Some(home) => Ok(PathBuf::from(home).join(".cache").join("starling")),
        None => Err(HubError::NoHomeDir),
    }
}

/// The directory holding one model's cached file and marker: `<home>/models/<alias>`.
pub(crate) fn model_dir(home: &Path, alias: &str) -> PathBuf {
    home.join("models").join(alias)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn starling_home_wins_over_home() {
        let dir = resolve_home(Some("store-dir".into()), Some("user-dir".into())).unwrap();
        assert_eq!(dir, PathBuf::from("store-dir"));
    }

    #[test]
    fn home_gives_dot_cache_starling() {
        let dir = resolve_home(None, Some("user-dir".into())).unwrap();
        assert_eq!(
            dir,
            PathBuf::from("user-dir").join(".cache").join("starling")
        );
        let dir = resolve_home(Some("".into()), Some("user-dir".into())).unwrap();
        assert_eq!(
            dir,
            PathBuf::from("user-dir").join(".cache").join("starling")
        );
    }

    #[test]
    fn neither_set_is_a_clear_error() {
        let err = resolve_home(None, Some("".into())).unwrap_err();
        assert!(matches!(err, HubError::NoHomeDir));
        assert!(err.to_string().contains("STARLING_HOME"));
    }
}
