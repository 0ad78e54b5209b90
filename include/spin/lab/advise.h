// spin/lab/advise.h — `spin advise`, the adoption answer: on this deployment, is the indexer a
// real share of the decode step, how much of it can be skipped on these requests before quality
// moves, and what does that gain.
//
// Three parts, each reusing what the lab already has:
//   the step      spin/lab/diagnose.h's paper model (indexer, top-k, sparse attention) plus the
//                 rest of the model (MoE, projections: rest_of_step, public configs) and spin's own
//                 device work (spin_own_cost: measured on an H200 where bench/gpu measured it,
//                 modelled from launches and bytes elsewhere);
//   the quality   per request (a generated scenario request or one recorded trace file), closed-loop
//                 replay (spin/lab/replay.h) of spin's default and of the paper's spin at each
//                 sparsity: that request's mean recall and p99 miss; over requests, the median,
//                 the 10 %-from-worst request and the worst (Spread);
//   the rule      recommend(): the highest sparsity whose worst request's p99 miss is within the
//                 tolerance, the step gain there, and one verdict line.
// Deterministic: the same inputs give the same advice (no time is measured here).
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/advise.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "spin/lab/diagnose.h"
#include "spin/lab/model.h"
#include "spin/predict.h"
#include "spin/status.h"
#include "spin/trace.h"

