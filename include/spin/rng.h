// spin/rng.h — counter-based random numbers: every draw is a pure function of (key, counter).
// Public because the benchmarks and tests draw their inputs from the same streams the library uses
// (exploration, workloads, the engine's data), so that a run is reproduced from its seed alone.
//
// There is no global RNG anywhere in spin. A stream is keyed on what identifies the decision
// (seed, request, layer, step, ...), so two tensor-parallel ranks, or two thread counts, that make
// the same decision draw the same numbers without talking to each other.
#pragma once

#include <cstdint>

namespace spin {

// SplitMix64 finaliser: a bijective 64-bit mixer with full avalanche.
constexpr uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xBF58476D1CE4E5B9ULL;
  x ^= x >> 27;
  x *= 0x94D049BB133111EBULL;
  x ^= x >> 31;
  return x;
}

// Folds any number of identifiers into one stream key.
constexpr uint64_t stream_key(uint64_t seed) { return mix64(seed ^ 0x9E3779B97F4A7C15ULL); }
template <typename... Rest>
constexpr uint64_t stream_key(uint64_t seed, uint64_t next, Rest... rest) {
  return stream_key(mix64(seed + 0x9E3779B97F4A7C15ULL) ^ next, static_cast<uint64_t>(rest)...);
}

__extension__ typedef unsigned __int128 uint128;

class CounterRng {
 public:
  explicit constexpr CounterRng(uint64_t key) : key_(key) {}

  // The draw at an explicit counter (random access); next_u64() walks the counter.
  constexpr uint64_t at(uint64_t counter) const {
    return mix64(key_ + (counter + 1) * 0x9E3779B97F4A7C15ULL);
  }
  constexpr uint64_t next_u64() { return at(counter_++); }

  // Uniform in [0, n) without modulo bias (Lemire's multiply-shift with rejection), n ≥ 1.
  uint64_t below(uint64_t n) {
    for (;;) {
      const uint128 m = static_cast<uint128>(next_u64()) * n;
      const uint64_t low = static_cast<uint64_t>(m);
      if (low >= n || low >= (0 - n) % n) return static_cast<uint64_t>(m >> 64);
    }
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }
  // Standard normal by Box–Muller (one of the pair; simple and deterministic).
  double normal();

  uint64_t counter() const { return counter_; }

 private:
  uint64_t key_;
  uint64_t counter_ = 0;
};

}  // namespace spin
