// Internal to src/eval: the parts of `spin eval` (spin/lab/eval.h), one job per file —
//   eval_jobs.cpp     which replays each scenario runs (the job tables);
//   eval_run.cpp      running them: scenarios, recorded traces, real-model traces, and run_eval;
//   eval_results.cpp  what they measured as typed results, and results.json;
//   eval_report.cpp   report.md, rendered from the typed results.
// compute (run_*) → results (add_results) → renderer (render_report); the tool draws the plots.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "spin/lab/advise.h"
#include "spin/lab/calibrate.h"
#include "spin/lab/eval.h"
#include "spin/lab/metrics.h"
#include "spin/predict.h"
#include "spin/lab/replay.h"
#include "spin/status.h"
#include "spin/lab/workload.h"

namespace spin::eval_internal {

// ---- Jobs (eval_jobs.cpp) --------------------------------------------------------------------

enum class Section { kPredictors, kSweep, kMtp, kPooling, kBeyond };
std::string section_name(Section s);

struct Job {
  Section section;
  std::string label;      // what the report calls it (e.g. "spin (no explore)")
  std::string predictor;  // make_predictor name
  PredictorConfig config;
  bool open_loop = false;
};

// The calibration row reads prev-iter's open-loop Pearson: the paper's all-keep statistic that the
// generator is fitted to (src/eval/calibrate.cpp) is the previous step's block scores.
inline constexpr const char* kCalibrationPredictor = "prev-iter";
inline constexpr const char* kPaperSpinLabel = "spin (paper)";  // spin with the "paper" preset
inline constexpr double kComparisonSparsity = 0.3;  // open-loop block recall is read at this budget
inline constexpr double kMtpSparsity = 0.5;         // MTP and pooling tables (where misses show)

const std::vector<double>& sweep_sparsities(bool quick);
const std::vector<double>& real_sparsities(bool quick);

// Every job of a scenario (or recorded trace); MTP scenarios run the calibration predictor and the
// MTP update modes only. Fails when an ablation does not apply to the user's base config.
Result<std::vector<Job>> jobs_for(bool mtp_scenario, const EvalOptions& o);
// The jobs of a real-model trace; `probe`: it carries a block probe at the predictors' block size.
std::vector<Job> real_jobs(bool mtp, bool probe, const EvalOptions& o);
// The top-k a real trace is read at.
std::vector<int32_t> real_topks(int32_t trace_topk, int64_t entries);

// ---- Runs (eval_run.cpp) ---------------------------------------------------------------------

struct JobResult {
  QualityStats quality{2048};
  double predictor_seconds = 0;
  double overhead_seconds = 0;       // select/observe/commit of the counted steps, probe excluded
  double indexer_entry_seconds = 0;  // the unit that turns it into indexer work
  std::vector<RequestQuality> per_request;  // each request's own mean recall and p99 miss, in order
  double overhead_fraction() const;
};

// What the jobs of one scenario measured, merged over its requests.
struct ScenarioRun {
  std::string name;
  WorkloadParams params;
  std::string description;           // recorded traces: what the file is (else params say it)
  std::vector<std::string> skipped;  // jobs not run: predictors a score trace cannot feed
  std::vector<Job> jobs;
  std::vector<JobResult> out;  // [jobs]
  TraceFacts facts;            // means over requests
  double generate_s = 0;       // generating and scoring (all-keep) the traces
  double replay_s = 0;
};

// One real trace at one top-k, and the synthetic generator at the same shape.
struct RealRun {
  std::string path, label, model, source;
  std::string kind;  // "scores": a model's attention; "keys": an indexer's keys and queries
  int32_t topk = 0;
  ScenarioRun run;
  std::vector<TraceFacts> layers;            // per layer, all-keep
  std::vector<TraceFacts> synthetic_layers;  // doc-qa-10k generated at the trace's shape
};

// ---- Typed results (eval_results.cpp); to_json writes results.json's objects -------------------
// Measured values are kept as measured (NaN where undefined); to_json writes a non-finite one as
// null (JSON has no NaN), and the report prints it as "–".

// One job's row of a table: its quality over every request of a scenario.
struct QualityRow {
  std::string scenario, label, predictor, config;
  double target_sparsity = 0;
  int64_t samples = 0, exact_by_construction = 0;
  double recall_mean = 0, miss_p50 = 0, miss_p99 = 0, miss_max = 0, block_recall_mean = 0, sparsity_mean = 0,
         block_sparsity_mean = 0, pearson_mean = 0, topk_recall_mean = 0, work_fraction = 0, probe_fraction = 0;
  // Sweep rows: the oracle's recall at the same target sparsity (0 when the sweep has no oracle
  // there), and this row's gap to it.
  std::optional<double> oracle_recall_mean, gap_to_oracle;
  nlohmann::json to_json() const;
};

// The calibration row of a scenario: prev-iter's open-loop Pearson and the all-keep facts beside
// the paper's targets (none for scenarios the paper does not measure).
struct CalibrationRow {
  std::string scenario;
  double pearson = 0, topk_recall = 0;
  std::optional<double> target_pearson, target_topk_recall;
  double topk_block_share = 0, mean_visible_entries = 0;
  nlohmann::json to_json() const;
};

// What a scenario (or recorded trace) was: its workload and the all-keep facts of its traces.
struct ScenarioFacts {
  int requests = 0;
  std::string workload;  // the generator's parameters, or "recorded trace: ..."
  std::vector<std::string> skipped_predictors;
  int32_t steps = 0, layers = 0, next_n = 0;
  int64_t prompt_tokens = 0;
  double mean_visible_entries = 0;
  int64_t samples = 0, exact_by_construction = 0;
  double topk_block_share = 0;
  nlohmann::json to_json() const;
};

// Measured times of a scenario, keyed per job ("section:label@sparsity").
struct ScenarioTiming {
  double generate_and_score_s = 0, replay_s = 0;
  std::map<std::string, double> predictor_s, overhead_fraction, cost_fraction;
  nlohmann::json to_json() const;
};

// Recall and p99 miss of one predictor's sweep read at a fixed indexer work.
struct EqualCostRow {
  std::string scenario, label;
  double work_fraction = 0, recall_mean = 0, miss_p99 = 0;
  nlohmann::json to_json() const;
};

// Mean, min and max of a per-layer statistic over the layers where it is finite (NaN mean and
// ±inf min/max when there are none).
struct LayerRange {
  double mean = 0, min = 0, max = 0;
  nlohmann::json to_json() const;
};

// Per-layer all-keep statistics and their range over the layers.
struct LayerStats {
  std::vector<TraceFacts> layers;
  LayerRange prev_step_topk_recall, prev_step_block_pearson, topk_block_share;
  nlohmann::json to_json() const;
};
LayerStats layer_stats(const std::vector<TraceFacts>& layers);

// One real-model trace at one top-k: what it is, its statistics beside the generator's, its tables.
struct RealModelResult {
  std::string trace, label, model, source, kind;
  int32_t topk = 0;
  LayerStats all_keep, synthetic;  // synthetic: doc-qa-10k generated at the same shape
  std::vector<QualityRow> sweep, mtp;
  nlohmann::json to_json() const;
};

// results.json's sections.
struct Results {
  std::vector<CalibrationRow> calibration;
  std::vector<QualityRow> predictors, sweep, mtp, pooling, beyond;
  std::vector<EqualCostRow> equal_cost;  // equal_cost_rows(sweep), once every scenario is in
  std::map<std::string, ScenarioFacts> scenarios;
  std::map<std::string, ScenarioTiming> timing;
  std::vector<RealModelResult> real_model;
  // The verdict the report opens with: the sweep's "spin" rows per request (scenarios and recorded
  // traces), by target sparsity > 0, and the advice built from them (eval_verdict).
  std::map<double, std::vector<RequestQuality>> verdict_requests;
  std::optional<Advice> verdict;
};

void add_results(const ScenarioRun& run, int requests, const std::map<std::string, CalibrationTarget>& targets,
                 Results* res);
void add_real_results(const RealRun& rr, Results* res);

// The indexer work levels of the equal-cost table, and every sweep predictor read at them.
const std::vector<double>& equal_cost_levels();
std::vector<EqualCostRow> equal_cost_rows(const std::vector<QualityRow>& sweep);

// `spin advise`'s rule over the sweep's "spin" requests, for advise's default deployment (the
// report says so, and points at `spin advise` for the reader's own); none without such rows.
Result<std::optional<Advice>> eval_verdict(const Results& res);

// The whole results.json; `threads` and the CPU are written beside the times they explain.
nlohmann::json results_json(const EvalOptions& o, const Results& res, double total_s, int threads);

// ---- Report (eval_report.cpp) ----------------------------------------------------------------

std::string render_report(const EvalOptions& o, int requests, const Results& res);

}  // namespace spin::eval_internal
