//! A small mutation fuzzer that runs as an ordinary `cargo test` on stable Rust.
//!
//! cargo-fuzz needs a nightly compiler and libFuzzer; CI here runs stable on two cores, so each
//! parser gets a bounded, reproducible run instead: every committed seed of its corpus first
//! (regressions included), then mutations of those seeds — bit flips, interesting integers,
//! dictionary tokens, deleted, duplicated and spliced ranges; for JSON targets also structural
//! edits of the parsed value ([`json`]) — until the time or case budget is spent. There is no coverage feedback; inputs the target accepts join the pool, so mutations
//! walk deeper into valid structure. The random stream is seeded, so a run is reproducible up
//! to where the time budget cuts it.
//!
//! A panic in the target is a finding: the input is written to the artifacts directory and the
//! run fails with its path and a hex excerpt. So is a single case slower than
//! [`Budget::max_case_time`] (a hang in waiting). Fixed findings go into the corpus as seeds, and
//! each gets a named regression test.
//!
//! Environment: `STARLING_FUZZ_SECONDS` (time per target, default per call site),
//! `STARLING_FUZZ_CASES` (case cap), `STARLING_FUZZ_SEED`, `STARLING_FUZZ_ARTIFACTS` (default:
//! the system temp directory), `STARLING_FUZZ_TRACE=1` (write each input to
//! `<artifacts>/<target>-current` before running it: what was running when the process died,
//! e.g. killed for memory, which no panic handler sees).
#![deny(missing_docs)]

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

pub mod json;
mod mutate;
mod rng;

pub use mutate::Mutator;
pub use rng::SplitMix64;

/// Inputs the pool keeps besides the corpus seeds (accepted ones, replaced at random).
const POOL_EXTRA: usize = 256;
/// Bytes of a failing input shown in the failure message.
const HEX_EXCERPT_BYTES: usize = 96;

/// How long and how much one target runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Budget {
    /// Wall time for the mutation phase (seeds always run in full).
    pub time: Duration,
    /// Most mutated cases.
    pub max_cases: u64,
    /// One case taking longer than this is a finding.
    pub max_case_time: Duration,
    /// Seed of the random stream.
    pub seed: u64,
}

impl Budget {
    /// `default_time` of mutations, overridden by the environment (see the crate docs).
    pub fn from_env(default_time: Duration) -> Self {
        let var = |name: &str| {
            std::env::var(name)
                .ok()
                .and_then(|v| v.trim().parse::<f64>().ok())
        };
        Budget {
            time: var("STARLING_FUZZ_SECONDS")
                .and_then(|s| Duration::try_from_secs_f64(s).ok())
                .unwrap_or(default_time),
            max_cases: var("STARLING_FUZZ_CASES").map_or(u64::MAX, |c| c as u64),
            max_case_time: Duration::from_secs(5),
            seed: var("STARLING_FUZZ_SEED").map_or(0x5eed_2323, |s| s as u64),
        }
    }
}

/// What the target made of an input.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Parsed (or rendered) fine: the input joins the pool of inputs to mutate.
    Accepted,
    /// Refused with an error, as bad input should be.
    Rejected,
}

/// What a run did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Report {
    /// The target's name.
    pub target: String,
    /// Corpus seeds run.
    pub seeds: usize,
    /// Past findings replayed.
    pub regressions: usize,
    /// Mutated cases run.
    pub cases: u64,
    /// Of all inputs run, how many the target accepted.
    pub accepted: u64,
    /// Wall time of the whole run.
    pub elapsed: Duration,
    /// The slowest single case.
    pub slowest_case: Duration,
    /// The start of the slowest input, in hex (to look into a slow parser).
    pub slowest_input: String,
}

impl std::fmt::Display for Report {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "fuzz {}: {} seeds + {} regressions + {} cases in {:.1} s ({:.0} cases/s), {} accepted, slowest case {:.1} ms ({})",
            self.target,
            self.seeds,
            self.regressions,
            self.cases,
            self.elapsed.as_secs_f64(),
            self.cases as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.accepted,
            self.slowest_case.as_secs_f64() * 1e3,
            self.slowest_input
        )
    }
}

/// One fuzz target: its name, corpus and mutation dictionary.
#[derive(Debug, Clone)]
pub struct Target {
    name: String,
    corpus: PathBuf,
    mutator: Mutator,
    artifacts: Option<PathBuf>,
    /// Field names for structural JSON mutations; `None`: bytes only.
    json_keys: Option<Vec<&'static str>>,
    /// Inputs that once failed: replayed every run, never mutated (they may be slow by design).
    regressions: Option<PathBuf>,
}

impl Target {
    /// A target named `name` whose seeds are the files of `corpus` (read recursively, in name
    /// order).
    pub fn new(name: &str, corpus: impl Into<PathBuf>) -> Self {
        Target {
            name: name.to_owned(),
            corpus: corpus.into(),
            mutator: Mutator::default(),
            artifacts: None,
            json_keys: None,
            regressions: None,
        }
    }

