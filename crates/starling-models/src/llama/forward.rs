//! The one forward pass ([`LlamaModel::forward`]), its closure form for recorded decode steps,
//! and the single-sequence reference runs built on it.

use starling_backend::{Backend, BackendError, BatchMeta, DeviceForward, HostTensor};

use super::layer::StepContext;
use super::{ForwardOptions, LlamaModel, Logits};
use crate::ModelError;

impl<B: Backend> LlamaModel<B> {
    /// Runs the batch's tokens through the model, writing their K/V into `caches` (one per
    /// layer), and returns the f32 logits of `meta.logits_rows` in backend memory ([`Logits`]:
    /// `to_host` copies them, `into_device` keeps them for sampling where they are); none when
    /// the batch asks for no rows (the head is skipped). `options` names what else to copy to
    /// the host (query rows, every layer's Q/K/V input); with none, the default, the pass issues
    /// backend ops only (token ids read through
    /// [`ModelOps::embedding_for_batch`](starling_backend::ModelOps::embedding_for_batch)), which
    /// is what a recorded decode step needs ([`device_forward`](Self::device_forward)).
    pub fn forward(
        &self,
        backend: &B,
        token_ids: &[u32],
        meta: &BatchMeta,
        batch: &B::Batch,
        caches: &mut [B::KvCache],
        options: ForwardOptions<'_>,
    ) -> Result<Logits<B>, ModelError> {
        let ForwardOptions {
            mut queries,
            mut activations,
        } = options;
        if let Some(capture) = queries.as_deref_mut() {
            capture.start(token_ids.len())?;
        }
        let num_slots = self.cache_groups.num_slots();
        if caches.len() != num_slots
            || token_ids.len() != meta.num_tokens()
            || meta.num_cache_groups() != self.cache_groups.num_groups()
        {
            return Err(ModelError::InvalidConfig(format!(
                "forward: {} caches for {num_slots} cache slots, {} ids for {} batch rows, {} \
                 cache groups for {}",
                caches.len(),
                token_ids.len(),
                meta.num_tokens(),
                meta.num_cache_groups(),
                self.cache_groups.num_groups()
            )));
        }
        let ctx = StepContext {
            dims: &self.dims,
            rope: &self.rope,
            batch,
            eps: self.config.rms_norm_eps,
        };
        let mut residual = backend.embedding_for_batch(&self.embed_tokens, token_ids, batch)?;
        if let Some(scale) = self
            .config
            .architecture
            .embedding_scale(self.config.hidden_size)
        {
            backend.scale_inplace(&mut residual, scale)?;
        }
        let mut pending_delta: Option<B::Tensor> = None;
        for (index, layer) in self.layers.iter().enumerate() {
            let cache = &mut caches[layer.cache_slot];
            let x = layer.input_norm(backend, &mut residual, pending_delta.take(), ctx.eps)?;
            if let Some(a) = activations.as_deref_mut() {
                a.attention_input(index, &backend.to_host(&x)?)?;
            }
            let delta = layer.step(
                backend,
                &x,
                &mut residual,
                cache,
                &ctx,
                queries.as_deref_mut(),
            )?;
            pending_delta = Some(delta);
        }
        self.head(backend, &mut residual, pending_delta, &meta.logits_rows)
    }

    /// [`forward`](Self::forward) with no options and the logits left in backend memory, as the
    /// closure a backend records decode graphs from ([`starling_backend::DeviceForward`]); a
    /// backend error passes through as itself.
    pub fn device_forward(&self) -> Box<DeviceForward<'_, B>> {
        Box::new(move |backend, ids, meta, batch, caches| {
            let logits = self
                .forward(backend, ids, meta, batch, caches, ForwardOptions::default())
                .map_err(|e| match e {
                    ModelError::Backend(b) => b,
                    other => BackendError::Device(other.to_string()),
                })?;
            logits
                .into_device()
                .ok_or_else(|| BackendError::Device("device forward: no logits rows".into()))
        })
    }

    /// Runs `ids` as one sequence through a fresh private cache (token `i` in slot `i`) and
    /// returns the logits of `logits_rows` on the host (`[0, vocab]` for none: the head is
    /// skipped); `options` as for [`forward`](Self::forward). The reference path for parity
    /// tests, quality measurements and calibration (the engine batches instead).
    pub fn forward_sequence(
        &self,
        backend: &B,
        ids: &[u32],
        logits_rows: Vec<u32>,
        options: ForwardOptions<'_>,
    ) -> Result<HostTensor, ModelError> {
        const BLOCK_TOKENS: usize = 16;
        if ids.is_empty() {
            return Err(ModelError::InvalidConfig(
                "a single-sequence run needs at least one token".into(),
            ));
        }
        let n = ids.len();
        let blocks = n.div_ceil(BLOCK_TOKENS);
        let groups = self.cache_groups.num_groups();
        let mut caches = self.alloc_kv_caches(backend, groups * blocks, BLOCK_TOKENS)?;
        // Blocks 0.. in order, so token i lives in slot i (group g: in its blocks g·blocks..).
        let every_row: Vec<u32> = (0..n as u32).collect();
        let mut meta = BatchMeta::single_sequence(
            0,
            n,
            every_row,
            (0..blocks as u32).collect(),
            BLOCK_TOKENS,
            logits_rows,
        );
        meta.replicate_groups(groups, blocks);
        let batch = backend.prepare_batch(&meta, groups * blocks)?;
        self.forward(backend, ids, &meta, &batch, &mut caches, options)?
            .to_host(backend)
    }

    /// Logits at every position of `ids`, one row each, from
    /// [`forward_sequence`](Self::forward_sequence).
    pub fn sequence_logits(&self, backend: &B, ids: &[u32]) -> Result<Vec<Vec<f32>>, ModelError> {
        let every_row: Vec<u32> = (0..ids.len() as u32).collect();
        let logits = self.forward_sequence(backend, ids, every_row, ForwardOptions::default())?;
        Ok(logits
            .data()
            .chunks(self.config.vocab_size)
            .map(<[f32]>::to_vec)
            .collect())
    }
}
