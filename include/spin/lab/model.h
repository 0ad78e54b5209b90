// spin/lab/model.h — the shapes of the models spin simulates: how many layers carry a lightning
// indexer, its heads, top-k, page size and compression, and the MLA attention heads. The engine
// (spin/lab/engine.h) and the GPU paper model (spin/lab/diagnose.h) both take one of these presets.
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/model.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

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

inline const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = {"deepseek-v3.2", "deepseek-v4-flash", "deepseek-v4-pro"};
  return names;
}

// The published model configs: V3.2 has an indexer on all 61 layers (64 heads × 128, top-k 2048,
// 128 MLA heads); V4-Flash / V4-Pro index their CSA layers (21 of 43 / 30 of 61) over entries
// that compress 4 tokens, with top-k 512 / 1024 and a 128-entry sliding window besides.
// Header-only, so the engine and the GPU model share it without depending on each other.
inline Result<ModelPreset> model_preset(const std::string& name) {
  if (name == "deepseek-v3.2") return ModelPreset{name, 61, 61, 64, 2048, 64, 1, 128, 0};
  if (name == "deepseek-v4-flash") return ModelPreset{name, 43, 21, 64, 512, 64, 4, 64, 128};
  if (name == "deepseek-v4-pro") return ModelPreset{name, 61, 30, 64, 1024, 64, 4, 128, 128};
  return Status(StatusCode::kInvalidArgument,
                "unknown model preset '" + name + "' (deepseek-v3.2, deepseek-v4-flash, deepseek-v4-pro)");
}

}  // namespace spin
