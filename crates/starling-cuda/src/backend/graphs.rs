//! Decode steps replayed from CUDA graphs, one per batch-size bucket ([`CudaDecodeGraphs`]).
//!
//! Recording a bucket: a replay batch of the bucket's size is allocated ([`CudaBatch::for_replay`];
//! fixed addresses for every input a replay reads), filled with the step, and the model's forward
//! pass runs once eagerly on it (it caches the RoPE table and lets cuBLAS settle), then once
//! under stream capture. Everything the forward allocates is allocated on the stream with
//! `cuMemAllocAsync` (cudarc), so under capture it becomes graph memory nodes, freed inside the
//! graph, at the same size on every replay; only the logits outlive the pass, and they are copied
//! into a buffer the bucket owns before the capture ends. A replay writes the step's inputs with
//! one host-to-device copy, launches the graph and copies the real rows' logits back.
//!
//! What cannot vary inside a graph is fixed per bucket or read from the device: the row count
//! (padding rows, see `batch.rs`), the block-table width (`max_model_len`), and the attention
//! launch's split count, which is sized for the most splits any step of the bucket can plan
//! ([`max_splits_for_bucket`]) while the step's own plan — the same [`plan_splits`] result an
//! eager step computes — is written with the inputs and read by the kernels, so unused splits
//! exit at once and a replayed step does the eager step's arithmetic.

use cudarc::driver::sys::{CUgraphInstantiate_flags, CUstreamCaptureMode};
use cudarc::driver::{CudaGraph, CudaSlice, DevicePtr};
use starling_backend::{
    BackendError, DecodeGraphConfig, DecodeGraphs, DecodeStep, DeviceForward, HostTensor,
};

use super::attention_plan::plan_splits;
use super::batch::{padded_meta, replay_inputs, replayable_rows, ReplayShape};
use super::{CudaBackend, CudaBatch, CudaKvCache};
use crate::{CudaError, DeviceBuf};

/// The batch sizes steps are padded to: powers of two up to `max_num_seqs`, which is always the
/// last (so no step is larger than the largest bucket). Padding costs at most twice the rows,
/// which at decode sizes is weight-bound GEMM work that barely grows with rows.
pub(crate) fn bucket_sizes(max_num_seqs: usize) -> Vec<usize> {
    let mut sizes = Vec::new();
    let mut b = 1;
    while b < max_num_seqs {
        sizes.push(b);
        b *= 2;
    }
    if max_num_seqs > 0 {
        sizes.push(max_num_seqs);
    }
    sizes
}

/// Index of the smallest bucket holding `rows`.
pub(crate) fn bucket_for(buckets: &[usize], rows: usize) -> Option<usize> {
    buckets.iter().position(|&b| b >= rows)
}

/// Most attention splits any step of bucket `index` can plan: [`plan_splits`] splits more the
/// fewer rows and the longer the context, so its bound is at the bucket's fewest real rows (one
/// more than the bucket below) and the longest context.
pub(crate) fn max_splits_for_bucket(
    buckets: &[usize],
    index: usize,
    num_kv_heads: usize,
    max_model_len_tokens: usize,
    num_sms: usize,
) -> usize {
    let fewest_rows = if index == 0 {
        1
    } else {
        buckets[index - 1] + 1
    };
    plan_splits(fewest_rows * num_kv_heads, 0, max_model_len_tokens, num_sms).splits
}

/// A recorded graph. CUDA graph objects may be used from any thread when calls on one graph are
/// serialised; the owner only touches it through `&mut self`.
struct RecordedGraph(CudaGraph);
// SAFETY: see above; the graph handles are plain driver handles, not tied to a thread.
unsafe impl Send for RecordedGraph {}

/// One bucket's graph and the buffers it reads and writes.
struct BucketGraph {
    batch: CudaBatch,
    graph: RecordedGraph,
    /// `[rows, vocab]` f32, written by the graph's last node.
    logits: CudaSlice<f32>,
    vocab: usize,
    /// The K/V buffers the graph writes, to notice a different cache set.
    cache_ptrs: Vec<u64>,
}

