//! The model's head: the residual stream's last add, the final RMSNorm and the LM head over the
//! rows that sample ([`Logits`]).

use starling_backend::{Backend, HostTensor};

use super::LlamaModel;
use crate::ModelError;

/// The logits a forward pass computed: f32 `[meta.logits_rows.len(), vocab]` in backend memory,
/// or none when the batch asked for no rows (a non-final prefill chunk samples nothing, so the
/// head was skipped).
pub struct Logits<B: Backend> {
    tensor: Option<B::Tensor>,
    vocab_size: usize,
}

impl<B: Backend> Logits<B> {
    /// The logits where they are (for [`DeviceSampling::sample_rows`], so a device backend copies
    /// only sampled tokens to the host); `None` when no rows were asked for.
    ///
    /// [`DeviceSampling::sample_rows`]: starling_backend::DeviceSampling::sample_rows
    pub fn into_device(self) -> Option<B::Tensor> {
        self.tensor
    }

    /// The logits copied to the host; `[0, vocab]` when no rows were asked for.
    pub fn to_host(&self, backend: &B) -> Result<HostTensor, ModelError> {
        match &self.tensor {
            Some(logits) => Ok(backend.to_host(logits)?),
            None => Ok(HostTensor::new(vec![0, self.vocab_size], Vec::new())?),
        }
    }
}

impl<B: Backend> LlamaModel<B> {
    /// The logits of `logits_rows` after the last layer: `residual` plus the last layer's MLP
    /// output `pending`, the final RMSNorm, the LM head (the embedding matrix when tied). Nothing
    /// runs when `logits_rows` is empty.
    pub(super) fn head(
        &self,
        backend: &B,
        residual: &mut B::Tensor,
        pending: Option<B::Tensor>,
        logits_rows: &[u32],
    ) -> Result<Logits<B>, ModelError> {
        let vocab_size = self.config.vocab_size;
        if logits_rows.is_empty() {
            // A non-final prefill chunk samples nothing: skip the head entirely.
            return Ok(Logits {
                tensor: None,
                vocab_size,
            });
        }
        if let Some(delta) = pending {
            backend.add_inplace(residual, &delta)?;
        }
        let last = backend.gather_rows(residual, logits_rows)?;
        let normed = backend.rms_norm(&last, &self.final_norm, self.config.rms_norm_eps)?;
        let head = self.lm_head.as_ref().unwrap_or(&self.embed_tokens);
        Ok(Logits {
            tensor: Some(backend.logits(&normed, head)?),
            vocab_size,
        })
    }
}
