//! Which tokens a compaction keeps: the selection over scores ([`select_keep`], per KV head;
//! [`select_keep_layer_wide`], one choice for the layer) and one layer's plan around it
//! ([`KeepPlan`]: a kept prefix and tail, protected sinks and window, slots left in place). The
//! host definitions; CUDA selects the same indices where the scores are.

mod plan;
mod select;

pub use plan::KeepPlan;
pub use select::{keep_count, protected_count, select_keep, select_keep_layer_wide};
