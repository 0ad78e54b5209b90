// Tests of each named predictor's own rule: the factory, prev-iter, prev-layer, oracle,
// step-reuse, indexcache-2/-4, and hisa (pooled keys checked against a from-scratch reference on a
// real paged e4m3 cache with a permuted block table, incremental over steps, drafts left out).
#include <gtest/gtest.h>

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <vector>

#include "predict/block_state.h"
#include "predict/hisa.h"
#include "predict_testing.h"
#include "spin/numerics.h"
#include "spin/predict.h"
#include "spin/predictor_inputs.h"
#include "spin/rng.h"

namespace spin {
namespace {

using testing::observe_union;
using testing::state_of;

PredictorConfig small_config() { return testing::small_blocks_config(1, 1); }

using testing::block_scores;
using testing::Cache;

std::unique_ptr<BlockPredictor> make(const std::string& name, const PredictorConfig& c, int32_t layers = 1) {
  return testing::make_checked(name, c, layers, 11);
}

Selection all_blocks(int32_t n) {
  Selection s;
  for (int32_t b = 0; b < n; ++b) s.blocks.push_back(b);
  return s;
}

TEST(PredictPredictors, FactoryNamesAndErrors) {
  const PredictorConfig c = small_config();
  EXPECT_EQ(predictor_names().size(), 15u);
  for (const std::string& n : predictor_names()) {
    auto p = make_predictor(n, c, 4, 0);
    ASSERT_TRUE(p.ok()) << n;
    EXPECT_EQ(p.value()->name(), n);
    EXPECT_EQ(p.value()->num_layers(), 4);
  }
  auto bad = make_predictor("spin2", c, 1, 0);
  EXPECT_EQ(bad.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(bad.status().message().find("indexcache-4"), std::string::npos);
  PredictorConfig wrong = c;
  wrong.alpha = 2;
  EXPECT_NE(make_predictor("spin", wrong, 1, 0).status().message().find("alpha"),
            std::string::npos);
  EXPECT_FALSE(make_predictor("spin", c, 0, 0).ok());
}

// The registry is the one list: every row makes its predictor, and what a row says it can do holds
// for the object it makes (reserve succeeds exactly where it can serve).
TEST(PredictPredictors, RegistryRowsMatchWhatTheirPredictorsDo) {
  const auto& rows = predictor_registry();
  ASSERT_EQ(rows.size(), predictor_names().size());
  PredictorConfig c;
  for (size_t i = 0; i < rows.size(); ++i) {
    const PredictorInfo& info = rows[i];
    EXPECT_EQ(info.name, predictor_names()[i]);
    EXPECT_EQ(find_predictor(info.name), &info);
    EXPECT_EQ(predictor_needs_keys(info.name), info.reads == PredictorReads::kKeys) << info.name;
    EXPECT_EQ(info.can_serve, info.reads == PredictorReads::kOwnState) << info.name;
    auto p = make_predictor(info.name, c, 2, 0);
    ASSERT_TRUE(p.ok()) << info.name;
    EXPECT_EQ(p.value()->name(), info.name);
    EXPECT_EQ(p.value()->reserve(4096, 2).ok(), info.can_serve) << info.name;
  }
  EXPECT_EQ(find_predictor("nope"), nullptr);
  EXPECT_FALSE(predictor_needs_keys("nope"));
}

// planned_bytes is what reserve() holds: the state grows to it and not past it, and the predictors
// that read keys add their pooled keys (one per block, or per probe_entries for the hybrid).
TEST(PredictPredictors, PlannedBytesCoverTheStateAndThePooledKeys) {
  PredictorConfig c = small_config();
  const int64_t entries = 4096;
  const double blocks = static_cast<double>(blocks_for_entries(c, entries));
  auto planned = [&](const char* name, const PredictorConfig& cfg) {
    return planned_bytes(*find_predictor(name), cfg, 3, entries, 2);
  };
  const double spin = planned("spin", c);
  EXPECT_GE(spin, 3 * blocks * 8);  // at least the slot state of every layer
  EXPECT_EQ(planned("prev-iter", c), spin);
  EXPECT_DOUBLE_EQ(planned("hisa", c) - spin, 3 * blocks * (128 * 4 + 4));
  PredictorConfig fine = c;
  fine.probe_entries = c.block_entries() / 2;
  EXPECT_DOUBLE_EQ(planned("spin-hybrid", fine) - planned("spin", fine), 3 * blocks * 2 * (128 * 4 + 4));
  EXPECT_GT(planned("spin", c), planned_bytes(*find_predictor("spin"), c, 3, entries / 2, 2));
  EXPECT_GT(planned("spin", c), planned_bytes(*find_predictor("spin"), c, 3, entries, 1));
  auto p = make("spin", c, 3);
  ASSERT_TRUE(p->reserve(entries, 2).ok());
  EXPECT_LE(static_cast<double>(p->memory_bytes()), spin);
}

TEST(PredictPredictors, PrevIterKeepsOnlyTheLastObservation) {
  PredictorConfig c = small_config();
  c.explicit_budget_blocks = 3;  // forced 0 and 9, plus one predicted
  auto p = make("prev-iter", c);
  Selection sel;
  std::vector<float> v(10, 0.0f);
  v[3] = 9;
  ASSERT_TRUE(p->select(0, {0, 40, 1}, &sel).ok());
  ASSERT_TRUE(observe_union(*p, 0, all_blocks(10), {block_scores(v, 4)}, 40, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  ASSERT_TRUE(p->select(0, {1, 40, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 3, 9}));
  v[3] = 0;
  v[6] = 9;
  ASSERT_TRUE(observe_union(*p, 0, all_blocks(10), {block_scores(v, 4)}, 40, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  ASSERT_TRUE(p->select(0, {2, 40, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 6, 9}));  // alpha = 1: 3 is forgotten
}

TEST(PredictPredictors, PrevLayerReadsThisStepOfTheLayerBelow) {
  PredictorConfig c = small_config();
  c.explicit_budget_blocks = 3;
  auto p = make("prev-layer", c, 3);
  Selection sel;
  // Layer 1 before layer 0 was observed at this step: refused.
  EXPECT_EQ(p->select(1, {0, 40, 1}, &sel).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p->select(0, {0, 40, 1}, &sel).ok());
  std::vector<float> v(10, 0.0f);
  v[4] = 9;
  ASSERT_TRUE(observe_union(*p, 0, all_blocks(10), {block_scores(v, 4)}, 40, 1).ok());
  ASSERT_TRUE(p->select(1, {0, 40, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 4, 9}));
  v[4] = 0;
  v[7] = 9;
  ASSERT_TRUE(observe_union(*p, 1, all_blocks(10), {block_scores(v, 4)}, 40, 1).ok());
  ASSERT_TRUE(p->select(2, {0, 40, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 7, 9}));
  ASSERT_TRUE(observe_union(*p, 2, sel, {block_scores(v, 4)}, 40, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  // Layer 0 falls back to prev-iter on itself: block 4 from its own step 0.
  ASSERT_TRUE(p->select(0, {1, 40, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 4, 9}));
}

TEST(PredictPredictors, OracleTakesTheBlocksHoldingTheTrueTopk) {
  PredictorConfig c = small_config();
  c.topk = 6;  // needs 2 blocks
  c.explicit_budget_blocks = 4;
  auto p = make("oracle", c);
  Selection sel;
  EXPECT_EQ(p->select(0, {0, 40, 1}, &sel).code(), StatusCode::kInvalidArgument);  // no top-k
  std::vector<int32_t> top = {21, 22, 23, 13, 5, -1};  // block 5: 3, block 3: 1, block 1: 1
  PredictorInputs inputs;
  StepInput in{0, 40, 1};
  in.inputs = &inputs;
  inputs.true_topk = top.data();
  ASSERT_TRUE(p->select(0, in, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 1, 5, 9}));  // 1 beats 3 on the tie
  std::vector<int32_t> outside = {40, -1, -1, -1, -1, -1};
  inputs.true_topk = outside.data();
  auto q = make("oracle", c);
  EXPECT_EQ(q->select(0, in, &sel).code(), StatusCode::kOutOfRange);
}

TEST(PredictPredictors, StepReuseTakesThePreviousTopkBlocks) {
  PredictorConfig c = small_config();
  c.topk = 8;
  c.explicit_budget_blocks = 4;
  auto p = make("step-reuse", c);
  Selection sel;
  ASSERT_TRUE(p->select(0, {0, 40, 1}, &sel).ok());  // nothing known: recency
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 7, 8, 9}));
  std::vector<float> v(40, 0.0f);
  for (int32_t pos : {9, 10, 11, 25, 26, 27, 28, 33}) v[static_cast<size_t>(pos)] = 5;
  // Top-8 of the scored blocks: blocks 2 (3 hits), 6 (3), 7 (1), 8 (1).
  ASSERT_TRUE(observe_union(*p, 0, all_blocks(10), {v}, 40, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  ASSERT_TRUE(p->select(0, {1, 40, 1}, &sel).ok());
  EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, 2, 6, 9}));
}

TEST(PredictPredictors, IndexCacheFullAndSharedLayers) {
  PredictorConfig c = small_config();
  c.explicit_budget_blocks = 3;
  for (int32_t freq : {2, 4}) {
    auto p = make(freq == 2 ? "indexcache-2" : "indexcache-4", c, 5);
    Selection sel;
    for (int32_t layer = 0; layer < 5; ++layer) {
      // Full layer f·freq has its hot block at 5 + f; a shared layer takes its full layer's.
      const int32_t hot = 5 + layer / freq;
      ASSERT_TRUE(p->select(layer, {0, 40, 1}, &sel).ok()) << layer;
      if (layer % freq == 0) {
        EXPECT_EQ(sel.row_blocks[0].size(), 10u) << layer;  // full layer: every block
      } else {
        EXPECT_EQ(sel.row_blocks[0], (std::vector<int32_t>{0, hot, 9})) << freq << " " << layer;
      }
      std::vector<float> v(10, 0.0f);
      v[static_cast<size_t>(layer % freq == 0 ? hot : 2)] = 9;  // shared layers' own scores: unused
      ASSERT_TRUE(observe_union(*p, layer, all_blocks(10), {block_scores(v, 4)}, 40, 1).ok());
    }
    ASSERT_TRUE(p->commit(0).ok());
  }
  auto q = make("indexcache-2", c, 2);
  Selection sel;
  EXPECT_EQ(q->select(1, {0, 40, 1}, &sel).code(), StatusCode::kFailedPrecondition);
}

// ---- hisa ---------------------------------------------------------------------------------------

// Σ_h w[h]·ReLU(q[h]·mean(keys of block b among the first `committed` entries)), in double.
double hisa_reference(const Cache& c, int32_t e, int64_t committed, int32_t b, const uint8_t* q,
                      const float* w, int32_t heads) {
  std::vector<double> mean(128, 0.0);
  int64_t n = 0;
  for (int64_t pos = int64_t{b} * e; pos < std::min<int64_t>((b + 1) * int64_t{e}, committed);
       ++pos, ++n)
    for (int d = 0; d < 128; ++d)
      mean[static_cast<size_t>(d)] += c.keys[static_cast<size_t>(pos)][static_cast<size_t>(d)];
  for (double& m : mean) m /= static_cast<double>(n);
  double total = 0;
  for (int32_t h = 0; h < heads; ++h) {
    double dot = 0;
    for (int d = 0; d < 128; ++d)
      dot += e4m3_to_float(q[h * 128 + d]) * mean[static_cast<size_t>(d)];
    total += w[h] * std::max(0.0, dot);
  }
  return total;
}

TEST(PredictPredictors, HisaPooledKeysIncrementalAndExact) {
  constexpr int32_t kHeads = 3;
  PredictorConfig c = small_config();
  c.page_size = 4;
  c.block_pages = 2;  // blocks of 8 entries over 2 pages
  c.topk = 8;
  c.explicit_budget_blocks = 3;
  c.local_blocks = 0;
  c.sink_blocks = 0;
  CounterRng rng(stream_key(5));
  std::vector<std::vector<float>> raw(90, std::vector<float>(128));
  std::vector<float> dir(128);
  for (float& d : dir) d = static_cast<float>(rng.normal());
  for (size_t pos = 0; pos < raw.size(); ++pos)
    for (size_t d = 0; d < 128; ++d)
      raw[pos][d] = static_cast<float>(rng.normal()) * 0.3f + (pos / 8 == 4 ? dir[d] : 0.0f);
  const Cache cache(4, raw, 99);
  std::vector<uint8_t> q(2 * kHeads * 128);
  std::vector<float> w = {0.5f, -0.25f, 1.0f, 0.5f, -0.25f, 1.0f};
  for (int r = 0; r < 2; ++r)
    for (int h = 0; h < kHeads; ++h)
      for (int d = 0; d < 128; ++d)
        q[static_cast<size_t>((r * kHeads + h) * 128 + d)] = e4m3_from_float(
            h == 0 ? dir[static_cast<size_t>(d)] : static_cast<float>(rng.normal()));

  auto p = make("hisa", c);
  Selection sel;
  EXPECT_EQ(p->select(0, {0, 40, 1}, &sel).code(), StatusCode::kInvalidArgument);  // no view
  int64_t step = 0;
  // Plain steps that grow the context (60 → 70 → 71 entries), then an MTP step (next_n 2).
  for (const auto& [entries, next_n] :
       std::vector<std::pair<int64_t, int32_t>>{{60, 1}, {70, 1}, {71, 1}, {81, 2}, {90, 2}}) {
    HisaView view{cache.bytes.data(),
                  4,
                  cache.table.data(),
                  entries,
                  q.data(),
                  w.data(),
                  kHeads,
                  static_cast<int64_t>(cache.table.size())};
    PredictorInputs inputs;
    StepInput in{step, entries, next_n};
    in.inputs = &inputs;
    inputs.hisa = &view;
    in.want_scores = true;
    ASSERT_TRUE(p->select(0, in, &sel).ok()) << entries;
    const int64_t committed = visible_entries(entries, next_n, 0);
    for (int32_t j = 0; j < next_n; ++j) {
      const auto& s = sel.row_scores[static_cast<size_t>(j)];
      for (int32_t b = 0; b < static_cast<int32_t>(s.size()); ++b) {
        if (int64_t{b} * 8 >= committed) {
          EXPECT_EQ(s[static_cast<size_t>(b)], FLT_MAX);  // only draft entries: keep
          continue;
        }
        const double want = hisa_reference(cache, 8, committed, b, q.data() + j * kHeads * 128,
                                           w.data() + j * kHeads, kHeads);
        EXPECT_NEAR(s[static_cast<size_t>(b)], want, 1e-4 * (1.0 + std::fabs(want)))
            << "entries " << entries << " row " << j << " block " << b;
      }
      EXPECT_TRUE(std::binary_search(sel.row_blocks[static_cast<size_t>(j)].begin(),
                                     sel.row_blocks[static_cast<size_t>(j)].end(), 4));
    }
    std::vector<std::vector<float>> full(static_cast<size_t>(next_n),
                                         std::vector<float>(static_cast<size_t>(entries), 1.0f));
    ASSERT_TRUE(observe_union(*p, 0, sel, full, entries, next_n).ok());
    ASSERT_TRUE(p->commit(0).ok());
    ++step;
  }
  EXPECT_EQ(p->memory_bytes(), state_of(*p, 0).memory_bytes() + 12 * kHisaBytesPerBlock);
  // A bad view is refused.
  HisaView bad{cache.bytes.data(), 8, cache.table.data(), 90, q.data(), w.data(), kHeads, -1};
  PredictorInputs inputs;
  StepInput in{step, 90, 1};
  in.inputs = &inputs;
  inputs.hisa = &bad;
  EXPECT_NE(p->select(0, in, &sel).message().find("page_size"), std::string::npos);
  std::vector<int32_t> broken = cache.table;
  broken[22] = 1000;
  HisaView oob{
      cache.bytes.data(), 4,        broken.data(), 92,
      q.data(),           w.data(), kHeads,        static_cast<int64_t>(cache.table.size())};
  in.num_entries = 92;
  inputs.hisa = &oob;
  EXPECT_EQ(p->select(0, in, &sel).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace spin
