// The real-model pieces of replay and eval: the truth at another top-k (ScoreOptions::topk),
// trace facts per layer with the block Pearson, and `spin eval --real`'s section.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <fstream>
#include <sstream>

#include "spin/lab/eval.h"
#include "spin/lab/replay.h"
#include "spin/topk.h"
#include "spin/lab/workload.h"
#include "test_util.h"

namespace spin {
namespace {

using spin::testing::TempDir;

// A small score trace as a real model's would look: the all-keep scores of a generated trace.
ScoreTrace small_score_trace(int32_t layers = 2) {
  WorkloadParams p = scenario_params("doc-qa-10k").value();
  p.prompt_tokens = 4200;  // 2048 · 4206 / 65536 = 131: a scaled top-k of 128
  p.steps = 6;
  p.layers = layers;
  p.num_heads = 16;
  p.topk = 64;
  ScoreTrace t = all_keep_score_trace(generate_workload(p).value()).value();
  t.meta.extra["source"] = "test scores, not a DSA indexer";
  return t;
}

TEST(RealModel, TruthAtAnotherTopkIsTheTopkOfTheSameScores) {
  const ScoreTrace t = small_score_trace();
  ScoreOptions o;
  o.topk = 100;
  const auto scored = score_trace(t, o).value();
  // Every row's truth (what all-keep's kept top-k is) is the top-100 of its recorded scores.
  ReplayOptions ro;
  ro.predictor = "all-keep";
  ro.keep_topk = true;
  ro.warm_start = false;
  const ReplayResult r = replay(*scored, ro).value();
  EXPECT_EQ(r.config.topk, 100);
  for (int64_t s = 0; s < t.steps(); ++s) {
    const int64_t visible = visible_entries(t.ctx_len[s], 1, 0, 1);
    std::vector<int32_t> want(100);
    TopkParams tp{t.row(1, s, 0), visible, 1, visible, nullptr, 100, want.data(), 100};
    ASSERT_TRUE(topk(tp, {}).ok());
    ASSERT_EQ(r.topk[1][static_cast<size_t>(s)], want) << s;
  }
  o.topk = -1;
  EXPECT_FALSE(score_trace(t, o).ok());
  o.topk = kTraceMaxTopk + 1;
  EXPECT_FALSE(score_trace(t, o).ok());
}

TEST(RealModel, FactsPerLayerAverageToTheWholeAndStableScoresCorrelateFully) {
  const ScoreTrace t = small_score_trace(3);
  const auto scored = score_trace(t).value();
  const TraceFacts all = trace_facts(*scored, 64);
  double recall = 0, share = 0, pearson = 0;
  for (int32_t l = 0; l < 3; ++l) {
    const TraceFacts f = trace_facts(*scored, 64, l);
    recall += f.prev_step_topk_recall / 3;
    share += f.topk_block_share / 3;
    pearson += f.prev_step_block_pearson / 3;
    EXPECT_GT(f.prev_step_block_pearson, 0.0);
    EXPECT_LE(f.prev_step_block_pearson, 1.0);
  }
  EXPECT_NEAR(recall, all.prev_step_topk_recall, 1e-12);  // same samples per layer
  EXPECT_NEAR(share, all.topk_block_share, 1e-12);
  EXPECT_NEAR(pearson, all.prev_step_block_pearson, 1e-12);
  // A trace whose every step repeats step 0's scores: block Pearson 1, prev-iter recall 1.
  ScoreTrace still = t;
  for (int64_t s = 1; s < still.steps(); ++s) {
    std::copy(still.row(0, 0, 0), still.row(0, 0, 0) + still.entries[0],
              still.scores[0].data() + s * still.entries[0]);
  }
  const TraceFacts f = trace_facts(*score_trace(still).value(), 64, 0);
  EXPECT_NEAR(f.prev_step_block_pearson, 1.0, 1e-12);
  EXPECT_GT(f.prev_step_topk_recall, 0.95);  // the newest entry joins each step
}

TEST(RealModel, EvalRealSectionReadsTheTraceAtTwoTopk) {
  TempDir dir;
  ASSERT_TRUE(write_score_trace(small_score_trace(), dir.file("real.st")).ok());
  EvalOptions o;
  o.scenarios = {"doc-qa-10k"};
  o.quick = true;
  o.real_traces = {dir.file("real.st")};
  o.out_dir = dir.file("out");
  o.threads = 2;
  auto summary = run_eval(o);
  ASSERT_TRUE(summary.ok()) << summary.status().to_string();
  std::ifstream in(summary->results_path);
  const nlohmann::json r = nlohmann::json::parse(in);
  ASSERT_EQ(r["real_model"].size(), 2u);  // its own top-k 64 and the scaled 128 (2048 of 64K at 4.2K)
  EXPECT_EQ(r["real_model"][0]["topk"], 64);
  EXPECT_EQ(r["real_model"][1]["topk"], 128);
  for (const auto& run : r["real_model"]) {
    EXPECT_EQ(run["all_keep"]["layers"].size(), 2u);
    EXPECT_EQ(run["source"], "test scores, not a DSA indexer");
    EXPECT_EQ(run["kind"], "scores");  // the report names the trace kind: attention, or an indexer
    EXPECT_FALSE(run["synthetic_doc_qa_10k_same_shape"]["layers"].empty());
    bool oracle_at_half = false;
    for (const auto& row : run["sweep"]) {
      if (row["label"] == "oracle" && row["target_sparsity"] == 0.5) oracle_at_half = row["recall_mean"] > 0.9;
      if (row["target_sparsity"] == 0.0) {
        EXPECT_EQ(row["recall_mean"], 1.0) << row["label"];
      }
    }
    EXPECT_TRUE(oracle_at_half);
  }
  EXPECT_NE(summary->report_md.find("## Real model"), std::string::npos);
  EXPECT_NE(summary->report_md.find("not a DSA indexer"), std::string::npos);
  EXPECT_NE(summary->report_md.find("score trace), top-k 64"), std::string::npos);
}

}  // namespace
}  // namespace spin
