//! What the CLI's integration tests share: running the `starling` binary and reading its output.
#![allow(dead_code)] // Each test binary uses a different subset.

use std::process::{Command, Output};

/// Runs the `starling` binary built for these tests with `args`.
pub fn starling(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_starling"))
        .args(args)
        .output()
        .expect("run starling")
}

/// Runs the `starling` binary with `args` and the environment variables `envs` set.
pub fn starling_with_env(args: &[&str], envs: &[(&str, &std::ffi::OsStr)]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_starling"))
        .args(args)
        .envs(envs.iter().map(|(k, v)| (*k, *v)))
        .output()
        .expect("run starling")
}

/// Runs `starling <command> --device cpu --load-format synthetic --model <preset> <rest>`: a
/// preset's shapes with random weights, nothing to download.
pub fn synthetic_on_cpu(command: &str, preset: &str, rest: &[&str]) -> Output {
    let mut args = vec![
        command,
        "--device",
        "cpu",
        "--load-format",
        "synthetic",
        "--model",
        preset,
    ];
    args.extend_from_slice(rest);
    starling(&args)
}

/// The run's standard output, lossily decoded.
pub fn stdout(out: &Output) -> String {
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The run's standard error, lossily decoded.
pub fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Asserts a clean failure: exit code 1, an `error:` line containing `needle`, no panic.
pub fn assert_clean_failure(out: &Output, needle: &str) {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "stderr: {err}");
    assert!(err.contains("error:"), "stderr: {err}");
    assert!(
        err.to_lowercase().contains(&needle.to_lowercase()),
        "expected {needle:?} in: {err}"
    );
    assert!(!err.contains("panicked"), "panic: {err}");
}
