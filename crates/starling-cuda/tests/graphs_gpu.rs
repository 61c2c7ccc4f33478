//! CUDA-graph decode replay against eager steps: logits must be bit-identical, step after step,
//! with contexts growing across block boundaries, for batches that fill a bucket and batches
//! that need padding rows. `#[ignore]`d in CPU CI; run through scripts/device/gpu_tests.sh.
//!
//! Each run keeps two cache sets filled by the same eager prefill: eager steps run on one,
//! replayed steps on the other, both fed the eager run's greedy tokens. Equal logits at every
//! step also show that the replayed KV writes matched the eager ones (later steps read them).

use starling_backend::{
    BackendCore, BatchMeta, DecodeGraphConfig, DecodeGraphs, DecodeStep, HostTensor, SeqBatchMeta,
};
use starling_cuda::{CudaBackend, CudaDecodeGraphs, CudaKvCache};
use starling_kv::{KvCacheManager, SeqId};
use starling_models::llama::{ForwardOptions, LatentRanks, LlamaModel};
use starling_models::{ModelConfig, ModelError};

const BLOCK_TOKENS: usize = 16;

/// One step's metadata for `seqs` (each with `new` tokens from `start`), from the manager.
fn step_meta(kv: &KvCacheManager, seqs: &[(SeqId, usize, usize)]) -> BatchMeta {
    let mut meta = BatchMeta {
        block_size_tokens: BLOCK_TOKENS,
        ..Default::default()
    };
    for &(id, start, new) in seqs {
        let query_start = meta.positions.len();
        meta.positions
            .extend((start..start + new).map(|p| p as u32));
        meta.slot_mapping
            .extend(kv.slot_mapping(id, start..start + new).expect("slots"));
        meta.seqs.push(SeqBatchMeta {
            query_start,
            query_len: new,
            context_len_tokens: start + new,
            block_table: kv
                .table(id)
                .expect("table")
                .block_ids()
                .iter()
                .map(|b| b.0)
                .collect(),
        });
        meta.logits_rows.push((query_start + new - 1) as u32);
    }
    meta
}

/// One eager forward pass of the step, its logits copied to the host.
fn eager_logits(
    model: &LlamaModel<CudaBackend>,
    gpu: &CudaBackend,
    ids: &[u32],
    meta: &BatchMeta,
    batch: &<CudaBackend as BackendCore>::Batch,
    caches: &mut [CudaKvCache],
) -> Result<HostTensor, ModelError> {
    let logits = model.forward(gpu, ids, meta, batch, caches, ForwardOptions::default())?;
    logits.to_host(gpu)
}

fn argmax(row: &[f32]) -> u32 {
    (0..row.len())
        .max_by(|&a, &b| row[a].total_cmp(&row[b]).then(b.cmp(&a)))
        .expect("non-empty row") as u32
}

/// Prefills `batch` sequences with prompts of `prompt_lens[i % len]` tokens, then decodes
/// `steps` tokens eagerly and by replay, asserting bit-equal logits at every step.
fn replay_matches_eager(cfg: &ModelConfig, batch: usize, prompt_lens: &[usize], steps: usize) {
    replay_matches_eager_with(cfg, &vec![None; cfg.num_layers], batch, prompt_lens, steps);
}

