// CPU feature checks (see cpu_features.h).
#include "kernels/cpu_features.h"

#if SPIN_X86_KERNELS
#include <cpuid.h>
#endif
#if SPIN_NEON_KERNELS && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace spin::detail {

#if SPIN_X86_KERNELS

bool cpu_has_avx512bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi") &&
         __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vl");
}

bool cpu_has_avx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

// F16C straight from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports has no "f16c".
static bool cpu_has_f16c() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
}

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && cpu_has_f16c();
}

bool cpu_is_intel() {
  __builtin_cpu_init();
  return __builtin_cpu_is("intel");
}

#else

bool cpu_has_avx512bf16() { return false; }
bool cpu_has_avx512f() { return false; }
bool cpu_has_avx2_fma() { return false; }
bool cpu_is_intel() { return false; }

#endif

bool cpu_has_neon() { return SPIN_NEON_KERNELS != 0; }

// The kernel tells user space what the CPU has through the auxiliary vector (HWCAP2_BF16).
bool cpu_has_neon_bf16() {
#if SPIN_NEON_KERNELS && defined(__linux__) && defined(HWCAP2_BF16)
  return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#else
  return false;
#endif
}

}  // namespace spin::detail
