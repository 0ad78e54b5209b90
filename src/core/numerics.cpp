// Number formats of the DSA indexer (see spin/numerics.h for the definitions).
#include "spin/numerics.h"

#include <array>
#include <bit>
#include <cmath>
#include <limits>

namespace spin {
namespace {

float e4m3_decode_formula(uint8_t code) {
  const int sign = code >> 7;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m · 2^-9
  } else {
    magnitude = std::ldexp(1.0f + static_cast<float>(mantissa) / 8.0f, exponent - 7);
  }
  return sign ? -magnitude : magnitude;
}

const std::array<float, 256>& e4m3_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int c = 0; c < 256; ++c) t[c] = e4m3_decode_formula(static_cast<uint8_t>(c));
    return t;
  }();
  return table;
}

}  // namespace

float e4m3_to_float(uint8_t code) { return e4m3_table()[code]; }

uint8_t e4m3_from_float(float x) {
  const uint8_t sign = (std::bit_cast<uint32_t>(x) >> 24) & 0x80;
  if (std::isnan(x)) return sign | 0x7F;
  const float a = std::fabs(x);
  if (a >= kE4m3Max) return sign | 0x7E;  // saturate (448 = 0x7E; 480 would be the NaN code)
  // Below 2^-6 the quantum is the subnormal step 2^-9; above, 2^(e-3) for exponent e.
  // Scaling by a power of two is exact, so nearbyint (ties to even) gives the RNE mantissa, and a
  // mantissa that rounds up to 16 carries into the exponent field by plain addition.
  if (a < 0x1p-6f) {  // zero and subnormals (m = 8 carries into the smallest normal, code 0x08)
    const int m = static_cast<int>(std::nearbyint(std::ldexp(a, 9)));
    return static_cast<uint8_t>(sign | m);
  }
  int exponent;
  std::frexp(a, &exponent);  // a = f · 2^exponent, f in [0.5, 1)
  const int e = exponent - 1;  // a in [2^e, 2^(e+1))
  const int q = static_cast<int>(std::nearbyint(std::ldexp(a, 3 - e)));  // in [8, 16]
  return static_cast<uint8_t>(sign | (((e + 7) << 3) + q - 8));
}

uint16_t e4m3_to_bf16_bits(uint8_t code) { return bf16_from_float(e4m3_to_float(code)); }

