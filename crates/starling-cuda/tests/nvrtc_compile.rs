//! Compiles every kernel module through the backend's own NVRTC path (`KernelCache::ptx`, disk
//! cache off) for sm_90 (the Hopper-only modules for sm_90a, as the backend does) and checks that each function the backend loads is an entry of the PTX.
//! Compiles from `STARLING_KERNEL_DIR` when it is set (a variant of the kernel files).
//! Needs NVRTC and the CUDA headers but no GPU: `scripts/nvrtc_check.sh` fetches both from PyPI
//! and runs this test, so kernels can be compile-checked on a CPU-only machine.

use starling_cuda::{kernel_modules, nvrtc_available, KernelCache};

/// The architecture the lent GPUs (H200) have.
const ARCH: &str = "sm_90";

#[test]
#[ignore = "needs libnvrtc and the CUDA headers; run scripts/nvrtc_check.sh"]
fn every_loaded_kernel_compiles_for_sm90() {
    assert!(
        nvrtc_available(),
        "libnvrtc cannot be loaded: set LD_LIBRARY_PATH (scripts/nvrtc_check.sh does)"
    );
    let cache = KernelCache::from_env().without_disk_cache();
    let mut checked = 0;
    for module in kernel_modules() {
        let arch = module
            .target
            .arch(ARCH)
            .unwrap_or_else(|| panic!("{}: not loaded on an {ARCH} device", module.name));
        // Built in, or from STARLING_KERNEL_DIR's files: variants can be checked here too.
        let source = module
            .source
            .load(module.name)
            .unwrap_or_else(|e| panic!("{e}"));
        let ptx = cache
            .ptx(module.name, &source, arch)
            .unwrap_or_else(|e| panic!("{e}"))
            .to_src();
        let entries: Vec<&str> = ptx
            .lines()
            .filter_map(|line| line.split(".entry ").nth(1))
            .map(|rest| rest.split('(').next().unwrap_or(rest).trim())
            .collect();
        for f in &module.functions {
            assert!(
                entries.contains(&f.as_str()),
                "{}: no `.entry {f}` in the PTX (entries: {entries:?})",
                module.name
            );
            // Every kernel is launched with programmatic dependent launch (src/launch.rs), which
            // is only safe if it waits on the preceding grid (pdl_entry() in kernels/pdl.cuh).
            assert!(
                entry_body(&ptx, f).contains("griddepcontrol.wait"),
                "{}: `{f}` never calls pdl_entry() (no griddepcontrol.wait in its PTX)",
                module.name
            );
        }
        // For register and spill reports (scripts/nvrtc_check.sh runs ptxas on them when given).
        if let Some(dir) = std::env::var_os("STARLING_PTX_DIR") {
            // Named by architecture too: ptxas needs it (sm_90a for wgmma).
            let path = std::path::Path::new(&dir).join(format!("{}.{arch}.ptx", module.name));
            std::fs::write(&path, &ptx).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        }
        println!(
            "{:<12} {:>3} kernels, {:>7} bytes of PTX",
            module.name,
            module.functions.len(),
            ptx.len()
        );
        checked += module.functions.len();
    }
    assert!(checked > 0, "kernel_modules() lists no functions");
}

/// The PTX of one entry: from its `.entry` line to the next entry (device functions are inlined
/// into the entries at sm_90 with `-default-device`, so the wait shows in each body).
fn entry_body<'p>(ptx: &'p str, name: &str) -> &'p str {
    let marker = format!(".entry {name}(");
    let Some(start) = ptx.find(&marker) else {
        return "";
    };
    let rest = &ptx[start + marker.len()..];
    let end = rest.find(".entry ").unwrap_or(rest.len());
    &rest[..end]
}