/// [`replay_matches_eager`] on a model whose layers given `Some` ranks cache STAR-KV latents.
fn replay_matches_eager_with(
    cfg: &ModelConfig,
    latent_ranks: &[Option<LatentRanks>],
    batch: usize,
    prompt_lens: &[usize],
    steps: usize,
) {
    let gpu = CudaBackend::new(0).expect("these tests need a CUDA GPU");
    let model = LlamaModel::synthetic_latent(&gpu, cfg, 11, latent_ranks).expect("model");
    let max_model_len = prompt_lens.iter().max().expect("prompts") + steps + 1;
    let blocks = batch * max_model_len.div_ceil(BLOCK_TOKENS) + 1;
    let mut kv = KvCacheManager::new(blocks, BLOCK_TOKENS).expect("manager");
    let alloc = || -> Vec<CudaKvCache> {
        model
            .alloc_kv_caches(&gpu, blocks, BLOCK_TOKENS)
            .expect("caches")
    };
    let (mut eager_caches, mut graph_caches) = (alloc(), alloc());
    let ids: Vec<SeqId> = (0..batch as u64).map(SeqId).collect();
    // Prefill, eagerly, into both cache sets.
    let mut next = Vec::new();
    let mut lens = Vec::new();
    for (i, &id) in ids.iter().enumerate() {
        let len = prompt_lens[i % prompt_lens.len()];
        let prompt: Vec<u32> = (0..len)
            .map(|t| ((t * 31 + i * 7 + 3) % cfg.vocab_size) as u32)
            .collect();
        kv.allocate_slots(id, len).expect("prompt slots");
        let meta = step_meta(&kv, &[(id, 0, len)]);
        let prepared = gpu.prepare_batch(&meta, blocks).expect("batch");
        let a = eager_logits(&model, &gpu, &prompt, &meta, &prepared, &mut eager_caches)
            .expect("prefill");
        let b = eager_logits(&model, &gpu, &prompt, &meta, &prepared, &mut graph_caches)
            .expect("prefill");
        assert_eq!(a.data(), b.data(), "the two prefills differ");
        next.push(argmax(a.data()));
        lens.push(len);
    }
    let config = DecodeGraphConfig {
        max_num_seqs: 8,
        max_model_len_tokens: max_model_len,
        block_size_tokens: BLOCK_TOKENS,
        num_cache_blocks: blocks,
        query_heads_per_kv_head: cfg.num_attention_heads / cfg.num_kv_heads.max(1),
        num_kv_heads: cfg.num_kv_heads,
        head_dim: cfg.head_dim,
    };
    // The concrete type (what `decode_graphs` boxes), for its census of recorded graphs.
    let mut graphs = CudaDecodeGraphs::new(&config).expect("graphs");
    let mut forward = model.device_forward();
    let vocab = cfg.vocab_size;
    for step in 0..steps {
        let rows: Vec<(SeqId, usize, usize)> = ids
            .iter()
            .zip(&lens)
            .map(|(&id, &len)| (id, len, 1))
            .collect();
        for &(id, _, _) in &rows {
            kv.allocate_slots(id, 1).expect("decode slot");
        }
        let meta = step_meta(&kv, &rows);
        let prepared = gpu.prepare_batch(&meta, blocks).expect("batch");
        let eager = eager_logits(&model, &gpu, &next, &meta, &prepared, &mut eager_caches)
            .expect("eager step");
        let replayed = graphs
            .run(
                &gpu,
                DecodeStep {
                    token_ids: &next,
                    meta: &meta,
                },
                &mut graph_caches,
                forward.as_mut(),
            )
            .expect("replay")
            .expect("a decode step within the buckets is replayed");
        let replayed = gpu.to_host(&replayed).expect("logits to the host");
        assert_eq!(replayed.shape(), eager.shape());
        let differing = eager
            .data()
            .iter()
            .zip(replayed.data())
            .filter(|(a, b)| a.to_bits() != b.to_bits())
            .count();
        let max_diff = eager
            .data()
            .iter()
            .zip(replayed.data())
            .map(|(a, b)| (a - b).abs())
            .fold(0f32, f32::max);
        assert_eq!(
            differing, 0,
            "batch {batch}, step {step} (contexts {lens:?}): {differing} logits differ, max |diff| \
             {max_diff}"
        );
        next = eager.data().chunks(vocab).map(argmax).collect();
        lens.iter_mut().for_each(|l| *l += 1);
    }
    // The recordings allocate from a pool the graph keeps, so no stream-ordered memory node sits
    // between two kernels (it would take away their programmatic edge).
    let censuses = graphs.censuses();
    assert!(!censuses.is_empty(), "no bucket was recorded");
    for (rows, census) in censuses {
        assert!(census.kernels > 0, "bucket {rows}: {census:?}");
        assert_eq!(
            census.memory, 0,
            "bucket {rows}: memory nodes in {census:?}"
        );
        if gpu.programmatic_launch() {
            assert!(
                census.programmatic_edges > 0,
                "bucket {rows}: no programmatic edge in {census:?}"
            );
        }
    }
}

/// The tiny test model with heads the GPU kernels take.
fn tiny() -> ModelConfig {
    ModelConfig {
        sliding_window: None,
        attention_scale: None,
        head_dim: 64,
        max_position_embeddings: 4096,
        ..ModelConfig::tiny_llama_for_tests()
    }
}

/// Qwen2.5-Coder-1.5B's attention shape (Q/K/V bias, 12 query / 2 KV heads × 128, tied
/// embeddings, its vocabulary), two layers.
fn qwen2_shaped() -> ModelConfig {
    ModelConfig {
        sliding_window: None,
        attention_scale: None,
        num_layers: 2,
        ..ModelConfig::qwen2_5_coder_1_5b()
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn tiny_model_replay_equals_eager_on_full_buckets() {
    // Buckets of max_num_seqs 8: 1, 2, 4, 8. Prompts of 14 and 30 tokens cross a block
    // boundary within the 20 steps.
    for batch in [1, 2, 4, 8] {
        replay_matches_eager(&tiny(), batch, &[14, 30, 5], 20);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn tiny_model_replay_equals_eager_with_padding_rows() {
    for batch in [3, 5, 7] {
        replay_matches_eager(&tiny(), batch, &[14, 30, 5], 20);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn replay_equals_eager_with_split_contexts() {
    // Contexts past 256 tokens split the attention (flash-decoding) at small batch: the replay
    // reads the step's split plan from the device.
    for batch in [1, 3] {
        replay_matches_eager(&tiny(), batch, &[700, 1500], 18);
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn qwen2_shaped_replay_equals_eager() {
    for batch in [1, 2, 3, 6] {
        replay_matches_eager(&qwen2_shaped(), batch, &[14, 300], 18);
    }
}

/// Mixed layers in one graph: the first layer caches full K/V, the others STAR-KV latents of two
/// shapes (decode attention on latents, the latent write; each shape's split plan read from its
/// own words of the replay buffer) — replayed bit for bit, split contexts included.
#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn replay_equals_eager_with_latent_layers() {
    let cfg = ModelConfig {
        sliding_window: None,
        attention_scale: None,
        num_layers: 3,
        ..qwen2_shaped()
    };
    let latent = Some(LatentRanks {
        key_ranks: vec![64, 40],
        value_rank: 128,
    });
    // Another value width: another latent split shape, with its own plan.
    let wider = Some(LatentRanks {
        key_ranks: vec![48, 64],
        value_rank: 256,
    });
    let ranks = vec![None, latent, wider];
    for batch in [1, 3, 6] {
        replay_matches_eager_with(&cfg, &ranks, batch, &[14, 300], 18);
    }
    replay_matches_eager_with(&cfg, &ranks, 2, &[700, 1500], 12);
}
