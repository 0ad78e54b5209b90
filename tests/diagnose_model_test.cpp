// The paper model of a GPU decode step (spin/lab/diagnose.h): it reproduces the measurements it is
// anchored on, its gains behave (1 at sparsity 0, rising, scored-only top-k ≥ full top-k), the
// budget floor shows in the realised sparsity, and bad input is refused.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "spin/lab/diagnose.h"

namespace spin {
namespace {

DiagnoseInput input(const std::string& gpu, int64_t context, int32_t batch) {
  DiagnoseInput in;
  in.model = model_preset("deepseek-v3.2").value();
  in.gpu = gpu_preset(gpu).value();
  in.context = context;
  in.batch = batch;
  return in;
}

TEST(Diagnose, ReproducesTheH200Anchors) {
  // DeepGEMM paged logits, B=64, 64K: 0.149 ms per layer; fast_topk_v2 0.037 ms at B=1 (77 % of the
  // indexer's time with the 0.011 ms logits), 0.039 ms measured at B=64 (the model: one wave, 0.037).
  auto big = diagnose(input("h200", 65536, 64)).value();
  const double layers = big.input.model.indexer_layers;
  EXPECT_NEAR(big.indexer_ms / layers, 0.149, 0.0015);
  EXPECT_EQ(big.indexer_bound, "memory");
  auto small = diagnose(input("h200", 65536, 1)).value();
  EXPECT_NEAR(small.indexer_ms / layers, 0.011, 1e-9);
  EXPECT_EQ(small.indexer_bound, "latency");
  EXPECT_NEAR(small.topk_ms / layers, 0.037, 1e-9);
  EXPECT_NEAR(small.topk_ms / (small.topk_ms + small.indexer_ms), 0.77, 0.01);
  EXPECT_NEAR(big.topk_ms / layers, 0.037, 1e-9);
}

TEST(Diagnose, GainsRiseWithSparsityAndNeedTheScoredTopk) {
  for (const std::string& gpu : gpu_preset_names()) {
    auto r = diagnose(input(gpu, 131072, 8)).value();
    ASSERT_EQ(r.rows.size(), 7u);
    EXPECT_DOUBLE_EQ(r.rows[0].gain_scored, 1.0);
    EXPECT_DOUBLE_EQ(r.rows[0].gain_full, 1.0);
    for (size_t i = 1; i < r.rows.size(); ++i) {
      EXPECT_GT(r.rows[i].gain_scored, r.rows[i - 1].gain_scored) << gpu;
      EXPECT_GE(r.rows[i].gain_scored, r.rows[i].gain_full) << gpu;
      EXPECT_LE(r.rows[i].realised_sparsity, r.rows[i].target_sparsity + 1e-12);
    }
    EXPECT_GT(r.indexer_share, 0.0);
    EXPECT_LT(r.indexer_share + r.topk_share, 1.0);
    EXPECT_FALSE(r.sources.empty());
  }
}

TEST(Diagnose, BudgetFloorAndOtherTime) {
  // 4K context = 64 blocks; top-k 2048 needs 32: sparsity above 0.5 cannot be realised.
  DiagnoseInput in = input("h100", 4096, 1);
  in.sparsities = {0.6};
  auto r = diagnose(in).value();
  EXPECT_NEAR(r.rows[0].realised_sparsity, 0.5, 1e-12);
  in.other_ms = 20.0;
  auto with_other = diagnose(in).value();
  EXPECT_LT(with_other.rows[0].gain_scored, r.rows[0].gain_scored);
  EXPECT_LT(with_other.indexer_share, r.indexer_share);
  const auto j = nlohmann::json::parse(diagnose_json(with_other));
  EXPECT_EQ(j["gpu"], "h100");
  EXPECT_EQ(j["sparsity"].size(), 1u);
  EXPECT_FALSE(j["sources"].empty());
  EXPECT_NE(diagnose_text(with_other).find("sources:"), std::string::npos);
}

TEST(Diagnose, RefusesBadInput) {
  EXPECT_FALSE(gpu_preset("a100").ok());
  DiagnoseInput in = input("b200", 131072, 1);
  in.sparsities = {1.0};
  EXPECT_EQ(diagnose(in).status().code(), StatusCode::kInvalidArgument);
  in = input("b200", 0, 1);
  EXPECT_EQ(diagnose(in).status().code(), StatusCode::kInvalidArgument);
  in = input("b200", 1024, 1);
  in.next_n = 9;
  EXPECT_EQ(diagnose(in).status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace spin
