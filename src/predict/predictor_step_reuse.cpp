// step-reuse: the previous step's top-k blocks reused (vllm-ascend's temporal reuse).
#include <memory>

#include "core/errors.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// step-reuse: the blocks holding the previous step's top-k (vllm-ascend's temporal reuse), most
// hits first, then recency.
class StepReusePredictor final : public PredictorBase {
 public:
  using PredictorBase::PredictorBase;

 protected:
  Status rank(const RowContext& row, float* p) override {
    fill_unknown(p, row.n_blocks);
    raise_previous_topk(row, 0.0f, HitTies::kIndex, p);
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<StepReusePredictor>(*this);
  }
};

}  // namespace

std::unique_ptr<BlockPredictor> make_step_reuse(const PredictorArgs& a) {
  return std::make_unique<StepReusePredictor>(a.name, a.config, a.num_layers, a.request_id, a.config.alpha,
                                              a.config.beta);
}

}  // namespace spin
