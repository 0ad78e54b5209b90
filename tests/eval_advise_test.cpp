// `spin advise`'s model and rule (spin/lab/advise.h; an eval_ test because the spread over requests
// is spin_eval's, with its nearest-rank percentiles): the paper's config, the spread over requests,
// the rest of the step and spin's own cost, and the recommendation — a stricter tolerance never
// recommends a higher sparsity (a property over random per-request qualities), an indexer share
// below kMinIndexerShare cannot pay, bad input is one clear error.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <random>

#include "spin/lab/advise.h"

namespace spin {
namespace {

const std::vector<double> kSparsities = {0.2, 0.3, 0.4, 0.5, 0.6, 0.7};

TEST(AdviseConfig, PaperSpinIsTheLibrarysPaperPreset) {
  const PredictorConfig paper = paper_spin_config();
  EXPECT_TRUE(paper.validate().ok());
  PredictorConfig preset;
  ASSERT_TRUE(preset.apply_preset("paper").ok());
  EXPECT_EQ(config_overrides(paper), config_overrides(preset));
  EXPECT_FALSE(config_overrides(paper).empty());
  EXPECT_TRUE(config_overrides(PredictorConfig{}).empty());
}

TEST(AdviseSpread, MedianTenPercentFromWorstAndWorst) {
  std::vector<double> v;
  for (int i = 1; i <= 20; ++i) v.push_back(i / 20.0);
  const Spread recall = spread_of(v, /*higher_is_better=*/true);
  EXPECT_DOUBLE_EQ(recall.worst, 0.05);
  EXPECT_DOUBLE_EQ(recall.p10, 0.10);    // the 2nd worst of 20
  EXPECT_DOUBLE_EQ(recall.median, 0.50);  // nearest rank 10 of 20
  const Spread miss = spread_of(v, /*higher_is_better=*/false);
  EXPECT_DOUBLE_EQ(miss.worst, 1.0);
  EXPECT_DOUBLE_EQ(miss.p10, 0.95);
  EXPECT_DOUBLE_EQ(miss.median, 0.50);
  const Spread one = spread_of({0.3}, false);
  EXPECT_DOUBLE_EQ(one.worst, 0.3);
  EXPECT_DOUBLE_EQ(one.p10, 0.3);
  EXPECT_TRUE(std::isnan(spread_of({}, true).median));
}

TEST(AdviseStep, RestOfStepFollowsTheBatchAndTheGpus) {
  Deployment d;
  d.batch = 1;
  auto one = rest_of_step(d);
  ASSERT_TRUE(one.ok()) << one.status().to_string();
  EXPECT_NEAR(one->experts_touched_per_layer, 8.0, 1e-9);  // one token picks its 8 experts
  d.batch = 256;
  auto many = rest_of_step(d);
  ASSERT_TRUE(many.ok());
  EXPECT_GT(many->experts_touched_per_layer, 250.0);
  EXPECT_LE(many->experts_touched_per_layer, 256.0);
  EXPECT_GT(many->ms, one->ms);
  d.tensor_parallel = 16;
  auto split = rest_of_step(d);
  ASSERT_TRUE(split.ok());
  EXPECT_NEAR(split->bytes_per_gpu * 2, many->bytes_per_gpu, 1e-6 * many->bytes_per_gpu);
  EXPECT_NE(one->source.find("config.json"), std::string::npos);
  for (const std::string& m : model_preset_names()) {
    d.model = m;
    EXPECT_TRUE(rest_of_step(d).ok()) << m;
  }
}

TEST(AdviseStep, SpinOwnCostIsMeasuredOnlyWhereMeasured) {
  Deployment d;  // H200, 128K, batch 64: a grid point of bench/gpu's run
  const SpinOwnCost h200 = spin_own_cost(d, 0.5);
  EXPECT_TRUE(h200.measured);
  EXPECT_GT(h200.ms, 0.0);
  EXPECT_GT(h200.modelled_ms, 0.0);
  EXPECT_NE(h200.source.find("measured"), std::string::npos);
  d.gpu = "h100";
  const SpinOwnCost h100 = spin_own_cost(d, 0.5);
  EXPECT_FALSE(h100.measured);
  EXPECT_DOUBLE_EQ(h100.ms, h100.modelled_ms);
  EXPECT_NE(h100.source.find("modelled"), std::string::npos);
}

TEST(AdviseStep, NothingSkippedCostsSpinsOwnWork) {
  auto step = model_step(Deployment{}, {0.0, 0.5});
  ASSERT_TRUE(step.ok()) << step.status().to_string();
  EXPECT_LT(step->points[0].gain, 0.0);
  EXPECT_GT(step->points[1].gain, step->points[0].gain);
  EXPECT_GT(step->indexer_share, 0.0);
  EXPECT_LT(step->indexer_share + step->topk_share, 1.0);
}

// Random per-request p99 misses that grow with sparsity on average but not request by request:
// the rule must not assume monotone quality.
std::vector<QualityPoint> random_quality(std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<std::vector<std::vector<RequestQuality>>> results(2, std::vector<std::vector<RequestQuality>>(kSparsities.size()));
  for (auto& per_config : results) {
    for (size_t s = 0; s < kSparsities.size(); ++s) {
      for (int r = 0; r < 5; ++r) {
        const double miss = std::min(0.99, kSparsities[s] * u(rng) + 0.3 * u(rng));
        per_config[s].push_back({1.0 - miss / 3, miss, kSparsities[s]});
      }
    }
  }
  return quality_points({kConfigDefault, kConfigPaper}, kSparsities, results);
}

TEST(AdviseRule, StricterToleranceNeverRecommendsHigherSparsity) {
  auto step = model_step(Deployment{}, kSparsities);
  ASSERT_TRUE(step.ok());
  std::mt19937_64 rng(31);
  const std::vector<double> tolerances = {0.01, 0.05, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.8, 0.99};
  for (int trial = 0; trial < 50; ++trial) {
    const std::vector<QualityPoint> quality = random_quality(rng);
    double previous = -1;  // none recommended = below every sparsity
    for (double t : tolerances) {
      auto a = recommend(step.value(), quality, t);
      ASSERT_TRUE(a.ok()) << a.status().to_string();
      const double s = a->recommended_sparsity.value_or(-1);
      EXPECT_GE(s, previous) << "trial " << trial << ", tolerance " << t;
      if (a->recommended_sparsity) {
        EXPECT_LE(a->p99_miss_worst, t);
      }
      previous = s;
    }
  }
}

TEST(AdviseRule, RecommendsTheHighestSparsityWithinToleranceAndItsVllmLine) {
  auto step = model_step(Deployment{}, kSparsities);
  ASSERT_TRUE(step.ok());
  // Default: every request's p99 miss = sparsity / 2; paper: = sparsity.
  std::vector<std::vector<std::vector<RequestQuality>>> results(2, std::vector<std::vector<RequestQuality>>(kSparsities.size()));
  for (size_t s = 0; s < kSparsities.size(); ++s) {
    results[0][s] = {{0.9, kSparsities[s] / 2, kSparsities[s]}, {0.9, kSparsities[s] / 4, kSparsities[s]}};
    results[1][s] = {{0.9, kSparsities[s], kSparsities[s]}};
  }
  const auto quality = quality_points({kConfigDefault, kConfigPaper}, kSparsities, results);
  auto a = recommend(step.value(), quality, 0.3);
  ASSERT_TRUE(a.ok());
  ASSERT_TRUE(a->recommended_sparsity.has_value());
  EXPECT_DOUBLE_EQ(*a->recommended_sparsity, 0.6);
  EXPECT_EQ(a->recommended_config, kConfigDefault);
  EXPECT_DOUBLE_EQ(a->p99_miss_worst, 0.3);
  EXPECT_TRUE(a->pays) << a->verdict;
  EXPECT_EQ(a->verdict.rfind("run spin at 0.6", 0), 0u) << a->verdict;
  EXPECT_NE(a->vllm_line.find("\"target_sparsity\":0.6"), std::string::npos) << a->vllm_line;
  EXPECT_NE(a->vllm_line.find("deepseek-ai/DeepSeek-V3.2"), std::string::npos);
  // At the default sparsity the line still names it; the paper's spin names its preset.
  auto at_default = recommend(step.value(), quality, 0.15);
  ASSERT_TRUE(at_default.ok());
  EXPECT_DOUBLE_EQ(at_default->recommended_sparsity.value_or(-1), PredictorConfig{}.target_sparsity);
  EXPECT_NE(at_default->vllm_line.find("\"target_sparsity\":0.3"), std::string::npos) << at_default->vllm_line;
  auto paper_only = quality;
  for (QualityPoint& q : paper_only) q.config = kConfigPaper;
  auto paper = recommend(step.value(), paper_only, 0.3);
  ASSERT_TRUE(paper.ok());
  EXPECT_NE(paper->vllm_line.find("\"preset\":\"paper\""), std::string::npos) << paper->vllm_line;
  EXPECT_NE(paper->verdict.find("the paper's config"), std::string::npos) << paper->verdict;
  const auto j = nlohmann::json::parse(advice_json(a.value()));
  EXPECT_DOUBLE_EQ(j["recommended_sparsity"].get<double>(), 0.6);
  EXPECT_DOUBLE_EQ(j["indexer_share"].get<double>(), step->indexer_share);
  EXPECT_EQ(j["quality"].size(), 2 * kSparsities.size());
  // Nothing within a tolerance below every request's miss: no recommendation, no vllm line.
  auto none = recommend(step.value(), quality, 0.01);
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->recommended_sparsity.has_value());
  EXPECT_FALSE(none->pays);
  EXPECT_TRUE(none->vllm_line.empty());
  EXPECT_NE(none->verdict.find("do not run spin"), std::string::npos) << none->verdict;
}

TEST(AdviseRule, IndexerShareBelowThresholdCannotPay) {
  Deployment d;
  d.other_ms = 1000;  // a step dominated by the rest of the model
  auto step = model_step(d, kSparsities);
  ASSERT_TRUE(step.ok());
  ASSERT_LT(step->indexer_share, kMinIndexerShare);
  std::vector<std::vector<std::vector<RequestQuality>>> perfect(1, std::vector<std::vector<RequestQuality>>(kSparsities.size()));
  for (auto& s : perfect[0]) s = {{1.0, 0.0, 0.5}};
  auto a = recommend(step.value(), quality_points({kConfigDefault}, kSparsities, perfect), kDefaultTolerance);
  ASSERT_TRUE(a.ok());
  EXPECT_FALSE(a->pays);
  EXPECT_NE(a->verdict.find("spin cannot pay here"), std::string::npos) << a->verdict;
  EXPECT_TRUE(a->vllm_line.empty());
  // Just above the threshold with the same quality: it pays.
  d.other_ms = 0;
  auto busy = model_step(d, kSparsities);
  ASSERT_TRUE(busy.ok());
  ASSERT_GE(busy->indexer_share, kMinIndexerShare);
  auto b = recommend(busy.value(), quality_points({kConfigDefault}, kSparsities, perfect), kDefaultTolerance);
  ASSERT_TRUE(b.ok());
  EXPECT_TRUE(b->pays) << b->verdict;
}

TEST(AdviseRule, BadInputIsOneClearError) {
  auto step = model_step(Deployment{}, kSparsities);
  ASSERT_TRUE(step.ok());
  for (double t : {0.0, 1.0, -0.1, 1.5, std::nan(""), std::numeric_limits<double>::infinity()}) {
    auto a = recommend(step.value(), {}, t);
    EXPECT_FALSE(a.ok()) << t;
    if (!a.ok()) {
      EXPECT_NE(a.status().message().find("tolerance"), std::string::npos) << a.status().message();
    }
  }
  Deployment d;
  d.model = "gpt-5";
  EXPECT_NE(d.validate().message().find("unknown model preset 'gpt-5'"), std::string::npos) << d.validate().message();
  d = Deployment{};
  d.gpu = "a100";
  EXPECT_NE(d.validate().message().find("unknown GPU preset 'a100'"), std::string::npos) << d.validate().message();
  EXPECT_FALSE(model_step(d, kSparsities).ok());
  // A quality point at a sparsity the step model lacks.
  std::vector<std::vector<std::vector<RequestQuality>>> r(1, std::vector<std::vector<RequestQuality>>(1, {{1, 0, 0.9}}));
  EXPECT_FALSE(recommend(step.value(), quality_points({kConfigDefault}, {0.9}, r), 0.5).ok());
}

TEST(AdviseRule, TraceOfAnotherGeometryIsRefusedByName) {
  const ModelPreset v32 = model_preset("deepseek-v3.2").value();
  TraceMeta meta;
  meta.topk = 2048;
  meta.page_size = 64;
  meta.compress_ratio = 1;
  EXPECT_TRUE(check_trace_geometry("a.st", meta, v32).ok());
  meta.topk = 512;
  meta.compress_ratio = 4;
  const Status s = check_trace_geometry("a.st", meta, v32);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("a.st"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("top-k 512"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("deepseek-v3.2"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace spin
