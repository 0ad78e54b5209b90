// spin diagnose's GPU cost model: it reproduces the published figures it is fitted to, moves the
// right way with sparsity, batch and the top-k's input, and refuses inputs it cannot model.
#include <gtest/gtest.h>

#include <cmath>

#include "spin/diagnose.h"

namespace spin {
namespace {

DiagnoseInput v32_on(const std::string& gpu, int64_t context, int32_t batch) {
  DiagnoseInput in;
  in.model = model_preset("deepseek-v3.2").value();
  in.gpu = gpu_preset(gpu).value();
  in.context = context;
  in.batch = batch;
  return in;
}

// The anchors of the fit: DeepGEMM's paged logits at 64K on an H200 (0.011 / 0.149 ms) and
// fast_topk_v2 (0.037 ms); their sum × 61 layers is the 2.9 / 11.5 ms per step of peers.md §4.
TEST(Diagnose, ReproducesThePublishedH200Figures) {
  const DiagnoseResult b1 = diagnose(v32_on("h200", 65536, 1)).value();
  const DiagnoseResult b64 = diagnose(v32_on("h200", 65536, 64)).value();
  EXPECT_NEAR(b1.rows[0].scored_topk.indexer_us, 11.0, 0.05);
  EXPECT_NEAR(b64.rows[0].scored_topk.indexer_us, 149.0, 0.05);
  EXPECT_NEAR(b1.rows[0].scored_topk.topk_us, 37.0, 0.05);
  const double step_b1 = (b1.rows[0].scored_topk.indexer_us + b1.rows[0].scored_topk.topk_us) * 61 / 1e3;
  const double step_b64 = (b64.rows[0].scored_topk.indexer_us + b64.rows[0].scored_topk.topk_us) * 61 / 1e3;
  EXPECT_NEAR(step_b1, 2.9, 0.15);
  EXPECT_NEAR(step_b64, 11.5, 0.5);
  EXPECT_GT(b1.topk_share_of_indexer, 0.7);  // "at batch 1 the top-k is ~77 % of the indexer's time"
}

TEST(Diagnose, SkippingPaysOnlyWhenTheTopkReadsTheScoredEntries) {
  for (int32_t batch : {1, 8, 64}) {
    const DiagnoseResult r = diagnose(v32_on("h200", 131072, batch)).value();
    ASSERT_EQ(r.rows.size(), 6u);
    EXPECT_EQ(r.rows[0].speedup_scored, 1.0);
    for (size_t i = 1; i < r.rows.size(); ++i) {
      EXPECT_GT(r.rows[i].speedup_scored, r.rows[i - 1].speedup_scored) << batch;
      EXPECT_GE(r.rows[i].speedup_full, r.rows[i - 1].speedup_full) << batch;
      EXPECT_GT(r.rows[i].speedup_scored, r.rows[i].speedup_full) << batch;
      EXPECT_EQ(r.rows[i].scored_topk.attention_us, r.rows[0].scored_topk.attention_us);  // top-k size fixed
    }
  }
  // At batch 1 the full-row top-k dominates: skipping half the blocks gains under 5 %.
  EXPECT_LT(diagnose(v32_on("h200", 131072, 1)).value().rows[3].speedup_full, 1.05);
}

TEST(Diagnose, BandwidthAndMtpMoveTheIndexer) {
  const double h100 = diagnose(v32_on("h100", 131072, 64)).value().rows[0].scored_topk.indexer_us;
  const double h200 = diagnose(v32_on("h200", 131072, 64)).value().rows[0].scored_topk.indexer_us;
  const double b200 = diagnose(v32_on("b200", 131072, 64)).value().rows[0].scored_topk.indexer_us;
  EXPECT_GT(h100, h200);
  EXPECT_GT(h200, b200);
  DiagnoseInput mtp = v32_on("h200", 131072, 64);
  mtp.next_n = 4;  // 4 rows per key read: FP8 compute, not bandwidth, now bounds the indexer
  const double mtp_us = diagnose(mtp).value().rows[0].scored_topk.indexer_us;
  EXPECT_GT(mtp_us, 1.2 * h200);
  EXPECT_LT(mtp_us, 2.0 * h200);  // the rows share one read of the keys (MQA)
}

TEST(Diagnose, RefusesWhatItCannotModel) {
  EXPECT_FALSE(gpu_preset("a100").ok());
  DiagnoseInput in = v32_on("h200", 131072, 1);
  in.context = 0;
  EXPECT_FALSE(diagnose(in).ok());
  in = v32_on("h200", 131072, 0);
  EXPECT_FALSE(diagnose(in).ok());
  in = v32_on("h200", 131072, 1);
  in.sparsities = {0.5, 1.0};
  EXPECT_FALSE(diagnose(in).ok());
  in.sparsities = {0.5, std::nan("")};
  EXPECT_FALSE(diagnose(in).ok());
  in = v32_on("h200", 131072, 1);
  in.model = model_preset("deepseek-v4-flash").value();
  in.context = 3;  // below one entry at compress ratio 4
  EXPECT_FALSE(diagnose(in).ok());
}

}  // namespace
}  // namespace spin
