// Tests of selection through the predictors: forced blocks, exact budget, the prediction fill and
// its tie rule, the unknown-block recency default, exploration counts, `stalest` and `uniform`.
#include <gtest/gtest.h>

#include <algorithm>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "predict/block_state.h"
#include "predict/kselect.h"
#include "predict_testing.h"
#include "spin/predict.h"
#include "spin/rng.h"

namespace spin {
namespace {

using testing::observe_union;
using testing::state_of;

// Blocks of 4 entries, top-k 4 (one block), 2 sinks, 3 locals, 50 % sparsity.
PredictorConfig base_config() { return testing::small_blocks_config(2, 3); }

using testing::block_scores;

std::unique_ptr<BlockPredictor> make(const char* name, const PredictorConfig& c, int32_t layers = 1,
                                     int64_t request = 0) {
  return testing::make_checked(name, c, layers, request);
}

bool contains(const std::vector<int32_t>& v, int32_t b) {
  return std::binary_search(v.begin(), v.end(), b);
}

// Step 0 with every block scored (the caller may score more than the selection), committed.
void observe_all(BlockPredictor& p, int64_t step, const std::vector<float>& full,
                 int64_t num_entries) {
  Selection sel;
  ASSERT_TRUE(p.select(0, {step, num_entries, 1}, &sel).ok());
  Selection everything;
  for (int32_t b = 0; b < blocks_for_entries(p.config(), num_entries); ++b)
    everything.blocks.push_back(b);
  ASSERT_TRUE(observe_union(p, 0, everything, {full}, num_entries, 1).ok());
  ASSERT_TRUE(p.commit(0).ok());
}

TEST(PredictSelect, ForcedBlocksAndRecencyDefault) {
  auto p = make("ema-slot", base_config());
  Selection sel;
  ASSERT_TRUE(p->select(0, {0, 80, 1}, &sel).ok());  // 20 blocks, budget 10
  // Nothing known yet: forced {0,1,17,18,19}, then the newest of the rest.
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 1, 12, 13, 14, 15, 16, 17, 18, 19}));
  EXPECT_EQ(sel.blocks, sel.row_blocks[0]);
  EXPECT_EQ(sel.row_budget[0], 10);
  EXPECT_EQ(sel.row_explored[0], 0);
}

TEST(PredictSelect, PredictionFillAndTies) {
  std::vector<float> v(20, 0.0f);
  v[5] = 10;
  v[3] = 8;
  v[9] = 8;
  v[11] = 6;
  // top-4 = block 5: kth = max = 10, spread = 10. x: block 5 → 0; 3, 9 → -1/6; 11 → -0.4/1.4;
  // every other block → -1/2.
  for (int32_t budget : {7, 8, 10}) {
    PredictorConfig c = base_config();
    c.explicit_budget_blocks = budget;
    auto p = make("ema-slot", c);
    observe_all(*p, 0, block_scores(v, 4), 80);
    EXPECT_EQ(state_of(*p, 0).slot(9), round_to_half(static_cast<float>(-1.0 / 6.0)));
    EXPECT_EQ(state_of(*p, 0).slot(11), round_to_half(static_cast<float>(-0.4 / 1.4)));
    Selection sel;
    StepInput in{1, 80, 1};
    in.want_scores = true;
    ASSERT_TRUE(p->select(0, in, &sel).ok());
    std::vector<int32_t> want;
    if (budget == 7) want = {0, 1, 3, 5, 17, 18, 19};  // 3 beats 9 on the tie
    if (budget == 8) want = {0, 1, 3, 5, 9, 17, 18, 19};
    if (budget == 10) want = {0, 1, 2, 3, 5, 9, 11, 17, 18, 19};  // then 2: lowest of the -1/2s
    EXPECT_EQ(sel.row_blocks[0], want) << budget;
    ASSERT_EQ(sel.row_scores[0].size(), 20u);
    EXPECT_NEAR(sel.row_scores[0][5], 0.0, 1e-6);
    EXPECT_NEAR(sel.row_scores[0][2], -0.5, 1e-6);
    ASSERT_TRUE(p->commit(0).code() == StatusCode::kFailedPrecondition);  // rows not observed
  }
}

TEST(PredictSelect, SmallContextsKeepEverything) {
  PredictorConfig c;  // top-k needs 32 blocks
  auto p = make("spin", c);
  Selection sel;
  ASSERT_TRUE(p->select(0, {0, 64 * 20 + 5, 1}, &sel).ok());  // 21 blocks ≤ 32
  EXPECT_EQ(sel.row_blocks[0].size(), 21u);
  EXPECT_EQ(sel.row_blocks[0].back(), 20);
  // Zero entries: nothing to select, and the protocol still runs.
  auto q = make("spin", c);
  ASSERT_TRUE(q->select(0, {0, 0, 1}, &sel).ok());
  EXPECT_TRUE(sel.blocks.empty());
  RowScores empty;
  ASSERT_TRUE(q->observe(0, 0, empty).ok());
  ASSERT_TRUE(q->commit(0).ok());
}

