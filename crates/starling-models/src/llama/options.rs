//! What a forward pass copies to the host besides the logits ([`ForwardOptions`]): post-RoPE
//! query rows ([`QueryCapture`], SnapKV's observation window) and every layer's Q/K/V input
//! ([`ActivationCapture`], STAR-KV whitening).

use starling_backend::{Backend, HostTensor};

use crate::ModelError;

/// Post-RoPE query rows copied to the host during a forward pass, per layer: what SnapKV's
/// observation window needs. Costs one small gather and copy per layer, only when rows are named.
#[derive(Debug, Default, Clone)]
pub struct QueryCapture {
    rows: Vec<u32>,
    per_layer: Vec<HostTensor>,
}

impl QueryCapture {
    /// Captures batch rows `rows` (indices into the step's flattened tokens).
    pub fn new(rows: Vec<u32>) -> Self {
        Self {
            rows,
            per_layer: Vec::new(),
        }
    }

    /// The captured batch rows, in capture order.
    pub fn rows(&self) -> &[u32] {
        &self.rows
    }

    /// Layer `layer`'s queries, `[rows.len(), num_heads * head_dim]`, after the forward pass.
    pub fn layer(&self, layer: usize) -> Option<&HostTensor> {
        self.per_layer.get(layer)
    }

    /// Forgets an earlier pass's queries and checks the rows against a batch of `batch_rows`.
    pub(super) fn start(&mut self, batch_rows: usize) -> Result<(), ModelError> {
        self.per_layer.clear();
        match self.rows.iter().find(|&&r| r as usize >= batch_rows) {
            Some(&bad) => Err(ModelError::InvalidConfig(format!(
                "query capture row {bad} outside a batch of {batch_rows} rows"
            ))),
            None => Ok(()),
        }
    }

    /// Copies the captured rows' queries (the first `q_size` columns of the rotated fused
    /// projection `qkv`) to the host as the next layer's; nothing when no rows are named.
    pub(super) fn record<B: Backend>(
        &mut self,
        backend: &B,
        qkv: &B::Tensor,
        q_size: usize,
    ) -> Result<(), ModelError> {
        if self.rows.is_empty() {
            return Ok(());
        }
        let rows = backend.to_host(&backend.gather_rows(qkv, &self.rows)?)?;
        self.push_layer(&rows, q_size)
    }

    fn push_layer(&mut self, qkv_rows: &HostTensor, q_size: usize) -> Result<(), ModelError> {
        let width = qkv_rows.shape().last().copied().unwrap_or(0);
        if width < q_size {
            return Err(ModelError::InvalidConfig(format!(
                "captured rows of width {width} hold no {q_size}-wide queries"
            )));
        }
        let data = qkv_rows
            .data()
            .chunks_exact(width)
            .flat_map(|row| row[..q_size].iter().copied())
            .collect();
        let q = HostTensor::new(vec![self.rows.len(), q_size], data)?;
        self.per_layer.push(q);
        Ok(())
    }
}

/// Receives the rows that enter each layer's Q/K/V projection (the output of the layer's input
/// RMSNorm), copied to the host: what activation-aware calibration (STAR-KV whitening) needs.
/// Costs one device-to-host copy of `[tokens, hidden]` per layer, only when a capture is given.
pub trait ActivationCapture {
    /// Called once per layer, in layer order, with `rows` of shape `[tokens, hidden]`.
    fn attention_input(&mut self, layer: usize, rows: &HostTensor) -> Result<(), ModelError>;
}

/// What a forward pass ([`LlamaModel::forward`](super::LlamaModel::forward)) copies to the host
/// besides the logits; the default copies nothing, so the pass issues backend ops only.
#[derive(Default)]
pub struct ForwardOptions<'a> {
    /// Post-RoPE query rows, per layer.
    pub queries: Option<&'a mut QueryCapture>,
    /// Every layer's Q/K/V projection input.
    pub activations: Option<&'a mut dyn ActivationCapture>,
}

impl<'a> ForwardOptions<'a> {
    /// Copies every layer's Q/K/V projection input to `capture`, nothing else.
    pub fn activations(capture: &'a mut dyn ActivationCapture) -> Self {
        Self {
            queries: None,
            activations: Some(capture),
        }
    }
}
