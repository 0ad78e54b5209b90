// spin/lab/metrics.h — quality metrics against all-keep, one definition everywhere
// (library, CLI, reports, tests).
//
// Per sample (request, layer, step, row):
//   recall       = |A ∩ B| / |B|, A = SPIN's top-k, B = all-keep top-k; miss = 1 - recall
//   block_recall = share of B's entries lying in the selected blocks (recall before top-k)
//   sparsity     = 1 - scored / visible (realised, entries or blocks)
//   pearson      = correlation of predicted and true pooled block scores over the visible blocks
//   topk_recall  = token-level open-loop recall, e.g. |TopK(I_{t-1}) ∩ TopK(I_t)| / k, which is
//                  recall(previous top-k, current top-k)
// Top-k arrays are int32 entry positions, -1 = padding (spin/topk.h); negative values are
// skipped wherever they stand, and duplicates count once (the arrays are sets).
//
// Decisions:
// - recall and block_recall with an empty B (nothing visible) are 1: nothing could be missed.
// - pearson of fewer than 2 points or of a constant vector is NaN (undefined, not "no
//   correlation"); SampleStats skips NaN samples and counts them in nan_count().
// - sparsity with 0 visible is 0: nothing could be skipped.
// - Percentiles are nearest-rank: P-th percentile of n sorted values = the ceil(P/100 · n)-th
//   smallest (1-based, at least the 1st). p99 of 1..100 is 99, p99 of 1..10 is 10, p50 of 1..10
//   is 5. ceil is taken with a 1e-9 relative tolerance so that P·n/100 landing a rounding error
//   above an integer does not skip a rank.
// - A sample whose row sees <= topk entries is exact by construction (all-keep keeps every
//   visible entry, so any selection that scores them all is exact, and the budget never drops
//   below what top-k needs): QualityStats counts it in exact_by_construction() and keeps it out
//   of every distribution, sparsity included.
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/metrics.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

#include <cstdint>
#include <limits>
#include <span>
#include <vector>

namespace spin {

// |A ∩ B| / |B| over the valid (>= 0) entries; 1 when B has none.
double recall(std::span<const int32_t> topk_spin, std::span<const int32_t> topk_full);

// Share of B's valid entries whose block (position / block_entries) is in `selected_blocks`
// (logical block ids; sorted ascending is fastest, any order is accepted). 1 when B has no valid
// entry; NaN when block_entries < 1.
double block_recall(std::span<const int32_t> selected_blocks, std::span<const int32_t> topk_full,
                    int64_t block_entries);

// Pearson correlation of x[0..n) and y[0..n), two-pass with double accumulation. NaN when n < 2,
// either vector is constant, or any value is not finite.
double pearson(const float* x, const float* y, int64_t n);
double pearson(const double* x, const double* y, int64_t n);

// 1 - scored / visible; 0 when visible <= 0.
double sparsity(int64_t scored, int64_t visible);

// The nearest-rank rank (1-based) of percentile p in [0, 100] among n values:
// max(1, ceil(p/100 · n)); 0 when n <= 0.
int64_t nearest_rank(double p, int64_t n);

// An accumulator of one metric's samples: count, mean, max, min and nearest-rank percentiles.
// Keeps every sample (8 bytes each). NaN samples are not added; they are counted in nan_count().
class SampleStats {
 public:
  void add(double x);
  void merge(const SampleStats& other);

  int64_t count() const { return static_cast<int64_t>(values_.size()); }
  int64_t nan_count() const { return nan_count_; }
  double mean() const;  // NaN when empty
  double max() const;   // NaN when empty
  double min() const;   // NaN when empty
  // Nearest-rank percentile, p in [0, 100]; NaN when empty. Sorts lazily; calls on a const object
  // from several threads at once are not safe.
  double percentile(double p) const;

  struct Summary {
    int64_t count = 0;
    int64_t nan_count = 0;
    double mean = std::numeric_limits<double>::quiet_NaN();
    double p50 = std::numeric_limits<double>::quiet_NaN();
    double p99 = std::numeric_limits<double>::quiet_NaN();
    double max = std::numeric_limits<double>::quiet_NaN();
  };
  Summary summary() const;

 private:
  mutable std::vector<double> values_;
  mutable bool sorted_ = true;
  int64_t nan_count_ = 0;
  double sum_ = 0.0;
};

// What one row of one step measured. NaN metrics and negative scored counts were not measured and
// are skipped.
struct RowQuality {
  int64_t visible_entries = 0;  // entries the row sees (decides exact-by-construction)
  int64_t scored_entries = -1;  // entries the predictor scored; < 0: not measured
  int64_t visible_blocks = 0;
  int64_t scored_blocks = -1;   // < 0: not measured
  int64_t probe_entries = 0;    // probe work in entry-equivalents (pooled keys scored: hisa, hybrid)
  double recall = std::numeric_limits<double>::quiet_NaN();
  double block_recall = std::numeric_limits<double>::quiet_NaN();
  double pearson = std::numeric_limits<double>::quiet_NaN();      // open loop
  double topk_recall = std::numeric_limits<double>::quiet_NaN();  // open loop, token level
};

// Aggregates RowQuality samples, separating those exact by construction (visible <= topk).
class QualityStats {
 public:
  explicit QualityStats(int64_t topk) : topk_(topk) {}

  void add(const RowQuality& row);
  // Adds `other`'s samples; false (and nothing merged) when its topk differs.
  bool merge(const QualityStats& other);

  int64_t topk() const { return topk_; }
  int64_t samples() const { return samples_; }  // every add(), exact ones included
  int64_t exact_by_construction() const { return exact_; }

  const SampleStats& recall() const { return recall_; }
  const SampleStats& miss() const { return miss_; }  // 1 - recall, for p99 miss
  const SampleStats& block_recall() const { return block_recall_; }
  const SampleStats& sparsity() const { return sparsity_; }
  const SampleStats& block_sparsity() const { return block_sparsity_; }
  const SampleStats& pearson() const { return pearson_; }
  const SampleStats& topk_recall() const { return topk_recall_; }
  // The indexer work the predictor caused over the full indexer's, summed over the samples that
  // are not exact by construction: (fine entries scored + probe entry-equivalents) / visible.
  // NaN without samples. Work, not time: deterministic (select/observe time: ReplayResult).
  double work_fraction() const;
  double probe_fraction() const;  // the probe's part of it
  double visible_entries_sum() const { return visible_sum_; }

 private:
  int64_t topk_;
  int64_t samples_ = 0;
  int64_t exact_ = 0;
  SampleStats recall_, miss_, block_recall_, sparsity_, block_sparsity_, pearson_, topk_recall_;
  double visible_sum_ = 0, scored_sum_ = 0, probe_sum_ = 0;  // rows with scored_entries measured
};

}  // namespace spin
