// Workloads, replay and the eval report: all-keep is exact, the oracle bounds every predictor,
// generation and reports are deterministic (also across thread counts), bad input is refused.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <omp.h>

#include <cstring>
#include <filesystem>
#include <fstream>

#include "spin/lab/eval.h"
#include "spin/lab/replay.h"
#include "spin/lab/workload.h"
#include "test_util.h"

namespace spin {
namespace {

WorkloadParams small_params(int32_t next_n = 1) {
  WorkloadParams p = scenario_params(next_n > 1 ? "doc-qa-10k-mtp" : "doc-qa-10k").value();
  p.prompt_tokens = 6000;
  p.steps = 8;
  p.layers = 2;
  p.num_heads = 16;
  return p;
}

TEST(Workload, DeterministicPerSeedAndThreadCount) {
  const WorkloadParams p = small_params();
  omp_set_num_threads(1);
  const Trace a = generate_workload(p).value();
  omp_set_num_threads(2);
  const Trace b = generate_workload(p).value();
  ASSERT_EQ(a.ctx_len, b.ctx_len);
  for (int l = 0; l < p.layers; ++l) {
    EXPECT_EQ(a.layers[l].k, b.layers[l].k);
    EXPECT_EQ(a.layers[l].q, b.layers[l].q);
    EXPECT_EQ(0, std::memcmp(a.layers[l].w.data(), b.layers[l].w.data(), a.layers[l].w.size() * 4));
  }
  WorkloadParams other = p;
  other.seed = 2;
  EXPECT_NE(generate_workload(other).value().layers[0].k, a.layers[0].k);
  EXPECT_TRUE(validate_trace(a).ok());
  EXPECT_EQ(a.ctx_len.front(), p.prompt_tokens + 1);
}

TEST(Workload, MtpTraceHasAcceptanceAndGrowsByAcceptedTokens) {
  const Trace t = generate_workload(small_params(3)).value();
  ASSERT_EQ(t.accepted.size(), t.ctx_len.size());
  for (size_t s = 1; s < t.ctx_len.size(); ++s) EXPECT_EQ(t.ctx_len[s], t.ctx_len[s - 1] + t.accepted[s - 1] + 1);
}

TEST(Workload, RejectsBadParameters) {
  EXPECT_EQ(scenario_params("no-such-scenario").status().code(), StatusCode::kInvalidArgument);
  WorkloadParams p = small_params();
  EXPECT_EQ(p.set("nonsense", "1").code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p.set("steps", "ten").code(), StatusCode::kInvalidArgument);
  p.next_n = 5;
  EXPECT_FALSE(generate_workload(p).ok());
  p = small_params();
  p.shift_prob = 1.5;
  EXPECT_FALSE(generate_workload(p).ok());
  p = small_params();
  ASSERT_TRUE(p.set("query_noise", "2.5").ok());
  EXPECT_EQ(p.query_noise, 2.5);
}

struct Replayed {
  Trace trace;
  std::shared_ptr<const ScoredTrace> scored;
};

Replayed scored_small(int32_t next_n = 1) {
  Replayed r{generate_workload(small_params(next_n)).value(), nullptr};
  r.scored = score_trace(r.trace).value();
  return r;
}

enum class Loop { kClosed, kOpen };  // ReplayOptions::open_loop

ReplayResult run(const Replayed& r, const std::string& predictor, double sparsity, Loop loop = Loop::kClosed) {
  ReplayOptions o;
  o.predictor = predictor;
  o.config.target_sparsity = sparsity;
  o.open_loop = loop == Loop::kOpen;
  auto result = replay(r.trace, *r.scored, o);
  EXPECT_TRUE(result.ok()) << result.status().to_string();
  return std::move(result).value();
}

TEST(Replay, AllKeepClosedLoopIsExact) {
  for (int32_t next_n : {1, 3}) {
    const Replayed r = scored_small(next_n);
    const ReplayResult all = run(r, "all-keep", 0.5);
    EXPECT_GT(all.quality.recall().count(), 0);
    EXPECT_EQ(all.quality.recall().mean(), 1.0);
    EXPECT_EQ(all.quality.miss().percentile(99), 0.0);
    EXPECT_EQ(all.quality.sparsity().mean(), 0.0);
  }
}

TEST(Replay, WarmStartObservesPrefillAndSkipsItsSamples) {
  const Replayed r = scored_small();
  const WorkloadParams p = small_params();
  ReplayOptions o;
  o.predictor = "spin";
  o.config.target_sparsity = 0.5;
  const ReplayResult warm = replay(r.trace, *r.scored, o).value();
  o.warm_start = false;
  const ReplayResult cold = replay(r.trace, *r.scored, o).value();
  EXPECT_EQ(warm.quality.samples(), int64_t{p.steps - 1} * p.layers);
  EXPECT_EQ(cold.quality.samples(), int64_t{p.steps} * p.layers);
  // A cold first step is a guess from nothing; the warm run never has one.
  EXPECT_GT(warm.quality.recall().mean(), cold.quality.recall().mean());
}

TEST(Replay, OracleBoundsEveryPredictorAndSparsityIsRealised) {
  const Replayed r = scored_small();
  const ReplayResult oracle_run = run(r, "oracle", 0.5);
  const double oracle = oracle_run.quality.recall().mean();
  const double oracle_blocks = oracle_run.quality.block_recall().mean();
  EXPECT_LT(oracle, 1.0);  // at 50 % sparsity this workload cannot be exact: the test has teeth
  for (const char* p : {"spin", "prev-iter", "ema-slot", "random", "step-reuse", "hisa"}) {
    const ReplayResult res = run(r, p, 0.5);
    EXPECT_LE(res.quality.recall().mean(), oracle + 1e-12) << p;
    EXPECT_LE(res.quality.block_recall().mean(), oracle_blocks + 1e-12) << p;
    EXPECT_NEAR(res.quality.sparsity().mean(), 0.5, 0.03) << p;  // forced/rounding keep it close
  }
  const TraceFacts facts = trace_facts(*r.scored, 64);
  EXPECT_GT(facts.topk_block_share, 0.5);  // a 6K context with k = 2048: top-k touches most blocks
  EXPECT_GT(facts.prev_step_topk_recall, 0.0);
}

TEST(Replay, OpenLoopReportsPearson) {
  const Replayed r = scored_small();
  const ReplayResult res = run(r, "prev-iter", 0.3, Loop::kOpen);
  EXPECT_GT(res.quality.pearson().count(), 0);
  EXPECT_GT(res.quality.pearson().mean(), 0.0);
  EXPECT_LE(res.quality.pearson().mean(), 1.0);
  EXPECT_GT(res.quality.topk_recall().count(), 0);
}

TEST(Replay, RejectsUnknownPredictorAndBadConfig) {
  const Replayed r = scored_small();
  ReplayOptions o;
  o.predictor = "nope";
  EXPECT_FALSE(replay(r.trace, *r.scored, o).ok());
  o.predictor = "spin";
  o.config.target_sparsity = 1.0;
  EXPECT_EQ(replay(r.trace, *r.scored, o).status().code(), StatusCode::kInvalidArgument);
}

nlohmann::json results_without_timing(const std::string& dir) {
  std::ifstream in(dir + "/results.json");
  nlohmann::json j = nlohmann::json::parse(in);
  j.erase("timing");
  return j;
}

TEST(Eval, SameSeedGivesIdenticalResultsWhateverTheThreads) {
  // A directory of its own: a fixed name under /tmp races with another checkout's test run.
  const testing::TempDir dir;
  const std::string base = dir.path() + "/spin-eval-test";
  EvalOptions o;
  o.quick = true;
  o.scenarios = {"doc-qa-10k"};
  o.out_dir = base + "-a";
  o.threads = 1;
  auto a = run_eval(o);
  ASSERT_TRUE(a.ok()) << a.status().to_string();
  o.out_dir = base + "-b";
  o.threads = 2;
  ASSERT_TRUE(run_eval(o).ok());
  EXPECT_EQ(results_without_timing(base + "-a"), results_without_timing(base + "-b"));
  EXPECT_NE(a->report_md.find("## Sparsity sweep"), std::string::npos);
  // The report opens with advise's verdict, before every table; results.json carries its fields.
  EXPECT_EQ(a->report_md.find("## Verdict"), a->report_md.find("## "));
  const nlohmann::json results = results_without_timing(base + "-a");
  EXPECT_TRUE(results["verdict"].contains("indexer_share"));
  EXPECT_TRUE(results["verdict"].contains("recommended_sparsity"));
  EXPECT_EQ(results["verdict"]["quality"].size(), 2u);  // quick: spin at 30 % and 50 % (0 % is not advice)
  EXPECT_TRUE(std::filesystem::exists(base + "-a/report.md"));
  std::filesystem::remove_all(base + "-a");
  std::filesystem::remove_all(base + "-b");
}

}  // namespace
}  // namespace spin
