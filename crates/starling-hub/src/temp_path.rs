//! A path that is deleted when the guard drops, unless the work using it succeeded.
//!
//! Every failure path of a fetch must leave no half-written file and no wheel directory behind;
//! tying the cleanup to `Drop` makes that hold for early returns via `?` too.

use std::fs;
use std::path::{Path, PathBuf};

/// Removes a file or a directory tree on drop unless [`RemoveOnDrop::keep`] was called.
#[derive(Debug)]
pub(crate) struct RemoveOnDrop {
    path: PathBuf,
    armed: bool,
}

impl RemoveOnDrop {
    /// Guards `path` (which may not exist yet).
    pub(crate) fn new(path: PathBuf) -> Self {
        RemoveOnDrop { path, armed: true }
    }

    /// The guarded path.
    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Stops the guard from deleting the path (it was renamed into place or is wanted).
    pub(crate) fn keep(mut self) {
        self.armed = false;
    }
}

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        // Cleanup is best effort: the path may never have been created.
        if self.path.is_dir() {
            let _ = fs::remove_dir_all(&self.path);
        } else {
            let _ = fs::remove_file(&self.path);
        }
    }
}

/// A name unique to this process and moment, for temp paths next to their final place.
pub(crate) fn unique_suffix() -> String {
    let nanos = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos())
        .unwrap_or(0);
    format!("{}-{nanos}", std::process::id())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_unless_kept() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("f");
        fs::write(&file, b"x").unwrap();
        drop(RemoveOnDrop::new(file.clone()));
        assert!(!file.exists());

        let sub = dir.path().join("d");
        fs::create_dir_all(sub.join("inner")).unwrap();
        drop(RemoveOnDrop::new(sub.clone()));
        assert!(!sub.exists());

        fs::write(&file, b"x").unwrap();
        RemoveOnDrop::new(file.clone()).keep();
        assert!(file.exists());
    }
}