enum BucketState {
    Empty,
    Ready(Box<BucketGraph>),
    /// Recording failed once: the bucket's steps run eagerly.
    Failed,
}

/// Recorded decode steps of one model over one set of caches (see the module docs).
pub struct CudaDecodeGraphs {
    config: DecodeGraphConfig,
    buckets: Vec<usize>,
    max_blocks: usize,
    states: Vec<BucketState>,
}

impl CudaDecodeGraphs {
    pub(crate) fn new(config: &DecodeGraphConfig) -> Result<Self, CudaError> {
        if config.block_size_tokens == 0 || config.max_num_seqs == 0 {
            return Err(CudaError::Shape(format!(
                "decode graphs: {config:?} has no rows or a zero block size"
            )));
        }
        let buckets = bucket_sizes(config.max_num_seqs);
        Ok(Self {
            config: *config,
            max_blocks: config
                .max_model_len_tokens
                .div_ceil(config.block_size_tokens)
                .max(1),
            states: buckets.iter().map(|_| BucketState::Empty).collect(),
            buckets,
        })
    }

    fn record(
        &self,
        backend: &CudaBackend,
        index: usize,
        step: DecodeStep<'_>,
        caches: &mut [CudaKvCache],
        forward: &mut DeviceForward<'_, CudaBackend>,
    ) -> Result<BucketGraph, CudaError> {
        let stream = backend.stream();
        let num_kv_heads = kv_heads(caches)?;
        let rows = self.buckets[index];
        let shape = ReplayShape {
            rows,
            max_blocks: self.max_blocks,
            max_splits: max_splits_for_bucket(
                &self.buckets,
                index,
                num_kv_heads,
                self.config.max_model_len_tokens,
                backend.num_sms,
            ),
            num_kv_heads,
            block_size_tokens: self.config.block_size_tokens,
        };
        let mut batch = CudaBatch::for_replay(stream, shape)?;
        let plan = step_plan(backend, step, num_kv_heads);
        let host = replay_inputs(
            &batch.layout,
            self.max_blocks,
            step.meta,
            step.token_ids,
            plan,
        );
        batch.write(stream, &host)?;
        let meta = padded_meta(rows, self.config.block_size_tokens);
        let mut ids = step.token_ids.to_vec();
        ids.resize(rows, 0);
        // Warm-up: the step itself, eagerly, on the replay batch.
        let warm = forward(backend, &ids, &meta, &batch, caches)?;
        let vocab = match warm.shape() {
            [r, v] if *r == rows => *v,
            s => {
                return Err(CudaError::Shape(format!(
                    "decode graphs: logits {s:?} for {rows} rows"
                )))
            }
        };
        drop(warm);
        backend.synchronize()?;
        let mut logits = stream.alloc_zeros::<f32>(rows * vocab)?;
        backend.begin_recording()?;
        let recorded = forward(backend, &ids, &meta, &batch, caches)
            .map_err(CudaError::from)
            .and_then(|out| match &out.buf {
                DeviceBuf::F32(src) => Ok(stream.memcpy_dtod(src, &mut logits)?),
                DeviceBuf::Bf16(_) => Err(CudaError::Shape("decode graphs: bf16 logits".into())),
            });
        // End the capture whatever happened, so the stream is usable again.
        let ended = backend.end_recording();
        recorded?;
        let graph = ended?.ok_or_else(|| {
            CudaError::Shape("decode graphs: the capture recorded nothing".into())
        })?;
        graph.upload()?;
        Ok(BucketGraph {
            batch,
            graph: RecordedGraph(graph),
            logits,
            vocab,
            cache_ptrs: cache_ptrs(backend, caches),
        })
    }

