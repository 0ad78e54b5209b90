// spin/selection_tables.h against the predictor itself: each table entry is what a fresh predictor
// selects (its budget, exploration and forced blocks) for a row of that many blocks, and the
// offset buckets and constants are the state's own.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "predict/block_state.h"
#include "predict/budget_moves.h"
#include "predict/pooling.h"
#include "predict/predictor_base.h"
#include "predict/probe_share.h"
#include "predict/select_rules.h"
#include "predict_testing.h"
#include "spin/predict.h"
#include "spin/selection_tables.h"

namespace spin {
namespace {

using spin::testing::make_checked;

// Row 0's selection of a fresh predictor at step 0 for a context of n whole blocks.
Selection select_fresh(std::string_view name, const PredictorConfig& c, int64_t n) {
  auto p = make_checked(name, c, 1, 3);
  StepInput in;
  in.step = 0;
  in.num_entries = n * c.block_entries();
  Selection sel;
  const Status s = p->select(0, in, &sel);
  EXPECT_TRUE(s.ok()) << s.to_string();
  return sel;
}

// Configs the tables must follow: defaults, the sparsity and budget extremes, forced blocks that
// overlap or cover the row, no pooling depth, larger blocks.
std::vector<PredictorConfig> hostile_configs() {
  std::vector<PredictorConfig> out;
  PredictorConfig base;
  base.page_size = 4;
  base.topk = 8;
  base.explore_churn = 0;  // exploration at the fixed ratio, as the table has it
  base.explore_ratio = 0.3;
  out.push_back(base);
  PredictorConfig c = base;
  c.target_sparsity = 0.0;
  out.push_back(c);
  c = base;
  c.target_sparsity = 0.99;
  c.explore_ratio = 0.5;  // llround's halves
  out.push_back(c);
  c = base;
  c.explicit_budget_blocks = 0;
  c.sink_blocks = 0;
  c.local_blocks = 0;
  out.push_back(c);
  c = base;
  c.explicit_budget_blocks = 9;
  c.sink_blocks = 4;
  c.local_blocks = 6;
  c.pool_depth = 0;
  out.push_back(c);
  c = base;
  c.block_pages = 2;
  c.topk = 64;
  c.sink_blocks = 30;
  c.explore_ratio = 1.0;
  c.pool_depth = 1.0;
  out.push_back(c);
  return out;
}

TEST(PredictTables, EveryBlockCountIsThePredictorsOwn) {
  constexpr int64_t kMaxBlocks = 150;
  for (const PredictorConfig& c : hostile_configs()) {
    SCOPED_TRACE(c.to_string());
    auto r = selection_tables(c, kMaxBlocks);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const SelectionTables& t = r.value();
    ASSERT_EQ(t.budget.size(), size_t{kMaxBlocks + 1});
    ASSERT_EQ(t.forced.size(), t.budget.size());
    ASSERT_EQ(t.explore.size(), t.budget.size());
    ASSERT_EQ(t.history.size(), t.budget.size());
    ASSERT_EQ(t.pool_rank.size(), t.budget.size());
    EXPECT_EQ(t.budget[0], 0);
    EXPECT_EQ(t.forced[0], 0);
    for (int64_t n = 1; n <= kMaxBlocks; ++n) {
      SCOPED_TRACE(n);
      const auto i = static_cast<size_t>(n);
      EXPECT_EQ(t.budget[i], budget_blocks(c, n));
      EXPECT_EQ(t.pool_rank[i], pool_rank(c, n));
      EXPECT_EQ(t.forced[i] + t.explore[i] + t.history[i], t.budget[i]);
      EXPECT_GE(t.explore[i], 0);
      EXPECT_GE(t.history[i], 0);
      const Selection spin = select_fresh("spin", c, n);
      const Selection random = select_fresh("random", c, n);
      if (t.budget[i] >= n) {  // the row keeps every block (no exploration)
        EXPECT_EQ(spin.row_budget[0], n);
        EXPECT_EQ(random.row_budget[0], n);
        continue;
      }
      EXPECT_EQ(spin.row_budget[0], t.budget[i]);
      EXPECT_EQ(spin.row_explored[0], t.explore[i]);
      // random spends every block after the forced ones on its draws.
      EXPECT_EQ(random.row_budget[0] - random.row_explored[0], t.forced[i]);
      // ... and the forced ones are the sink and newest local blocks.
      const ForcedRanges f = forced_ranges(c, n);
      int64_t kept = 0;
      for (const int32_t b : random.row_blocks[0]) kept += b < f.sink_end || b >= f.local_begin;
      EXPECT_EQ(kept, t.forced[i]);
    }
  }
}

TEST(PredictTables, OffsetBucketsAreTheStatesOwn) {
  PredictorConfig c;
  for (const int64_t max_blocks : {0, 1, 2, 63, 64, 65, 129, 1000, 8192}) {
    SCOPED_TRACE(max_blocks);
    auto r = selection_tables(c, max_blocks);
    ASSERT_TRUE(r.ok()) << r.status().to_string();
    const SelectionTables& t = r.value();
    ASSERT_EQ(t.offset_bucket.size(), static_cast<size_t>(std::max<int64_t>(1, max_blocks)));
    for (size_t d = 0; d < t.offset_bucket.size(); ++d)
      ASSERT_EQ(t.offset_bucket[d], offset_bucket(static_cast<int64_t>(d)));
    BlockState s(0.5, 0.1);
    s.ensure_blocks(std::max<int64_t>(1, max_blocks));
    ASSERT_EQ(static_cast<int64_t>(t.bucket_lo.size()), s.n_offset_buckets());
    ASSERT_EQ(t.bucket_hi.size(), t.bucket_lo.size());
    EXPECT_EQ(t.bucket_lo[0], 0);
    for (size_t k = 0; k < t.bucket_lo.size(); ++k) {
      ASSERT_LT(t.bucket_lo[k], t.bucket_hi[k]);
      if (k + 1 < t.bucket_lo.size()) {
        EXPECT_EQ(t.bucket_hi[k], t.bucket_lo[k + 1]);
      }
      // Every distance of the range is in the bucket, and the ones around it are not.
      for (int64_t d = t.bucket_lo[k]; d < t.bucket_hi[k]; ++d) {
        ASSERT_EQ(offset_bucket(d), static_cast<int32_t>(k));
      }
      if (k > 0) {
        EXPECT_NE(offset_bucket(t.bucket_lo[k] - 1), static_cast<int32_t>(k));
      }
      EXPECT_NE(offset_bucket(t.bucket_hi[k]), static_cast<int32_t>(k));
    }
    EXPECT_GT(t.bucket_hi.back(), std::max<int64_t>(0, max_blocks - 1));  // the farthest distance
  }
}

TEST(PredictTables, TinyAndRefused) {
  PredictorConfig c;
  auto zero = selection_tables(c, 0);
  ASSERT_TRUE(zero.ok());
  EXPECT_EQ(zero.value().budget, std::vector<int64_t>{0});
  EXPECT_EQ(zero.value().pool_rank, std::vector<int64_t>{1});
  EXPECT_EQ(zero.value().offset_bucket, std::vector<int32_t>{0});
  EXPECT_EQ(zero.value().bucket_hi, std::vector<int64_t>{1});
  auto one = selection_tables(c, 1);
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one.value().budget, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(one.value().forced, (std::vector<int64_t>{0, 1}));
  EXPECT_EQ(selection_tables(c, -1).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(selection_tables(c, (int64_t{1} << 31) + 1).status().code(), StatusCode::kInvalidArgument);
  PredictorConfig bad;
  bad.target_sparsity = 1.0;
  EXPECT_EQ(selection_tables(bad, 10).status().code(), StatusCode::kInvalidArgument);
}

TEST(PredictTables, ConstantsAreThePredictorsOwn) {
  const SelectionConstants k = selection_constants();
  EXPECT_EQ(k.offset_mean_scale, kOffsetMeanScale);
  EXPECT_EQ(k.offset_exact_distances, kOffsetExactDistances);
  EXPECT_EQ(k.offset_buckets_per_octave, kOffsetBucketsPerOctave);
  EXPECT_EQ(k.topk_first_base, kTopkFirstBase);
  EXPECT_EQ(k.topk_hits_cap, kTopkHitsCap);
  EXPECT_EQ(k.recent_base, kRecentBase);
  for (const int64_t d : {0, 1, 5, 1 << 20}) {
    EXPECT_EQ(k.unknown_base - static_cast<float>(d), PredictorBase::unknown_score(d));
  }
  EXPECT_EQ(k.churn_ema_keep, kChurnEmaKeep);
  EXPECT_EQ(k.churn_ema_weight, kChurnEmaWeight);
  EXPECT_EQ(k.explore_share_step, kExploreShareStep);
  EXPECT_EQ(k.explore_share_fall, kExploreShareFall);
  EXPECT_EQ(k.explore_share_floor, kExploreShareFloor);
  EXPECT_EQ(k.explore_share_ceiling, kExploreShareCeiling);
  EXPECT_EQ(k.additions_gain_weight, kAdditionsGainWeight);
  EXPECT_EQ(k.additions_gain_warmup, kAdditionsGainWarmup);
  // The offset buckets' constants are the ones offset_bucket() runs.
  EXPECT_EQ(offset_bucket(k.offset_exact_distances - 1), k.offset_exact_distances - 1);
  EXPECT_EQ(offset_bucket(2 * k.offset_exact_distances),
            k.offset_exact_distances + k.offset_buckets_per_octave);
  for (const float p : {-std::numeric_limits<float>::infinity(), -2.0f, -1.0f, -0.75f, -0.2f, 0.0f,
                        0.3f, 0.999f, 1.0f, 7.5f, std::numeric_limits<float>::quiet_NaN()})
    EXPECT_EQ(hit_tie_level(p), PredictorBase::hit_tie_level(p)) << p;
}

}  // namespace
}  // namespace spin
