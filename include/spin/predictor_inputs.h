// spin/predictor_inputs.h — what the predictors that read more than their own state take with a
// step (StepInput::inputs): the oracle this step's true top-k (a bound, not a predictor to
// deploy), hisa and spin-hybrid the key cache and the query, or a probe made from them. The
// predictors an engine serves (spin, prev-iter, …: PredictorInfo::reads == kOwnState) read none
// of it, so an integrator never fills this in.
#pragma once

#include <cstdint>

namespace spin {

// The flat view hisa needs to pool keys and score them: the key cache in IndexerPageLayout
// (spin/geometry.h), the page table and the step's query.
struct HisaView {
  const uint8_t* key_cache = nullptr;    // this layer's paged indexer key cache
  int32_t page_size = 0;                 // must equal PredictorConfig::page_size
  const int32_t* block_table = nullptr;  // [ceil(num_entries / page_size)] logical → physical page
  int64_t num_entries = 0;               // must equal StepInput::num_entries
  const uint8_t* q = nullptr;            // [next_n, num_heads, 128] e4m3 (scales folded into w)
  const float* w = nullptr;              // [next_n, num_heads]
  int32_t num_heads = 0;
  int64_t num_cache_pages = -1;  // physical pages in key_cache, to check block_table; -1: unchecked
};

struct PredictorInputs {
  const int32_t* true_topk = nullptr;    // oracle: [next_n, topk] this step's true top-k, -1 padded
  const HisaView* hisa = nullptr;        // hisa, spin-hybrid: the query and the cache
  // Optional: this step's probe of every visible block — the query scored against one pooled key
  // per block, higher = more promising (e.g. hisa's Σ_h w·ReLU(q·kbar), or a score trace's
  // layer.{l}.probe). Row j's values are block_probe[j · block_probe_stride + b] for its
  // blocks b < ceil(visible_entries(j) / block_entries); block_probe_entries must equal the
  // config's block_entries(). hisa ranks by it when `hisa` is null.
  const float* block_probe = nullptr;    // [next_n][block_probe_stride]
  int64_t block_probe_stride = 0;        // ≥ the last row's block count
  int32_t block_probe_entries = 0;       // entries per pooled key
};

}  // namespace spin