namespace spin {

// ---- Configurations compared -------------------------------------------------------------------

// The paper's spin (arXiv 2610.09025 as summarised in reference/peers_dec2026.md): the library's
// "paper" preset (PredictorConfig::apply_preset).
PredictorConfig paper_spin_config();
// "key=value" pairs of `config` that differ from the defaults, in field order.
std::vector<std::pair<std::string, std::string>> config_overrides(const PredictorConfig& config);

inline constexpr const char* kConfigDefault = "spin";
inline constexpr const char* kConfigPaper = "paper";

// ---- The step ----------------------------------------------------------------------------------

struct Deployment {
  std::string model = "deepseek-v3.2";
  std::string gpu = "h200";
  int64_t context = 131072;     // tokens cached per request
  int32_t batch = 64;           // requests decoding together
  int32_t next_n = 1;           // rows per request (1 + MTP drafts)
  int32_t tensor_parallel = 8;  // GPUs the model's weights are split over (the indexer is replicated)
  double other_ms = -1;         // the rest of the step in ms; < 0 = modelled by rest_of_step
  Status validate() const;      // ranges, and the model and GPU known (one line each)
};

// The public figures of a model's non-indexer decode work (its config.json).
struct ModelWeights {
  int32_t hidden = 0, layers = 0, dense_layers = 0, dense_intermediate = 0;
  int32_t routed_experts = 0, experts_per_token = 0, shared_experts = 0, expert_intermediate = 0;
  double attention_params_per_layer = 0;  // MLA projections (q, kv, o), per layer
  int32_t vocab = 0;
  std::string source;
};
Result<ModelWeights> model_weights(const std::string& model);

// The rest of one decode step on one GPU (MoE, dense FFNs, attention projections, lm_head): the
// FP8 weights each GPU streams (its 1/tensor_parallel share of the dense weights and of every
// routed expert some token of the batch picks, routing assumed uniform) against HBM, or the
// FLOPs against FP8 dense, whichever binds. Communication, sampling and the host are left out,
// so it is a floor (and the gain an upper bound).
struct RestOfStep {
  double ms = 0;
  double bytes_per_gpu = 0, flops_per_gpu = 0, experts_touched_per_layer = 0;
  std::string bound;   // "memory" or "compute"
  std::string source;  // the figures and the assumptions, one line
};
Result<RestOfStep> rest_of_step(const Deployment& deployment);

// spin's own device work in one decode step at target sparsity `sparsity` (plan, compact,
// observe + remap, over the model's indexer layers).
struct SpinOwnCost {
  double ms = 0;
  bool measured = false;  // bench/gpu measured it on this GPU (the nearest grid point)
  double modelled_ms = 0; // the launch-and-byte model, always computed (beside the measurement)
  std::string source;
};
SpinOwnCost spin_own_cost(const Deployment& deployment, double sparsity);

struct StepPoint {
  double target_sparsity = 0, realised_sparsity = 0;
  double step_ms = 0;     // with spin: indexer and top-k over the scored entries, plus spin's own
  double gain = 0;        // all-keep step / step_ms - 1: the decode-throughput gain at this batch
  SpinOwnCost own;
};

struct StepModel {
  Deployment deployment;
  DiagnoseResult diagnose;  // indexer, top-k, attention (other_ms = rest.ms)
  RestOfStep rest;
  double step_ms = 0;       // all-keep
  double indexer_share = 0, topk_share = 0;
  std::vector<StepPoint> points;
  std::vector<std::string> sources;
};
Result<StepModel> model_step(const Deployment& deployment, const std::vector<double>& sparsities);

// ---- The quality -------------------------------------------------------------------------------

// One request's closed-loop quality at one configuration and sparsity.
struct RequestQuality {
  double recall_mean = 0, miss_p99 = 0, realised_sparsity = 0;
};

// A per-request value over the requests: the median request, the request 10 % from the worst
// (nearest rank) and the worst request. "Worst" is the lowest recall or the highest miss.
struct Spread {
  double median = 0, p10 = 0, worst = 0;
};
// (spread_of, quality_points and measure_advise_quality are built in spin_eval: they use its
// nearest-rank percentiles and replays.)
Spread spread_of(std::vector<double> values, bool higher_is_better);

struct QualityPoint {
  std::string config;  // kConfigDefault or kConfigPaper
  double target_sparsity = 0;
  int64_t requests = 0;
  Spread recall_mean, miss_p99;
  double realised_sparsity = 0;  // mean over requests
};
// The points of every (config, sparsity) from per-request results ([config][sparsity][request]).
std::vector<QualityPoint> quality_points(const std::vector<std::string>& configs, const std::vector<double>& sparsities,
                                         const std::vector<std::vector<std::vector<RequestQuality>>>& results);

struct AdviseQualityOptions {
  std::vector<std::string> scenarios;  // empty and no traces: default_advise_scenarios()
  std::vector<std::string> traces;     // recorded trace files: one request each
  std::vector<double> sparsities;      // empty: default_advise_sparsities()
  int requests = 3;                    // generated requests per scenario (seeds seed, seed+1, ...)
  int32_t steps = 24, layers = 2;      // of each generated request
  uint64_t seed = 1;
  int threads = 0;
  // Read every trace at the model's top-k, whatever top-k it was recorded at (its scores are
  // whole: `spin replay --topk` does the same): for traces of another model, such as the
  // real-model traces of a small LM (top-k scaled to their 8K context). Page size and compress
  // ratio must still match.
  bool at_model_topk = false;
  std::function<void(const std::string& stage, double fraction)> progress;
};
const std::vector<std::string>& default_advise_scenarios();
const std::vector<double>& default_advise_sparsities();

struct AdviseQuality {
  std::vector<QualityPoint> points;  // [config × sparsity], kConfigDefault first
  std::vector<std::string> sources;  // what the requests were, one line each
};
// Replays every request with spin's default and the paper's spin at each sparsity (closed loop,
// warm start, prefills observed: spin/lab/replay.h). Generated requests take the model's top-k
// and page size and `next_n` rows; a trace must have the model's geometry.
Result<AdviseQuality> measure_advise_quality(const ModelPreset& model, int32_t next_n,
                                             const AdviseQualityOptions& options);

// A trace file whose geometry (top-k unless `any_topk`, page size, compress ratio) is not the
// model's: one line naming the file, what it has and what the model has.
Status check_trace_geometry(const std::string& path, const TraceMeta& meta, const ModelPreset& model,
                            bool any_topk = false);

// ---- The rule ----------------------------------------------------------------------------------

// Below this share of the step the indexer cannot pay for spin: at the paper's highest operating
// point (50 % sparsity) it would save under 5 % of the step before spin's own cost, which an
// end-to-end serving measurement does not tell from run-to-run noise.
inline constexpr double kMinIndexerShare = 0.10;
// The default tolerance on the worst request's p99 miss: the paper's RULER run at 50 % sparsity
// reached a p99 miss of 48.83 % with task quality kept (LongBench-v2 within 2.6 % relative at
// 20–50 %: DESIGN.md §5, reference/peers_dec2026.md), so 0.5 is the most the paper showed harmless.
inline constexpr double kDefaultTolerance = 0.5;

struct Advice {
  StepModel step;
  std::vector<QualityPoint> quality;
  std::vector<std::string> sources_of_quality;  // what the requests were
  double tolerance = kDefaultTolerance;
  bool pays = false;                     // spin is worth running here at this tolerance
  std::optional<double> recommended_sparsity;  // the highest within tolerance (even if it cannot pay)
  std::string recommended_config;        // kConfigDefault or kConfigPaper
  double expected_gain = 0;              // step gain at the recommendation
  double p99_miss_worst = 0;             // worst request's p99 miss there
  std::string verdict;                   // one line
  std::string vllm_line;                 // the `vllm serve` line for the recommendation ("" if none)
  std::vector<std::string> notes;
  // What spin did to the decode step's latency tail on this CPU (`spin bench decode`'s engine),
  // when measured (the tool measures it; the library never times anything here).
  struct CpuTail {
    std::string setup, cpu;
    double sparsity = 0;
    double all_keep_p50_ms = 0, all_keep_p99_ms = 0, spin_p50_ms = 0, spin_p99_ms = 0;
  };
  std::optional<CpuTail> cpu_tail;
};
// Tolerance in (0, 1); the quality points' sparsities must be among the step model's.
// `measured_on` names the requests in the verdict ("your traces", "the built-in scenarios").
inline constexpr const char* kOnYourTraces = "your traces";
inline constexpr const char* kOnScenarios = "the built-in scenarios";
Result<Advice> recommend(const StepModel& step, const std::vector<QualityPoint>& quality, double tolerance,
                         const std::string& measured_on = kOnYourTraces);

// One screen of text, and the same as JSON fields (indexer_share, recommended_sparsity, ...).
std::string advice_text(const Advice& advice);
std::string advice_json(const Advice& advice);
// The short verdict block `spin eval`'s report opens with (markdown).
std::string advice_markdown(const Advice& advice);

}  // namespace spin
