// prev-layer: each layer predicted from the previous layer's scores of the same step.
#include <memory>

#include "core/errors.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// prev-layer: this step's pooled scores of layer l-1 (same row), read from its pending buffer.
// Layer 0 has no previous layer and falls back to prev-iter on itself (the state runs alpha = 1).
class PrevLayerPredictor final : public PredictorBase {
 public:
  PrevLayerPredictor(const PredictorConfig& c, int32_t layers, int64_t request)
      : PredictorBase("prev-layer", c, layers, request, 1.0, c.beta) {}

 protected:
  Status prepare(int32_t layer, const StepInput& in) override {
    if (layer == 0) return ok_status();
    for (int32_t j = 0; j < in.next_n; ++j)
      if (!current_observation(layer - 1, j, in.step))
        return failed_precondition(
            "prev-layer: layer {} reads layer {}'s row {} of step {}, which has not been observed "
            "yet; run layers in increasing order and observe every row before the next layer",
            layer, layer - 1, j, in.step);
    return ok_status();
  }
  Status rank(const RowContext& row, float* p) override {
    fill_unknown(p, row.n_blocks);
    if (row.layer == 0) {
      const BlockState& st = layer_state(0);
      for (int64_t b = 0; b < row.n_blocks; ++b)
        if (st.seen(b)) p[b] = st.slot(b);
      return ok_status();
    }
    const PooledRow* obs = current_observation(row.layer - 1, row.row, row.step);
    for (size_t i = 0; i < obs->blocks.size() && obs->blocks[i] < row.n_blocks; ++i)
      p[obs->blocks[i]] = obs->x[i];
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<PrevLayerPredictor>(*this);
  }
};

}  // namespace

std::unique_ptr<BlockPredictor> make_prev_layer(const PredictorArgs& a) {
  return std::make_unique<PrevLayerPredictor>(a.config, a.num_layers, a.request_id);
}

}  // namespace spin
