// Tests of PredictorConfig (validation, printing, parsing), the enum names, and the budget rules.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "spin/predict.h"

namespace spin {
namespace {

TEST(PredictConfig, DefaultsAreValidAndDocumented) {
  PredictorConfig c;
  ASSERT_TRUE(c.validate().ok()) << c.validate().to_string();
  EXPECT_DOUBLE_EQ(c.target_sparsity, 0.3);
  EXPECT_EQ(c.explicit_budget_blocks, -1);
  EXPECT_EQ(c.sink_blocks, 1);
  EXPECT_EQ(c.local_blocks, 2);
  EXPECT_DOUBLE_EQ(c.explore_ratio, 0.1);
  EXPECT_DOUBLE_EQ(c.explore_churn, 0.1);  // by ablation; see predict.h
  EXPECT_EQ(c.topk_first, 1);              // likewise
  EXPECT_EQ(c.recent_blocks, 16);          // likewise
  EXPECT_EQ(c.explore_policy, ExplorePolicy::kUniform);
  EXPECT_DOUBLE_EQ(c.alpha, 0.5);
  EXPECT_DOUBLE_EQ(c.beta, 0.1);
  EXPECT_EQ(c.combine, Combine::kWeighted);  // by ablation; see predict.h
  EXPECT_EQ(c.combine_weight, 0.8);
  EXPECT_EQ(c.pooling, Pooling::kMax);
  EXPECT_DOUBLE_EQ(c.pool_depth, 0.2);  // by ablation; see predict.h
  EXPECT_EQ(c.mtp_update, MtpUpdate::kPrefix);
  EXPECT_EQ(c.page_size, 64);
  EXPECT_EQ(c.block_pages, 1);
  EXPECT_EQ(c.topk, 2048);
  EXPECT_EQ(c.block_entries(), 64);
}

TEST(PredictConfig, ToStringIsOneLineAndParsesBack) {
  PredictorConfig c;
  c.target_sparsity = 0.45;
  c.explicit_budget_blocks = 17;
  c.explore_policy = ExplorePolicy::kStalest;
  c.alpha = 1.0 / 3.0;
  c.combine = Combine::kWeighted;
  c.pooling = Pooling::kTopkHits;
  c.mtp_update = MtpUpdate::kAllRows;
  c.seed = 0xFFFFFFFFFFFFFFFFULL;
  const std::string s = c.to_string();
  EXPECT_EQ(s.find('\n'), std::string::npos);
  EXPECT_NE(s.find("pooling=topk-hits"), std::string::npos) << s;
  EXPECT_NE(s.find("mtp_update=all-rows"), std::string::npos) << s;
  PredictorConfig d;
  ASSERT_TRUE(d.parse(s).ok()) << d.parse(s).to_string();
  EXPECT_EQ(d.to_string(), s);
  EXPECT_EQ(d.alpha, c.alpha);  // shortest round-trip printing keeps every bit
  EXPECT_EQ(d.seed, c.seed);
}

TEST(PredictConfig, SetAndParse) {
  PredictorConfig c;
  EXPECT_TRUE(c.set("topk", "512").ok());
  EXPECT_EQ(c.topk, 512);
  EXPECT_TRUE(c.set("explore_policy", "stalest").ok());
  EXPECT_EQ(c.explore_policy, ExplorePolicy::kStalest);
  EXPECT_TRUE(c.parse("alpha=0.25, beta=0.5\npooling=lse  combine=weighted").ok());
  EXPECT_EQ(c.alpha, 0.25);
  EXPECT_EQ(c.beta, 0.5);
  EXPECT_EQ(c.pooling, Pooling::kLse);
  EXPECT_EQ(c.combine, Combine::kWeighted);

  Status s = c.set("no_such_key", "1");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("target_sparsity"), std::string::npos) << s.message();
  EXPECT_FALSE(c.set("topk", "12x").ok());
  EXPECT_FALSE(c.set("topk", "").ok());
  EXPECT_FALSE(c.set("topk", "99999999999").ok());
  EXPECT_FALSE(c.set("alpha", "nan").ok());
  EXPECT_FALSE(c.set("alpha", "0.5.1").ok());
  EXPECT_FALSE(c.set("seed", "-1").ok());
  s = c.set("pooling", "median");
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("max, mean, topk-hits, lse"), std::string::npos) << s.message();
  EXPECT_FALSE(c.parse("alpha").ok());
  EXPECT_FALSE(c.parse("=3").ok());
}