TEST(PredictSelect, CombineMaxAndWeighted) {
  std::vector<float> v(20, 0.0f);
  v[5] = 10;
  v[18] = 6;
  for (Combine comb : {Combine::kMax, Combine::kWeighted}) {
    PredictorConfig c = base_config();
    c.combine = comb;
    c.combine_weight = 0.25;
    c.topk_first = 0;  // p[b] itself, not raised for the last top-k's block
    auto p = make("spin", c);
    observe_all(*p, 0, block_scores(v, 4), 80);
    const BlockState& st = state_of(*p, 0);
    Selection sel;
    StepInput in{1, 84, 1};  // one more block appended: block 20 is new (never seen)
    in.want_scores = true;
    ASSERT_TRUE(p->select(0, in, &sel).ok());
    const std::vector<float>& s = sel.row_scores[0];
    ASSERT_EQ(s.size(), 21u);
    // Block 0 now sits at distance 20, which no row has observed yet: slot only.
    EXPECT_FLOAT_EQ(s[0], st.slot(0));
    EXPECT_FALSE(st.offset_known(offset_bucket(20)));
    for (int32_t b = 1; b < 20; ++b) {
      const int32_t bucket = offset_bucket(20 - b);
      ASSERT_TRUE(st.offset_known(bucket)) << b;
      const float want = comb == Combine::kMax ? std::max(st.slot(b), st.offset(bucket))
                                               : 0.25f * st.slot(b) + 0.75f * st.offset(bucket);
      EXPECT_FLOAT_EQ(s[static_cast<size_t>(b)], want) << b;
    }
    // Block 20 was never observed: its prior is the offset at distance 0 (was block 19's).
    EXPECT_FLOAT_EQ(s[20], st.offset(0));
  }
}

TEST(PredictSelect, ExplorationCount) {
  struct Case {
    double ratio;
    int32_t explored;
  };
  // budget 10, forced 5: E = round(ratio·10), at most 5.
  for (const Case k :
       {Case{0.0, 0}, Case{0.1, 1}, Case{0.2, 2}, Case{0.25, 3}, Case{0.44, 4}, Case{1.0, 5}}) {
    PredictorConfig c = base_config();
    c.explore_ratio = k.ratio;
    c.explore_churn = 0;  // the fixed share (explore_churn explores nothing before it measures)
    auto p = make("spin", c);
    Selection sel;
    ASSERT_TRUE(p->select(0, {0, 80, 1}, &sel).ok());
    EXPECT_EQ(sel.row_explored[0], k.explored) << k.ratio;
    EXPECT_EQ(sel.row_blocks[0].size(), 10u);
    // Only spin explores.
    auto q = make("ema-slot", c);
    ASSERT_TRUE(q->select(0, {0, 80, 1}, &sel).ok());
    EXPECT_EQ(sel.row_explored[0], 0);
  }
}

// topk_first: a block that held the last step's top-k ranks above a block whose EMA is higher.
TEST(PredictSelect, TopkFirstRanksTheLastTopkBlocks) {
  std::vector<float> v0(20, 0.0f), v1(20, 0.0f);
  v0[5] = 10;   // step 0: block 5 holds the top-k (x 0), every other block x -1/2
  v1[7] = 10;   // step 1: block 7 does; block 5 just misses it (x ≈ -0.01)
  v1[5] = 9.9f;
  for (int32_t first : {0, 1}) {
    PredictorConfig c = base_config();
    c.explore_ratio = 0;
    c.combine_weight = 1.0;  // p = slot: 5's EMA ≈ -0.005 beats 7's -0.25
    c.explicit_budget_blocks = 6;  // the 5 forced blocks and one ranked
    c.topk_first = first;
    for (const char* name : {"spin", "spin-ic2"}) {
      auto p = make(name, c);
      observe_all(*p, 0, block_scores(v0, 4), 80);
      observe_all(*p, 1, block_scores(v1, 4), 80);
      Selection sel;
      ASSERT_TRUE(p->select(0, {2, 80, 1}, &sel).ok());
      EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 1, first ? 7 : 5, 17, 18, 19})) << name << first;
    }
  }
  // The paper's ablations keep their own ranking.
  PredictorConfig c = base_config();
  c.explicit_budget_blocks = 6;
  auto q = make("ema-slot", c);
  observe_all(*q, 0, block_scores(v0, 4), 80);
  observe_all(*q, 1, block_scores(v1, 4), 80);
  Selection sel;
  ASSERT_TRUE(q->select(0, {2, 80, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 1, 5, 17, 18, 19}));
}

