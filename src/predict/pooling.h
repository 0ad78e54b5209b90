// Pooling: one row's indexer scores → one normalised value x[b] per scored block (the
// "observation" of a predictor). Internal to spin_predict (and the replay harness, which pools the
// true scores for the open-loop metrics); callers of the library hand a RowScores to observe().
#pragma once

#include <cstdint>
#include <limits>
#include <vector>

#include "spin/predict.h"

namespace spin {

// Normalisation (per row, so that steps are comparable): with kth = the row's k-th largest scored
// value (k = min(topk, scored entries); tie rule score desc, position asc) and spread = max - kth
// (or |max|, or 1, when that is 0), a pooled value v is first made relative, r = (v - kth)/spread
// (shift- and scale-free, any sign of scores), then squashed below 0 as r/(1-r): monotone, so the
// ranking is kept, and bounded by -1 (reached only by float rounding) so that a very bad block
// cannot swamp an EMA. Blocks nothing is known about rank below -1 (PredictorBase::unknown_score).
//   max:       r of the block's max score           → x in [-1, 1]; 0 = the block holds the kth
//              (with rank m > 1: of its m-th best score, or its smallest with fewer scored)
//   mean:      r of the block's mean score          → x in [-1, 1]
//   lse:       log Σ exp((s - kth)/spread)           → x in [-1, 1 + ln E]
//   topk-hits: (block's entries in the row's top-k) / E → x in [0, 1]
struct PooledRow {
  int64_t visible_entries = 0;
  int64_t newest_block = -1;   // block of the row's last visible entry; -1 if none
  int64_t scored_entries = 0;  // finite scored entries seen
  double kth_score = 0.0;
  double max_score = 0.0;
  std::vector<int32_t> blocks;     // observed blocks (≥ 1 finite entry), ascending
  std::vector<float> x;            // pooled, normalised value per observed block
  std::vector<int32_t> topk_hits;  // entries of the block in the row's top-k
  void clear();
};

// Buffers pool_row reuses across calls (optional): no allocation once warmed up.
struct PoolScratch {
  std::vector<float> values;         // copy of the scored values for the k-th selection
  std::vector<int32_t> block_index;  // block → index in scored_blocks (-1 elsewhere)
  std::vector<float> block_values;   // one block's scored values (max pooling's m-th best)
};

// Max pooling's rank m for a row that sees n_blocks blocks under `config`'s fixed budget:
// ⌈pool_depth · topk / budget_blocks⌉ within [1, block entries] (PredictorConfig::pool_depth).
int64_t pool_rank(const PredictorConfig& config, int64_t n_blocks);

// Validates and pools one row. Errors: a NaN or +inf score in a scored, visible entry (message
// names the block and position); blocks not ascending or outside the row buffer; inconsistent
// topk_positions. With topk_positions the scored entries are read once; without, twice plus an
// nth_element over them (an engine has the top-k already: pass it).
// Blocks listed beyond the row's visible entries are skipped (an MTP union holds later rows'
// newest blocks). rank: max pooling takes each block's rank-th best score (1: its best; spin's
// family passes pool_rank()).
Status pool_row(const PredictorConfig& config, const RowScores& row, PooledRow* out,
                PoolScratch* scratch = nullptr, int64_t rank = 1);
// The same with only the values buffer kept between calls (the block map is rebuilt per call).
Status pool_row(const PredictorConfig& config, const RowScores& row, PooledRow* out,
                std::vector<float>* values_scratch);

namespace detail {

// One block's statistics over its scored (not -inf) entries: the pool pass's inner loop.
struct BlockScan {
  int64_t n = 0, greater = 0, equal = 0;
  double sum = 0.0;
  float max = -std::numeric_limits<float>::infinity();
  bool non_finite = false;  // a NaN or +inf among them
};

// Entries are summed in kScanLanes interleaved fp32 lane sums (entry i to lane i mod 4, over the
// largest multiple of 4), which are added in lane order in double, then the rest one by one in
// double; the max is taken the same way. That order is part of the definition, so the vectorised
// scan and its reference agree bitwise, on every ISA and for any thread count (a row is pooled by
// one thread). Max, counts and hits are exact in any order; only the mean's sum depends on it.
inline constexpr int kScanLanes = 4;
BlockScan scan_block(const float* scores, int64_t len, float kth);            // generic vectors
BlockScan scan_block_reference(const float* scores, int64_t len, float kth);  // plain scalar code

}  // namespace detail

}  // namespace spin
