// The EMA family, one class: prev-iter, ema-slot, ema-offset, spin (slot and offset EMAs plus
// exploration), spin-hybrid (the pooled-key probe in place of uniform exploration on probe steps),
// and spin / spin-hybrid stacked on IndexCache's layer sharing (spin-ic2, spin-hybrid-ic2).
// Exploration belongs to spin alone: the other EMA predictors are the ablations the paper
// compares, so they must not borrow spin's coin.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/errors.h"
#include "predict/hisa.h"
#include "predict/predictor_base.h"
#include "predict/registry.h"
#include "predict/select_rules.h"

namespace spin {
namespace {

// The slot/offset ranking of the EMA predictors: p[b] = combine(slot[b], offset[bucket(newest -
// b)]) when both are known, else whichever is known, else the recency default.
void ema_rank(const BlockState& st, const PredictorConfig& c, int64_t n_blocks, bool use_slot,
              bool use_offset, float* p) {
  const float w = static_cast<float>(c.combine_weight);
  const int64_t newest = n_blocks - 1;
  for (int64_t b = 0; b < n_blocks; ++b) {
    const int64_t d = newest - b;
    const int32_t bucket = offset_bucket(d);
    const bool slot_known = use_slot && st.seen(b);
    const bool offset_known = use_offset && st.offset_known(bucket);
    if (slot_known && offset_known) {
      const float s = st.slot(b), o = st.offset(bucket);
      p[b] = c.combine == Combine::kMax ? std::max(s, o) : w * s + (1.0f - w) * o;
    } else if (slot_known) {
      p[b] = st.slot(b);
    } else if (offset_known) {
      p[b] = st.offset(bucket);
    } else {
      p[b] = PredictorBase::unknown_score(d);
    }
  }
}

// kTopkFirstBase and kRecentBase: predict/select_rules.h.

// The newest `window` blocks at kRecentBase - distance, newest first.
void raise_recent(int64_t n_blocks, int32_t window, float* p) {
  for (int64_t b = std::max<int64_t>(0, n_blocks - window); b < n_blocks; ++b)
    p[b] = kRecentBase - static_cast<float>(n_blocks - 1 - b);
}

// Which parts an EmaPredictor uses.
struct EmaParts {
  double alpha;
  bool slot = true, offset = true;
  bool explore = false;    // spin's uniform exploration (and PredictorConfig::topk_first, recent_blocks)
  bool probe = false;      // spin-hybrid: the pooled-key probe chooses the exploration share
  bool moves = false;      // budget_moves applies
  int32_t share_freq = 0;  // stacked on IndexCache: layers l % freq != 0 reuse layer l - l % freq
};

// prev-iter (slot, alpha = 1), ema-slot (slot), ema-offset (offset), spin (both + exploration),
// spin-hybrid (spin, with the probe in place of uniform exploration on probe steps), and both
// stacked on IndexCache's layer sharing (spin-ic2, spin-hybrid-ic2: the full layers predict, the
// shared ones reuse the full layer's top-k blocks of the same step).
class EmaPredictor final : public PredictorBase {
 public:
  EmaPredictor(std::string name, const PredictorConfig& c, int32_t layers, int64_t request,
               const EmaParts& parts)
      : PredictorBase(std::move(name), c, layers, request, parts.alpha, c.beta),
        parts_(parts),
        keys_(parts.probe ? layers : 0, c.probe_entries > 0 ? c.probe_entries : c.block_entries()) {}

 protected:
  bool explores() const override { return parts_.explore; }
  bool moves_budget() const override { return parts_.moves; }
  bool shared(int32_t layer) const { return parts_.share_freq > 0 && layer % parts_.share_freq != 0; }
  int32_t full_layer(int32_t layer) const { return layer - layer % parts_.share_freq; }  // a shared layer's source

