// Scalar reference indexer: boring loops, double accumulation, no tiling — the ground truth the
// fast kernels are compared against. Walks every (request, row, visible entry) directly so that
// it also cross-checks the tile planner of the fast paths.
#include <algorithm>
#include <cstring>
#include <limits>
#include <vector>

#include "kernels/indexer_internal.h"
#include "spin/cache.h"
#include "spin/numerics.h"

namespace spin::detail {

void indexer_run_reference(const IndexerParams& p) {
  const IndexerPageLayout layout{p.page_size};
  const int64_t block_entries = int64_t{p.block_pages} * p.page_size;
  for (int32_t b = 0; b < p.batch; ++b) {
    // Which entries are selected: all, or those of the listed blocks.
    const int64_t entries = visible_entries(p.context_lens[b], p.next_n, p.next_n - 1, p.compress_ratio);
    std::vector<char> selected(static_cast<size_t>(entries), p.block_offsets == nullptr ? 1 : 0);
    if (p.block_offsets != nullptr) {
      for (int32_t i = p.block_offsets[b]; i < p.block_offsets[b + 1]; ++i) {
        const int64_t first = p.block_ids[i] * block_entries;
        for (int64_t s = first; s < std::min(first + block_entries, entries); ++s) selected[s] = 1;
      }
    }
    for (int32_t r = 0; r < p.next_n; ++r) {
      const int64_t row = int64_t{b} * p.next_n + r;
      float* out = p.logits + row * p.logits_stride;
      std::fill_n(out, p.logits_cols, -std::numeric_limits<float>::infinity());
      const int64_t visible = visible_entries(p.context_lens[b], p.next_n, r, p.compress_ratio);
      const uint8_t* q = p.q + row * p.num_heads * kIndexerHeadDim;
      const float* w = p.weights + row * p.num_heads;
      for (int64_t s = 0; s < visible; ++s) {
        if (!selected[s]) continue;
        const int32_t phys = p.block_table[int64_t{b} * p.block_table_stride + s / p.page_size];
        const uint8_t* page = p.key_cache + phys * layout.page_bytes();
        const int32_t offset = static_cast<int32_t>(s % p.page_size);
        const uint8_t* k = page + layout.value_offset(offset);
        float k_scale;
        std::memcpy(&k_scale, page + layout.scale_offset(offset), sizeof(float));
        double total = 0.0;
        for (int32_t h = 0; h < p.num_heads; ++h) {
          double dot = 0.0;
          for (int d = 0; d < kIndexerHeadDim; ++d) {
            dot += double{e4m3_to_float(q[h * kIndexerHeadDim + d])} * double{e4m3_to_float(k[d])};
          }
          total += double{w[h]} * std::max(dot, 0.0);
        }
        out[s] = static_cast<float>(double{k_scale} * total);
      }
    }
  }
}

// score_fp32_keys' ground truth: each dot and the head sum in double, rounded once.
void fp32_keys_run_reference(const float* keys, int64_t count, const float* q, const float* w, int32_t heads,
                             float* out) {
  for (int64_t i = 0; i < count; ++i) {
    double total = 0;
    for (int32_t h = 0; h < heads; ++h) {
      double dot = 0;
      for (int d = 0; d < kIndexerHeadDim; ++d) {
        dot += static_cast<double>(keys[i * kIndexerHeadDim + d]) * q[h * kIndexerHeadDim + d];
      }
      total += static_cast<double>(w[h]) * std::max(dot, 0.0);
    }
    out[i] = static_cast<float>(total);
  }
}

}  // namespace spin::detail
