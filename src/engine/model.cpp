// The model presets (spin/model.h).
#include "spin/model.h"

#include "core/errors.h"

namespace spin {

const std::vector<std::string>& model_preset_names() {
  static const std::vector<std::string> names = {"deepseek-v3.2", "deepseek-v4-flash", "deepseek-v4-pro"};
  return names;
}

Result<ModelPreset> model_preset(const std::string& name) {
  // The published model configs: V3.2 has an indexer on all 61 layers (64 heads × 128, top-k 2048,
  // 128 MLA heads); V4-Flash / V4-Pro index their CSA layers (21 of 43 / 30 of 61) over entries
  // that compress 4 tokens, with top-k 512 / 1024 and a 128-entry sliding window besides.
  if (name == "deepseek-v3.2") return ModelPreset{name, 61, 61, 64, 2048, 64, 1, 128, 0};
  if (name == "deepseek-v4-flash") return ModelPreset{name, 43, 21, 64, 512, 64, 4, 64, 128};
  if (name == "deepseek-v4-pro") return ModelPreset{name, 61, 30, 64, 1024, 64, 4, 128, 128};
  return invalid_argument("unknown model preset '{}' (deepseek-v3.2, deepseek-v4-flash, deepseek-v4-pro)", name);
}

}  // namespace spin
