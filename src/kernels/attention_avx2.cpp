// AVX2 + FMA sparse MLA decode kernel (Zen 2/3, Haswell and later Intel client parts): the
// fp32-FMA kernel of attention_fp32_simd.h on 8-lane ymm registers — QK^T tiles of 6 entries ×
// 16 heads (12 accumulators), P·V tiles of 4 heads × 16 dims (8 accumulators).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention_internal.h"
#include "spin/numerics.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace spin::detail {

bool attention_cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

namespace attention_avx2 {

struct V {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kHeadVectors = 2;
  static constexpr int kPvVectors = 2;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float x) { return _mm256_set1_ps(x); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, Reg a) { _mm256_storeu_ps(p, a); }
  static Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  static Reg max(Reg a, Reg b) { return _mm256_max_ps(a, b); }
  static Reg round(Reg a) { return _mm256_round_ps(a, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC); }
  static Reg pow2(Reg n) {  // 2^n for integral n in [-126, 127]
    const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_castsi256_ps(e);
  }
};

#include "kernels/attention_fp32_simd.h"

}  // namespace attention_avx2

void attention_run_avx2(const SparseAttentionParams& params, int num_threads) {
  attention_avx2::run_fp32_attention<attention_avx2::V>(params, num_threads);
}

}  // namespace spin::detail

#pragma GCC pop_options
