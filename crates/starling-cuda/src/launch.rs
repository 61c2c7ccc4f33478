//! Kernel launches through `cuLaunchKernelEx`, so that a kernel may be launched with programmatic
//! dependent launch (PDL): the next kernel's blocks are scheduled while this one finishes, and
//! wait on the device (`griddepcontrol.wait`, `kernels/pdl.cuh`) rather than on the stream.
//!
//! cudarc's `LaunchArgs` only calls `cuLaunchKernel`, which takes no launch attributes. Every kernel
//! this crate loads starts with `pdl_entry()` (checked in its PTX by `tests/nvrtc_compile.rs`), so
//! every launch may carry the attribute; cuBLAS's kernels are launched by cuBLAS and never do.

use std::ffi::c_void;

use cudarc::driver::sys::{
    self, CUlaunchAttribute, CUlaunchAttributeID, CUlaunchAttributeValue, CUlaunchConfig,
};
use cudarc::driver::{
    CudaFunction, CudaSlice, CudaStream, CudaView, CudaViewMut, DevicePtr, DevicePtrMut,
    DriverError, LaunchConfig, SyncOnDrop,
};

/// The environment variable that turns programmatic dependent launch off (`0`), for measuring
/// what it gains in the same run.
pub const PDL_ENV: &str = "STARLING_PDL";

/// Whether kernels are launched with programmatic dependent launch: on devices of compute
/// capability 9.0 or newer (where `griddepcontrol` exists), unless [`PDL_ENV`] is `0`.
pub(crate) fn pdl_enabled(compute_major: i32) -> bool {
    compute_major >= 9 && std::env::var(PDL_ENV).map_or(true, |v| v.trim() != "0")
}

/// One kernel launch's arguments, each widened to a 64-bit word: the driver reads as many bytes
/// of each as the kernel's parameter has, which on a little-endian host are the value's own.
pub(crate) struct KernelArgs<'a> {
    words: Vec<u64>,
    /// Kept until the launch is queued, as cudarc asks of device pointers it hands out.
    guards: Vec<SyncOnDrop<'a>>,
    stream: &'a CudaStream,
}

impl<'a> KernelArgs<'a> {
    /// No arguments yet, for a launch on `stream`.
    pub(crate) fn new(stream: &'a CudaStream) -> Self {
        Self {
            words: Vec::with_capacity(16),
            guards: Vec::new(),
            stream,
        }
    }

    /// Appends the next argument, in the kernel's parameter order.
    pub(crate) fn push(&mut self, arg: impl KernelArg<'a>) {
        arg.push_to(self);
    }

    fn push_ptr(&mut self, (ptr, guard): (sys::CUdeviceptr, SyncOnDrop<'a>)) {
        self.words.push(ptr);
        self.guards.push(guard);
    }

    /// Queues `func` on the stream with grid, block and dynamic shared memory from `cfg`, with
    /// the programmatic-serialisation attribute when `pdl` is set.
    ///
    /// # Safety
    /// The arguments must be the kernel's parameters, in order and of its types, with buffers
    /// sized for the launch geometry; and with `pdl`, the kernel must call `pdl_entry()` before
    /// it touches memory an earlier kernel writes.
    pub(crate) unsafe fn launch(
        mut self,
        func: &CudaFunction,
        cfg: LaunchConfig,
        pdl: bool,
    ) -> Result<(), DriverError> {
        self.stream.context().bind_to_thread()?;
        let mut params: Vec<*mut c_void> = self
            .words
            .iter_mut()
            .map(|w| w as *mut u64 as *mut c_void)
            .collect();
        // SAFETY: a C union of plain data; all-zero is a valid value of every member.
        let mut value: CUlaunchAttributeValue = unsafe { std::mem::zeroed() };
        value.programmaticStreamSerializationAllowed = 1;
        let mut attribute = CUlaunchAttribute {
            id: CUlaunchAttributeID::CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION,
            pad: [0; 4],
            value,
        };
        let config = CUlaunchConfig {
            gridDimX: cfg.grid_dim.0,
            gridDimY: cfg.grid_dim.1,
            gridDimZ: cfg.grid_dim.2,
            blockDimX: cfg.block_dim.0,
            blockDimY: cfg.block_dim.1,
            blockDimZ: cfg.block_dim.2,
            sharedMemBytes: cfg.shared_mem_bytes,
            hStream: self.stream.cu_stream(),
            attrs: &mut attribute,
            numAttrs: u32::from(pdl),
        };
        // SAFETY: `config`, `attribute` and `params` (pointing into `self.words`) outlive the
        // call, which copies them; the caller vouches for the arguments (see above).
        unsafe {
            sys::cuLaunchKernelEx(
                &config,
                func.cu_function(),
                params.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        }
        .result()?;
        drop(self.guards);
        Ok(())
    }
}

/// A value that can be passed to a kernel: a device buffer (as its address) or a scalar.
pub(crate) trait KernelArg<'a> {
    /// Appends this argument to `args`.
    fn push_to(self, args: &mut KernelArgs<'a>);
}

impl<'a, T> KernelArg<'a> for &'a CudaSlice<T> {
    fn push_to(self, args: &mut KernelArgs<'a>) {
        let stream = args.stream;
        args.push_ptr(self.device_ptr(stream));
    }
}

impl<'a, T> KernelArg<'a> for &'a mut CudaSlice<T> {
    fn push_to(self, args: &mut KernelArgs<'a>) {
        let stream = args.stream;
        args.push_ptr(self.device_ptr_mut(stream));
    }
}

impl<'a, T> KernelArg<'a> for &'a CudaView<'_, T> {
    fn push_to(self, args: &mut KernelArgs<'a>) {
        let stream = args.stream;
        args.push_ptr(self.device_ptr(stream));
    }
}

impl<'a, T> KernelArg<'a> for &'a mut CudaViewMut<'_, T> {
    fn push_to(self, args: &mut KernelArgs<'a>) {
        let stream = args.stream;
        args.push_ptr(self.device_ptr_mut(stream));
    }
}

/// Scalars, widened without changing their bytes (low bytes first on a little-endian host).
macro_rules! scalar_arg {
    ($($t:ty => $widen:expr),* $(,)?) => {$(
        impl<'a> KernelArg<'a> for &$t {
            fn push_to(self, args: &mut KernelArgs<'a>) {
                let widen: fn($t) -> u64 = $widen;
                args.words.push(widen(*self));
            }
        }
    )*};
}
scalar_arg!(
    i32 => |v| u64::from(v as u32),
    u32 => u64::from,
    f32 => |v| u64::from(v.to_bits()),
    u64 => |v| v,
    usize => |v| v as u64,
);

#[cfg(not(target_endian = "little"))]
compile_error!("kernel arguments are widened to 64-bit words, which needs a little-endian host");

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pdl_needs_compute_capability_9() {
        // The environment variable is not set in tests, so the capability decides.
        if std::env::var(PDL_ENV).is_err() {
            assert!(pdl_enabled(9));
            assert!(pdl_enabled(10));
            assert!(!pdl_enabled(8));
        }
    }
}
