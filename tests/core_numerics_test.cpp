// Number formats: e4m3 against all 256 codes, RNE at every midpoint, UE8M0 scales, Hadamard.
#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <vector>

#include "spin/numerics.h"
#include "spin/rng.h"

namespace spin {
namespace {

bool is_nan_code(int c) { return (c & 0x7F) == 0x7F; }

// Brute force: the finite magnitude code nearest to |x|, ties to the even mantissa (code bit 0
// clear), with the sign of x (tiny negatives become -0, as torch's float8_e4m3fn does).
uint8_t nearest_code(float x) {
  int best = 0;
  double best_err = std::fabs(x);
  for (int c = 1; c <= 0x7E; ++c) {
    const double err = std::fabs(double{e4m3_to_float(static_cast<uint8_t>(c))} - std::fabs(x));
    if (err < best_err || (err == best_err && (c & 1) == 0)) {
      best = c;
      best_err = err;
    }
  }
  return static_cast<uint8_t>(best | (std::signbit(x) ? 0x80 : 0));
}

TEST(E4m3, DecodesKnownCodes) {
  EXPECT_EQ(e4m3_to_float(0x00), 0.0f);
  EXPECT_TRUE(std::signbit(e4m3_to_float(0x80)));
  EXPECT_EQ(e4m3_to_float(0x38), 1.0f);
  EXPECT_EQ(e4m3_to_float(0x7E), 448.0f);
  EXPECT_EQ(e4m3_to_float(0xFE), -448.0f);
  EXPECT_EQ(e4m3_to_float(0x01), 0x1p-9f);   // smallest subnormal
  EXPECT_EQ(e4m3_to_float(0x07), 7 * 0x1p-9f);
  EXPECT_EQ(e4m3_to_float(0x08), 0x1p-6f);   // smallest normal
  EXPECT_TRUE(std::isnan(e4m3_to_float(0x7F)));
  EXPECT_TRUE(std::isnan(e4m3_to_float(0xFF)));
}

TEST(E4m3, EveryCodeRoundTripsAndIsExactInBf16) {
  for (int c = 0; c < 256; ++c) {
    if (is_nan_code(c)) continue;
    const float v = e4m3_to_float(static_cast<uint8_t>(c));
    EXPECT_EQ(e4m3_from_float(v), c) << "code " << c;
    EXPECT_EQ(bf16_to_float(e4m3_to_bf16_bits(static_cast<uint8_t>(c))), v) << "code " << c;
  }
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::quiet_NaN()) & 0x7F, 0x7F);
}

// Every midpoint between adjacent finite codes rounds to the even code; just off the midpoint
// rounds to the nearer one.
TEST(E4m3, MidpointsRoundToEven) {
  for (int c = 0; c < 0x7E; ++c) {
    const float lo = e4m3_to_float(static_cast<uint8_t>(c));
    const float hi = e4m3_to_float(static_cast<uint8_t>(c + 1));
    const float mid = (lo + hi) / 2;  // exact in fp32
    const int even = (c % 2 == 0) ? c : c + 1;
    EXPECT_EQ(e4m3_from_float(mid), even) << "between codes " << c << " and " << c + 1;
    EXPECT_EQ(e4m3_from_float(-mid), even | 0x80);
    EXPECT_EQ(e4m3_from_float(std::nextafter(mid, 0.0f)), c);
    EXPECT_EQ(e4m3_from_float(std::nextafter(mid, 1000.0f)), c + 1);
  }
}

TEST(E4m3, RandomValuesMatchBruteForceNearest) {
  CounterRng rng(stream_key(11));
  for (int i = 0; i < 20000; ++i) {
    const float x = static_cast<float>(std::ldexp(rng.uniform() * 2 - 1, static_cast<int>(rng.below(22)) - 12));
    if (std::fabs(x) >= 448.0f) continue;
    ASSERT_EQ(e4m3_from_float(x), nearest_code(x)) << "x = " << x;
  }
}