// topk_first orders blocks of equal hits by their own rank (in eighths, hit_tie_level), where
// step-reuse keeps the lower index.
TEST(PredictSelect, TopkFirstBreaksHitTiesByHistory) {
  std::vector<float> v(80, 0.0f);
  v[20] = v[21] = 5;   // block 5: two of the top-k (4), at the k-th score: x 0
  v[36] = v[37] = 10;  // block 9: the other two, at the row's max: x 1
  PredictorConfig c = base_config();
  c.explore_ratio = 0;
  c.recent_blocks = 0;
  c.explicit_budget_blocks = 6;  // the 5 forced blocks and one ranked
  for (const char* name : {"spin", "step-reuse"}) {
    auto p = make(name, c);
    observe_all(*p, 0, v, 80);
    Selection sel;
    ASSERT_TRUE(p->select(0, {1, 80, 1}, &sel).ok());
    const int32_t ranked = std::string(name) == "spin" ? 9 : 5;
    EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 1, ranked, 17, 18, 19})) << name;
  }
}

TEST(PredictSelect, HitTieLevelsAreQuartersOfTheRank) {
  EXPECT_EQ(PredictorBase::hit_tie_level(-5.0f), 0.0f);  // unknown blocks' defaults and below
  EXPECT_EQ(PredictorBase::hit_tie_level(-1.0f), 0.0f);
  EXPECT_EQ(PredictorBase::hit_tie_level(-0.75f), 0.125f);
  EXPECT_EQ(PredictorBase::hit_tie_level(-0.01f), 0.375f);
  EXPECT_EQ(PredictorBase::hit_tie_level(0.0f), 0.5f);
  EXPECT_EQ(PredictorBase::hit_tie_level(0.99f), 0.875f);
  EXPECT_EQ(PredictorBase::hit_tie_level(524288.0f), 0.875f);  // a raised newest block: the top level
  EXPECT_EQ(PredictorBase::hit_tie_level(std::numeric_limits<float>::quiet_NaN()), 0.0f);
  // Exact above 2^20: the largest hit count (capped at 2^20 - 1) and the top level stay apart.
  EXPECT_EQ(1048576.0f + 1048575.0f + PredictorBase::hit_tie_level(0.99f), 2097151.875f);
  EXPECT_NE(1048576.0f + 1048575.0f + PredictorBase::hit_tie_level(0.74f), 2097151.875f);
}

// recent_blocks: the newest blocks rank after the last top-k's blocks, newest first, above a block
// whose EMA is higher; 0 leaves the EMA's order.
TEST(PredictSelect, RecentBlocksRankAfterTheLastTopk) {
  std::vector<float> v(20, 0.0f);
  v[5] = 10;  // the top-k (one block)
  v[2] = 9;   // the best EMA after it
  for (int32_t recent : {0, 5}) {
    PredictorConfig c = base_config();
    c.explore_ratio = 0;
    c.explicit_budget_blocks = 7;  // the 5 forced blocks (0, 1, 17, 18, 19) and two ranked
    c.recent_blocks = recent;      // 5: blocks 15..19, of which 15 and 16 are not forced
    auto p = make("spin", c);
    observe_all(*p, 0, block_scores(v, 4), 80);
    Selection sel;
    ASSERT_TRUE(p->select(0, {1, 80, 1}, &sel).ok());
    const std::vector<int32_t> want = recent ? std::vector<int32_t>{0, 1, 5, 16, 17, 18, 19}
                                             : std::vector<int32_t>{0, 1, 2, 5, 17, 18, 19};
    EXPECT_EQ(sel.row_blocks[0], want) << recent;
  }
  // The paper's ablations keep their own ranking.
  PredictorConfig c = base_config();
  c.explicit_budget_blocks = 7;
  c.recent_blocks = 5;
  auto q = make("ema-slot", c);
  observe_all(*q, 0, block_scores(v, 4), 80);
  Selection sel;
  ASSERT_TRUE(q->select(0, {1, 80, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 1, 2, 5, 17, 18, 19}));
}

