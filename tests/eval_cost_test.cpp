// Cost accounting: every predictor's work_fraction hand-checked on a small
// trace — fine entries scored plus probe entry-equivalents over the visible entries — and the
// timed part (select/observe overhead) finite, non-negative, and added on top.
#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "spin/predict.h"
#include "spin/lab/replay.h"
#include "spin/lab/workload.h"

namespace spin {
namespace {

struct Expected {
  double scored = 0, probe = 0, visible = 0;
};

// What each predictor must cost at target sparsity 0.5 with 64-entry blocks, one sink and two
// local blocks: a budgeted row scores its budget's full blocks plus the newest, partial block (always
// forced); a full row scores everything; a probing row scores one pooled key per visible block.
Expected expected_cost(const std::string& name, const Trace& trace, const PredictorConfig& c) {
  Expected e;
  const int32_t layers = trace.meta.num_layers;
  for (int64_t s = 1; s < trace.steps(); ++s) {  // step 0 is the prefill, not a sample
    const int64_t v = trace.ctx_len[static_cast<size_t>(s)];
    const int64_t n = (v + 63) / 64;
    const int64_t newest = v - (n - 1) * 64;
    const int64_t budgeted = (budget_blocks(c, n) - 1) * 64 + newest;
    for (int32_t l = 0; l < layers; ++l) {
      const bool full_layer = l % 2 == 0;
      const bool full = name == "all-keep" || (name.starts_with("indexcache") && full_layer);
      const bool probes = name == "hisa" || name == "spin-hybrid" || (name == "spin-hybrid-ic2" && full_layer);
      e.scored += static_cast<double>(full ? v : budgeted);
      e.probe += probes ? static_cast<double>(n) : 0.0;
      e.visible += static_cast<double>(v);
    }
  }
  return e;
}

TEST(EvalCost, WorkFractionOfEveryPredictorByHand) {
  WorkloadParams p = scenario_params("doc-qa-10k").value();
  p.prompt_tokens = 1000;  // 16 blocks, the newest partial
  p.steps = 5;
  p.layers = 2;
  p.num_heads = 4;
  p.topk = 64;
  const Trace trace = generate_workload(p).value();
  const auto scored = score_trace(trace).value();
  for (const std::string& name : predictor_names()) {
    if (name == "indexcache-4") continue;  // 2 layers: every layer but 0 shares, checked as -2
    ReplayOptions o;
    o.predictor = name;
    o.config.target_sparsity = 0.5;
    const ReplayResult r = replay(trace, *scored, o).value();
    PredictorConfig c = o.config;
    c.page_size = 64;
    c.topk = 64;
    const Expected e = expected_cost(name, trace, c);
    EXPECT_EQ(r.quality.visible_entries_sum(), e.visible) << name;
    EXPECT_DOUBLE_EQ(r.quality.work_fraction(), (e.scored + e.probe) / e.visible) << name;
    EXPECT_DOUBLE_EQ(r.quality.probe_fraction(), e.probe / e.visible) << name;
    EXPECT_GT(r.indexer_entry_seconds, 0.0);
    EXPECT_GE(r.overhead_fraction(), 0.0) << name;
    EXPECT_TRUE(std::isfinite(r.cost_fraction())) << name;
    EXPECT_DOUBLE_EQ(r.cost_fraction(), r.quality.work_fraction() + r.overhead_fraction());
  }
}

}  // namespace
}  // namespace spin
