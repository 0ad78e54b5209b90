// spin/topk.h — per-row top-k over indexer scores, in the format sparse MLA consumes.
//
// For each row, the selected SET is the first k finite scores in the order (score descending,
// position ascending): a deterministic tie rule, so tensor-parallel ranks holding identical scores
// always agree. -0.0 and +0.0 are equal. NaN and ±inf count as "not scored" (the indexer writes
// -inf for skipped or invisible entries). Output: int32 [rows, k] request-local positions in
// ASCENDING order, padded with -1 at the end when a row has fewer than k finite scores.
#pragma once

#include <cstdint>

#include "spin/status.h"

namespace spin {

struct TopkParams {
  const float* scores = nullptr;  // [rows, scores_stride]
  int64_t scores_stride = 0;
  int32_t rows = 0;
  int64_t cols = 0;                  // columns read per row
  const int64_t* visible_entries = nullptr;  // optional [rows]: read only the first visible_entries[r] ≤ cols
  int32_t topk = 0;
  int32_t* out = nullptr;  // [rows, out_stride], out_stride ≥ topk
  int64_t out_stride = 0;
};

enum class TopkImpl {
  kAuto = 0,   // radix select
  kRadix,      // O(cols) radix select on order-preserving integer keys
  kReference,  // sort by (score desc, position asc); the ground truth
};
const char* topk_impl_name(TopkImpl impl);

struct TopkOptions {
  TopkImpl impl = TopkImpl::kAuto;
  int num_threads = 0;  // rows are split across threads; 0 = OpenMP default
};

Status validate_topk_params(const TopkParams& params);
Status topk(const TopkParams& params, const TopkOptions& options = {});

}  // namespace spin
