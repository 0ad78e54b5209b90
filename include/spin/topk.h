// spin/topk.h — per-row top-k over indexer scores, in the format sparse MLA consumes.
//
// For each row, the selected SET is the first k finite scores in the order (score descending,
// position ascending): a deterministic tie rule, so tensor-parallel ranks holding identical scores
// always agree. -0.0 and +0.0 are equal. NaN and ±inf count as "not scored" (the indexer writes
// -inf for skipped or invisible entries). Output: int32 [rows, k] request-local positions in
// ASCENDING order, padded with -1 at the end when a row has fewer than k finite scores.
//
// Row r reads its first n_r = visible_entries[r] (or cols) scores — or, with a block mask, only
// the entries of its scored blocks: block b covers [b·block_entries, (b+1)·block_entries) ∩ [0, n_r).
// The masked result is exactly the full-row result over the row with every other entry set to
// -inf (what the block-masked indexer writes), but reads only (1 - sparsity) of the row. Why it
// matters: on an H200 at batch 1 the top-k is ~77 % of the indexer's time (the paged-logits kernel
// itself is memory-bound), so skipping blocks pays only if top-k skips them too. The mask is the
// indexer's own CSR (IndexerParams::block_offsets / block_ids, block_entries = page_size ·
// block_pages), shared by the next_n rows of a request.
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
  // --- Optional block mask (CSR over masks); null block_offsets = read every entry of the row ---
  const int32_t* block_ids = nullptr;      // sorted, unique logical block ids of each mask (≥ 0);
                                           // blocks starting at or past a row's n_r are skipped
  const int32_t* block_offsets = nullptr;  // [rows / rows_per_mask + 1]: mask m owns ids
                                           // [block_offsets[m], block_offsets[m+1])
  int32_t rows_per_mask = 1;  // consecutive rows sharing one mask (the indexer's next_n); divides rows
  int64_t block_entries = 0;  // entries per block (page_size · block_pages), ≥ 1 with a mask
};

enum class TopkImpl {
  kAuto = 0,   // radix select
  kRadix,      // one streaming pass with a rising threshold, radix select on the survivors
  kReference,  // sort by (score desc, position asc) over the -inf-padded row; the ground truth
};
const char* topk_impl_name(TopkImpl impl);

struct TopkOptions {
  TopkImpl impl = TopkImpl::kAuto;
  int num_threads = 0;  // rows are split across threads; 0 = OpenMP default
};

Status validate_topk_params(const TopkParams& params);
Status topk(const TopkParams& params, const TopkOptions& options = {});

}  // namespace spin