// The paper's SPIN by name (arXiv 2610.09025): α 0.5, 5 % uniform exploration every step, max
// pooling of the best score, and none of spin's additions; budget and geometry untouched.
TEST(PredictConfig, PaperPresetIsThePublishedSpin) {
  PredictorConfig c;
  c.target_sparsity = 0.5;
  c.topk = 512;
  c.alpha = 0.9;
  ASSERT_TRUE(c.apply_preset("paper").ok());
  EXPECT_DOUBLE_EQ(c.alpha, 0.5);
  EXPECT_DOUBLE_EQ(c.explore_ratio, 0.05);
  EXPECT_DOUBLE_EQ(c.explore_churn, 0.0);
  EXPECT_EQ(c.explore_policy, ExplorePolicy::kUniform);
  EXPECT_EQ(c.pooling, Pooling::kMax);
  EXPECT_DOUBLE_EQ(c.pool_depth, 0.0);
  EXPECT_EQ(c.topk_first, 0);
  EXPECT_EQ(c.recent_blocks, 0);
  EXPECT_EQ(c.budget_moves, BudgetMoves::kNone);
  EXPECT_DOUBLE_EQ(c.target_sparsity, 0.5);
  EXPECT_EQ(c.topk, 512);
  EXPECT_TRUE(c.validate().ok());

  // "preset=" in a settings string applies in order: later pairs override it, earlier ones not.
  PredictorConfig d;
  ASSERT_TRUE(d.parse("explore_ratio=0.3 preset=paper recent_blocks=4").ok());
  EXPECT_DOUBLE_EQ(d.explore_ratio, 0.05);
  EXPECT_EQ(d.recent_blocks, 4);
  // to_string prints fields, not the preset, and reads back the same config.
  PredictorConfig e;
  ASSERT_TRUE(e.parse(c.to_string()).ok());
  EXPECT_EQ(e.to_string(), c.to_string());

  // "default" undoes it: every field back to PredictorConfig{}'s but the ones no preset sets.
  ASSERT_TRUE(c.apply_preset("default").ok());
  PredictorConfig expect;
  expect.target_sparsity = 0.5;
  expect.topk = 512;
  EXPECT_EQ(c.to_string(), expect.to_string());
  EXPECT_EQ(preset_names(), (std::vector<std::string>{"default", "paper"}));
}

TEST(PredictConfig, UnknownPresetNamesTheKnownOnes) {
  PredictorConfig c;
  const std::string before = c.to_string();
  const Status s = c.set("preset", "papers");
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("unknown preset 'papers'; supported: default, paper"), std::string::npos)
      << s.message();
  EXPECT_EQ(c.to_string(), before);
  EXPECT_NE(c.set("nope", "1").message().find("preset, target_sparsity"), std::string::npos);
}

TEST(PredictConfig, EnumNamesRoundTrip) {
  for (Pooling v : {Pooling::kMax, Pooling::kMean, Pooling::kTopkHits, Pooling::kLse})
    EXPECT_EQ(pooling_from_name(pooling_name(v)).value(), v);
  for (ExplorePolicy v : {ExplorePolicy::kUniform, ExplorePolicy::kStalest})
    EXPECT_EQ(explore_policy_from_name(explore_policy_name(v)).value(), v);
  for (Combine v : {Combine::kMax, Combine::kWeighted})
    EXPECT_EQ(combine_from_name(combine_name(v)).value(), v);
  for (MtpUpdate v : {MtpUpdate::kPrefix, MtpUpdate::kRow0, MtpUpdate::kAllRows})
    EXPECT_EQ(mtp_update_from_name(mtp_update_name(v)).value(), v);
  EXPECT_STREQ(pooling_name(Pooling::kTopkHits), "topk-hits");
  EXPECT_STREQ(mtp_update_name(MtpUpdate::kAllRows), "all-rows");
  EXPECT_FALSE(explore_policy_from_name("Uniform").ok());  // names are exact
  EXPECT_FALSE(combine_from_name("").ok());
  EXPECT_FALSE(mtp_update_from_name("row1").ok());
}

