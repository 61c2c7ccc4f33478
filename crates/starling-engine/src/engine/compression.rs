//! Token eviction inside the engine: a request's policy ([`SeqCompression`]: when it is due and
//! to what target) and the per-layer step that evicts ([`compact_layer`]: score → select →
//! compact). `compaction.rs` schedules those steps across engine steps.
//!
//! The target is computed from the *logical* length (tokens the model has seen): a request at
//! ratio r keeps `keep_tokens(logical)`, so compressing again after more tokens arrive tops the
//! cache back down to the ratio instead of compounding it. A compression runs when the surplus
//! reaches `every_n_tokens` (during chunked prefill that is as blocks fill, so peak memory stays
//! bounded by target + one chunk) and once more when a prompt completes, so decoding starts
//! exactly at the target.
//!
//! Under the context/question split ([`crate::RequestOptions::question_tokens`], kvpress's
//! protocol) only the context is evicted, once, when the prompt completes; the question, the chat
//! template's tail and every generated token are kept.
//!
//! With prefix caching, a request's leading blocks may be shared with other requests, which read
//! them: those are never compacted. The *shared prefix* (`first_evictable_tokens`, whole blocks)
//! is kept as it is and eviction chooses only among the tokens after it (the sink protection
//! counts from the sequence's start, so it falls inside the prefix when the prefix is longer);
//! compaction is handed only the blocks from the first slot that may move
//! (`first_rewritten_tokens`: the prefix and the sinks after it stay in place), so a block
//! before it is not even written with its own values.
//!
//! Every score is computed where the cache lives (`Backend::key_scores` for KeyDiff and KNorm,
//! `Backend::window_scores` for SnapKV and TOVA) and the backend selects and compacts by it
//! there (`Backend::compact_kv_by_scores`: no scores cross to the host, so a compaction never
//! waits for the device); StreamingLLM and Random read no keys at all and select on the host.

use starling_backend::{
    AttentionDims, Backend, HostTensor, KeepPlan, KeyScoreKind, KvCacheSpec, LatentFactors,
    RopeSpec, WindowScoreSpec,
};
use starling_evict::scorer::SnapKv;
use starling_evict::{
    scorer_for, CompressionConfig, CompressionMethod, HeadKeys, ScoreInput, Scorer,
};

use super::EngineError;
use crate::scheduler::Footprint;

/// The most token slots one sequence of `total_tokens` holds at once under `policy` (all of
/// them when it does not evict): its kept tokens plus what arrives between compactions and one
/// prefill chunk of `chunk_tokens` in flight. The engine's preflight and admission count this.
pub fn eviction_peak_tokens(
    policy: &starling_evict::CompressionConfig,
    total_tokens: usize,
    chunk_tokens: usize,
) -> usize {
    match SeqCompression::new(policy, None) {
        None => total_tokens,
        Some(c) => {
            Footprint::compressed(c.peak_tokens(total_tokens), total_tokens, chunk_tokens)
                .max_held_tokens
        }
    }
}

/// The longest sequence whose peak under `policy` ([`eviction_peak_tokens`]) fits
/// `capacity_tokens` slots (the peak grows with the length, so a bisection finds it).
pub fn longest_evicting_context(
    policy: &starling_evict::CompressionConfig,
    capacity_tokens: usize,
    chunk_tokens: usize,
) -> usize {
    let fits = |len: usize| eviction_peak_tokens(policy, len, chunk_tokens) <= capacity_tokens;
    if !policy.evicts() {
        return capacity_tokens;
    }
    let (mut lo, mut hi) = (capacity_tokens, capacity_tokens.saturating_mul(64).max(1));
    if fits(hi) {
        return hi;
    }
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    lo
}

/// A request's eviction policy and its scorer.
pub(crate) struct SeqCompression {
    pub(crate) config: CompressionConfig,
    scorer: Box<dyn Scorer>,
    /// The context/question split: the prompt's last this many tokens are never evicted.
    question_tokens: Option<usize>,
}