  Status prepare(int32_t layer, const StepInput& in) override {
    if (shared(layer)) return check_layer_observed(full_layer(layer), layer, in);
    if (!parts_.probe) return ok_status();
    probe_row_ = {-1, -1, -1};  // a new select: steps repeat after reset, rebind or fork
    const HisaView* hisa = inputs_of(in).hisa;
    if (hisa == nullptr && inputs_of(in).block_probe == nullptr)
      return invalid_argument(
          "{}: StepInput::inputs has neither hisa nor block_probe; its probe scores pooled block keys with "
          "the step's query (or reads that score, recorded)",
          name());
    if (hisa == nullptr) {
      if (config().probe_entries != 0)
        return invalid_argument("{}: a recorded block_probe has one pooled key per block; probe_entries must be 0",
                                name());
      return ok_status();
    }
    SPIN_RETURN_IF_ERROR(check_hisa_view(config(), *hisa, in.num_entries, in.next_n));
    // Only committed entries (row 0's prefix) are pooled: drafts can still be rewritten.
    return keys_[layer].update(*hisa, visible_entries(in, 0));
  }
  Status rank(const RowContext& row, float* p) override {
    if (shared(row.layer)) {
      rank_by_layer_topk(row, full_layer(row.layer), p);
      return ok_status();
    }
    ema_rank(layer_state(row.layer), config(), row.n_blocks, parts_.slot, parts_.offset, p);
    if (probes(row) && config().probe_blend > 0) SPIN_RETURN_IF_ERROR(blend_with_probe(row, p));
    if (parts_.explore && keeps_additions(row.layer)) add_additions(row, p);
    return ok_status();
  }
  // spin's family: the last top-k's blocks, then the newest, then p.
  void add_additions(const RowContext& row, float* p) const {
    raise_recent(row.n_blocks, config().recent_blocks, p);
    if (config().topk_first) raise_previous_topk(row, kTopkFirstBase, HitTies::kRank, p);
  }
  bool rank_pair(const RowContext& row, float* with, float* without) override {
    if (!parts_.explore || parts_.probe || shared(row.layer)) return false;
    ema_rank(layer_state(row.layer), config(), row.n_blocks, parts_.slot, parts_.offset, without);
    std::copy(without, without + row.n_blocks, with);
    add_additions(row, with);
    return true;
  }
  bool probes(const RowContext& row) const {
    return parts_.probe && !shared(row.layer) && row.step % config().probe_interval == 0;
  }
  int64_t probe_quota(const RowContext& row, int64_t budget, int64_t left) const override {
    (void)left;
    if (!probes(row)) return 0;
    return std::llround(probe_share(row.layer) * static_cast<double>(budget));
  }
  Status probe(const RowContext& row, float* q, int64_t* work) override {
    SPIN_RETURN_IF_ERROR(score_probe(row));
    std::copy(probe_.begin(), probe_.begin() + row.n_blocks, q);
    *work = probe_work_;
    return ok_status();
  }
  // The row's probe into probe_ (once per row: rank() may need it before probe()).
  Status score_probe(const RowContext& row) {
    if (probe_row_ == std::make_tuple(row.layer, row.row, row.step)) return ok_status();
    probe_.resize(static_cast<size_t>(row.n_blocks));
    if (inputs_of(*row.in).hisa == nullptr) {
      copy_block_probe(row, probe_.data(), &probe_work_);
    } else {
      SPIN_RETURN_IF_ERROR(keys_[row.layer].score(
          *inputs_of(*row.in).hisa, row.row, row.n_blocks, config().block_entries(), probe_.data(), &probe_work_,
          &query_scratch_));
    }
    probe_row_ = {row.layer, row.row, row.step};
    return ok_status();
  }
  // p ← (1 - λ)·z(p) + λ·z(probe) over the blocks both know (z: standardised over those blocks);
  // blocks history knows nothing about keep their (lowest) recency default.
  Status blend_with_probe(const RowContext& row, float* p) {
    SPIN_RETURN_IF_ERROR(score_probe(row));
    const double lambda = config().probe_blend;
    double sp = 0, sp2 = 0, sq = 0, sq2 = 0;
    int64_t n = 0;
    for (int64_t b = 0; b < row.n_blocks; ++b) {
      if (p[b] <= -2.0f || probe_[static_cast<size_t>(b)] == FLT_MAX) continue;
      const double x = p[b], y = probe_[static_cast<size_t>(b)];
      sp += x, sp2 += x * x, sq += y, sq2 += y * y, ++n;
    }
    if (n < 2) return ok_status();
    const auto dn = static_cast<double>(n);
    const double mp = sp / dn, mq = sq / dn;
    const double dp = std::sqrt(std::max(sp2 / dn - mp * mp, 1e-30));
    const double dq = std::sqrt(std::max(sq2 / dn - mq * mq, 1e-30));
    for (int64_t b = 0; b < row.n_blocks; ++b) {
      if (p[b] <= -2.0f || probe_[static_cast<size_t>(b)] == FLT_MAX) continue;
      // Shifted to stay above -1 (the unknown blocks' defaults lie at ≤ -2).
      p[b] = static_cast<float>(
          8.0 + (1.0 - lambda) * (p[b] - mp) / dp + lambda * (probe_[static_cast<size_t>(b)] - mq) / dq);
    }
    return ok_status();
  }
  std::unique_ptr<PredictorBase> clone() const override {
    return std::make_unique<EmaPredictor>(*this);
  }
  void on_reset() override {
    keys_.reset();
  }
  void on_fork(int64_t shared_entries) override {
    keys_.truncate(shared_entries);
  }
  size_t extra_memory_bytes() const override { return keys_.memory_bytes(); }

