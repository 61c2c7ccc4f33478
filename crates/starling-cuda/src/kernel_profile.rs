//! Device time per launch site ([`starling_backend::KernelSiteTime`]): each launch bracketed by
//! two timing events on the stream, the pairs read back once they have completed.
//!
//! Off by default, and then one relaxed atomic load per launch. While on, launches are
//! serialised by the events (programmatic dependent launch cannot overlap a kernel with the
//! next), so the table measures each kernel alone; launches recorded into a CUDA graph are not
//! timed (an event of a recording would be a graph node, not a measurement).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, DriverError};
use starling_backend::KernelSiteTime;

/// Pending launches beyond which a new launch first waits for the oldest to complete, so a
/// profile never holds more than this many event pairs (a few MB of driver state).
const MAX_PENDING_LAUNCHES: usize = 16_384;

/// One timed launch whose events may not have completed yet.
struct PendingLaunch {
    site: Arc<str>,
    start: CudaEvent,
    end: CudaEvent,
}

/// Launches and summed device time of one site.
#[derive(Clone, Copy, Default)]
struct SiteTotals {
    launches: u64,
    gpu_time_ns: u64,
}

#[derive(Default)]
struct ProfileState {
    pending: VecDeque<PendingLaunch>,
    /// Events whose launch has been read, for reuse (creating one costs a driver call).
    free_events: Vec<CudaEvent>,
    totals: HashMap<Arc<str>, SiteTotals>,
}

/// The backend's launch timer.
#[derive(Default)]
pub(crate) struct KernelProfiler {
    enabled: AtomicBool,
    state: Mutex<ProfileState>,
}

/// A started launch: its site and start event, to be closed by [`KernelProfiler::end`].
pub(crate) struct LaunchTiming {
    site: Arc<str>,
    start: CudaEvent,
}

impl KernelProfiler {
    /// Starts timing launches (again from zero if it already ran).
    pub(crate) fn start(&self) {
        let mut state = self.lock();
        state.pending.clear();
        state.totals.clear();
        self.enabled.store(true, Ordering::Relaxed);
    }

    /// Whether launches are being timed.
    pub(crate) fn enabled(&self) -> bool {
        self.enabled.load(Ordering::Relaxed)
    }

    fn lock(&self) -> MutexGuard<'_, ProfileState> {
        // The state is counters and events: still usable after a panic elsewhere.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Records the start event of a launch of `site` on `stream`; `None` when not profiling.
    pub(crate) fn begin(
        &self,
        stream: &CudaStream,
        site: impl FnOnce() -> Arc<str>,
    ) -> Result<Option<LaunchTiming>, DriverError> {
        if !self.enabled() {
            return Ok(None);
        }
        let start = self.event(stream)?;
        start.record(stream)?;
        Ok(Some(LaunchTiming {
            site: site(),
            start,
        }))
    }

    /// Records the end event of a launch [`begin`](Self::begin) started.
    pub(crate) fn end(
        &self,
        stream: &CudaStream,
        timing: Option<LaunchTiming>,
    ) -> Result<(), DriverError> {
        let Some(LaunchTiming { site, start }) = timing else {
            return Ok(());
        };
        let end = self.event(stream)?;
        end.record(stream)?;
        let mut state = self.lock();
        state.pending.push_back(PendingLaunch { site, start, end });
        if state.pending.len() > MAX_PENDING_LAUNCHES {
            if let Some(oldest) = state.pending.front() {
                oldest.end.synchronize()?;
            }
        }
        Self::read_completed(&mut state)
    }

    /// A timing event, reused when one is free.
    fn event(&self, stream: &CudaStream) -> Result<CudaEvent, DriverError> {
        if let Some(event) = self.lock().free_events.pop() {
            return Ok(event);
        }
        stream
            .context()
            .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
    }

    /// Adds every completed launch at the front of the queue to its site's totals.
    fn read_completed(state: &mut ProfileState) -> Result<(), DriverError> {
        while state.pending.front().is_some_and(|p| p.end.is_complete()) {
            let Some(launch) = state.pending.pop_front() else {
                break;
            };
            let ms = launch.start.elapsed_ms(&launch.end)?;
            let totals = state.totals.entry(launch.site).or_default();
            totals.launches += 1;
            totals.gpu_time_ns += (f64::from(ms.max(0.0)) * 1e6).round() as u64;
            state.free_events.extend([launch.start, launch.end]);
        }
        Ok(())
    }

    /// Every site's totals over the launches completed so far, longest first.
    pub(crate) fn snapshot(&self) -> Result<Vec<KernelSiteTime>, DriverError> {
        let mut state = self.lock();
        Self::read_completed(&mut state)?;
        let mut sites: Vec<KernelSiteTime> = state
            .totals
            .iter()
            .map(|(site, t)| KernelSiteTime {
                site: site.to_string(),
                launches: t.launches,
                gpu_time_ns: t.gpu_time_ns,
            })
            .collect();
        sites.sort_by(|a, b| {
            b.gpu_time_ns
                .cmp(&a.gpu_time_ns)
                .then_with(|| a.site.cmp(&b.site))
        });
        Ok(sites)
    }
}
