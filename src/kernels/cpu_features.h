// The one place spin asks the CPU what it can run (x86: feature bits via the compiler's cpuid
// builtins; aarch64: NEON is part of the base ISA, BF16 from HWCAP2); every kernel front end
// dispatches on these, and every forced path is checked here. Each answer is the CPU's, capped by
// SPIN_CPU (spin/cpu.h). A check for another ISA's feature answers false, so a path forced on the
// wrong CPU is refused by name rather than run.
#pragma once

// Which kernel files have code on this build (each kernel file guards its own ISA).
#if defined(__x86_64__)
#define SPIN_X86_KERNELS 1
#else
#define SPIN_X86_KERNELS 0
#endif
#if defined(__aarch64__)
#define SPIN_NEON_KERNELS 1
#else
#define SPIN_NEON_KERNELS 0
#endif

namespace spin::detail {

bool cpu_has_avx512bf16();  // vdpbf16ps + vpermi2b + AVX-512BW (Zen 4, Sapphire Rapids)
bool cpu_has_avx512f();     // AVX-512F (Skylake-X and later)
bool cpu_has_avx2_fma();    // AVX2 + FMA + F16C (Haswell, Zen 1 and later)
bool cpu_is_intel();
// Whether `auto` takes the AVX-512F fp32-FMA kernels over the AVX-512 BF16 ones: on Intel cores
// (Sapphire Rapids) vdpbf16ps reaches only half the zmm FMA peak (238 vs 475 GFLOP/s on 2
// threads) and the fp32 kernels win — on a 2-core Sapphire Rapids VM, 2 threads,
// `spin bench indexer --context 131072 --rows 1 --impl I`: 5.9 ms (avx512f) vs 10.1 ms;
// `spin bench attention --rows 1 8 --impl I`: 2.0 / 17.2 ms vs 5.9 / 27.0 ms. On Zen 4 zmm FMAs
// are double-pumped and vdpbf16ps has twice their rate, so bf16 stays first there.
bool cpu_prefers_fp32_fma_to_bf16_dot();
bool cpu_has_neon();        // AdvSIMD with fp16 conversions: every aarch64 CPU
bool cpu_has_neon_bf16();   // FEAT_BF16 (BFDOT): Neoverse V1/N2, Graviton 3, Apple M2 (the neon_bf16 indexer)

}  // namespace spin::detail
