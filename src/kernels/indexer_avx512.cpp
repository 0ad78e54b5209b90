// AVX-512 BF16 indexer kernel (Zen 4, Sapphire Rapids and later).
//
// The score is a small GEMM per key tile: S[entry, head] = Σ_d k[entry, d] · q[head, d], then
// ReLU, the head-weighted sum and the key scale. e4m3 → bf16 is exact and a bf16×bf16 product is
// exact in fp32, so vdpbf16ps (pairs of bf16 products accumulated in fp32) reproduces the FP8
// tensor-core math up to summation order.
//
//  * Keys: each tile (≤ 32 entries of one page) is converted once, for all rows, with two byte
//    lookups (vpermi2b over a 128-entry table for the high and low bf16 bytes) plus the sign bit.
//    The conversion interleaves dimensions in a fixed lane order; queries go through the very same
//    conversion, so both operands share that order and the dot product is unchanged.
//  * Queries: packed once per row as [pair p][head] 32-bit words (dims 2p, 2p+1 of the converted
//    order), heads padded to a multiple of 64 with zero weights.
//  * Micro-kernel: 6 entries × 64 heads = 24 zmm accumulators; per dimension pair, 4 query loads
//    and 6 key-pair broadcasts feed 24 vdpbf16ps. The epilogue applies ReLU and the weights and
//    reduces over heads in a fixed order, so results are independent of the thread count.
// GCC 12's own _mm512_reduce_add_ps / _mm512_undefined_* trip -Wmaybe-uninitialized (a known
// false positive inside avx512fintrin.h); silence it for this file only.
#if defined(__x86_64__)  // x86 only: the file is empty on other ISAs (see simd_neon.cpp)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "kernels/indexer_internal.h"
#include "spin/cache.h"
#include "spin/numerics.h"

#define SPIN_TARGET_AVX512BF16 __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,avx512vbmi")))

namespace spin::detail {

namespace {

constexpr int kMicroEntries = 6;   // entries per micro-tile (24 accumulators + 4 query registers)
constexpr int kHeadChunk = 64;     // heads per micro-kernel pass (4 zmm of 16 fp32 lanes)
constexpr int kPairs = kIndexerHeadDim / 2;

// High and low bytes of bf16(e4m3(code)) for the 128 codes without the sign bit.
struct Bf16ByteTables {
  alignas(64) std::array<uint8_t, 128> hi;
  alignas(64) std::array<uint8_t, 128> lo;
};
const Bf16ByteTables& byte_tables() {
  static const Bf16ByteTables tables = [] {
    Bf16ByteTables t{};
    for (int c = 0; c < 128; ++c) {
      const uint16_t bits = e4m3_to_bf16_bits(static_cast<uint8_t>(c));
      t.hi[c] = static_cast<uint8_t>(bits >> 8);
      t.lo[c] = static_cast<uint8_t>(bits & 0xFF);
    }
    return t;
  }();
  return tables;
}

struct Converter {
  __m512i hi0, hi1, lo0, lo1, sign;

  SPIN_TARGET_AVX512BF16 static Converter make() {
    const Bf16ByteTables& t = byte_tables();
    return {_mm512_load_si512(t.hi.data()), _mm512_load_si512(t.hi.data() + 64),
            _mm512_load_si512(t.lo.data()), _mm512_load_si512(t.lo.data() + 64),
            _mm512_set1_epi8(static_cast<char>(0x80))};
  }
  // 128 e4m3 codes → 128 bf16 values in the kernel's dimension order.
  SPIN_TARGET_AVX512BF16 void convert128(const uint8_t* src, uint16_t* dst) const {
    for (int half = 0; half < 2; ++half) {
      const __m512i x = _mm512_loadu_si512(src + 64 * half);
      __m512i h = _mm512_permutex2var_epi8(hi0, x, hi1);  // index bit 7 (the sign) is ignored
      const __m512i l = _mm512_permutex2var_epi8(lo0, x, lo1);
      h = _mm512_or_si512(h, _mm512_and_si512(x, sign));
      _mm512_storeu_si512(dst + 64 * half, _mm512_unpacklo_epi8(l, h));
      _mm512_storeu_si512(dst + 64 * half + 32, _mm512_unpackhi_epi8(l, h));
    }
  }
};

// Σ_{h in chunk} w[h] · ReLU(k_e · q_h) for E entries, added to out[e].
//   keys: E × 128 bf16 (converted order); qpack: [64 pairs][padded_heads] words; w: chunk weights.
template <int E>
SPIN_TARGET_AVX512BF16 inline void micro_tile(const uint16_t* keys, const uint32_t* qpack,
                                              int32_t padded_heads, const float* w, float* out) {
  __m512 acc[E][4];
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[e][j] = _mm512_setzero_ps();
  }
  for (int pair = 0; pair < kPairs; ++pair) {
    const uint32_t* qrow = qpack + pair * padded_heads;
    const __m512bh q0 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qrow));
    const __m512bh q1 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qrow + 16));
    const __m512bh q2 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qrow + 32));
    const __m512bh q3 = reinterpret_cast<__m512bh>(_mm512_loadu_si512(qrow + 48));
