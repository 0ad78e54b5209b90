// spin/selection_tables.h: the predictor's per-block-count rules and constants, tabulated by the
// functions the predictor itself runs.
#include <algorithm>
#include <cstdint>
#include <new>
#include <vector>

#include "core/errors.h"
#include "predict/block_state.h"
#include "predict/budget_moves.h"
#include "predict/pooling.h"
#include "predict/predictor_base.h"
#include "predict/probe_share.h"
#include "predict/select_rules.h"
#include "spin/selection_tables.h"

namespace spin {
namespace {

void fill_tables(const PredictorConfig& config, int64_t max_blocks, SelectionTables* t) {
  const auto rows = static_cast<size_t>(max_blocks) + 1;
  t->budget.resize(rows);
  t->forced.resize(rows);
  t->explore.resize(rows);
  t->history.resize(rows);
  t->pool_rank.resize(rows);
  for (int64_t n = 0; n <= max_blocks; ++n) {
    const auto i = static_cast<size_t>(n);
    const int64_t budget = budget_blocks(config, n);
    const int64_t forced = forced_count(forced_ranges(config, n), n);
    // budget_blocks() keeps the forced blocks within the budget (select_row's `left` ≥ 0).
    const int64_t left = budget - forced;
    t->budget[i] = budget;
    t->forced[i] = forced;
    t->explore[i] = explore_count(config.explore_ratio, budget, left);
    t->history[i] = left - t->explore[i];
    t->pool_rank[i] = pool_rank(config, n);
  }
  // Distances 0..max(1, max_blocks) - 1: the farthest a row of max_blocks blocks sees is
  // max_blocks - 1 (and one entry for an empty table, as the device indexes it).
  const int64_t distances = std::max<int64_t>(1, max_blocks);
  t->offset_bucket.resize(static_cast<size_t>(distances));
  for (int64_t d = 0; d < distances; ++d) t->offset_bucket[static_cast<size_t>(d)] = offset_bucket(d);
  // Each bucket's range: offset_bucket() never decreases with the distance, so bucket k starts at
  // the first distance whose bucket is ≥ k (a binary search) and ends where bucket k + 1 starts.
  const int32_t last = offset_bucket(std::max<int64_t>(0, max_blocks - 1));
  const auto first_distance = [](int32_t k) {
    int64_t lo = 0, hi = int64_t{1} << 40;  // offset_bucket(2^40) = 200 > every k asked for
    while (lo < hi) {
      const int64_t mid = lo + (hi - lo) / 2;
      if (offset_bucket(mid) >= k) {
        hi = mid;
      } else {
        lo = mid + 1;
      }
    }
    return lo;
  };
  t->bucket_lo.resize(static_cast<size_t>(last) + 1);
  t->bucket_hi.resize(static_cast<size_t>(last) + 1);
  for (int32_t k = 0; k <= last; ++k) {
    t->bucket_lo[static_cast<size_t>(k)] = first_distance(k);
    t->bucket_hi[static_cast<size_t>(k)] = first_distance(k + 1);
  }
}

}  // namespace

Result<SelectionTables> selection_tables(const PredictorConfig& config, int64_t max_blocks) {
  SPIN_RETURN_IF_ERROR(config.validate());
  if (max_blocks < 0 || max_blocks > (int64_t{1} << 31))
    return invalid_argument("selection_tables: max_blocks {} is outside 0..2^31", max_blocks);
  SelectionTables t;
  try {
    fill_tables(config, max_blocks, &t);
  } catch (const std::bad_alloc&) {
    return resource_exhausted("selection_tables: no memory for the tables of {} blocks", max_blocks);
  }
  return t;
}

SelectionConstants selection_constants() {
  SelectionConstants k;
  k.offset_mean_scale = kOffsetMeanScale;
  k.offset_exact_distances = kOffsetExactDistances;
  k.offset_buckets_per_octave = kOffsetBucketsPerOctave;
  k.topk_first_base = kTopkFirstBase;
  k.topk_hits_cap = kTopkHitsCap;
  k.recent_base = kRecentBase;
  k.unknown_base = PredictorBase::unknown_score(0);
  k.churn_ema_keep = kChurnEmaKeep;
  k.churn_ema_weight = kChurnEmaWeight;
  k.explore_share_step = kExploreShareStep;
  k.explore_share_fall = kExploreShareFall;
  k.explore_share_floor = kExploreShareFloor;
  k.explore_share_ceiling = kExploreShareCeiling;
  k.additions_gain_weight = kAdditionsGainWeight;
  k.additions_gain_warmup = kAdditionsGainWarmup;
  return k;
}

float hit_tie_level(float p) { return PredictorBase::hit_tie_level(p); }

}  // namespace spin