/// A compression decided for a step: the physical length to compress to, and which of the
/// request's physical tokens are open to eviction: `first_evictable_tokens..evictable_tokens`
/// (the tokens before and after are all kept).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct DueTarget {
    pub(crate) target_tokens: usize,
    pub(crate) evictable_tokens: usize,
    /// The shared prefix, kept whole (0 when nothing is shared).
    pub(crate) first_evictable_tokens: usize,
    /// Slots below this stay where they are in every layer and head (the prefix, then the
    /// protected sinks right after it): what the compaction announces to the prefix cache.
    pub(crate) first_rewritten_tokens: usize,
}

impl DueTarget {
    /// The target for evicting among `first..evictable` of `physical` tokens down to
    /// `target_tokens` (raised so the protected candidates and everything outside the range
    /// are kept; `None` when nothing would be evicted).
    fn new(
        config: &CompressionConfig,
        target_tokens: usize,
        first: usize,
        evictable: usize,
        physical: usize,
    ) -> Option<Self> {
        let first = first.min(evictable);
        let sinks = config.sink_tokens.saturating_sub(first);
        let candidates = evictable - first;
        let protected = starling_evict::protected_count(
            candidates,
            sinks,
            config.window_tokens.min(candidates),
        );
        let floor = first + protected + (physical - evictable);
        let target_tokens = target_tokens.max(floor);
        (target_tokens < physical).then_some(Self {
            target_tokens,
            evictable_tokens: evictable,
            first_evictable_tokens: first,
            first_rewritten_tokens: first + sinks.min(candidates),
        })
    }
}

impl SeqCompression {
    /// The policy of `config`; `None` when it never evicts (method `none` or ratio 0), so such
    /// requests take exactly the uncompressed path. `question_tokens` splits the prompt into a
    /// context (evicted) and a question (kept).
    pub(crate) fn new(config: &CompressionConfig, question_tokens: Option<usize>) -> Option<Self> {
        scorer_for(config).map(|scorer| Self {
            config: config.clone(),
            scorer,
            question_tokens,
        })
    }

    /// Whether scoring needs the observation-window queries (SnapKV, TOVA).
    pub(crate) fn needs_queries(&self) -> bool {
        self.scorer.needs_queries()
    }

    /// The observation window, tokens: the question under the context/question split (SnapKV
    /// then scores with the question's queries), else the configuration's `window_tokens`;
    /// TOVA always reads the newest query only.
    pub(crate) fn observation_window_tokens(&self) -> usize {
        let window = self.question_tokens.unwrap_or(self.config.window_tokens);
        self.scorer.observation_window_tokens(window).max(1)
    }

    /// The most slots a request that grows to `total_tokens` holds between compactions: its
    /// target at that length plus the surplus it may gather before the next compaction (less
    /// when the surplus could not arise). The transient prefill chunk is reserved by the
    /// scheduler once for all requests. Under the context/question split the whole prompt is
    /// held until it completes, so the projection is the uncompressed length.
    pub(crate) fn peak_tokens(&self, total_tokens: usize) -> usize {
        if self.question_tokens.is_some() {
            return total_tokens;
        }
        let target = self.config.keep_tokens(total_tokens);
        (target + self.config.every_n_tokens).min(total_tokens)
    }

    /// The compression due after a step leaves the request with `logical` and `physical`
    /// tokens, or `None`. `prompt_completed` is true on the step that finished the prompt's
    /// prefill; `num_prompt_tokens` locates the question under the context/question split;
    /// the first `shared_prefix_tokens` physical tokens are shared with other requests and
    /// kept whole.
    pub(crate) fn due_target(
        &self,
        logical_tokens: usize,
        physical_tokens: usize,
        prompt_completed: bool,
        num_prompt_tokens: usize,
        shared_prefix_tokens: usize,
    ) -> Option<DueTarget> {
        let shared = shared_prefix_tokens.min(physical_tokens);
        if let Some(question) = self.question_tokens {
            // Once, when the prompt is in: nothing was evicted before, so physical index i is
            // token i and the context is the first `prompt - question` of them.
            if !prompt_completed || physical_tokens != logical_tokens {
                return None;
            }
            let context = num_prompt_tokens
                .saturating_sub(question)
                .min(physical_tokens);
            let target = self.config.keep_tokens(context) + (physical_tokens - context);
            return DueTarget::new(&self.config, target, shared, context, physical_tokens);
        }
        let target = self.config.keep_tokens(logical_tokens);
        let due = DueTarget::new(
            &self.config,
            target,
            shared,
            physical_tokens,
            physical_tokens,
        )?;
        let surplus = physical_tokens - due.target_tokens;
        (surplus >= self.config.every_n_tokens || prompt_completed).then_some(due)
    }

