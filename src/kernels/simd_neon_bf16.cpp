// The Arm NEON BF16 indexer kernel for cores with FEAT_BF16 (BFDOT: Neoverse V1/V2/N2, Graviton
// 3/4, Grace, Apple M2 and later), chosen at run time by cpu_has_neon_bf16() (HWCAP2_BF16); the
// plain fp32 NEON kernel (simd_neon.cpp) serves every other aarch64 core. Only this file's own
// functions are compiled for Armv8.2-A + BF16 (`#pragma GCC target`: GCC 12's arm_neon.h declares
// the bf16 intrinsics for exactly that target; base Armv8-A everywhere else), so nothing outside
// it can emit a BF16 or v8.2 instruction — the cross build's second qemu run (a Cortex-A72, v8.0)
// would trap on one.
//
// Same math as the AVX-512 BF16 kernel (indexer_avx512.cpp): e4m3 → bf16 is exact, a bf16 × bf16
// product of two e4m3 values is exact in fp32, and BFDOT adds two such products to an fp32
// accumulator per lane — the FP8 tensor-core math up to summation order and BFDOT's own rounding
// of the pair sum (Arm's non-extended BF16 behaviour: round-to-odd inside the pair, denormals
// flushed; every operand and product here is a normal number, see below).
//  * Conversion: the fp16 trick of the fp32 kernels (indexer_fp32_simd.h) gives value · 2^-8
//    exactly in fp32 (FCVTL); its top 16 bits are then the exact bf16 (≤ 4 significant bits).
//    Keys and queries both carry 2^-8, so dots carry 2^-16 (kUnscale undoes it); the smallest
//    product, 2^-34, stays normal.
//  * Queries: packed once per row as [pair p][head] 32-bit words (dims 2p, 2p+1), heads padded to
//    a multiple of 16 with zero weights.
//  * Micro-kernel: 6 entries × 16 heads (4 q registers) = 24 accumulators of the 32 registers; per
//    dim pair, 4 query loads and 6 key-pair broadcasts (LD1R) feed 24 BFDOTs. The epilogue applies
//    ReLU and the weights and reduces over heads in a fixed order, so results are independent of
//    the thread count.
// Not timed on Arm hardware yet (only qemu, which checks correctness, not speed).
#if defined(__aarch64__)
#include <arm_neon.h>
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/indexer_internal.h"
#include "spin/geometry.h"

#if defined(__clang__)
#pragma clang attribute push(__attribute__((target("bf16"))), apply_to = function)
#else
#pragma GCC push_options
#pragma GCC target("arch=armv8.2-a+bf16")  // arm_neon.h declares the bf16 intrinsics for this target
#endif

namespace spin::detail {
namespace neon_bf16 {

constexpr int kEntries = 6;                         // entries per micro-tile
constexpr int kHeadVectors = 4;                     // 4-lane head vectors per micro-tile
constexpr int32_t kChunk = 4 * kHeadVectors;        // heads per micro-tile
constexpr int32_t kPairs = kIndexerHeadDim / 2;     // 64 dim pairs per key
constexpr float kUnscale = 65536.0f;                // 2^16: undoes the 2^-8 of both operands

// 8 e4m3 codes → the bf16 bit patterns of value · 2^-8 (exact; see the banner).
inline uint16x8_t e4m3x8_to_bf16(uint8x8_t codes) {
  const uint16x8_t w = vmovl_u8(codes);
  const uint16x8_t sign = vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x80)), 8);
  const uint16x8_t mag = vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x7F)), 7);
  const float16x8_t h = vreinterpretq_f16_u16(vorrq_u16(sign, mag));
  const uint32x4_t lo = vreinterpretq_u32_f32(vcvt_f32_f16(vget_low_f16(h)));
  const uint32x4_t hi = vreinterpretq_u32_f32(vcvt_high_f32_f16(h));
  return vcombine_u16(vshrn_n_u32(lo, 16), vshrn_n_u32(hi, 16));
}

// 128 e4m3 codes → 128 bf16 bit patterns (value · 2^-8), in dimension order.
inline void convert_row(const uint8_t* src, uint16_t* dst) {
  for (int d = 0; d < kIndexerHeadDim; d += 8) vst1q_u16(dst + d, e4m3x8_to_bf16(vld1_u8(src + d)));
}

// Σ_{h in chunk} w[h] · ReLU(k_e · q_h) for E entries, added to out[e].
//   keys: E × 128 bf16 (4-byte aligned rows); qpack: [pair][padded] words from the chunk's first
//   head; w: the chunk's weights.
template <int E>
inline void micro_tile(const uint16_t* keys, const uint32_t* qpack, int32_t padded, const float* w, float* out) {
  float32x4_t acc[E][kHeadVectors];
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
#pragma GCC unroll 4
    for (int j = 0; j < kHeadVectors; ++j) acc[e][j] = vdupq_n_f32(0.0f);
  }
  for (int32_t pair = 0; pair < kPairs; ++pair) {
    bfloat16x8_t q[kHeadVectors];
#pragma GCC unroll 4
    for (int j = 0; j < kHeadVectors; ++j) q[j] = vreinterpretq_bf16_u32(vld1q_u32(qpack + pair * padded + 4 * j));
#pragma GCC unroll 8
    for (int e = 0; e < E; ++e) {
      const uint32_t* kp = reinterpret_cast<const uint32_t*>(keys + e * kIndexerHeadDim) + pair;
      const bfloat16x8_t k = vreinterpretq_bf16_u32(vld1q_dup_u32(kp));
#pragma GCC unroll 4
      for (int j = 0; j < kHeadVectors; ++j) acc[e][j] = vbfdotq_f32(acc[e][j], k, q[j]);
    }
  }
  const float32x4_t zero = vdupq_n_f32(0.0f);
