// The one place spin asks the CPU what it can run (x86 feature bits via the compiler's cpuid
// builtins); every kernel front end dispatches on these, and every forced path is checked here.
#pragma once

namespace spin::detail {

bool cpu_has_avx512bf16();  // vdpbf16ps + vpermi2b + AVX-512BW (Zen 4, Sapphire Rapids)
bool cpu_has_avx512f();     // AVX-512F (Skylake-X and later)
bool cpu_has_avx2_fma();    // AVX2 + FMA + F16C (Haswell, Zen 1 and later)
bool cpu_is_intel();

}  // namespace spin::detail