TEST(PredictConfig, ValidateRejectsEachBadField) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  struct Case {
    const char* what;
    void (*mutate)(PredictorConfig&);
  };
  const Case cases[] = {
      {"target_sparsity", [](PredictorConfig& c) { c.target_sparsity = 1.0; }},
      {"target_sparsity", [](PredictorConfig& c) { c.target_sparsity = -0.01; }},
      {"explicit_budget_blocks", [](PredictorConfig& c) { c.explicit_budget_blocks = -2; }},
      {"sink_blocks", [](PredictorConfig& c) { c.sink_blocks = -1; }},
      {"local_blocks", [](PredictorConfig& c) { c.local_blocks = -1; }},
      {"explore_ratio", [](PredictorConfig& c) { c.explore_ratio = 1.5; }},
      {"explore_churn", [](PredictorConfig& c) { c.explore_churn = -0.1; }},
      {"explore_churn", [](PredictorConfig& c) { c.explore_churn = 1.5; }},
      {"topk_first", [](PredictorConfig& c) { c.topk_first = 2; }},
      {"recent_blocks", [](PredictorConfig& c) { c.recent_blocks = -1; }},
      {"recent_blocks", [](PredictorConfig& c) { c.recent_blocks = kMaxRecentBlocks + 1; }},
      {"pool_depth", [](PredictorConfig& c) { c.pool_depth = -0.1; }},
      {"pool_depth", [](PredictorConfig& c) { c.pool_depth = 1.5; }},
      {"alpha", [](PredictorConfig& c) { c.alpha = 0.0; }},
      {"alpha", [](PredictorConfig& c) { c.alpha = 1.01; }},
      {"beta", [](PredictorConfig& c) { c.beta = 0.0; }},
      {"combine_weight", [](PredictorConfig& c) { c.combine_weight = -0.5; }},
      {"page_size", [](PredictorConfig& c) { c.page_size = 0; }},
      {"block_pages", [](PredictorConfig& c) { c.block_pages = 0; }},
      {"exceeds", [](PredictorConfig& c) { c.page_size = 4096, c.block_pages = 1024; }},
      {"topk", [](PredictorConfig& c) { c.topk = 0; }},
      {"pooling", [](PredictorConfig& c) { c.pooling = static_cast<Pooling>(9); }},
      {"explore_policy",
       [](PredictorConfig& c) { c.explore_policy = static_cast<ExplorePolicy>(7); }},
      {"combine", [](PredictorConfig& c) { c.combine = static_cast<Combine>(7); }},
      {"mtp_update", [](PredictorConfig& c) { c.mtp_update = static_cast<MtpUpdate>(7); }},
  };
  for (const Case& k : cases) {
    PredictorConfig c;
    k.mutate(c);
    const Status s = c.validate();
    EXPECT_EQ(s.code(), StatusCode::kInvalidArgument) << k.what;
    EXPECT_NE(s.message().find(k.what), std::string::npos) << s.message();
  }
  PredictorConfig c;
  c.target_sparsity = nan;
  EXPECT_FALSE(c.validate().ok());
  c = PredictorConfig{};
  c.alpha = nan;
  EXPECT_FALSE(c.validate().ok());
  c = PredictorConfig{};
  c.explicit_budget_blocks = 0;  // allowed: clamps up to what top-k needs
  EXPECT_TRUE(c.validate().ok());
}

TEST(PredictBudget, Rules) {
  PredictorConfig c;  // topk 2048, E 64: top-k needs 32 blocks; forced 3
  EXPECT_EQ(blocks_for_topk(c), 32);
  EXPECT_EQ(budget_blocks(c, 0), 0);
  EXPECT_EQ(budget_blocks(c, 10), 10);      // n ≤ 32: every block
  EXPECT_EQ(budget_blocks(c, 40), 32);      // 0.7·40 = 28 → clamped up to 32
  EXPECT_EQ(budget_blocks(c, 100), 70);     // exactly 70, not 71 (float guard)
  EXPECT_EQ(budget_blocks(c, 2048), 1434);  // ceil(1433.6)
  c.target_sparsity = 0.5;
  EXPECT_EQ(budget_blocks(c, 101), 51);
  c.explicit_budget_blocks = 5;
  EXPECT_EQ(budget_blocks(c, 100), 32);
  c.explicit_budget_blocks = 60;
  EXPECT_EQ(budget_blocks(c, 100), 60);
  c.explicit_budget_blocks = 600;
  EXPECT_EQ(budget_blocks(c, 100), 100);
  // Forced blocks always fit: topk 1 needs one block, but 3 sinks + 4 locals are forced.
  PredictorConfig f;
  f.topk = 1;
  f.sink_blocks = 3;
  f.local_blocks = 4;
  f.target_sparsity = 0.99;
  EXPECT_EQ(budget_blocks(f, 100), 7);
  f.page_size = 10;
  f.target_sparsity = 0.3;
  EXPECT_EQ(budget_blocks(f, 10), 7);
  f.topk = 1000;  // needs 100 blocks of 10 entries
  EXPECT_EQ(budget_blocks(f, 150), 105);
  EXPECT_EQ(budget_blocks(f, 120), 100);
}

TEST(PredictBudget, Visibility) {
  EXPECT_EQ(visible_entries(100, 1, 0), 100);
  EXPECT_EQ(visible_entries(100, 4, 0), 97);
  EXPECT_EQ(visible_entries(100, 4, 3), 100);
  EXPECT_EQ(visible_entries(2, 4, 0), 0);  // clamped at 0
  EXPECT_EQ(visible_entries(0, 1, 0), 0);
  PredictorConfig c;
  c.page_size = 16;
  c.block_pages = 2;
  EXPECT_EQ(blocks_for_entries(c, 0), 0);
  EXPECT_EQ(blocks_for_entries(c, 1), 1);
  EXPECT_EQ(blocks_for_entries(c, 32), 1);
  EXPECT_EQ(blocks_for_entries(c, 33), 2);
}

}  // namespace
}  // namespace spin