uint16_t bf16_from_float(float x) {
  uint32_t bits = std::bit_cast<uint32_t>(x);
  if (std::isnan(x)) return static_cast<uint16_t>((bits >> 16) | 0x40);  // keep it a quiet NaN
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

float bf16_to_float(uint16_t bits) { return std::bit_cast<float>(static_cast<uint32_t>(bits) << 16); }

float ue8m0_scale(float amax) {
  const float a = std::fmax(amax, kQuantAmaxFloor);
  const float s = a * (1.0f / kE4m3Max);  // fl32(amax · fl32(1/448)), as act_quant computes it
  const uint32_t bits = std::bit_cast<uint32_t>(s);
  uint32_t exponent = (bits >> 23) & 0xFF;
  if (bits & 0x7FFFFF) exponent += 1;  // ceil(log2 s): round up unless s is a power of two
  return std::bit_cast<float>(exponent << 23);
}

void hadamard128(float* v) {
  for (int len = 1; len < kIndexerHeadDim; len <<= 1) {
    for (int i = 0; i < kIndexerHeadDim; i += 2 * len) {
      for (int j = i; j < i + len; ++j) {
        const float a = v[j];
        const float b = v[j + len];
        v[j] = a + b;
        v[j + len] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(kIndexerHeadDim));
  for (int d = 0; d < kIndexerHeadDim; ++d) v[d] *= norm;
}

float quantize_e4m3_block128_reference(const float* x, uint8_t* out) {
  float amax = 0.0f;
  for (int d = 0; d < kIndexerHeadDim; ++d) amax = std::fmax(amax, std::fabs(x[d]));
  const float scale = ue8m0_scale(amax);
  for (int d = 0; d < kIndexerHeadDim; ++d) {
    const float v = std::fmin(std::fmax(x[d] / scale, -kE4m3Max), kE4m3Max);
    out[d] = e4m3_from_float(v);
  }
  return scale;
}

// ---------------------------------------------------------------------------------------------
// The block quantiser, four lanes at a time with the compiler's generic vectors (SSE2 on any
// x86-64, NEON on aarch64: both baseline, so no dispatch), bitwise identical to the reference
// above for every input, NaN and infinities included (tests/core_numerics_test.cpp):
//  * amax: a lane keeps its value unless |x| > it; the lanes' maxima combine in any order (max of
//    non-NaN values is exact). A block holding a NaN goes to the reference instead: std::fmax
//    skips a quiet NaN but returns NaN for a signalling one (glibc, IEEE 754-2008 maxNum), which
//    then resets the running max — an order that lanes cannot follow. (Keys and queries are
//    checked finite before they get here; infinities take the fast path.)
//  * clamp: y > -448 ? y : -448, then < 448 ? · : 448 — std::fmax / std::fmin, NaN → -448 included.
//  * encode (|v| ≤ 448 after the clamp): below 2^-6, m = RNE(|v| · 2^9) — exact scaling, then
//    rounding by adding 2^23 (the integer lands in the mantissa bits); above, RNE to 3 mantissa
//    bits by integer addition on the fp32 bits (a carry moves into the exponent, as the
//    reference's mantissa 16 does), minus the exponent bias difference (127 − 7) · 8. 448 itself
//    encodes to 0x7E and nothing rounds past it, so the saturation branch is never needed.

namespace {

using F4 = float __attribute__((vector_size(16)));
using I4 = int32_t __attribute__((vector_size(16)));

F4 load4(const float* p) {
  F4 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

F4 select4(I4 mask, F4 a, F4 b) {
  return std::bit_cast<F4>((mask & std::bit_cast<I4>(a)) | (~mask & std::bit_cast<I4>(b)));
}

I4 e4m3_codes4(F4 v) {
  const I4 bits = std::bit_cast<I4>(v);
  const I4 sign = (bits >> 24) & 0x80;
  const I4 abs_bits = bits & 0x7FFFFFFF;
  const F4 a = std::bit_cast<F4>(abs_bits);
  const I4 sub = std::bit_cast<I4>(a * 512.0f + 0x1p23f) - std::bit_cast<I4>(F4{} + 0x1p23f);
  const I4 normal = ((abs_bits + 0x7FFFF + ((abs_bits >> 20) & 1)) >> 20) - (120 << 3);
  const I4 small = a < 0x1p-6f;
  return sign | (small & sub) | (~small & normal);
}

}  // namespace

float quantize_e4m3_block128(const float* x, uint8_t* out) {
  const I4 abs_mask = I4{} + 0x7FFFFFFF;
  F4 lane_max = F4{};
  I4 nan = I4{};
  for (int d = 0; d < kIndexerHeadDim; d += 4) {
    const F4 a = std::bit_cast<F4>(std::bit_cast<I4>(load4(x + d)) & abs_mask);
    lane_max = select4(a > lane_max, a, lane_max);
    nan |= a != a;
  }
  if ((nan[0] | nan[1] | nan[2] | nan[3]) != 0) return quantize_e4m3_block128_reference(x, out);
  const float amax = std::fmax(std::fmax(lane_max[0], lane_max[1]), std::fmax(lane_max[2], lane_max[3]));
  const float scale = ue8m0_scale(amax);
  // x / scale as x · (1/scale): the scale is a power of two (or +inf), so 1/scale is exact (at
  // worst subnormal) and both round the same real quotient once — bitwise equal, without a divide.
  const float inverse = 1.0f / scale;
  const F4 lo = F4{} - kE4m3Max, hi = F4{} + kE4m3Max;
  for (int d = 0; d < kIndexerHeadDim; d += 4) {
    const F4 y = load4(x + d) * inverse;
    const F4 low_clamped = select4(y > lo, y, lo);
    const I4 codes = e4m3_codes4(select4(low_clamped < hi, low_clamped, hi));
    for (int i = 0; i < 4; ++i) out[d + i] = static_cast<uint8_t>(codes[i]);
  }
  return scale;
}

}  // namespace spin
