// all-keep: the unmodified indexer (every block scored), as a predictor.
#include <algorithm>
#include <memory>

#include "core/errors.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// all-keep: the unmodified indexer. p = 0 (it has no ranking of its own).
class AllKeepPredictor final : public PredictorBase {
 public:
  using PredictorBase::PredictorBase;

 protected:
  Fill fill(int32_t) const override { return Fill::kAll; }
  Status rank(const RowContext& row, float* p) override {
    std::fill(p, p + row.n_blocks, 0.0f);
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<AllKeepPredictor>(*this);
  }
};

}  // namespace

std::unique_ptr<BlockPredictor> make_all_keep(const PredictorArgs& a) {
  return std::make_unique<AllKeepPredictor>(a.name, a.config, a.num_layers, a.request_id, a.config.alpha, a.config.beta);
}

}  // namespace spin