 private:
  EmaParts parts_;
  HisaKeyLayers keys_;  // every layer's when parts_.probe, else none
  std::vector<float> query_scratch_;
  std::vector<float> probe_;  // the probe of row probe_row_ = (layer, row, step)
  std::tuple<int32_t, int32_t, int64_t> probe_row_{-1, -1, -1};
  int64_t probe_work_ = 0;
};

// spin and spin-hybrid; layer_sharing 2 stacks them on IndexCache (spin-ic2, spin-hybrid-ic2).
std::unique_ptr<BlockPredictor> make_spin_family(const PredictorArgs& a, bool probe, int32_t layer_sharing) {
  return std::make_unique<EmaPredictor>(
      a.name, a.config, a.num_layers, a.request_id,
      EmaParts{.alpha = a.config.alpha, .explore = true, .probe = probe, .moves = true, .share_freq = layer_sharing});
}

}  // namespace

std::unique_ptr<BlockPredictor> make_prev_iter(const PredictorArgs& a) {
  return std::make_unique<EmaPredictor>(a.name, a.config, a.num_layers, a.request_id,
                                        EmaParts{.alpha = 1.0, .offset = false});
}
std::unique_ptr<BlockPredictor> make_ema_slot(const PredictorArgs& a) {
  return std::make_unique<EmaPredictor>(a.name, a.config, a.num_layers, a.request_id,
                                        EmaParts{.alpha = a.config.alpha, .offset = false});
}
std::unique_ptr<BlockPredictor> make_ema_offset(const PredictorArgs& a) {
  return std::make_unique<EmaPredictor>(a.name, a.config, a.num_layers, a.request_id,
                                        EmaParts{.alpha = a.config.alpha, .slot = false});
}
std::unique_ptr<BlockPredictor> make_spin(const PredictorArgs& a) { return make_spin_family(a, false, 0); }
std::unique_ptr<BlockPredictor> make_spin_ic2(const PredictorArgs& a) { return make_spin_family(a, false, 2); }
std::unique_ptr<BlockPredictor> make_spin_hybrid(const PredictorArgs& a) { return make_spin_family(a, true, 0); }
std::unique_ptr<BlockPredictor> make_spin_hybrid_ic2(const PredictorArgs& a) { return make_spin_family(a, true, 2); }

}  // namespace spin
