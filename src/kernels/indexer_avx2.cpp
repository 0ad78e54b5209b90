// AVX2 + FMA + F16C indexer kernel (Zen 2/3, Haswell and later Intel client parts): the fp32-FMA
// kernel of indexer_fp32_simd.h on 8-lane ymm registers, 6 entries × 16 heads per micro-tile
// (12 accumulators + 2 query registers + 1 key broadcast of the 16 ymm registers).
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/indexer_internal.h"
#include "spin/geometry.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace spin::detail {

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}

namespace avx2 {

struct V {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kHeadVectors = 2;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static Reg broadcast(const float* p) { return _mm256_broadcast_ss(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg relu(Reg a) { return _mm256_max_ps(a, _mm256_setzero_ps()); }
  static float reduce(Reg a) {  // ((0+4) + (2+6)) + ((1+5) + (3+7)): a fixed order
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void e4m3x16(const uint8_t* src, float* dst) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), 7);
    const __m256i h = _mm256_or_si256(sign, mag);
    _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(dst + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
  }
};

#include "kernels/indexer_fp32_simd.h"

}  // namespace avx2

void indexer_run_avx2(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads) {
  avx2::run_fp32_indexer<avx2::V>(params, tiles, num_threads);
}

}  // namespace spin::detail

#pragma GCC pop_options
