// Workload calibration against the SPIN paper's all-keep statistics (see spin/lab/calibrate.h).
#include "spin/lab/calibrate.h"

#include <nlohmann/json.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <cstdio>

#include "core/atomic_file.h"
#include "core/errors.h"
#include "spin/lab/replay.h"

namespace spin {

const std::vector<CalibrationTarget>& paper_targets() {
  // DeepSeek-V3.2 (doc-qa-*) and V4 Flash (v4flash-*), prev-iter at 9.7K / 94K prompts.
  static const std::vector<CalibrationTarget> targets = {{"doc-qa-10k", 0.913, 0.824},
                                                         {"doc-qa-94k", 0.902, 0.615},
                                                         {"v4flash-10k", 0.876, 0.751},
                                                         {"v4flash-94k", 0.849, 0.577}};
  return targets;
}

Result<CalibrationMeasurement> measure_calibration(const WorkloadParams& params, int seeds) {
  QualityStats pearson(params.topk);
  CalibrationMeasurement m;
  for (int i = 0; i < seeds; ++i) {
    WorkloadParams p = params;
    p.seed = params.seed + static_cast<uint64_t>(i);
    auto trace = generate_workload(p);
    if (!trace.ok()) return trace.status();
    auto scored = score_trace(trace.value());
    if (!scored.ok()) return scored.status();
    ReplayOptions options;
    options.predictor = "prev-iter";
    options.open_loop = true;
    auto result = replay(trace.value(), *scored.value(), options);
    if (!result.ok()) return result.status();
    pearson.merge(result->quality);
    const TraceFacts facts = trace_facts(*scored.value(), p.page_size);
    m.topk_recall += facts.prev_step_topk_recall / seeds;
    m.topk_block_share += facts.topk_block_share / seeds;
  }
  m.pearson = pearson.pearson().mean();
  return m;
}

namespace {

// The knobs calibrate() moves, with their ranges and the step used for finite differences.
struct Knob {
  double WorkloadParams::*field;
  const char* name;
  double lo, hi, scale;  // scale: a "typical" change, so that steps are comparable across knobs
};
const std::vector<Knob>& knobs() {
  static const std::vector<Knob> k = {
      {&WorkloadParams::query_noise, "query_noise", 0.0, 16.0, 2.0},
      {&WorkloadParams::head_spread, "head_spread", 0.0, 24.0, 2.0},
      {&WorkloadParams::salience_sigma, "salience_sigma", 0.05, 4.0, 0.3},
  };
  return k;
}

}  // namespace

// One function: the Gauss–Newton iteration below (Jacobian, minimum-norm step,
// backtracking) shares params, current and the best point measure() keeps; split, every stage
// would take all of them.
Result<CalibrationResult> calibrate(const CalibrationTarget& target, const CalibrationOptions& options) {
  auto base = scenario_params(target.scenario);
  if (!base.ok()) return base.status();
  WorkloadParams params = base.value();
  const std::vector<Knob>& ks = knobs();
  auto error_of = [&](const std::array<double, 2>& y) {
    return std::max(std::fabs(target.pearson - y[0]), std::fabs(target.topk_recall - y[1]));
  };
  // Every measurement — steps and finite-difference probes alike — competes for the result.
  WorkloadParams best = params;
  CalibrationMeasurement best_m;
  double best_error = std::numeric_limits<double>::infinity();
  auto measure = [&](const WorkloadParams& p) -> Result<std::array<double, 2>> {
    auto m = measure_calibration(p, options.seeds);
    if (!m.ok()) return m.status();
    if (options.progress) {
      std::string line = " ";
      for (const Knob& k : ks) line += fmt::format(" {}={:.4f}", k.name, p.*k.field);
      options.progress(line + fmt::format(" → pearson {:.4f}, topk recall {:.4f}", m->pearson, m->topk_recall));
    }
    const std::array<double, 2> y = {m->pearson, m->topk_recall};
    if (error_of(y) < best_error) {
      best_error = error_of(y);
      best = p;
      best_m = m.value();
    }
    return y;
  };
  // Damped Gauss–Newton on the two statistics over three knobs (in units of each knob's scale):
  // a finite-difference Jacobian J (2×3), the minimum-norm step J^T (J J^T)^-1 · error, then
  // backtracking (halve the step until the error shrinks). The best point seen is kept.
  auto y = measure(params);
  if (!y.ok()) return y.status();
  std::array<double, 2> current = y.value();
  for (int iteration = 0; iteration < options.iterations; ++iteration) {
    if (error_of(current) < options.tolerance) break;
    const double e0 = target.pearson - current[0];
    const double e1 = target.topk_recall - current[1];
    double J[2][3];
    for (size_t k = 0; k < ks.size(); ++k) {
      WorkloadParams probe = params;
      const double h = 0.25 * ks[k].scale;
      const bool up = params.*ks[k].field + h <= ks[k].hi;
      probe.*ks[k].field += up ? h : -h;
      auto yk = measure(probe);
      if (!yk.ok()) return yk.status();
      J[0][k] = (yk.value()[0] - current[0]) / (up ? 0.25 : -0.25);
      J[1][k] = (yk.value()[1] - current[1]) / (up ? 0.25 : -0.25);
    }
    const double a = J[0][0] * J[0][0] + J[0][1] * J[0][1] + J[0][2] * J[0][2] + 1e-9;
    const double b = J[0][0] * J[1][0] + J[0][1] * J[1][1] + J[0][2] * J[1][2];
    const double d = J[1][0] * J[1][0] + J[1][1] * J[1][1] + J[1][2] * J[1][2] + 1e-9;
    const double det = a * d - b * b;
    if (std::fabs(det) < 1e-12) break;  // the knobs no longer move the statistics independently
    const double u0 = (d * e0 - b * e1) / det;
    const double u1 = (-b * e0 + a * e1) / det;
    bool improved = false;
    for (double damping = 1.0; damping > 0.05 && !improved; damping *= 0.5) {
      WorkloadParams trial = params;
      // Scale units; shrink the whole vector (keeping its direction) to at most one scale.
      double step[3], largest = 0;
      for (size_t k = 0; k < ks.size(); ++k) {
        step[k] = damping * (J[0][k] * u0 + J[1][k] * u1);
        largest = std::max(largest, std::fabs(step[k]));
      }
      for (size_t k = 0; k < ks.size(); ++k) {
        const double s = largest > 1.0 ? step[k] / largest : step[k];
        trial.*ks[k].field = std::clamp(params.*ks[k].field + s * ks[k].scale, ks[k].lo, ks[k].hi);
      }
      auto yt = measure(trial);
      if (!yt.ok()) return yt.status();
      if (error_of(yt.value()) < error_of(current)) {
        params = trial;
        current = yt.value();
        improved = true;
      }
    }
    if (!improved) break;  // a local minimum of the achievable error
  }
  return CalibrationResult{target, best, best_m};
}

Status write_calibration(const std::string& path, const std::vector<CalibrationResult>& results,
                         const std::string& command) {
  nlohmann::json doc;
  doc["_comment"] = "Written by `spin calibrate --write`; compiled into the generator. Do not edit by hand.";
  doc["command"] = command;
  doc["scenarios"] = nlohmann::json::object();
  for (const CalibrationResult& r : results) {
    nlohmann::json fitted = nlohmann::json::object();
    for (const Knob& k : knobs()) fitted[k.name] = fmt::format("{:.6g}", r.params.*k.field);
    doc["scenarios"][r.target.scenario] = {
        {"params", fitted},
        {"prompt_tokens", r.params.prompt_tokens},
        {"target", {{"pearson", r.target.pearson}, {"topk_recall", r.target.topk_recall}}},
        {"achieved", {{"pearson", r.achieved.pearson}, {"topk_recall", r.achieved.topk_recall}}}};
  }
  return write_file_atomic(path, doc.dump(2) + "\n");
}

}  // namespace spin
