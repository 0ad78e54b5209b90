// indexcache-2, indexcache-4: full layers every N, the others reuse the full layer's top-k blocks.
#include <memory>
#include <string>

#include "core/errors.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// indexcache-N: layers l % N == 0 are full (every block scored); the others reuse the blocks
// holding the top-k of the nearest preceding full layer at this step (same row), most hits first.
class IndexCachePredictor final : public PredictorBase {
 public:
  IndexCachePredictor(std::string name, const PredictorConfig& c, int32_t layers, int64_t request,
                      int32_t freq)
      : PredictorBase(std::move(name), c, layers, request, c.alpha, c.beta), freq_(freq) {}

 protected:
  Fill fill(int32_t layer) const override {
    return layer % freq_ == 0 ? Fill::kAll : Fill::kRanked;
  }
  Status prepare(int32_t layer, const StepInput& in) override {
    if (layer % freq_ == 0) return ok_status();
    return check_layer_observed(layer - layer % freq_, layer, in);
  }
  Status rank(const RowContext& row, float* p) override {
    if (row.layer % freq_ == 0) {
      fill_unknown(p, row.n_blocks);
      return ok_status();
    }
    rank_by_layer_topk(row, row.layer - row.layer % freq_, p);
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<IndexCachePredictor>(*this);
  }

 private:
  int32_t freq_;
};

}  // namespace

std::unique_ptr<BlockPredictor> make_indexcache_2(const PredictorArgs& a) {
  return std::make_unique<IndexCachePredictor>(a.name, a.config, a.num_layers, a.request_id, 2);
}
std::unique_ptr<BlockPredictor> make_indexcache_4(const PredictorArgs& a) {
  return std::make_unique<IndexCachePredictor>(a.name, a.config, a.num_layers, a.request_id, 4);
}

}  // namespace spin
