//! Device time per launch site ([`starling_backend::KernelSiteTime`]): each launch bracketed by
//! two timing events on the stream, the pairs read back once they have completed.
//!
//! Off by default, and then one relaxed atomic load per launch. While on, launches are
//! serialised by the events (programmatic dependent launch cannot overlap a kernel with the
//! next), so the table measures each kernel alone; launches recorded into a CUDA graph are not
//! timed (an event of a recording would be a graph node, not a measurement). Each site waits
//! at a host gate ([`crate::profile_gate`]) until it is issued, so host work inside a site is not
//! counted as device time; where the gate cannot be made, sites are timed without it (logged
//! once). Library calls (cuBLAS, cuBLASLt) are never gated: their lazy kernel loads wait for the
//! context, which a closed gate holds (`CudaBackend::profiled_library`).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use cudarc::driver::sys::CUevent_flags;
use cudarc::driver::{CudaEvent, CudaStream, DriverError};
use starling_backend::KernelSiteTime;

use crate::profile_gate::{gate_wanted, HostGate};

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
    gate: GateState,
}

/// The host gate, made at the first timed launch (it needs the stream's context).
#[derive(Default)]
enum GateState {
    /// Not tried yet.
    #[default]
    Untried,
    /// Sites wait at it.
    Ready(HostGate),
    /// A wait on it failed: opened for good and kept (earlier waits may still read it) but
    /// not used again.
    Broken(#[allow(dead_code, reason = "held only to keep the word alive")] HostGate),
    /// Off (`STARLING_PROFILE_GATE=0`) or could not be made: sites are timed without it.
    Off,
}

impl Drop for ProfileState {
    fn drop(&mut self) {
        // The gate's word is freed with the state: let the last timed launch (after the last
        // wait on the gate, which `end` opened) complete first.
        if let Some(last) = self.pending.back() {
            let _ = last.end.synchronize();
        }
    }
}

/// The backend's launch timer.
#[derive(Default)]
pub(crate) struct KernelProfiler {
    enabled: AtomicBool,
    state: Mutex<ProfileState>,
}

/// A started launch: its site and start event, to be closed by [`KernelProfiler::end`].
pub(crate) struct LaunchTiming<'p> {
    site: Arc<str>,
    start: CudaEvent,
    gate: GateRelease<'p>,
}

/// Opens a site's wait on the gate when dropped: at the end of the site, and on every path
/// out of it (an error, a panic in the launch), since a gate left closed holds the stream
/// for good.
struct GateRelease<'p> {
    profiler: &'p KernelProfiler,
    /// The value the site's wait holds the stream at; `None` for an ungated site.
    value: Option<u32>,
}

impl Drop for GateRelease<'_> {
    fn drop(&mut self) {
        let Some(value) = self.value else { return };
        if let GateState::Ready(gate) = &mut self.profiler.lock().gate {
            gate.open(value);
        }
    }
}

impl KernelProfiler {
    /// Starts timing launches (again from zero if it already ran).
    pub(crate) fn start(&self) {
        let mut state = self.lock();
        // Launches still in flight may wait on the gate: let them finish before forgetting them.
        if let Some(last) = state.pending.back() {
            let _ = last.end.synchronize();
        }
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

    /// Records the start event of a launch of `site` on `stream`, held at the host gate if
    /// `gated` (our own kernels; not library calls, see `CudaBackend::profiled_library`);
    /// `None` when not profiling.
    pub(crate) fn begin(
        &self,
        stream: &CudaStream,
        site: impl FnOnce() -> Arc<str>,
        gated: bool,
    ) -> Result<Option<LaunchTiming<'_>>, DriverError> {
        if !self.enabled() {
            return Ok(None);
        }
        let start = self.event(stream)?;
        let gate = GateRelease {
            profiler: self,
            value: if gated { self.close_gate(stream) } else { None },
        };
        start.record(stream)?;
        Ok(Some(LaunchTiming {
            site: site(),
            start,
            gate,
        }))
    }

    /// Enqueues the gate's wait (made on first use); `None` when sites run ungated.
    fn close_gate(&self, stream: &CudaStream) -> Option<u32> {
        let mut state = self.lock();
        if matches!(state.gate, GateState::Untried) {
            state.gate = if !gate_wanted() {
                GateState::Off
            } else {
                match HostGate::new(stream) {
                    Ok(gate) => GateState::Ready(gate),
                    Err(e) => {
                        tracing::warn!(
                            "kernel profile: no host gate ({e}); sites are timed without it, \
                             so host time inside a site may be counted"
                        );
                        GateState::Off
                    }
                }
            };
        }
        let GateState::Ready(gate) = &mut state.gate else {
            return None;
        };
        match gate.close(stream) {
            Ok(value) => Some(value),
            Err(e) => {
                tracing::warn!("kernel profile: the host gate's wait failed ({e}); ungated now");
                gate.open_all();
                if let GateState::Ready(gate) = std::mem::take(&mut state.gate) {
                    state.gate = GateState::Broken(gate);
                }
                None
            }
        }
    }

    /// Records the end event of a launch [`begin`](Self::begin) started.
    pub(crate) fn end(
        &self,
        stream: &CudaStream,
        timing: Option<LaunchTiming<'_>>,
    ) -> Result<(), DriverError> {
        let Some(LaunchTiming { site, start, gate }) = timing else {
            return Ok(());
        };
        let end = self.event(stream)?;
        end.record(stream)?;
        // The site is issued: let the device run it (an error above opens it too, by drop).
        drop(gate);
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
