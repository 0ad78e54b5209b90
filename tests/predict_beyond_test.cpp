// Beyond the paper: spin-hybrid (history + the pooled-key probe), spin stacked on
// IndexCache's layer sharing, and budgets that move between layers and steps at the same mean.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "predict/hisa.h"
#include "predict/probe_share.h"
#include "predict_testing.h"
#include "spin/predict.h"
#include "spin/predictor_inputs.h"
#include "spin/rng.h"

namespace spin {
namespace {

using testing::Cache;
using testing::make_checked;
using testing::observe_union;

constexpr int32_t kHeads = 3;

// Blocks of 8 entries over pages of 4, top-k 8, one sink and two local blocks, 50 %.
PredictorConfig hybrid_config() {
  PredictorConfig c;
  c.page_size = 4;
  c.block_pages = 2;
  c.topk = 8;
  c.target_sparsity = 0.5;
  c.probe_share = 0.3;
  c.explore_churn = 0;  // the fixed exploration share between probe steps, from the first step
  return c;
}

struct Keys {
  Cache cache;
  std::vector<uint8_t> q;
  std::vector<float> w;
};

Keys make_keys(int64_t entries, uint64_t seed) {
  CounterRng rng(stream_key(seed));
  std::vector<std::vector<float>> raw(static_cast<size_t>(entries), std::vector<float>(128));
  for (auto& k : raw)
    for (float& x : k) x = static_cast<float>(rng.normal());
  Keys k{Cache(4, raw, seed + 1), std::vector<uint8_t>(kMaxNextN * kHeads * 128), {}};
  for (uint8_t& x : k.q) x = e4m3_from_float(static_cast<float>(rng.normal()));
  for (int i = 0; i < kMaxNextN * kHeads; ++i) k.w.push_back(static_cast<float>(0.5 + rng.uniform()));
  return k;
}

// Scores where a focus region of blocks (moving every `period` steps) dominates, plus noise.
std::vector<float> focus_scores(int64_t entries, int64_t step, int32_t layer, int32_t block_entries,
                                int64_t period, double noise) {
  CounterRng rng(stream_key(7, static_cast<uint64_t>(layer), static_cast<uint64_t>(step)));
  const int64_t blocks = (entries + block_entries - 1) / block_entries;
  const int64_t focus = (step / period * 7 + layer * 3) % blocks;
  std::vector<float> s(static_cast<size_t>(entries));
  for (int64_t e = 0; e < entries; ++e) {
    const int64_t b = e / block_entries;
    const double near = std::abs(b - focus) <= 1 ? 3.0 : 0.0;
    s[static_cast<size_t>(e)] = static_cast<float>(near + noise * rng.normal());
  }
  return s;
}

TEST(PredictHybrid, DeterministicInsideTheBudgetWithTheForcedBlocksAndItsProbeCharged) {
  const Keys k = make_keys(120, 3);
  for (const int32_t pool : {0, 4}) {
    PredictorConfig c = hybrid_config();
    c.probe_entries = pool;
    c.probe_interval = 2;
    auto a = make_checked("spin-hybrid", c, 1, 5);
    auto b = make_checked("spin-hybrid", c, 1, 5);
    Selection sa, sb;
    int64_t step = 0;
    for (const auto& [entries, next_n] : std::vector<std::pair<int64_t, int32_t>>{
             {60, 1}, {70, 1}, {71, 1}, {81, 2}, {90, 2}, {100, 1}, {101, 3}, {120, 1}}) {
      HisaView view{k.cache.bytes.data(), 4, k.cache.table.data(), entries, k.q.data(), k.w.data(),
                    kHeads, static_cast<int64_t>(k.cache.table.size())};
      PredictorInputs inputs;
      StepInput in{step, entries, next_n};
      in.inputs = &inputs;
      inputs.hisa = &view;
      ASSERT_TRUE(a->select(0, in, &sa).ok());
      ASSERT_TRUE(b->select(0, in, &sb).ok());
      EXPECT_EQ(sa.blocks, sb.blocks) << "step " << step;
      EXPECT_EQ(sa.row_blocks, sb.row_blocks);
      const int64_t committed = visible_entries(entries, next_n, 0);
      for (int32_t j = 0; j < next_n; ++j) {
        const auto& rb = sa.row_blocks[static_cast<size_t>(j)];
        const int64_t n = blocks_for_entries(c, visible_entries(entries, next_n, j));
        EXPECT_EQ(static_cast<int64_t>(rb.size()), budget_blocks(c, n));
        EXPECT_TRUE(std::is_sorted(rb.begin(), rb.end()));
        EXPECT_EQ(std::adjacent_find(rb.begin(), rb.end()), rb.end());
        for (const int64_t forced : {int64_t{0}, n - 2, n - 1})
          EXPECT_TRUE(std::binary_search(rb.begin(), rb.end(), static_cast<int32_t>(forced)))
              << "step " << step << " row " << j << " lacks forced block " << forced;
        // Probe steps (even) charge one entry-equivalent per pooled key of a visible block; in
        // between it explores uniformly and probes nothing.
        const int64_t per_block = pool == 0 ? 1 : 8 / pool;
        const int64_t pools = pool == 0 ? blocks_for_entries(c, committed) : (committed + pool - 1) / pool;
        const int64_t want = step % 2 == 0 ? std::min(pools, n * per_block) : 0;
        EXPECT_EQ(sa.row_probed[static_cast<size_t>(j)], want) << "step " << step << " pool " << pool;
        // Exploration's share: uniform draws in between, the probe's picks on probe steps.
        const int64_t share = std::llround((step % 2 == 0 ? c.probe_share : c.explore_ratio) *
                                           static_cast<double>(budget_blocks(c, n)));
        EXPECT_EQ(sa.row_explored[static_cast<size_t>(j)], share) << "step " << step;
      }
      std::vector<std::vector<float>> full;
      for (int32_t j = 0; j < next_n; ++j) full.push_back(focus_scores(entries, step, 0, 8, 3, 0.5));
      ASSERT_TRUE(observe_union(*a, 0, sa, full, entries, next_n).ok());
      ASSERT_TRUE(observe_union(*b, 0, sb, full, entries, next_n).ok());
      ASSERT_TRUE(a->commit(next_n - 1).ok());
      ASSERT_TRUE(b->commit(next_n - 1).ok());
      ++step;
    }
  }
}

TEST(PredictHybrid, TheProbeFindsABlockHistoryHasNeverSeen) {
  // History is told block 3 matters; the query points at block 9's keys alone. With the probe's
  // share the hybrid keeps both; spin (no probe) can only find block 9 by exploration's luck.
  PredictorConfig c = hybrid_config();
  c.explore_ratio = 0;
  c.target_sparsity = 0.6;
  CounterRng rng(stream_key(11));
  std::vector<float> dir(128);
  for (float& d : dir) d = static_cast<float>(rng.normal());
  std::vector<std::vector<float>> raw(128, std::vector<float>(128));
  for (size_t pos = 0; pos < raw.size(); ++pos)
    for (size_t d = 0; d < 128; ++d)
      raw[pos][d] = static_cast<float>(rng.normal()) * 0.2f + (pos / 8 == 9 ? 2.0f * dir[d] : 0.0f);
  const Cache cache(4, raw, 12);
  std::vector<uint8_t> q(kHeads * 128);
  for (int h = 0; h < kHeads; ++h)
    for (int d = 0; d < 128; ++d) q[static_cast<size_t>(h * 128 + d)] = e4m3_from_float(dir[static_cast<size_t>(d)]);
  const std::vector<float> w(kHeads, 1.0f);
  auto hybrid = make_checked("spin-hybrid", c, 1, 0);
  auto spin = make_checked("spin", c, 1, 0);
  std::vector<float> prefill(128, 0.0f);
  for (int e = 24; e < 32; ++e) prefill[static_cast<size_t>(e)] = 5.0f;  // block 3
  std::vector<int32_t> all(16);
  for (int32_t b = 0; b < 16; ++b) all[static_cast<size_t>(b)] = b;
  RowScores r{prefill.data(), 128, 128, all.data(), 16};
  ASSERT_TRUE(hybrid->observe_prefill(0, 0, r).ok());
  ASSERT_TRUE(spin->observe_prefill(0, 0, r).ok());
  HisaView view{cache.bytes.data(), 4, cache.table.data(), 128, q.data(), w.data(), kHeads,
                static_cast<int64_t>(cache.table.size())};
  PredictorInputs inputs;
  StepInput in{1, 128, 1};
  in.inputs = &inputs;
  inputs.hisa = &view;
  Selection sh, ss;
  ASSERT_TRUE(hybrid->select(0, in, &sh).ok());
  ASSERT_TRUE(spin->select(0, in, &ss).ok());
  EXPECT_TRUE(std::binary_search(sh.blocks.begin(), sh.blocks.end(), 3));
  EXPECT_TRUE(std::binary_search(sh.blocks.begin(), sh.blocks.end(), 9));
  EXPECT_TRUE(std::binary_search(ss.blocks.begin(), ss.blocks.end(), 3));
  EXPECT_FALSE(std::binary_search(ss.blocks.begin(), ss.blocks.end(), 9));
  // Without the keys it says what it needs, in one line.
  StepInput bare{2, 128, 1};
  auto fresh = make_checked("spin-hybrid", c, 1, 0);
  const Status s = fresh->select(0, bare, &sh);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("pooled block keys"), std::string::npos);
}

TEST(PredictHybrid, AdaptiveShareMovesTowardTheSourceThatPays) {
  // Every step the top-k moves to a block history has never seen (block 4 + step) and the query
  // points at that block's keys: the probe's picks pay, history's marginal picks do not, so the
  // probe's share — the exploration count — grows.
  PredictorConfig c = hybrid_config();
  c.probe_adapt = 1;
  c.probe_share = 0.2;
  CounterRng rng(stream_key(13));
  constexpr int64_t kEntries = 200;  // 25 blocks of 8
  std::vector<std::vector<float>> dir(25, std::vector<float>(128));
  for (auto& d : dir)
    for (float& x : d) x = static_cast<float>(rng.normal());
  std::vector<std::vector<float>> raw(kEntries, std::vector<float>(128));
  for (size_t pos = 0; pos < raw.size(); ++pos)
    for (size_t d = 0; d < 128; ++d)
      raw[pos][d] = static_cast<float>(rng.normal()) * 0.2f + 2.0f * dir[pos / 8][d];
  const Cache cache(4, raw, 14);
  const std::vector<float> w(kHeads, 1.0f);
  auto p = make_checked("spin-hybrid", c, 1, 0);
  std::vector<int32_t> explored;
  for (int64_t step = 0; step < 8; ++step) {
    const int64_t target = 4 + step;
    std::vector<uint8_t> q(kHeads * 128);
    for (int h = 0; h < kHeads; ++h)
      for (int d = 0; d < 128; ++d)
        q[static_cast<size_t>(h * 128 + d)] = e4m3_from_float(dir[static_cast<size_t>(target)][static_cast<size_t>(d)]);
    HisaView view{cache.bytes.data(), 4, cache.table.data(), kEntries, q.data(), w.data(), kHeads,
                  static_cast<int64_t>(cache.table.size())};
    PredictorInputs inputs;
    StepInput in{step, kEntries, 1};
    in.inputs = &inputs;
    inputs.hisa = &view;
    Selection sel;
    ASSERT_TRUE(p->select(0, in, &sel).ok());
    explored.push_back(sel.row_explored[0]);
    std::vector<float> scores(static_cast<size_t>(kEntries), 0.0f);
    for (int64_t e = target * 8; e < target * 8 + 8; ++e) scores[static_cast<size_t>(e)] = 5.0f;
    ASSERT_TRUE(observe_union(*p, 0, sel, {scores}, kEntries, 1).ok());
    ASSERT_TRUE(p->commit(0).ok());
  }
  EXPECT_GT(explored.back(), explored.front());
  // Without adaptation the share stays where the config put it.
  c.probe_adapt = 0;
  auto fixed = make_checked("spin-hybrid", c, 1, 0);
  Selection sel;
  const std::vector<uint8_t> q(kHeads * 128, 0x30);
  HisaView view{cache.bytes.data(), 4, cache.table.data(), kEntries, q.data(), w.data(), kHeads,
                static_cast<int64_t>(cache.table.size())};
  PredictorInputs inputs;
  StepInput in{0, kEntries, 1};
  in.inputs = &inputs;
  inputs.hisa = &view;
  ASSERT_TRUE(fixed->select(0, in, &sel).ok());
  EXPECT_EQ(sel.row_explored[0], explored.front());
}

// Slot 0's prefill over all 40 blocks (of 4 entries) of `entries`: `scores` per entry.
void observe_full_prefill(BlockPredictor& p, const std::vector<float>& scores, int64_t entries) {
  std::vector<int32_t> all(40);
  for (int32_t b = 0; b < 40; ++b) all[static_cast<size_t>(b)] = b;
  RowScores r;
  r.scores = scores.data();
  r.num_cols = r.visible_entries = entries;
  r.scored_blocks = all.data();
  r.num_scored_blocks = 40;
  EXPECT_TRUE(p.observe_prefill(0, 0, r).ok());
}

// adapt: each layer's exploration share follows what exploration finds against history's
// lowest-ranked picks. 40 blocks of 4, budget 20 (one sink, one local, 4 explored at the start:
// explore_ratio 0.2); the prefill shows block b at 100 - b, so history believes blocks 1–16.
// `moved` true: from then on the top-k (8 entries, 2 blocks) sits in blocks 20–38 alone, which
// only exploration reaches at first — the share grows; false: the truth stays and the top-k (56
// entries, 14 blocks) is history's picks, explored blocks below them find nothing while its
// lowest picks hold the top-k — the share shrinks, slowly (a quarter of each move), to its floor
// (half the ratio: 0.1 · 20 = 2 blocks). `steps` decode steps.
std::vector<int32_t> explored_per_step(bool moved, int32_t adapt, int64_t steps = 6) {
  PredictorConfig c;
  c.page_size = 4;
  c.topk = moved ? 8 : 56;
  c.target_sparsity = 0.5;
  c.recent_blocks = 0;
  c.explore_ratio = 0.2;
  c.explore_churn = 0;  // without adapt: always round(0.2 · 20) = 4
  c.adapt = adapt;
  auto p = make_checked("spin", c, 1, 7);
  const int64_t entries = 40 * 4;
  std::vector<float> before(40), after(40);
  for (int32_t b = 0; b < 40; ++b) {
    const auto fb = static_cast<float>(b);
    before[static_cast<size_t>(b)] = b == 0 || b == 39 ? 0.0f : 100.0f - fb;
    after[static_cast<size_t>(b)] = !moved ? before[static_cast<size_t>(b)] : b >= 20 && b < 39 ? 200.0f - fb : 0.0f;
  }
  const std::vector<float> prefill = testing::block_scores(before, 4), truth = testing::block_scores(after, 4);
  observe_full_prefill(*p, prefill, entries);
  std::vector<int32_t> explored;
  Selection sel;
  for (int64_t step = 1; step <= steps; ++step) {
    EXPECT_TRUE(p->select(0, {step, entries, 1}, &sel).ok());
    explored.push_back(sel.row_explored[0]);
    EXPECT_EQ(sel.row_budget[0], 20);
    EXPECT_TRUE(observe_union(*p, 0, sel, {truth}, entries, 1).ok());
    EXPECT_TRUE(p->commit(0).ok());
  }
  return explored;
}

TEST(PredictAdapt, ExplorationFollowsWhatItFinds) {
  const std::vector<int32_t> fixed = {4, 4, 4, 4, 4, 4};
  EXPECT_EQ(explored_per_step(true, 0), fixed);
  EXPECT_EQ(explored_per_step(false, 0), fixed);
  const std::vector<int32_t> grew = explored_per_step(true, 1);
  EXPECT_EQ(grew[0], 4);
  EXPECT_GT(*std::max_element(grew.begin(), grew.end()), 4) << ::testing::PrintToString(grew);
  const std::vector<int32_t> shrank = explored_per_step(false, 1, 24);
  EXPECT_EQ(shrank[0], 4);
  EXPECT_TRUE(std::is_sorted(shrank.rbegin(), shrank.rend())) << ::testing::PrintToString(shrank);
  // Slowly: a symmetric rule would reach the floor after one step (0.2 - 0.5 · 0.2 = 0.1); this
  // one takes a quarter of that move per step, so the second step still explores 4 blocks.
  EXPECT_EQ(shrank[1], 4) << ::testing::PrintToString(shrank);
  EXPECT_GT(shrank[3], 2) << ::testing::PrintToString(shrank);
  // ... and never below the floor, half the ratio: llround(0.1 · 20) = 2 (a quarter used to be 1).
  EXPECT_EQ(shrank.back(), 2) << ::testing::PrintToString(shrank);
  // Deterministic: the same inputs and seed give the same shares, step by step.
  EXPECT_EQ(explored_per_step(false, 1, 24), shrank);
  EXPECT_EQ(explored_per_step(true, 1), grew);
}

// The share's update rule itself (probe_share.h): history's lowest-ranked pick (block 5) holds
// `history_hits` top-k entries, exploration's pick (block 9) `explore_hits`, one block each.
double share_after(int64_t explore_hits, int64_t history_hits, double share, double fall) {
  ProbeShareState st;
  st.share = share;
  const uint64_t picked[] = {9};
  const uint64_t history[] = {uint64_t{7} << 32 | 3, uint64_t{8} << 32 | 5};  // block 5 ranks lowest
  std::vector<uint64_t> scratch;
  st.record(picked, 1, 1, history, 2, &scratch);
  PooledRow row;
  row.blocks = {3, 5, 9};
  row.x = {1, 1, 1};
  row.topk_hits = {1, static_cast<int32_t>(history_hits), static_cast<int32_t>(explore_hits)};
  st.update(row, 0.1, kExploreShareStep * 0.1, kExploreShareFloor * 0.1, kExploreShareCeiling * 0.1, fall);
  return st.current(0.1);
}

TEST(PredictAdapt, ExplorationShareRisesAtOnceFallsSlowlyAndKeepsItsFloor) {
  constexpr double kStep = kExploreShareStep * 0.1;  // 0.05
  // Exploration paid (3 hits against 1): d = 0.5, the whole move up.
  EXPECT_DOUBLE_EQ(share_after(3, 1, 0.1, kExploreShareFall), 0.1 + kStep * 0.5);
  // History paid (1 against 3): d = -0.5; of the move to the target 0.075 a quarter is taken.
  EXPECT_DOUBLE_EQ(share_after(1, 3, 0.1, kExploreShareFall), 0.1 + kExploreShareFall * (kStep * -0.5));
  EXPECT_GT(share_after(1, 3, 0.1, kExploreShareFall), share_after(1, 3, 0.1, 1.0));  // stays higher
  // From the floor's neighbourhood a fall stops at the floor, half the ratio (0.05), not below.
  EXPECT_DOUBLE_EQ(share_after(0, 4, kExploreShareFloor * 0.1, kExploreShareFall), 0.05);
  EXPECT_EQ(kExploreShareFloor, 0.5);
  // Ceiling: four times the ratio.
  EXPECT_DOUBLE_EQ(share_after(4, 0, 0.39, kExploreShareFall), 0.4);
  // fall 1 (probe_adapt's call) is the symmetric rule, to the bit.
  EXPECT_EQ(share_after(1, 3, 0.1, 1.0), std::clamp(0.1 + kStep * -0.5, 0.05, 0.4));
}

// adapt: a layer keeps spin's additions while they rank its top-k better than the EMA alone. 40
// blocks of 4, top-k 8, budget 20, no exploration; the only addition on is the recency window (16
// blocks). `old` true: the top-k sits in blocks 5 and 6 at every step — the window ranks them
// below 16 newer blocks, so the layer drops it and ranks by the EMA; false: the top-k sits in the
// window's first blocks (36, 37) and the prefill pointed at 5 and 6 — the window ranks as well or
// better, kept.
// Returns block 30's rank key at the last step: 2^19 - 9 when the window is on, an EMA value off.
float window_rank_after(bool old, int32_t adapt, int64_t steps = 12) {
  PredictorConfig c;
  c.page_size = 4;
  c.topk = 8;
  c.target_sparsity = 0.5;
  c.topk_first = 0;
  c.recent_blocks = 16;
  c.explore_ratio = 0;
  c.adapt = adapt;
  auto p = make_checked("spin", c, 1, 3);
  const int64_t entries = 40 * 4;
  std::vector<float> before(40, 0.0f), after(40, 0.0f);
  before[5] = before[6] = 100.0f;
  (old ? after[5] : after[37]) = 100.0f;
  (old ? after[6] : after[36]) = 99.0f;
  const std::vector<float> prefill = testing::block_scores(before, 4), truth = testing::block_scores(after, 4);
  observe_full_prefill(*p, prefill, entries);
  Selection sel;
  for (int64_t step = 1; step <= steps; ++step) {
    StepInput in{step, entries, 1};
    in.want_scores = true;
    EXPECT_TRUE(p->select(0, in, &sel).ok());
    EXPECT_TRUE(observe_union(*p, 0, sel, {truth}, entries, 1).ok());
    EXPECT_TRUE(p->commit(0).ok());
  }
  return sel.row_scores[0][30];
}

TEST(PredictAdapt, AdditionsStayWhileTheyRankBetter) {
  static_assert(kAdditionsGainWarmup < 12, "window_rank_after's steps must outlast the warm-up");
  constexpr float kWindowed = 524288.0f - 9.0f;  // kRecentBase - distance (predictor_ema.cpp)
  EXPECT_EQ(window_rank_after(true, 0), kWindowed);
  EXPECT_EQ(window_rank_after(false, 0), kWindowed);
  EXPECT_LT(window_rank_after(true, 1), 1000.0f);  // dropped: the EMA ranks the layer
  // ... but not before the gain was measured on kAdditionsGainWarmup steps (step 8's select has
  // seven: steps 1–7 committed).
  EXPECT_EQ(window_rank_after(true, 1, kAdditionsGainWarmup), kWindowed);
  EXPECT_EQ(window_rank_after(false, 1), kWindowed);
}

TEST(PredictHybrid, ConfigRangesAreChecked) {
  PredictorConfig c = hybrid_config();
  for (const char* bad : {"probe_adapt=2", "probe_share=1.5", "probe_interval=0", "probe_entries=3", "probe_blend=-0.1",
                          "budget_move_max=1", "budget_moves=sideways"}) {
    PredictorConfig x = c;
    const Status s = x.parse(bad);
    EXPECT_FALSE(s.ok() && x.validate().ok()) << bad;
  }
  PredictorConfig x = c;
  ASSERT_TRUE(x.parse("probe_entries=4 budget_moves=both probe_blend=0.5").ok());
  PredictorConfig y;
  ASSERT_TRUE(y.parse(x.to_string()).ok());
  EXPECT_EQ(y.to_string(), x.to_string());
}

TEST(PredictStacked, SharedLayersReuseTheFullLayersTopkAndFullLayersPredict) {
  PredictorConfig c = hybrid_config();
  c.page_size = 8;
  c.block_pages = 1;
  auto p = make_checked("spin-ic2", c, 2, 0);
  auto ic = make_checked("indexcache-2", c, 2, 0);
  constexpr int64_t kEntries = 160;  // 20 blocks
  // The prompt's prefill, scored in full: the focus (blocks 8..10) is known from step 0.
  const std::vector<float> prompt = focus_scores(kEntries, 0, 3, 8, 100, 0.1);
  std::vector<int32_t> all(20);
  for (int32_t b = 0; b < 20; ++b) all[static_cast<size_t>(b)] = b;
  const RowScores r{prompt.data(), kEntries, kEntries, all.data(), 20};
  for (int32_t layer = 0; layer < 2; ++layer) {
    ASSERT_TRUE(p->observe_prefill(layer, 0, r).ok());
    ASSERT_TRUE(ic->observe_prefill(layer, 0, r).ok());
  }
  for (int64_t step = 1; step < 6; ++step) {
    for (int32_t layer = 0; layer < 2; ++layer) {
      Selection sp, si;
      const StepInput in{step, kEntries + step, 1};
      ASSERT_TRUE(p->select(layer, in, &sp).ok());
      ASSERT_TRUE(ic->select(layer, in, &si).ok());
      const int64_t n = blocks_for_entries(c, kEntries + step);
      // The full layer: all blocks for indexcache, the budget for the stack.
      if (layer == 0) {
        EXPECT_EQ(static_cast<int64_t>(si.blocks.size()), n);
      }
      EXPECT_EQ(static_cast<int64_t>(sp.blocks.size()), budget_blocks(c, n));
      // Both layers' scores put the focus on blocks 8..10 (focus_scores' layer 3 at these steps).
      const std::vector<std::vector<float>> full = {focus_scores(kEntries + step, step, 3, 8, 100, 0.1)};
      ASSERT_TRUE(observe_union(*p, layer, sp, full, kEntries + step, 1).ok());
      ASSERT_TRUE(observe_union(*ic, layer, si, full, kEntries + step, 1).ok());
      // Layer 1 reuses layer 0's top-k blocks of the same step: the focus.
      if (layer == 1) {
        for (const int32_t b : {8, 9, 10}) {
          EXPECT_TRUE(std::binary_search(sp.blocks.begin(), sp.blocks.end(), b)) << b;
        }
      }
    }
    ASSERT_TRUE(p->commit(0).ok());
    ASSERT_TRUE(ic->commit(0).ok());
  }
  // Layer 1 before layer 0 is refused, as indexcache refuses it.
  Selection s;
  EXPECT_EQ(p->select(1, {6, 166, 1}, &s).code(), StatusCode::kFailedPrecondition);
}

// Runs `steps` steps of spin over 4 layers whose focus moves at different rates and returns, per
// step, Σ over layers of (moved budget - fixed budget) in blocks.
std::vector<int64_t> budget_moves_over(BudgetMoves mode, int64_t steps) {
  PredictorConfig c = hybrid_config();
  c.page_size = 8;
  c.block_pages = 1;
  c.budget_moves = mode;
  constexpr int32_t kLayers = 4;
  auto p = make_checked("spin", c, kLayers, 0);
  std::vector<int64_t> moved;
  for (int64_t step = 0; step < steps; ++step) {
    const int64_t entries = 800 + step;
    int64_t delta = 0;
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      Selection sel;
      EXPECT_TRUE(p->select(layer, {step, entries, 1}, &sel).ok());
      delta += sel.row_budget[0] - budget_blocks(c, blocks_for_entries(c, entries));
      // Layer l's focus jumps every 2 + 5·l steps: layer 0 churns most, layer 3 least.
      const std::vector<std::vector<float>> full = {focus_scores(entries, step, layer, 8, 2 + 5 * layer, 1.0)};
      EXPECT_TRUE(observe_union(*p, layer, sel, full, entries, 1).ok());
    }
    EXPECT_TRUE(p->commit(0).ok());
    moved.push_back(delta);
  }
  return moved;
}

