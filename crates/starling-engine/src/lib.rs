//! Sequences, the scheduler (continuous batching, chunked prefill, preemption), the sampler and
//! the engine step loop.
#![deny(missing_docs)]

pub mod engine;
pub mod sampling;
pub mod scheduler;
pub mod testing;

pub use engine::{
    CacheReport, Engine, EngineConfig, EngineCounters, EngineError, EngineStats, FailureKind,
    PrefixCacheCounters, RequestFailure, RequestOptions, RequestOutput, WarmUp,
    DEFAULT_COMPACTION_STEP_BUDGET_TOKENS,
};
