// Top-k selection: a sorting reference and an O(n) radix select with the same tie rule
// (score descending, position ascending) and the same output (positions ascending, -1 padded).
//
// Radix select maps each finite score to a 32-bit key whose unsigned order is the score order,
// finds the exact k-th largest key with three histogram passes (11 + 11 + 10 bits; after the
// first pass only the candidates in the boundary bucket are revisited), then one final scan in
// position order emits every key above the threshold plus the first `needed` keys equal to it.
// That last scan is what makes both the tie rule and the ascending output free.
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "spin/topk.h"

namespace spin {

const char* topk_impl_name(TopkImpl impl) {
  switch (impl) {
    case TopkImpl::kAuto: return "auto";
    case TopkImpl::kRadix: return "radix";
    case TopkImpl::kReference: return "reference";
  }
  return "unknown";
}

Status validate_topk_params(const TopkParams& p) {
  if (p.rows < 0) return invalid_argument("rows must be ≥ 0, got {}", p.rows);
  if (p.topk < 1) return invalid_argument("topk must be ≥ 1, got {}", p.topk);
  if (p.cols < 0) return invalid_argument("cols must be ≥ 0, got {}", p.cols);
  if (p.cols > INT32_MAX) return invalid_argument("cols {} exceeds int32 positions", p.cols);
  if (p.scores_stride < p.cols) {
    return invalid_argument("scores_stride ({}) must be ≥ cols ({})", p.scores_stride, p.cols);
  }
  if (p.out_stride < p.topk) return invalid_argument("out_stride ({}) must be ≥ topk ({})", p.out_stride, p.topk);
  if (p.rows == 0) return ok_status();
  if (p.out == nullptr) return invalid_argument("out is null");
  if (p.cols > 0 && p.scores == nullptr) return invalid_argument("scores is null");
  if (p.visible_entries != nullptr) {
    for (int32_t r = 0; r < p.rows; ++r) {
      if (p.visible_entries[r] < 0 || p.visible_entries[r] > p.cols) {
        return out_of_range("visible_entries[{}] = {} is outside [0, cols={}]", r, p.visible_entries[r], p.cols);
      }
    }
  }
  return ok_status();
}

namespace {

// Order-preserving key: larger score → larger unsigned key; -0 folds onto +0. Non-finite scores
// (±inf, NaN) map to 0, a key no finite score can have (the smallest finite key is 0x00800000),
// so "bucket 0" means "not a candidate". Branch-free: scores have random signs.
inline uint32_t score_key(float score) {
  uint32_t u = std::bit_cast<uint32_t>(score);
  const bool finite = (u & 0x7F800000u) != 0x7F800000u;
  u = (u & 0x7FFFFFFFu) != 0 ? u : 0u;
  const uint32_t key = u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
  return finite ? key : 0u;
}

void topk_row_reference(const float* scores, int64_t n, int32_t k, int32_t* out) {
  std::vector<std::pair<float, int32_t>> finite;
  for (int64_t i = 0; i < n; ++i) {
    if (std::isfinite(scores[i])) finite.emplace_back(scores[i], static_cast<int32_t>(i));
  }
  std::sort(finite.begin(), finite.end(), [](const auto& a, const auto& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  });
  const size_t take = std::min(finite.size(), static_cast<size_t>(k));
  std::vector<int32_t> chosen;
  for (size_t i = 0; i < take; ++i) chosen.push_back(finite[i].second);
  std::sort(chosen.begin(), chosen.end());
  std::fill_n(out, k, -1);
  std::copy(chosen.begin(), chosen.end(), out);
}

struct RadixScratch {
  std::vector<uint32_t> keys;
  std::vector<uint32_t> next;
};

void topk_row_radix(const float* scores, int64_t n, int32_t k, int32_t* out, RadixScratch& scratch) {
  // Pass 1: histogram of the top 11 bits of every key (bucket 0 = non-finite).
  // Scores cluster in a few buckets, so one counter array would serialise on store-to-load
  // forwarding of the same counter; four interleaved arrays break that chain.
  std::array<std::array<uint32_t, 2048>, 4> sub{};
  int64_t i4 = 0;
  for (; i4 + 4 <= n; i4 += 4) {
    ++sub[0][score_key(scores[i4]) >> 21];
    ++sub[1][score_key(scores[i4 + 1]) >> 21];
    ++sub[2][score_key(scores[i4 + 2]) >> 21];
    ++sub[3][score_key(scores[i4 + 3]) >> 21];
  }
  for (; i4 < n; ++i4) ++sub[0][score_key(scores[i4]) >> 21];
  std::array<int64_t, 2048> hist{};
  for (int b = 0; b < 2048; ++b) hist[b] = int64_t{sub[0][b]} + sub[1][b] + sub[2][b] + sub[3][b];
  const int64_t finite = n - hist[0];
  if (finite <= k) {  // every finite score is selected
    int32_t w = 0;
    for (int64_t i = 0; i < n && w < k; ++i) {  // w < k: out has exactly k slots
      out[w] = static_cast<int32_t>(i);
      w += score_key(scores[i]) != 0;
    }
    std::fill(out + w, out + k, -1);
    return;
  }
  // Walk buckets from the top to find the one holding the k-th largest key.
  int64_t above = 0;  // keys strictly above the current bucket
  int bucket = 2047;
  while (above + hist[bucket] < k) above += hist[bucket--];
  uint32_t prefix = static_cast<uint32_t>(bucket);
  scratch.keys.clear();
  for (int64_t i = 0; i < n; ++i) {
    const uint32_t key = score_key(scores[i]);
    if ((key >> 21) == prefix) scratch.keys.push_back(key);
  }
  // Passes 2 and 3 refine on the candidates only: bits 20..10, then 9..0.
  const int shifts[2] = {10, 0};
  const int widths[2] = {11, 10};
  int known_bits = 11;
  for (int pass = 0; pass < 2; ++pass) {
    std::array<int64_t, 2048> h{};
    const uint32_t mask = (1u << widths[pass]) - 1;
    for (uint32_t key : scratch.keys) ++h[(key >> shifts[pass]) & mask];
    int b = static_cast<int>(mask);
    while (above + h[b] < k) above += h[b--];
    prefix = (prefix << widths[pass]) | static_cast<uint32_t>(b);
    known_bits += widths[pass];
    scratch.next.clear();
    for (uint32_t key : scratch.keys) {
      if ((key >> (32 - known_bits)) == prefix) scratch.next.push_back(key);
    }
    std::swap(scratch.keys, scratch.next);
  }
  // Final scan in position order: every key above the threshold, plus the first `equal_left`
  // keys equal to it (the lowest positions — the tie rule). Writes are unconditional and the
  // cursor advances only on a take, which keeps the loop free of unpredictable branches.
  const uint32_t threshold = prefix;  // the exact k-th largest key
  int64_t equal_left = k - above;
  int32_t w = 0;
  for (int64_t i = 0; i < n && w < k; ++i) {
    const uint32_t key = score_key(scores[i]);
    const bool tie = key == threshold && equal_left > 0;
    equal_left -= tie;
    out[w] = static_cast<int32_t>(i);
    w += (key > threshold) | tie;
  }
}

}  // namespace

Status topk(const TopkParams& p, const TopkOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_topk_params(p));
  if (options.num_threads < 0) return invalid_argument("num_threads must be ≥ 0, got {}", options.num_threads);
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  const bool reference = options.impl == TopkImpl::kReference;
#pragma omp parallel num_threads(threads)
  {
    RadixScratch scratch;
#pragma omp for schedule(dynamic, 1)
    for (int32_t r = 0; r < p.rows; ++r) {
      const float* row = p.scores + int64_t{r} * p.scores_stride;
      const int64_t n = p.visible_entries != nullptr ? p.visible_entries[r] : p.cols;
      int32_t* out = p.out + int64_t{r} * p.out_stride;
      if (reference) {
        topk_row_reference(row, n, p.topk, out);
      } else {
        topk_row_radix(row, n, p.topk, out, scratch);
      }
    }
  }
  return ok_status();
}

}  // namespace spin
