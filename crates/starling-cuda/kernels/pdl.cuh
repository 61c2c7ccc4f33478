// Programmatic dependent launch (sm_90+). The host launches every kernel with
// CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION (backend.rs `launch!`), which lets the
// next kernel in the stream start its blocks before this one has finished, so that a kernel's
// launch and ramp overlap its predecessor's tail. That is only safe because every kernel calls
// `pdl_entry()` before it touches memory another kernel writes: `griddepcontrol.wait` returns once
// the preceding grid has completed and its writes are visible (at once when the kernel was
// launched without the attribute), and `griddepcontrol.launch_dependents` then lets the next
// kernel's blocks be scheduled. Only reads of data no kernel writes (weights) may precede it.
// tests/nvrtc_compile.rs checks that every loaded kernel's PTX waits. The host prepends this file
// to every kernel source (kernels.rs), since NVRTC compiles one source string per module.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
__device__ __forceinline__ void pdl_entry() {
    asm volatile("griddepcontrol.wait;" ::: "memory");
    asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
}
// Starts moving a 128-byte line of data no kernel writes (weights) into L2, ahead of
// `pdl_entry()`.
__device__ __forceinline__ void prefetch_l2(const void* p) {
    asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}
#else
__device__ __forceinline__ void pdl_entry() {}
__device__ __forceinline__ void prefetch_l2(const void*) {}
#endif
