// Header-only helpers for the predictor tests (tests/predict_*_test.cpp): they play the indexer's
// part of the protocol — score the selected union of a step from given all-keep scores, exactly as
// the kernel writes a row (-inf outside the scored blocks) — and measure block recall. Test-only: it
// lives in tests/, beside the tests that use it.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <memory>
#include <string_view>
#include <vector>

#include <cstring>
#include <numeric>

#include "predict/block_state.h"
#include "predict/predictor_base.h"
#include "spin/numerics.h"
#include "spin/predict.h"
#include "spin/rng.h"

namespace spin::testing {

// make_predictor that must succeed (a test failure otherwise).
inline std::unique_ptr<BlockPredictor> make_checked(std::string_view name, const PredictorConfig& c,
                                                    int32_t layers, int64_t request_id) {
  auto r = make_predictor(name, c, layers, request_id);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

// A predictor's state of one layer: internal to the library (every predictor is a PredictorBase),
// read here by white-box tests.
inline const BlockState& state_of(const BlockPredictor& p, int32_t layer) {
  return dynamic_cast<const PredictorBase&>(p).state(layer);
}

// All-keep scores where every entry of block b (of e entries) equals v[b].
inline std::vector<float> block_scores(const std::vector<float>& v, int32_t e) {
  std::vector<float> s;
  for (float x : v) s.insert(s.end(), static_cast<size_t>(e), x);
  return s;
}

// The predictor tests' small geometry: blocks of 4 entries, top-k 4 (one block), 50 % sparsity,
// with `sink_blocks` sinks and `local_blocks` locals, and no recent window (16 blocks would rank
// nearly every block of these 20-block contexts by recency; the window has its own test).
inline PredictorConfig small_blocks_config(int32_t sink_blocks, int32_t local_blocks) {
  PredictorConfig c;
  c.page_size = 4;
  c.topk = 4;
  c.sink_blocks = sink_blocks;
  c.local_blocks = local_blocks;
  c.target_sparsity = 0.5;
  c.recent_blocks = 0;
  return c;
}

// Row j's buffer after scoring `blocks`: full[pos] for visible entries of those blocks, else -inf.
inline std::vector<float> masked_row(const std::vector<float>& full, int64_t visible,
                                     const std::vector<int32_t>& blocks, int32_t block_entries) {
  std::vector<float> row(full.size(), -std::numeric_limits<float>::infinity());
  for (const int32_t b : blocks) {
    const int64_t begin = static_cast<int64_t>(b) * block_entries;
    const int64_t end = std::min<int64_t>(begin + block_entries, visible);
    for (int64_t p = begin; p < end; ++p)
      row[static_cast<size_t>(p)] = full[static_cast<size_t>(p)];
  }
  return row;
}

// Observes every row of a step: row j is scored on `sel.blocks` (the union) from full[j], the row's
// all-keep scores over num_entries columns.
inline Status observe_union(BlockPredictor& p, int32_t layer, const Selection& sel,
                            const std::vector<std::vector<float>>& full, int64_t num_entries,
                            int32_t next_n) {
  const int32_t e = p.config().block_entries();
  for (int32_t j = 0; j < next_n; ++j) {
    const int64_t visible = visible_entries(num_entries, next_n, j);
    const std::vector<float> row = masked_row(full[static_cast<size_t>(j)], visible, sel.blocks, e);
    RowScores r;
    r.scores = row.data();
    r.num_cols = visible;  // the narrowest buffer a caller may pass: the union reaches past it
    r.visible_entries = visible;
    r.scored_blocks = sel.blocks.data();
    r.num_scored_blocks = static_cast<int64_t>(sel.blocks.size());
    Status s = p.observe(layer, j, r);
    if (!s.ok()) return s;
  }
  return ok_status();
}

// The true top-k of a row (score descending, position ascending), -1 padded to k.
inline std::vector<int32_t> true_topk(const std::vector<float>& full, int64_t visible, int32_t k) {
  std::vector<int32_t> pos;
  for (int32_t i = 0; i < visible; ++i)
    if (full[static_cast<size_t>(i)] != -std::numeric_limits<float>::infinity()) pos.push_back(i);
  const size_t keep = std::min(pos.size(), static_cast<size_t>(k));
  std::partial_sort(pos.begin(), pos.begin() + static_cast<ptrdiff_t>(keep), pos.end(),
                    [&](int32_t a, int32_t b) {
                      const float sa = full[static_cast<size_t>(a)],
                                  sb = full[static_cast<size_t>(b)];
                      return sa > sb || (sa == sb && a < b);
                    });
  pos.resize(keep);
  pos.resize(static_cast<size_t>(k), -1);
  return pos;
}

// Share of the true top-k entries lying in `blocks` (spin/lab/metrics.h block_recall); 1 if none.
inline double block_recall(const std::vector<int32_t>& topk, const std::vector<int32_t>& blocks,
                           int32_t block_entries) {
  int64_t total = 0, in = 0;
  for (const int32_t pos : topk) {
    if (pos < 0) continue;
    ++total;
    in += std::binary_search(blocks.begin(), blocks.end(), pos / block_entries);
  }
  return total == 0 ? 1.0 : static_cast<double>(in) / static_cast<double>(total);
}

// A paged e4m3 key cache (spin/geometry.h layout) with pages scattered by a permutation.
struct Cache {  // (tests: hisa and spin-hybrid)
  int32_t page_size;
  std::vector<uint8_t> bytes;
  std::vector<int32_t> table;
  std::vector<std::vector<float>> keys;  // the dequantised keys, for the reference

  Cache(int32_t ps, const std::vector<std::vector<float>>& raw, uint64_t seed) : page_size(ps) {
    const int64_t pages = (static_cast<int64_t>(raw.size()) + ps - 1) / ps;
    table.resize(static_cast<size_t>(pages));
    std::iota(table.begin(), table.end(), 0);
    CounterRng rng(seed);
    for (int64_t i = pages - 1; i > 0; --i)
      std::swap(table[static_cast<size_t>(i)], table[rng.below(static_cast<uint64_t>(i) + 1)]);
    bytes.assign(static_cast<size_t>(pages * ps * 132), 0);
    for (size_t pos = 0; pos < raw.size(); ++pos) {
      const int64_t page = table[pos / static_cast<size_t>(ps)];
      const int64_t o = static_cast<int64_t>(pos) % ps;
      uint8_t* base = bytes.data() + page * ps * 132;
      std::vector<float> x = raw[pos];
      const float scale = quantize_e4m3_block128(x.data(), base + o * 128);
      std::memcpy(base + ps * 128 + 4 * o, &scale, 4);
      std::vector<float> deq(128);
      for (int d = 0; d < 128; ++d)
        deq[static_cast<size_t>(d)] = e4m3_to_float(base[o * 128 + d]) * scale;
      keys.push_back(deq);
    }
  }
};

}  // namespace spin::testing
