// Portable indexer kernel: plain C++ in fp32 for any CPU. Keys are widened per tile and queries
// are stored transposed ([dim][head]) so the inner loop runs over heads and vectorises without
// reassociating any sum (each (row, head, entry) dot is still summed in dimension order).
#include <omp.h>

#include <algorithm>
#include <cstring>
#include <vector>

#include "kernels/indexer_internal.h"
#include "spin/cache.h"
#include "spin/numerics.h"

namespace spin::detail {

void indexer_run_portable(const IndexerParams& p, const std::vector<IndexerTile>& tiles, int num_threads) {
  const IndexerPageLayout layout{p.page_size};
  const int32_t heads = p.num_heads;
  const int64_t rows = int64_t{p.batch} * p.next_n;
  // q transposed per row: [row][dim][head], widened to fp32 once per call.
  std::vector<float> q_t(static_cast<size_t>(rows) * kIndexerHeadDim * heads);
  for (int64_t r = 0; r < rows; ++r) {
    for (int32_t h = 0; h < heads; ++h) {
      for (int d = 0; d < kIndexerHeadDim; ++d) {
        q_t[(r * kIndexerHeadDim + d) * heads + h] = e4m3_to_float(p.q[(r * heads + h) * kIndexerHeadDim + d]);
      }
    }
  }
  const int64_t n_tiles = static_cast<int64_t>(tiles.size());
#pragma omp parallel num_threads(num_threads)
  {
    std::vector<float> key(kIndexerHeadDim);
    std::vector<float> acc(static_cast<size_t>(heads));
#pragma omp for schedule(static)
    for (int64_t t = 0; t < n_tiles; ++t) {
      const IndexerTile& tile = tiles[t];
      const uint8_t* page = p.key_cache + tile.physical_page * layout.page_bytes();
      const int32_t first_offset = static_cast<int32_t>(tile.first_entry % p.page_size);
      for (int32_t i = 0; i < tile.count; ++i) {
        const int32_t offset = first_offset + i;
        const uint8_t* k = page + layout.value_offset(offset);
        float k_scale;
        std::memcpy(&k_scale, page + layout.scale_offset(offset), sizeof(float));
        for (int d = 0; d < kIndexerHeadDim; ++d) key[d] = e4m3_to_float(k[d]);
        const int64_t s = tile.first_entry + i;
        for (int32_t r = 0; r < p.next_n; ++r) {
          if (s >= visible_entries(p.context_lens[tile.request], p.next_n, r, p.compress_ratio)) continue;
          const int64_t row = int64_t{tile.request} * p.next_n + r;
          const float* qr = q_t.data() + row * kIndexerHeadDim * heads;
          std::fill(acc.begin(), acc.end(), 0.0f);
          for (int d = 0; d < kIndexerHeadDim; ++d) {
            const float kd = key[d];
            for (int32_t h = 0; h < heads; ++h) acc[h] += qr[d * heads + h] * kd;
          }
          const float* w = p.weights + row * heads;
          float total = 0.0f;
          for (int32_t h = 0; h < heads; ++h) total += w[h] * std::max(acc[h], 0.0f);
          p.logits[row * p.logits_stride + s] = k_scale * total;
        }
      }
    }
  }
}

// score_fp32_keys in plain C++: 8 independent partial sums per dot, so the compiler widens it at
// the baseline ISA without -ffast-math (what HisaKeys::score did before it called the kernels).
void fp32_keys_run_portable(const float* keys, int64_t count, const float* q, const float* w, int32_t heads,
                            float* out) {
  for (int64_t i = 0; i < count; ++i) {
    const float* k = keys + i * kIndexerHeadDim;
    float total = 0.0f;
    for (int32_t h = 0; h < heads; ++h) {
      const float* qh = q + h * kIndexerHeadDim;
      float acc[8] = {};
      for (int d = 0; d < kIndexerHeadDim; d += 8) {
        for (int j = 0; j < 8; ++j) acc[j] += k[d + j] * qh[d + j];
      }
      const float dot = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
      if (dot > 0.0f) total += w[h] * dot;
    }
    out[i] = total;
  }
}

}  // namespace spin::detail
