// Top-k: radix select against the sorting reference — exact sets on tie-free inputs, the
// (score desc, position asc) rule on constructed ties, padding, guards, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernel_harness.h"
#include "spin/rng.h"
#include "spin/topk.h"

namespace spin {
namespace {

using testing::GuardedBuffer;

struct RunOptions {
  const std::vector<int64_t>* visible_entries = nullptr;  // null: every row reads all cols
  int threads = 0;
};

std::vector<int32_t> run_topk(const std::vector<float>& scores, int32_t rows, int64_t cols, int32_t k,
                              TopkImpl impl, const RunOptions& o = {}) {
  GuardedBuffer<int32_t> out(static_cast<size_t>(rows) * k, testing::kPoisonIndex);
  TopkParams p;
  p.scores = scores.data();
  p.scores_stride = cols;
  p.rows = rows;
  p.cols = cols;
  p.visible_entries = o.visible_entries ? o.visible_entries->data() : nullptr;
  p.topk = k;
  p.out = out.data();
  p.out_stride = k;
  const Status s = topk(p, TopkOptions{impl, o.threads});
  EXPECT_TRUE(s.ok()) << s.to_string();
  EXPECT_TRUE(out.guards_intact());
  return out.payload();
}

// Checks shape rules that hold for any correct answer: ascending, unique, -1 only at the end,
// every returned position finite, and gathered scores ≥ every unreturned finite score.
void check_well_formed(const std::vector<float>& scores, int64_t n, int32_t k, const int32_t* out) {
  int32_t valid = 0;
  while (valid < k && out[valid] >= 0) ++valid;
  for (int32_t i = valid; i < k; ++i) ASSERT_EQ(out[i], -1);
  for (int32_t i = 1; i < valid; ++i) ASSERT_LT(out[i - 1], out[i]);
  std::vector<char> taken(n, 0);
  float min_taken = std::numeric_limits<float>::infinity();
  for (int32_t i = 0; i < valid; ++i) {
    ASSERT_LT(out[i], n);
    ASSERT_TRUE(std::isfinite(scores[out[i]]));
    taken[out[i]] = 1;
    min_taken = std::min(min_taken, scores[out[i]]);
  }
  int64_t finite = 0;
  for (int64_t s = 0; s < n; ++s) {
    if (!std::isfinite(scores[s])) continue;
    ++finite;
    if (!taken[s]) {
      ASSERT_LE(scores[s], min_taken);
    }
  }
  ASSERT_EQ(valid, std::min<int64_t>(finite, k));
}

TEST(Topk, RadixMatchesReferenceOnRandomRows) {
  CounterRng rng(stream_key(42));
  const int64_t sizes[] = {0, 1, 7, 2047, 2048, 2049, 5000, 70001};
  for (int64_t cols : sizes) {
    for (int32_t k : {1, 5, 2048}) {
      const int32_t rows = 3;
      std::vector<float> scores(static_cast<size_t>(rows) * cols);
      for (float& s : scores) {
        const double u = rng.uniform();
        s = u < 0.1 ? -std::numeric_limits<float>::infinity() : static_cast<float>(rng.normal() * 10);
      }
      if (cols > 10) scores[3] = std::numeric_limits<float>::quiet_NaN();  // ignored like -inf
      testing::for_each_fast_impl_against_reference<TopkImpl>(
          [&](TopkImpl impl) { return run_topk(scores, rows, cols, k, impl); },
          [&](TopkImpl, const std::vector<int32_t>& fast, const std::vector<int32_t>& ref) {
            ASSERT_EQ(fast, ref) << "cols " << cols << " k " << k;
            for (int32_t r = 0; r < rows; ++r) {
              std::vector<float> row(scores.begin() + r * cols, scores.begin() + (r + 1) * cols);
              check_well_formed(row, cols, k, fast.data() + r * k);
            }
          });
    }
  }
}

TEST(Topk, TieRuleTakesLowerPositions) {
  // 10 equal scores above a floor, k = 4: positions 2, 3, 5, 7 hold the top value.
  std::vector<float> scores = {1, 1, 9, 9, 1, 9, 0.5f, 9, 9, 9};
  for (TopkImpl impl : {TopkImpl::kRadix, TopkImpl::kReference}) {
    EXPECT_EQ(run_topk(scores, 1, 10, 4, impl), (std::vector<int32_t>{2, 3, 5, 7}));
    // Ties straddling the boundary: k = 7 takes the six 9s and the first 1.
    EXPECT_EQ(run_topk(scores, 1, 10, 7, impl), (std::vector<int32_t>{0, 2, 3, 5, 7, 8, 9}));
  }
  std::vector<float> zeros = {0.0f, -0.0f, 0.0f, -0.0f};  // -0 == +0: lower positions win
  EXPECT_EQ(run_topk(zeros, 1, 4, 2, TopkImpl::kRadix), (std::vector<int32_t>{0, 1}));
  EXPECT_EQ(run_topk(zeros, 1, 4, 2, TopkImpl::kReference), (std::vector<int32_t>{0, 1}));
}

TEST(Topk, HeavyTiesMatchReference) {
  CounterRng rng(stream_key(9));
  std::vector<float> scores(50000);
  for (float& s : scores) s = static_cast<float>(rng.below(5));  // five distinct values only
  EXPECT_EQ(run_topk(scores, 1, 50000, 2048, TopkImpl::kRadix), run_topk(scores, 1, 50000, 2048, TopkImpl::kReference));
}

TEST(Topk, PadsWithMinusOneAndHonoursRowLengths) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores = {3, ninf, 1, 2, 100, 100, 100, 100};
  std::vector<int64_t> lens = {4, 0};
  for (TopkImpl impl : {TopkImpl::kRadix, TopkImpl::kReference}) {
    const auto out = run_topk(scores, 2, 4, 5, impl, {.visible_entries = &lens});
    EXPECT_EQ(out, (std::vector<int32_t>{0, 2, 3, -1, -1, -1, -1, -1, -1, -1}));
  }
}

// Exactly k finite scores followed by -inf: the "everything finite is selected" path must not
// write a (k+1)-th slot — neither into the next row nor past the buffer (the last row).
TEST(Topk, ExactlyKFiniteThenMinusInfStaysInItsRow) {
  const float ninf = -std::numeric_limits<float>::infinity();
  std::vector<float> scores = {1, 2, ninf, 5, 3, ninf};
  for (TopkImpl impl : {TopkImpl::kRadix, TopkImpl::kReference}) {
    EXPECT_EQ(run_topk(scores, 2, 3, 2, impl), (std::vector<int32_t>{0, 1, 0, 1}));
  }
}

TEST(Topk, DeterministicAcrossThreads) {
  CounterRng rng(stream_key(77));
  std::vector<float> scores(8 * 20000);
  for (float& s : scores) s = static_cast<float>(std::round(rng.normal() * 50));  // many ties
  testing::expect_deterministic_across_threads(
      [&](int threads) { return run_topk(scores, 8, 20000, 2048, TopkImpl::kRadix, {.threads = threads}); }, "radix");
}

TEST(Topk, RejectsBadArguments) {
  std::vector<float> scores(10);
  std::vector<int32_t> out(10);
  TopkParams p{scores.data(), 10, 1, 10, nullptr, 4, out.data(), 4};
  EXPECT_TRUE(topk(p).ok());
  TopkParams bad = p;
  bad.topk = 0;
  EXPECT_EQ(topk(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.out_stride = 3;
  EXPECT_EQ(topk(bad).code(), StatusCode::kInvalidArgument);
  bad = p;
  bad.scores_stride = 5;
  EXPECT_EQ(topk(bad).code(), StatusCode::kInvalidArgument);
  std::vector<int64_t> lens = {11};
  bad = p;
  bad.visible_entries = lens.data();
  EXPECT_EQ(topk(bad).code(), StatusCode::kOutOfRange);
}

}  // namespace
}  // namespace spin
