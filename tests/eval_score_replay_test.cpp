// Replays of score traces, prefill observations and MTP rows:
// - a key trace and the score trace of its all-keep scores replay identically (every metric
//   bitwise, every kept top-k) for every predictor, hisa included (through the converted trace's
//   block probe); all-keep is exact; hisa refuses a score trace without a probe;
// - generated MTP rows are different tokens (own queries), so prefix / row0 / all-rows differ,
//   and all three start from the same state after the warm start;
// - a step whose ctx_len jumps (a tool output) is observed as a prefill and not counted.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <cstring>

#include "predict/block_state.h"
#include "predict_testing.h"
#include "spin/predictor_inputs.h"
#include "spin/lab/metrics.h"
#include "spin/lab/replay.h"
#include "spin/lab/workload.h"
#include "test_util.h"

namespace spin {
namespace {

using spin::testing::TempDir;
using spin::testing::state_of;

WorkloadParams small_params(int32_t next_n = 1) {
  WorkloadParams p = scenario_params(next_n > 1 ? "doc-qa-10k-mtp" : "doc-qa-10k").value();
  p.prompt_tokens = 5000;
  p.steps = 8;
  p.layers = 2;
  p.num_heads = 16;
  return p;
}

// The metrics of a replay as JSON, without the time it took.
nlohmann::json metrics(const ReplayResult& r, const ScoredTrace& scored) {
  nlohmann::json j = nlohmann::json::parse(replay_json("t", r, trace_facts(scored, r.config.block_entries())));
  for (const char* timed : {"predictor_seconds", "overhead_fraction", "cost_fraction", "indexer_entry_seconds"})
    j.erase(timed);
  return j;
}

bool same_bits(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

struct KeyAndScores {
  Trace keys;
  std::shared_ptr<const ScoredTrace> from_keys, from_scores;
  ScoreTrace scores;  // as read back (with its probe)
};

// A generated key trace, and its all-keep score trace written to disk and read back.
KeyAndScores key_and_scores(const WorkloadParams& p) {
  KeyAndScores k;
  k.keys = generate_workload(p).value();
  k.from_keys = score_trace(k.keys).value();
  auto scores = all_keep_score_trace(k.keys);
  EXPECT_TRUE(scores.ok()) << scores.status().to_string();
  TempDir dir;
  EXPECT_TRUE(write_score_trace(scores.value(), dir.file("s")).ok());
  auto back = read_score_trace(dir.file("s"));
  EXPECT_TRUE(back.ok()) << back.status().to_string();
  k.scores = back.value();
  k.from_scores = score_trace(back.value()).value();
  EXPECT_FALSE(has_keys(*k.from_scores));
  EXPECT_TRUE(has_keys(*k.from_keys));
  EXPECT_TRUE(has_probe(*k.from_scores));
  EXPECT_FALSE(has_probe(*k.from_keys));
  return k;
}

TEST(ScoreReplay, AllKeepClosedLoopOnAScoreTraceIsExact) {
  for (int32_t next_n : {1, 3}) {
    const KeyAndScores k = key_and_scores(small_params(next_n));
    ReplayOptions o;
    o.predictor = "all-keep";
    o.config.target_sparsity = 0.5;
    const ReplayResult r = replay(*k.from_scores, o).value();
    EXPECT_GT(r.quality.recall().count(), 0);
    EXPECT_EQ(r.quality.recall().mean(), 1.0);
    EXPECT_EQ(r.quality.miss().max(), 0.0);
  }
}

// Open loop with keep_topk keeps every row (the all-keep top-k it saw), so nothing
// returned is unwritten; trace_facts refuses block_entries 0 instead of dividing by it.
TEST(ScoreReplay, OpenLoopKeepsEveryTopkRowAndFactsRefuseZero) {
  WorkloadParams p = small_params();
  p.prompt_tokens = 3000;
  p.steps = 4;
  const Trace t = generate_workload(p).value();
  auto scored = score_trace(t).value();
  ReplayOptions o;
  o.open_loop = true;
  o.keep_topk = true;
  o.config.topk = p.topk;
  auto r = replay(t, *scored, o);
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  ASSERT_EQ(r->topk.size(), static_cast<size_t>(p.layers));
  for (const auto& layer : r->topk) {
    ASSERT_EQ(layer.size(), static_cast<size_t>(p.steps));
    for (const auto& row : layer) EXPECT_EQ(row.size(), static_cast<size_t>(p.topk));
  }
  EXPECT_EQ(check_trace_facts(*scored, 0).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(check_trace_facts(*scored, 64, p.layers).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(check_trace_facts(*scored, 64).ok());
  EXPECT_EQ(trace_facts(*scored, 0).samples, 0);
  ScoreOptions many;
  many.threads = 1 << 20;
  EXPECT_EQ(score_trace(t, many).status().code(), StatusCode::kInvalidArgument);
}

TEST(ScoreReplay, KeyTraceAndItsScoreTraceReplayIdentically) {
  for (int32_t next_n : {1, 3}) {
    const KeyAndScores k = key_and_scores(small_params(next_n));
    int compared = 0;
    for (const std::string& p : predictor_names()) {
      for (bool open_loop : {false, true}) {
        ReplayOptions o;
        o.predictor = p;
        o.config.target_sparsity = 0.5;
        o.open_loop = open_loop;
        o.keep_topk = !open_loop;
        const ReplayResult a = replay(k.keys, *k.from_keys, o).value();
        auto b = replay(*k.from_scores, o);
        ASSERT_TRUE(b.ok()) << p << ": " << b.status().to_string();
        EXPECT_EQ(metrics(a, *k.from_keys), metrics(b.value(), *k.from_scores)) << p << (open_loop ? " open" : " closed");
        // Bitwise, not just the printed digits (NaN where a metric does not apply).
        EXPECT_TRUE(same_bits(a.quality.recall().mean(), b->quality.recall().mean())) << p;
        EXPECT_TRUE(same_bits(a.quality.miss().percentile(99), b->quality.miss().percentile(99))) << p;
        EXPECT_TRUE(same_bits(a.quality.block_recall().mean(), b->quality.block_recall().mean())) << p;
        EXPECT_TRUE(same_bits(a.quality.sparsity().mean(), b->quality.sparsity().mean())) << p;
        EXPECT_TRUE(same_bits(a.quality.pearson().mean(), b->quality.pearson().mean())) << p;
        EXPECT_EQ(a.quality.samples(), b->quality.samples()) << p;
        EXPECT_EQ(a.topk, b->topk) << p;
        ++compared;
      }
    }
    EXPECT_EQ(compared, 2 * static_cast<int>(predictor_names().size()));
  }
}

// The converted probe is hisa's own block score: the same selections, not just the same means.
TEST(ScoreReplay, HisaOnTheProbeSelectsWhatHisaOnTheKeysSelects) {
  for (int32_t next_n : {1, 3}) {
    const KeyAndScores k = key_and_scores(small_params(next_n));
    for (double sparsity : {0.3, 0.7}) {
      ReplayOptions o;
      o.predictor = "hisa";
      o.config.target_sparsity = sparsity;
      o.keep_topk = true;
      const ReplayResult a = replay(k.keys, *k.from_keys, o).value();
      const ReplayResult b = replay(*k.from_scores, o).value();
      EXPECT_EQ(a.topk, b.topk) << "next_n " << next_n << " sparsity " << sparsity;
      EXPECT_GT(a.quality.samples(), 0);
      // Not trivially all-keep: hisa misses some of the top-k at 70 %.
      if (sparsity > 0.5) {
        EXPECT_LT(a.quality.recall().mean(), 1.0);
      }
    }
  }
}

TEST(ScoreReplay, HisaRefusesAScoreTraceWithoutProbeInOneLine) {
  const KeyAndScores k = key_and_scores(small_params());
  ScoreTrace bare = k.scores;
  bare.probe.clear();
  bare.probe_block_entries = 0;
  const auto scored = score_trace(bare).value();
  EXPECT_FALSE(has_probe(*scored));
  ReplayOptions o;
  o.predictor = "hisa";
  auto r = replay(*scored, o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(r.status().message().find('\n'), std::string::npos);
  EXPECT_NE(r.status().message().find("hisa needs the indexer's keys"), std::string::npos) << r.status().message();
  EXPECT_NE(r.status().message().find("no block probe"), std::string::npos) << r.status().message();
  // The key trace's scored form without the trace itself cannot feed hisa either.
  EXPECT_FALSE(replay(*k.from_keys, o).ok());
  EXPECT_TRUE(replay(k.keys, *k.from_keys, o).ok());
  // A probe pooled over other blocks than the predictor's is refused, naming both sizes; score-only
  // predictors replay as before (they never see the probe).
  o.config.block_pages = 2;
  r = replay(*k.from_scores, o);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("pooled over 64 entries, but its blocks hold 128"), std::string::npos)
      << r.status().message();
  o.predictor = "spin";
  EXPECT_TRUE(replay(*k.from_scores, o).ok());
}

// A predictor given a probe of the wrong block size or too short a stride says so in one line.
TEST(ScoreReplay, StepInputProbeIsChecked) {
  PredictorConfig c;
  c.page_size = 4;
  c.topk = 4;
  c.target_sparsity = 0.5;  // 5 of 10 blocks
  auto made = make_predictor("hisa", c, 1, 0);
  ASSERT_TRUE(made.ok());
  BlockPredictor& p = *made.value();
  std::vector<float> probe(10);
  for (size_t b = 0; b < probe.size(); ++b) probe[b] = static_cast<float>((b * 7) % 10);
  PredictorInputs inputs;
  StepInput in;
  in.inputs = &inputs;
  in.step = 0;
  in.num_entries = 40;
  Selection sel;
  Status s = p.select(0, in, &sel);
  EXPECT_NE(s.message().find("neither hisa (the query and the key cache) nor block_probe"), std::string::npos)
      << s.message();
  inputs.block_probe = probe.data();
  inputs.block_probe_stride = 10;
  inputs.block_probe_entries = 8;
  s = p.select(0, in, &sel);
  EXPECT_NE(s.message().find("block_probe_entries 8 differs from the config's block_entries 4"), std::string::npos)
      << s.message();
  inputs.block_probe_entries = 4;
  inputs.block_probe_stride = 9;
  s = p.select(0, in, &sel);
  EXPECT_NE(s.message().find("block_probe_stride 9 is below row 0's 10 blocks"), std::string::npos) << s.message();
  inputs.block_probe_stride = 10;
  ASSERT_TRUE(p.select(0, in, &sel).ok());
  // Forced: block 0 (sink) and 8, 9 (local); then the highest probe: 7 (value 9), 4 (8), ... within 5 blocks.
  EXPECT_EQ(sel.blocks, (std::vector<int32_t>{0, 4, 7, 8, 9}));
}

// ---------------------------------------------------------------------------------------------
// MTP

// The all-keep top-k of every (layer, step, row), from an all-keep replay.
std::vector<std::vector<std::vector<int32_t>>> truth_topk(const ScoredTrace& scored) {
  ReplayOptions o;
  o.predictor = "all-keep";
  o.keep_topk = true;
  return replay(scored, o).value().topk;
}

TEST(MtpRows, GeneratedRowsAreDifferentTokens) {
  const WorkloadParams p = small_params(3);
  const Trace t = generate_workload(p).value();
  const auto scored = score_trace(t).value();
  const auto topk = truth_topk(*scored);
  // A draft row's top-k overlaps row 0's about as much as the next step's does, not almost fully
  // (before rows had their own query noise, draft rows were row 0 moved by one rope position).
  double rows = 0, steps = 0;
  int n = 0;
  for (int l = 0; l < p.layers; ++l) {
    for (int s = 0; s + 1 < p.steps; ++s) {
      rows += recall(topk[l][s * 3 + 1], topk[l][s * 3]);
      steps += recall(topk[l][(s + 1) * 3], topk[l][s * 3]);
      ++n;
      const size_t row_bytes = size_t{16} * 128;
      const uint8_t* q = t.layers[l].q.data() + size_t(s) * 3 * row_bytes;
      EXPECT_NE(0, std::memcmp(q, q + row_bytes, row_bytes));
    }
  }
  rows /= n;
  steps /= n;
  EXPECT_LT(rows, 0.9) << "row-to-row top-k overlap " << rows << ", step-to-step " << steps;
  EXPECT_LT(rows, steps + 0.1);
}

ReplayResult run_mode(const ScoredTrace& scored, MtpUpdate mode, double sparsity,
                      std::function<void(int64_t, const BlockPredictor&)> after_step = {}) {
  ReplayOptions o;
  o.predictor = "spin";
  o.config.target_sparsity = sparsity;
  o.config.mtp_update = mode;
  // The paper's ranking and pooling: under topk_first the last top-k's blocks fill this small
  // budget and the replayed EMAs, what the modes differ in, rarely decide a block; pool_depth's
  // m-th best entry (m = 11 here) moves less between the modes' rows than the best does.
  o.config.topk_first = 0;
  o.config.pool_depth = 0;
  o.keep_topk = true;
  o.after_step = std::move(after_step);
  return replay(scored, o).value();
}

TEST(MtpRows, PrefixRow0AndAllRowsReplaysDiffer) {
  WorkloadParams p = small_params(3);
  p.steps = 12;
  const KeyAndScores k = key_and_scores(p);
  const ReplayResult prefix = run_mode(*k.from_scores, MtpUpdate::kPrefix, 0.5);
  const ReplayResult row0 = run_mode(*k.from_scores, MtpUpdate::kRow0, 0.5);
  const ReplayResult all = run_mode(*k.from_scores, MtpUpdate::kAllRows, 0.5);
  EXPECT_NE(prefix.topk, row0.topk);
  EXPECT_NE(prefix.topk, all.topk);
  EXPECT_NE(row0.topk, all.topk);
  EXPECT_NE(prefix.quality.recall().mean(), row0.quality.recall().mean());
  EXPECT_NE(prefix.quality.recall().mean(), all.quality.recall().mean());
}

// Every layer's state, bit for bit.
std::vector<std::vector<uint32_t>> state_bits(const BlockPredictor& p) {
  std::vector<std::vector<uint32_t>> out;
  for (int l = 0; l < p.num_layers(); ++l) {
    const BlockState& s = state_of(p, l);
    std::vector<uint32_t>& v = out.emplace_back();
    for (int64_t b = 0; b < s.n_blocks(); ++b) {
      uint32_t x;
      const float slot = s.slot(b);
      std::memcpy(&x, &slot, 4);
      v.push_back(s.seen(b) ? x : 0u);
      v.push_back(static_cast<uint32_t>(s.last_seen(b)));
    }
    for (int32_t i = 0; i < s.n_offset_buckets(); ++i) {
      uint32_t x;
      const float o = s.offset(i);
      std::memcpy(&x, &o, 4);
      v.push_back(s.offset_known(i) ? x : 0u);
      v.push_back(static_cast<uint32_t>(s.offset_updates(i)));
    }
  }
  return out;
}

TEST(MtpRows, EveryModeHasTheSameStateAfterTheWarmStart) {
  Trace t = generate_workload(small_params(3)).value();
  t.accepted[0] = 1;  // prefix (rows 0..1), row0 (row 0) and all-rows (0..2) used to differ here
  const auto scored = score_trace(t).value();
  std::vector<std::vector<std::vector<uint32_t>>> after_warm;
  for (MtpUpdate mode : {MtpUpdate::kPrefix, MtpUpdate::kRow0, MtpUpdate::kAllRows}) {
    run_mode(*scored, mode, 0.5, [&](int64_t step, const BlockPredictor& p) {
      if (step == 0) after_warm.push_back(state_bits(p));
    });
  }
  ASSERT_EQ(after_warm.size(), 3u);
  ASSERT_FALSE(after_warm[0].empty());
  EXPECT_EQ(after_warm[0], after_warm[1]);
  EXPECT_EQ(after_warm[0], after_warm[2]);
}

// ---------------------------------------------------------------------------------------------
// Prefill observations

WorkloadParams burst_params() {
  WorkloadParams p = scenario_params("agentic").value();
  p.prompt_tokens = 4000;
  p.steps = 10;
  p.layers = 2;
  p.num_heads = 16;
  p.burst_steps = 5;  // a tool output of 1500 tokens before step 5
  p.tool_tokens = 1500;
  return p;
}

TEST(Prefill, CtxLenJumpIsObservedAsPrefillAndNotCounted) {
  const WorkloadParams p = burst_params();
  const KeyAndScores k = key_and_scores(p);
  ReplayOptions o;
  o.predictor = "prev-iter";
  o.config.target_sparsity = 0.5;
  o.keep_topk = true;
  for (int64_t s = 0; s < p.steps; ++s) EXPECT_EQ(replayed_as_prefill(*k.from_scores, s, o), s == 0 || s == 5) << s;
  // What the predictor knows right after step 5: with the prefill, every block of the context
  // was observed at step 5 (the tool output included); replayed as decode, only the selected ones.
  std::vector<int64_t> seen_at_5, blocks_at_5;
  auto watch = [&](int64_t step, const BlockPredictor& pred) {
    if (step != 5) return;
    const BlockState& st = state_of(pred, 0);
    int64_t seen = 0;
    for (int64_t b = 0; b < st.n_blocks(); ++b) seen += st.last_seen(b) == 5;
    seen_at_5.push_back(seen);
    blocks_at_5.push_back(st.n_blocks());
  };
  o.after_step = watch;
  const ReplayResult with = replay(*k.from_scores, o).value();
  o.prefill_jumps = false;
  const ReplayResult decode = replay(*k.from_scores, o).value();
  EXPECT_EQ(with.prefill_steps, 2);
  EXPECT_EQ(decode.prefill_steps, 1);
  EXPECT_EQ(with.quality.samples(), int64_t{p.steps - 2} * p.layers);
  EXPECT_EQ(decode.quality.samples(), int64_t{p.steps - 1} * p.layers);
  ASSERT_EQ(seen_at_5.size(), 2u);
  EXPECT_EQ(seen_at_5[0], blocks_at_5[0]) << "the prefill observes every block";
  EXPECT_LT(seen_at_5[1], blocks_at_5[1]) << "decode observes only the budget";
  // The prefill step's kept top-k is the truth (everything was scored).
  const auto truth = truth_topk(*k.from_scores);
  EXPECT_EQ(with.topk[0][5], truth[0][5]);
  EXPECT_NE(decode.topk[0][5], truth[0][5]);
  // The metrics window: only steps 6.. counted.
  o.prefill_jumps = true;
  o.count_from_step = 6;
  o.after_step = nullptr;
  EXPECT_EQ(replay(*k.from_scores, o).value().quality.samples(), int64_t{p.steps - 6} * p.layers);
}

TEST(Prefill, ObservePrefillProtocol) {
  PredictorConfig c;
  c.page_size = 4;
  c.topk = 4;
  auto made = make_predictor("spin", c, 1, 7);
  ASSERT_TRUE(made.ok());
  BlockPredictor& p = *made.value();
  std::vector<float> scores(40);
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = static_cast<float>(i % 7);
  std::vector<int32_t> blocks(10);
  for (int32_t b = 0; b < 10; ++b) blocks[b] = b;
  RowScores rs;
  rs.scores = scores.data();
  rs.num_cols = 40;
  rs.visible_entries = 40;
  rs.scored_blocks = blocks.data();
  rs.num_scored_blocks = 10;
  ASSERT_TRUE(p.observe_prefill(0, 3, rs).ok());
  ASSERT_TRUE(p.observe_prefill(0, 3, rs).ok());  // another row of the same prefill
  for (int64_t b = 0; b < 10; ++b) EXPECT_EQ(state_of(p, 0).last_seen(b), 3);
  EXPECT_EQ(p.observe_prefill(1, 3, rs).code(), StatusCode::kInvalidArgument);  // no layer 1
  StepInput in;
  in.step = 3;
  in.num_entries = 41;
  Selection sel;
  EXPECT_EQ(p.select(0, in, &sel).code(), StatusCode::kFailedPrecondition);  // step 3 was the prefill
  in.step = 4;
  ASSERT_TRUE(p.select(0, in, &sel).ok());
  EXPECT_EQ(p.observe_prefill(0, 5, rs).code(), StatusCode::kFailedPrecondition);  // a step is open
  std::vector<float> row(41, -std::numeric_limits<float>::infinity());
  for (int32_t b : sel.blocks)
    for (int64_t e = int64_t{b} * 4; e < std::min<int64_t>(41, (b + 1) * 4); ++e) row[e] = 1.0f;
  RowScores obs;
  obs.scores = row.data();
  obs.num_cols = 41;
  obs.visible_entries = 41;
  obs.scored_blocks = sel.blocks.data();
  obs.num_scored_blocks = static_cast<int64_t>(sel.blocks.size());
  ASSERT_TRUE(p.observe(0, 0, obs).ok());
  ASSERT_TRUE(p.commit(0).ok());
  EXPECT_EQ(p.observe_prefill(0, 4, rs).code(), StatusCode::kFailedPrecondition);  // not after step 4
  EXPECT_TRUE(p.observe_prefill(0, 5, rs).ok());
}

}  // namespace
}  // namespace spin
