//! Eviction's selection on the GPU (`select_kept_tokens`) against its definition,
//! `KeepPlan::keep_lists`: the same indices, exactly, for scores full of ties, NaN, ±∞ and
//! signed zeros, per KV head and layer-wide, with kept prefixes and tails, skipped slots, no
//! room and all room, up to 30k tokens; then whole compactions by scores (`compact_kv_by_scores`)
//! equal to the CPU's bit for bit.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_backend::keep::protected_count;
use starling_backend::{HostTensor, KeepPlan, KvCacheOps};

use super::{assert_caches_equal, block_tables, filled_caches, gpu, kv_spec, KV_SHAPES};

/// `heads × n` scores drawn from a few values (ties everywhere) and the special floats.
fn tricky_scores(rng: &mut ChaCha8Rng, heads: usize, n: usize) -> HostTensor {
    let data = (0..heads * n)
        .map(|_| match rng.gen_range(0..20) {
            0 => f32::NAN,
            1 => f32::INFINITY,
            2 => f32::NEG_INFINITY,
            3 => -0.0,
            4 => 0.0,
            5..=9 => rng.gen_range(-4i32..4) as f32 * 0.25,
            _ => rng.gen_range(-1.0f32..1.0),
        })
        .collect();
    HostTensor::new(vec![heads, n], data).unwrap()
}

/// A valid plan over `n` tokens: random ranges, protection and target, the skip as far as the
/// plan allows in whole blocks of `bs`.
fn random_plan(
    rng: &mut ChaCha8Rng,
    n: usize,
    heads: usize,
    bs: usize,
    layer_wide: bool,
    one_list: bool,
) -> KeepPlan {
    let first = if rng.gen_bool(0.3) {
        rng.gen_range(0..=n / 3)
    } else {
        0
    };
    let end = if rng.gen_bool(0.3) {
        rng.gen_range(first..=n)
    } else {
        n
    };
    let (sink, window): (usize, usize) = (rng.gen_range(0..12), rng.gen_range(0..80));
    let candidates = end - first;
    let protected = protected_count(candidates, sink.saturating_sub(first), window);
    let floor = n - candidates + protected;
    // No room, all room, or anything between.
    let target = match rng.gen_range(0..4) {
        0 => floor,
        1 => n,
        _ => rng.gen_range(floor..=n),
    };
    let in_place = first.max(sink.min(end));
    KeepPlan {
        physical_tokens: n,
        target_tokens: target,
        first_evictable_tokens: first,
        evictable_end_tokens: end,
        sink_tokens: sink,
        window_tokens: window,
        layer_wide: layer_wide || one_list,
        lists: if one_list { 1 } else { heads },
        skip_tokens: if rng.gen_bool(0.5) {
            in_place / bs * bs
        } else {
            0
        },
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn device_selection_equals_keep_lists() {
    let gpu = gpu();
    let mut rng = ChaCha8Rng::seed_from_u64(71);
    let mut cases = 0;
    for heads in [1usize, 2, 8, 32] {
        for n in [1usize, 17, 300, 1023, 1025, 4096, 30_000] {
            let trials = if n >= 4096 { 4 } else { 12 };
            for trial in 0..trials {
                let scores = tricky_scores(&mut rng, heads, n);
                let device = gpu.upload_f32(&scores).unwrap();
                let (layer_wide, one_list) = match trial % 3 {
                    0 => (false, false),
                    1 => (true, false),
                    _ => (true, true),
                };
                let plan = random_plan(&mut rng, n, heads, 16, layer_wide, one_list);
                let want = plan.keep_lists(&scores).unwrap();
                let got = gpu.select_kept_tokens(&device, &plan).unwrap();
                assert_eq!(got.len(), want.len(), "{plan:?}: lists");
                for (l, (g, w)) in got.iter().zip(&want).enumerate() {
                    if let Some(k) = g.iter().zip(w).position(|(a, b)| a != b) {
                        panic!(
                            "{heads} heads, {n} tokens, {plan:?}: list {l} differs at {k} \
                             (GPU {}, CPU {})",
                            g[k], w[k]
                        );
                    }
                    assert_eq!(g.len(), w.len(), "{plan:?}: list {l} length");
                }
                cases += 1;
            }
        }
    }
    println!("select_kept_tokens: {cases} plans, every list equal to KeepPlan::keep_lists");
    // Scores of the wrong shape and plans that cannot keep their target are refused.
    let scores = gpu.upload_f32(&tricky_scores(&mut rng, 2, 100)).unwrap();
    let plan = random_plan(&mut rng, 100, 2, 16, false, false);
    assert!(gpu
        .select_kept_tokens(
            &scores,
            &KeepPlan {
                physical_tokens: 99,
                ..plan
            }
        )
        .is_err());
    assert!(gpu
        .select_kept_tokens(&scores, &KeepPlan { lists: 3, ..plan })
        .is_err());
    let below = KeepPlan {
        target_tokens: 0,
        sink_tokens: 4,
        ..plan
    };
    assert!(gpu.select_kept_tokens(&scores, &below).is_err());
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn compaction_by_scores_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(72);
    let lens = [300usize, 77, 1500];
    for (nkv, hd) in KV_SHAPES {
        let spec = kv_spec(nkv, hd, 160);
        let bs = spec.block_size_tokens;
        let (mut cache_c, mut cache_g) = filled_caches(&gpu, &cpu, &spec, &mut rng);
        let (tables, _) = block_tables(&mut rng, &spec, &lens);
        // Applied one after another to the same caches: each compacts one sequence (several
        // times, shorter each time) while the others must stay as they are.
        for round in 0..6 {
            let seq = round % lens.len();
            let (table, len) = (&tables[seq], lens[seq] - round / lens.len() * 20);
            let scores = tricky_scores(&mut rng, nkv, len);
            let plan = random_plan(&mut rng, len, nkv, bs, round % 2 == 1, false);
            cpu.compact_kv_by_scores(&mut cache_c, table, bs, &scores, &plan)
                .unwrap();
            gpu.compact_kv_by_scores(
                &mut cache_g,
                table,
                bs,
                &gpu.upload_f32(&scores).unwrap(),
                &plan,
            )
            .unwrap();
            let name = format!("compact_kv_by_scores {nkv}x{hd} round {round} {plan:?}");
            assert_caches_equal(&name, &gpu, &cache_g, &cpu, &cache_c, &spec);
        }
        println!("compact_kv_by_scores {nkv}x{hd}: 6 rounds exact");
        // A plan for another layer's lists moves nothing and is refused.
        let scores = tricky_scores(&mut rng, nkv, lens[0]);
        let one = random_plan(&mut rng, lens[0], nkv, bs, true, true);
        if nkv > 1 {
            assert!(gpu
                .compact_kv_by_scores(
                    &mut cache_g,
                    &tables[0],
                    bs,
                    &gpu.upload_f32(&scores).unwrap(),
                    &one
                )
                .is_err());
            assert_caches_equal("refused plan", &gpu, &cache_g, &cpu, &cache_c, &spec);
        }
    }
}