TEST(E4m3, SaturatesAt448) {
  EXPECT_EQ(e4m3_from_float(448.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(464.0f), 0x7E);
  EXPECT_EQ(e4m3_from_float(1e30f), 0x7E);
  EXPECT_EQ(e4m3_from_float(-1e30f), 0xFE);
  EXPECT_EQ(e4m3_from_float(std::numeric_limits<float>::infinity()), 0x7E);
}

TEST(Bf16, RoundsToNearestEven) {
  EXPECT_EQ(bf16_from_float(1.0f), 0x3F80);
  EXPECT_EQ(bf16_from_float(std::bit_cast<float>(0x3F808000u)), 0x3F80);  // tie → even
  EXPECT_EQ(bf16_from_float(std::bit_cast<float>(0x3F818000u)), 0x3F82);  // tie → even (up)
  EXPECT_EQ(bf16_from_float(std::bit_cast<float>(0x3F808001u)), 0x3F81);
  EXPECT_TRUE(std::isnan(bf16_to_float(bf16_from_float(std::numeric_limits<float>::quiet_NaN()))));
}

// binary16's value of code h, computed from its definition (independent of half_to_float).
double half_value(uint16_t h) {
  const int exponent = (h >> 10) & 0x1F, mantissa = h & 0x3FF;
  const double magnitude = exponent == 0 ? std::ldexp(mantissa, -24)
                                         : std::ldexp(1024 + mantissa, exponent - 25);
  return (h & 0x8000) ? -magnitude : magnitude;
}

TEST(Half, EveryCodeDecodesAndRoundTrips) {
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const auto code = static_cast<uint16_t>(h);
    if (((code >> 10) & 0x1F) == 31) {  // inf and NaN
      const float v = half_to_float(code);
      EXPECT_EQ(std::isnan(v), (code & 0x3FF) != 0) << h;
      if (!std::isnan(v)) {
        EXPECT_EQ(half_from_float(v), code) << h;
      }
      continue;
    }
    EXPECT_EQ(double{half_to_float(code)}, half_value(code)) << h;
    EXPECT_EQ(half_from_float(half_to_float(code)), code) << h;
  }
}

TEST(Half, RoundsToNearestEvenAtEveryMidpoint) {
  // Between consecutive finite positive codes h, h + 1 (subnormals, the normal boundary and the
  // largest finite included): the midpoint (exact in a float) goes to the even code, a float
  // either side of it to the nearer one; then the same mirrored.
  for (uint16_t h = 0; h < 0x7BFF; ++h) {
    const auto next = static_cast<uint16_t>(h + 1);
    const auto mid = static_cast<float>((half_value(h) + half_value(next)) / 2);
    const uint16_t even = (h & 1) ? next : h;
    EXPECT_EQ(half_from_float(mid), even) << h;
    EXPECT_EQ(half_from_float(std::nextafter(mid, 0.0f)), h) << h;
    EXPECT_EQ(half_from_float(std::nextafter(mid, 1e9f)), next) << h;
    EXPECT_EQ(half_from_float(-mid), even | 0x8000) << h;
  }
  EXPECT_EQ(half_from_float(65504.0f), 0x7BFF);
  EXPECT_EQ(half_from_float(std::nextafter(65520.0f, 0.0f)), 0x7BFF);  // below the tie: largest
  EXPECT_EQ(half_from_float(65520.0f), 0x7C00);  // the tie with 2^16 goes to inf (even)
  EXPECT_EQ(half_from_float(-1e30f), 0xFC00);
  EXPECT_EQ(half_from_float(std::numeric_limits<float>::infinity()), 0x7C00);
  EXPECT_EQ(half_from_float(1e-9f), 0x0000);  // below half the smallest subnormal
  EXPECT_EQ(half_from_float(-0.0f), 0x8000);
  EXPECT_TRUE(std::isnan(half_to_float(half_from_float(std::numeric_limits<float>::quiet_NaN()))));
}

