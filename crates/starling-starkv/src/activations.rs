//! Activation statistics for whitening: the second moment `E[x xᵀ]` of every layer's Q/K/V
//! projection input (the output of the layer's input RMSNorm), accumulated while the original
//! model runs over calibration text. These are the `C` of [`Whitener`].

use rayon::prelude::*;
use starling_backend::{Backend, HostTensor};
use starling_models::llama::{ActivationCapture, ForwardOptions, LlamaModel};
use starling_models::{ModelConfig, ModelError};

use crate::{Matrix, SecondMoment, StarKvError, Whitener};

/// Per-layer second moments of the attention input, filled by running the model
/// ([`AttentionInputMoments::observe`]); implements [`ActivationCapture`] so any forward pass
/// with hooks can feed it.
#[derive(Clone, Debug, PartialEq)]
pub struct AttentionInputMoments {
    hidden_size: usize,
    moments: Vec<SecondMoment>,
    windows_seen: u64,
}

impl AttentionInputMoments {
    /// Empty statistics for a model of `config`'s shape.
    pub fn new(config: &ModelConfig) -> Self {
        Self {
            hidden_size: config.hidden_size,
            moments: (0..config.num_layers)
                .map(|_| SecondMoment::new(config.hidden_size))
                .collect(),
            windows_seen: 0,
        }
    }

    /// Runs `ids` through `model` as one sequence (its own fresh cache, so every window starts
    /// at position 0) and adds every layer's attention-input rows.
    pub fn observe<B: Backend>(
        &mut self,
        backend: &B,
        model: &LlamaModel<B>,
        ids: &[u32],
    ) -> Result<(), StarKvError> {
        let config = model.config();
        if config.num_layers != self.moments.len() || config.hidden_size != self.hidden_size {
            return Err(StarKvError::InvalidArgument(format!(
                "statistics for {} layers × {} wide, model has {} × {}",
                self.moments.len(),
                self.hidden_size,
                config.num_layers,
                config.hidden_size
            )));
        }
        let before: Vec<u64> = self.moments.iter().map(SecondMoment::rows_seen).collect();
        model
            .forward_sequence(backend, ids, Vec::new(), ForwardOptions::activations(self))
            .map_err(StarKvError::Calibration)?;
        // Every layer must have seen exactly this window's rows, or the layers' statistics
        // would describe different text.
        for (layer, (moment, rows_before)) in self.moments.iter().zip(before).enumerate() {
            let added = moment.rows_seen() - rows_before;
            if added != ids.len() as u64 {
                return Err(StarKvError::InvalidArgument(format!(
                    "layer {layer} received {added} activation rows for a {}-token window",
                    ids.len()
                )));
            }
        }
        self.windows_seen += 1;
        Ok(())
    }

    /// One second moment per layer, layer order.
    pub fn moments(&self) -> &[SecondMoment] {
        &self.moments
    }

    /// Tokens observed (the same in every layer).
    pub fn tokens_seen(&self) -> u64 {
        self.moments.first().map_or(0, SecondMoment::rows_seen)
    }

    /// Windows observed.
    pub fn windows_seen(&self) -> u64 {
        self.windows_seen
    }

    /// One whitener per layer (see [`Whitener::new`]); layers are independent, so they are
    /// decomposed in parallel, each sequentially (thread count does not change the result).
    pub fn whiteners(&self, relative_floor: f64) -> Result<Vec<Whitener>, StarKvError> {
        self.moments
            .par_iter()
            .map(|moment| Whitener::new(moment, relative_floor))
            .collect()
    }
}

impl ActivationCapture for AttentionInputMoments {
    fn attention_input(&mut self, layer: usize, rows: &HostTensor) -> Result<(), ModelError> {
        let [tokens, width] = *rows.shape() else {
            return Err(ModelError::InvalidConfig(format!(
                "attention input of shape {:?} is not a matrix",
                rows.shape()
            )));
        };
        let layers = self.moments.len();
        let moment = self.moments.get_mut(layer).ok_or_else(|| {
            ModelError::InvalidConfig(format!("activation of layer {layer} of {layers}"))
        })?;
        let to_model_error = |e: StarKvError| ModelError::InvalidConfig(e.to_string());
        let rows = Matrix::new(tokens, width, rows.data().to_vec()).map_err(to_model_error)?;
        moment.add_rows(&rows).map_err(to_model_error)
    }
}

#[cfg(test)]
mod tests;