TEST(PredictBudgetMoves, KeepTheMeanBudgetWithinOneBlockPerStep) {
  constexpr int64_t kSteps = 60;
  for (const BudgetMoves mode : {BudgetMoves::kNone, BudgetMoves::kLayers, BudgetMoves::kSteps, BudgetMoves::kBoth}) {
    const std::vector<int64_t> moved = budget_moves_over(mode, kSteps);
    int64_t total = 0;
    for (const int64_t d : moved) total += d;
    // Mean over the run of the per-row difference (4 rows a step), at most one block.
    EXPECT_LE(std::abs(static_cast<double>(total)) / (4.0 * kSteps), 1.0) << budget_moves_name(mode);
    if (mode == BudgetMoves::kLayers) {
      // Layers: every step's total stays within one block per row of the fixed total (rounding).
      for (const int64_t d : moved) EXPECT_LE(std::abs(d), 4) << budget_moves_name(mode);
    }
  }
}

TEST(PredictBudgetMoves, BudgetsDoMove) {
  // A test that cannot fail proves nothing: the churning layer gets more than the calm one.
  PredictorConfig c = hybrid_config();
  c.page_size = 8;
  c.block_pages = 1;
  c.budget_moves = BudgetMoves::kLayers;
  auto p = make_checked("spin", c, 4, 0);
  std::vector<int32_t> last(4);
  for (int64_t step = 0; step < 30; ++step) {
    for (int32_t layer = 0; layer < 4; ++layer) {
      Selection sel;
      ASSERT_TRUE(p->select(layer, {step, 800 + step, 1}, &sel).ok());
      last[static_cast<size_t>(layer)] = sel.row_budget[0];
      const std::vector<std::vector<float>> full = {focus_scores(800 + step, step, layer, 8, 2 + 5 * layer, 1.0)};
      ASSERT_TRUE(observe_union(*p, layer, sel, full, 800 + step, 1).ok());
    }
    ASSERT_TRUE(p->commit(0).ok());
  }
  EXPECT_GT(last[0], last[3]);
}

}  // namespace
}  // namespace spin
