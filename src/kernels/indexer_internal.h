// Internal interface between the indexer front end (validation, tiling, dispatch: indexer.cpp)
// and its implementations (indexer_reference.cpp, indexer_portable.cpp, indexer_avx512.cpp,
// and the fp32-FMA kernels of simd_avx512f.cpp, simd_avx2.cpp and simd_neon.cpp; simd_neon_bf16.cpp). CPU checks: cpu_features.h.
#pragma once

#include <cstdint>
#include <cstring>
#include <vector>

#include "spin/geometry.h"
#include "spin/indexer.h"

namespace spin::detail {

// Largest number of entries processed as one key tile. A tile never crosses a page (pages are
// scattered in memory), and 32 entries of converted bf16 keys (8 KiB) stay in L1 beside the packed
// queries of one row (16 KiB at 64 heads). Set by `spin bench indexer` on Zen 4 (16/32/64 tried).
inline constexpr int32_t kTileEntries = 32;

// Entries [first_entry, first_entry + count) of one request, all inside one physical page.
struct IndexerTile {
  int32_t request;
  int32_t physical_page;
  int64_t first_entry;  // request-local entry position
  int32_t count;
};

// Splits the visible (and, when masked, selected) entries of every request into tiles.
std::vector<IndexerTile> plan_indexer_tiles(const IndexerParams& params);

// Writes -inf to every output column [0, logits_cols) of every row.
void fill_logits_neg_inf(const IndexerParams& params, int num_threads);

// Each implementation scores the planned tiles (outputs already -inf filled).
void indexer_run_portable(const IndexerParams& params, const std::vector<IndexerTile>& tiles,
                          int num_threads);
void indexer_run_avx512bf16(const IndexerParams& params, const std::vector<IndexerTile>& tiles,
                            int num_threads);
// The fp32-FMA kernel (indexer_fp32_simd.h) for CPUs without a bf16 dot.
void indexer_run_avx512f(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads);
void indexer_run_avx2(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads);
void indexer_run_neon(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads);
// BFDOT on FEAT_BF16 cores (simd_neon_bf16.cpp).
void indexer_run_neon_bf16(const IndexerParams& params, const std::vector<IndexerTile>& tiles, int num_threads);

// Scalar ground truth with double accumulation; plans nothing, walks entries directly.
void indexer_run_reference(const IndexerParams& params);

// score_fp32_keys (spin/indexer.h) per path: the scalar ground truth (double), plain C++, and the
// fp32-FMA micro-tiles of indexer_fp32_simd.h.
void fp32_keys_run_reference(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out);
void fp32_keys_run_portable(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out);
void fp32_keys_run_avx512f(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out);
void fp32_keys_run_avx2(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out);
void fp32_keys_run_neon(const float* keys, int64_t count, const float* q, const float* w, int32_t heads, float* out);

// Pages sit at random addresses, so the hardware prefetcher cannot run ahead across tiles: the
// kernels fetch the next tile's values into L1 while this one computes (a few µs per tile).
inline void prefetch_tile_values(const IndexerParams& p, const IndexerTile& next) {
  const IndexerPageLayout layout{p.page_size};
  const uint8_t* values = p.key_cache + next.physical_page * layout.page_bytes() +
                          layout.value_offset(static_cast<int32_t>(next.first_entry % p.page_size));
  for (int32_t line = 0; line < next.count * kEntryValueBytes; line += 64) __builtin_prefetch(values + line, 0, 3);
}

// logits[row, first_entry + i] = k_scale[i] · (scores[i] · unscale) for the tile's first `count`
// entries (unscale is an exact power of two that undoes a kernel's operand scaling, else 1).
inline void write_tile_scores(const IndexerParams& p, const IndexerTile& tile, int64_t row, int32_t count,
                              const float* scores, float unscale) {
  const IndexerPageLayout layout{p.page_size};
  const uint8_t* page = p.key_cache + tile.physical_page * layout.page_bytes();
  const int32_t first_offset = static_cast<int32_t>(tile.first_entry % p.page_size);
  float* out = p.logits + row * p.logits_stride + tile.first_entry;
  for (int32_t i = 0; i < count; ++i) {
    float k_scale;
    std::memcpy(&k_scale, page + layout.scale_offset(first_offset + i), sizeof(float));
    out[i] = k_scale * (scores[i] * unscale);
  }
}

inline int32_t padded_heads(int32_t num_heads) { return (num_heads + 63) / 64 * 64; }

}  // namespace spin::detail
