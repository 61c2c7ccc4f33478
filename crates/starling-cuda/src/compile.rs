//! Run-time kernel compilation with NVRTC and an on-disk cache of the PTX, keyed by a hash of the
//! source, the target architecture and the compiler options (so an edited kernel or another GPU
//! never picks up a stale module).

use std::path::{Path, PathBuf};

use cudarc::nvrtc::{compile_ptx_with_opts, CompileOptions, Ptx};
use sha2::{Digest, Sha256};

use crate::CudaError;

/// Where compiled modules are kept: `$STARLING_HOME/kernels` (default `~/.cache/starling/kernels`),
/// or nowhere when no home directory is known.
#[derive(Debug, Clone)]
pub struct KernelCache {
    dir: Option<PathBuf>,
    cuda_include: String,
}

impl KernelCache {
    /// The cache under the usual directories; CUDA headers from `CUDA_HOME`/`CUDA_PATH`
    /// (default `/usr/local/cuda`), which NVRTC needs for `cuda_bf16.h`.
    pub fn from_env() -> Self {
        let dir = std::env::var_os("STARLING_HOME")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/starling")))
            .map(|h| h.join("kernels"));
        let cuda_root = std::env::var("CUDA_HOME")
            .or_else(|_| std::env::var("CUDA_PATH"))
            .unwrap_or_else(|_| "/usr/local/cuda".to_string());
        Self {
            dir,
            cuda_include: format!("{cuda_root}/include"),
        }
    }

    /// The same compiler set-up with no on-disk cache: every [`KernelCache::ptx`] call compiles
    /// (compile checks must not be answered from a cache).
    pub fn without_disk_cache(self) -> Self {
        Self { dir: None, ..self }
    }

    /// PTX for `source`, compiled for `arch` (e.g. `sm_90`), from the cache when present.
    pub fn ptx(&self, name: &str, source: &str, arch: &'static str) -> Result<Ptx, CudaError> {
        let options = vec!["--std=c++17".to_string(), "-default-device".to_string()];
        let key = {
            let mut h = Sha256::new();
            h.update(source.as_bytes());
            h.update(arch.as_bytes());
            h.update(options.join(" ").as_bytes());
            h.update(self.cuda_include.as_bytes());
            hex::encode(&h.finalize()[..12])
        };
        let cached = self
            .dir
            .as_ref()
            .map(|d| d.join(format!("{name}-{arch}-{key}.ptx")));
        if let Some(path) = &cached {
            if let Ok(text) = std::fs::read_to_string(path) {
                tracing::debug!("kernel {name}: cached PTX {}", path.display());
                return Ok(Ptx::from_src(text));
            }
        }
        let started = std::time::Instant::now();
        let opts = CompileOptions {
            arch: Some(arch),
            include_paths: vec![self.cuda_include.clone()],
            options,
            name: Some(format!("{name}.cu")),
            ..Default::default()
        };
        let ptx = compile_ptx_with_opts(source, opts).map_err(|e| CudaError::Compile {
            module: name.to_string(),
            log: e.to_string(),
        })?;
        tracing::info!(
            "kernel {name}: compiled for {arch} in {:?}",
            started.elapsed()
        );
        if let Some(path) = cached {
            // A cache that cannot be written only costs the next run a compile.
            let write = || -> std::io::Result<()> {
                if let Some(parent) = path.parent() {
                    std::fs::create_dir_all(parent)?;
                }
                let tmp = path.with_extension("ptx.tmp");
                std::fs::write(&tmp, ptx.to_src())?;
                std::fs::rename(&tmp, &path)
            };
            if let Err(e) = write() {
                tracing::warn!("kernel cache {}: {e}", path.display());
            }
        }
        Ok(ptx)
    }
}