// pool_depth: spin's family observes a block by its m-th best entry, m = ⌈pool_depth · topk /
// budget⌉ (here 8 / 2 = 4, every entry of the block); the other predictors by its best.
TEST(PredictSelect, SpinPoolsABlockByItsMthBestEntry) {
  std::vector<float> v(80, 0.0f);
  v[12] = 10;                                  // block 3: one strong entry
  for (int32_t i = 28; i < 32; ++i) v[i] = 6;  // block 7: four fairly strong ones
  PredictorConfig c = testing::small_blocks_config(0, 0);
  c.topk = 8;
  c.explicit_budget_blocks = 2;
  c.pool_depth = 1.0;
  for (const char* name : {"spin", "prev-iter"}) {
    auto p = make(name, c);
    observe_all(*p, 0, v, 80);
    const BlockState& st = state_of(*p, 0);
    if (std::string(name) == "spin") {
      EXPECT_LT(st.slot(3), st.slot(7)) << "block 3's 4th best is 0, block 7's is 6";
    } else {
      EXPECT_GT(st.slot(3), st.slot(7)) << "block 3's best is 10, block 7's is 6";
    }
  }
}

// explore_churn: no exploration until the layer has measured its top-k churn, then explore_ratio ·
// min(1, churn EMA / explore_churn), the churn counted in entries; explore_churn 0: always
// explore_ratio (the paper's).
TEST(PredictSelect, ExplorationFollowsTheTopkChurn) {
  std::vector<float> at5(80, 0.0f), mostly5(80, 0.0f);
  for (int32_t i = 20; i < 24; ++i) at5[i] = 10;  // the top-k (4) is block 5
  for (int32_t i = 20; i < 23; ++i) mostly5[i] = 10;
  mostly5[36] = 10;  // three of its entries stay in block 5, one moves to block 9
  for (double churn_scale : {0.0, 0.1}) {
    PredictorConfig c = base_config();
    c.explore_ratio = 0.2;  // budget 10: E = 2 at the full share
    c.explore_churn = churn_scale;
    c.adapt = 0;  // (adapt moves the share by its own yield instead)
    auto p = make("spin", c);
    std::vector<int32_t> explored;
    for (int64_t step = 0; step < 4; ++step) {
      Selection sel;
      ASSERT_TRUE(p->select(0, {step, 80, 1}, &sel).ok());
      explored.push_back(sel.row_explored[0]);
      Selection everything;
      for (int32_t b = 0; b < 20; ++b) everything.blocks.push_back(b);
      ASSERT_TRUE(observe_union(*p, 0, everything, {step < 2 ? at5 : mostly5}, 80, 1).ok());
      ASSERT_TRUE(p->commit(0).ok());
    }
    if (churn_scale == 0) {
      EXPECT_EQ(explored, (std::vector<int32_t>{2, 2, 2, 2}));
    } else {
      // Unmeasured twice (step 0 had no top-k before it), churn 0, then step 2's churn: 1 of 4
      // entries left the old blocks (in blocks it would be 1 of 2), EMA 0.8·0 + 0.2·0.25 = 0.05,
      // share 0.2 · 0.05 / 0.1 = 0.1 of budget 10 → 1 (the block churn would give 2).
      EXPECT_EQ(explored, (std::vector<int32_t>{0, 0, 0, 1}));
    }
  }
}

