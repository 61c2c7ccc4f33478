//! Per-head RMSNorm (Qwen3's q/k norm, `kernels/head_norm.cu`) against the CPU reference.

use rand::SeedableRng;
use rand_chacha::ChaCha8Rng;
use starling_backend::cpu::CpuBackend;
use starling_backend::{BackendCore, HeadSpan, ModelOps};

use super::{check, gpu, rand_host};

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn rms_norm_heads_matches_cpu() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(18);
    // (rows, q heads, kv heads, head_dim): Qwen3-8B at decode and prefill, a 64-wide head, a
    // 256-wide one (the kernel's widest), and one not a multiple of 32 lanes.
    for &(n, heads, kv_heads, d) in &[
        (1usize, 32usize, 8usize, 128usize),
        (300, 32, 8, 128),
        (7, 14, 2, 64),
        (3, 4, 1, 256),
        (5, 3, 3, 40),
    ] {
        let width = (heads + 2 * kv_heads) * d;
        let x = rand_host(&mut rng, vec![n, width], 3.0);
        let wq = rand_host(&mut rng, vec![d], 1.5);
        let wk = rand_host(&mut rng, vec![d], 1.5);
        let q = HeadSpan {
            first_col: 0,
            num_heads: heads,
            head_dim: d,
        };
        let k = HeadSpan {
            first_col: heads * d,
            num_heads: kv_heads,
            head_dim: d,
        };
        let (mut gx, gq, gk) = (
            gpu.upload(&x).unwrap(),
            gpu.upload(&wq).unwrap(),
            gpu.upload(&wk).unwrap(),
        );
        gpu.rms_norm_heads(&mut gx, &gq, q, 1e-6).unwrap();
        gpu.rms_norm_heads(&mut gx, &gk, k, 1e-6).unwrap();
        let mut cx = x.clone();
        cpu.rms_norm_heads(&mut cx, &wq, q, 1e-6).unwrap();
        cpu.rms_norm_heads(&mut cx, &wk, k, 1e-6).unwrap();
        let got = gpu.to_host(&gx).unwrap();
        check(&format!("rms_norm_heads {n}x{width} d{d}"), &got, &cx);
        // The value columns are outside both spans: left bit for bit.
        for (r, (g, c)) in got
            .data()
            .chunks(width)
            .zip(cx.data().chunks(width))
            .enumerate()
        {
            assert_eq!(
                g[k.end_col()..],
                c[k.end_col()..],
                "row {r}: values changed"
            );
        }
    }
}

#[test]
#[ignore = "needs a CUDA GPU; run scripts/device/gpu_tests.sh"]
fn rms_norm_heads_rejects_what_the_cpu_rejects() {
    let (gpu, cpu) = (gpu(), CpuBackend::new());
    let mut rng = ChaCha8Rng::seed_from_u64(19);
    let x = rand_host(&mut rng, vec![2, 64], 1.0);
    let w = rand_host(&mut rng, vec![16], 1.0);
    let (gw, mut gx) = (gpu.upload(&w).unwrap(), gpu.upload(&x).unwrap());
    for span in [
        HeadSpan {
            first_col: 16,
            num_heads: 4,
            head_dim: 16,
        },
        HeadSpan {
            first_col: 0,
            num_heads: 0,
            head_dim: 16,
        },
        HeadSpan {
            first_col: 0,
            num_heads: 2,
            head_dim: 32,
        },
    ] {
        assert!(cpu.rms_norm_heads(&mut x.clone(), &w, span, 1e-6).is_err());
        assert!(
            gpu.rms_norm_heads(&mut gx, &gw, span, 1e-6).is_err(),
            "{span:?}"
        );
    }
    // The refused calls left the tensor alone.
    assert_eq!(gpu.to_host(&gx).unwrap().data(), x.data());
    // Wider than the kernel's registers hold: refused on the GPU only.
    let wide = rand_host(&mut rng, vec![1, 512], 1.0);
    let w512 = rand_host(&mut rng, vec![512], 1.0);
    let span = HeadSpan {
        first_col: 0,
        num_heads: 1,
        head_dim: 512,
    };
    let (mut gwide, gw512) = (gpu.upload(&wide).unwrap(), gpu.upload(&w512).unwrap());
    assert!(gpu.rms_norm_heads(&mut gwide, &gw512, span, 1e-6).is_err());
}
