//! The device's default memory pool, which every buffer comes from (cudarc allocates with
//! `cuMemAllocAsync`). Its release threshold is 0 unless set: at every stream, event or context
//! synchronise (each engine step has one) the driver hands the pool's unused memory back, and
//! the next step's activations map it again. PyTorch's caching allocator (vLLM) never gives it
//! back. [`MEMPOOL_RELEASE_THRESHOLD_ENV`] sets the threshold for an A/B run; it stays the
//! driver's default until a GPU run says keeping the memory is worth it.

use cudarc::driver::{result, sys};

use crate::CudaError;

/// Bytes of unused memory the pool keeps across synchronisations (`max` for all of it); unset,
/// the driver's default (0).
pub const MEMPOOL_RELEASE_THRESHOLD_ENV: &str = "STARLING_MEMPOOL_RELEASE_THRESHOLD";

/// The threshold [`MEMPOOL_RELEASE_THRESHOLD_ENV`] asks for: `None` when unset; an unreadable
/// value is an error (an A/B run must not silently measure the default).
pub(crate) fn requested_release_threshold() -> Result<Option<u64>, CudaError> {
    let Ok(value) = std::env::var(MEMPOOL_RELEASE_THRESHOLD_ENV) else {
        return Ok(None);
    };
    parse_threshold(&value).map(Some).ok_or_else(|| {
        CudaError::Backend(starling_backend::BackendError::Device(format!(
            "{MEMPOOL_RELEASE_THRESHOLD_ENV}={value:?}: a byte count or `max`"
        )))
    })
}

fn parse_threshold(value: &str) -> Option<u64> {
    match value.trim() {
        "max" => Some(u64::MAX),
        v => v.parse().ok(),
    }
}

/// Sets the release threshold of GPU `ordinal`'s default pool (the context must be current).
pub(crate) fn set_release_threshold(ordinal: usize, bytes: u64) -> Result<(), CudaError> {
    let device = result::device::get(ordinal as i32)?;
    let mut value = bytes;
    // SAFETY: the device comes from the driver; the attribute takes a cuuint64_t.
    unsafe {
        let pool = result::device::get_default_mem_pool(device)?;
        result::mem_pool::set_attribute(
            pool,
            sys::CUmemPool_attribute::CU_MEMPOOL_ATTR_RELEASE_THRESHOLD,
            (&mut value as *mut u64).cast(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::parse_threshold;

    #[test]
    fn thresholds_are_byte_counts_or_max() {
        assert_eq!(parse_threshold("max"), Some(u64::MAX));
        assert_eq!(parse_threshold(" 1073741824 "), Some(1 << 30));
        assert_eq!(parse_threshold("1GiB"), None);
        assert_eq!(parse_threshold(""), None);
    }
}
