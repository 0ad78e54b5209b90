// HisaKeys: the per-layer state of the `hisa` predictor (HISA, arXiv 2603.28458, coarse stage)
// and of spin-hybrid's probe: one mean-pooled indexer key per pool of `pool_entries` entries (hisa:
// one pool per block), kept incrementally — each select folds in only the entries committed since
// the last one — and scored with a row's query by the indexer formula
//   p[g] = Σ_h w[h] · ReLU(q[h] · kbar_g),   kbar_g = (Σ_{o in pool g} dequant(k_o)) / count_g
// and a block scores as its best pool.
// where dequant(k) = e4m3_to_float(code) · scale (IndexerPageLayout, spin/geometry.h). Only committed entries
// are pooled (row 0's visible prefix), never a step's draft entries, which may still be rewritten.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "spin/predict.h"
#include "spin/predictor_inputs.h"

namespace spin {

// hisa keeps a 128-float key sum + int32 pooled-entry count per block per layer, beside the state.
inline constexpr size_t kHisaBytesPerBlock = 128 * 4 + 4;

// Checks a HisaView against the config and the step (pointers, page size, entry count, heads).
Status check_hisa_view(const PredictorConfig& config, const HisaView& view, int64_t num_entries,
                       int32_t next_n);

class HisaKeys {
 public:
  // pool_entries must divide the config's block_entries (PredictorConfig::validate checks it).
  explicit HisaKeys(int32_t pool_entries = kDefaultPageSize) : pool_(pool_entries) {}

  // Folds entries [pooled so far, committed_entries) into the pool sums. O(new entries · 128).
  Status update(const HisaView& view, int64_t committed_entries);
  // p[0..n_blocks) for row `row` of the view's query, blocks of `block_entries` entries. A block
  // without committed entries (only drafts) scores +FLT_MAX: nothing is known, and it holds the
  // newest entries, so keep it. *scored: the pools scored (the probe's work in entry-equivalents).
  // The pools are scored by the indexer's fp32-key kernel (score_fp32_keys, spin/indexer.h).
  Status score(const HisaView& view, int32_t row, int64_t n_blocks, int32_t block_entries, float* p,
               int64_t* scored, std::vector<float>* scratch) const;
  void reset();
  // Keeps the sums of the pools lying wholly inside the first shared_entries entries.
  void truncate(int64_t shared_entries);
  size_t memory_bytes() const { return count_.size() * kHisaBytesPerBlock; }
  int32_t pool_entries() const { return pool_; }
  int64_t pooled_entries(int64_t pool) const {
    return pool < static_cast<int64_t>(count_.size()) ? count_[static_cast<size_t>(pool)] : 0;
  }
  const float* key_sum(int64_t pool) const { return &sum_[static_cast<size_t>(pool) * 128]; }

 private:
  int32_t pool_;
  std::vector<float> sum_;      // [pools, 128] dequantised key sums
  std::vector<int32_t> count_;  // [pools] entries pooled into each sum
  int64_t complete_ = 0;        // pools [0, complete_) are full and never read again
};

// The pooled keys of every layer of one request (hisa, spin-hybrid's probe): what a reset, a fork
// and memory_bytes() do to them, said once.
class HisaKeyLayers {
 public:
  HisaKeyLayers(int32_t layers, int32_t pool_entries)
      : keys_(static_cast<size_t>(layers), HisaKeys(pool_entries)) {}

  HisaKeys& operator[](int32_t layer) { return keys_[static_cast<size_t>(layer)]; }
  const HisaKeys& operator[](int32_t layer) const { return keys_[static_cast<size_t>(layer)]; }
  void reset() {
    for (HisaKeys& k : keys_) k.reset();
  }
  void truncate(int64_t shared_entries) {
    for (HisaKeys& k : keys_) k.truncate(shared_entries);
  }
  size_t memory_bytes() const {
    size_t bytes = 0;
    for (const HisaKeys& k : keys_) bytes += k.memory_bytes();
    return bytes;
  }

 private:
  std::vector<HisaKeys> keys_;
};

}  // namespace spin
