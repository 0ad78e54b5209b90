// The AVX-512F kernels for CPUs without a bf16 dot (Skylake-X, Cascade Lake, Ice Lake — and Intel
// cores generally for the indexer, see indexer.cpp): the fp32-FMA indexer (indexer_fp32_simd.h:
// 6 entries × 64 heads per tile, 24 accumulators) and sparse MLA attention
// (attention_fp32_simd.h: QK^T 6 entries × 64 heads, P·V 4 heads × 64 dims) on 16-lane zmm
// registers, compiled for this ISA only inside this file (`#pragma GCC target`) and namespace.
// GCC 12's own avx512fintrin.h trips -W(maybe-)uninitialized (known false positives inside
// _mm512_max_ps / _mm512_reduce_add_ps); silence them for this file only.
#if defined(__x86_64__)  // x86 only: the file is empty on other ISAs (see simd_neon.cpp)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
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
#pragma clang attribute push(__attribute__((target("avx512f,avx2,fma,f16c"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#endif

namespace spin::detail {
namespace avx512f {

struct V {
  using Reg = __m512;
  static constexpr int kLanes = 16;
  static constexpr int kHeadVectors = 4;  // head vectors per QK tile
  static constexpr int kPvVectors = 4;    // dim vectors per P·V tile
  static constexpr int kPvHeads = 4;      // heads per P·V tile (16 accumulators)
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
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23));
  }
  static float reduce(Reg a) { return _mm512_reduce_add_ps(a); }  // a fixed tree order
  static void e4m3x16(const uint8_t* src, float* dst) {  // see indexer_fp32_simd.h
    const __m256i x = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src)));
    const __m256i sign = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x80)), 8);
    const __m256i mag = _mm256_slli_epi16(_mm256_and_si256(x, _mm256_set1_epi16(0x7F)), 7);
    _mm512_storeu_ps(dst, _mm512_cvtph_ps(_mm256_or_si256(sign, mag)));
  }
  static void bf16x16(const uint8_t* src, float* dst) {  // 16 bf16 → fp32: exact (a 16-bit shift)
    const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src));
    _mm512_storeu_ps(dst, _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(x), 16)));
  }
};

#include "kernels/fp32_simd_tiles.h"
#include "kernels/indexer_fp32_simd.h"
#include "kernels/attention_fp32_simd.h"

}  // namespace avx512f

void indexer_run_avx512f(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads) {
  avx512f::run_fp32_indexer<avx512f::V>(params, tiles, num_threads);
}

void fp32_keys_run_avx512f(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out) {
  avx512f::score_fp32_keys<avx512f::V>(keys, count, q, w, heads, out);
}

void attention_run_avx512f(const SparseAttentionParams& params, int num_threads, int heads_per_task) {
  avx512f::run_fp32_attention<avx512f::V>(params, num_threads, heads_per_task);
}

}  // namespace spin::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // __x86_64__
