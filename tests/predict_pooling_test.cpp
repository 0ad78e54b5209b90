// Tests of pool_row: each pooling mode on a hand-computed row, the normalisation's invariances, the
// tie rule, errors on non-finite scores and bad inputs, and the topk_positions fast path agreeing
// with the internal k-th selection on random rows.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "predict/pooling.h"
#include "spin/rng.h"

namespace spin {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

PredictorConfig small_config(Pooling pooling, int32_t entries_per_block, int32_t topk) {
  PredictorConfig c;
  c.page_size = entries_per_block;
  c.pooling = pooling;
  c.topk = topk;
  return c;
}

// Row of 12 columns, 10 visible, blocks of 4. Block 0 = [1, 5, -inf, 2], block 1 not scored,
// block 2 = [3, 4 | NaN garbage past `visible`]. Scored values 1,5,2,3,4; top-3 = {5, 4, 3}.
struct HandRow {
  std::vector<float> scores = {1,
                               5,
                               kNegInf,
                               2,
                               kNegInf,
                               kNegInf,
                               kNegInf,
                               kNegInf,
                               3,
                               4,
                               std::numeric_limits<float>::quiet_NaN(),
                               7};
  std::vector<int32_t> blocks = {0, 2};
  RowScores row() const {
    RowScores r;
    r.scores = scores.data();
    r.num_cols = 12;
    r.visible_entries = 10;
    r.scored_blocks = blocks.data();
    r.num_scored_blocks = 2;
    return r;
  }
};

TEST(PredictPooling, HandComputedModes) {
  HandRow h;
  PooledRow out;
  // kth = 3, max = 5, spread = 2.
  ASSERT_TRUE(pool_row(small_config(Pooling::kMax, 4, 3), h.row(), &out).ok());
  EXPECT_EQ(out.newest_block, 2);
  EXPECT_EQ(out.scored_entries, 5);
  EXPECT_DOUBLE_EQ(out.kth_score, 3.0);
  EXPECT_DOUBLE_EQ(out.max_score, 5.0);
  ASSERT_EQ(out.blocks, (std::vector<int32_t>{0, 2}));
  EXPECT_NEAR(out.x[0], 1.0, 1e-6);  // (5-3)/2
  EXPECT_NEAR(out.x[1], 0.5, 1e-6);  // (4-3)/2
  EXPECT_EQ(out.topk_hits, (std::vector<int32_t>{1, 2}));

  ASSERT_TRUE(pool_row(small_config(Pooling::kMean, 4, 3), h.row(), &out).ok());
  // block 0 mean 8/3 → r = -1/6 → r/(1-r) = -1/7; block 2 mean 3.5 → r = 0.25.
  EXPECT_NEAR(out.x[0], -1.0 / 7.0, 1e-6);
  EXPECT_NEAR(out.x[1], 0.25, 1e-6);

  ASSERT_TRUE(pool_row(small_config(Pooling::kTopkHits, 4, 3), h.row(), &out).ok());
  EXPECT_NEAR(out.x[0], 0.25, 1e-6);  // 1 of 4 entries in the top-3
  EXPECT_NEAR(out.x[1], 0.5, 1e-6);

  ASSERT_TRUE(pool_row(small_config(Pooling::kLse, 4, 3), h.row(), &out).ok());
  EXPECT_NEAR(out.x[0], std::log(std::exp(-1.0) + std::exp(1.0) + std::exp(-0.5)), 1e-6);
  EXPECT_NEAR(out.x[1], std::log(1.0 + std::exp(0.5)), 1e-6);
}

// Max pooling at rank m: each block's m-th best scored entry (-inf skipped), its smallest when it
// holds fewer; the k-th, the spread and the hits do not move.
TEST(PredictPooling, RankedMaxTakesTheMthBestEntry) {
  HandRow h;
  PooledRow out;
  const PredictorConfig c = small_config(Pooling::kMax, 4, 3);  // kth = 3, spread = 2
  ASSERT_TRUE(pool_row(c, h.row(), &out, nullptr, 2).ok());
  EXPECT_DOUBLE_EQ(out.kth_score, 3.0);
  EXPECT_NEAR(out.x[0], -1.0 / 3.0, 1e-6);  // block 0's 2nd best is 2: r = -1/2 → -1/3
  EXPECT_NEAR(out.x[1], 0.0, 1e-6);         // block 2's is 3, the k-th itself
  EXPECT_EQ(out.topk_hits, (std::vector<int32_t>{1, 2}));
  ASSERT_TRUE(pool_row(c, h.row(), &out, nullptr, 3).ok());
  EXPECT_NEAR(out.x[0], -0.5, 1e-6);  // block 0's 3rd best is 1: r = -1 → -1/2
  EXPECT_NEAR(out.x[1], 0.0, 1e-6);   // block 2 holds two: its smallest
  // Rank 1 is plain max pooling; other poolings ignore the rank.
  PooledRow plain, ranked;
  ASSERT_TRUE(pool_row(c, h.row(), &plain).ok());
  ASSERT_TRUE(pool_row(c, h.row(), &ranked, nullptr, 1).ok());
  EXPECT_EQ(plain.x, ranked.x);
  ASSERT_TRUE(pool_row(small_config(Pooling::kMean, 4, 3), h.row(), &plain).ok());
  ASSERT_TRUE(pool_row(small_config(Pooling::kMean, 4, 3), h.row(), &ranked, nullptr, 3).ok());
  EXPECT_EQ(plain.x, ranked.x);
  // Ties count once each: [4, 4, 4, 1] at rank 3 is 4.
  std::vector<float> tied = {4, 4, 4, 1};
  std::vector<int32_t> one = {0};
  ASSERT_TRUE(pool_row(small_config(Pooling::kMax, 4, 1), {tied.data(), 4, 4, one.data(), 1, nullptr}, &out,
                       nullptr, 3)
                  .ok());
  EXPECT_NEAR(out.x[0], 0.0, 1e-6);
}

// pool_rank = ⌈pool_depth · topk / budget⌉ within [1, block entries]: 128 blocks of 64.
TEST(PredictPooling, RankFollowsTheBudget) {
  PredictorConfig c = small_config(Pooling::kMax, 64, 256);
  c.pool_depth = 0.2;
  c.target_sparsity = 0.5;  // budget 64: 51.2 / 64 → 1
  EXPECT_EQ(pool_rank(c, 128), 1);
  c.target_sparsity = 0.7;  // budget 39: 51.2 / 39 → 2
  EXPECT_EQ(pool_rank(c, 128), 2);
  c.topk = 2048;
  c.target_sparsity = 0.5;  // 409.6 / 64 → 7
  EXPECT_EQ(pool_rank(c, 128), 7);
  c.pool_depth = 1.0;  // 2048 / 32 = 64 (the budget is clamped up to the top-k's 32 blocks)
  c.target_sparsity = 0.9;
  EXPECT_EQ(pool_rank(c, 128), 64);
  c.page_size = 16;  // 2048 / 128 = 16, at most E = 16
  EXPECT_EQ(pool_rank(c, 128), 16);
  c.pool_depth = 0.0;
  EXPECT_EQ(pool_rank(c, 128), 1);
  EXPECT_EQ(pool_rank(c, 0), 1);  // nothing visible: no budget
}

TEST(PredictPooling, NegativeScoresAndScaleInvariance) {
  std::vector<float> s = {-5, -1, -3, -2};
  std::vector<int32_t> blocks = {0, 1};
  RowScores r{s.data(), 4, 4, blocks.data(), 2, nullptr};
  PooledRow a, b;
  const PredictorConfig c = small_config(Pooling::kMax, 2, 2);
  ASSERT_TRUE(pool_row(c, r, &a).ok());
  EXPECT_NEAR(a.x[0], 1.0, 1e-6);  // kth = -2, max = -1
  EXPECT_NEAR(a.x[1], 0.0, 1e-6);
  // Any positive scale and shift gives the same x.
  std::vector<float> t(s.size());
  for (size_t i = 0; i < s.size(); ++i) t[i] = 1000.0f * s[i] + 12345.0f;
  r.scores = t.data();
  ASSERT_TRUE(pool_row(c, r, &b).ok());
  EXPECT_NEAR(b.x[0], a.x[0], 1e-5);
  EXPECT_NEAR(b.x[1], a.x[1], 1e-5);
  // Bounded below: a block far below the k-th score ends near -1, never below.
  std::vector<float> far = {-1e30f, -1e30f, 1.0f, 2.0f};
  r.scores = far.data();
  ASSERT_TRUE(pool_row(c, r, &b).ok());
  EXPECT_GE(b.x[0], -1.0f);
  EXPECT_LT(b.x[0], -0.99f);
}

TEST(PredictPooling, TiesGoToLowerPositions) {
  std::vector<float> s = {7, 7, 7, 7, 7};
  std::vector<int32_t> blocks = {0, 1, 2};
  RowScores r{s.data(), 5, 5, blocks.data(), 3, nullptr};
  PooledRow out;
  ASSERT_TRUE(pool_row(small_config(Pooling::kTopkHits, 2, 3), r, &out).ok());
  EXPECT_EQ(out.topk_hits, (std::vector<int32_t>{2, 1, 0}));
  EXPECT_NEAR(out.x[0], 1.0, 1e-6);
  EXPECT_NEAR(out.x[2], 0.0, 1e-6);
  ASSERT_TRUE(pool_row(small_config(Pooling::kMax, 2, 3), r, &out).ok());
  for (float x : out.x) EXPECT_NEAR(x, 0.0, 1e-6);  // max = kth: spread falls back to |max|
  // Fewer scored entries than topk: all of them are top-k.
  ASSERT_TRUE(pool_row(small_config(Pooling::kTopkHits, 2, 100), r, &out).ok());
  EXPECT_EQ(out.topk_hits, (std::vector<int32_t>{2, 2, 1}));
}

TEST(PredictPooling, NonFiniteScoresAreRejectedWithBlockAndPosition) {
  HandRow h;
  h.scores[3] = std::numeric_limits<float>::quiet_NaN();
  PooledRow out;
  Status s = pool_row(small_config(Pooling::kMax, 4, 3), h.row(), &out);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("position 3 (block 0) is NaN"), std::string::npos) << s.message();
  EXPECT_TRUE(out.blocks.empty());  // nothing half-pooled
  h.scores[3] = 2;
  h.scores[9] = std::numeric_limits<float>::infinity();
  s = pool_row(small_config(Pooling::kMax, 4, 3), h.row(), &out);
  EXPECT_NE(s.message().find("position 9 (block 2) is +inf"), std::string::npos) << s.message();
  // NaN in a block that was not scored, or past `visible`, is never read.
  h.scores[9] = 4;
  h.scores[5] = std::numeric_limits<float>::quiet_NaN();
  EXPECT_TRUE(pool_row(small_config(Pooling::kMax, 4, 3), h.row(), &out).ok());
}

