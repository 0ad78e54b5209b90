// spin/selection_tables.h — the selection rules that depend on a row's block count alone, as
// tables, and the ranking's constants: what a mirror of the predictor on another device
// (python/spin_dsa/device) reads instead of restating them. Each entry is computed by the very
// function the predictor runs (budget_blocks, pool_rank, the forced ranges, the exploration count,
// the offset buckets), so the library stays the reference.
#pragma once

#include <cstdint>
#include <vector>

#include "spin/predict.h"
#include "spin/status.h"

namespace spin {

struct SelectionTables {
  // [max_blocks + 1], by a row's block count n:
  std::vector<int64_t> budget;     // budget_blocks(config, n)
  std::vector<int64_t> forced;     // the sink and newest local blocks the row always keeps
  // Uniform exploration at the fixed explore_ratio (spin's family without explore_churn or
  // adapt): llround(explore_ratio · budget), at most budget - forced.
  std::vector<int64_t> explore;
  std::vector<int64_t> history;    // budget - forced - explore: the ranked picks
  std::vector<int64_t> pool_rank;  // max pooling's rank in spin's family (pool_depth)
  // [max(1, max_blocks)], by distance d ≥ 0 behind a row's newest block: the offset EMA's bucket.
  std::vector<int32_t> offset_bucket;
  // [offset_bucket(max(0, max_blocks - 1)) + 1] (a BlockState's bucket count), by bucket: the
  // distances [lo, hi) it holds (the last bucket's whole range, also past max_blocks).
  std::vector<int64_t> bucket_lo, bucket_hi;
};

// The tables for rows of 0..max_blocks blocks (0 ≤ max_blocks ≤ 2^31). kInvalidArgument for an
// invalid config or max_blocks, kResourceExhausted when the memory is not there.
Result<SelectionTables> selection_tables(const PredictorConfig& config, int64_t max_blocks);

struct SelectionConstants {
  double offset_mean_scale;         // the offset EMA's per-bucket fixed-point sum: x · this
  int64_t offset_exact_distances;   // distances below it have a bucket each
  int64_t offset_buckets_per_octave;
  float topk_first_base;            // topk_first: a block with h hits ranks at this + h + tie level
  int32_t topk_hits_cap;            // ... with h capped here
  float recent_base;                // recent_blocks: d blocks behind the newest rank at this - d
  float unknown_base;               // a block nothing is known about ranks at this - d
  double churn_ema_keep;            // explore_churn's churn EMA: keep · ema + weight · measured
  double churn_ema_weight;
  // adapt (PredictorConfig::adapt): a layer's exploration share moves by up to step · explore_ratio
  // a commit, within [floor, ceiling] · explore_ratio, a fall taken by `fall` of its move; the
  // additions' gain is an EMA of weight additions_gain_weight (src/predict/probe_share.h).
  double explore_share_step;
  double explore_share_fall;
  double explore_share_floor;
  double explore_share_ceiling;
  double additions_gain_weight;
  int64_t additions_gain_warmup;    // ... acted on after this many measured steps
};
SelectionConstants selection_constants();

// spin's topk_first tie level of a ranking value p (PredictorBase::hit_tie_level): p in quarters
// of [-1, 1], as 0, 1/8, ..., 7/8 (NaN: 0).
float hit_tie_level(float p);

}  // namespace spin
