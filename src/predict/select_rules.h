// The parts of PredictorBase::select_row and of the EMA ranking that depend on a row's block count
// alone, or are constants: named once here so that the predictor runs them and
// spin/selection_tables.h tabulates the very same functions for a mirror of the predictor on
// another device (python/spin_dsa/device).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "spin/predict.h"

namespace spin {

// The blocks a row of n blocks always keeps: its first sink blocks [0, sink_end) and its newest
// local blocks [local_begin, n). The two ranges overlap when n < sink_blocks + local_blocks.
struct ForcedRanges {
  int64_t sink_end;
  int64_t local_begin;
};
inline ForcedRanges forced_ranges(const PredictorConfig& config, int64_t n_blocks) {
  return {std::min<int64_t>(config.sink_blocks, n_blocks),
          std::max<int64_t>(0, n_blocks - config.local_blocks)};
}
// How many blocks the two ranges hold together.
inline int64_t forced_count(const ForcedRanges& f, int64_t n_blocks) {
  return f.sink_end + (n_blocks - std::max(f.local_begin, f.sink_end));
}

// Blocks a row explores: `share` of its budget rounded half away from zero (std::llround), at most
// `left`, the budget after the forced blocks.
inline int64_t explore_count(double share, int64_t budget, int64_t left) {
  return std::min<int64_t>(std::llround(share * static_cast<double>(budget)), left);
}

// PredictorConfig::topk_first ranks a block holding h of the last top-k at kTopkFirstBase + h + t:
// above every EMA value (|x| ≤ 1 + ln 2^20) and blended rank (8 ± a few standard scores). t, the
// block's own rank in eighths (PredictorBase::hit_tie_level), orders blocks of equal hits by
// history instead of by index: on the real traces most blocks hold a few of the top-k's entries
// (1–4 of 256), and the lower-index rule kept old blocks over better ones (docs/results.md).
// Exact in float32 (the step in [2^20, 2^21) is 1/8), so the device path computes the same bits.
inline constexpr float kTopkFirstBase = 1048576.0f;  // 2^20
// Hits are capped there (HitTies::kRank) so that base + hits stays below 2^21, where t's eighths
// are exact: only one block can hold 2^20 hits, so the cap never reorders two.
inline constexpr int32_t kTopkHitsCap = (1 << 20) - 1;
// PredictorConfig::recent_blocks ranks a block d blocks behind the newest at kRecentBase - d: below
// the last top-k's blocks, above every EMA value, exact in float32 (d < kMaxRecentBlocks = 2^18).
inline constexpr float kRecentBase = 524288.0f;  // 2^19
static_assert(kRecentBase - kMaxRecentBlocks > 1024.0f && kRecentBase < kTopkFirstBase);

}  // namespace spin