TEST(PredictPooling, BadInputs) {
  HandRow h;
  PooledRow out;
  const PredictorConfig c = small_config(Pooling::kMax, 4, 3);
  RowScores r = h.row();
  r.visible_entries = 13;
  EXPECT_EQ(pool_row(c, r, &out).code(), StatusCode::kInvalidArgument);
  r = h.row();
  std::vector<int32_t> unsorted = {2, 0};
  r.scored_blocks = unsorted.data();
  EXPECT_EQ(pool_row(c, r, &out).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> dup = {2, 2};
  r.scored_blocks = dup.data();
  EXPECT_EQ(pool_row(c, r, &out).code(), StatusCode::kInvalidArgument);
  std::vector<int32_t> negative = {-1, 0};
  r.scored_blocks = negative.data();
  EXPECT_EQ(pool_row(c, r, &out).code(), StatusCode::kOutOfRange);
  // Blocks past the row's view (an MTP union's later rows) are skipped, even past num_cols.
  std::vector<int32_t> beyond = {0, 2, 3, 7};
  r.scored_blocks = beyond.data();
  r.num_scored_blocks = 4;
  ASSERT_TRUE(pool_row(c, r, &out).ok());
  EXPECT_EQ(out.blocks, (std::vector<int32_t>{0, 2}));
  std::vector<int32_t> top3 = {9, 1, 8};
  r.topk_positions = top3.data();
  ASSERT_TRUE(pool_row(c, r, &out).ok());
  EXPECT_EQ(out.topk_hits, (std::vector<int32_t>{1, 2}));
  // The float-scratch overload gives the same.
  std::vector<float> values;
  PooledRow same;
  r.topk_positions = nullptr;
  ASSERT_TRUE(pool_row(c, r, &same, &values).ok());
  EXPECT_EQ(same.x, std::vector<float>({1.0f, 0.5f}));
  r = h.row();
  r.scores = nullptr;
  EXPECT_FALSE(pool_row(c, r, &out).ok());
  EXPECT_FALSE(pool_row(c, h.row(), nullptr).ok());
  // Nothing scored: no observation, but the row's newest block is known.
  r = h.row();
  r.num_scored_blocks = 0;
  ASSERT_TRUE(pool_row(c, r, &out).ok());
  EXPECT_TRUE(out.blocks.empty());
  EXPECT_EQ(out.newest_block, 2);
  // A scored block that holds only -inf gives no observation.
  std::vector<int32_t> with_empty = {0, 1, 2};
  r = h.row();
  r.scored_blocks = with_empty.data();
  r.num_scored_blocks = 3;
  ASSERT_TRUE(pool_row(c, r, &out).ok());
  EXPECT_EQ(out.blocks, (std::vector<int32_t>{0, 2}));
}

TEST(PredictPooling, TopkPositionsValidation) {
  HandRow h;
  PooledRow out;
  const PredictorConfig c = small_config(Pooling::kTopkHits, 4, 3);
  RowScores r = h.row();
  std::vector<int32_t> good = {9, -1, 1, 8};  // unordered, padded anywhere: accepted
  PredictorConfig c4 = c;
  c4.topk = 4;
  r.topk_positions = good.data();
  EXPECT_FALSE(pool_row(c4, r, &out).ok());  // 3 positions, but min(4, 5) = 4 expected
  std::vector<int32_t> top3 = {9, 1, 8};
  r.topk_positions = top3.data();
  ASSERT_TRUE(pool_row(c, r, &out).ok());
  EXPECT_EQ(out.topk_hits, (std::vector<int32_t>{1, 2}));
  std::vector<int32_t> not_top = {9, 1, 0};  // 0 holds 1, while 3 (pos 8) is higher
  r.topk_positions = not_top.data();
  Status s = pool_row(c, r, &out);
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("not the row's top-3"), std::string::npos) << s.message();
  std::vector<int32_t> unscored = {9, 1, 5};
  r.topk_positions = unscored.data();
  EXPECT_NE(pool_row(c, r, &out).message().find("not scored"), std::string::npos);
  std::vector<int32_t> masked = {9, 1, 2};  // position 2 holds -inf
  r.topk_positions = masked.data();
  EXPECT_NE(pool_row(c, r, &out).message().find("-inf"), std::string::npos);
  std::vector<int32_t> beyond = {9, 1, 10};
  r.topk_positions = beyond.data();
  EXPECT_EQ(pool_row(c, r, &out).code(), StatusCode::kOutOfRange);
}

