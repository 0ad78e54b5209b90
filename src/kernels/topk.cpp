// Top-k selection: a sorting reference and a one-pass radix select with the same tie rule (score
// descending, position ascending) and the same output (positions ascending, -1 padded), over a
// whole row or over the entries of its scored blocks only.
//
// Radix select (kRadix) reads the row once:
//  - each finite score maps to a 32-bit key whose unsigned order is the score order (-0 folds onto
//    +0; ±inf and NaN map to key 0, which is never a candidate);
//  - the row streams through in groups of kGroup scores. A group is first tested with plain float
//    compares against the current threshold — portable code the compiler vectorises; once a few
//    thousand entries have been seen almost no group holds a candidate — and only a group with a
//    hit is compacted, branch-free, into a candidate buffer of (key, position) in position order;
//  - when the buffer is full it is reduced to the exact top-k of the prefix seen so far (radix
//    select on the keys, 8-bit digits from their highest differing bit, then a stable filter) and
//    the threshold rises to one above the k-th key: a later entry with that key ranks below all
//    k kept ones (position asc), so it can never be selected;
//  - after the first reduction (at ~2k candidates) and each time the entries seen double, the
//    floor also rises speculatively to where the row's final k-th key is expected (RadixRow's
//    comment): checked at the end, and a miss rescans the row without speculation;
//  - at the end one more reduction leaves the row's exact top-k, already in position order.
// So about k + O(sqrt(k)) candidates are written after the first ~2k entries: the row is read
// once with float compares, and the rest touches O(k) memory (the previous design made three full
// passes: histogram, candidate compaction, final emit scan; 2.7× / 2.5× / 1.3× std::nth_element
// at 32K / 128K / 512K). Worst case (an ascending row: every entry a candidate) it stays O(n):
// each reduction frees kSlack slots; a descending row misses the speculation and is read twice.
//
// A block mask only changes which position ranges stream through (adjacent blocks merged into one
// range); blocks are ascending, so positions stay ascending and the same code gives the same
// answer as over the -inf-padded row, reading only the scored entries.
#include <omp.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <utility>
#include <vector>

#include "core/errors.h"
#include "spin/memory.h"
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
  if (p.block_offsets != nullptr) {
    if (p.rows_per_mask < 1) return invalid_argument("rows_per_mask must be ≥ 1, got {}", p.rows_per_mask);
    if (p.rows % p.rows_per_mask != 0) {
      return invalid_argument("rows ({}) must be a multiple of rows_per_mask ({})", p.rows, p.rows_per_mask);
    }
    if (p.block_entries < 1 || p.block_entries > INT32_MAX) {
      return invalid_argument("block_entries must be in [1, 2^31), got {}", p.block_entries);
    }
  }
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
  if (p.block_offsets != nullptr) {
    const int32_t masks = p.rows / p.rows_per_mask;
    for (int32_t m = 0; m < masks; ++m) {
      const int32_t begin = p.block_offsets[m];
      const int32_t end = p.block_offsets[m + 1];
      if (begin < 0 || end < begin) {
        return invalid_argument("block_offsets[{}..{}] = [{}, {}) is not a valid range", m, m + 1, begin, end);
      }
      if (end > begin && p.block_ids == nullptr) {
        return invalid_argument("block_offsets selects {} blocks for mask {} but block_ids is null", end - begin, m);
      }
      for (int32_t i = begin; i < end; ++i) {
        if (p.block_ids[i] < 0) return out_of_range("mask {} selects block {} (ids must be ≥ 0)", m, p.block_ids[i]);
        if (i > begin && p.block_ids[i] <= p.block_ids[i - 1]) {
          return invalid_argument("mask {}: block ids must be sorted ascending and unique ({} after {})", m,
                                  p.block_ids[i], p.block_ids[i - 1]);
        }
      }
    }
  }
  return ok_status();
}

