//! Engine errors.

use starling_kv::{KvError, SeqId};

use crate::sampling::SamplingError;
use crate::scheduler::SchedulerError;

/// Errors the engine reports; request-level ones leave the engine serving.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The KV cache could not be sized (e.g. one max-length sequence does not fit).
    #[error(transparent)]
    Kv(#[from] KvError),
    /// The scheduler refused a request or a transition.
    #[error(transparent)]
    Scheduler(#[from] SchedulerError),
    /// Invalid sampling parameters, or logits that cannot be sampled (NaN, all masked); the
    /// message says which.
    #[error(transparent)]
    Sampling(#[from] SamplingError),
    /// The model or backend failed while running a step.
    #[error("model error: {0}")]
    Model(#[from] starling_models::ModelError),
    /// A backend failure outside the model (cache allocation, batch upload).
    #[error("backend error: {0}")]
    Backend(#[from] starling_backend::BackendError),
    /// Token eviction failed (invalid compression configuration or scorer input).
    #[error("kv compression: {0}")]
    Compression(#[from] starling_evict::EvictError),
    /// A STAR-KV checkpoint could not be loaded or does not fit the model.
    #[error("STAR-KV: {0}")]
    StarKv(#[from] starling_starkv::StarKvError),
    /// A prompt that cannot be served (empty, too long, token ids outside the vocabulary).
    #[error("invalid request: {0}")]
    InvalidRequest(String),
    /// An id the engine does not know (already finished or never added).
    #[error("unknown request {0:?}")]
    UnknownRequest(SeqId),
}
