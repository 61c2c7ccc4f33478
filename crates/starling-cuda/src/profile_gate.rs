//! A word of mapped host memory that the stream waits on before each timed launch site, so a
//! site's start event, its launches and its end event run back to back on the device once the
//! host has issued all of them.
//!
//! Why: while the host is the slower side (and a profile makes it so), the stream drains, and an
//! event recorded on an idle stream completes at once — the pair then spans whatever the host
//! did between the start event and the launch. For a cuBLAS site that is the library's
//! descriptor set-up and heuristic query: `serve --kernel-profile` read Qwen2.5-Coder-1.5B's QKV
//! GEMM at 222–331 µs a launch where the GEMM alone takes 77 µs (`bench kernels --gemm`, H100,
//! session 34). Holding the stream at a gate until the site is issued makes the pair time the
//! device's work only; the wait itself sits outside the pair.
//!
//! The gate is `cuStreamWaitValue32` on a counter in page-locked, device-mapped host memory,
//! compared cyclically (`GEQ`), so the counter may wrap. `STARLING_PROFILE_GATE=0` turns it off
//! (events as before, host time included), for an A/B of the two readings.

use cudarc::driver::sys::{self, CUstreamWaitValue_flags};
use cudarc::driver::{result, CudaStream, DriverError};

/// Set to `0` to time launch sites without the gate (host time between a site's events and
/// its launches is then included whenever the stream has drained).
pub const PROFILE_GATE_ENV: &str = "STARLING_PROFILE_GATE";

/// Whether the gate is wanted ([`PROFILE_GATE_ENV`] unset or anything but `0`).
pub(crate) fn gate_wanted() -> bool {
    std::env::var(PROFILE_GATE_ENV).map_or(true, |v| v.trim() != "0")
}

/// The gate: the host's counter and the device's view of it.
pub(crate) struct HostGate {
    /// Page-locked host word the host writes (volatile) to open the gate.
    host: *mut u32,
    /// The same word as the device addresses it.
    device: sys::CUdeviceptr,
    /// The value of the last wait enqueued.
    closed_at: u32,
    /// The value last written: the word only moves forward (cyclically), so a site that ends
    /// after a later one (nested sites) cannot close what the later one opened.
    opened_at: u32,
}

// SAFETY: the word is only written through `&mut self` (the profiler's mutex) or read by the
// device; the pointer is valid from `new` to `drop`.
unsafe impl Send for HostGate {}

impl HostGate {
    /// Allocates the word (open: the device sees 0 and no wait is pending) in `stream`'s context.
    pub(crate) fn new(stream: &CudaStream) -> Result<Self, DriverError> {
        stream.context().bind_to_thread()?;
        // SAFETY: a 4-byte allocation, written before any use; freed in `drop`.
        let host = unsafe {
            result::malloc_host(
                std::mem::size_of::<u32>(),
                sys::CU_MEMHOSTALLOC_DEVICEMAP | sys::CU_MEMHOSTALLOC_PORTABLE,
            )
        }? as *mut u32;
        // SAFETY: `host` is a fresh, aligned allocation of one u32.
        unsafe { std::ptr::write_volatile(host, 0) };
        let mut device: sys::CUdeviceptr = 0;
        // SAFETY: `host` came from cuMemHostAlloc with DEVICEMAP; flags must be 0.
        let mapped =
            unsafe { sys::cuMemHostGetDevicePointer_v2(&mut device, host.cast(), 0) }.result();
        if let Err(e) = mapped {
            // SAFETY: nothing has been enqueued on the word.
            let _ = unsafe { result::free_host(host.cast()) };
            return Err(e);
        }
        Ok(Self {
            host,
            device,
            closed_at: 0,
            opened_at: 0,
        })
    }

    /// Enqueues a wait on `stream` until the host opens the gate at the returned value.
    pub(crate) fn close(&mut self, stream: &CudaStream) -> Result<u32, DriverError> {
        let value = self.closed_at.wrapping_add(1);
        // SAFETY: `device` maps the live host word; the wait compares cyclically.
        unsafe {
            sys::cuStreamWaitValue32_v2(
                stream.cu_stream(),
                self.device,
                value,
                CUstreamWaitValue_flags::CU_STREAM_WAIT_VALUE_GEQ as u32,
            )
        }
        .result()?;
        self.closed_at = value;
        Ok(value)
    }

    /// Lets the stream past every wait up to `value`: called once the site is issued (on error
    /// paths too: a gate left closed would hold the stream for good).
    pub(crate) fn open(&mut self, value: u32) {
        if !cyclically_after(value, self.opened_at) {
            return;
        }
        self.opened_at = value;
        // The launches issued before this store must not be reordered after it.
        std::sync::atomic::fence(std::sync::atomic::Ordering::SeqCst);
        // SAFETY: `host` is the live word from `new`.
        unsafe { std::ptr::write_volatile(self.host, value) };
    }

    /// Opens every wait enqueued so far.
    pub(crate) fn open_all(&mut self) {
        let last = self.closed_at;
        self.open(last);
    }
}

impl Drop for HostGate {
    /// The owner must first let every enqueued wait complete (the profiler synchronises on its
    /// last timed launch, which follows the last wait).
    fn drop(&mut self) {
        self.open_all();
        // SAFETY: allocated by cuMemHostAlloc in `new`, freed once, no wait pending (above).
        if let Err(e) = unsafe { result::free_host(self.host.cast()) } {
            tracing::warn!("freeing the kernel profile's gate word: {e}");
        }
    }
}

/// Whether `value` comes after `current` in the cyclic order `CU_STREAM_WAIT_VALUE_GEQ` uses
/// (`(int32_t)(value - current) > 0`), so the counter may wrap.
fn cyclically_after(value: u32, current: u32) -> bool {
    (value.wrapping_sub(current) as i32) > 0
}

#[cfg(test)]
mod tests {
    use super::cyclically_after;

    #[test]
    fn the_gate_counter_moves_forward_across_the_wrap() {
        assert!(cyclically_after(1, 0));
        assert!(!cyclically_after(0, 0));
        assert!(
            !cyclically_after(5, 6),
            "an outer site ending after an inner one"
        );
        assert!(cyclically_after(0, u32::MAX), "the wrap");
        assert!(cyclically_after(3, u32::MAX - 2));
        assert!(!cyclically_after(u32::MAX, 2));
    }
}
