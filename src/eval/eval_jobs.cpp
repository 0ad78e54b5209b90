// `spin eval`'s job tables: which replays (predictor, config, open or closed loop) each scenario,
// recorded trace and real-model trace runs, and at which sparsities.
#include <fmt/format.h>

#include <algorithm>

#include "core/errors.h"
#include "eval/eval_internal.h"

namespace spin::eval_internal {

namespace {

// Where `spin eval` lists each predictor, in order: the open-loop comparison, the closed-loop sweep
// (after spin itself and its ablations), and the sweep over recorded traces (those reading keys
// only where the trace carries a probe). Names are the registry's (predictor_names()).
const std::vector<std::string> kOpenLoop = {"prev-iter", "prev-layer", "ema-slot", "ema-offset", "spin",
                                            "hisa",      "step-reuse", "random",   "oracle"};
const std::vector<std::string> kSweep = {"spin-hybrid", "step-reuse", "hisa",      "indexcache-2", "indexcache-4",
                                         "spin-ic2",    "spin-hybrid-ic2", "prev-iter", "random", "oracle"};
const std::vector<std::string> kTraceSweep = {"step-reuse", "prev-iter", "indexcache-2", "random",         "oracle",
                                              "hisa",       "spin-hybrid", "spin-ic2",   "spin-hybrid-ic2"};

// spin's ablations beside it in every sweep: without exploration, and the paper's spin
// (PredictorConfig::apply_preset("paper")).
void add_spin_rows(const PredictorConfig& c, std::vector<Job>* jobs) {
  jobs->push_back({Section::kSweep, "spin", "spin", c, false});
  PredictorConfig no_explore = c;
  no_explore.explore_ratio = 0.0;
  jobs->push_back({Section::kSweep, "spin (no explore)", "spin", no_explore, false});
  PredictorConfig paper = c;
  (void)paper.apply_preset("paper");  // a built-in preset of valid fields
  jobs->push_back({Section::kSweep, std::string(kPaperSpinLabel), "spin", paper, false});
}

// The ablations behind spin-hybrid's and the budget moves' defaults, at the MTP table's
// sparsity: the probe's share of the budget, its pooling granularity (entries per pooled key),
// how often it runs, and whether it also re-ranks history; the budget moves against the fixed one.
// A literal that does not apply to the user's base config (a --set the ablation cannot combine
// with) fails the eval, naming the ablation: a job dropped quietly would leave a hole in the table.
Status add_beyond_ablations(const PredictorConfig& base, std::vector<Job>* jobs) {
  auto hybrid = [&](const std::string& pairs) -> Status {
    PredictorConfig c = base;
    if (Status s = c.parse(pairs); !s.ok()) return Status(s.code(), "eval: ablation " + pairs + ": " + s.message());
    if (Status s = c.validate(); !s.ok()) return Status(s.code(), "eval: ablation " + pairs + ": " + s.message());
    jobs->push_back({Section::kBeyond, "spin-hybrid " + pairs, "spin-hybrid", c, false});
    return ok_status();
  };
  for (const char* pairs : {"probe_share=0.1", "probe_share=0.3", "probe_share=0.5", "probe_entries=16",
                            "probe_interval=4", "probe_blend=0.5", "probe_adapt=1"}) {
    SPIN_RETURN_IF_ERROR(hybrid(pairs));
  }
  for (BudgetMoves moves : {BudgetMoves::kLayers, BudgetMoves::kSteps, BudgetMoves::kBoth}) {
    PredictorConfig c = base;
    c.budget_moves = moves;
    jobs->push_back({Section::kBeyond, std::string("spin budget_moves=") + budget_moves_name(moves), "spin", c, false});
  }
  return ok_status();
}

}  // namespace

std::string section_name(Section s) {
  switch (s) {
    case Section::kPredictors: return "predictors";
    case Section::kSweep: return "sweep";
    case Section::kBeyond: return "beyond";
    case Section::kMtp: return "mtp";
    case Section::kPooling: return "pooling";
  }
  return "?";
}

const std::vector<double>& sweep_sparsities(bool quick) {
  static const std::vector<double> full = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  static const std::vector<double> short_list = {0.0, 0.3, 0.5};
  return quick ? short_list : full;
}

Result<std::vector<Job>> jobs_for(bool mtp_scenario, const EvalOptions& o) {
  std::vector<Job> jobs;
  auto with = [&](double sparsity) {
    PredictorConfig c = o.base_config;
    c.target_sparsity = sparsity;
    return c;
  };
  // Calibration and open-loop comparison (every scenario: the calibration row needs prev-iter).
  const std::vector<std::string> open_loop = mtp_scenario
      ? std::vector<std::string>{kCalibrationPredictor}
      : kOpenLoop;
  for (const std::string& p : open_loop) jobs.push_back({Section::kPredictors, p, p, with(kComparisonSparsity), true});
  if (mtp_scenario) {
    for (MtpUpdate mode : {MtpUpdate::kPrefix, MtpUpdate::kRow0, MtpUpdate::kAllRows}) {
      for (double s : {0.3, kMtpSparsity}) {
        PredictorConfig c = with(s);
        c.mtp_update = mode;
        jobs.push_back({Section::kMtp, mtp_update_name(mode), "spin", c, false});
      }
    }
    return jobs;
  }
  for (double s : sweep_sparsities(o.quick)) {
    add_spin_rows(with(s), &jobs);
    for (const std::string& p : kSweep) {
      jobs.push_back({Section::kSweep, p, p, with(s), false});
    }
  }
  SPIN_RETURN_IF_ERROR(add_beyond_ablations(with(kMtpSparsity), &jobs));
  for (Pooling pooling : {Pooling::kMax, Pooling::kMean, Pooling::kTopkHits, Pooling::kLse}) {
    PredictorConfig c = with(kMtpSparsity);
    c.pooling = pooling;
    jobs.push_back({Section::kPooling, std::string("pooling=") + pooling_name(pooling), "spin", c, false});
  }
  // The combine rule (slot vs offset): the ablation behind the default.
  for (const auto& [combine, weight] : std::vector<std::pair<Combine, double>>{
           {Combine::kMax, 0.0}, {Combine::kWeighted, 0.5}, {Combine::kWeighted, 0.8}, {Combine::kWeighted, 1.0}}) {
    PredictorConfig c = with(kMtpSparsity);
    c.combine = combine;
    if (combine == Combine::kWeighted) c.combine_weight = weight;
    const std::string label = combine == Combine::kMax ? "combine=max" : fmt::format("combine=weighted {:.1f}", weight);
    jobs.push_back({Section::kPooling, label, "spin", c, false});
  }
  return jobs;
}

const std::vector<double>& real_sparsities(bool quick) {
  static const std::vector<double> full = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7};
  static const std::vector<double> short_list = {0.0, 0.3, 0.5, 0.7};
  return quick ? short_list : full;
}

