// Internal to src/eval: a trace's all-keep ground truth, as replay reads it. Built by score_trace
// (replay_scoring.cpp), read by the replay (replay.cpp) and the conversion to a score trace
// (replay_outputs.cpp); spin/lab/replay.h only forward-declares it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "spin/cache.h"
#include "spin/geometry.h"
#include "spin/predict.h"
#include "spin/lab/replay.h"
#include "spin/status.h"

namespace spin {

class ScoredTrace {
 public:
  int32_t layers = 0;
  int32_t next_n = 1;
  int32_t num_heads = 64;
  int32_t topk = 2048;
  int32_t page_size = kDefaultPageSize;
  int32_t compress_ratio = 1;
  int64_t steps = 0;
  std::vector<int64_t> ctx_len;
  std::vector<int32_t> accepted;        // [steps], or empty
  bool has_keys = false;                // built from a key trace (caches below are filled)
  std::vector<IndexerKeyCache> caches;  // one per layer, pages in logical order
  std::vector<int32_t> identity_pages;  // logical page i = physical page i
  // Indexed by (layer · steps + step) · next_n + row.
  std::vector<std::vector<float>> scores;   // [visible] all-keep scores
  std::vector<std::vector<int32_t>> truth;  // [topk] all-keep top-k, -1 padded
  std::vector<int64_t> visible_entries;  // entries each row sees
  // A score trace's block probe (ScoreTrace::probe), [layers][steps, next_n, probe_blocks[l]]; empty if none.
  std::vector<std::vector<float>> probe;
  std::vector<int64_t> probe_blocks;  // [layers]
  int32_t probe_block_entries = 0;

  size_t index(int32_t l, int64_t s, int32_t j) const {
    return static_cast<size_t>((l * steps + s) * next_n + j);
  }
  int64_t entries_at(int64_t s) const {
    return spin::visible_entries(ctx_len[s], next_n, next_n - 1, compress_ratio);
  }
};

namespace replay_internal {

// Names where in the trace a failure happened ("layer 3, step 17, row 1: ...").
inline Status at_row(const Status& s, int32_t layer, int64_t step, int32_t row = -1) {
  if (s.ok()) return s;
  const std::string where = row >= 0 ? fmt::format("layer {}, step {}, row {}", layer, step, row)
                                     : fmt::format("layer {}, step {}", layer, step);
  return {s.code(), where + ": " + s.message()};
}

}  // namespace replay_internal
}  // namespace spin
