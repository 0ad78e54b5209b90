// select_smallest: the partial selection behind every predictor's fill. Same contract as
// std::nth_element(a, a + k, a + n) for the first k — afterwards a[0..k) holds the k smallest
// keys, in no particular order — but with a branch-free partition loop: on random keys
// nth_element's partition mispredicts about every other comparison (~15-20 ns per key measured on
// 2048 blocks); this loop runs at a few ns per key. Keys must be distinct (the callers pack the
// block index into the low 32 bits), which also makes the chosen set unique.
#pragma once

#include <algorithm>
#include <bit>
#include <cstdint>

namespace spin {

inline void select_smallest(uint64_t* a, int64_t n, int64_t k) {
  if (k <= 0 || k >= n) return;
  int64_t lo = 0, hi = n;
  // Median-of-3 quickselect degrades only on adversarial inputs; after this many rounds, hand the
  // rest to introselect, whose worst case is O(n log n).
  int rounds = 2 * static_cast<int>(std::bit_width(static_cast<uint64_t>(n))) + 8;
  while (hi - lo > 32) {
    if (--rounds < 0) {
      std::nth_element(a + lo, a + k, a + hi);
      return;
    }
    const uint64_t x = a[lo], y = a[lo + (hi - lo) / 2], z = a[hi - 1];
    // The median of three distinct keys: one of them lies below it, itself not, so the
    // partition point falls strictly inside (lo, hi) and every round makes progress.
    const uint64_t pivot = std::max(std::min(x, y), std::min(std::max(x, y), z));
    int64_t store = lo;
    for (int64_t i = lo; i < hi; ++i) {
      // Lomuto without a branch: always swap, advance only past a smaller key. Keys in
      // [store, i) are ≥ pivot, so a swap that does not advance keeps that true.
      const uint64_t v = a[i];
      a[i] = a[store];
      a[store] = v;
      store += v < pivot;
    }
    if (store == k) return;
    if (k < store) {
      hi = store;
    } else {
      lo = store;
    }
  }
  std::nth_element(a + lo, a + k, a + hi);
}

}  // namespace spin
