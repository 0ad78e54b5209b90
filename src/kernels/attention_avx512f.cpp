// AVX-512F sparse MLA decode kernel for CPUs without a bf16 dot (Skylake-X, Cascade Lake): the
// fp32-FMA kernel of attention_fp32_simd.h on 16-lane zmm registers — QK^T tiles of 6 entries ×
// 64 heads (24 accumulators), P·V tiles of 4 heads × 64 dims (16 accumulators).
// GCC 12's own avx512fintrin.h trips -W(maybe-)uninitialized (known false positives).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_internal.h"
#include "spin/numerics.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")

namespace spin::detail {

bool attention_cpu_has_avx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

namespace attention_avx512f {

struct V {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kHeadVectors = 4;
  static constexpr int kPvVectors = 4;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float x) { return _mm512_set1_ps(x); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, Reg a) { _mm512_storeu_ps(p, a); }
  static Reg broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm512_max_ps(a, b); }
  static Reg round(Reg a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Reg pow2(Reg n) {  // 2^n for integral n in [-126, 127]
    const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_castsi512_ps(e);
  }
};

#include "kernels/attention_fp32_simd.h"

}  // namespace attention_avx512f

void attention_run_avx512f(const SparseAttentionParams& params, int num_threads) {
  attention_avx512f::run_fp32_attention<attention_avx512f::V>(params, num_threads);
}

}  // namespace spin::detail

#pragma GCC pop_options
