// `spin advise`'s quality (spin/lab/advise.h: spread_of, quality_points, measure_advise_quality):
// every request — a generated
// scenario request, or one recorded trace file — replayed closed loop with spin's default and the
// paper's spin at each sparsity; each request's mean recall and p99 miss, spread over requests.
// The step model and the rule are spin_diagnose's (src/diagnose/advise.cpp).
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>

#include "core/errors.h"
#include "spin/lab/advise.h"
#include "spin/lab/metrics.h"
#include "spin/lab/replay.h"
#include "spin/lab/workload.h"

namespace spin {
namespace {

using Stage = std::function<void(const std::string& stage, double fraction)>;
using PerConfig = std::vector<std::vector<std::vector<RequestQuality>>>;  // [config][sparsity][request]

struct Request {
  std::string label;
  std::shared_ptr<const ScoredTrace> scored;
};

// Replays one scored request with every (config, sparsity); appends its results in that order,
// independent of which thread finished first.
Status replay_request(const Request& r, const std::vector<PredictorConfig>& configs, const std::vector<double>& sparsities,
                      int threads, PerConfig* out) {
  const size_t n = configs.size() * sparsities.size();
  std::vector<RequestQuality> part(n);
  std::vector<Status> errors(n);
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t j = 0; j < n; ++j) {
    ReplayOptions ro;
    ro.predictor = "spin";
    ro.config = configs[j / sparsities.size()];
    ro.config.target_sparsity = sparsities[j % sparsities.size()];
    auto res = replay(*r.scored, ro);
    if (!res.ok()) {
      errors[j] = res.status();
      continue;
    }
    part[j] = {res->quality.recall().mean(), res->quality.miss().percentile(99), res->quality.sparsity().mean()};
  }
  for (size_t j = 0; j < n; ++j) {
    if (!errors[j].ok()) return Status(errors[j].code(), r.label + ": " + errors[j].message());
    (*out)[j / sparsities.size()][j % sparsities.size()].push_back(part[j]);
  }
  return ok_status();
}

Result<Request> generated_request(const ModelPreset& model, int32_t next_n, const AdviseQualityOptions& o,
                                  const std::string& scenario, int request, int threads) {
  auto params = scenario_params(scenario);
  if (!params.ok()) return params.status();
  params->steps = o.steps;
  params->layers = o.layers;
  params->next_n = next_n;
  params->topk = model.topk;
  params->page_size = model.page_size;
  params->seed = o.seed + static_cast<uint64_t>(request);
  auto trace = generate_workload(params.value());
  if (!trace.ok()) return trace.status();
  ScoreOptions so;
  so.threads = threads;
  auto scored = score_trace(trace.value(), so);
  if (!scored.ok()) return scored.status();
  return Request{fmt::format("{} request {}", scenario, request + 1), std::move(scored).value()};
}

Result<Request> trace_request(const ModelPreset& model, const std::string& path, bool at_model_topk, int threads) {
  auto reader = TraceReader::open(path);
  if (!reader.ok()) return reader.status();
  SPIN_RETURN_IF_ERROR(check_trace_geometry(path, reader->meta(), model, at_model_topk));
  ScoreOptions so;
  so.threads = threads;
  so.topk = model.topk;
  auto scored = reader->kind() == TraceKind::kScores ? score_trace(reader->to_score_trace(), so)
                                                     : score_trace(reader->to_trace(), so);
  if (!scored.ok()) return Status(scored.status().code(), path + ": " + scored.status().message());
  // What the file is (a real model's attention is not a DSA indexer: say whose scores these are).
  const std::string label = fmt::format("{} (model {}, {} trace, top-k {}{})", path, reader->meta().model,
                                        trace_kind_name(reader->kind()), reader->meta().topk,
                                        reader->meta().topk == model.topk ? "" : fmt::format(", read at top-k {}", model.topk));
  return Request{label, std::move(scored).value()};
}

}  // namespace

