//! One module per subcommand.

pub mod bench;
pub mod bench_campaign;
pub mod bench_eval;
pub mod bench_gemm;
pub mod bench_gpu;
pub mod bench_niah;
pub mod bench_quality;
pub mod bench_serve;
pub mod calibrate;
pub mod calibrate_profiles;
pub mod calibrate_torch;
pub mod demo;
pub mod generate;
pub mod info;
pub mod model;
pub mod serve;
