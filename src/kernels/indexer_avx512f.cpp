// AVX-512F indexer kernel for CPUs without a bf16 dot product (Skylake-X, Cascade Lake, Ice Lake):
// the fp32-FMA kernel of indexer_fp32_simd.h on 16-lane zmm registers, 6 entries × 64 heads per
// micro-tile (24 accumulators + 4 query registers + 1 key broadcast of the 32 zmm registers).
// GCC 12's own _mm512_max_ps / _mm512_reduce_add_ps trip -W(maybe-)uninitialized inside avx512fintrin.h (a known
// false positive); silence it for this file only.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/indexer_internal.h"
#include "spin/geometry.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")

namespace spin::detail {

bool cpu_has_avx512f() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}

namespace avx512f {

struct V {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kHeadVectors = 4;
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg broadcast(const float* p) { return _mm512_set1_ps(*p); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg relu(Reg a) { return _mm512_max_ps(a, _mm512_setzero_ps()); }
  static float reduce(Reg a) { return _mm512_reduce_add_ps(a); }  // a fixed tree order
  static void e4m3x16(const uint8_t* src, float* dst) {
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), 7);
    _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_or_si256(sign, mag)));
  }
};

#include "kernels/indexer_fp32_simd.h"

}  // namespace avx512f

void indexer_run_avx512f(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads) {
  avx512f::run_fp32_indexer<avx512f::V>(params, tiles, num_threads);
}

}  // namespace spin::detail

#pragma GCC pop_options
