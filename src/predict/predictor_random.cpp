// random: the budget filled uniformly at random (the control every predictor must beat).
#include <algorithm>
#include <memory>

#include "core/errors.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// random: forced blocks, then a uniform random subset (the exploration draw) fills the budget.
class RandomPredictor final : public PredictorBase {
 public:
  using PredictorBase::PredictorBase;

 protected:
  Fill fill(int32_t) const override { return Fill::kRandom; }
  Status rank(const RowContext& row, float* p) override {
    std::fill(p, p + row.n_blocks, 0.0f);
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<RandomPredictor>(*this);
  }
};

}  // namespace

std::unique_ptr<BlockPredictor> make_random(const PredictorArgs& a) {
  return std::make_unique<RandomPredictor>(a.name, a.config, a.num_layers, a.request_id, a.config.alpha, a.config.beta);
}

}  // namespace spin
