// spin/lab/eval.h — `spin eval`, the main job: every quality claim of the project on the built-in
// scenarios, written as report.md and results.json (the `spin` command draws the plots from
// results.json: the library runs no programs).
//
// Sections (each a table in report.md and a key in results.json):
//   calibration   per scenario: all-keep prev-iter Pearson and top-k recall (paper target beside
//                 them where the paper has one), share of blocks holding ≥ 1 top-k entry;
//   predictors    open loop (predictors see every step's full scores): Pearson of each
//                 predictor's block ranking against the true pooled scores, block recall of the
//                 blocks it would keep at the comparison sparsity;
//   sweep         closed loop, sparsity 0–60 %: spin with and without exploration against
//                 step-reuse, hisa, indexcache-2/4, prev-iter, random and the oracle at the same
//                 budget — mean recall, p99 miss, realised sparsity, gap to the oracle;
//   mtp           MTP scenarios: prefix vs row0 vs all-rows replay, mean recall and p99 miss;
//   pooling       spin with max / mean / topk-hits / lse pooling;
//   real_model    real-model traces (EvalOptions::real_traces): per-layer statistics, sweeps at two
//                 top-k, MTP modes, and the synthetic generator at the same shape for comparison.
// Prefills (step 0 and every ctx_len jump, spin/lab/replay.h) are observed in full by every predictor
// and not counted. Deterministic: the same options give an identical results.json apart from its "timing" keys.
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/eval.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "spin/predict.h"
#include "spin/status.h"

namespace spin {

struct EvalOptions {
  // Empty = the built-in set (base and -mtp) but the long-context tasks (niah-*, mrcr-*: by name),
  // unless traces are given.
  std::vector<std::string> scenarios;
  // Recorded trace files (key or score traces, spin/trace.h), each evaluated like a scenario with
  // one request; on a score trace the predictors that need keys (hisa) are skipped, and the
  // report says so.
  std::vector<std::string> traces;
  // Real-model traces (recorded by ./scripts/record-real-traces.sh: a pretrained LM's attention,
  // not a DSA indexer): the "real model" section — per-layer all-keep statistics, the closed-loop
  // sweep (0–70 %) of every score-only predictor with the oracle at the trace's top-k and at the
  // other of {top-k scaled to the context, DSA's 2048}, MTP update modes on MTP traces, and the
  // synthetic generator at the same shape beside them (the default scenarios still run).
  std::vector<std::string> real_traces;
  bool quick = false;                  // shorter runs, fewer points: ≤ 2 minutes
  std::string out_dir = "spin-report";
  uint64_t seed = 1;
  int requests = 0;                    // requests (seeds) per scenario; 0 = 3, or 1 with quick
  int threads = 0;
  PredictorConfig base_config;         // printed with the results; sweeps vary target_sparsity
  // Progress lines (stage, fraction done); the CLI draws them.
  std::function<void(const std::string& stage, double fraction)> progress;
};

struct EvalSummary {
  std::string report_md;     // the whole report, also written to out_dir/report.md
  std::string results_path;  // out_dir/results.json
};

Result<EvalSummary> run_eval(const EvalOptions& options);

}  // namespace spin