    fn run_cuda(
        &mut self,
        backend: &CudaBackend,
        step: DecodeStep<'_>,
        caches: &mut [CudaKvCache],
        forward: &mut DeviceForward<'_, CudaBackend>,
    ) -> Result<Option<HostTensor>, CudaError> {
        let Some(n) = replayable_rows(step.meta, step.token_ids, self.max_blocks) else {
            return Ok(None);
        };
        step.meta.validate(self.config.num_cache_blocks)?;
        if step.meta.block_size_tokens != self.config.block_size_tokens || caches.is_empty() {
            return Ok(None);
        }
        let Some(index) = bucket_for(&self.buckets, n) else {
            return Ok(None);
        };
        let num_kv_heads = kv_heads(caches)?;
        let plan = step_plan(backend, step, num_kv_heads);
        let bound = max_splits_for_bucket(
            &self.buckets,
            index,
            num_kv_heads,
            self.config.max_model_len_tokens,
            backend.num_sms,
        );
        if plan.splits > bound {
            // Only a context past max_model_len plans more: not this bucket's shape.
            return Ok(None);
        }
        let ptrs = cache_ptrs(backend, caches);
        if let BucketState::Ready(g) = &self.states[index] {
            let heads = g.batch.replay.map(|r| r.num_kv_heads);
            if g.cache_ptrs != ptrs || heads != Some(num_kv_heads) {
                // Another cache set: every recording writes into the old one.
                self.states.iter_mut().for_each(|s| *s = BucketState::Empty);
            }
        }
        if matches!(self.states[index], BucketState::Empty) {
            match self.record(backend, index, step, caches, forward) {
                Ok(g) => self.states[index] = BucketState::Ready(Box::new(g)),
                Err(e) => {
                    tracing::warn!(
                        "recording the decode graph of {} rows failed ({e}); its steps run eagerly",
                        self.buckets[index]
                    );
                    self.states[index] = BucketState::Failed;
                    return Ok(None);
                }
            }
        }
        let BucketState::Ready(g) = &mut self.states[index] else {
            return Ok(None);
        };
        if let Some(bad) = step.token_ids.iter().find(|&&t| t as usize >= g.vocab) {
            return Err(CudaError::Shape(format!(
                "token id {bad} outside a vocabulary of {}",
                g.vocab
            )));
        }
        let stream = backend.stream();
        let host = replay_inputs(
            &g.batch.layout,
            self.max_blocks,
            step.meta,
            step.token_ids,
            plan,
        );
        g.batch.write(stream, &host)?;
        g.graph.0.launch()?;
        // Padding rows come last: copy the real rows only.
        let real: Vec<f32> = stream.clone_dtoh(&g.logits.slice(..n * g.vocab))?;
        let vocab = g.vocab;
        let mut out = Vec::with_capacity(step.meta.logits_rows.len() * vocab);
        for &r in &step.meta.logits_rows {
            let r = r as usize;
            out.extend_from_slice(&real[r * vocab..(r + 1) * vocab]);
        }
        Ok(Some(HostTensor::new(
            vec![step.meta.logits_rows.len(), vocab],
            out,
        )?))
    }
}

/// The split plan an eager run of `step` makes (every row decodes, so all are per-token rows).
fn step_plan(
    backend: &CudaBackend,
    step: DecodeStep<'_>,
    num_kv_heads: usize,
) -> super::attention_plan::SplitPlan {
    let max_visible = step
        .meta
        .seqs
        .iter()
        .map(|s| s.context_len_tokens)
        .max()
        .unwrap_or(0);
    plan_splits(
        step.meta.seqs.len() * num_kv_heads,
        0,
        max_visible,
        backend.num_sms,
    )
}

fn kv_heads(caches: &[CudaKvCache]) -> Result<usize, CudaError> {
    caches
        .first()
        .map(|c| c.spec().num_kv_heads)
        .ok_or_else(|| CudaError::Shape("decode graphs: no caches".into()))
}

fn cache_ptrs(backend: &CudaBackend, caches: &[CudaKvCache]) -> Vec<u64> {
    let stream = backend.stream();
    caches
        .iter()
        .flat_map(|c| [c.keys.device_ptr(stream).0, c.values.device_ptr(stream).0])
        .collect()
}