#pragma GCC unroll 8
  for (int e = 0; e < E; ++e) {
    float32x4_t s = vmulq_f32(vmaxq_f32(acc[e][0], zero), vld1q_f32(w));
#pragma GCC unroll 4
    for (int j = 1; j < kHeadVectors; ++j) s = vfmaq_f32(s, vmaxq_f32(acc[e][j], zero), vld1q_f32(w + 4 * j));
    out[e] += vaddvq_f32(s);  // FADDP twice: a fixed order
  }
}

template <int E>
inline void micro_all_heads(const uint16_t* keys, const uint32_t* qpack, int32_t padded, const float* w, float* out) {
  for (int32_t chunk = 0; chunk < padded; chunk += kChunk) micro_tile<E>(keys, qpack + chunk, padded, w + chunk, out);
}

void score_entries(const uint16_t* keys, int32_t count, const uint32_t* qpack, int32_t padded, const float* w,
                   float* out) {
  std::fill_n(out, count, 0.0f);
  int32_t i = 0;
  for (; i + kEntries <= count; i += kEntries) {
    micro_all_heads<kEntries>(keys + i * kIndexerHeadDim, qpack, padded, w, out + i);
  }
  const uint16_t* k = keys + i * kIndexerHeadDim;
  switch (count - i) {
    case 5: micro_all_heads<5>(k, qpack, padded, w, out + i); break;
    case 4: micro_all_heads<4>(k, qpack, padded, w, out + i); break;
    case 3: micro_all_heads<3>(k, qpack, padded, w, out + i); break;
    case 2: micro_all_heads<2>(k, qpack, padded, w, out + i); break;
    case 1: micro_all_heads<1>(k, qpack, padded, w, out + i); break;
    default: break;
  }
}

// Every row's query once as [row][pair][padded head] words (zero past the real heads), and
// zero-padded weights.
void pack_queries(const IndexerParams& p, int32_t padded, int num_threads, std::vector<uint32_t>& qpack,
                  std::vector<float>& wpad) {
  const int64_t rows = int64_t{p.batch} * p.next_n;
  const int32_t heads = p.num_heads;
  qpack.assign(static_cast<size_t>(rows) * kPairs * padded, 0u);
  wpad.assign(static_cast<size_t>(rows) * padded, 0.0f);
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t r = 0; r < rows; ++r) {
    alignas(16) uint16_t converted[kIndexerHeadDim];
    for (int32_t h = 0; h < heads; ++h) {
      convert_row(p.q + (r * heads + h) * kIndexerHeadDim, converted);
      for (int32_t pair = 0; pair < kPairs; ++pair) {
        const uint32_t word = uint32_t{converted[2 * pair]} | (uint32_t{converted[2 * pair + 1]} << 16);
        qpack[(r * kPairs + pair) * padded + h] = word;
      }
      wpad[r * padded + h] = p.weights[r * heads + h];
    }
  }
}

}  // namespace neon_bf16

// Scores the planned tiles (outputs already -inf filled), as every indexer implementation does.
void indexer_run_neon_bf16(const IndexerParams& p, const std::vector<IndexerTile>& tiles, int num_threads) {
  using namespace neon_bf16;
  const IndexerPageLayout layout{p.page_size};
  const int32_t padded = (p.num_heads + kChunk - 1) / kChunk * kChunk;
  std::vector<uint32_t> qpack;
  std::vector<float> wpad;
  pack_queries(p, padded, num_threads, qpack, wpad);
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel for schedule(static) num_threads(num_threads)
  for (int64_t t = 0; t < n_tiles; ++t) {
    const IndexerTile& tile = tiles[t];
    alignas(64) uint16_t keys[kTileEntries * kIndexerHeadDim];
    alignas(64) float scores[kTileEntries];
    const uint8_t* page = p.key_cache + tile.physical_page * layout.page_bytes();
    const int32_t first_offset = static_cast<int32_t>(tile.first_entry % p.page_size);
    for (int32_t i = 0; i < tile.count; ++i) {
      convert_row(page + layout.value_offset(first_offset + i), keys + i * kIndexerHeadDim);
    }
    if (t + 1 < n_tiles) prefetch_tile_values(p, tiles[t + 1]);
    const int64_t context_len = p.context_lens[tile.request];
    for (int32_t r = 0; r < p.next_n; ++r) {
      const int64_t visible = visible_entries(context_len, p.next_n, r, p.compress_ratio);
      const int32_t count = static_cast<int32_t>(std::min<int64_t>(tile.count, visible - tile.first_entry));
      if (count <= 0) continue;
      const int64_t row = int64_t{tile.request} * p.next_n + r;
      score_entries(keys, count, qpack.data() + row * kPairs * padded, padded, wpad.data() + row * padded, scores);
      write_tile_scores(p, tile, row, count, scores, kUnscale);
    }
  }
}

}  // namespace spin::detail

#if defined(__clang__)
#pragma clang attribute pop
#else
#pragma GCC pop_options
#endif
#endif  // __aarch64__