// The top-k a real trace is read at: its own, and the others of {2048 scaled to the context as
// 2048 of 64K (a power of two in [64, 2048]), DSA's 2048} that the context holds 4× over.
std::vector<int32_t> real_topks(int32_t trace_topk, int64_t entries) {
  const double scaled = 2048.0 * static_cast<double>(entries) / 65536.0;
  int32_t pow2 = 64;
  while (pow2 < 2048 && 2.0 * pow2 <= scaled) pow2 *= 2;
  std::vector<int32_t> ks = {trace_topk};
  for (int32_t k : {pow2, 2048}) {
    if (int64_t{4} * k <= entries && std::find(ks.begin(), ks.end(), k) == ks.end()) ks.push_back(k);
  }
  return ks;
}

// spin (with its ablations) and kTraceSweep's predictors, closed loop; MTP traces
// add the update modes. `probe`: the trace carries a block probe (layer.{l}.probe) at the
// predictors' block size, so the predictors that read keys (hisa, spin-hybrid) run on it too.
std::vector<Job> real_jobs(bool mtp, bool probe, const EvalOptions& o) {
  std::vector<Job> jobs;
  auto with = [&](double sparsity) {
    PredictorConfig c = o.base_config;
    c.target_sparsity = sparsity;
    return c;
  };
  for (double sp : real_sparsities(o.quick)) {
    add_spin_rows(with(sp), &jobs);
    for (const std::string& p : kTraceSweep) {
      if (predictor_needs_keys(p) && !probe) continue;  // a score trace without the probe they read
      jobs.push_back({Section::kSweep, p, p, with(sp), false});
    }
  }
  if (mtp) {
    for (MtpUpdate mode : {MtpUpdate::kPrefix, MtpUpdate::kRow0, MtpUpdate::kAllRows}) {
      for (double sp : {0.3, kMtpSparsity}) {
        PredictorConfig c = with(sp);
        c.mtp_update = mode;
        jobs.push_back({Section::kMtp, mtp_update_name(mode), "spin", c, false});
      }
    }
  }
  return jobs;
}

}  // namespace spin::eval_internal
