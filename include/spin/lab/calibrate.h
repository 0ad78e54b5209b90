// spin/lab/calibrate.h — fits the workload generator to the SPIN paper's all-keep statistics.
//
// The paper (DeepSeek-V3.2, 9.7K / 94K prompts) reports for the prev-iter predictor, open loop:
// Pearson of pooled block scores 0.913 / 0.902 and token top-k recall between consecutive steps
// 0.824 / 0.615. calibrate() fits three generator knobs for one scenario:
//   query_noise     per-step query noise: how much top-k churns (both statistics ↓);
//   head_spread     fixed per-head query directions: a stable, head-specific score level per
//                   segment, which steadies block maxima (Pearson ↑) at long context;
//   salience_sigma  spread of stable per-entry salience (both ↑; moves Pearson most at short
//                   context, where head_spread hardly matters).
// No single pair separates the two statistics at both context lengths (found by probing), so the
// fit is a damped Gauss–Newton over all three (finite-difference Jacobian, minimum-norm steps,
// backtracking), each candidate measured on the default eval's sample (see seeds). Deterministic.
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/calibrate.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

#include <functional>
#include <string>
#include <vector>

#include "spin/status.h"
#include "spin/lab/workload.h"

namespace spin {

struct CalibrationTarget {
  std::string scenario;
  double pearson = 0;
  double topk_recall = 0;
};
// The paper's points: doc-qa-10k and doc-qa-94k (DeepSeek-V3.2), v4flash-10k and v4flash-94k
// (DeepSeek-V4 Flash).
const std::vector<CalibrationTarget>& paper_targets();

struct CalibrationMeasurement {
  double pearson = 0;      // prev-iter open loop, mean over samples
  double topk_recall = 0;  // |TopK_{t-1} ∩ TopK_t| / k, mean
  double topk_block_share = 0;
};
// Measures one parameter set (generate, score, replay prev-iter open loop) over `seeds`
// requests with seeds params.seed, params.seed+1, ... (sample-weighted means).
Result<CalibrationMeasurement> measure_calibration(const WorkloadParams& params, int seeds = 1);

struct CalibrationOptions {
  // Each candidate is measured on exactly what `spin eval` runs by default — the scenario's steps
  // and layers, requests with seeds 1..seeds — because both statistics are dominated by rare
  // focus shifts and vary by ±0.03 between small samples.
  int seeds = 3;
  int iterations = 10;      // Gauss–Newton iterations (4–8 measurements each)
  double tolerance = 0.01;   // stop when both statistics are this close
  std::function<void(const std::string& line)> progress;
};
struct CalibrationResult {
  CalibrationTarget target;
  WorkloadParams params;  // full params with the fitted knobs
  CalibrationMeasurement achieved;
};
Result<CalibrationResult> calibrate(const CalibrationTarget& target, const CalibrationOptions& options = {});

// Writes the fitted knobs of `results` as data/calibration.json content, atomically.
Status write_calibration(const std::string& path, const std::vector<CalibrationResult>& results,
                         const std::string& command);

}  // namespace spin
