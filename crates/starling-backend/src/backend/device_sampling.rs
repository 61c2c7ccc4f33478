//! Sampling where the logits are ([`DeviceSampling`]).

use crate::sampling::{sample_host_rows, select_host_rows, RowOutcome, RowSamplingParams};
use crate::{BackendCore, BackendError, HostTensor};

/// Token sampling next to the logits, so a device backend copies only token ids and
/// log-probabilities to the host. Both methods default to the host reference
/// ([`crate::sampling`]) over a copy of the logits.
pub trait DeviceSampling: BackendCore {
    /// Samples one token for each of `rows` from an f32 `[n, vocab]` logits tensor (as
    /// [`ModelOps::logits`](crate::ModelOps::logits) returns it) where the logits live, and returns, in `rows`' order, only
    /// each row's token id and raw log-probability (or why the row has no distribution). The
    /// reference is [`crate::sampling::sample_row`]; the default copies the logits to the host
    /// and runs it.
    fn sample_rows(
        &self,
        logits: &Self::Tensor,
        rows: &[RowSamplingParams],
    ) -> Result<Vec<RowOutcome>, BackendError> {
        if rows.is_empty() {
            return Ok(Vec::new());
        }
        sample_host_rows(&self.to_host(logits)?, rows)
    }

    /// The listed rows of an f32 `[n, vocab]` logits tensor, copied to the host in the listed
    /// order (the rows a host sampler still needs). The default copies the whole tensor first.
    fn logits_rows_to_host(
        &self,
        logits: &Self::Tensor,
        rows: &[u32],
    ) -> Result<HostTensor, BackendError> {
        select_host_rows(&self.to_host(logits)?, rows)
    }
}
