//! Device memory of the backend's tensors: allocation (from the recording pool while a decode
//! graph is recorded, so the graph holds no memory nodes), the one constructor every tensor goes
//! through, host uploads (refused while recording) and read-back, synthetic fills.

use std::sync::atomic::Ordering;
use std::sync::Arc;

use cudarc::driver::CudaSlice;
use half::bf16;
use rayon::prelude::*;
use starling_backend::{BackendError, HostTensor};

use super::{err, grid_for, CudaBackend};
use crate::recording_pool::RecordingPool;
use crate::{CudaError, CudaTensor, DeviceBuf};

impl CudaBackend {
    /// Copies a host tensor to the device in f32, the dtype
    /// [`ModelOps::logits`](starling_backend::ModelOps::logits) returns (logits for the sampling op
    /// in tests and tools; [`BackendCore::upload`](starling_backend::BackendCore::upload)
    /// converts to bf16).
    pub fn upload_f32(&self, host: &HostTensor) -> Result<CudaTensor, CudaError> {
        let buf = if host.numel() == 0 {
            self.stream.alloc_zeros::<f32>(1)?
        } else {
            self.stream.clone_htod(host.data())?
        };
        Ok(self.tensor(DeviceBuf::F32(buf), host.shape().to_vec()))
    }

    /// A device tensor of N(mean, std) bf16 values made on the GPU (synthetic weights: no host
    /// copy, no transfer).
    pub fn random_bf16(
        &self,
        shape: Vec<usize>,
        seed: u64,
        std: f32,
        mean: f32,
    ) -> Result<CudaTensor, CudaError> {
        let n: usize = shape.iter().product();
        let mut buf = self.alloc_bf16(n)?;
        launch!(
            self,
            &self.kernels.fill_normal,
            grid_for(n),
            &mut buf,
            &n,
            &seed,
            &std,
            &mean
        )?;
        Ok(self.tensor(DeviceBuf::Bf16(buf), shape))
    }

    /// Overwrites a device buffer with N(0, `std`) values (benchmarks fill caches this way).
    pub fn fill_normal_slice(
        &self,
        buf: &mut CudaSlice<bf16>,
        seed: u64,
        std: f32,
    ) -> Result<(), CudaError> {
        let n = buf.len();
        let mean = 0.0f32;
        launch!(
            self,
            &self.kernels.fill_normal,
            grid_for(n),
            buf,
            &n,
            &seed,
            &std,
            &mean
        )
    }

    /// An uninitialised buffer of `n` bf16 (at least one), for a tensor built by
    /// [`CudaBackend::tensor`]: from the recording pool while a decode graph is recorded.
    pub(super) fn alloc_bf16(&self, n: usize) -> Result<CudaSlice<bf16>, CudaError> {
        self.alloc_for_tensor(n)
    }

    /// As [`CudaBackend::alloc_bf16`], f32.
    pub(super) fn alloc_f32(&self, n: usize) -> Result<CudaSlice<f32>, CudaError> {
        self.alloc_for_tensor(n)
    }

    /// The buffer of [`CudaBackend::alloc_bf16`] / [`CudaBackend::alloc_f32`].
    pub(super) fn alloc_for_tensor<T: cudarc::driver::DeviceRepr>(
        &self,
        n: usize,
    ) -> Result<CudaSlice<T>, CudaError> {
        if let Some(pool) = self.active_pool() {
            // SAFETY: every caller fully overwrites the buffer before it is read, and wraps it in
            // a tensor through `tensor`, which hands it back to the pool on drop.
            if let Some(buf) = unsafe { pool.take::<T>(n) }? {
                return Ok(buf);
            }
        }
        // SAFETY: every caller fully overwrites the buffer before it is read.
        Ok(unsafe { self.stream.alloc::<T>(n.max(1)) }?)
    }

    /// The recording pool, while a decode graph is recorded.
    pub(super) fn active_pool(&self) -> Option<Arc<RecordingPool>> {
        self.recording_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// Makes (`Some`) or clears (`None`) the pool the backend's tensors allocate from.
    pub(crate) fn set_recording_pool(&self, pool: Option<Arc<RecordingPool>>) {
        *self
            .recording_pool
            .lock()
            .unwrap_or_else(|p| p.into_inner()) = pool;
    }

    /// A tensor of `buf`: one the recording pool lent goes back to it on drop; any other is
    /// freed with the tensor. Every tensor the backend makes is made here.
    pub(crate) fn tensor(&self, buf: DeviceBuf, shape: Vec<usize>) -> CudaTensor {
        match self.active_pool() {
            Some(pool) if pool.lent(&buf) => CudaTensor::pooled(buf, shape, pool),
            _ => CudaTensor::new(buf, shape),
        }
    }

    /// Refuses host uploads while a decode graph is being recorded (see `recording`).
    pub(super) fn check_not_recording(&self, what: &str) -> Result<(), CudaError> {
        if self.recording.load(Ordering::Relaxed) {
            return Err(CudaError::Shape(format!(
                "{what} would upload host data while a CUDA graph is being recorded"
            )));
        }
        Ok(())
    }

    /// A host index array on the device (one zero for an empty one: cudarc allocates no empty
    /// buffer); refused while a graph is recorded.
    pub(super) fn upload_u32(&self, v: &[u32]) -> Result<CudaSlice<u32>, CudaError> {
        self.check_not_recording("an index upload")?;
        if v.is_empty() {
            return Ok(self.stream.clone_htod(&[0u32][..])?);
        }
        Ok(self.stream.clone_htod(v)?)
    }

    /// `Backend::upload`: the host tensor in bf16.
    pub(super) fn upload_impl(&self, host: &HostTensor) -> Result<CudaTensor, BackendError> {
        let data: Vec<bf16> = host.data().par_iter().map(|&v| bf16::from_f32(v)).collect();
        let buf = if data.is_empty() {
            self.alloc_bf16(1).map_err(err)?
        } else {
            self.stream.clone_htod(&data).map_err(err)?
        };
        Ok(self.tensor(DeviceBuf::Bf16(buf), host.shape().to_vec()))
    }

    /// `Backend::to_host`: the tensor in f32 on the host.
    pub(super) fn to_host_impl(&self, t: &CudaTensor) -> Result<HostTensor, BackendError> {
        let n = t.numel();
        let data = match t.buf() {
            DeviceBuf::Bf16(b) => {
                let v: Vec<bf16> = self.stream.clone_dtoh(b).map_err(err)?;
                v[..n].iter().map(|x| x.to_f32()).collect()
            }
            DeviceBuf::F32(b) => {
                let mut v: Vec<f32> = self.stream.clone_dtoh(b).map_err(err)?;
                v.truncate(n);
                v
            }
        };
        HostTensor::new(t.shape().to_vec(), data)
    }
}