// The tie rule of spin/topk.h, by brute force: score descending, position ascending.
std::vector<int32_t> brute_topk(const std::vector<float>& s, int64_t visible, int32_t k) {
  std::vector<int32_t> pos;
  for (int32_t i = 0; i < visible; ++i)
    if (s[static_cast<size_t>(i)] != kNegInf) pos.push_back(i);
  std::stable_sort(pos.begin(), pos.end(), [&](int32_t a, int32_t b) {
    return s[static_cast<size_t>(a)] > s[static_cast<size_t>(b)];
  });
  if (static_cast<int64_t>(pos.size()) > k) pos.resize(static_cast<size_t>(k));
  pos.resize(static_cast<size_t>(k), -1);
  return pos;
}

TEST(PredictPooling, TopkPositionsAgreeWithInternalSelection) {
  CounterRng rng(stream_key(7, 1));
  PoolScratch scratch;
  for (int iter = 0; iter < 400; ++iter) {
    const int32_t e = static_cast<int32_t>(1 + rng.below(9));
    const int64_t cols = static_cast<int64_t>(rng.below(300));
    const int64_t visible =
        cols == 0 ? 0 : static_cast<int64_t>(rng.below(static_cast<uint64_t>(cols) + 1));
    const int32_t k = static_cast<int32_t>(1 + rng.below(40));
    const Pooling pooling = static_cast<Pooling>(rng.below(4));
    PredictorConfig c = small_config(pooling, e, k);
    std::vector<float> s(static_cast<size_t>(cols), kNegInf);
    std::vector<int32_t> blocks;
    const int64_t n_blocks = (cols + e - 1) / e;
    for (int32_t b = 0; b < n_blocks; ++b) {
      if (rng.below(3) == 0) continue;
      blocks.push_back(b);
      for (int64_t p = b * e; p < std::min<int64_t>((b + 1) * e, cols); ++p)
        // Few distinct values: many ties; some -inf (masked); negative values too.
        s[static_cast<size_t>(p)] =
            rng.below(6) == 0 ? kNegInf : static_cast<float>(rng.below(7)) - 3.0f;
    }
    // Columns outside scored blocks hold -inf, as the kernel writes them.
    RowScores r{s.data(), cols, visible, blocks.data(), static_cast<int64_t>(blocks.size()),
                nullptr};
    PooledRow own, given;
    ASSERT_TRUE(pool_row(c, r, &own, &scratch).ok());
    std::vector<int32_t> top = brute_topk(s, visible, k);
    r.topk_positions = top.data();
    const Status st = pool_row(c, r, &given);
    ASSERT_TRUE(st.ok()) << st.to_string() << " iter " << iter;
    EXPECT_EQ(own.blocks, given.blocks) << iter;
    EXPECT_EQ(own.topk_hits, given.topk_hits) << iter;
    EXPECT_EQ(own.x, given.x) << iter;
    EXPECT_EQ(own.kth_score, given.kth_score) << iter;
    int64_t hits = std::accumulate(own.topk_hits.begin(), own.topk_hits.end(), int64_t{0});
    EXPECT_EQ(hits, std::min<int64_t>(k, own.scored_entries)) << iter;
    for (float x : own.x) {
      EXPECT_TRUE(std::isfinite(x));
      EXPECT_GE(x, pooling == Pooling::kTopkHits ? 0.0f : -1.0f);
    }
  }
}

