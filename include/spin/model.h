// spin/model.h — the shapes of the models spin simulates: how many layers carry a lightning
// indexer, its heads, top-k, page size and compression, and the MLA attention heads. The engine
// (spin/engine.h) and the GPU paper model (spin/diagnose.h) both take one of these presets.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "spin/geometry.h"
#include "spin/status.h"

namespace spin {

struct ModelPreset {
  std::string name;
  int32_t model_layers = 0;     // decoder layers of the model
  int32_t indexer_layers = 0;   // layers with a lightning indexer
  int32_t index_heads = 64;     // indexer heads × 128 dims
  int32_t topk = 2048;
  int32_t page_size = kDefaultPageSize;       // indexer entries per page
  int32_t compress_ratio = 1;   // tokens per indexer entry (V4 CSA: 4)
  int32_t attn_heads = 128;     // MLA query heads
  int32_t window = 0;           // V4 sliding-window entries attended besides the top-k
};
// deepseek-v3.2 (61 of 61 layers, top-k 2048, 128 heads), deepseek-v4-flash (21 of 43, ratio 4,
// top-k 512, 64 heads, window 128), deepseek-v4-pro (30 of 61, ratio 4, top-k 1024, 128 heads,
// window 128).
Result<ModelPreset> model_preset(const std::string& name);
const std::vector<std::string>& model_preset_names();

}  // namespace spin