// The compiler's own binary16 where it has one in C++: _Float16 on x86-64 (GCC 12 has it there,
// not on AArch64), __fp16 on AArch64 (IEEE binary16; its conversions are the FPU's).
#if defined(__x86_64__) && defined(__FLT16_MANT_DIG__)
using CompilerHalf = _Float16;
#define SPIN_COMPILER_HALF 1
#elif defined(__aarch64__)
using CompilerHalf = __fp16;
#define SPIN_COMPILER_HALF 1
#endif

#if defined(SPIN_COMPILER_HALF)
TEST(Half, AgreesWithTheCompilersFloat16) {
  // Any bit pattern, and values across binary16's range (subnormals to overflow).
  CounterRng rng(stream_key(7));
  for (int i = 0; i < 1000000; ++i) {
    const float x = (i & 1) ? std::bit_cast<float>(static_cast<uint32_t>(rng.next_u64()))
                            : static_cast<float>(std::ldexp(rng.uniform() * 2 - 1,
                                                            static_cast<int>(rng.below(44)) - 26));
    if (std::isnan(x)) continue;
    EXPECT_EQ(half_from_float(x), std::bit_cast<uint16_t>(static_cast<CompilerHalf>(x))) << x;
  }
}
#endif

TEST(Ue8m0, PowerOfTwoCeiling) {
  EXPECT_EQ(ue8m0_scale(448.0f), 1.0f);           // exactly a power of two: no round-up
  EXPECT_EQ(ue8m0_scale(449.0f), 2.0f);
  EXPECT_EQ(ue8m0_scale(1.0f), 0x1p-8f);          // 1/448 → 2^ceil(-8.81) = 2^-8
  EXPECT_EQ(ue8m0_scale(0.0f), ue8m0_scale(1e-4f));  // amax floor
  CounterRng rng(stream_key(3));
  for (int i = 0; i < 1000; ++i) {
    const float amax = static_cast<float>(std::exp(rng.normal() * 5));
    const float s = ue8m0_scale(amax);
    int e;
    EXPECT_EQ(std::frexp(s, &e), 0.5f) << "not a power of two";
    EXPECT_LE(std::fmax(amax, 1e-4f) * (1.0f / 448.0f), s);
    EXPECT_GT(std::fmax(amax, 1e-4f) * (1.0f / 448.0f), s / 2);
  }
}

TEST(Quantize, Block128UsesScaleAndClamp) {
  std::vector<float> x(128);
  for (int d = 0; d < 128; ++d) x[d] = static_cast<float>(d - 64) * 0.37f;
  std::vector<uint8_t> codes(128);
  const float scale = quantize_e4m3_block128(x.data(), codes.data());
  EXPECT_EQ(scale, ue8m0_scale(64 * 0.37f));
  for (int d = 0; d < 128; ++d) {
    EXPECT_EQ(codes[d], e4m3_from_float(x[d] / scale));
    EXPECT_NEAR(e4m3_to_float(codes[d]) * scale, x[d], std::fabs(x[d]) / 16 + scale * 0x1p-9f);
  }
}

TEST(Hadamard, MatchesSylvesterMatrix) {
  CounterRng rng(stream_key(5));
  std::vector<float> v(128);
  for (float& x : v) x = static_cast<float>(rng.normal());
  std::vector<float> y = v;
  hadamard128(y.data());
  for (int i = 0; i < 128; ++i) {
    double expect = 0;
    for (int j = 0; j < 128; ++j) expect += ((std::popcount(static_cast<unsigned>(i & j)) & 1) ? -1.0 : 1.0) * v[j];
    EXPECT_NEAR(y[i], expect / std::sqrt(128.0), 1e-5) << "i = " << i;
  }
  hadamard128(y.data());  // H is symmetric and orthogonal: applying it twice is the identity
  for (int i = 0; i < 128; ++i) EXPECT_NEAR(y[i], v[i], 1e-5);
}

