// `spin eval`'s results: what the runs measured, as the typed rows of results.json's sections
// (add_results), the equal-cost table read off the sweeps, and each row's JSON.
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>

#include <nlohmann/json.hpp>

#include "eval/eval_internal.h"
#include "spin/cpu.h"

namespace spin::eval_internal {

using json = nlohmann::json;

namespace {

// NaN-safe JSON number (JSON has no NaN): null.
json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }
json num(const std::optional<double>& v) { return v ? num(*v) : json(nullptr); }

double finite_or_nan(double v) { return std::isfinite(v) ? v : NAN; }

QualityRow quality_row(const std::string& scenario, const Job& job, const QualityStats& q) {
  QualityRow row;
  row.scenario = scenario;
  row.label = job.label;
  row.predictor = job.predictor;
  row.target_sparsity = job.config.target_sparsity;
  row.config = job.config.to_string();
  row.samples = q.samples();
  row.exact_by_construction = q.exact_by_construction();
  row.recall_mean = q.recall().mean();
  row.miss_p50 = q.miss().percentile(50);
  row.miss_p99 = q.miss().percentile(99);
  row.miss_max = q.miss().max();
  row.block_recall_mean = q.block_recall().mean();
  row.sparsity_mean = q.sparsity().mean();
  row.block_sparsity_mean = q.block_sparsity().mean();
  row.pearson_mean = q.pearson().mean();
  row.topk_recall_mean = q.topk_recall().mean();
  row.work_fraction = q.work_fraction();
  row.probe_fraction = q.probe_fraction();
  return row;
}

ScenarioFacts scenario_facts(const ScenarioRun& run, int requests) {
  const WorkloadParams& params = run.params;
  ScenarioFacts f;
  f.requests = requests;
  f.workload = run.description.empty() ? params.to_string() : run.description;
  f.skipped_predictors = run.skipped;
  f.steps = params.steps;
  f.layers = params.layers;
  f.next_n = params.next_n;
  f.prompt_tokens = params.prompt_tokens;
  f.mean_visible_entries = run.facts.mean_visible_entries;
  f.samples = run.facts.samples;
  f.exact_by_construction = run.facts.exact_by_construction;
  f.topk_block_share = run.facts.topk_block_share;
  return f;
}

CalibrationRow calibration_row(const std::string& scenario, const QualityStats& q, const TraceFacts& facts,
                               const std::map<std::string, CalibrationTarget>& targets) {
  CalibrationRow c;
  c.scenario = scenario;
  c.pearson = q.pearson().mean();
  c.topk_recall = facts.prev_step_topk_recall;
  if (const auto it = targets.find(scenario); it != targets.end()) {
    c.target_pearson = it->second.pearson;
    c.target_topk_recall = it->second.topk_recall;
  }
  c.topk_block_share = facts.topk_block_share;
  c.mean_visible_entries = facts.mean_visible_entries;
  return c;
}

// The oracle's recall per target sparsity, for the sweep's gap column.
std::map<double, double> oracle_recall(const ScenarioRun& run) {
  std::map<double, double> oracle;
  for (size_t j = 0; j < run.jobs.size(); ++j) {
    if (run.jobs[j].section == Section::kSweep && find_predictor(run.jobs[j].predictor)->reads == PredictorReads::kTrueTopk) {
      oracle[run.jobs[j].config.target_sparsity] = run.out[j].quality.recall().mean();
    }
  }
  return oracle;
}

// Recall and p99 miss of one predictor's sweep at indexer work `cost`: linear between the two
// sweep points whose work brackets it; NaN outside the points' range.
std::pair<double, double> at_cost(std::vector<std::array<double, 3>> points, double cost) {
  std::sort(points.begin(), points.end());
  for (size_t i = 0; i + 1 < points.size(); ++i) {
    const auto& a = points[i];
    const auto& b = points[i + 1];
    if (cost < a[0] || cost > b[0]) continue;
    const double t = b[0] > a[0] ? (cost - a[0]) / (b[0] - a[0]) : 0.0;
    return {a[1] + t * (b[1] - a[1]), a[2] + t * (b[2] - a[2])};
  }
  return {NAN, NAN};
}

// Every sweep row's (work, recall, p99 miss), per scenario and label.
std::map<std::string, std::map<std::string, std::vector<std::array<double, 3>>>> cost_points(
    const std::vector<QualityRow>& sweep) {
  std::map<std::string, std::map<std::string, std::vector<std::array<double, 3>>>> points;
  for (const QualityRow& r : sweep) {
    const double w = r.work_fraction;
    if (std::isfinite(w)) {
      points[r.scenario][r.label].push_back({w, finite_or_nan(r.recall_mean), finite_or_nan(r.miss_p99)});
    }
  }
  return points;
}

}  // namespace

