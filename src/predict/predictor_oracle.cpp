// oracle: the best block recall a selection of the budget can reach (it reads the true top-k).
#include <memory>

#include "core/errors.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// oracle: blocks ranked by how many of this step's TRUE top-k entries they hold (the caller passes
// them in PredictorInputs::true_topk). With the shared forced blocks, taking the highest counts is the
// best block recall any selection of the budget can reach.
class OraclePredictor final : public PredictorBase {
 public:
  using PredictorBase::PredictorBase;

 protected:
  Status prepare(int32_t, const StepInput& in) override {
    const int32_t* true_topk = inputs_of(in).true_topk;
    if (true_topk == nullptr)
      return invalid_argument(
          "oracle: StepInput::inputs->true_topk is null; the oracle ranks blocks by "
          "this step's true top-k ([next_n, topk] positions, -1 padded)");
    const int32_t k = config().topk;
    for (int32_t j = 0; j < in.next_n; ++j) {
      const int64_t vis = visible_entries(in, j);
      for (int32_t t = 0; t < k; ++t) {
        const int32_t pos = true_topk[static_cast<int64_t>(j) * k + t];
        if (pos != -1 && (pos < 0 || pos >= vis))
          return out_of_range(
              "oracle: true_topk[{}][{}] = {} is outside row {}'s {} visible "
              "entries",
              j, t, pos, j, vis);
      }
    }
    return ok_status();
  }
  Status rank(const RowContext& row, float* p) override {
    fill_unknown(p, row.n_blocks);
    const int32_t k = config().topk;
    const int32_t e = config().block_entries();
    const int32_t* top = inputs_of(*row.in).true_topk + static_cast<int64_t>(row.row) * k;
    for (int32_t t = 0; t < k; ++t) {
      if (top[t] < 0) continue;
      float& v = p[top[t] / e];
      v = v < 0.0f ? 1.0f : v + 1.0f;  // unknown scores are ≤ -2, counts ≥ 1
    }
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<OraclePredictor>(*this);
  }
};

}  // namespace

std::unique_ptr<BlockPredictor> make_oracle(const PredictorArgs& a) {
  return std::make_unique<OraclePredictor>(a.name, a.config, a.num_layers, a.request_id, a.config.alpha, a.config.beta);
}

}  // namespace spin
