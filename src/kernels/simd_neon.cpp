// The Arm NEON (AdvSIMD) kernels for aarch64, where NEON is always present: the fp32-FMA indexer
// (indexer_fp32_simd.h: 6 entries × 16 heads per tile, 24 accumulators) and sparse MLA attention
// (attention_fp32_simd.h: QK^T 6 entries × 16 heads, P·V 4 heads × 16 dims) on 4-lane q registers
// (32 of them, so the 6 × 4 register tile of the zmm kernel fits). The same templated bodies as
// the AVX2 and AVX-512F kernels, compiled inside this file's namespace; the whole file is empty on
// other ISAs (CMake compiles every kernel file everywhere and each guards its own ISA).
//
// e4m3 → fp32 as on x86 (indexer_fp32_simd.h): the codes become fp16 bit patterns of value · 2^-8
// by shifts, and FCVTL converts fp16 exactly (part of base AArch64, unlike the bf16 dot, which this
// file does not use: BFDOT rounds its products differently from the fp32 path and is left for a
// CPU that has it to measure).
#if defined(__aarch64__)
#include <arm_neon.h>
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

namespace spin::detail {
namespace neon {

struct V {
  using Reg = float32x4_t;
  static constexpr int kLanes = 4;
  static constexpr int kHeadVectors = 4;  // head vectors per QK tile (6 × 4 accumulators + 4 + 1 of 32)
  static constexpr int kPvVectors = 4;    // dim vectors per P·V tile (4 × 4 accumulators)
  static constexpr int kPvHeads = 4;      // heads per P·V tile (not measured on Arm yet: kept at 4)
  static Reg zero() { return vdupq_n_f32(0.0f); }
  static Reg set1(float x) { return vdupq_n_f32(x); }
  static Reg load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, Reg a) { vst1q_f32(p, a); }
  static Reg broadcast(const float* p) { return vld1q_dup_f32(p); }
  static Reg fma(Reg a, Reg b, Reg c) { return vfmaq_f32(c, a, b); }  // a·b + c, one rounding
  static Reg mul(Reg a, Reg b) { return vmulq_f32(a, b); }
  static Reg add(Reg a, Reg b) { return vaddq_f32(a, b); }
  static Reg sub(Reg a, Reg b) { return vsubq_f32(a, b); }
  static Reg max(Reg a, Reg b) { return vmaxq_f32(a, b); }  // operands are never NaN here
  static Reg round(Reg a) { return vrndnq_f32(a); }         // to nearest, ties to even
  static Reg pow2(Reg n) {                                  // 2^n for integral n in [-126, 127]
    return vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23));
  }
  static float reduce(Reg a) { return vaddvq_f32(a); }  // FADDP twice: (0+1) + (2+3), a fixed order
  static void e4m3x16(const uint8_t* src, float* dst) {  // see indexer_fp32_simd.h
    const uint8x16_t x = vld1q_u8(src);
    for (int half = 0; half < 2; ++half) {
      const uint16x8_t w = half == 0 ? vmovl_u8(vget_low_u8(x)) : vmovl_high_u8(x);
      const uint16x8_t sign = vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x80)), 8);
      const uint16x8_t mag = vshlq_n_u16(vandq_u16(w, vdupq_n_u16(0x7F)), 7);
      const float16x8_t h = vreinterpretq_f16_u16(vorrq_u16(sign, mag));
      vst1q_f32(dst + 8 * half, vcvt_f32_f16(vget_low_f16(h)));
      vst1q_f32(dst + 8 * half + 4, vcvt_high_f32_f16(h));
    }
  }
  static void bf16x16(const uint8_t* src, float* dst) {  // 16 bf16 → fp32: exact (a 16-bit shift)
    for (int half = 0; half < 2; ++half) {
      const uint16x8_t x = vreinterpretq_u16_u8(vld1q_u8(src + 16 * half));
      vst1q_f32(dst + 8 * half, vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(x), 16)));
      vst1q_f32(dst + 8 * half + 4, vreinterpretq_f32_u32(vshll_high_n_u16(x, 16)));
    }
  }
};

#include "kernels/fp32_simd_tiles.h"
#include "kernels/indexer_fp32_simd.h"
#include "kernels/attention_fp32_simd.h"

}  // namespace neon

void indexer_run_neon(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads) {
  neon::run_fp32_indexer<neon::V>(params, tiles, num_threads);
}

void fp32_keys_run_neon(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out) {
  neon::score_fp32_keys<neon::V>(keys, count, q, w, heads, out);
}

void attention_run_neon(const SparseAttentionParams& params, int num_threads, int heads_per_task) {
  neon::run_fp32_attention<neon::V>(params, num_threads, heads_per_task);
}

}  // namespace spin::detail
#endif  // __aarch64__