// The vectorised block scan against its scalar reference, bitwise (sum, max, counts, flag), on
// every length 0..260 (every tail) of rows holding -inf runs, NaN, +inf, subnormals, ±0,
// all-equal values and the k-th itself.
bool same_scan(const detail::BlockScan& a, const detail::BlockScan& b) {
  return a.n == b.n && a.greater == b.greater && a.equal == b.equal && a.non_finite == b.non_finite &&
         std::bit_cast<uint64_t>(a.sum) == std::bit_cast<uint64_t>(b.sum) &&
         std::bit_cast<uint32_t>(a.max) == std::bit_cast<uint32_t>(b.max);
}

TEST(PredictPooling, VectorisedScanMatchesReferenceBitwise) {
  CounterRng rng(stream_key(404));
  const float specials[] = {kNegInf,
                            kNegInf,
                            std::numeric_limits<float>::quiet_NaN(),
                            std::numeric_limits<float>::infinity(),
                            std::numeric_limits<float>::denorm_min(),
                            -std::numeric_limits<float>::denorm_min(),
                            0.0f,
                            -0.0f,
                            1.5f};
  for (int64_t len = 0; len <= 260; ++len) {
    for (int kind = 0; kind < 6; ++kind) {
      std::vector<float> s(static_cast<size_t>(len));
      for (float& v : s) {
        const double g = rng.normal();
        switch (kind) {
          case 0: v = static_cast<float>(g); break;                                          // plain
          case 1: v = 1.5f; break;                                                           // all equal
          case 2: v = kNegInf; break;                                                        // nothing scored
          case 3: v = rng.uniform() < 0.3 ? specials[rng.below(9)] : static_cast<float>(g); break;
          case 4: v = static_cast<float>(g * 1e-40); break;                                  // subnormal
          default: v = rng.uniform() < 0.5 ? -0.0f : 0.0f; break;                            // signed zeros
        }
      }
      for (float kth : {1.5f, 0.0f, -0.5f}) {
        const detail::BlockScan fast = detail::scan_block(s.data(), len, kth);
        const detail::BlockScan ref = detail::scan_block_reference(s.data(), len, kth);
        ASSERT_TRUE(same_scan(fast, ref)) << "length " << len << " kind " << kind << " kth " << kth;
      }
    }
  }
}

