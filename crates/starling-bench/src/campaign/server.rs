//! A server child process: started from a command line in its own process group (so a server
//! that forks workers, as vLLM does, is stopped whole), its output logged to a file, waited on
//! until `/health` answers, and stopped by SIGTERM then SIGKILL to the group.

use std::fs::File;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::error::BenchError;

/// Lines of the log a refused boot reports.
const LOG_TAIL_LINES: usize = 12;
/// How often a booting server is polled.
const POLL_PERIOD: Duration = Duration::from_millis(250);
/// How long a stopping server gets between SIGTERM and SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(10);

/// A started server; dropping it stops the process group.
#[derive(Debug)]
pub struct ServerProcess {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub base_url: String,
    /// Where its stdout and stderr go.
    pub log_path: PathBuf,
    stopped: bool,
}

/// How a boot ended.
#[derive(Debug)]
pub enum BootOutcome {
    /// `/health` answered 200.
    Up(ServerProcess),
    /// The process exited first: its status and the last lines of its log.
    Exited {
        /// Exit status as text.
        status: String,
        /// The log's last lines.
        log_tail: String,
    },
    /// Neither within the timeout (the process has been stopped).
    TimedOut {
        /// The log's last lines.
        log_tail: String,
    },
}

/// The last `lines` non-empty lines of the file at `path` (empty when unreadable).
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read(path)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_default();
    let kept: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    kept[kept.len().saturating_sub(lines)..].join("\n")
}

impl ServerProcess {
    /// Runs `command_line` with `sh -c` (`exec`, so the shell becomes the server) in a new
    /// process group, output to `log_path`, listening on `port`.
    pub fn spawn(command_line: &str, port: u16, log_path: &Path) -> Result<Self, BenchError> {
        let log = File::create(log_path).map_err(|e| BenchError::io(log_path, e))?;
        let log_err = log.try_clone().map_err(|e| BenchError::io(log_path, e))?;
        let child = Command::new("sh")
            .arg("-c")
            .arg(format!("exec {command_line}"))
            .stdin(Stdio::null())
            .stdout(log)
            .stderr(log_err)
            .process_group(0)
            .spawn()
            .map_err(|e| BenchError::io(Path::new("sh"), e))?;
        Ok(ServerProcess {
            child,
            base_url: format!("http://127.0.0.1:{port}"),
            log_path: log_path.to_owned(),
            stopped: false,
        })
    }

    /// Waits until `/health` answers 200, the process exits, or `timeout` passes.
    pub async fn wait_until_up(mut self, timeout: Duration) -> BootOutcome {
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .unwrap_or_default();
        let health = format!("{}/health", self.base_url);
        let started = Instant::now();
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                self.stopped = true;
                return BootOutcome::Exited {
                    status: status.to_string(),
                    log_tail: log_tail(&self.log_path, LOG_TAIL_LINES),
                };
            }
            if let Ok(response) = http.get(&health).send().await {
                if response.status().is_success() {
                    return BootOutcome::Up(self);
                }
            }
            if started.elapsed() >= timeout {
                self.stop().await;
                return BootOutcome::TimedOut {
                    log_tail: log_tail(&self.log_path, LOG_TAIL_LINES),
                };
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
    }

    /// Whether the process is still running.
    pub fn is_running(&mut self) -> bool {
        !self.stopped && matches!(self.child.try_wait(), Ok(None))
    }

    fn signal_group(&self, signal: i32) {
        let Ok(pid) = i32::try_from(self.child.id()) else {
            return;
        };
        // SAFETY: kill(2) with a negative pid signals the process group the child leads
        // (created by `process_group(0)` at spawn); it touches no memory of ours.
        unsafe {
            libc::kill(-pid, signal);
        }
    }

    /// SIGTERM to the group, SIGKILL after a grace period, then waits for the leader.
    pub async fn stop(&mut self) {
        if self.stopped {
            return;
        }
        self.signal_group(libc::SIGTERM);
        let started = Instant::now();
        while started.elapsed() < STOP_GRACE {
            if !matches!(self.child.try_wait(), Ok(None)) {
                break;
            }
            tokio::time::sleep(POLL_PERIOD).await;
        }
        // Workers the leader left behind go too.
        self.signal_group(libc::SIGKILL);
        let _ = self.child.wait();
        self.stopped = true;
    }
}

impl Drop for ServerProcess {
    fn drop(&mut self) {
        if !self.stopped {
            self.signal_group(libc::SIGKILL);
            let _ = self.child.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_command_that_exits_is_a_refused_boot_with_its_last_lines() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("boot.log");
        let server = ServerProcess::spawn(
            "sh -c 'echo starting; echo >&2 error: KV budget too small; exit 3'",
            1,
            &log,
        )
        .unwrap();
        match server.wait_until_up(Duration::from_secs(20)).await {
            BootOutcome::Exited { status, log_tail } => {
                assert!(status.contains('3'), "{status}");
                assert!(
                    log_tail.contains("error: KV budget too small"),
                    "{log_tail}"
                );
                assert!(log_tail.contains("starting"), "{log_tail}");
            }
            other => panic!("expected an exit, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn a_server_that_never_answers_times_out_and_is_stopped_with_its_children() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("boot.log");
        let pid_file = dir.path().join("child.pid");
        // The leader forks a worker that would outlive it without the group kill.
        let command = format!("sh -c 'sleep 300 & echo $! > {}; wait'", pid_file.display());
        let server = ServerProcess::spawn(&command, 1, &log).unwrap();
        let outcome = server.wait_until_up(Duration::from_millis(800)).await;
        assert!(
            matches!(outcome, BootOutcome::TimedOut { .. }),
            "{outcome:?}"
        );
        let worker: i32 = std::fs::read_to_string(&pid_file)
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        // Reaped or a zombie of init: either way no longer a live `sleep` of ours.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let alive = unsafe { libc::kill(worker, 0) } == 0
            && std::fs::read_to_string(format!("/proc/{worker}/stat"))
                .map(|s| !s.contains(") Z "))
                .unwrap_or(false);
        assert!(!alive, "the worker {worker} survived the group kill");
    }
}
