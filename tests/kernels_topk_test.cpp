// Top-k: radix select against the sorting reference — exact sets on tie-free inputs, the
// (score desc, position asc) rule on constructed ties, padding, guards, determinism.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "kernel_harness.h"
#include "spin/memory.h"
#include "spin/rng.h"
#include "spin/topk.h"

namespace spin {
namespace {

using testing::GuardedBuffer;

// A block mask for TopkParams: CSR over masks, each shared by rows_per_mask consecutive rows.
struct BlockMask {
  std::vector<int32_t> ids;
  std::vector<int32_t> offsets;  // [masks + 1]
  int32_t rows_per_mask = 1;
  int64_t block_entries = 1;
};

struct RunOptions {
  const std::vector<int64_t>* visible_entries = nullptr;  // null: every row reads all cols
  int threads = 0;
  const BlockMask* mask = nullptr;  // null: every entry of the row
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
  if (o.mask != nullptr) {
    p.block_ids = o.mask->ids.data();
    p.block_offsets = o.mask->offsets.data();
    p.rows_per_mask = o.mask->rows_per_mask;
    p.block_entries = o.mask->block_entries;
  }
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

// The -inf-padded rows a block-masked indexer writes: every entry outside the row's blocks (or
// past its visible length) is -inf. The masked top-k must equal the full-row top-k over these.
std::vector<float> pad_unscored(const std::vector<float>& scores, int32_t rows, int64_t cols,
                                const std::vector<int64_t>& lens, const BlockMask& mask) {
  std::vector<float> padded(scores.size(), -std::numeric_limits<float>::infinity());
  for (int32_t r = 0; r < rows; ++r) {
    const int32_t m = r / mask.rows_per_mask;
    for (int32_t i = mask.offsets[m]; i < mask.offsets[m + 1]; ++i) {
      for (int64_t e = mask.ids[i] * mask.block_entries; e < (mask.ids[i] + 1) * mask.block_entries; ++e) {
        if (e < lens[r]) padded[r * cols + e] = scores[r * cols + e];
      }
    }
  }
  return padded;
}

// Hostile masked shapes: page sizes 1/5/61/64/69 × block_pages 1/3, next_n 1–3 rows per mask with
// ragged visible lengths (the last block partially visible, blocks past a row's end), empty
// masks, rows with fewer scored entries than k, heavy ties across blocks, NaN and ±inf inside
// scored blocks. Radix and reference over the mask, and radix over the padded full row, agree.
TEST(Topk, BlockMaskMatchesFullRowOverPaddedScores) {
  CounterRng rng(stream_key(0xB10C));
  int cases = 0;
  for (int32_t page_size : {1, 5, 61, 64, 69}) {
    for (int32_t block_pages : {1, 3}) {
      for (int32_t next_n : {1, 2, 3}) {
        for (int32_t k : {1, 7, 300, 2048}) {
          const int64_t E = int64_t{page_size} * block_pages;
          const int32_t masks = 2 + static_cast<int32_t>(rng.below(2));
          const int32_t rows = masks * next_n;
          const int64_t cols = static_cast<int64_t>(rng.below(12000)) + 1;
          const bool ties = rng.below(2) == 0;
          std::vector<float> scores(static_cast<size_t>(rows) * cols);
          for (float& s : scores) {
            const double u = rng.uniform();
            s = u < 0.02 ? -std::numeric_limits<float>::infinity()
                : u < 0.03 ? std::numeric_limits<float>::quiet_NaN()
                : u < 0.035 ? std::numeric_limits<float>::infinity()
                : ties ? static_cast<float>(rng.below(6)) - 2.5f  // ties across blocks, incl. ±0 below
                       : static_cast<float>(rng.normal() * 4);
          }
          if (ties) scores[0] = -0.0f;
          std::vector<int64_t> lens(static_cast<size_t>(rows));
          BlockMask mask;
          mask.rows_per_mask = next_n;
          mask.block_entries = E;
          mask.offsets.push_back(0);
          for (int32_t m = 0; m < masks; ++m) {
            // Ragged: row j of next_n sees a little more than row j-1; the last may see all cols.
            const int64_t base = static_cast<int64_t>(rng.below(static_cast<uint64_t>(cols) + 1));
            for (int32_t j = 0; j < next_n; ++j) lens[m * next_n + j] = std::min<int64_t>(cols, base + j * 3);
            const int64_t n_blocks = (cols + E - 1) / E + 2;  // ids past the end too: skipped
            const double keep = m == 0 ? 0.0 : rng.uniform();  // mask 0 empty
            for (int64_t b = 0; b < n_blocks; ++b) {
              if (rng.uniform() < keep) mask.ids.push_back(static_cast<int32_t>(b));
            }
            mask.offsets.push_back(static_cast<int32_t>(mask.ids.size()));
          }
          const std::string name = "page " + std::to_string(page_size) + " block_pages " +
                                   std::to_string(block_pages) + " next_n " + std::to_string(next_n) + " k " +
                                   std::to_string(k) + " cols " + std::to_string(cols);
          SCOPED_TRACE(name);
          const RunOptions masked{.visible_entries = &lens, .mask = &mask};
          const std::vector<float> padded = pad_unscored(scores, rows, cols, lens, mask);
          const auto full = run_topk(padded, rows, cols, k, TopkImpl::kReference, {.visible_entries = &lens});
          testing::for_each_fast_impl_against_reference<TopkImpl>(
              [&](TopkImpl impl) { return run_topk(scores, rows, cols, k, impl, masked); },
              [&](TopkImpl, const std::vector<int32_t>& fast, const std::vector<int32_t>& ref) {
                ASSERT_EQ(fast, ref);
                ASSERT_EQ(fast, full);
                for (int32_t r = 0; r < rows; ++r) {
                  std::vector<float> row(padded.begin() + r * cols, padded.begin() + r * cols + lens[r]);
                  check_well_formed(row, lens[r], k, fast.data() + r * k);
                }
              });
          ASSERT_EQ(run_topk(padded, rows, cols, k, TopkImpl::kRadix, {.visible_entries = &lens}), full);
          ++cases;
        }
      }
    }
  }
  EXPECT_EQ(cases, 5 * 2 * 3 * 4);
}

// Long rows with a rising threshold: sorted ascending (every entry a candidate, the buffer reduces
// again and again), descending, and a constant row (all ties: lowest positions), with and without
// a mask — radix against the reference.
TEST(Topk, AdversarialOrdersMatchReference) {
  const int64_t cols = 100000;
  std::vector<std::vector<float>> inputs(3, std::vector<float>(cols));
  for (int64_t i = 0; i < cols; ++i) {
    inputs[0][i] = static_cast<float>(i) * 0.5f;
    inputs[1][i] = -static_cast<float>(i);
    inputs[2][i] = 1.0f;
  }
  BlockMask mask;
  mask.block_entries = 64;
  mask.offsets = {0};
  for (int32_t b = 0; b < (cols + 63) / 64; b += 2) mask.ids.push_back(b);
  mask.offsets.push_back(static_cast<int32_t>(mask.ids.size()));
  for (const auto& scores : inputs) {
    for (const BlockMask* m : {static_cast<const BlockMask*>(nullptr), static_cast<const BlockMask*>(&mask)}) {
      for (int32_t k : {1, 2048, 9000}) {
        EXPECT_EQ(run_topk(scores, 1, cols, k, TopkImpl::kRadix, {.mask = m}),
                  run_topk(scores, 1, cols, k, TopkImpl::kReference, {.mask = m}))
            << "k " << k << (m ? " masked" : "");
      }
    }
  }
}

TEST(Topk, BlockMaskDeterministicAcrossThreads) {
  CounterRng rng(stream_key(78));
  std::vector<float> scores(8 * 20000);
  for (float& s : scores) s = static_cast<float>(std::round(rng.normal() * 50));  // many ties
  BlockMask mask;
  mask.rows_per_mask = 2;
  mask.block_entries = 64;
  mask.offsets = {0};
  for (int32_t m = 0; m < 4; ++m) {
    for (int32_t b = 0; b < 20000 / 64 + 1; ++b) {
      if (rng.uniform() < 0.5) mask.ids.push_back(b);
    }
    mask.offsets.push_back(static_cast<int32_t>(mask.ids.size()));
  }
  testing::expect_deterministic_across_threads(
      [&](int threads) {
        return run_topk(scores, 8, 20000, 2048, TopkImpl::kRadix, {.threads = threads, .mask = &mask});
      },
      "radix masked");
}

TEST(Topk, RejectsBadBlockMasks) {
  std::vector<float> scores(20);
  std::vector<int32_t> out(8);
  std::vector<int32_t> ids = {0, 2, 1};
  std::vector<int32_t> offsets = {0, 2, 3};
  TopkParams p{scores.data(), 10, 2, 10, nullptr, 4, out.data(), 4};
  p.block_ids = ids.data();
  p.block_offsets = offsets.data();
  p.block_entries = 4;
  EXPECT_TRUE(topk(p).ok());
  TopkParams bad = p;
  bad.block_entries = 0;
  testing::expect_status(topk(bad), StatusCode::kInvalidArgument, "block_entries");
  bad = p;
  bad.rows_per_mask = 0;
  testing::expect_status(topk(bad), StatusCode::kInvalidArgument, "rows_per_mask");
  bad = p;
  bad.rows_per_mask = 3;  // 2 rows
  testing::expect_status(topk(bad), StatusCode::kInvalidArgument, "multiple of rows_per_mask");
  bad = p;
  bad.rows_per_mask = 2;  // one mask of ids {0, 2} is fine
  EXPECT_TRUE(topk(bad).ok());
  std::vector<int32_t> unsorted = {0, 2, 2};
  bad = p;
  bad.block_ids = unsorted.data();
  std::vector<int32_t> off2 = {0, 1, 3};
  bad.block_offsets = off2.data();
  testing::expect_status(topk(bad), StatusCode::kInvalidArgument, "sorted ascending and unique");
  std::vector<int32_t> negative = {-1, 0, 1};
  bad = p;
  bad.block_ids = negative.data();
  testing::expect_status(topk(bad), StatusCode::kOutOfRange, "block -1");
  // A thread count above the machine's is refused, not handed to OpenMP.
  testing::expect_status(topk(p, {TopkImpl::kAuto, max_threads() + 1}), StatusCode::kInvalidArgument, "num_threads");
  EXPECT_TRUE(topk(p, {TopkImpl::kAuto, max_threads()}).ok());
  std::vector<int32_t> backwards = {0, 2, 1};
  bad = p;
  bad.block_offsets = backwards.data();
  testing::expect_status(topk(bad), StatusCode::kInvalidArgument, "not a valid range");
  bad = p;
  bad.block_ids = nullptr;
  testing::expect_status(topk(bad), StatusCode::kInvalidArgument, "block_ids is null");
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