    /// The name of what this policy keeps at a prefill point with chunks cut at multiples of
    /// `stride_tokens`, when that is a function of the tokens before the point (scores from
    /// the keys or positions alone, no question split): every field of the policy and the
    /// stride. `None` for SnapKV and TOVA (their window's queries), Random (a stream of
    /// draws) and the question split (the prompt's end). See `compacted_prefix.rs`.
    pub(crate) fn cacheable_state_name(&self, stride_tokens: usize) -> Option<String> {
        let pure = matches!(
            self.config.method,
            CompressionMethod::KeyDiff | CompressionMethod::KNorm | CompressionMethod::StreamingLlm
        );
        if !pure || self.question_tokens.is_some() || self.needs_queries() {
            return None;
        }
        let policy = serde_json::to_string(&self.config).ok()?;
        Some(format!("{policy};stride={stride_tokens}"))
    }

    /// Whether the policy may compact before the prompt is in (as chunks fill); under the
    /// context/question split it compacts once, when the prompt is in.
    pub(crate) fn compacts_during_prefill(&self) -> bool {
        self.question_tokens.is_none()
    }

    /// Where this policy's scores come from.
    fn scoring(&self) -> Scoring {
        match self.config.method {
            CompressionMethod::KeyDiff => Scoring::Keys(KeyScoreKind::KeyDiff),
            CompressionMethod::KNorm => Scoring::Keys(KeyScoreKind::KNorm),
            CompressionMethod::SnapKv => Scoring::Window {
                pool_kernel_tokens: SnapKv::default().pool_kernel_tokens,
            },
            CompressionMethod::Tova => Scoring::Window {
                pool_kernel_tokens: 1,
            },
            CompressionMethod::StreamingLlm
            | CompressionMethod::Random
            | CompressionMethod::None => Scoring::Keyless,
        }
    }
}

/// Where a layer's scores are computed.
enum Scoring {
    /// A key statistic, by `Backend::key_scores`.
    Keys(KeyScoreKind),
    /// Observation-window attention, by `Backend::window_scores`.
    Window { pool_kernel_tokens: usize },
    /// From positions alone (StreamingLLM, Random): the host scorer, given no keys.
    Keyless,
}

/// Shapes of the attention the cache serves.
#[derive(Debug, Clone, Copy)]
pub(crate) struct HeadShape {
    pub(crate) num_kv_heads: usize,
    pub(crate) head_dim: usize,
    /// Query heads per KV head.
    pub(crate) group: usize,
}

/// One layer's compaction of one request.
#[derive(Clone, Copy)]
pub(crate) struct LayerJob<'a> {
    pub(crate) block_table: &'a [u32],
    pub(crate) block_size_tokens: usize,
    pub(crate) physical_tokens: usize,
    pub(crate) due: DueTarget,
    /// The layer's observation-window queries, `[window, q_size]`: the request's last
    /// `window` physical tokens (SnapKV, TOVA).
    pub(crate) queries: Option<&'a HostTensor>,
}

/// What scoring a STAR-KV latent layer needs: its up-projections and rotary embedding, to
/// reconstruct the keys every method scores (post-RoPE, as a full layer caches them).
pub(crate) struct LatentScoring<'a, T> {
    pub(crate) factors: LatentFactors<'a, T>,
    pub(crate) dims: &'a AttentionDims,
    pub(crate) rope: &'a RopeSpec,
}