TEST(PredictSelect, StalestPicksTheOldest) {
  PredictorConfig c = base_config();
  c.explore_policy = ExplorePolicy::kStalest;
  c.explore_ratio = 0.2;  // E = 2 of budget 10
  c.explore_churn = 0;    // every step (the top-k here never moves: churn 0 would stop it)
  std::vector<float> v(20, 0.0f);
  v[5] = 10;
  v[4] = -50;  // 4 and 7 look useless, so prediction alone would never pick them
  v[7] = -50;
  auto p = make("spin", c);
  observe_all(*p, 0, block_scores(v, 4), 80);
  // Step 1 scores every block but 4 and 7: they stay at last_seen 0, the rest move to 1.
  Selection sel;
  ASSERT_TRUE(p->select(0, {1, 80, 1}, &sel).ok());
  Selection most;
  for (int32_t b = 0; b < 20; ++b)
    if (b != 4 && b != 7) most.blocks.push_back(b);
  ASSERT_TRUE(observe_union(*p, 0, most, {block_scores(v, 4)}, 80, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  EXPECT_EQ(state_of(*p, 0).last_seen(4), 0);
  EXPECT_EQ(state_of(*p, 0).last_seen(6), 1);
  ASSERT_TRUE(p->select(0, {2, 80, 1}, &sel).ok());
  EXPECT_EQ(sel.row_explored[0], 2);
  EXPECT_TRUE(contains(sel.row_blocks[0], 4));
  EXPECT_TRUE(contains(sel.row_blocks[0], 7));
  ASSERT_TRUE(observe_union(*p, 0, sel, {block_scores(v, 4)}, 80, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  // The context grows to 24 blocks: 20 is new and not forced (21..23 are), so never-seen 20 is
  // the stalest; the second pick is the oldest seen block, lowest index on ties.
  std::vector<float> w = v;
  w.resize(24, 0.0f);
  ASSERT_TRUE(p->select(0, {3, 96, 1}, &sel).ok());
  EXPECT_TRUE(contains(sel.row_blocks[0], 20));
  int32_t oldest = -1;
  for (int32_t b = 2; b < 20 && oldest < 0; ++b)
    if (state_of(*p, 0).last_seen(b) == 1) oldest = b;  // the oldest after steps 0..2
  ASSERT_GE(oldest, 0);
  EXPECT_TRUE(contains(sel.row_blocks[0], oldest)) << oldest;
}

TEST(PredictSelect, UniformExplorationIsKeyedAndDeterministic) {
  PredictorConfig c = base_config();
  c.explore_ratio = 0.5;  // 100 blocks, budget 50: E = 25
  c.explore_churn = 0;    // from the first step
  Selection a, b;
  auto p = make("spin", c, 2, 7);
  auto q = make("spin", c, 2, 7);
  ASSERT_TRUE(p->select(1, {3, 400, 1}, &a).ok());
  ASSERT_TRUE(q->select(1, {3, 400, 1}, &b).ok());
  EXPECT_EQ(a.blocks, b.blocks);
  EXPECT_EQ(a.row_explored[0], 25);
  // Another seed, request, layer or step draws another subset.
  int differ = 0;
  for (int variant = 0; variant < 4; ++variant) {
    PredictorConfig d = c;
    int64_t request = 7, step = 3;
    int32_t layer = 1;
    if (variant == 0) d.seed = 1;
    if (variant == 1) request = 8;
    if (variant == 2) layer = 0;
    if (variant == 3) step = 4;
    auto r = make("spin", d, 2, request);
    ASSERT_TRUE(r->select(layer, {step, 400, 1}, &b).ok());
    differ += a.blocks != b.blocks;
  }
  EXPECT_EQ(differ, 4);
}

TEST(PredictSelect, RandomAndAllKeep) {
  PredictorConfig c = base_config();
  auto r = make("random", c);
  Selection sel;
  ASSERT_TRUE(r->select(0, {0, 400, 1}, &sel).ok());  // 100 blocks, budget 50
  ASSERT_EQ(sel.row_blocks[0].size(), 50u);
  for (int32_t b : {0, 1, 97, 98, 99}) EXPECT_TRUE(contains(sel.row_blocks[0], b));
  // Not simply the newest blocks.
  EXPECT_LT(sel.row_blocks[0][2], 40);
  auto k = make("all-keep", c);
  ASSERT_TRUE(k->select(0, {0, 401, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0].size(), 101u);
}

// select_smallest against a full sort, on random, sorted, reversed, organ-pipe and few-valued
// (distinct after packing the index) inputs, for every k.
TEST(PredictSelect, SelectSmallestMatchesSort) {
  CounterRng rng(stream_key(77));
  for (int iter = 0; iter < 300; ++iter) {
    const int64_t n = 1 + static_cast<int64_t>(rng.below(iter < 100 ? 40 : 3000));
    std::vector<uint64_t> keys(static_cast<size_t>(n));
    const int shape = iter % 5;
    for (int64_t i = 0; i < n; ++i) {
      uint64_t v = rng.next_u64() >> 32;
      if (shape == 1) v = static_cast<uint64_t>(i);
      if (shape == 2) v = static_cast<uint64_t>(n - i);
      if (shape == 3) v = static_cast<uint64_t>(std::min(i, n - i));
      if (shape == 4) v = rng.below(3);
      keys[static_cast<size_t>(i)] = v << 32 | static_cast<uint64_t>(i);
    }
    std::vector<uint64_t> sorted = keys;
    std::sort(sorted.begin(), sorted.end());
    for (int64_t k : {int64_t{0}, int64_t{1}, n / 3, n / 2, n - 1, n,
                      static_cast<int64_t>(rng.below(static_cast<uint64_t>(n)))}) {
      std::vector<uint64_t> a = keys;
      select_smallest(a.data(), n, k);
      std::sort(a.begin(), a.begin() + k);
      ASSERT_TRUE(std::equal(a.begin(), a.begin() + k, sorted.begin())) << n << " " << k;
      std::sort(a.begin(), a.end());
      ASSERT_EQ(a, sorted);  // a permutation
    }
  }
}

}  // namespace
}  // namespace spin
