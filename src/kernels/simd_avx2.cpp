// The AVX2 + FMA + F16C kernels (Zen 2/3, Haswell and later Intel client parts): the fp32-FMA
// indexer (indexer_fp32_simd.h: 6 entries × 16 heads per tile, 12 accumulators) and sparse MLA
// attention (attention_fp32_simd.h: QK^T 6 entries × 16 heads, P·V 6 heads × 16 dims) on 8-lane
// ymm registers, compiled for this ISA only inside this file (`#pragma GCC target`) and namespace.
#if defined(__x86_64__)  // x86 only: the file is empty on other ISAs (see simd_neon.cpp)
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/attention_internal.h"
#include "kernels/indexer_internal.h"
#include "spin/geometry.h"
#include "spin/numerics.h"

// Everything below is compiled for this ISA (GCC: target pragma; clang, which the fuzzer uses:
// the same attribute on every function).
#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
#endif

namespace spin::detail {
namespace avx2 {

struct V {
  using Reg = __m256;
  static constexpr int kLanes = 8;
  static constexpr int kHeadVectors = 2;  // head vectors per QK tile
  static constexpr int kPvVectors = 2;    // dim vectors per P·V tile
  static constexpr int kPvHeads = 6;      // heads per P·V tile: 12 accumulators + 2 values + 1 P of 16
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
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23));
  }
  static float reduce(Reg a) {  // ((0+4) + (2+6)) + ((1+5) + (3+7)): a fixed order
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static void e4m3x16(const uint8_t* src, float* dst) {  // see indexer_fp32_simd.h
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), 7);
    const __m256i h = _mm256_or_si256(sign, mag);
    _mm256_storeu_ps(dst, _mm256_cvtph_ps(_mm256_castsi256_si128(h)));
    _mm256_storeu_ps(dst + 8, _mm256_cvtph_ps(_mm256_extracti128_si256(h, 1)));
  }
  static void bf16x16(const uint8_t* src, float* dst) {  // 16 bf16 → fp32: exact (a 16-bit shift)
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    const __m256i lo = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_castsi256_si128(x)), 16);
    const __m256i hi = _mm256_slli_epi32(_mm256_cvtepu16_epi32(_mm256_extracti128_si256(x, 1)), 16);
    _mm256_storeu_ps(dst, _mm256_castsi256_ps(lo));
    _mm256_storeu_ps(dst + 8, _mm256_castsi256_ps(hi));
  }
};

#include "kernels/fp32_simd_tiles.h"
#include "kernels/indexer_fp32_simd.h"
#include "kernels/attention_fp32_simd.h"

}  // namespace avx2

void indexer_run_avx2(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads) {
  avx2::run_fp32_indexer<avx2::V>(params, tiles, num_threads);
}

void fp32_keys_run_avx2(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out) {
  avx2::score_fp32_keys<avx2::V>(keys, count, q, w, heads, out);
}

void attention_run_avx2(const SparseAttentionParams& params, int num_threads, int heads_per_task) {
  avx2::run_fp32_attention<avx2::V>(params, num_threads, heads_per_task);
}

}  // namespace spin::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // __x86_64__
