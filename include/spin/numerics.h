// spin/numerics.h — the number formats of the DSA indexer, bit-exact with DeepGEMM / vLLM.
//
//   e4m3 (float8_e4m3fn): 1 sign, 4 exponent (bias 7), 3 mantissa bits; no infinity; 0x7F/0xFF are
//        NaN; largest finite 448; subnormals m·2^-9. Encoding rounds to nearest, ties to even, and
//        saturates to ±448 (callers clamp first, as the DSA quantiser does).
//   bf16: the top 16 bits of an fp32. Every e4m3 value is exactly representable in bf16, which is
//        why a CPU kernel may compute e4m3 dot products as bf16 products with fp32 accumulation.
//   UE8M0 scale: a power of two, 2^ceil(log2(amax · (1/448))) with amax = max(max|x|, 1e-4),
//        computed with exponent-field bit operations exactly as DeepSeek's act_quant does.
//   binary16 (IEEE half, torch.float16): 1 sign, 5 exponent (bias 15), 10 mantissa bits; largest
//        finite 65504; subnormals m·2^-24. The predictor stores its slot EMA in it (block_state.h).
#pragma once

#include <bit>
#include <cmath>
#include <cstdint>

namespace spin {

inline constexpr float kE4m3Max = 448.0f;
inline constexpr float kQuantAmaxFloor = 1e-4f;
inline constexpr int kIndexerHeadDim = 128;
// Query rows per request and step: 1 (plain decode) to 1 + 3 MTP draft tokens.
inline constexpr int32_t kMaxNextN = 4;

float e4m3_to_float(uint8_t code);
uint8_t e4m3_from_float(float x);  // round-to-nearest-even, saturating to ±448; NaN → 0x7F|sign
uint16_t e4m3_to_bf16_bits(uint8_t code);

uint16_t bf16_from_float(float x);  // round-to-nearest-even (NaN stays NaN)
float bf16_to_float(uint16_t bits);

// binary16 ⇄ float, inline: the predictor converts every block's slot EMA on each select and
// observe (out of line they cost select 17–25 % at 128K–512K; docs/results.md).
inline uint16_t half_from_float(float x);  // round-to-nearest-even (as a CUDA / torch cast); NaN stays NaN
inline float half_to_float(uint16_t bits);  // exact
// x rounded to the nearest binary16 value (ties to even), as a float.
inline float round_to_half(float x) { return half_to_float(half_from_float(x)); }

// The UE8M0 power-of-two scale for a block whose largest magnitude is `amax` (floored at 1e-4).
float ue8m0_scale(float amax);

// In-place y = H_128 · v · 128^-0.5 with H the Sylvester (natural-order) Hadamard matrix,
// computed in fp32 by the fast Walsh–Hadamard butterflies.
void hadamard128(float* v);

// Quantises one 128-d vector: out[d] = e4m3(clamp(x[d] / scale, ±448)), returns the scale.
// Vectorised (4 lanes, baseline SIMD of x86-64 and aarch64); bitwise identical to the reference
// for every input, non-finite ones included (std::fmax / std::fmin semantics: NaN → -448).
float quantize_e4m3_block128(const float* x, uint8_t* out);
// The scalar definition (e4m3_from_float per element): the ground truth of the one above.
float quantize_e4m3_block128_reference(const float* x, uint8_t* out);

inline uint16_t half_from_float(float x) {
  const uint32_t bits = std::bit_cast<uint32_t>(x);
  const auto sign = static_cast<uint16_t>((bits >> 16) & 0x8000);
  const uint32_t abs = bits & 0x7FFFFFFF;
  if (abs > 0x7F800000) return static_cast<uint16_t>(sign | 0x7E00 | ((abs >> 13) & 0x3FF));  // quiet NaN
  if (abs >= 0x477FF000) return static_cast<uint16_t>(sign | 0x7C00);  // |x| ≥ 65520 (inf included) rounds to inf
  if (abs < 0x38800000) {
    // Below 2^-14: a subnormal half, m·2^-24 — the scaling is exact and nearbyint rounds half
    // to even; m = 1024 is the smallest normal, whose bits are m as well.
    const float scaled = std::bit_cast<float>(abs) * 16777216.0f;
    return static_cast<uint16_t>(sign | static_cast<uint32_t>(std::nearbyint(scaled)));
  }
  // Normal: the exponent rebiased (127 → 15), the 23-bit mantissa rounded to 10 bits, half to
  // even; a carry out of the mantissa moves into the exponent, as it should.
  uint32_t h = abs - (112u << 23);
  h += 0xFFF + ((h >> 13) & 1);
  return static_cast<uint16_t>(sign | (h >> 13));
}

inline float half_to_float(uint16_t bits) {
  const uint32_t sign = static_cast<uint32_t>(bits & 0x8000) << 16;
  const uint32_t exponent = (bits >> 10) & 0x1F, mantissa = bits & 0x3FF;
  if (exponent == 0) {  // zero or subnormal: mantissa · 2^-24, exact in a float
    const float magnitude = static_cast<float>(mantissa) * 0x1p-24f;
    return sign ? -magnitude : magnitude;
  }
  if (exponent == 31) return std::bit_cast<float>(sign | 0x7F800000 | (mantissa << 13));  // inf, NaN
  return std::bit_cast<float>(sign | ((exponent + 112) << 23) | (mantissa << 13));
}

}  // namespace spin
