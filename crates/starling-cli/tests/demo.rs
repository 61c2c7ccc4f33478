//! `starling demo` end to end on the CPU: the prompts run plain, with token eviction and with
//! STAR-KV latents on one KV budget; the STAR-KV checkpoint is calibrated on the first run,
//! cached under `$STARLING_HOME` and reused by the next; the latent arm gets more blocks.

use std::path::{Path, PathBuf};
use std::process::Output;

mod common;

use common::{assert_clean_failure, starling, starling_with_env, stderr, stdout, synthetic_on_cpu};

/// One row of the demo's summary table.
#[derive(Debug)]
struct SummaryRow {
    arm: String,
    blocks: usize,
    free_at_peak: usize,
    longest_context: usize,
}

/// The rows of the `| arm | … |` table at the end of the demo's output.
fn summary_rows(text: &str) -> Vec<SummaryRow> {
    text.lines()
        .filter(|l| l.starts_with("| ") && !l.starts_with("| arm "))
        .map(|line| {
            let cells: Vec<&str> = line.split('|').map(str::trim).collect();
            // ["", arm, KV per token, blocks, held at peak, held when done, free at peak,
            //  longest context, ""]
            SummaryRow {
                arm: cells[1].to_owned(),
                blocks: cells[3].parse().expect("blocks"),
                free_at_peak: cells[6].parse().expect("free blocks"),
                longest_context: cells[7].parse().expect("longest context"),
            }
        })
        .collect()
}

/// A `$STARLING_HOME` of its own whose models and essays are the real cache's (linked, not
/// copied), so the demo's checkpoint is calibrated here and nowhere else.
fn private_home() -> tempfile::TempDir {
    let real = starling_hub::resolve_home(
        std::env::var_os(starling_hub::STARLING_HOME_ENV),
        std::env::var_os("HOME"),
    )
    .expect("a STARLING_HOME");
    let home = tempfile::tempdir().unwrap();
    for dir in ["models", "datasets"] {
        // On a fresh machine the real cache may not have fetched the essays yet: a link to a
        // missing directory would make the fetch fail instead of filling the real cache.
        std::fs::create_dir_all(real.join(dir)).unwrap();
        std::os::unix::fs::symlink(real.join(dir), home.path().join(dir)).unwrap();
    }
    home
}

fn demo(home: &Path, extra: &[&str]) -> Output {
    // The demo's own budget: full K/V for 1.5 contexts of 2048 tokens.
    let mut args = vec!["demo", "--device", "cpu", "--max-tokens", "12"];
    args.extend_from_slice(extra);
    starling_with_env(&args, &[("STARLING_HOME", home.as_os_str())])
}

fn checkpoint_dirs(home: &Path) -> Vec<PathBuf> {
    let root = home.join("star-kv");
    let Ok(models) = std::fs::read_dir(&root) else {
        return Vec::new();
    };
    models
        .flat_map(|m| std::fs::read_dir(m.unwrap().path()).unwrap())
        .map(|r| r.unwrap().path())
        .collect()
}

#[test]
fn demo_runs_three_arms_on_one_budget_and_calibrates_star_kv_once() {
    let home = private_home();
    let first = demo(home.path(), &[]);
    let text = stdout(&first);
    assert!(first.status.success(), "stderr: {}", stderr(&first));
    assert!(
        stderr(&first).contains("STAR-KV: calibrating a balanced checkpoint for smollm2-135m"),
        "stderr: {}",
        stderr(&first)
    );
    assert!(text.contains("calibrated now in"), "{text}");
    for header in [
        "== plain (full K/V): full K/V in f32",
        "== eviction (keydiff at ratio 0.5, every 16 tokens): full K/V in f32",
        "== STAR-KV (balanced latents): STAR-KV latents (balanced, checkpoint `whitened-svd-4096`; 27 of 30 layers",
    ] {
        assert!(text.contains(header), "{header:?} missing from:\n{text}");
    }
    // Every arm answers every prompt; the real model still knows its capitals.
    assert_eq!(text.matches("> What is the capital of France?").count(), 3);
    assert!(text.contains("Paris"), "{text}");
    // 3072 tokens × 45 KiB.
    assert!(
        text.contains("Same KV budget for every arm: 135.00 MiB"),
        "{text}"
    );
    let rows = summary_rows(&text);
    let arms: Vec<&str> = rows.iter().map(|r| r.arm.as_str()).collect();
    assert_eq!(arms, ["plain", "eviction", "STAR-KV"], "{text}");
    let (plain, eviction, star_kv) = (&rows[0], &rows[1], &rows[2]);
    // 3072 tokens of full K/V in 16-token blocks; the latents are 12% smaller per token.
    assert_eq!(plain.blocks, 192, "{text}");
    assert_eq!(plain.longest_context, 3072, "{text}");
    assert_eq!(eviction.blocks, plain.blocks, "eviction keeps the layout");
    assert!(star_kv.blocks > plain.blocks, "{rows:?}");
    assert!(star_kv.free_at_peak > plain.free_at_peak, "{rows:?}");
    // The same memory boots a longer latent context.
    assert!(star_kv.longest_context > plain.longest_context, "{rows:?}");
    let dirs = checkpoint_dirs(home.path());
    assert_eq!(dirs.len(), 1, "{dirs:?}");
    assert!(dirs[0].join("balanced/manifest.json").is_file());

    // The second run finds the checkpoint and calibrates nothing.
    let second = demo(home.path(), &[]);
    assert!(second.status.success(), "stderr: {}", stderr(&second));
    assert!(
        !stderr(&second).contains("calibrating"),
        "{}",
        stderr(&second)
    );
    assert!(
        stdout(&second).contains("cached, reused"),
        "{}",
        stdout(&second)
    );
    let again = summary_rows(&stdout(&second));
    assert_eq!(again[2].blocks, star_kv.blocks);
    assert_eq!(checkpoint_dirs(home.path()), dirs);
}

#[test]
fn demo_on_a_synthetic_preset_runs_random_latents_and_refuses_kv_compression() {
    let out = synthetic_on_cpu("demo", "smollm2-135m", &["--max-tokens", "2"]);
    let text = stdout(&out);
    assert!(out.status.success(), "stderr: {}", stderr(&out));
    // Share 0.5 of SmolLM2's 3 × 64: key rank 32 per head, value rank 96, in all 30 layers.
    assert!(
        text.contains("== STAR-KV (synthetic latents at share 0.5): synthetic latents (30 of 30 layers, key rank 32 per head, value rank 96)"),
        "{text}"
    );
    let rows = summary_rows(&text);
    assert_eq!(rows.len(), 3, "{text}");
    // (3 × 32 + 96) × 4 + 4 = 772 bytes a layer against 1536: about twice the blocks.
    assert_eq!(rows[0].blocks, 192, "{rows:?}");
    assert_eq!(rows[2].blocks, 382, "{rows:?}");

    let out = starling(&[
        "demo",
        "--kv-compression",
        r#"{"method":"keydiff","ratio":0.5}"#,
    ]);
    assert_clean_failure(&out, "--eviction");
    let out = starling(&["demo", "--eviction", r#"{"method":"none"}"#]);
    assert_eq!(out.status.code(), Some(2), "stderr: {}", stderr(&out));
    assert!(stderr(&out).contains("evicts"), "stderr: {}", stderr(&out));
}