/// Score → select → compact, for one layer of one request: afterwards the layer's first
/// `due.target_tokens` physical slots hold the kept tokens of every head, in order. Selection
/// is per KV head, or layer-wide when the method asks for it (TOVA), the policy does
/// (`head_wise: false`) or the layer's heads share rows. A latent layer (`latent`) is scored
/// on its keys reconstructed into a private full cache of the request's length and compacted
/// with one list (key latents, value latent and position move together). Scores computed where
/// the cache lives stay there: the backend selects and compacts by them
/// (`Backend::compact_kv_by_scores`), so nothing waits for the device. The caller shrinks the
/// block table once every layer is done.
pub(crate) fn compact_layer<B: Backend>(
    backend: &B,
    cache: &mut B::KvCache,
    policy: &SeqCompression,
    shape: HeadShape,
    job: &LayerJob<'_>,
    layer: usize,
    latent: Option<LatentScoring<'_, B::Tensor>>,
) -> Result<LayerMicros, EngineError> {
    let started = std::time::Instant::now();
    let mut micros = LayerMicros::default();
    let n = job.physical_tokens;
    let plan = keep_plan(policy, shape, job, latent.is_some());
    let scores = match &latent {
        None => layer_scores(backend, cache, policy, shape, job, layer)?,
        Some(l) => {
            // Physical index i of the reconstruction sits in slot i.
            let blocks = n.div_ceil(job.block_size_tokens).max(1);
            let spec = KvCacheSpec::full(
                blocks,
                job.block_size_tokens,
                shape.num_kv_heads,
                shape.head_dim,
                backend.kv_cache_dtype(),
            );
            let mut dense = backend.alloc_kv_cache(&spec)?;
            let table: Vec<u32> = (0..blocks as u32).collect();
            backend.reconstruct_kv(
                cache,
                &l.factors,
                l.dims,
                l.rope,
                job.block_table,
                n,
                &mut dense,
                &table,
            )?;
            let dense_job = LayerJob {
                block_table: &table,
                ..*job
            };
            layer_scores(backend, &dense, policy, shape, &dense_job, layer)?
        }
    };
    micros.score = started.elapsed().as_micros() as u64;
    let (table, bs) = (job.block_table, job.block_size_tokens);
    match scores {
        LayerScores::Device(scores) => {
            backend.compact_kv_by_scores(cache, table, bs, &scores, &plan)?;
        }
        LayerScores::Host(scores) => plan.compact_on_host(backend, cache, table, bs, &scores)?,
    }
    micros.compact = started.elapsed().as_micros() as u64 - micros.score;
    Ok(micros)
}

/// The selection of one layer's compaction: the due target's ranges, the policy's protection,
/// per KV head or layer-wide (the method asks for it, the policy does, or a latent layer's
/// heads share rows: one list), and the leading whole blocks left in place (the prefix and
/// the sinks after it: they may be shared, now or by a request admitted while this compaction
/// spans steps, and a shared block is never written, not even with its own values).
fn keep_plan(
    policy: &SeqCompression,
    shape: HeadShape,
    job: &LayerJob<'_>,
    latent: bool,
) -> KeepPlan {
    let n = job.physical_tokens;
    let due = job.due;
    let evictable = due.evictable_tokens.min(n);
    let bs = job.block_size_tokens.max(1);
    KeepPlan {
        physical_tokens: n,
        target_tokens: due.target_tokens,
        first_evictable_tokens: due.first_evictable_tokens.min(evictable),
        evictable_end_tokens: evictable,
        sink_tokens: policy.config.sink_tokens,
        window_tokens: policy.config.window_tokens,
        // A latent layer's heads share one value latent per token: one list for all of them.
        layer_wide: latent || policy.scorer.layer_wide() || !policy.config.head_wise,
        lists: if latent { 1 } else { shape.num_kv_heads },
        skip_tokens: due.first_rewritten_tokens / bs * bs,
    }
}

/// One layer's scores, `[num_kv_heads, n]`: where the cache lives, or made on the host.
enum LayerScores<T> {
    Device(T),
    Host(HostTensor),
}