    /// Past findings, replayed before the mutations (missing directory: none).
    pub fn regressions(mut self, dir: impl Into<PathBuf>) -> Self {
        self.regressions = Some(dir.into());
        self
    }

    /// Inputs are JSON: half the cases are structural edits of a parsed input ([`json`]),
    /// adding fields from `keys`.
    pub fn json(mut self, keys: &[&'static str]) -> Self {
        self.json_keys = Some(keys.to_vec());
        self
    }

    /// Where failing inputs are written (default: `$STARLING_FUZZ_ARTIFACTS`, else
    /// `starling-fuzz` in the system temp directory).
    pub fn artifacts_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.artifacts = Some(dir.into());
        self
    }

    /// Tokens that mutations insert or overwrite with (keywords, field names, magic numbers).
    pub fn dictionary(mut self, tokens: &[&[u8]]) -> Self {
        self.mutator = self.mutator.with_dictionary(tokens);
        self
    }

    /// Longest input a mutation may produce.
    pub fn max_len(mut self, bytes: usize) -> Self {
        self.mutator = self.mutator.with_max_len(bytes);
        self
    }

    /// Runs every seed, then mutations within `budget`, calling `run` on each input. Panics (a
    /// test failure) with the saved input when `run` panics or one case exceeds the budget's
    /// case time; returns the report otherwise.
    pub fn run(&self, budget: Budget, run: impl Fn(&[u8]) -> Verdict) -> Report {
        let started = Instant::now();
        let seeds = read_corpus(&self.corpus);
        assert!(
            !seeds.is_empty(),
            "fuzz {}: no seeds in {}",
            self.name,
            self.corpus.display()
        );
        let regressions = self
            .regressions
            .as_deref()
            .map(read_corpus)
            .unwrap_or_default();
        let mut report = Report {
            target: self.name.clone(),
            seeds: seeds.len(),
            regressions: regressions.len(),
            cases: 0,
            accepted: 0,
            elapsed: Duration::ZERO,
            slowest_case: Duration::ZERO,
            slowest_input: String::new(),
        };
        let mut pool: Vec<Vec<u8>> = Vec::with_capacity(seeds.len() + POOL_EXTRA);
        for (path, seed) in &seeds {
            let verdict = self.case(seed, &run, &mut report, &format!("seed {}", path.display()));
            report.accepted += u64::from(verdict == Verdict::Accepted);
            pool.push(seed.clone());
        }
        for (path, input) in &regressions {
            let what = format!("regression {}", path.display());
            let verdict = self.case(input, &run, &mut report, &what);
            report.accepted += u64::from(verdict == Verdict::Accepted);
        }
        let corpus_len = pool.len();
        let mut rng = SplitMix64::new(budget.seed);
        let mutation_started = Instant::now();
        while report.cases < budget.max_cases && mutation_started.elapsed() < budget.time {
            let base = &pool[rng.below(pool.len())];
            let other = &pool[rng.below(pool.len())];
            let structural = match &self.json_keys {
                Some(keys) if rng.one_in(2) => json::mutate(base, keys, &mut rng),
                _ => None,
            };
            let input = structural.unwrap_or_else(|| self.mutator.mutate(base, other, &mut rng));
            report.cases += 1;
            let what = format!("case {} (seed {:#x})", report.cases, budget.seed);
            let verdict = self.case(&input, &run, &mut report, &what);
            if report.slowest_case > budget.max_case_time {
                let path = self.save(&input);
                panic!(
                    "fuzz {}: {what} took {:?} (limit {:?}); input saved to {}",
                    self.name,
                    report.slowest_case,
                    budget.max_case_time,
                    path.display()
                );
            }
            if verdict == Verdict::Accepted {
                report.accepted += 1;
                if pool.len() < corpus_len + POOL_EXTRA {
                    pool.push(input);
                } else {
                    let slot = corpus_len + rng.below(POOL_EXTRA);
                    pool[slot] = input;
                }
            }
        }
        report.elapsed = started.elapsed();
        eprintln!("{report}");
        report
    }

