//! Per-launch-site GPU time, for a breakdown of where a serving run's device time goes (the
//! seed's torch.profiler table: calls, share, time per call).
//!
//! A backend that can time its launches ([`crate::BackendCore::start_kernel_profile`]) brackets
//! each one with a pair of timing events and sums the elapsed time per site: a kernel by its
//! function name, a cuBLAS call by its operation and weight shape. Figures are cumulative since
//! the profile started, so a client diffs two snapshots to get one workload's share.

use serde::{Deserialize, Serialize};

/// Cumulative device time of one launch site.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct KernelSiteTime {
    /// The kernel's function name, or `cublas:<op> <n>x<k>` for a library call.
    pub site: String,
    /// Launches timed.
    pub launches: u64,
    /// Device time between each launch's start and end events, summed, nanoseconds.
    pub gpu_time_ns: u64,
}
