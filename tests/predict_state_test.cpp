// Tests of BlockState: the offset bucket function, slot and offset EMAs on hand-computed sequences,
// growth, memory accounting, reset and copies.
#include <gtest/gtest.h>

#include <vector>

#include "predict/block_state.h"

namespace spin {
namespace {

// The slot EMA is binary16 (block_state.h): x taken at it, the float32 update rounded to it.
float h(float x) { return round_to_half(x); }
float ema(float old, float x, float alpha) { return h((1.0f - alpha) * old + alpha * h(x)); }

PooledRow make_row(int64_t newest, std::vector<int32_t> blocks, std::vector<float> x) {
  PooledRow r;
  r.newest_block = newest;
  r.visible_entries = (newest + 1) * 64;
  r.blocks = std::move(blocks);
  r.x = std::move(x);
  r.topk_hits.assign(r.blocks.size(), 0);
  return r;
}

TEST(PredictState, OffsetBuckets) {
  for (int64_t d = 0; d < 64; ++d) EXPECT_EQ(offset_bucket(d), d);
  // 64..127: four buckets of 16; 128..255: four of 32.
  EXPECT_EQ(offset_bucket(64), 64);
  EXPECT_EQ(offset_bucket(79), 64);
  EXPECT_EQ(offset_bucket(80), 65);
  EXPECT_EQ(offset_bucket(96), 66);
  EXPECT_EQ(offset_bucket(127), 67);
  EXPECT_EQ(offset_bucket(128), 68);
  EXPECT_EQ(offset_bucket(159), 68);
  EXPECT_EQ(offset_bucket(160), 69);
  EXPECT_EQ(offset_bucket(255), 71);
  EXPECT_EQ(offset_bucket(256), 72);
  EXPECT_EQ(offset_bucket(8191), 91);
  EXPECT_EQ(offset_bucket(int64_t{1} << 30), 64 + 24 * 4);
  int32_t prev = 0;
  for (int64_t d = 1; d < 300000; ++d) {
    const int32_t b = offset_bucket(d);
    EXPECT_TRUE(b == prev || b == prev + 1) << d;  // monotone, no gaps
    prev = b;
  }
}

TEST(PredictState, SlotEmaExact) {
  BlockState s(0.5, 0.1);
  s.ensure_blocks(6);
  EXPECT_FALSE(s.seen(3));
  EXPECT_EQ(s.last_seen(3), kNeverSeen);
  s.apply(make_row(5, {3}, {0.8f}), 0);
  EXPECT_EQ(s.slot(3), h(0.8f));  // first observation: x itself
  EXPECT_EQ(s.last_seen(3), 0);
  s.apply(make_row(5, {3}, {0.2f}), 1);
  EXPECT_EQ(s.slot(3), ema(h(0.8f), 0.2f, 0.5f));  // ≈ 0.5·0.8 + 0.5·0.2
  s.apply(make_row(5, {1, 3}, {-0.6f, -0.4f}), 4);
  EXPECT_EQ(s.slot(3), ema(ema(h(0.8f), 0.2f, 0.5f), -0.4f, 0.5f));  // ≈ 0.5·0.5 + 0.5·(-0.4)
  EXPECT_NEAR(s.slot(3), 0.05, 1e-3);
  EXPECT_EQ(s.slot(1), h(-0.6f));
  EXPECT_EQ(s.last_seen(3), 4);
  EXPECT_EQ(s.last_seen(1), 4);
  EXPECT_FALSE(s.seen(0));
  EXPECT_FALSE(s.seen(2));

  BlockState a(0.3, 0.1);
  a.apply(make_row(0, {0}, {1.0f}), 0);
  a.apply(make_row(0, {0}, {0.0f}), 1);
  a.apply(make_row(0, {0}, {0.5f}), 2);
  // 1 → 0.7 → 0.7·0.7 + 0.3·0.5 = 0.64
  EXPECT_EQ(a.slot(0), ema(ema(1.0f, 0.0f, 0.3f), 0.5f, 0.3f));
  EXPECT_NEAR(a.slot(0), 0.64, 1e-3);
  BlockState one(1.0, 0.1);  // prev-iter: the last observation
  one.apply(make_row(0, {0}, {0.9f}), 0);
  one.apply(make_row(0, {0}, {-0.3f}), 1);
  EXPECT_EQ(one.slot(0), h(-0.3f));
}

TEST(PredictState, ObservationsAtBinary16) {
  // 0.1 is no binary16: the slot and the offset take its nearest half (0.0999755859375), and an
  // update that lands between two halves is rounded to the nearer (ties to even).
  BlockState s(0.5, 0.1);
  s.apply(make_row(4, {4}, {0.1f}), 0);
  EXPECT_EQ(s.slot(4), 0.0999755859375f);
  EXPECT_EQ(s.offset(0), 0.0999755859375f);
  // 0.5·0.0999755859375 + 0.5·0.199951171875 = 0.14996337890625, halfway between the halves
  // 0.14990234375 and 0.1500244140625: to the even one.
  s.apply(make_row(4, {4}, {0.2f}), 1);
  EXPECT_EQ(s.slot(4), 0.14990234375f);
  EXPECT_NE(s.slot(4), 0.5f * 0.0999755859375f + 0.5f * 0.199951171875f);
}

TEST(PredictState, OffsetEmaAtDistances) {
  BlockState s(0.5, 0.1);
  s.apply(make_row(9, {7, 9}, {0.5f, 1.0f}), 0);  // d = 2 and 0
  EXPECT_TRUE(s.offset_known(0));
  EXPECT_TRUE(s.offset_known(2));
  EXPECT_FALSE(s.offset_known(1));
  EXPECT_NEAR(s.offset(0), 1.0, 1e-6);
  EXPECT_NEAR(s.offset(2), 0.5, 1e-6);
  s.apply(make_row(10, {8, 10}, {0.25f, 0.0f}), 1);  // the row moved on: d still 2 and 0
  EXPECT_NEAR(s.offset(0), 0.9, 1e-6);               // 0.9·1 + 0.1·0
  EXPECT_NEAR(s.offset(2), 0.475, 1e-6);             // 0.9·0.5 + 0.1·0.25
  EXPECT_EQ(s.offset_updates(0), 2);
  // Slot 8 and 10 were first seen: x itself. Block 9 is unchanged.
  EXPECT_NEAR(s.slot(8), 0.25, 1e-6);
  EXPECT_NEAR(s.slot(9), 1.0, 1e-6);

  // A log bucket gets one update per row, with the mean of the row's blocks in it.
  BlockState f(0.5, 0.25);
  f.apply(make_row(200, {130, 136, 199}, {0.6f, 0.2f, -0.5f}), 3);  // d = 70, 64 → bucket 64; d=1
  EXPECT_EQ(offset_bucket(70), 64);
  EXPECT_EQ(f.offset(64), offset_mean(offset_fixed_point(h(0.6f)) + offset_fixed_point(h(0.2f)), 2));
  EXPECT_NEAR(f.offset(64), 0.4, 1e-3);
  EXPECT_EQ(f.offset_updates(64), 1);
  EXPECT_NEAR(f.offset(1), -0.5, 1e-6);
  f.apply(make_row(201, {137}, {1.0f}), 4);  // d = 64 → bucket 64
  EXPECT_NEAR(f.offset(64), 0.75 * 0.4 + 0.25 * 1.0, 1e-3);
  EXPECT_EQ(f.offset_updates(64), 2);
}

TEST(PredictState, GrowsAndCountsMemory) {
  BlockState s(0.5, 0.1);
  EXPECT_EQ(s.memory_bytes(), 0u);
  s.ensure_blocks(10);
  EXPECT_EQ(s.n_blocks(), 10);
  EXPECT_EQ(s.n_offset_buckets(), 10);
  EXPECT_EQ(s.memory_bytes(), 10 * kStateBytesPerBlock + 10 * kStateBytesPerOffsetBucket);
  s.apply(make_row(4, {2}, {0.5f}), 0);
  s.ensure_blocks(8192);  // 512K entries at page 64
  EXPECT_EQ(s.n_blocks(), 8192);
  EXPECT_EQ(s.n_offset_buckets(), 92);
  EXPECT_EQ(s.memory_bytes(), 8192u * 6 + 92u * 8);  // binary16 slot + int32 last_seen
  EXPECT_NEAR(s.slot(2), 0.5, 1e-6);  // growth keeps what was known
  EXPECT_FALSE(s.seen(5000));
  s.ensure_blocks(100);  // never shrinks
  EXPECT_EQ(s.n_blocks(), 8192);
  // apply() grows on its own for a row beyond the current size.
  s.apply(make_row(9000, {8999}, {0.1f}), 1);
  EXPECT_EQ(s.n_blocks(), 9001);
  s.truncate(3);
  EXPECT_EQ(s.n_blocks(), 3);
  EXPECT_NEAR(s.slot(2), 0.5, 1e-6);
  s.reset();
  EXPECT_EQ(s.n_blocks(), 0);
  EXPECT_EQ(s.memory_bytes(), 0u);
  EXPECT_FALSE(s.offset_known(0));
}

TEST(PredictState, CopiesAreIndependent) {
  BlockState a(0.5, 0.1);
  a.apply(make_row(3, {1, 3}, {0.2f, 0.4f}), 0);
  BlockState b = a;  // prefix sharing: fork = copy
  b.apply(make_row(3, {1}, {1.0f}), 1);
  EXPECT_EQ(a.slot(1), h(0.2f));
  EXPECT_EQ(b.slot(1), ema(h(0.2f), 1.0f, 0.5f));
  EXPECT_EQ(a.last_seen(1), 0);
  EXPECT_EQ(b.last_seen(1), 1);
}

}  // namespace
}  // namespace spin
