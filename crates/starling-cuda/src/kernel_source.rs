//! Where a kernel module's source comes from (built in, or a directory's files for kernel
//! development) and which devices it is compiled for; the tiled prefill kernel choice.

use crate::CudaError;

/// A module's source as built in, and the files of `kernels/` it is made of, in order.
#[derive(Clone, Copy, Debug)]
pub struct KernelSource {
    /// The files' text, concatenated.
    pub text: &'static str,
    /// File names under `crates/starling-cuda/kernels/`.
    pub files: &'static [&'static str],
}

/// Environment variable naming a directory that holds the kernel files (a checkout's
/// `crates/starling-cuda/kernels`): modules are then compiled from those files instead of the
/// sources built into the binary, so a kernel can be changed and run on a GPU machine without
/// rebuilding. For kernel development only; the PTX cache keys on the text, so edits recompile.
pub const KERNEL_DIR_ENV: &str = "STARLING_KERNEL_DIR";

impl KernelSource {
    /// The text to compile: from [`KERNEL_DIR_ENV`]'s directory when it is set, else built in.
    pub fn load(&self, module: &str) -> Result<std::borrow::Cow<'static, str>, CudaError> {
        match std::env::var_os(KERNEL_DIR_ENV) {
            None => Ok(std::borrow::Cow::Borrowed(self.text)),
            Some(dir) => {
                tracing::info!("kernel {module}: source from {}", dir.to_string_lossy());
                self.read_from(std::path::Path::new(&dir), module)
                    .map(std::borrow::Cow::Owned)
            }
        }
    }

    /// The files concatenated from `dir` (a clear error naming a missing or unreadable one).
    pub fn read_from(&self, dir: &std::path::Path, module: &str) -> Result<String, CudaError> {
        let mut text = String::new();
        for file in self.files {
            let path = dir.join(file);
            let part = std::fs::read_to_string(&path).map_err(|e| CudaError::Compile {
                module: module.to_string(),
                log: format!("{KERNEL_DIR_ENV}: {}: {e}", path.display()),
            })?;
            text.push_str(&part);
        }
        Ok(text)
    }
}

/// The value of `#define NAME value` (a number) in a kernel source, if it has one: what the host
/// reads from the text it compiles where a kernel's shared memory depends on a knob a kernel
/// directory may change ([`KERNEL_DIR_ENV`]), e.g. the stages of a ring.
pub(crate) fn numeric_define(source: &str, name: &str) -> Option<usize> {
    source.lines().find_map(|line| {
        let mut words = line.split_whitespace();
        (words.next() == Some("#define") && words.next() == Some(name))
            .then(|| words.next()?.parse().ok())
            .flatten()
    })
}

/// The numeric `#define NAME` of module `module`'s source, or a compile error naming it.
pub(crate) fn required_define(source: &str, module: &str, name: &str) -> Result<usize, CudaError> {
    numeric_define(source, name).ok_or_else(|| CudaError::Compile {
        module: module.to_string(),
        log: format!("no numeric #define {name} in the source"),
    })
}

/// Which devices a kernel module is compiled and loaded for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ModuleTarget {
    /// Every device, for its own architecture (`sm_{major}{minor}`).
    Device,
    /// Compute capability 9.0 only, for `sm_90a`: the architecture-specific instructions
    /// (wgmma) that PTX for plain `sm_90` cannot use, and that no other device runs.
    Hopper,
}

impl ModuleTarget {
    /// The architecture to compile for on a device of architecture `device_arch` (`sm_90`, …),
    /// or `None` where the module does not load there.
    pub fn arch(self, device_arch: &'static str) -> Option<&'static str> {
        match self {
            ModuleTarget::Device => Some(device_arch),
            ModuleTarget::Hopper => (device_arch == "sm_90").then_some("sm_90a"),
        }
    }
}

/// Environment variable choosing the tiled prefill kernel on a Hopper GPU: `wgmma` (or
/// `wgmma-ws`, its name while it had an unspecialised sibling) for the warp-specialised wgmma
/// kernel (`prefill_wgmma.cu`, head width 128, bf16 cache), `mma` for the mma.sync one
/// (`prefill_attention.cu`); unset, [`WGMMA_PREFILL_BY_DEFAULT`] decides.
pub const PREFILL_KERNEL_ENV: &str = "STARLING_PREFILL_KERNEL";

/// Whether a Hopper GPU runs the wgmma prefill kernel when [`PREFILL_KERNEL_ENV`] is unset. On
/// since session 30: the parity suite passed with it, and it ran 0.99-1.18x the mma.sync kernel
/// on the H100's prompt-prefill grid (Qwen 4k batch 1: 1.69x, one block per SM splitting
/// differently) and +1.8% served output tokens/s at memory-bound 4k.
pub const WGMMA_PREFILL_BY_DEFAULT: bool = true;

/// Which Hopper prefill kernel serves head width 128 with a bf16 cache on compute capability 9.0
/// (elsewhere the mma.sync kernel always does).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HopperPrefill {
    /// The mma.sync kernel, as on every other device.
    Mma,
    /// `prefill_wgmma_ws_d128_bf16`: two consumer warpgroups and a producer warpgroup handing
    /// stages over through mbarriers, one block per SM.
    WgmmaWarpSpecialised,
}

impl HopperPrefill {
    /// The choice [`PREFILL_KERNEL_ENV`] asks for, else the default. An unknown value is logged
    /// and ignored (the default serves).
    pub fn requested() -> Self {
        let default = if WGMMA_PREFILL_BY_DEFAULT {
            Self::WgmmaWarpSpecialised
        } else {
            Self::Mma
        };
        match std::env::var(PREFILL_KERNEL_ENV) {
            Ok(v) => Self::parse(&v).unwrap_or_else(|| {
                tracing::warn!("{PREFILL_KERNEL_ENV}={v:?} is none of mma, wgmma, wgmma-ws");
                default
            }),
            Err(_) => default,
        }
    }

    /// `mma`, or `wgmma` / `wgmma-ws` (surrounding blanks ignored).
    pub fn parse(value: &str) -> Option<Self> {
        match value.trim() {
            "mma" => Some(Self::Mma),
            "wgmma" | "wgmma-ws" => Some(Self::WgmmaWarpSpecialised),
            _ => None,
        }
    }
}
