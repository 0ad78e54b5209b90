// Quality metrics against hand-computed values (spin/lab/metrics.h).
#include "spin/lab/metrics.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

namespace spin {
namespace {

using V = std::vector<int32_t>;

TEST(Recall, CountsValidEntriesOfFullTopK) {
  EXPECT_DOUBLE_EQ(recall(V{1, 5, 9, 12}, V{1, 2, 5, 7}), 0.5);
  EXPECT_DOUBLE_EQ(recall(V{1, 2, 5, 7}, V{1, 2, 5, 7}), 1.0);
  EXPECT_DOUBLE_EQ(recall(V{0, 3, 4, 6}, V{1, 2, 5, 7}), 0.0);
}

TEST(Recall, SkipsPaddingOnBothSides) {
  // B holds 2 valid entries: the denominator is 2, not 4.
  EXPECT_DOUBLE_EQ(recall(V{2, 3, -1, -1}, V{1, 2, -1, -1}), 0.5);
  // -1 in A never matches -1 in B.
  EXPECT_DOUBLE_EQ(recall(V{-1, -1, -1, -1}, V{4, -1, -1, -1}), 0.0);
  // Different lengths (A padded longer) are fine.
  EXPECT_DOUBLE_EQ(recall(V{4, 8, -1, -1, -1, -1}, V{4, 8, 9}), 2.0 / 3.0);
}

TEST(Recall, EmptyFullTopKIsOne) {
  EXPECT_DOUBLE_EQ(recall(V{-1, -1}, V{-1, -1}), 1.0);
  EXPECT_DOUBLE_EQ(recall(V{3}, V{}), 1.0);
}

TEST(Recall, AnyOrderAndDuplicatesCountAsSets) {
  EXPECT_DOUBLE_EQ(recall(V{9, 1, 5, 1}, V{7, 5, 2, 1}), 0.5);
  EXPECT_DOUBLE_EQ(recall(V{5, 5, 5, 5}, V{5, 6}), 0.5);
}

TEST(BlockRecall, ShareOfFullTopKInSelectedBlocks) {
  // Entries 1, 65, 130, 200 lie in blocks 0, 1, 2, 3 of 64 entries.
  EXPECT_DOUBLE_EQ(block_recall(V{0, 2}, V{1, 65, 130, 200, -1}, 64), 0.5);
  EXPECT_DOUBLE_EQ(block_recall(V{3, 0, 2, 1}, V{1, 65, 130, 200}, 64), 1.0);  // unsorted ok
  EXPECT_DOUBLE_EQ(block_recall(V{}, V{1, 65}, 64), 0.0);
  EXPECT_DOUBLE_EQ(block_recall(V{}, V{-1, -1}, 64), 1.0);
  EXPECT_DOUBLE_EQ(block_recall(V{0}, V{0, 1, 2, 63, 64}, 64), 0.8);
  EXPECT_TRUE(std::isnan(block_recall(V{0}, V{1}, 0)));
}

TEST(Pearson, KnownVectors) {
  const float x[] = {1, 2, 3, 4, 5};
  const float up[] = {2, 4, 6, 8, 10};
  const float down[] = {5, 4, 3, 2, 1};
  const float mixed[] = {2, 1, 4, 3, 5};  // sxy 8, sxx 10, syy 10 -> 0.8
  EXPECT_DOUBLE_EQ(pearson(x, up, 5), 1.0);
  EXPECT_DOUBLE_EQ(pearson(x, down, 5), -1.0);
  EXPECT_NEAR(pearson(x, mixed, 5), 0.8, 1e-15);
  const double xd[] = {1, 2, 3, 4};
  const double yd[] = {1, 3, 2, 4};  // sxy 4, sxx 5, syy 5 -> 0.8
  EXPECT_NEAR(pearson(xd, yd, 4), 0.8, 1e-15);
}

TEST(Pearson, UndefinedCasesAreNaN) {
  const float x[] = {1, 2, 3};
  const float c[] = {7, 7, 7};
  const float bad[] = {1, NAN, 3};
  EXPECT_TRUE(std::isnan(pearson(x, c, 3)));
  EXPECT_TRUE(std::isnan(pearson(c, x, 3)));
  EXPECT_TRUE(std::isnan(pearson(x, x, 1)));
  EXPECT_TRUE(std::isnan(pearson(x, x, 0)));
  EXPECT_TRUE(std::isnan(pearson(x, bad, 3)));
  EXPECT_TRUE(std::isnan(pearson(static_cast<const float*>(nullptr), x, 3)));
}

TEST(Pearson, DoubleAccumulationSurvivesLargeOffsets) {
  // Offsets of 1e6 around differences of 1: a one-pass float formula loses everything here.
  std::vector<float> x, y;
  for (int i = 0; i < 1000; ++i) {
    x.push_back(1e6f + static_cast<float>(i % 17));
    y.push_back(static_cast<float>(i % 17) * 0.5f - 3.0f);
  }
  EXPECT_NEAR(pearson(x.data(), y.data(), 1000), 1.0, 1e-12);
}

TEST(Sparsity, RealisedShareSkipped) {
  EXPECT_DOUBLE_EQ(sparsity(25, 100), 0.75);
  EXPECT_DOUBLE_EQ(sparsity(100, 100), 0.0);
  EXPECT_DOUBLE_EQ(sparsity(0, 0), 0.0);
}

TEST(NearestRank, DefinitionCeilPOverHundredTimesN) {
  EXPECT_EQ(nearest_rank(99, 100), 99);
  EXPECT_EQ(nearest_rank(99, 10), 10);
  EXPECT_EQ(nearest_rank(50, 10), 5);
  EXPECT_EQ(nearest_rank(50, 11), 6);
  EXPECT_EQ(nearest_rank(0, 10), 1);
  EXPECT_EQ(nearest_rank(100, 10), 10);
  EXPECT_EQ(nearest_rank(50, 0), 0);
  // Every integer percentile of 100 samples is its own rank (no rounding error skips one).
  for (int p = 1; p <= 100; ++p) EXPECT_EQ(nearest_rank(p, 100), p) << "p" << p;
  for (int p = 1; p <= 100; ++p) EXPECT_EQ(nearest_rank(p, 1000), 10 * p) << "p" << p;
  EXPECT_EQ(nearest_rank(99.9, 1000), 999);
}

SampleStats stats_of(std::vector<double> v, uint32_t seed) {
  std::mt19937 rng(seed);
  std::shuffle(v.begin(), v.end(), rng);  // order must not matter
  SampleStats s;
  for (double x : v) s.add(x);
  return s;
}

std::vector<double> one_to(int n) {
  std::vector<double> v(n);
  std::iota(v.begin(), v.end(), 1.0);
  return v;
}

TEST(SampleStats, NearestRankPercentiles) {
  const SampleStats a = stats_of(one_to(100), 1);
  EXPECT_EQ(a.percentile(99), 99);
  EXPECT_EQ(a.percentile(50), 50);
  EXPECT_EQ(a.percentile(100), 100);
  EXPECT_EQ(a.percentile(0), 1);
  const SampleStats b = stats_of(one_to(10), 2);
  EXPECT_EQ(b.percentile(99), 10);
  EXPECT_EQ(b.percentile(50), 5);
  EXPECT_EQ(b.percentile(90), 9);
  EXPECT_EQ(b.percentile(91), 10);
  const SampleStats one = stats_of({0.25}, 3);
  EXPECT_EQ(one.percentile(1), 0.25);
  EXPECT_EQ(one.percentile(99), 0.25);
}

TEST(SampleStats, MeanMaxCountAndNaNSkipping) {
  SampleStats s = stats_of({0.5, 1.0, 0.0, 0.25}, 4);
  s.add(NAN);
  EXPECT_EQ(s.count(), 4);
  EXPECT_EQ(s.nan_count(), 1);
  EXPECT_DOUBLE_EQ(s.mean(), 0.4375);
  EXPECT_EQ(s.max(), 1.0);
  EXPECT_EQ(s.min(), 0.0);
  const auto sum = s.summary();
  EXPECT_EQ(sum.count, 4);
  EXPECT_EQ(sum.nan_count, 1);
  EXPECT_EQ(sum.p50, 0.25);
  EXPECT_EQ(sum.p99, 1.0);
  EXPECT_EQ(sum.max, 1.0);

  SampleStats empty;
  EXPECT_TRUE(std::isnan(empty.mean()));
  EXPECT_TRUE(std::isnan(empty.percentile(50)));
  EXPECT_TRUE(std::isnan(empty.max()));
  EXPECT_EQ(empty.summary().count, 0);
}

TEST(SampleStats, MergeEqualsAddingEverything) {
  SampleStats a = stats_of({5, 1, 3}, 5), b = stats_of({2, 4}, 6), all = stats_of(one_to(5), 7);
  a.add(NAN);
  a.merge(b);
  EXPECT_EQ(a.count(), 5);
  EXPECT_EQ(a.nan_count(), 1);
  EXPECT_EQ(a.percentile(50), all.percentile(50));
  EXPECT_EQ(a.percentile(99), 5);
  EXPECT_DOUBLE_EQ(a.mean(), 3.0);
  EXPECT_EQ(a.min(), 1.0);
  // Adding after a percentile query keeps results right (the lazy sort is redone).
  a.add(0.5);
  EXPECT_EQ(a.percentile(0), 0.5);
  EXPECT_EQ(a.max(), 5.0);
}

TEST(QualityStats, ExactByConstructionCountedApart) {
  QualityStats q(/*topk=*/4);
  RowQuality exact;  // sees 4 <= topk entries: recall 1 by construction
  exact.visible_entries = 4;
  exact.scored_entries = 4;
  exact.recall = 1.0;
  q.add(exact);
  RowQuality tiny;
  tiny.visible_entries = 0;
  q.add(tiny);
  RowQuality r;
  r.visible_entries = 100;
  r.scored_entries = 40;
  r.visible_blocks = 10;
  r.scored_blocks = 4;
  r.recall = 0.75;
  r.block_recall = 1.0;
  q.add(r);
  r.recall = 0.5;
  r.pearson = 0.9;
  r.scored_entries = -1;  // not measured
  q.add(r);

  EXPECT_EQ(q.samples(), 4);
  EXPECT_EQ(q.exact_by_construction(), 2);
  EXPECT_EQ(q.recall().count(), 2);
  EXPECT_DOUBLE_EQ(q.recall().mean(), 0.625);
  EXPECT_DOUBLE_EQ(q.miss().max(), 0.5);
  EXPECT_EQ(q.miss().percentile(99), 0.5);
  EXPECT_EQ(q.block_recall().count(), 2);
  EXPECT_EQ(q.sparsity().count(), 1);
  EXPECT_DOUBLE_EQ(q.sparsity().mean(), 0.6);
  EXPECT_EQ(q.block_sparsity().count(), 2);
  EXPECT_EQ(q.pearson().count(), 1);
  EXPECT_EQ(q.pearson().nan_count(), 1);
  EXPECT_EQ(q.topk_recall().count(), 0);

  QualityStats other(4);
  other.add(r);
  EXPECT_TRUE(q.merge(other));
  EXPECT_EQ(q.samples(), 5);
  EXPECT_EQ(q.recall().count(), 3);
  QualityStats wrong(8);
  EXPECT_FALSE(q.merge(wrong));
  EXPECT_EQ(q.samples(), 5);
}

}  // namespace
}  // namespace spin
