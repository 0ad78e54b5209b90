// Tests of speculative decoding (MTP) and of the select → observe → commit protocol: per-row
// visibility and sets, the union, prefix-valid replay of rows 0..a in order versus row0 and
// all-rows, every misuse error (and that an error changes nothing), fork and reset.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <vector>

#include "predict/block_state.h"
#include "predict_testing.h"
#include "spin/predict.h"

namespace spin {
namespace {

using testing::observe_union;
using testing::state_of;

PredictorConfig mtp_config(MtpUpdate mode) {
  PredictorConfig c = testing::small_blocks_config(1, 1);
  c.alpha = 0.25;  // not 0.5, so that the replay order shows in the EMA
  c.mtp_update = mode;
  return c;
}

std::unique_ptr<BlockPredictor> make(const char* name, const PredictorConfig& c, int32_t layers = 1) {
  return testing::make_checked(name, c, layers, 3);
}

// Row j of a 41-entry step with next_n 3 sees 39, 40, 41 entries: blocks 0..9, 0..9, 0..10.
// Its scores: entry pos holds ((3 + 2j)·pos + 5j) mod 13, so each row pools differently (a mere
// shift or scale per row would not: the normalisation removes both).
std::vector<std::vector<float>> mtp_scores(int64_t entries, int32_t next_n) {
  std::vector<std::vector<float>> full(static_cast<size_t>(next_n));
  for (int32_t j = 0; j < next_n; ++j)
    for (int64_t p = 0; p < entries; ++p)
      full[static_cast<size_t>(j)].push_back(static_cast<float>(((3 + 2 * j) * p + 5 * j) % 13));
  return full;
}

TEST(PredictMtp, RowsHaveTheirOwnVisibilityAndTheUnionCoversThem) {
  auto p = make("spin", mtp_config(MtpUpdate::kPrefix));
  Selection sel;
  ASSERT_TRUE(p->select(0, {0, 41, 3}, &sel).ok());
  ASSERT_EQ(sel.row_blocks.size(), 3u);
  EXPECT_EQ(sel.row_budget, (std::vector<int32_t>{5, 5, 6}));  // ceil(0.5·10), ceil(0.5·11)
  EXPECT_EQ(sel.row_blocks[0].back(), 9);                      // each row's newest block is forced
  EXPECT_EQ(sel.row_blocks[2].back(), 10);
  std::vector<int32_t> u;
  for (const auto& r : sel.row_blocks) u.insert(u.end(), r.begin(), r.end());
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  EXPECT_EQ(sel.blocks, u);
}

// Pools row j the way observe() will, to compute the expected EMAs by hand.
PooledRow pooled(const PredictorConfig& c, const std::vector<float>& full, int64_t visible,
                 const std::vector<int32_t>& blocks) {
  const std::vector<float> row = testing::masked_row(full, visible, blocks, c.block_entries());
  RowScores r{row.data(),    static_cast<int64_t>(row.size()),    visible,
              blocks.data(), static_cast<int64_t>(blocks.size()), nullptr};
  PooledRow out;
  EXPECT_TRUE(pool_row(c, r, &out).ok());
  return out;
}

float x_of(const PooledRow& r, int32_t b) {
  for (size_t i = 0; i < r.blocks.size(); ++i)
    if (r.blocks[i] == b) return r.x[i];
  ADD_FAILURE() << "block " << b << " not observed";
  return 0;
}

TEST(PredictMtp, ReplayModes) {
  const auto full = mtp_scores(41, 3);
  for (MtpUpdate mode : {MtpUpdate::kPrefix, MtpUpdate::kRow0, MtpUpdate::kAllRows}) {
    for (int32_t accepted = 0; accepted < 3; ++accepted) {
      const PredictorConfig c = mtp_config(mode);
      auto p = make("ema-slot", c);
      Selection sel;
      ASSERT_TRUE(p->select(0, {5, 41, 3}, &sel).ok());
      ASSERT_TRUE(observe_union(*p, 0, sel, full, 41, 3).ok());
      // Nothing is applied before commit.
      EXPECT_FALSE(state_of(*p, 0).seen(0));
      ASSERT_TRUE(p->commit(accepted).ok());
      int32_t last = accepted;
      if (mode == MtpUpdate::kRow0) last = 0;
      if (mode == MtpUpdate::kAllRows) last = 2;
      std::vector<PooledRow> rows;
      for (int32_t j = 0; j < 3; ++j) rows.push_back(pooled(c, full[j], 39 + j, sel.blocks));
      // Block 0 (a sink, seen by every row): EMA over rows 0..last in order.
      // (At binary16, the state's precision: block_state.h.)
      float want = round_to_half(x_of(rows[0], 0));
      for (int32_t j = 1; j <= last; ++j)
        want = round_to_half(0.75f * want + 0.25f * round_to_half(x_of(rows[j], 0)));
      EXPECT_EQ(state_of(*p, 0).slot(0), want) << mtp_update_name(mode) << " a=" << accepted;
      if (last == 1) {  // the order shows: rows 1 then 0 would give another value
        const float reversed = 0.75f * x_of(rows[1], 0) + 0.25f * x_of(rows[0], 0);
        EXPECT_GT(std::abs(reversed - want), 1e-3);
      }
      EXPECT_EQ(state_of(*p, 0).last_seen(0), 5);
      // Block 10 is visible to row 2 only.
      EXPECT_EQ(state_of(*p, 0).seen(10), last == 2) << mtp_update_name(mode) << " a=" << accepted;
      // Offset distance 0: one update per replayed row.
      EXPECT_EQ(state_of(*p, 0).offset_updates(0), last + 1);
    }
  }
}

TEST(PredictMtp, ProtocolErrors) {
  const PredictorConfig c = mtp_config(MtpUpdate::kPrefix);
  auto p = make("spin", c, 2);
  const auto full = mtp_scores(41, 2);
  Selection sel;
  std::vector<float> row(41, 1.0f);
  RowScores rs{row.data(), 41, 40, nullptr, 0, nullptr};

  // Nothing open.
  Status s = p->commit(0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("nothing pending"), std::string::npos) << s.message();
  EXPECT_EQ(p->observe(0, 0, rs).code(), StatusCode::kFailedPrecondition);

  // Bad inputs to select.
  EXPECT_EQ(p->select(2, {0, 41, 2}, &sel).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->select(0, {0, 41, 5}, &sel).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->select(0, {0, 41, 0}, &sel).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->select(0, {-1, 41, 2}, &sel).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->select(0, {int64_t{1} << 31, 41, 2}, &sel).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->select(0, {0, -1, 2}, &sel).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(p->select(0, {0, 41, 2}, nullptr).code(), StatusCode::kInvalidArgument);

  ASSERT_TRUE(p->select(0, {0, 41, 2}, &sel).ok());
  // Same layer twice, another step, another next_n while step 0 is open.
  EXPECT_EQ(p->select(0, {0, 41, 2}, &sel).code(), StatusCode::kFailedPrecondition);
  s = p->select(1, {1, 42, 2}, &sel);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("commit"), std::string::npos) << s.message();
  EXPECT_EQ(p->select(1, {0, 41, 1}, &sel).code(), StatusCode::kInvalidArgument);
  // Observe: unselected layer, bad row, wrong visible count, non-finite scores.
  EXPECT_EQ(p->observe(1, 0, rs).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(p->observe(0, 2, rs).code(), StatusCode::kInvalidArgument);
  rs.visible_entries = 41;
  EXPECT_EQ(p->observe(0, 0, rs).code(), StatusCode::kInvalidArgument);  // row 0 sees 40, not 41
  std::vector<int32_t> b0 = {0};
  row[2] = std::numeric_limits<float>::quiet_NaN();
  RowScores bad{row.data(), 41, 40, b0.data(), 1, nullptr};
  s = p->observe(0, 0, bad);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("position 2 (block 0)"), std::string::npos) << s.message();
  // Commit with a row unobserved.
  std::vector<float> r0 = testing::masked_row(full[0], 40, sel.blocks, 4);
  RowScores again{r0.data(), 41, 40, sel.blocks.data(), static_cast<int64_t>(sel.blocks.size()),
                  nullptr};
  ASSERT_TRUE(p->observe(0, 0, again).ok());
  s = p->commit(0);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("layer 0 row 1"), std::string::npos) << s.message();
  // Row 0 twice.
  EXPECT_EQ(p->observe(0, 0, again).code(), StatusCode::kFailedPrecondition);
  std::vector<float> r1 = testing::masked_row(full[1], 41, sel.blocks, 4);
  RowScores row1{r1.data(), 41, 41, sel.blocks.data(), static_cast<int64_t>(sel.blocks.size()),
                 nullptr};
  ASSERT_TRUE(p->observe(0, 1, row1).ok());
  EXPECT_EQ(p->commit(2).code(), StatusCode::kInvalidArgument);  // accepted ≤ next_n - 1
  EXPECT_EQ(p->commit(-1).code(), StatusCode::kInvalidArgument);
  // None of the errors changed anything: the step commits cleanly.
  EXPECT_FALSE(state_of(*p, 0).seen(0));
  ASSERT_TRUE(p->commit(1).ok());
  EXPECT_TRUE(state_of(*p, 0).seen(0));
  // Twice.
  s = p->commit(1);
  EXPECT_EQ(s.code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(s.message().find("already committed"), std::string::npos) << s.message();
  // Steps must increase.
  EXPECT_EQ(p->select(0, {0, 43, 2}, &sel).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p->select(0, {2, 43, 2}, &sel).ok());  // gaps are fine
}

TEST(PredictMtp, PlainDecodeNeedsCommitToo) {
  auto p = make("ema-slot", mtp_config(MtpUpdate::kPrefix));
  Selection sel;
  ASSERT_TRUE(p->select(0, {0, 40, 1}, &sel).ok());
  ASSERT_TRUE(observe_union(*p, 0, sel, mtp_scores(40, 1), 40, 1).ok());
  EXPECT_EQ(p->select(0, {1, 41, 1}, &sel).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p->commit(0).ok());
  ASSERT_TRUE(p->select(0, {1, 41, 1}, &sel).ok());
}

TEST(PredictMtp, ForkAndReset) {
  const PredictorConfig c = mtp_config(MtpUpdate::kPrefix);
  auto p = make("spin", c);
  Selection sel;
  const auto full = mtp_scores(80, 1);
  ASSERT_TRUE(p->select(0, {0, 80, 1}, &sel).ok());
  // Forking with a step open is refused.
  EXPECT_EQ(p->fork(9, -1).status().code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(observe_union(*p, 0, sel, full, 80, 1).ok());
  ASSERT_TRUE(p->commit(0).ok());
  EXPECT_EQ(p->fork(9, -2).status().code(), StatusCode::kInvalidArgument);

  auto whole = p->fork(9, -1);
  ASSERT_TRUE(whole.ok());
  BlockPredictor& child = *whole.value();
  EXPECT_EQ(child.request_id(), 9);
  EXPECT_EQ(state_of(child, 0).n_blocks(), 20);
  EXPECT_EQ(state_of(child, 0).slot(19), state_of(*p, 0).slot(19));
  // The child numbers its own steps and evolves independently.
  ASSERT_TRUE(child.select(0, {0, 84, 1}, &sel).ok());
  ASSERT_TRUE(observe_union(child, 0, sel, mtp_scores(84, 1), 84, 1).ok());
  ASSERT_TRUE(child.commit(0).ok());
  EXPECT_EQ(state_of(child, 0).last_seen(20), 0);
  EXPECT_EQ(state_of(*p, 0).n_blocks(), 20);

  auto prefix = p->fork(10, 30);  // shares 30 entries: blocks 0..7 (7 partially)
  ASSERT_TRUE(prefix.ok());
  EXPECT_EQ(state_of(*prefix.value(), 0).n_blocks(), 8);
  EXPECT_EQ(prefix.value()->memory_bytes(),
            8 * kStateBytesPerBlock + state_of(*p, 0).n_offset_buckets() * kStateBytesPerOffsetBucket);

  p->reset();
  EXPECT_EQ(state_of(*p, 0).n_blocks(), 0);
  EXPECT_EQ(p->memory_bytes(), 0u);
  EXPECT_EQ(p->commit(0).code(), StatusCode::kFailedPrecondition);
  ASSERT_TRUE(p->select(0, {0, 80, 1}, &sel).ok());  // step 0 again after a reset
}

}  // namespace
}  // namespace spin
