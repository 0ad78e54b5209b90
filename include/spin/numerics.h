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

uint16_t half_from_float(float x);  // round-to-nearest-even (as a CUDA / torch cast); NaN stays NaN
float half_to_float(uint16_t bits);  // exact
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

}  // namespace spin
