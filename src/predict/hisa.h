// HisaKeys: the per-layer state of the `hisa` predictor (HISA, arXiv 2603.28458, coarse stage):
// one mean-pooled indexer key per block, kept incrementally — each select folds in only the
// entries committed since the last one — and scored with a row's query by the indexer formula
//   p[b] = Σ_h w[h] · ReLU(q[h] · kbar_b),   kbar_b = (Σ_{o in block b} dequant(k_o)) / count_b
// where dequant(k) = e4m3_to_float(code) · scale (IndexerPageLayout, spin/geometry.h). Only committed entries
// are pooled (row 0's visible prefix), never a step's draft entries, which may still be rewritten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "spin/predict.h"

namespace spin {

// Checks a HisaView against the config and the step (pointers, page size, entry count, heads).
Status check_hisa_view(const PredictorConfig& config, const HisaView& view, int64_t num_entries,
                       int32_t next_n);

class HisaKeys {
 public:
  // Folds entries [pooled so far, committed_entries) into the block sums. O(new entries · 128).
  Status update(const PredictorConfig& config, const HisaView& view, int64_t committed_entries);
  // p[0..n_blocks) for row `row` of the view's query. A block without committed entries (only
  // drafts) scores +FLT_MAX: nothing is known, and it holds the newest entries, so keep it.
  void score(const HisaView& view, int32_t row, int64_t n_blocks, float* p,
             std::vector<float>* query_scratch) const;
  void reset();
  // Keeps the sums of the blocks lying wholly inside the first shared_entries entries.
  void truncate(const PredictorConfig& config, int64_t shared_entries);
  size_t memory_bytes() const { return count_.size() * kHisaBytesPerBlock; }
  int64_t pooled_entries(int64_t block) const {
    return block < static_cast<int64_t>(count_.size()) ? count_[static_cast<size_t>(block)] : 0;
  }
  const float* key_sum(int64_t block) const { return &sum_[static_cast<size_t>(block) * 128]; }

 private:
  std::vector<float> sum_;      // [blocks, 128] dequantised key sums
  std::vector<int32_t> count_;  // [blocks] entries pooled into each sum
  int64_t complete_ = 0;        // blocks [0, complete_) are full and never read again
};

}  // namespace spin
