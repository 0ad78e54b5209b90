// Property tests over thousands of random, seeded configurations (CounterRng only): for every
// predictor, every row's selection is sorted, unique, in range, exactly the budget, and holds the
// forced blocks; the union is exactly the union of the rows; two predictors fed the same inputs
// choose the same blocks; and no predictor's block recall beats the oracle's at the same budget.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "predict_testing.h"
#include "spin/numerics.h"
#include "spin/predict.h"
#include "spin/predictor_inputs.h"
#include "spin/rng.h"

namespace spin {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

PredictorConfig random_config(CounterRng& rng) {
  static constexpr int32_t kPageSizes[] = {1, 2, 4, 5, 16, 61, 64};
  PredictorConfig c;
  c.page_size = kPageSizes[rng.below(7)];
  c.block_pages = static_cast<int32_t>(1 + rng.below(3));
  c.topk = static_cast<int32_t>(1 + rng.below(rng.below(2) ? 64 : 600));
  c.target_sparsity = rng.uniform() * 0.95;
  c.explicit_budget_blocks = rng.below(4) == 0 ? static_cast<int32_t>(rng.below(40)) : -1;
  c.sink_blocks = static_cast<int32_t>(rng.below(4));
  c.local_blocks = static_cast<int32_t>(rng.below(4));
  c.explore_ratio = rng.below(3) == 0 ? 0.0 : rng.uniform();
  c.explore_policy = static_cast<ExplorePolicy>(rng.below(2));
  c.alpha = 0.05 + 0.95 * rng.uniform();
  c.beta = 0.05 + 0.95 * rng.uniform();
  c.combine = static_cast<Combine>(rng.below(2));
  c.combine_weight = rng.uniform();
  c.pooling = static_cast<Pooling>(rng.below(4));
  c.mtp_update = static_cast<MtpUpdate>(rng.below(3));
  c.seed = rng.next_u64();
  return c;
}

struct HisaInputs {
  std::vector<uint8_t> cache, q;
  std::vector<int32_t> table;
  std::vector<float> w;
};

HisaInputs random_hisa(CounterRng& rng, int32_t page_size, int64_t max_entries, int32_t heads) {
  HisaInputs h;
  const int64_t pages = (max_entries + page_size - 1) / page_size + 1;
  h.table.resize(static_cast<size_t>(pages));
  std::iota(h.table.begin(), h.table.end(), 0);
  for (int64_t i = pages - 1; i > 0; --i)
    std::swap(h.table[static_cast<size_t>(i)], h.table[rng.below(static_cast<uint64_t>(i) + 1)]);
  h.cache.resize(static_cast<size_t>(pages * page_size * 132));
  for (int64_t p = 0; p < pages; ++p) {
    uint8_t* base = h.cache.data() + p * page_size * 132;
    // Eight codes per draw; the 0xF7 mask clears bit 3, so no code is a NaN (0x7F / 0xFF).
    for (int64_t i = 0; i < page_size * 128; i += 8) {
      const uint64_t codes = rng.next_u64() & 0xF7F7F7F7F7F7F7F7ULL;
      std::memcpy(base + i, &codes, 8);
    }
    for (int64_t o = 0; o < page_size; ++o) {
      const float scale = std::ldexp(1.0f, static_cast<int>(rng.below(6)) - 3);
      std::memcpy(base + page_size * 128 + 4 * o, &scale, 4);
    }
  }
  h.q.resize(static_cast<size_t>(kMaxNextN * heads * 128));
  for (uint8_t& b : h.q) b = static_cast<uint8_t>(rng.below(0x7F) | (rng.below(2) << 7));
  h.w.resize(static_cast<size_t>(kMaxNextN * heads));
  for (float& x : h.w) x = static_cast<float>(rng.uniform() - 0.3);
  return h;
}

bool is_full_layer(const std::string& name, int32_t layer) {
  if (name == "all-keep") return true;
  if (name == "indexcache-2") return layer % 2 == 0;
  if (name == "indexcache-4") return layer % 4 == 0;
  return false;
}

// This (step, layer)'s all-keep scores and true top-k per row: one draw per entry, 1 in 64 masked
// (-inf), else (per row, at random) 5 levels — many ties — or a 24-bit value in ±8.
void random_step_scores(CounterRng& rng, const PredictorConfig& c, int64_t entries, int32_t next_n,
                        std::vector<std::vector<float>>* full, std::vector<int32_t>* top) {
  full->assign(static_cast<size_t>(next_n), {});
  top->assign(static_cast<size_t>(next_n) * c.topk, 0);
  for (int32_t j = 0; j < next_n; ++j) {
    auto& f = (*full)[static_cast<size_t>(j)];
    f.resize(static_cast<size_t>(entries));
    const bool coarse = rng.below(2) == 0;
    for (float& s : f) {
      const uint64_t r = rng.next_u64();
      s = (r & 63) == 0 ? kNegInf
          : coarse      ? static_cast<float>((r >> 8) % 5)
                        : static_cast<float>(static_cast<double>(r >> 40) * 0x1.0p-20 - 8.0);
    }
    const auto t = testing::true_topk(f, visible_entries(entries, next_n, j), c.topk);
    std::copy(t.begin(), t.end(), top->begin() + static_cast<ptrdiff_t>(j) * c.topk);
  }
}

// The rules every selection keeps: each row's set is its budget (every block on a full layer),
// sorted, unique, in range, holds the forced blocks, explores within its budget; the union is
// the rows' sets. *recall = each row's block recall of the true top-k.
void check_selection(const Selection& sel, const PredictorConfig& c, const std::string& name, int32_t layer,
                     int64_t entries, int32_t next_n, const std::vector<int32_t>& top, const std::string& where,
                     std::vector<double>* recall) {
  std::vector<int32_t> u;
  for (int32_t j = 0; j < next_n; ++j) {
    const auto& rb = sel.row_blocks[static_cast<size_t>(j)];
    const int64_t n = blocks_for_entries(c, visible_entries(entries, next_n, j));
    const int64_t want = is_full_layer(name, layer) ? n : budget_blocks(c, n);
    ASSERT_EQ(static_cast<int64_t>(rb.size()), want) << name << " row " << j << " " << where;
    for (size_t i = 0; i < rb.size(); ++i) {
      ASSERT_GE(rb[i], 0);
      ASSERT_LT(rb[i], n);
      if (i > 0) {
        ASSERT_LT(rb[i - 1], rb[i]) << name << " " << where;
      }
    }
    for (int64_t b = 0; b < n; ++b) {
      const bool forced = b < c.sink_blocks || b >= n - c.local_blocks;
      if (forced) {
        ASSERT_TRUE(std::binary_search(rb.begin(), rb.end(), static_cast<int32_t>(b)))
            << name << " forced " << b << " " << where;
      }
    }
    ASSERT_LE(sel.row_explored[static_cast<size_t>(j)], static_cast<int32_t>(rb.size()));
    u.insert(u.end(), rb.begin(), rb.end());
    std::vector<int32_t> tj(top.begin() + static_cast<ptrdiff_t>(j) * c.topk,
                            top.begin() + static_cast<ptrdiff_t>(j + 1) * c.topk);
    recall->push_back(testing::block_recall(tj, rb, c.block_entries()));
  }
  std::sort(u.begin(), u.end());
  u.erase(std::unique(u.begin(), u.end()), u.end());
  ASSERT_EQ(sel.blocks, u) << name << " " << where;
}

TEST(PredictProperty, RandomConfigurations) {
  const std::vector<std::string>& names = predictor_names();
  const int kIters = 2000;
  int64_t checked_rows = 0, oracle_checks = 0;
  for (int iter = 0; iter < kIters; ++iter) {
    CounterRng rng(stream_key(2026, static_cast<uint64_t>(iter)));
    const PredictorConfig c = random_config(rng);
    ASSERT_TRUE(c.validate().ok()) << c.to_string();
    const int32_t e = c.block_entries();
    const int32_t layers = static_cast<int32_t>(1 + rng.below(4));
    const int32_t next_n = static_cast<int32_t>(1 + rng.below(4));
    const int steps = static_cast<int>(2 + rng.below(3));
    const int64_t max_blocks =
        static_cast<int64_t>(rng.below(4) == 0 ? rng.below(6) : 1 + rng.below(160));
    int64_t entries = std::min<int64_t>(max_blocks * e, 1000) + static_cast<int64_t>(rng.below(3));
    const int64_t request = static_cast<int64_t>(rng.below(1000));
    const int32_t heads = static_cast<int32_t>(1 + rng.below(3));
    const HisaInputs hisa = random_hisa(rng, c.page_size, entries + 4 * steps + 8, heads);
    const std::string where = "iter " + std::to_string(iter) + ": " + c.to_string();

    // Every third configuration also runs a twin of each predictor on the same inputs.
    const bool with_twins = iter % 3 == 0;
    std::vector<std::unique_ptr<BlockPredictor>> preds, twins;
    for (const std::string& n : names) {
      preds.push_back(std::move(make_predictor(n, c, layers, request)).value());
      if (with_twins) twins.push_back(std::move(make_predictor(n, c, layers, request)).value());
    }
    Selection sel, twin_sel;
    for (int step = 0; step < steps; ++step) {
      const int32_t accepted = static_cast<int32_t>(rng.below(static_cast<uint64_t>(next_n)));
      for (int32_t layer = 0; layer < layers; ++layer) {
        std::vector<std::vector<float>> full;
        std::vector<int32_t> top;
        random_step_scores(rng, c, entries, next_n, &full, &top);
        HisaView view{hisa.cache.data(),
                      c.page_size,
                      hisa.table.data(),
                      entries,
                      hisa.q.data(),
                      hisa.w.data(),
                      heads,
                      static_cast<int64_t>(hisa.table.size())};
        PredictorInputs inputs;
        StepInput in{step, entries, next_n};
        in.inputs = &inputs;
        inputs.true_topk = top.data();
        inputs.hisa = &view;
        std::vector<std::vector<double>> oracle_recall;
        for (size_t pi = 0; pi < names.size(); ++pi) {
          const std::string& name = names[pi];
          Status s = preds[pi]->select(layer, in, &sel);
          ASSERT_TRUE(s.ok()) << name << " " << s.to_string() << " " << where;
          if (with_twins) {
            ASSERT_TRUE(twins[pi]->select(layer, in, &twin_sel).ok());
            ASSERT_EQ(sel.blocks, twin_sel.blocks) << name << " " << where;
            ASSERT_EQ(sel.row_blocks, twin_sel.row_blocks) << name << " " << where;
          }
          ASSERT_EQ(sel.row_blocks.size(), static_cast<size_t>(next_n));
          std::vector<double> recall;
          check_selection(sel, c, name, layer, entries, next_n, top, where, &recall);
          if (::testing::Test::HasFatalFailure()) return;
          checked_rows += next_n;
          // Full layers score more than the budget: they are not held to the oracle's bound.
          oracle_recall.push_back(is_full_layer(name, layer) ? std::vector<double>{} : recall);
          ASSERT_TRUE(testing::observe_union(*preds[pi], layer, sel, full, entries, next_n).ok());
          if (with_twins) {
            ASSERT_TRUE(testing::observe_union(*twins[pi], layer, sel, full, entries, next_n).ok());
          }
        }
        const size_t oi =
            static_cast<size_t>(std::find(names.begin(), names.end(), "oracle") - names.begin());
        for (size_t pi = 0; pi < names.size(); ++pi) {
          for (size_t j = 0; j < oracle_recall[pi].size(); ++j) {
            ASSERT_LE(oracle_recall[pi][j], oracle_recall[oi][j] + 1e-12)
                << names[pi] << " beats the oracle, row " << j << " " << where;
            ++oracle_checks;
          }
        }
      }
      for (size_t pi = 0; pi < names.size(); ++pi) {
        ASSERT_TRUE(preds[pi]->commit(accepted).ok()) << names[pi];
        if (with_twins) {
          ASSERT_TRUE(twins[pi]->commit(accepted).ok());
        }
      }
      entries += accepted + 1;  // the accepted drafts plus the bonus token
    }
  }
  std::printf("checked %lld rows, %lld oracle comparisons\n", static_cast<long long>(checked_rows),
              static_cast<long long>(oracle_checks));
}

}  // namespace
}  // namespace spin
