// The predictor registry's private half: what a factory receives. The table itself (one row per
// predictor: its PredictorInfo and its factory) is registry.cpp; spin/predict.h exposes the rows.
//
// Each predictor lives in its own file, src/predict/predictor_<name>.cpp (a PredictorBase subclass
// and its factory). A predictor only ranks a row's blocks; the protocol, budget, forced blocks and
// replay live in PredictorBase. A block nothing is known about gets PredictorBase::unknown_score:
// below every observed value, newest first — a recency prior, so a predictor with nothing to go
// on behaves like a sliding window.
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
