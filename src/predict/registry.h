// The predictor registry's private half: what a factory receives. The table itself (one row per
// predictor: its PredictorInfo and its factory) is registry.cpp; spin/predict.h exposes the rows.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "spin/predict.h"

namespace spin {

struct PredictorArgs {
  std::string name;
  const PredictorConfig& config;  // validated by make_predictor
  int32_t num_layers;
  int64_t request_id;
};

using PredictorFactory = std::unique_ptr<BlockPredictor> (*)(const PredictorArgs&);

}  // namespace spin
