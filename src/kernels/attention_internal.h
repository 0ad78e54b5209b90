// Internal interface between the sparse-attention front end (validation, dispatch: attention.cpp)
// and its implementations (attention_reference.cpp: reference + portable; attention_avx512.cpp).
#pragma once

#include <cstdint>

#include "spin/attention.h"

namespace spin::detail {

// Entries per online-softmax tile. A compile-time constant of the algorithm (it fixes where the
// running max is rescaled), never derived from the thread count, so results do not depend on
// it. 48 is a multiple of every micro-kernel height (6, 8, 12, 24 entries) so full tiles need
// no padding; 48 bf16 keys (54 KiB) stay in L2 beside the task's o and packed q.
// Timed on Zen 4 (1 thread; heads 128 / topk 2048 and heads 64 / topk 512 + 128): 24, 48 and 96
// are within 2% of each other.
inline constexpr int32_t kAttentionTileEntries = 48;

// Collects the valid selected entries of row `row` ([indices ‖ extra_indices] with -1 skipped,
// in that order) into `out` (room for topk + n_extra); returns how many.
inline int32_t attention_selected_entries(const SparseAttentionParams& p, int64_t row, int32_t* out) {
  int32_t n = 0;
  const int32_t* idx = p.indices + row * p.topk;
  for (int32_t i = 0; i < p.topk; ++i) {
    if (idx[i] >= 0) out[n++] = idx[i];
  }
  const int32_t* extra = p.extra_indices + row * p.n_extra;
  for (int32_t i = 0; i < p.n_extra; ++i) {
    if (extra[i] >= 0) out[n++] = extra[i];
  }
  return n;
}

// Address of request `b`'s entry `position` (validated beforehand).
inline const uint8_t* attention_entry(const SparseAttentionParams& p, int32_t b, int32_t position) {
  const LatentPageLayout layout{p.dtype, p.page_size};
  const int32_t phys = p.block_table[int64_t{b} * p.block_table_stride + position / p.page_size];
  return p.latent_cache + phys * layout.page_bytes() + layout.entry_offset(position % p.page_size);
}

// Each implementation fills out (and lse) for every row; parameters are already validated.
void attention_run_reference(const SparseAttentionParams& params);
void attention_run_portable(const SparseAttentionParams& params, int num_threads);
void attention_run_avx512bf16(const SparseAttentionParams& params, int num_threads, int heads_per_task,
                              bool bf16_probabilities);
// The fp32-FMA kernel (attention_fp32_simd.h) for CPUs without a bf16 dot.
// heads_per_task as AttentionOptions (0 = auto), rounded up to whole head chunks of the target.
void attention_run_avx512f(const SparseAttentionParams& params, int num_threads, int heads_per_task);
void attention_run_avx2(const SparseAttentionParams& params, int num_threads, int heads_per_task);
void attention_run_neon(const SparseAttentionParams& params, int num_threads, int heads_per_task);  // aarch64 only

}  // namespace spin::detail