void add_results(const ScenarioRun& run, int requests, const std::map<std::string, CalibrationTarget>& targets,
                 Results* res) {
  const std::string& name = run.name;
  res->scenarios[name] = scenario_facts(run, requests);
  ScenarioTiming& timing = res->timing[name];
  timing = {run.generate_s, run.replay_s, {}, {}, {}};
  std::map<double, double> oracle = oracle_recall(run);
  for (size_t j = 0; j < run.jobs.size(); ++j) {
    const Job& job = run.jobs[j];
    const QualityStats& q = run.out[j].quality;
    QualityRow row = quality_row(name, job, q);
    const std::string key = section_name(job.section) + ":" + job.label + "@" + fmt::format("{:.2f}", job.config.target_sparsity);
    timing.predictor_s[key] = run.out[j].predictor_seconds;
    // Measured, so under timing: what select/observe cost in indexer work, and the total.
    const double overhead = run.out[j].overhead_fraction();
    timing.overhead_fraction[key] = overhead;
    timing.cost_fraction[key] = q.work_fraction() + overhead;
    switch (job.section) {
      case Section::kPredictors:
        res->predictors.push_back(row);
        if (job.predictor == kCalibrationPredictor) res->calibration.push_back(calibration_row(name, q, run.facts, targets));
        break;
      case Section::kSweep:
        row.oracle_recall_mean = oracle[job.config.target_sparsity];
        row.gap_to_oracle = oracle[job.config.target_sparsity] - q.recall().mean();
        res->sweep.push_back(row);
        if (job.label == kConfigDefault && job.config.target_sparsity > 0) {
          auto& requests_at = res->verdict_requests[job.config.target_sparsity];
          requests_at.insert(requests_at.end(), run.out[j].per_request.begin(), run.out[j].per_request.end());
        }
        break;
      case Section::kMtp: res->mtp.push_back(row); break;
      case Section::kPooling: res->pooling.push_back(row); break;
      case Section::kBeyond: res->beyond.push_back(row); break;
    }
  }
}

LayerStats layer_stats(const std::vector<TraceFacts>& layers) {
  struct Range {
    double sum = 0, lo = INFINITY, hi = -INFINITY;
    int n = 0;
    void add(double v) {
      if (!std::isfinite(v)) return;
      sum += v, lo = std::min(lo, v), hi = std::max(hi, v), ++n;
    }
    LayerRange get() const { return {n ? sum / n : NAN, lo, hi}; }
  } recall, pearson, share;
  for (const TraceFacts& f : layers) {
    recall.add(f.prev_step_topk_recall);
    pearson.add(f.prev_step_block_pearson);
    share.add(f.topk_block_share);
  }
  return {layers, recall.get(), pearson.get(), share.get()};
}

void add_real_results(const RealRun& rr, Results* res) {
  Results part;
  add_results(rr.run, 1, {}, &part);
  res->timing[rr.label] = part.timing[rr.label];
  res->real_model.push_back({rr.path, rr.label, rr.model, rr.source, rr.kind, rr.topk, layer_stats(rr.layers),
                             layer_stats(rr.synthetic_layers), part.sweep, part.mtp});
}

const std::vector<double>& equal_cost_levels() {
  static const std::vector<double> levels = {0.5, 0.6, 0.7, 0.8};
  return levels;
}

std::vector<EqualCostRow> equal_cost_rows(const std::vector<QualityRow>& sweep) {
  std::vector<EqualCostRow> out;
  for (const auto& [scenario, by_label] : cost_points(sweep)) {
    for (const auto& [label, points] : by_label) {
      for (double c : equal_cost_levels()) {
        const auto [recall, p99] = at_cost(points, c);
        out.push_back({scenario, label, c, recall, p99});
      }
    }
  }
  return out;
}

// ---- JSON ------------------------------------------------------------------------------------

json QualityRow::to_json() const {
  json j = {{"samples", samples},
            {"exact_by_construction", exact_by_construction},
            {"recall_mean", num(recall_mean)},
            {"miss_p50", num(miss_p50)},
            {"miss_p99", num(miss_p99)},
            {"miss_max", num(miss_max)},
            {"block_recall_mean", num(block_recall_mean)},
            {"sparsity_mean", num(sparsity_mean)},
            {"block_sparsity_mean", num(block_sparsity_mean)},
            {"pearson_mean", num(pearson_mean)},
            {"topk_recall_mean", num(topk_recall_mean)},
            {"work_fraction", num(work_fraction)},
            {"probe_fraction", num(probe_fraction)},
            {"scenario", scenario},
            {"label", label},
            {"predictor", predictor},
            {"target_sparsity", target_sparsity},
            {"config", config}};
  if (oracle_recall_mean) j["oracle_recall_mean"] = num(oracle_recall_mean);
  if (gap_to_oracle) j["gap_to_oracle"] = num(gap_to_oracle);
  return j;
}

json CalibrationRow::to_json() const {
  return {{"scenario", scenario},
          {"pearson", num(pearson)},
          {"topk_recall", topk_recall},
          {"target_pearson", num(target_pearson)},
          {"target_topk_recall", num(target_topk_recall)},
          {"topk_block_share", topk_block_share},
          {"mean_visible_entries", mean_visible_entries}};
}