    /// Runs one input, turning a panic into a test failure that names the saved input.
    fn case(
        &self,
        input: &[u8],
        run: &impl Fn(&[u8]) -> Verdict,
        report: &mut Report,
        what: &str,
    ) -> Verdict {
        if std::env::var_os("STARLING_FUZZ_TRACE").is_some() {
            let path = self.artifacts_path(&format!("{}-current", self.name));
            if let Err(e) = std::fs::write(&path, input) {
                eprintln!("cannot trace to {}: {e}", path.display());
            }
        }
        let started = Instant::now();
        let outcome = catch_unwind(AssertUnwindSafe(|| run(input)));
        let took = started.elapsed();
        if took > report.slowest_case {
            report.slowest_case = took;
            report.slowest_input = hex_excerpt(input);
        }
        match outcome {
            Ok(verdict) => verdict,
            Err(panic) => {
                let message = panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|s| (*s).to_owned()))
                    .unwrap_or_default();
                let path = self.save(input);
                panic!(
                    "fuzz {}: {what} panicked: {message}\n  input ({} bytes) saved to {}\n  starts {}",
                    self.name,
                    input.len(),
                    path.display(),
                    hex_excerpt(input)
                );
            }
        }
    }

    /// Writes a failing input where a developer can add it to the corpus.
    fn save(&self, input: &[u8]) -> PathBuf {
        let path = self.artifacts_path(&format!("{}-{:016x}", self.name, fnv1a(input)));
        if let Err(e) = std::fs::write(&path, input) {
            eprintln!("cannot save the failing input to {}: {e}", path.display());
        }
        path
    }

    /// `file` in the artifacts directory (created if need be).
    fn artifacts_path(&self, file: &str) -> PathBuf {
        let dir = self.artifacts.clone().unwrap_or_else(|| {
            std::env::var_os("STARLING_FUZZ_ARTIFACTS")
                .map_or_else(|| std::env::temp_dir().join("starling-fuzz"), PathBuf::from)
        });
        if let Err(e) = std::fs::create_dir_all(&dir) {
            eprintln!("cannot create {}: {e}", dir.display());
        }
        dir.join(file)
    }
}

/// Every file under `dir`, in path order.
fn read_corpus(dir: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut files = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if let Ok(bytes) = std::fs::read(&path) {
                files.push((path, bytes));
            }
        }
    }
    files.sort();
    files
}

fn hex_excerpt(input: &[u8]) -> String {
    let shown = &input[..input.len().min(HEX_EXCERPT_BYTES)];
    let hex: String = shown.iter().map(|b| format!("{b:02x}")).collect();
    if shown.len() < input.len() {
        format!("{hex}…")
    } else {
        hex
    }
}

/// FNV-1a, to name saved inputs by content.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn corpus(files: &[(&str, &[u8])]) -> tempdir::Dir {
        let dir = tempdir::Dir::new();
        for (name, bytes) in files {
            std::fs::write(dir.path().join(name), bytes).unwrap();
        }
        dir
    }

    mod tempdir {
        /// A directory removed on drop (no dependency for one test).
        pub struct Dir(std::path::PathBuf);

        impl Dir {
            pub fn new() -> Self {
                static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
                let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                let path = std::env::temp_dir()
                    .join(format!("starling-fuzz-test-{}-{n}", std::process::id()));
                std::fs::create_dir_all(&path).unwrap();
                Dir(path)
            }

            pub fn path(&self) -> &std::path::Path {
                &self.0
            }
        }

        impl Drop for Dir {
            fn drop(&mut self) {
                let _ = std::fs::remove_dir_all(&self.0);
            }
        }
    }

    fn budget(cases: u64) -> Budget {
        Budget {
            time: Duration::from_secs(10),
            max_cases: cases,
            max_case_time: Duration::from_secs(5),
            seed: 1,
        }
    }

    #[test]
    fn a_panicking_parser_is_found_and_its_input_saved() {
        let dir = corpus(&[("seed", b"GGUF\x03\x00\x00\x00")]);
        let artifacts = tempdir::Dir::new();
        let target = Target::new("panicky", dir.path())
            .dictionary(&[b"\xff\xff"])
            .artifacts_dir(artifacts.path());
        // Panics whenever the byte after the magic is 0xff: a mutation finds it quickly.
        let found = catch_unwind(AssertUnwindSafe(|| {
            target.run(budget(100_000), |input| {
                if input.len() > 4 && input[4] == 0xff {
                    panic!("boom");
                }
                Verdict::Rejected
            })
        }));
        let message = found
            .expect_err("the fuzzer must find the panic")
            .downcast_ref::<String>()
            .cloned()
            .unwrap();
        assert!(message.contains("panicked: boom"), "{message}");
        let saved = std::fs::read_dir(artifacts.path()).unwrap().count();
        assert_eq!(saved, 1, "{message}");
    }

    #[test]
    fn runs_are_reproducible_and_respect_the_case_budget() {
        let dir = corpus(&[("a", b"{\"n\": 1}"), ("b", b"[1, 2, 3]")]);
        let target = Target::new("json-ish", dir.path()).dictionary(&[b"null", b"\""]);
        let seen = |seed| {
            let inputs = std::sync::Mutex::new(Vec::new());
            let report = target.run(
                Budget {
                    seed,
                    ..budget(300)
                },
                |input| {
                    inputs.lock().unwrap().push(input.to_vec());
                    if input.first() == Some(&b'{') {
                        Verdict::Accepted
                    } else {
                        Verdict::Rejected
                    }
                },
            );
            assert_eq!(report.cases, 300);
            assert_eq!(report.seeds, 2);
            inputs.into_inner().unwrap()
        };
        assert_eq!(seen(7), seen(7));
        assert_ne!(seen(7), seen(8));
    }
}
