// One prefill path: replay, the serving API and the decode engine all observe a prefill (the prompt,
// and every context jump: a tool output) through BlockPredictor::observe_prefill at the same step
// number, so on an agentic trace with tool bursts they choose the same blocks and get the same
// top-k at every step and layer, and the same recall where they measure it.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "spin/lab/engine.h"
#include "spin/lab/replay.h"
#include "spin/serving.h"
#include "spin/topk.h"
#include "spin/lab/workload.h"

namespace spin {
namespace {

// A small agentic trace: a tool output every 5 steps, so a run holds several context jumps.
Trace agentic_trace(int32_t next_n) {
  WorkloadParams p = scenario_params(next_n > 1 ? "agentic-mtp" : "agentic").value();
  p.next_n = next_n;
  p.prompt_tokens = 3000;
  p.steps = 16;
  p.layers = 2;
  p.num_heads = 16;
  p.burst_steps = 5;
  p.tool_tokens = 400;
  p.segment_tokens = 300;
  return generate_workload(p).value();
}

PredictorConfig parity_config() {
  PredictorConfig c;
  c.target_sparsity = 0.5;
  c.explore_ratio = 0.2;  // exploration is keyed on the step: a numbering slip shows
  return c;
}

std::vector<int64_t> prefill_steps(const ScoredTrace& scored, int64_t steps) {
  std::vector<int64_t> out;
  for (int64_t s = 0; s < steps; ++s) {
    if (replayed_as_prefill(scored, s, ReplayOptions{})) out.push_back(s);
  }
  return out;
}

ReplayResult replay_with_topk(const ScoredTrace& scored, const Trace* keys) {
  ReplayOptions o;
  o.predictor = "spin";
  o.config = parity_config();
  o.keep_topk = true;
  auto r = keys ? replay(*keys, scored, o) : replay(scored, o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

TEST(PrefillParity, TheTraceHasContextJumps) {
  const Trace t = agentic_trace(1);
  auto scored = score_trace(t).value();
  EXPECT_GE(prefill_steps(*scored, t.steps()).size(), 3u);  // the prompt and two tool outputs
}

// Serving's prefill() + commit() equals replay's observe_prefill step: the decode steps after it
// select the same blocks, so the masked top-k is the same at every step and layer.
TEST(PrefillParity, ServingPrefillEqualsReplay) {
  const Trace t = agentic_trace(1);
  const ScoreTrace st = all_keep_score_trace(t).value();
  auto scored = score_trace(st).value();
  const ReplayResult want = replay_with_topk(*scored, nullptr);
  ASSERT_GE(want.prefill_steps, 3);

  ServingOptions o;
  o.predictor = "spin";
  o.config = parity_config();
  o.config.page_size = st.meta.page_size;
  o.config.topk = st.meta.topk;
  o.max_requests = 1;
  o.num_layers = st.meta.num_layers;
  o.max_entries = st.ctx_len.back();
  auto made = ServingPredictor::create(o);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  ServingPredictor& s = *made.value();
  const int32_t slot = 0, accepted = 0;
  ASSERT_TRUE(s.add(slot, /*request_id=*/0).ok());  // replay's request id: the same exploration
  const int32_t k = st.meta.topk, E = s.block_entries();
  std::vector<int32_t> blocks(static_cast<size_t>(s.max_blocks())), topk_out(static_cast<size_t>(k));
  std::vector<float> masked;
  int64_t decode_rows = 0;
  for (int64_t step = 0; step < st.steps(); ++step) {
    const int64_t seq = st.ctx_len[step];
    const int64_t visible = visible_entries(seq, 1, 0);
    for (int32_t l = 0; l < st.meta.num_layers; ++l) {
      const float* row = st.row(l, step, 0);
      if (replayed_as_prefill(*scored, step, ReplayOptions{})) {
        ASSERT_TRUE(s.prefill(&slot, 1, l, &seq, row, st.entries[l]).ok()) << step;
        continue;
      }
      int32_t count = 0;
      ASSERT_TRUE(s.select(&slot, 1, l, &seq, 1, blocks.data(), s.max_blocks(), &count).ok()) << step;
      masked.assign(static_cast<size_t>(visible), -std::numeric_limits<float>::infinity());
      for (int32_t c = 0; c < count; ++c) {
        for (int64_t e = int64_t{blocks[c]} * E; e < std::min<int64_t>(visible, int64_t{blocks[c] + 1} * E); ++e) {
          masked[static_cast<size_t>(e)] = row[e];
        }
      }
      TopkParams tp{masked.data(), visible, 1, visible, nullptr, k, topk_out.data(), k};
      ASSERT_TRUE(topk(tp).ok());
      EXPECT_EQ(topk_out, want.topk[l][static_cast<size_t>(step)]) << "step " << step << " layer " << l;
      ASSERT_TRUE(s.observe(&slot, 1, l, masked.data(), visible, visible, topk_out.data(), k).ok());
      ++decode_rows;
    }
    ASSERT_TRUE(s.commit(&slot, 1, &accepted).ok()) << step;
    EXPECT_EQ(s.step(slot), step + 1);  // a prefill numbers its step as replay does
  }
  EXPECT_EQ(decode_rows, want.quality.samples());
}

// The engine replaying the trace's keys and queries (`spin bench decode --source`) equals replay:
// the same top-k at every step and layer (prefills included: both score them in full) and the same
// recall over the decode rows, plain and MTP.
void expect_engine_equals_replay(int32_t next_n) {
  const Trace t = agentic_trace(next_n);
  auto scored = score_trace(t).value();
  const ReplayResult want = replay_with_topk(*scored, &t);
  const int32_t layers = t.meta.num_layers;
  IndexerInputs in;
  in.steps = static_cast<int32_t>(t.steps());
  in.next_n = next_n;
  in.num_heads = t.meta.num_heads;
  in.entries = static_cast<int64_t>(t.layers[0].k_scale.size());
  in.ctx_len = t.ctx_len.data();
  in.accepted = next_n > 1 ? t.accepted.data() : nullptr;
  for (const TraceLayer& l : t.layers) {
    in.keys.push_back(l.k.data());
    in.key_scales.push_back(l.k_scale.data());
    in.queries.push_back(l.q.data());
    in.weights.push_back(l.w.data());
  }
  EngineConfig c;
  c.model.name = "trace";
  c.model.model_layers = c.model.indexer_layers = layers;
  c.model.index_heads = t.meta.num_heads;
  c.model.topk = t.meta.topk;
  c.model.page_size = t.meta.page_size;
  c.model.attn_heads = 4;
  c.layers = layers;
  c.next_n = next_n;
  c.predictor = "spin";
  c.predictor_config = parity_config();
  c.measure_attn_err = true;
  c.inputs = &in;
  auto made = DecodeEngine::create(c, 1, t.ctx_len.back() + next_n);
  ASSERT_TRUE(made.ok()) << made.status().to_string();
  DecodeEngine& e = *made.value();
  ASSERT_TRUE(e.add_request(/*request_id=*/0, in.prompt_tokens()).ok());
  double recall_sum = 0;
  int64_t recall_rows = 0, prefill_rows = 0;
  for (int64_t step = 0; step < t.steps(); ++step) {
    StepStats stats;
    const Status ran = e.step(&stats);
    ASSERT_TRUE(ran.ok()) << step << ": " << ran.to_string();
    recall_sum += stats.recall_sum;
    recall_rows += stats.recall_rows;
    prefill_rows += stats.prefill_rows;
    for (int32_t l = 0; l < layers; ++l) {
      std::vector<int32_t> rows;
      for (int32_t j = 0; j < next_n; ++j) {
        const auto& r = want.topk[l][static_cast<size_t>(step * next_n + j)];
        rows.insert(rows.end(), r.begin(), r.end());
      }
      EXPECT_EQ(*e.last_topk(0, l), rows) << "step " << step << " layer " << l;
    }
  }
  EXPECT_EQ(prefill_rows, want.prefill_steps * next_n);
  EXPECT_EQ(recall_rows, want.quality.samples());
  EXPECT_NEAR(recall_sum / static_cast<double>(recall_rows), want.quality.recall().mean(), 1e-12);
}

TEST(PrefillParity, EngineEqualsReplayAcrossToolBursts) { expect_engine_equals_replay(1); }
TEST(PrefillParity, EngineEqualsReplayAcrossToolBurstsWithMtp) { expect_engine_equals_replay(2); }

}  // namespace
}  // namespace spin