impl DecodeGraphs<CudaBackend> for CudaDecodeGraphs {
    fn run(
        &mut self,
        backend: &CudaBackend,
        step: DecodeStep<'_>,
        caches: &mut [CudaKvCache],
        forward: &mut DeviceForward<'_, CudaBackend>,
    ) -> Result<Option<HostTensor>, BackendError> {
        self.run_cuda(backend, step, caches, forward)
            .map_err(BackendError::from)
    }

    fn buckets(&self) -> &[usize] {
        &self.buckets
    }
}

impl CudaBackend {
    /// Starts recording the stream (thread-local capture: other threads' CUDA calls do not
    /// invalidate it); uploads are refused until [`CudaBackend::end_recording`].
    fn begin_recording(&self) -> Result<(), CudaError> {
        self.stream
            .begin_capture(CUstreamCaptureMode::CU_STREAM_CAPTURE_MODE_THREAD_LOCAL)?;
        self.recording
            .store(true, std::sync::atomic::Ordering::Relaxed);
        Ok(())
    }

    /// Ends the capture and instantiates what it recorded.
    fn end_recording(&self) -> Result<Option<CudaGraph>, CudaError> {
        self.recording
            .store(false, std::sync::atomic::Ordering::Relaxed);
        Ok(self.stream.end_capture(CUgraphInstantiate_flags(0))?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_powers_of_two_ending_at_the_limit() {
        assert_eq!(bucket_sizes(1), vec![1]);
        assert_eq!(bucket_sizes(8), vec![1, 2, 4, 8]);
        assert_eq!(bucket_sizes(6), vec![1, 2, 4, 6]);
        assert_eq!(bucket_sizes(256).len(), 9);
        assert!(bucket_sizes(0).is_empty());
    }

    #[test]
    fn each_batch_goes_to_the_smallest_bucket_that_holds_it() {
        let b = bucket_sizes(6);
        assert_eq!(bucket_for(&b, 1), Some(0));
        assert_eq!(bucket_for(&b, 3), Some(2));
        assert_eq!(bucket_for(&b, 4), Some(2));
        assert_eq!(bucket_for(&b, 5), Some(3));
        assert_eq!(bucket_for(&b, 6), Some(3));
        assert_eq!(bucket_for(&b, 7), None);
    }

    #[test]
    fn the_bucket_split_bound_covers_every_step_it_serves() {
        let buckets = bucket_sizes(64);
        for kv in [1, 4, 8, 32] {
            for (i, &b) in buckets.iter().enumerate() {
                let bound = max_splits_for_bucket(&buckets, i, kv, 4096, 132);
                let fewest = if i == 0 { 1 } else { buckets[i - 1] + 1 };
                for rows in fewest..=b {
                    for visible in [1, 255, 256, 257, 1000, 4095, 4096] {
                        let p = plan_splits(rows * kv, 0, visible, 132);
                        assert!(p.splits <= bound, "kv {kv} rows {rows} visible {visible}");
                    }
                }
            }
        }
        // Batch 1 of 32 KV heads at 4k: ceil(1056 / 32) = 33 splits, capped by 4096 / 256 = 16.
        assert_eq!(max_splits_for_bucket(&buckets, 0, 32, 4096, 132), 16);
    }

    #[test]
    fn graphs_need_rows_and_a_block_size() {
        let config = DecodeGraphConfig {
            max_num_seqs: 4,
            max_model_len_tokens: 100,
            block_size_tokens: 16,
            num_cache_blocks: 10,
        };
        let g = CudaDecodeGraphs::new(&config).expect("valid config");
        assert_eq!(g.buckets(), &[1, 2, 4]);
        assert_eq!(g.max_blocks, 7);
        let zero = DecodeGraphConfig {
            block_size_tokens: 0,
            ..config
        };
        assert!(CudaDecodeGraphs::new(&zero).is_err());
    }
}