json ScenarioFacts::to_json() const {
  return {{"requests", requests},
          {"workload", workload},
          {"skipped_predictors", skipped_predictors},
          {"steps", steps},
          {"layers", layers},
          {"next_n", next_n},
          {"prompt_tokens", prompt_tokens},
          {"mean_visible_entries", mean_visible_entries},
          {"samples", samples},
          {"exact_by_construction", exact_by_construction},
          {"topk_block_share", topk_block_share}};
}

json ScenarioTiming::to_json() const {
  json j = {{"generate_and_score_s", generate_and_score_s}, {"replay_s", replay_s}};
  for (const auto& [key, seconds] : predictor_s) j["predictor_s"][key] = seconds;
  for (const auto& [key, fraction] : overhead_fraction) j["overhead_fraction"][key] = num(fraction);
  for (const auto& [key, fraction] : cost_fraction) j["cost_fraction"][key] = num(fraction);
  return j;
}

json EqualCostRow::to_json() const {
  return {{"scenario", scenario}, {"label", label}, {"work_fraction", work_fraction}, {"recall_mean", num(recall_mean)},
          {"miss_p99", num(miss_p99)}};
}

json LayerRange::to_json() const { return {{"mean", num(mean)}, {"min", num(min)}, {"max", num(max)}}; }

json LayerStats::to_json() const {
  json rows = json::array();
  for (size_t l = 0; l < layers.size(); ++l) {
    const TraceFacts& f = layers[l];
    rows.push_back({{"layer", l}, {"prev_step_topk_recall", num(f.prev_step_topk_recall)},
                    {"prev_step_block_pearson", num(f.prev_step_block_pearson)},
                    {"topk_block_share", num(f.topk_block_share)}});
  }
  return {{"layers", rows},
          {"summary",
           {{"prev_step_topk_recall", prev_step_topk_recall.to_json()},
            {"prev_step_block_pearson", prev_step_block_pearson.to_json()},
            {"topk_block_share", topk_block_share.to_json()}}}};
}

namespace {

template <typename Row>
json rows_json(const std::vector<Row>& rows) {
  json out = json::array();
  for (const Row& r : rows) out.push_back(r.to_json());
  return out;
}

}  // namespace

json RealModelResult::to_json() const {
  return {{"trace", trace},
          {"label", label},
          {"model", model},
          {"source", source},
          {"kind", kind},
          {"topk", topk},
          {"all_keep", all_keep.to_json()},
          {"synthetic_doc_qa_10k_same_shape", synthetic.to_json()},
          {"sweep", rows_json(sweep)},
          {"mtp", rows_json(mtp)}};
}

Result<std::optional<Advice>> eval_verdict(const Results& res) {
  if (res.verdict_requests.empty()) return std::optional<Advice>();
  std::vector<double> sparsities;
  std::vector<std::vector<RequestQuality>> per_sparsity;
  for (const auto& [s, requests] : res.verdict_requests) {
    sparsities.push_back(s);
    per_sparsity.push_back(requests);
  }
  auto step = model_step(Deployment{}, sparsities);
  if (!step.ok()) return step.status();
  auto advice = recommend(step.value(), quality_points({kConfigDefault}, sparsities, {per_sparsity}), kDefaultTolerance,
                          "the requests of this report");
  if (!advice.ok()) return advice.status();
  for (const QualityRow& r : res.sweep) {  // the scenarios (and traces) that gave "spin" requests
    auto& names = advice->sources_of_quality;
    if (r.label == kConfigDefault && std::find(names.begin(), names.end(), r.scenario) == names.end()) names.push_back(r.scenario);
  }
  return std::optional<Advice>(std::move(advice).value());
}

json results_json(const EvalOptions& o, const Results& res, double total_s, int threads) {
  json results = {{"seed", o.seed}, {"quick", o.quick}, {"config", o.base_config.to_string()}};
  // The same fields `spin advise --json` prints (indexer_share, recommended_sparsity, verdict, ...).
  if (res.verdict) results["verdict"] = json::parse(advice_json(*res.verdict));
  if (!res.scenarios.empty()) {
    for (const auto& [name, facts] : res.scenarios) results["scenarios"][name] = facts.to_json();
  }
  results["calibration"] = rows_json(res.calibration);
  results["predictors"] = rows_json(res.predictors);
  results["sweep"] = rows_json(res.sweep);
  results["equal_cost"] = rows_json(res.equal_cost);
  results["beyond"] = rows_json(res.beyond);
  results["mtp"] = rows_json(res.mtp);
  results["pooling"] = rows_json(res.pooling);
  if (!res.real_model.empty()) results["real_model"] = rows_json(res.real_model);
  json timing = json::object();
  for (const auto& [name, t] : res.timing) timing[name] = t.to_json();
  timing["total_s"] = total_s;
  // Beside the times: what they were measured on (it varies with the machine, as they do).
  timing["machine"] = {{"cpu", cpu_model_name()}, {"kernels", cpu_summary()}, {"spin_cpu", cpu_cap_name()},
                       {"threads", threads}};
  results["timing"] = timing;
  return results;
}

}  // namespace spin::eval_internal
