//! The two tiled attention kernels that launch with more than the default 48 KiB of dynamic
//! shared memory (tensor-core decode, tiled prefill): the opt-in and the occupancy query done
//! once at load, so a device that cannot run one falls back to a kernel that computes the same;
//! [`granted_variants`] does the same for instantiation lists (the latent score kernels).

use cudarc::driver::sys::CUfunction_attribute;
use cudarc::driver::CudaFunction;

use crate::geometry::{
    decode_mma_shared_bytes, prefill_shared_bytes, prefill_wgmma_ws_shared_bytes, CacheElem,
    DECODE_MMA_THREADS, PREFILL_THREADS, PREFILL_WGMMA_WS_THREADS,
};
use crate::kernel_source::HopperPrefill;
use crate::CudaError;

/// The tensor-core decode kernel for one head width, with its launch needs on this device.
pub(crate) struct DecodeMmaKernel {
    pub(crate) function: CudaFunction,
    /// Dynamic shared memory per block ([`decode_mma_shared_bytes`]).
    pub(crate) shared_bytes: u32,
    /// Blocks resident per SM (the driver's occupancy figure: shared memory and registers), which
    /// the split plan fills.
    pub(crate) resident_per_sm: usize,
}

impl DecodeMmaKernel {
    /// Raises the function's dynamic shared-memory limit to what it needs and asks the driver how
    /// many blocks fit an SM. `None` where the device cannot run it (a GPU with less shared
    /// memory per block than the ring needs): decode rows then keep the per-token kernel, which
    /// computes the same attention.
    pub(crate) fn prepare(
        function: CudaFunction,
        head_dim: usize,
        elem: CacheElem,
    ) -> Option<Self> {
        let (shared_bytes, resident_per_sm) = opt_in_shared_memory(
            &function,
            decode_mma_shared_bytes(head_dim, elem),
            DECODE_MMA_THREADS,
            &format!("decode attention d{head_dim} {}", elem.suffix()),
            "the per-token kernel serves decode",
        )?;
        Some(Self {
            function,
            shared_bytes,
            resident_per_sm,
        })
    }
}

/// Raises `function`'s dynamic shared-memory limit to `bytes` (above the 48 KiB default: the
/// opt-in shared memory of sm_80+) and asks the driver how many blocks of `threads` fit an SM.
/// Returns (shared bytes per launch, resident blocks per SM), or `None` — logged as `kernel`
/// falling back to `fallback` — where no block fits or the driver refuses.
pub(crate) fn opt_in_shared_memory(
    function: &CudaFunction,
    bytes: usize,
    threads: u32,
    kernel: &str,
    fallback: &str,
) -> Option<(u32, usize)> {
    let shared_bytes = u32::try_from(bytes).ok()?;
    let outcome = function
        .set_attribute(
            CUfunction_attribute::CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
            i32::try_from(bytes).ok()?,
        )
        .and_then(|()| {
            function.occupancy_max_active_blocks_per_multiprocessor(threads, bytes, None)
        });
    match outcome {
        Ok(resident) if resident > 0 => Some((shared_bytes, resident as usize)),
        Ok(_) => {
            tracing::info!("{kernel}: no block of {bytes} B shared memory fits an SM; {fallback}");
            None
        }
        Err(e) => {
            tracing::info!("{kernel}: {e}; {fallback}");
            None
        }
    }
}

/// A tiled prefill kernel for one head width, with the block it launches with.
pub(crate) struct PrefillKernel {
    pub(crate) function: CudaFunction,
    /// Dynamic shared memory per block ([`prefill_shared_bytes`],
    /// [`prefill_wgmma_ws_shared_bytes`]).
    pub(crate) shared_bytes: u32,
    /// Threads per block.
    pub(crate) threads: u32,
    /// Blocks of it resident per SM (the driver's occupancy figure): the split plan's waves.
    pub(crate) resident_per_sm: usize,
}

impl PrefillKernel {
    /// Raises the function's dynamic shared-memory limit to what it needs (above the 48 KiB
    /// default: the opt-in shared memory of sm_80+). `None` where the device cannot run it:
    /// prefill rows then go to the decode kernel, which attends any single row correctly.
    pub(crate) fn prepare(
        function: CudaFunction,
        head_dim: usize,
        elem: CacheElem,
    ) -> Option<Self> {
        let (shared_bytes, resident) = opt_in_shared_memory(
            &function,
            prefill_shared_bytes(head_dim, elem),
            PREFILL_THREADS,
            &format!("prefill attention d{head_dim} {}", elem.suffix()),
            "the decode kernel serves prefill rows",
        )?;
        tracing::debug!(
            "prefill attention d{head_dim} {}: {resident} blocks per SM",
            elem.suffix()
        );
        Some(Self {
            function,
            shared_bytes,
            threads: PREFILL_THREADS,
            resident_per_sm: resident,
        })
    }

    /// A Hopper (wgmma) kernel, head width 128 and bf16 cache, prepared as [`Self::prepare`]
    /// does; `None` (logged) where the device cannot run it (or `kind` is the mma.sync kernel):
    /// the mma.sync kernel serves then.
    pub(crate) fn prepare_wgmma(function: CudaFunction, kind: HopperPrefill) -> Option<Self> {
        let (bytes, threads, label) = match kind {
            HopperPrefill::Mma => return None,
            HopperPrefill::WgmmaWarpSpecialised => (
                prefill_wgmma_ws_shared_bytes(),
                PREFILL_WGMMA_WS_THREADS,
                "prefill attention wgmma-ws d128 bf16",
            ),
        };
        let (shared_bytes, resident) = opt_in_shared_memory(
            &function,
            bytes,
            threads,
            label,
            "the mma.sync prefill kernel serves",
        )?;
        tracing::debug!("{label}: {resident} blocks per SM");
        Some(Self {
            function,
            shared_bytes,
            threads,
            resident_per_sm: resident,
        })
    }
}

/// The variants whose function (`take`: the function, the dynamic shared memory it asks for and
/// its label) the device grants that memory at `threads` per block; the others are logged with `fallback` and left out.
pub(crate) fn granted_variants<V: Copy, const N: usize>(
    variants: [V; N],
    mut take: impl FnMut(V) -> Result<(CudaFunction, usize, String), CudaError>,
    threads: u32,
    fallback: &str,
) -> Result<Vec<(V, CudaFunction)>, CudaError> {
    let mut granted = Vec::new();
    for variant in variants {
        let (function, bytes, label) = take(variant)?;
        if opt_in_shared_memory(&function, bytes, threads, &label, fallback).is_some() {
            granted.push((variant, function));
        }
    }
    Ok(granted)
}
