// hisa: blocks ranked by their mean-pooled keys scored with the row's query (predict/hisa.h).
#include <memory>
#include <vector>

#include "core/errors.h"
#include "predict/hisa.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"

namespace spin {
namespace {

// hisa: mean-pooled block keys (kept incrementally, see hisa.h) scored with the row's query by the
// indexer formula; the highest blocks fill the budget. Without the cache (PredictorInputs::hisa null)
// it ranks by PredictorInputs::block_probe, the same score computed elsewhere (a score trace's probe).
class HisaPredictor final : public PredictorBase {
 public:
  HisaPredictor(const PredictorConfig& c, int32_t layers, int64_t request)
      : PredictorBase("hisa", c, layers, request, c.alpha, c.beta),
        keys_(layers, c.block_entries()) {}

 protected:
  Status prepare(int32_t layer, const StepInput& in) override {
    const HisaView* hisa = inputs_of(in).hisa;
    if (hisa == nullptr && inputs_of(in).block_probe == nullptr)
      return invalid_argument(
          "hisa: StepInput::inputs has neither hisa (the query and the key cache) nor block_probe; hisa needs one");
    if (hisa == nullptr) return ok_status();  // the probe is the whole ranking
    SPIN_RETURN_IF_ERROR(check_hisa_view(config(), *hisa, in.num_entries, in.next_n));
    // Row 0's entries are committed tokens; entries past them are this step's drafts, which can
    // still be rejected and rewritten, so they are never folded into the cached sums.
    return keys_[layer].update(*hisa, visible_entries(in, 0));
  }
  // The probe is hisa's whole ranking: it chooses every block after the forced ones (and is
  // charged as probe work); rank() is the same score, for the open loop's Pearson.
  int64_t probe_quota(const RowContext&, int64_t, int64_t left) const override { return left; }
  Status probe(const RowContext& row, float* q, int64_t* work) override {
    if (inputs_of(*row.in).hisa == nullptr) {
      copy_block_probe(row, q, work);
      return ok_status();
    }
    return keys_[row.layer].score(*inputs_of(*row.in).hisa, row.row, row.n_blocks,
                                                       config().block_entries(), q, work, &query_scratch_);
  }
  Status rank(const RowContext& row, float* p) override {
    int64_t work = 0;
    return probe(row, p, &work);
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<HisaPredictor>(*this);
  }
  void on_reset() override {
    keys_.reset();
  }
  void on_fork(int64_t shared_entries) override {
    keys_.truncate(shared_entries);
  }
  size_t extra_memory_bytes() const override { return keys_.memory_bytes(); }

 private:
  HisaKeyLayers keys_;
  std::vector<float> query_scratch_;
};

}  // namespace

std::unique_ptr<BlockPredictor> make_hisa(const PredictorArgs& a) {
  return std::make_unique<HisaPredictor>(a.config, a.num_layers, a.request_id);
}

}  // namespace spin