Spread spread_of(std::vector<double> values, bool higher_is_better) {
  Spread s;
  if (values.empty()) return {NAN, NAN, NAN};
  // Sorted worst first: the 10 %-from-worst request is the nearest-rank 10th percentile of that order.
  std::sort(values.begin(), values.end());
  if (!higher_is_better) std::reverse(values.begin(), values.end());
  const auto n = static_cast<int64_t>(values.size());
  const auto rank = [n](double p) { return nearest_rank(p, n); };  // spin/lab/metrics.h's percentiles
  s.worst = values.front();
  s.p10 = values[rank(10) - 1];
  // The median by value (nearest rank of the ascending order), whichever way is better.
  std::vector<double> asc = values;
  std::sort(asc.begin(), asc.end());
  s.median = asc[rank(50) - 1];
  return s;
}

std::vector<QualityPoint> quality_points(const std::vector<std::string>& configs, const std::vector<double>& sparsities,
                                         const std::vector<std::vector<std::vector<RequestQuality>>>& results) {
  std::vector<QualityPoint> out;
  for (size_t c = 0; c < configs.size() && c < results.size(); ++c) {
    for (size_t i = 0; i < sparsities.size() && i < results[c].size(); ++i) {
      std::vector<double> recall, miss;
      double realised = 0;
      for (const RequestQuality& q : results[c][i]) {
        recall.push_back(q.recall_mean);
        miss.push_back(q.miss_p99);
        realised += q.realised_sparsity;
      }
      QualityPoint p;
      p.config = configs[c];
      p.target_sparsity = sparsities[i];
      p.requests = static_cast<int64_t>(recall.size());
      p.recall_mean = spread_of(recall, true);
      p.miss_p99 = spread_of(miss, false);
      p.realised_sparsity = recall.empty() ? NAN : realised / static_cast<double>(recall.size());
      out.push_back(p);
    }
  }
  return out;
}

Result<AdviseQuality> measure_advise_quality(const ModelPreset& model, int32_t next_n, const AdviseQualityOptions& o) {
  if (o.requests < 1 || o.steps < 2 || o.layers < 1) {
    return invalid_argument("advise: requests {}, steps {}, layers {}: need ≥ 1, ≥ 2, ≥ 1", o.requests, o.steps, o.layers);
  }
  const std::vector<std::string> configs = {kConfigDefault, kConfigPaper};
  const std::vector<PredictorConfig> config_values = {PredictorConfig{}, paper_spin_config()};
  const std::vector<double>& sparsities = o.sparsities.empty() ? default_advise_sparsities() : o.sparsities;
  const std::vector<std::string>& scenarios =
      o.scenarios.empty() && o.traces.empty() ? default_advise_scenarios() : o.scenarios;
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const Stage stage = o.progress ? o.progress : [](const std::string&, double) {};
  const double total = static_cast<double>(scenarios.size() * o.requests + o.traces.size());
  PerConfig results(configs.size(), std::vector<std::vector<RequestQuality>>(sparsities.size()));
  AdviseQuality out;
  double done = 0;
  for (const std::string& scenario : scenarios) {
    for (int i = 0; i < o.requests; ++i) {
      stage(fmt::format("{} request {}/{}", scenario, i + 1, o.requests), done++ / total);
      auto r = generated_request(model, next_n, o, scenario, i, threads);
      if (!r.ok()) return r.status();
      SPIN_RETURN_IF_ERROR(replay_request(r.value(), config_values, sparsities, threads, &results));
    }
    out.sources.push_back(fmt::format("{} × {} generated ({} steps, {} layers, top-k {}, next_n {})", scenario,
                                      o.requests, o.steps, o.layers, model.topk, next_n));
  }
  for (const std::string& path : o.traces) {
    stage(path, done++ / total);
    auto r = trace_request(model, path, o.at_model_topk, threads);
    if (!r.ok()) return r.status();
    SPIN_RETURN_IF_ERROR(replay_request(r.value(), config_values, sparsities, threads, &results));
    out.sources.push_back(r->label);
  }
  stage("done", 1.0);
  out.points = quality_points(configs, sparsities, results);
  return out;
}

}  // namespace spin