// pool_row at page sizes 1/16/64/128, every pooling mode, -inf holes and unscored blocks: the same
// bits on every call (the scan's order is fixed, and a row is pooled by one thread).
TEST(PredictPooling, DeterministicAtEveryPageSize) {
  for (int32_t page : {1, 16, 64, 128}) {
    for (Pooling pooling : {Pooling::kMax, Pooling::kMean, Pooling::kLse, Pooling::kTopkHits}) {
      const PredictorConfig config = small_config(pooling, page, 7);
      CounterRng rng(stream_key(static_cast<uint64_t>(page) * 10 + static_cast<uint64_t>(pooling)));
      const int64_t cols = int64_t{page} * 9 + 3;
      std::vector<float> scores(static_cast<size_t>(cols));
      for (float& v : scores) v = rng.uniform() < 0.2 ? kNegInf : static_cast<float>(rng.normal());
      std::vector<int32_t> blocks;
      for (int32_t b = 0; int64_t{b} * page < cols; ++b) {
        if (b % 3 != 1) blocks.push_back(b);
      }
      RowScores row;
      row.scores = scores.data();
      row.num_cols = cols;
      row.visible_entries = cols;
      row.scored_blocks = blocks.data();
      row.num_scored_blocks = static_cast<int64_t>(blocks.size());
      PooledRow first, second;
      ASSERT_TRUE(pool_row(config, row, &first).ok());
      ASSERT_TRUE(pool_row(config, row, &second).ok());
      ASSERT_FALSE(first.x.empty());
      ASSERT_EQ(first.x.size(), second.x.size());
      EXPECT_EQ(std::memcmp(first.x.data(), second.x.data(), first.x.size() * sizeof(float)), 0) << page;
      EXPECT_EQ(first.topk_hits, second.topk_hits);
    }
  }
}

}  // namespace
}  // namespace spin
