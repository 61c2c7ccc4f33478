//! Device buffers for the forward passes of a decode-graph recording ([`RecordingPool`]), so that
//! the recorded graph holds kernels only.
//!
//! Under stream capture, every `cuMemAllocAsync` / `cuMemFreeAsync` becomes a memory node of the
//! graph. A memory node between two kernels is a full dependency: it takes away the programmatic
//! edge that lets a kernel start while its predecessor finishes (programmatic dependent launch,
//! `crate::launch`); a census of a batch-1 llama2-7b graph counted 648 memory nodes among 324
//! kernels and 64 programmatic edges. So while a bucket is recorded, the backend's allocations
//! come from this pool instead: the eager warm-up pass allocates what it needs and returns each
//! buffer on drop, and the captured pass (the same shapes in the same order) finds every size it
//! asks for already free. The pool then belongs to the bucket's graph, which reads and writes
//! those addresses on every replay; nothing else is ever lent them.

use std::sync::{Arc, Mutex};

use cudarc::driver::{sys, CudaSlice, CudaStream, DevicePtr, DeviceRepr};

use crate::device_buf::DeviceBuf;
use crate::CudaError;

/// Buffers lent to the tensors of one recording, reused by size.
#[derive(Debug)]
pub(crate) struct RecordingPool {
    stream: Arc<CudaStream>,
    state: Mutex<PoolState>,
}

#[derive(Debug, Default)]
struct PoolState {
    /// Buffers not lent now: (bytes, address).
    free: Vec<(usize, sys::CUdeviceptr)>,
    /// Buffers lent now: (bytes, address).
    lent: Vec<(usize, sys::CUdeviceptr)>,
    /// Every buffer the pool allocated (freed when the pool goes).
    owned: Vec<sys::CUdeviceptr>,
    /// Whether a size not free may be allocated (the eager warm-up pass), or must be refused so
    /// the caller allocates on the stream (under capture).
    growable: bool,
    /// Requests refused while not growable: each became a memory node of the graph.
    misses: usize,
}

impl RecordingPool {
    /// An empty pool that allocates on `stream`; growable until [`RecordingPool::freeze`].
    pub(crate) fn new(stream: Arc<CudaStream>) -> Self {
        Self {
            stream,
            state: Mutex::new(PoolState {
                growable: true,
                ..PoolState::default()
            }),
        }
    }

    /// From now on, only sizes already allocated are lent (the capture must not allocate).
    pub(crate) fn freeze(&self) {
        self.lock().growable = false;
    }

    /// Requests the pool refused after [`RecordingPool::freeze`].
    pub(crate) fn misses(&self) -> usize {
        self.lock().misses
    }

    /// Bytes the pool holds.
    pub(crate) fn bytes(&self) -> usize {
        let state = self.lock();
        state.free.iter().chain(&state.lent).map(|&(b, _)| b).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, PoolState> {
        // A panic while holding the lock leaves plain bookkeeping behind; keep using it.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A buffer of `len` elements of `T`, uninitialised; `None` when frozen and no buffer of
    /// that size is free.
    ///
    /// # Safety
    /// The caller must write the buffer before reading it, and must hand it back through
    /// [`RecordingPool::give_back`] (a tensor built by `CudaBackend::tensor` does), never drop it
    /// as a `CudaSlice` (that would free memory the pool owns).
    pub(crate) unsafe fn take<T: DeviceRepr>(
        &self,
        len: usize,
    ) -> Result<Option<CudaSlice<T>>, CudaError> {
        let bytes = len.max(1) * std::mem::size_of::<T>();
        let mut state = self.lock();
        let ptr = if let Some(i) = state.free.iter().rposition(|&(b, _)| b == bytes) {
            state.free.swap_remove(i).1
        } else if state.growable {
            // SAFETY: only allocates; the caller writes before reading.
            let raw = unsafe { self.stream.alloc::<u8>(bytes) }?;
            let ptr = raw.leak();
            state.owned.push(ptr);
            ptr
        } else {
            state.misses += 1;
            return Ok(None);
        };
        state.lent.push((bytes, ptr));
        // SAFETY: a live allocation of `bytes` ≥ len·size_of::<T>() bytes, which the pool keeps
        // until it is dropped; the caller returns the slice instead of dropping it.
        Ok(Some(unsafe {
            self.stream.upgrade_device_ptr(ptr, len.max(1))
        }))
    }

    /// Whether `buf` is a buffer this pool lent and has not had back.
    pub(crate) fn lent(&self, buf: &DeviceBuf) -> bool {
        let ptr = address(buf, &self.stream);
        self.lock().lent.iter().any(|&(_, p)| p == ptr)
    }

    /// Takes back a buffer it lent (without freeing it); any other buffer is dropped as usual.
    pub(crate) fn give_back(&self, buf: DeviceBuf) {
        let ptr = address(&buf, &self.stream);
        let mut state = self.lock();
        match state.lent.iter().position(|&(_, p)| p == ptr) {
            Some(i) => {
                let entry = state.lent.swap_remove(i);
                state.free.push(entry);
                match buf {
                    DeviceBuf::Bf16(s) => {
                        s.leak();
                    }
                    DeviceBuf::F32(s) => {
                        s.leak();
                    }
                }
            }
            None => drop(buf),
        }
    }
}

/// The device address of a buffer.
fn address(buf: &DeviceBuf, stream: &CudaStream) -> sys::CUdeviceptr {
    match buf {
        DeviceBuf::Bf16(s) => s.device_ptr(stream).0,
        DeviceBuf::F32(s) => s.device_ptr(stream).0,
    }
}

impl Drop for RecordingPool {
    fn drop(&mut self) {
        let state = self.state.get_mut().unwrap_or_else(|p| p.into_inner());
        for &ptr in &state.owned {
            // SAFETY: allocated by this pool on this stream; every tensor that borrowed it holds
            // the pool (so is gone), and the graph that used it is dropped first (field order in
            // `BucketGraph`). Stream-ordered, so queued work on it finishes first.
            let freed = unsafe { cudarc::driver::result::free_async(ptr, self.stream.cu_stream()) };
            if let Err(e) = freed {
                tracing::warn!("decode graph pool: freeing a buffer failed: {e}");
            }
        }
    }
}