#pragma GCC unroll 8
    for (int e = 0; e < E; ++e) {
      int32_t kpair;
      std::memcpy(&kpair, keys + e * kIndexerHeadDim + 2 * pair, sizeof(kpair));
      const __m512bh k = reinterpret_cast<__m512bh>(_mm512_set1_epi32(kpair));
      acc[e][0] = _mm512_dpbf16_ps(acc[e][0], k, q0);
      acc[e][1] = _mm512_dpbf16_ps(acc[e][1], k, q1);
      acc[e][2] = _mm512_dpbf16_ps(acc[e][2], k, q2);
      acc[e][3] = _mm512_dpbf16_ps(acc[e][3], k, q3);
    }
  }
  const __m512 zero = _mm512_setzero_ps();
  const __m512 w0 = _mm512_loadu_ps(w), w1 = _mm512_loadu_ps(w + 16);
  const __m512 w2 = _mm512_loadu_ps(w + 32), w3 = _mm512_loadu_ps(w + 48);
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
    __m512 s = _mm512_mul_ps(_mm512_max_ps(acc[e][0], zero), w0);
    s = _mm512_fmadd_ps(_mm512_max_ps(acc[e][1], zero), w1, s);
    s = _mm512_fmadd_ps(_mm512_max_ps(acc[e][2], zero), w2, s);
    s = _mm512_fmadd_ps(_mm512_max_ps(acc[e][3], zero), w3, s);
    out[e] += _mm512_reduce_add_ps(s);
  }
}

template <int E>
SPIN_TARGET_AVX512BF16 void micro_all_heads(const uint16_t* keys, const uint32_t* qpack, int32_t padded_heads,
                                            const float* w, float* out) {
  for (int32_t chunk = 0; chunk < padded_heads; chunk += kHeadChunk) {
    micro_tile<E>(keys, qpack + chunk, padded_heads, w + chunk, out);
  }
}

SPIN_TARGET_AVX512BF16 void score_entries(const uint16_t* keys, int32_t count, const uint32_t* qpack,
                                          int32_t padded_heads, const float* w, float* out) {
  std::fill_n(out, count, 0.0f);
  int32_t i = 0;
  for (; i + kMicroEntries <= count; i += kMicroEntries) {
    micro_all_heads<kMicroEntries>(keys + i * kIndexerHeadDim, qpack, padded_heads, w, out + i);
  }
  const uint16_t* k = keys + i * kIndexerHeadDim;
  switch (count - i) {
    case 5: micro_all_heads<5>(k, qpack, padded_heads, w, out + i); break;
    case 4: micro_all_heads<4>(k, qpack, padded_heads, w, out + i); break;
    case 3: micro_all_heads<3>(k, qpack, padded_heads, w, out + i); break;
    case 2: micro_all_heads<2>(k, qpack, padded_heads, w, out + i); break;
    case 1: micro_all_heads<1>(k, qpack, padded_heads, w, out + i); break;
    default: break;
  }
}

}  // namespace

SPIN_TARGET_AVX512BF16 void indexer_run_avx512bf16(const IndexerParams& p, const std::vector<IndexerTile>& tiles,
                                                   int num_threads) {
  const IndexerPageLayout layout{p.page_size};
  const Converter converter = Converter::make();
  const int32_t heads = p.num_heads;
  const int32_t padded = padded_heads(heads);
  const int64_t rows = int64_t{p.batch} * p.next_n;

  // Pack every row's query once: [row][pair][padded head] words, and zero-padded weights.
  std::vector<uint32_t> qpack(static_cast<size_t>(rows) * kPairs * padded, 0u);
  std::vector<float> wpad(static_cast<size_t>(rows) * padded, 0.0f);
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t r = 0; r < rows; ++r) {
    alignas(64) uint16_t converted[kIndexerHeadDim];
    for (int32_t h = 0; h < heads; ++h) {
      converter.convert128(p.q + (r * heads + h) * kIndexerHeadDim, converted);
      for (int pair = 0; pair < kPairs; ++pair) {
        uint32_t word;
        std::memcpy(&word, converted + 2 * pair, sizeof(word));
        qpack[(r * kPairs + pair) * padded + h] = word;
      }
      wpad[r * padded + h] = p.weights[r * heads + h];
    }
  }

  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const IndexerTile& tile = tiles[t];
    alignas(64) uint16_t keys[kTileEntries * kIndexerHeadDim];
    alignas(64) float scores[kTileEntries];
    const uint8_t* page = p.key_cache + tile.physical_page * layout.page_bytes();
    const int32_t first_offset = static_cast<int32_t>(tile.first_entry % p.page_size);
    for (int32_t i = 0; i < tile.count; ++i) {
      converter.convert128(page + layout.value_offset(first_offset + i), keys + i * kIndexerHeadDim);
    }
    if (t + 1 < n_tiles) prefetch_tile_values(p, tiles[t + 1]);
    const int64_t context_len = p.context_lens[tile.request];
    for (int32_t r = 0; r < p.next_n; ++r) {
      const int64_t visible = visible_entries(context_len, p.next_n, r, p.compress_ratio);
      const int32_t count = static_cast<int32_t>(std::min<int64_t>(tile.count, visible - tile.first_entry));
      if (count <= 0) continue;
      const int64_t row = int64_t{tile.request} * p.next_n + r;
      score_entries(keys, count, qpack.data() + row * kPairs * padded, padded, wpad.data() + row * padded, scores);
      write_tile_scores(p, tile, row, count, scores, 1.0f);
    }
  }
}

}  // namespace spin::detail
#endif  // __x86_64__