TEST(CounterRng, IsAPureFunctionOfKeyAndCounter) {
  CounterRng a(stream_key(1, 2, 3, 4));
  CounterRng b(stream_key(1, 2, 3, 4));
  CounterRng c(stream_key(1, 2, 3, 5));
  for (int i = 0; i < 100; ++i) {
    const uint64_t x = a.next_u64();
    EXPECT_EQ(x, b.next_u64());
    EXPECT_NE(x, c.next_u64());
    EXPECT_EQ(x, CounterRng(stream_key(1, 2, 3, 4)).at(static_cast<uint64_t>(i)));
  }
  std::vector<int> counts(7, 0);
  for (int i = 0; i < 70000; ++i) ++counts[a.below(7)];
  for (int n : counts) EXPECT_NEAR(n, 10000, 500);
}

// The vectorised block quantiser against its scalar reference, bitwise (codes and scale), on
// blocks meant to break it: random bit patterns (quiet and signalling NaNs, ±inf, subnormals),
// all-equal blocks, every rounding tie of every binade, ±0, values at and past ±448 · scale, and
// a single huge or tiny element that pins the scale.
struct QuantCase {
  const char* name;
  std::vector<float> block;
};

std::vector<QuantCase> hostile_blocks() {
  std::vector<QuantCase> cases;
  CounterRng rng(stream_key(91));
  auto bits_block = [&](uint32_t mask) {
    std::vector<float> b(128);
    for (float& v : b) v = std::bit_cast<float>(static_cast<uint32_t>(rng.next_u64()) & mask);
    return b;
  };
  for (int i = 0; i < 2000; ++i) cases.push_back({"random bits", bits_block(0xFFFFFFFFu)});
  for (int i = 0; i < 500; ++i) cases.push_back({"subnormals", bits_block(0x807FFFFFu)});
  for (int i = 0; i < 500; ++i) cases.push_back({"finite bits", bits_block(0xBF7FFFFFu)});
  for (float v : {0.0f, -0.0f, 1.0f, -3.5f, 1e-30f, 448.0f, 3e38f, std::numeric_limits<float>::denorm_min()}) {
    cases.push_back({"all equal", std::vector<float>(128, v)});
  }
  const float inf = std::numeric_limits<float>::infinity();
  const float qnan = std::numeric_limits<float>::quiet_NaN(), snan = std::numeric_limits<float>::signaling_NaN();
  for (float special : {inf, -inf, qnan, snan, -qnan}) {
    for (int at : {0, 3, 64, 127}) {
      std::vector<float> b(128);
      for (int d = 0; d < 128; ++d) b[d] = static_cast<float>(rng.normal()) * 10.0f;
      b[at] = special;
      cases.push_back({"one special", b});
    }
  }
  // Every midpoint between e4m3 neighbours of every binade (and just around it), scale pinned to 1
  // by a 448 in lane 0.
  for (int e = -10; e <= 8; ++e) {
    std::vector<float> b(128);
    b[0] = 448.0f;
    for (int d = 1; d < 128; ++d) {
      const float step = std::ldexp(1.0f, std::max(e - 3, -9));
      const float mid = std::ldexp(1.0f, e) + step * (static_cast<float>(d % 8) + 0.5f);
      b[d] = (d % 3 == 0 ? std::nextafter(mid, 0.0f) : d % 3 == 1 ? mid : std::nextafter(mid, inf)) * (d & 8 ? -1.0f : 1.0f);
    }
    cases.push_back({"ties", b});
  }
  for (float pin : {1e-38f, 1e-4f, 1e30f, 3.4e38f}) {
    std::vector<float> b(128);
    for (int d = 0; d < 128; ++d) b[d] = static_cast<float>(rng.normal());
    b[17] = pin;
    cases.push_back({"pinned scale", b});
  }
  return cases;
}

TEST(QuantizeBlock, VectorisedMatchesReferenceBitwise) {
  for (const QuantCase& c : hostile_blocks()) {
    uint8_t fast[128], ref[128];
    const float fast_scale = quantize_e4m3_block128(c.block.data(), fast);
    const float ref_scale = quantize_e4m3_block128_reference(c.block.data(), ref);
    ASSERT_EQ(std::bit_cast<uint32_t>(fast_scale), std::bit_cast<uint32_t>(ref_scale)) << c.name;
    ASSERT_EQ(std::memcmp(fast, ref, 128), 0) << c.name;
  }
}

}  // namespace
}  // namespace spin