namespace {

// Order-preserving key: larger score → larger unsigned key; -0 folds onto +0. Non-finite scores
// (±inf, NaN) map to 0, a key no finite score can have (the smallest finite key is 0x00800000).
// Branch-free: scores have random signs.
inline uint32_t score_key(float score) {
  uint32_t u = std::bit_cast<uint32_t>(score);
  const bool finite = (u & 0x7F800000u) != 0x7F800000u;
  u = (u & 0x7FFFFFFFu) != 0 ? u : 0u;
  const uint32_t key = u ^ (static_cast<uint32_t>(static_cast<int32_t>(u) >> 31) | 0x80000000u);
  return finite ? key : 0u;
}

constexpr uint32_t kMinFiniteKey = 0x00800000u;  // score_key(-FLT_MAX)
constexpr float kMaxFinite = std::numeric_limits<float>::max();

// The smallest float t with {finite s : s >= t} == {finite s : score_key(s) >= lo}, for lo ≥ 1:
// the inverse of score_key. lo = 0x7FFFFFFF (just above the smallest negative denormal) gives
// -0.0, and s >= -0.0 holds for both zeros, whose key 0x80000000 is ≥ lo — as required. Keys above
// the largest finite one give +inf or a NaN, which no finite s reaches.
inline float key_floor_score(uint32_t lo) {
  if (lo <= kMinFiniteKey) return -kMaxFinite;
  return std::bit_cast<float>((lo & 0x80000000u) != 0 ? lo ^ 0x80000000u : ~lo);
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

// Scores tested per group with float compares before any candidate is written. Set with
// `spin bench topk --sparsity 0.5` (k = 2048, one thread, Sapphire Rapids): 8 vs 16 is within
// ±5 % on full rows (32K–512K) and 1.1–1.2× faster on masked rows read through their block list
// (fewer scores compacted per hit: the hits, not the compares, dominate); 32 and 64 are 10–50 %
// slower. P(hit) per group = 1 - (1 - k/m)^kGroup.
constexpr int kGroup = 8;
// Candidate slots beyond 2k: a reduction costs O(buffer) and frees (buffer - k) slots. Set with
// `spin bench topk` (k = 2048, one thread, Xeon Sapphire Rapids) before speculation: 1024 and
// 4096 within 5 % of each other from 32K to 512K (1024 10 % slower at 8K), 16384 25–60 % slower
// (the threshold rose too rarely). With speculation a forced reduction after the first is rare on
// indexer-like rows; the slack bounds the work on adversarial ones (an ascending row).
constexpr int64_t kSlack = 4096;

// Exact k-th largest of keys[0, n) (1 ≤ k ≤ n) and how many keys are strictly above it. Radix
// select on 8-bit digits, starting at the highest bit in which the keys differ (buffered keys
// often share their top 10–20 bits: everything above the floor), so usually 2–3 histogram passes,
// the first over all n keys, the later ones over the boundary digit's keys only (copied to `tmp`,
// ≥ n slots). 256 bins: clearing and walking them costs next to nothing at n ≈ k.
uint32_t kth_largest_key(const uint32_t* keys, int64_t n, int64_t k, uint32_t* tmp, int64_t* above_out) {
  uint32_t diff = 0;
  for (int64_t i = 0; i < n; ++i) diff |= keys[i] ^ keys[0];
  int top = 32 - std::countl_zero(diff);  // bits [top, 32) are the same in every key
  uint32_t prefix = top == 32 ? 0u : keys[0] >> top;
  int64_t above = 0;
  const uint32_t* cur = keys;
  int64_t m = n;
  while (top > 0) {
    const int width = std::min(top, 8);
    const int shift = top - width;
    const uint32_t mask = (1u << width) - 1;
    // Four interleaved counter arrays: clustered digits would otherwise serialise on
    // store-to-load forwarding of one counter.
    std::array<std::array<int32_t, 256>, 4> sub{};
    int64_t i4 = 0;
    for (; i4 + 4 <= m; i4 += 4) {
      ++sub[0][(cur[i4] >> shift) & mask];
      ++sub[1][(cur[i4 + 1] >> shift) & mask];
      ++sub[2][(cur[i4 + 2] >> shift) & mask];
      ++sub[3][(cur[i4 + 3] >> shift) & mask];
    }
    for (; i4 < m; ++i4) ++sub[0][(cur[i4] >> shift) & mask];
    int b = static_cast<int>(mask);
    int64_t here = 0;
    for (;; --b) {
      here = int64_t{sub[0][b]} + sub[1][b] + sub[2][b] + sub[3][b];
      if (above + here >= k) break;
      above += here;
    }
    prefix = (prefix << width) | static_cast<uint32_t>(b);
    top = shift;
    if (top == 0) break;
    int64_t w = 0;  // the boundary digit's keys
    for (int64_t i = 0; i < m; ++i) {
      tmp[w] = cur[i];
      w += (cur[i] >> shift) == prefix;
    }
    cur = tmp;
    m = w;
  }
  *above_out = above;
  return prefix;
}

// Per-thread candidate buffers, sized once per call (uninitialised: only [0, size) is ever read).
struct RadixScratch {
  int64_t capacity = 0;
  std::unique_ptr<uint32_t[]> keys, tmp;
  std::unique_ptr<int32_t[]> pos;
  void reserve(int64_t n) {
    if (n <= capacity) return;
    keys.reset(new uint32_t[static_cast<size_t>(n)]);
    tmp.reset(new uint32_t[static_cast<size_t>(n)]);
    pos.reset(new int32_t[static_cast<size_t>(n)]);
    capacity = n;
  }
};

// Whether any of g[0, kGroup) is a finite score ≥ t: an OR of compares with no early exit, which
// the compiler turns into packed compares (cmpleps) — its own function so that the loop is
// vectorised rather than unrolled into scalar compares inside the caller's loop.
inline bool group_has_candidate(const float* g, float t) {
  unsigned hits = 0;
#pragma GCC unroll 1
  for (int j = 0; j < kGroup; ++j) hits |= static_cast<unsigned>(g[j] >= t) & static_cast<unsigned>(g[j] <= kMaxFinite);
  return hits != 0;
}

// One row's streaming selection: scan() the row's ranges in ascending order, then finish().
//
// Speculation: after a reduction at m of the row's N scored entries the buffer holds the prefix's
// top k, and the row's final k-th key is most likely near the prefix's (k·m/N)-th. The floor is
// then raised speculatively to the prefix's q-th key, q = k·m/N + 4·sqrt(k·m/N) + 16 (< k), which
// skips almost every later candidate that would only be reduced away. It is exact whenever at
// least k buffered keys end up ≥ the floor (then every key ≥ the floor was collected and the k-th
// largest is among them). A reduction forced by a full buffer always has that (at most k of its
// keys, the last reduction's, lie below the floor — speculate() drops the rest — and it holds
// more than 2k); at the end finish() checks it and, in the
// rare miss (a descending row, say), returns false and the row is rescanned without speculation.
class RadixRow {
 public:
  RadixRow(int32_t k, int64_t capacity, int64_t scored, bool speculate, RadixScratch& s)
      : keys_(s.keys.get()),
        tmp_(s.tmp.get()),
        pos_(s.pos.get()),
        capacity_(capacity),
        limit_(std::min(capacity, 2 * int64_t{k} + kGroup)),
        scored_(scored),
        k_(k),
        speculate_(speculate) {}

  void scan(const float* row, int64_t begin, int64_t end) {
    seen_offset_ = seen_ - begin;
    int64_t i = begin;
    for (; i + kGroup <= end; i += kGroup) {
      if (group_has_candidate(row + i, floor_score_)) push_group(row + i, i);
    }
    if (i < end) push(row + i, i, end - i);
    seen_ += end - begin;
  }

  // Writes the top-k positions (ascending, -1 padded) to out[0, k); false: the speculative floor
  // was too high (nothing written; rescan without speculation).
  bool finish(int32_t* out) {
    if (floor_key_ > proven_floor_) {
      int64_t at_floor = 0;
      for (int64_t i = 0; i < size_; ++i) at_floor += keys_[i] >= floor_key_;
      if (at_floor < k_) return false;
    }
    if (size_ > k_) reduce(seen_);
    std::copy_n(pos_, size_, out);
    std::fill(out + size_, out + k_, -1);
    return true;
  }

 private:
  // Appends the group's entries with key ≥ floor_key_: every slot is written, the cursor advances
  // only on a take (no unpredictable branch). Room for a whole group is made first.
  void push(const float* g, int64_t first, int64_t count) {
    if (size_ + kGroup > limit_) reduce(seen_offset_ + first);
    if (seen_offset_ + first >= next_speculation_) speculate(seen_offset_ + first);
    uint32_t* kk = keys_ + size_;
    int32_t* pp = pos_ + size_;
    int64_t w = 0;
    for (int64_t j = 0; j < count; ++j) {
      const uint32_t key = score_key(g[j]);
      kk[w] = key;
      pp[w] = static_cast<int32_t>(first + j);
      w += key >= floor_key_;
    }
    size_ += w;
  }

  // push() of a whole group, with the keys computed first in a loop the compiler vectorises.
  void push_group(const float* g, int64_t first) {
    if (size_ + kGroup > limit_) reduce(seen_offset_ + first);
    if (seen_offset_ + first >= next_speculation_) speculate(seen_offset_ + first);
    uint32_t group_keys[kGroup];
#pragma GCC unroll 1
    for (int j = 0; j < kGroup; ++j) group_keys[j] = score_key(g[j]);
    uint32_t* kk = keys_ + size_;
    int32_t* pp = pos_ + size_;
    int64_t w = 0;
    for (int j = 0; j < kGroup; ++j) {
      kk[w] = group_keys[j];
      pp[w] = static_cast<int32_t>(first + j);
      w += group_keys[j] >= floor_key_;
    }
    size_ += w;
  }

  // size_ > k, ≥ k keys ≥ floor_key_ → the k best of the buffer (the exact top k of the `seen`
  // entries so far), in position order; the proven floor rises above their k-th key.
  void reduce(int64_t seen) {
    int64_t above = 0;
    const uint32_t threshold = kth_largest_key(keys_, size_, k_, tmp_, &above);
    int64_t equal_left = k_ - above;  // ties at the threshold: the lowest positions win
    int64_t w = 0;
    for (int64_t i = 0; i < size_; ++i) {
      const uint32_t key = keys_[i];
      const bool tie = key == threshold && equal_left > 0;
      equal_left -= tie;
      keys_[w] = key;
      pos_[w] = pos_[i];
      w += (key > threshold) | tie;
    }
    size_ = w;  // == k
    limit_ = capacity_;
    proven_floor_ = threshold + 1;  // threshold ≤ score_key(FLT_MAX) = 0xFF7FFFFF: no wrap
    floor_key_ = proven_floor_;
    floor_score_ = key_floor_score(floor_key_);
    speculate(seen);
  }

  // Raises the floor to the q-th largest buffered key, q = k·seen/N + 4·sqrt(k·seen/N) + 16 (when
  // q < k), and drops the buffered keys below it; then again each time `seen` doubles. Every seen
  // key ≥ the old floor is buffered, so the q-th largest buffered key (if above the old floor) is
  // the prefix's exact q-th key, and afterwards the buffer is exactly the seen keys ≥ the floor.
  void speculate(int64_t seen) {
    next_speculation_ = 2 * seen;
    if (!speculate_ || seen >= scored_) return;
    const double expected = static_cast<double>(k_) * static_cast<double>(seen) / static_cast<double>(scored_);
    const int64_t q = static_cast<int64_t>(expected + 4 * std::sqrt(expected)) + 16;
    if (q >= k_ || q > size_) return;
    int64_t ignored = 0;
    const uint32_t floor = kth_largest_key(keys_, size_, q, tmp_, &ignored);
    if (floor <= floor_key_) return;
    int64_t w = 0;
    for (int64_t i = 0; i < size_; ++i) {
      keys_[w] = keys_[i];
      pos_[w] = pos_[i];
      w += keys_[i] >= floor;
    }
    size_ = w;
    floor_key_ = floor;
    floor_score_ = key_floor_score(floor_key_);
  }

  uint32_t* keys_;
  uint32_t* tmp_;
  int32_t* pos_;
  int64_t size_ = 0;
  int64_t capacity_;
  // Buffer fill that forces a reduction: ~2k the first time (the floor starts rising early; no
  // speculation yet, so nothing needs proving), then the capacity (so more than k buffered keys
  // are ≥ a speculative floor: see above).
  int64_t limit_;
  int64_t scored_;           // entries the row streams in all
  int64_t seen_ = 0;         // entries streamed before the current range
  int64_t seen_offset_ = 0;  // seen_ - begin of the current range: entries seen before position i = offset + i
  int32_t k_;
  bool speculate_;
  int64_t next_speculation_ = std::numeric_limits<int64_t>::max();  // the first comes with the first reduction
  uint32_t proven_floor_ = 1;  // no key below it can be selected (1: every finite score can)
  uint32_t floor_key_ = 1;     // candidates have key ≥ floor_key_ (≥ proven_floor_)
  float floor_score_ = -kMaxFinite;
};

// Calls f(begin, end) for the row's scored ranges in ascending order: [0, n), or the mask's blocks
// clipped to [0, n) with adjacent blocks merged.
template <typename F>
void for_each_range(const TopkParams& p, int32_t r, int64_t n, const F& f) {
  if (p.block_offsets == nullptr) {
    if (n > 0) f(int64_t{0}, n);
    return;
  }
  const int32_t m = r / p.rows_per_mask;
  const int32_t last = p.block_offsets[m + 1];
  for (int32_t i = p.block_offsets[m]; i < last;) {
    const int64_t begin = int64_t{p.block_ids[i]} * p.block_entries;
    if (begin >= n) break;  // ids ascend: the rest lie past this row's end
    int32_t j = i + 1;
    while (j < last && p.block_ids[j] == p.block_ids[j - 1] + 1) ++j;
    f(begin, std::min(int64_t{p.block_ids[j - 1] + 1} * p.block_entries, n));
    i = j;
  }
}

}  // namespace

Status topk(const TopkParams& p, const TopkOptions& options) {
  SPIN_RETURN_IF_ERROR(validate_topk_params(p));
  if (options.num_threads < 0 || options.num_threads > max_threads()) {
    // An unbounded count would have OpenMP start that many threads (100000 exhausts the process).
    return invalid_argument("num_threads must be in 0..{} (this machine's logical CPUs; 0 = all), got {}",
                            max_threads(), options.num_threads);
  }
  const int threads = options.num_threads > 0 ? options.num_threads : omp_get_max_threads();
  const bool reference = options.impl == TopkImpl::kReference;
  // No row holds more than cols candidates, so short rows never pay for 2k + kSlack slots.
  const int64_t capacity = std::min(2 * int64_t{p.topk} + kSlack, p.cols + kGroup);
#pragma omp parallel num_threads(threads)
  {
    RadixScratch scratch;
    std::vector<float> padded;  // reference with a mask: the -inf-padded row
#pragma omp for schedule(dynamic, 1)
    for (int32_t r = 0; r < p.rows; ++r) {
      const float* row = p.scores + int64_t{r} * p.scores_stride;
      const int64_t n = p.visible_entries != nullptr ? p.visible_entries[r] : p.cols;
      int32_t* out = p.out + int64_t{r} * p.out_stride;
      if (reference) {
        if (p.block_offsets != nullptr) {
          padded.assign(static_cast<size_t>(n), -std::numeric_limits<float>::infinity());
          for_each_range(p, r, n, [&](int64_t b, int64_t e) { std::copy(row + b, row + e, padded.begin() + b); });
          row = padded.data();
        }
        topk_row_reference(row, n, p.topk, out);
      } else {
        scratch.reserve(capacity);
        int64_t scored = 0;
        for_each_range(p, r, n, [&](int64_t b, int64_t e) { scored += e - b; });
        for (bool speculate : {true, false}) {
          RadixRow sel(p.topk, capacity, scored, speculate, scratch);
          for_each_range(p, r, n, [&](int64_t b, int64_t e) { sel.scan(row, b, e); });
          if (sel.finish(out)) break;  // always true without speculation
        }
      }
    }
  }
  return ok_status();
}

}  // namespace spin