/// Host time of one layer's compaction by phase, microseconds: issuing the scoring (on a
/// device backend its launches; on the CPU the work itself), and the selection and compaction
/// (on a device backend launches too: nothing here waits for the device).
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct LayerMicros {
    pub(crate) score: u64,
    pub(crate) compact: u64,
}

impl std::ops::AddAssign for LayerMicros {
    fn add_assign(&mut self, other: Self) {
        self.score += other.score;
        self.compact += other.compact;
    }
}

/// One score row per KV head, `n` long: computed where the cache lives (left there), or on
/// the host for the methods that read no keys.
fn layer_scores<B: Backend>(
    backend: &B,
    cache: &B::KvCache,
    policy: &SeqCompression,
    shape: HeadShape,
    job: &LayerJob<'_>,
    layer: usize,
) -> Result<LayerScores<B::Tensor>, EngineError> {
    let n = job.physical_tokens;
    let (table, bs) = (job.block_table, job.block_size_tokens);
    match policy.scoring() {
        Scoring::Keys(kind) => Ok(LayerScores::Device(
            backend.key_scores(cache, table, bs, n, kind)?,
        )),
        Scoring::Window { pool_kernel_tokens } => {
            let queries = job.queries.ok_or_else(|| {
                EngineError::InvalidRequest(format!(
                    "no observation-window queries for layer {layer} of a {} request",
                    policy.config.method
                ))
            })?;
            let spec = WindowScoreSpec {
                group: shape.group,
                scale: 1.0 / (shape.head_dim as f32).sqrt(),
                pool_kernel_tokens,
            };
            Ok(LayerScores::Device(
                backend.window_scores(cache, table, bs, n, queries, &spec)?,
            ))
        }
        Scoring::Keyless => {
            // The scorer reads only the token count: one zero "key" of width 1 per token.
            let zeros = vec![0.0f32; n];
            let mut rows = Vec::with_capacity(shape.num_kv_heads * n);
            for kv_head in 0..shape.num_kv_heads {
                rows.extend(policy.scorer.score(&ScoreInput {
                    keys: HeadKeys::new(&zeros, 1)?,
                    queries: None,
                    layer,
                    kv_head,
                })?);
            }
            Ok(LayerScores::Host(HostTensor::new(
                vec![shape.num_kv_heads, n],
                rows,
            )?))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use starling_evict::CompressionMethod;

    fn policy(ratio: f64, every_n_tokens: usize, question: Option<usize>) -> SeqCompression {
        SeqCompression::new(
            &CompressionConfig {
                method: CompressionMethod::KeyDiff,
                ratio,
                sink_tokens: 4,
                window_tokens: 8,
                every_n_tokens,
                seed: 0,
                head_wise: true,
            },
            question,
        )
        .expect("evicting config")
    }

    #[test]
    fn none_and_ratio_zero_never_compress() {
        assert!(SeqCompression::new(&CompressionConfig::default(), None).is_none());
        let zero = CompressionConfig {
            method: CompressionMethod::KeyDiff,
            ..CompressionConfig::default()
        };
        assert!(SeqCompression::new(&zero, None).is_none());
    }

    #[test]
    fn target_follows_the_logical_length_and_waits_for_a_surplus() {
        let p = policy(0.5, 16, None);
        let due = |l, ph, done| p.due_target(l, ph, done, 100, 0).map(|d| d.target_tokens);
        // 100 logical tokens: protected 12, evict floor(0.5 * 88) = 44 → keep 56.
        assert_eq!(due(100, 100, false), Some(56));
        // Already compressed to 56; 10 more tokens: target keep(110) = 61, surplus 5 < 16.
        assert_eq!(due(110, 66, false), None);
        // ... unless the prompt just completed.
        assert_eq!(due(110, 66, true), Some(61));
        // At or below target: nothing, even at prompt end.
        assert_eq!(due(110, 61, true), None);
        // Surplus reaches every_n_tokens.
        assert_eq!(due(142, 93, false), Some(77));
        // Short sequences are all protected.
        assert_eq!(due(12, 12, true), None);
        // The whole physical length is open to eviction.
        assert_eq!(
            p.due_target(100, 100, false, 100, 0)
                .unwrap()
                .evictable_tokens,
            100
        );
    }

    #[test]
    fn the_question_split_compresses_the_context_once_at_the_prompt_end() {
        // 100-token prompt, the last 20 the question: the context of 80 keeps
        // 80 - floor(0.5 * (80 - 12)) = 46, plus the question's 20.
        let p = policy(0.5, 16, Some(20));
        assert_eq!(
            p.due_target(64, 64, false, 100, 0),
            None,
            "not before the prompt is in"
        );
        assert_eq!(
            p.due_target(100, 100, true, 100, 0),
            Some(DueTarget {
                target_tokens: 66,
                evictable_tokens: 80,
                first_evictable_tokens: 0,
                first_rewritten_tokens: 4,
            })
        );
        // Never again while decoding, whatever the surplus.
        assert_eq!(p.due_target(300, 266, false, 100, 0), None);
        assert_eq!(p.peak_tokens(140), 140);
        // The observation window is the question.
        assert_eq!(p.observation_window_tokens(), 20);
    }

    #[test]
    fn the_plan_keeps_every_token_after_the_evictable_prefix() {
        let p = policy(0.5, 16, Some(3));
        let shape = HeadShape {
            num_kv_heads: 2,
            head_dim: 4,
            group: 1,
        };
        // 10 tokens, the first 7 evictable: sinks 4 + window 8 cover the 7, so the target is
        // raised to all 10 (DueTarget's floor) and nothing moves.
        let due = DueTarget::new(&p.config, 5, 0, 7, 10);
        assert_eq!(due, None);
        // Without protection: keep the best 2 of the 7 and the 3 after them.
        let unprotected = SeqCompression::new(
            &CompressionConfig {
                sink_tokens: 0,
                window_tokens: 0,
                ..p.config.clone()
            },
            Some(3),
        )
        .unwrap();
        let due = DueTarget::new(&unprotected.config, 5, 0, 7, 10).unwrap();
        let job = LayerJob {
            block_table: &[0, 1, 2],
            block_size_tokens: 4,
            physical_tokens: 10,
            due,
            queries: None,
        };
        let scores = HostTensor::new(
            vec![2, 10],
            [
                (0..10).map(|i| i as f32).collect::<Vec<_>>(),
                (0..10).map(|i| -(i as f32)).collect(),
            ]
            .concat(),
        )
        .unwrap();
        let plan = keep_plan(&unprotected, shape, &job, false);
        assert_eq!(plan.skip_tokens, 0);
        assert_eq!(
            plan.keep_lists(&scores).unwrap(),
            vec![vec![5, 6, 7, 8, 9], vec![0, 1, 7, 8, 9]]
        );
        // A latent layer: one list, ranked by the heads' mean (all equal: the lower indices).
        let latent = keep_plan(&unprotected, shape, &job, true);
        assert_eq!((latent.lists, latent.layer_wide), (1, true));
        assert_eq!(
            latent.keep_lists(&scores).unwrap(),
            vec![vec![0, 1, 7, 8, 9]]
        );
    }

    #[test]
    fn the_plan_leaves_whole_blocks_of_prefix_and_sinks_in_place() {
        let p = policy(0.5, 16, None);
        // A shared prefix of 8 and sinks 4 after... the sinks count from the start: inside it.
        let due = DueTarget::new(&p.config, 40, 8, 64, 64).unwrap();
        assert_eq!(due.first_rewritten_tokens, 8);
        let shape = HeadShape {
            num_kv_heads: 1,
            head_dim: 4,
            group: 1,
        };
        let table: Vec<u32> = (0..16).collect();
        let job = |bs| LayerJob {
            block_table: &table,
            block_size_tokens: bs,
            physical_tokens: 64,
            due,
            queries: None,
        };
        assert_eq!(keep_plan(&p, shape, &job(4), false).skip_tokens, 8);
        assert_eq!(keep_plan(&p, shape, &job(16), false).skip_tokens, 0);
    }
}
