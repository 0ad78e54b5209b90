// `spin eval`: the built-in evaluation (see spin/eval.h for what each section measures).
#include "spin/eval.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>

#include "core/atomic_file.h"
#include "core/errors.h"
#include "spin/calibrate.h"
#include "spin/cpu.h"
#include "spin/replay.h"
#include "spin/trace.h"
#include "spin/workload.h"

namespace spin {
namespace {

using json = nlohmann::json;

enum class Section { kPredictors, kSweep, kMtp, kPooling, kBeyond };

struct Job {
  Section section;
  std::string label;      // what the report calls it (e.g. "spin (no explore)")
  std::string predictor;  // make_predictor name
  PredictorConfig config;
  bool open_loop = false;
};

struct JobResult {
  QualityStats quality{2048};
  double predictor_seconds = 0;
  double overhead_seconds = 0;       // select/observe/commit of the counted steps, probe excluded
  double indexer_entry_seconds = 0;  // the unit that turns it into indexer work
  double overhead_fraction() const {
    const double full = indexer_entry_seconds * quality.visible_entries_sum();
    return full > 0 ? overhead_seconds / full : NAN;
  }
};

// NaN-safe JSON number (JSON has no NaN): null.
json num(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

std::string cell(double v, const char* format = "{:.3f}") {
  return std::isfinite(v) ? fmt::format(fmt::runtime(format), v) : "–";
}

const std::vector<double>& sweep_sparsities(bool quick) {
  static const std::vector<double> full = {0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6};
  static const std::vector<double> short_list = {0.0, 0.3, 0.5};
  return quick ? short_list : full;
}

// The calibration row reads prev-iter's open-loop Pearson: the paper's all-keep statistic that the
// generator is fitted to (src/eval/calibrate.cpp) is the previous step's block scores.
constexpr const char* kCalibrationPredictor = "prev-iter";
constexpr double kComparisonSparsity = 0.3;  // open-loop block recall is read at this budget
constexpr double kMtpSparsity = 0.5;         // MTP and pooling tables (where misses show)

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
      : eval_predictors(&PredictorInfo::EvalPlaces::open_loop);
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
    jobs.push_back({Section::kSweep, "spin", "spin", with(s), false});
    PredictorConfig no_explore = with(s);
    no_explore.explore_ratio = 0.0;
    jobs.push_back({Section::kSweep, "spin (no explore)", "spin", no_explore, false});
    for (const std::string& p : eval_predictors(&PredictorInfo::EvalPlaces::sweep)) {
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

json quality_json(const QualityStats& q) {
  return {{"samples", q.samples()},
          {"exact_by_construction", q.exact_by_construction()},
          {"recall_mean", num(q.recall().mean())},
          {"miss_p50", num(q.miss().percentile(50))},
          {"miss_p99", num(q.miss().percentile(99))},
          {"miss_max", num(q.miss().max())},
          {"block_recall_mean", num(q.block_recall().mean())},
          {"sparsity_mean", num(q.sparsity().mean())},
          {"block_sparsity_mean", num(q.block_sparsity().mean())},
          {"pearson_mean", num(q.pearson().mean())},
          {"topk_recall_mean", num(q.topk_recall().mean())},
          {"work_fraction", num(q.work_fraction())},
          {"probe_fraction", num(q.probe_fraction())}};
}

// ---- Compute: one scenario, every job, every request ----------------------------------------

using Progress = std::function<void(const std::string& stage, double fraction)>;

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

Status run_jobs(const EvalOptions& o, const Trace* trace, const ScoredTrace& scored, int requests, int threads,
                const Progress& stage, ScenarioRun* run);

// Generates request `request`'s trace, scores it and replays every job on it; merges the results
// into `run` (in job order, so the statistics do not depend on thread timing).
Status run_request(const EvalOptions& o, int request, int requests, int threads, const Progress& stage,
                   ScenarioRun* run) {
  WorkloadParams request_params = run->params;
  request_params.seed = o.seed + static_cast<uint64_t>(request);
  const auto g0 = std::chrono::steady_clock::now();
  stage("generating", 0.0);
  auto trace = generate_workload(request_params);
  if (!trace.ok()) return trace.status();
  ScoreOptions score_options;
  score_options.threads = threads;
  score_options.progress = [&](int64_t done, int64_t total) {
    stage("scoring (all-keep)", 0.05 + 0.2 * static_cast<double>(done) / static_cast<double>(total));
  };
  auto scored = score_trace(trace.value(), score_options);
  if (!scored.ok()) return scored.status();
  run->generate_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - g0).count();
  return run_jobs(o, &trace.value(), *scored.value(), requests, threads, stage, run);
}

// Replays every job of `run` on one scored trace (`trace`, for hisa's keys, may be null) and
// merges the results and the trace's facts into `run`.
Status run_jobs(const EvalOptions& o, const Trace* trace, const ScoredTrace& scored, int requests, int threads,
                const Progress& stage, ScenarioRun* run) {
  const std::vector<Job>& jobs = run->jobs;
  std::vector<JobResult> part(jobs.size());
  std::vector<Status> errors(jobs.size());
  int64_t finished = 0;
  // Jobs are independent replays; each result lands in its own slot, so the order in which
  // threads finish them never shows in the results.
#pragma omp parallel for schedule(dynamic, 1) num_threads(threads)
  for (size_t j = 0; j < jobs.size(); ++j) {
    ReplayOptions ro;
    ro.predictor = jobs[j].predictor;
    ro.config = jobs[j].config;
    ro.open_loop = jobs[j].open_loop;
    auto r = trace != nullptr ? replay(*trace, scored, ro) : replay(scored, ro);
    if (r.ok()) {
      part[j] = {r->quality, r->predictor_seconds, r->overhead_seconds, r->indexer_entry_seconds};
    } else {
      errors[j] = r.status();
    }
#pragma omp critical
    {
      ++finished;
      stage(fmt::format("replaying {}/{}", finished, jobs.size()),
            0.25 + 0.75 * static_cast<double>(finished) / static_cast<double>(jobs.size()));
    }
  }
  for (size_t j = 0; j < jobs.size(); ++j) {
    if (!errors[j].ok()) {
      return Status(errors[j].code(), fmt::format("{} / {}: {}", run->name, jobs[j].label, errors[j].message()));
    }
    run->out[j].quality.merge(part[j].quality);
    run->out[j].predictor_seconds += part[j].predictor_seconds;
    run->out[j].overhead_seconds += part[j].overhead_seconds;
    run->out[j].indexer_entry_seconds = part[j].indexer_entry_seconds;  // one per process and shape
  }
  // Blocks as replay() sees them: the trace's page size, the config's pages per block.
  const TraceFacts f = trace_facts(scored, run->params.page_size * o.base_config.block_pages);
  // Means over requests (each request has the same number of samples).
  TraceFacts& facts = run->facts;
  facts.samples += f.samples;
  facts.exact_by_construction += f.exact_by_construction;
  facts.topk_block_share += f.topk_block_share / requests;
  facts.prev_step_topk_recall += f.prev_step_topk_recall / requests;
  facts.mean_visible_entries += f.mean_visible_entries / requests;
  return ok_status();
}

// Every job of scenario `name` over `requests` independent traces (seed, seed+1, ...).
Result<ScenarioRun> run_scenario(const EvalOptions& o, const std::string& name, int requests, int threads,
                                 const Progress& report) {
  auto params = scenario_params(name);
  if (!params.ok()) return params.status();
  ScenarioRun run;
  run.name = name;
  run.params = params.value();
  run.params.seed = o.seed;
  if (o.quick) {
    run.params.steps = std::min(run.params.steps, 16);
    run.params.layers = std::min(run.params.layers, 2);
  }
  const auto t0 = std::chrono::steady_clock::now();
  auto jobs = jobs_for(run.params.next_n > 1, o);
  if (!jobs.ok()) return jobs.status();
  run.jobs = std::move(jobs).value();
  run.out.resize(run.jobs.size());
  for (JobResult& r : run.out) r.quality = QualityStats(run.params.topk);
  for (int request = 0; request < requests; ++request) {
    const double r0 = static_cast<double>(request) / requests, r1 = 1.0 / requests;
    auto stage = [&](const std::string& what, double f) {
      report(fmt::format("request {}/{}: {}", request + 1, requests, what), r0 + r1 * f);
    };
    SPIN_RETURN_IF_ERROR(run_request(o, request, requests, threads, stage, &run));
  }
  run.replay_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - run.generate_s;
  return run;
}

// A recorded trace file (key or score trace) as one more "scenario": the same jobs, one request.
// A score trace skips the jobs whose predictor needs keys (hisa), and says so in the report.
Result<ScenarioRun> run_trace_file(const EvalOptions& o, const std::string& path, int threads, const Progress& report) {
  const auto t0 = std::chrono::steady_clock::now();
  auto reader = TraceReader::open(path);
  if (!reader.ok()) return reader.status();
  const TraceMeta& m = reader->meta();
  ScenarioRun run;
  run.name = path;
  run.params.scenario = path;
  run.params.steps = static_cast<int32_t>(reader->steps());
  run.params.layers = m.num_layers;
  run.params.next_n = m.next_n;
  run.params.page_size = m.page_size;
  run.params.topk = m.topk;
  run.params.prompt_tokens = reader->ctx_len().front();
  const bool scores = reader->kind() == TraceKind::kScores;
  run.description = fmt::format("recorded trace: model {}, kind={}", m.model, trace_kind_name(m.kind));
  auto jobs = jobs_for(m.next_n > 1, o);
  if (!jobs.ok()) return jobs.status();
  for (Job& job : jobs.value()) {
    // A score trace feeds a probing predictor only through a recorded probe of its block size.
    const bool probe_fits = reader->has_probe() && reader->probe_block_entries() == m.page_size * job.config.block_pages &&
                            job.config.probe_entries == 0;
    if (scores && predictor_needs_keys(job.predictor) && !probe_fits) {
      if (std::find(run.skipped.begin(), run.skipped.end(), job.label) == run.skipped.end()) {
        run.skipped.push_back(job.label);
      }
      continue;
    }
    // An ablation whose geometry this trace cannot have (a pooled key of 16 entries in blocks of 4).
    PredictorConfig c = job.config;
    c.page_size = m.page_size;
    if (!c.validate().ok()) {
      run.skipped.push_back(job.label);
      continue;
    }
    run.jobs.push_back(std::move(job));
  }
  run.out.resize(run.jobs.size());
  for (JobResult& r : run.out) r.quality = QualityStats(m.topk);
  ScoreOptions score_options;
  score_options.threads = threads;
  score_options.progress = [&](int64_t done, int64_t total) {
    report("scoring (all-keep)", 0.25 * static_cast<double>(done) / static_cast<double>(total));
  };
  Trace trace;
  Result<std::shared_ptr<const ScoredTrace>> scored = Status(StatusCode::kInvalidArgument, "not scored");
  if (scores) {
    scored = score_trace(reader->to_score_trace(), score_options);
  } else {
    trace = reader->to_trace();
    scored = score_trace(trace, score_options);
  }
  if (!scored.ok()) return Status(scored.status().code(), path + ": " + scored.status().message());
  run.generate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  SPIN_RETURN_IF_ERROR(run_jobs(o, scores ? nullptr : &trace, *scored.value(), 1, threads, report, &run));
  run.replay_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - run.generate_s;
  return run;
}

// ---- Real-model traces: compute ------------------------------------------------------------

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

// spin (with and without exploration) and the registry's trace_sweep rows, closed loop; MTP traces
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
    jobs.push_back({Section::kSweep, "spin", "spin", with(sp), false});
    PredictorConfig no_explore = with(sp);
    no_explore.explore_ratio = 0.0;
    jobs.push_back({Section::kSweep, "spin (no explore)", "spin", no_explore, false});
    for (const std::string& p : eval_predictors(&PredictorInfo::EvalPlaces::trace_sweep)) {
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

// One real trace at one top-k, and the synthetic generator at the same shape.
struct RealRun {
  std::string path, label, model, source;
  std::string kind;  // "scores": a model's attention; "keys": an indexer's keys and queries
  int32_t topk = 0;
  ScenarioRun run;
  std::vector<TraceFacts> layers;            // per layer, all-keep
  std::vector<TraceFacts> synthetic_layers;  // doc-qa-10k generated at the trace's shape
};

std::string file_stem(const std::string& path) {
  std::string name = path.substr(path.find_last_of('/') + 1);
  return name.substr(0, name.find('.'));
}

std::vector<TraceFacts> facts_per_layer(const ScoredTrace& scored, int32_t layers, int32_t block_entries) {
  std::vector<TraceFacts> out;
  for (int32_t l = 0; l < layers; ++l) out.push_back(trace_facts(scored, block_entries, l));
  return out;
}

// The generator's doc-qa-10k scenario at the real trace's context, steps and top-k (8 layers).
Result<std::vector<TraceFacts>> synthetic_twin(const EvalOptions& o, const TraceReader& r, int32_t topk,
                                               int threads) {
  auto params = scenario_params("doc-qa-10k");
  if (!params.ok()) return params.status();
  WorkloadParams p = params.value();
  p.prompt_tokens = r.ctx_len().front() - r.meta().next_n;
  p.steps = static_cast<int32_t>(std::min<int64_t>(r.steps(), o.quick ? 16 : 64));
  p.layers = o.quick ? 2 : 8;
  p.page_size = r.meta().page_size;
  p.topk = topk;
  p.seed = o.seed;
  auto trace = generate_workload(p);
  if (!trace.ok()) return trace.status();
  ScoreOptions so;
  so.threads = threads;
  auto scored = score_trace(trace.value(), so);
  if (!scored.ok()) return scored.status();
  return facts_per_layer(*scored.value(), p.layers, p.page_size * o.base_config.block_pages);
}

Result<std::vector<RealRun>> run_real_trace(const EvalOptions& o, const std::string& path, int threads,
                                            const Progress& report) {
  auto reader = TraceReader::open(path);
  if (!reader.ok()) return reader.status();
  const TraceMeta& m = reader->meta();
  const bool scores = reader->kind() == TraceKind::kScores;
  const int64_t entries = reader->visible_entries(reader->steps() - 1, m.next_n - 1);
  const std::vector<int32_t> ks = real_topks(m.topk, entries);
  const auto source = m.extra.find("source");
  Trace trace;
  ScoreTrace score_trace_data;
  if (scores) {
    score_trace_data = reader->to_score_trace();
  } else {
    trace = reader->to_trace();
  }
  std::vector<RealRun> runs;
  for (size_t ki = 0; ki < ks.size(); ++ki) {
    const auto t0 = std::chrono::steady_clock::now();
    const double f0 = static_cast<double>(ki) / static_cast<double>(ks.size()), f1 = 1.0 / static_cast<double>(ks.size());
    auto stage = [&](const std::string& what, double f) { report(fmt::format("top-k {}: {}", ks[ki], what), f0 + f1 * f); };
    RealRun rr;
    rr.path = path;
    rr.topk = ks[ki];
    rr.label = fmt::format("{}@k{}", file_stem(path), ks[ki]);
    rr.model = m.model;
    rr.source = source != m.extra.end() ? source->second : "recorded trace";
    rr.kind = scores ? "scores" : "keys";
    ScenarioRun& run = rr.run;
    run.name = rr.label;
    run.description = fmt::format("real-model trace {}: model {}, kind={}, top-k {}", path, m.model,
                                  trace_kind_name(m.kind), ks[ki]);
    run.params.scenario = rr.label;
    run.params.steps = static_cast<int32_t>(reader->steps());
    run.params.layers = m.num_layers;
    run.params.next_n = m.next_n;
    run.params.page_size = m.page_size;
    run.params.topk = ks[ki];
    run.params.prompt_tokens = reader->ctx_len().front();
    const bool probe = reader->has_probe() && reader->probe_block_entries() == m.page_size * o.base_config.block_pages;
    run.jobs = real_jobs(m.next_n > 1, probe, o);
    run.out.resize(run.jobs.size());
    for (JobResult& r : run.out) r.quality = QualityStats(ks[ki]);
    ScoreOptions so;
    so.threads = threads;
    so.topk = ks[ki];
    so.progress = [&](int64_t done, int64_t total) {
      stage("scoring (all-keep)", 0.2 * static_cast<double>(done) / static_cast<double>(total));
    };
    auto scored = scores ? score_trace(score_trace_data, so) : score_trace(trace, so);
    if (!scored.ok()) return Status(scored.status().code(), path + ": " + scored.status().message());
    const int32_t block_entries = m.page_size * o.base_config.block_pages;
    rr.layers = facts_per_layer(*scored.value(), m.num_layers, block_entries);
    run.generate_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SPIN_RETURN_IF_ERROR(run_jobs(o, scores ? nullptr : &trace, *scored.value(), 1, threads, stage, &run));
    auto twin = synthetic_twin(o, reader.value(), ks[ki], threads);
    if (!twin.ok()) return twin.status();
    rr.synthetic_layers = std::move(twin).value();
    run.replay_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() - run.generate_s;
    runs.push_back(std::move(rr));
  }
  return runs;
}

// ---- Results: results.json's sections -----------------------------------------------------

struct Results {
  json calibration = json::array(), predictors = json::array(), sweep = json::array(), mtp = json::array(),
       pooling = json::array(), beyond = json::array(), timing = json::object(), scenarios = json::object(),
       real_model = json::array();
  json equal_cost = json::array();  // equal_cost_json(sweep), once every scenario is in
};

void add_results(const ScenarioRun& run, int requests, const std::map<std::string, CalibrationTarget>& targets,
                 Results* res) {
  const std::string& name = run.name;
  const WorkloadParams& params = run.params;
  const TraceFacts& facts = run.facts;
  res->scenarios[name] = {{"requests", requests},
                          {"workload", run.description.empty() ? params.to_string() : run.description},
                          {"skipped_predictors", run.skipped},
                          {"steps", params.steps},
                          {"layers", params.layers},
                          {"next_n", params.next_n},
                          {"prompt_tokens", params.prompt_tokens},
                          {"mean_visible_entries", facts.mean_visible_entries},
                          {"samples", facts.samples},
                          {"exact_by_construction", facts.exact_by_construction},
                          {"topk_block_share", facts.topk_block_share}};
  json& timing = res->timing[name];
  timing = {{"generate_and_score_s", run.generate_s}, {"replay_s", run.replay_s}};
  // Oracle recall per sparsity, for the gap column.
  std::map<double, double> oracle;
  for (size_t j = 0; j < run.jobs.size(); ++j) {
    if (run.jobs[j].section == Section::kSweep && find_predictor(run.jobs[j].predictor)->reads == PredictorReads::kTrueTopk) {
      oracle[run.jobs[j].config.target_sparsity] = run.out[j].quality.recall().mean();
    }
  }
  for (size_t j = 0; j < run.jobs.size(); ++j) {
    const Job& job = run.jobs[j];
    const QualityStats& q = run.out[j].quality;
    json row = quality_json(q);
    row.update({{"scenario", name}, {"label", job.label}, {"predictor", job.predictor},
                {"target_sparsity", job.config.target_sparsity}, {"config", job.config.to_string()}});
    const std::string key = section_name(job.section) + ":" + job.label + "@" + fmt::format("{:.2f}", job.config.target_sparsity);
    timing["predictor_s"][key] = run.out[j].predictor_seconds;
    // Measured, so under timing: what select/observe cost in indexer work, and the total.
    const double overhead = run.out[j].overhead_fraction();
    timing["overhead_fraction"][key] = num(overhead);
    timing["cost_fraction"][key] = num(q.work_fraction() + overhead);
    switch (job.section) {
      case Section::kPredictors:
        res->predictors.push_back(row);
        if (job.predictor == kCalibrationPredictor) {
          const auto it = targets.find(name);
          res->calibration.push_back(
              {{"scenario", name},
               {"pearson", num(q.pearson().mean())},
               {"topk_recall", facts.prev_step_topk_recall},
               {"target_pearson", it != targets.end() ? num(it->second.pearson) : json(nullptr)},
               {"target_topk_recall", it != targets.end() ? num(it->second.topk_recall) : json(nullptr)},
               {"topk_block_share", facts.topk_block_share},
               {"mean_visible_entries", facts.mean_visible_entries}});
        }
        break;
      case Section::kSweep:
        row["oracle_recall_mean"] = num(oracle[job.config.target_sparsity]);
        row["gap_to_oracle"] = num(oracle[job.config.target_sparsity] - q.recall().mean());
        res->sweep.push_back(row);
        break;
      case Section::kMtp: res->mtp.push_back(row); break;
      case Section::kPooling: res->pooling.push_back(row); break;
      case Section::kBeyond: res->beyond.push_back(row); break;
    }
  }
}

// Per-layer statistics and their mean / min / max over the layers.
json layer_facts_json(const std::vector<TraceFacts>& layers) {
  json rows = json::array();
  struct Range {
    double sum = 0, lo = INFINITY, hi = -INFINITY;
    int n = 0;
    void add(double v) {
      if (!std::isfinite(v)) return;
      sum += v, lo = std::min(lo, v), hi = std::max(hi, v), ++n;
    }
    json to_json() const { return {{"mean", n ? num(sum / n) : json(nullptr)}, {"min", num(lo)}, {"max", num(hi)}}; }
  } recall, pearson, share;
  for (size_t l = 0; l < layers.size(); ++l) {
    const TraceFacts& f = layers[l];
    rows.push_back({{"layer", l}, {"prev_step_topk_recall", num(f.prev_step_topk_recall)},
                    {"prev_step_block_pearson", num(f.prev_step_block_pearson)},
                    {"topk_block_share", num(f.topk_block_share)}});
    recall.add(f.prev_step_topk_recall);
    pearson.add(f.prev_step_block_pearson);
    share.add(f.topk_block_share);
  }
  return {{"layers", rows},
          {"summary",
           {{"prev_step_topk_recall", recall.to_json()}, {"prev_step_block_pearson", pearson.to_json()},
            {"topk_block_share", share.to_json()}}}};
}

void add_real_results(const RealRun& rr, Results* res) {
  Results part;
  add_results(rr.run, 1, {}, &part);
  res->timing[rr.label] = part.timing[rr.label];
  res->real_model.push_back({{"trace", rr.path},
                             {"label", rr.label},
                             {"model", rr.model},
                             {"source", rr.source},
                             {"kind", rr.kind},
                             {"topk", rr.topk},
                             {"all_keep", layer_facts_json(rr.layers)},
                             {"synthetic_doc_qa_10k_same_shape", layer_facts_json(rr.synthetic_layers)},
                             {"sweep", part.sweep},
                             {"mtp", part.mtp}});
}

// ---- Renderers: report.md's sections --------------------------------------------------------

double number_or_nan(const json& x) { return x.is_number() ? x.get<double>() : NAN; }
std::string number_cell(const json& x) { return x.is_number() ? cell(x.get<double>()) : std::string("–"); }

std::string render_calibration(const json& calibration) {
  std::string md = "## Calibration (all-keep, prev-iter open loop)\n\n| scenario | visible entries | Pearson | target | top-k "
                   "recall | target | blocks with ≥1 top-k entry |\n|---|---:|---:|---:|---:|---:|---:|\n";
  for (const json& c : calibration) {
    md += fmt::format("| {} | {:.0f} | {} | {} | {} | {} | {:.1f}% |\n", c["scenario"].get<std::string>(),
                      c["mean_visible_entries"].get<double>(), number_cell(c["pearson"]),
                      number_cell(c["target_pearson"]), number_cell(c["topk_recall"]),
                      number_cell(c["target_topk_recall"]), 100 * c["topk_block_share"].get<double>());
  }
  return md;
}

std::string render_predictors(const json& predictors) {
  std::string md =
      fmt::format("\n## Predictor comparison (open loop, block recall at {:.0f}% sparsity)\n\n", 100 * kComparisonSparsity);
  md += "| scenario | predictor | Pearson | block recall | top-k recall (token) |\n|---|---|---:|---:|---:|\n";
  for (const json& r : predictors) {
    md += fmt::format("| {} | {} | {} | {} | {} |\n", r["scenario"].get<std::string>(), r["label"].get<std::string>(),
                      number_cell(r["pearson_mean"]), number_cell(r["block_recall_mean"]),
                      number_cell(r["topk_recall_mean"]));
  }
  return md;
}

std::string render_sweep_tables(const json& sweep, const std::vector<double>& sparsities);

std::string render_sweep(const json& sweep, bool quick) {
  return "\n## Sparsity sweep (closed loop): mean recall / p99 miss, realised sparsity in brackets\n\n" +
         render_sweep_tables(sweep, sweep_sparsities(quick));
}

// One table per scenario: a row per predictor, a column per target sparsity.
std::string render_sweep_tables(const json& sweep, const std::vector<double>& sparsities) {
  std::string md;
  std::map<std::string, std::map<std::string, std::map<double, const json*>>> grid;
  std::vector<std::string> order;
  for (const json& r : sweep) {
    const std::string label = r["label"];
    if (std::find(order.begin(), order.end(), label) == order.end()) order.push_back(label);
    grid[r["scenario"]][label][r["target_sparsity"].get<double>()] = &r;
  }
  for (const auto& [scenario, by_label] : grid) {
    md += "### " + scenario + "\n\n| predictor |";
    std::string rule = "|---|";
    for (double s : sparsities) {
      md += fmt::format(" {:.0f}% |", 100 * s);
      rule += "---:|";
    }
    md += "\n" + rule + "\n";
    for (const std::string& label : order) {
      if (!by_label.count(label)) continue;
      md += "| " + label + " |";
      for (double s : sparsities) {
        const json* r = by_label.at(label).count(s) ? by_label.at(label).at(s) : nullptr;
        if (r == nullptr) {
          md += " – |";
          continue;
        }
        md += fmt::format(" {} / {} ({:.0f}%) |", cell(number_or_nan((*r)["recall_mean"])),
                          cell(number_or_nan((*r)["miss_p99"])), 100 * number_or_nan((*r)["sparsity_mean"]));
      }
      md += "\n";
    }
    md += "\n";
  }
  return md;
}

const std::vector<double>& equal_cost_levels() {
  static const std::vector<double> levels = {0.5, 0.6, 0.7, 0.8};
  return levels;
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
std::map<std::string, std::map<std::string, std::vector<std::array<double, 3>>>> cost_points(const json& sweep) {
  std::map<std::string, std::map<std::string, std::vector<std::array<double, 3>>>> points;
  for (const json& r : sweep) {
    const double w = number_or_nan(r["work_fraction"]);
    if (std::isfinite(w)) points[r["scenario"]][r["label"]].push_back({w, number_or_nan(r["recall_mean"]), number_or_nan(r["miss_p99"])});
  }
  return points;
}

json equal_cost_json(const json& sweep) {
  json out = json::array();
  for (const auto& [scenario, by_label] : cost_points(sweep)) {
    for (const auto& [label, points] : by_label) {
      for (double c : equal_cost_levels()) {
        const auto [recall, p99] = at_cost(points, c);
        out.push_back({{"scenario", scenario}, {"label", label}, {"work_fraction", c}, {"recall_mean", num(recall)},
                       {"miss_p99", num(p99)}});
      }
    }
  }
  return out;
}

std::string render_equal_cost(const json& equal_cost, const json& sweep_order) {
  std::string md =
      "\n## At equal cost (closed loop): mean recall / p99 miss at the same indexer work\n\n"
      "Work = (fine entries scored + probe work) / the full indexer's entries; the probe (hisa, spin-hybrid) "
      "scores one pooled key per block with the query, heads·128 multiply-adds: one entry's worth. Read off "
      "each predictor's sweep, linear between its two nearest points (– where the sweep does not reach "
      "that cost: indexcache never costs less than its full layers). Select/observe time, measured, is in "
      "results.json timing.overhead_fraction (spin ≈ 1–2 % of the indexer on this CPU: pooling each scored "
      "entry's score) and not added here, so that the table is deterministic.\n\n";
  std::vector<std::string> order;
  for (const json& r : sweep_order)
    if (std::find(order.begin(), order.end(), r["label"].get<std::string>()) == order.end()) order.push_back(r["label"]);
  std::map<std::string, std::map<std::string, std::map<double, const json*>>> grid;
  for (const json& r : equal_cost) grid[r["scenario"]][r["label"]][r["work_fraction"].get<double>()] = &r;
  for (const auto& [scenario, by_label] : grid) {
    md += "### " + scenario + "\n\n| predictor |";
    std::string rule = "|---|";
    for (double c : equal_cost_levels()) {
      md += fmt::format(" work {:.0f}% |", 100 * c);
      rule += "---:|";
    }
    md += "\n" + rule + "\n";
    for (const std::string& label : order) {
      if (!by_label.count(label) || label == "random") continue;
      md += "| " + label + " |";
      for (double c : equal_cost_levels()) {
        const json& r = *by_label.at(label).at(c);
        md += fmt::format(" {} / {} |", cell(number_or_nan(r["recall_mean"])), cell(number_or_nan(r["miss_p99"])));
      }
      md += "\n";
    }
    md += "\n";
  }
  return md;
}

std::string render_beyond(const json& beyond) {
  if (beyond.empty()) return "";
  std::string md = fmt::format(
      "\n## Ablation: spin-hybrid's probe and the budget moves ({:.0f}% target sparsity, closed loop)\n\n"
      "| scenario | variant | mean recall | p99 miss | work fraction | probe part |\n|---|---|---:|---:|---:|---:|\n",
      100 * kMtpSparsity);
  for (const json& r : beyond) {
    md += fmt::format("| {} | {} | {} | {} | {} | {} |\n", r["scenario"].get<std::string>(), r["label"].get<std::string>(),
                      cell(number_or_nan(r["recall_mean"])), cell(number_or_nan(r["miss_p99"])),
                      cell(number_or_nan(r["work_fraction"])), cell(number_or_nan(r["probe_fraction"]), "{:.4f}"));
  }
  return md;
}

std::string render_mtp(const json& mtp) {
  std::string md = fmt::format(
      "## MTP replay (spin; closed loop): mean recall / p99 miss\n\n| scenario | update | 30% | {:.0f}% |\n|---|---|---:|---:|\n",
      100 * kMtpSparsity);
  for (size_t i = 0; i + 1 < mtp.size(); i += 2) {
    md += fmt::format("| {} | {} | {} / {} | {} / {} |\n", mtp[i]["scenario"].get<std::string>(),
                      mtp[i]["label"].get<std::string>(), cell(number_or_nan(mtp[i]["recall_mean"])),
                      cell(number_or_nan(mtp[i]["miss_p99"])), cell(number_or_nan(mtp[i + 1]["recall_mean"])),
                      cell(number_or_nan(mtp[i + 1]["miss_p99"])));
  }
  return md;
}

std::string render_pooling(const json& pooling) {
  std::string md = fmt::format(
      "\n## Ablation: pooling and combine (spin, {:.0f}% sparsity, closed loop)\n\n| scenario | variant | mean recall | "
      "p99 miss | block recall |\n|---|---|---:|---:|---:|\n",
      100 * kMtpSparsity);
  for (const json& r : pooling) {
    md += fmt::format("| {} | {} | {} | {} | {} |\n", r["scenario"].get<std::string>(), r["label"].get<std::string>(),
                      cell(number_or_nan(r["recall_mean"])), cell(number_or_nan(r["miss_p99"])),
                      cell(number_or_nan(r["block_recall_mean"])));
  }
  return md;
}

std::string range_cell(const json& r) {
  return fmt::format("{} ({}–{})", number_cell(r["mean"]), number_cell(r["min"]), number_cell(r["max"]));
}

// The real-model section: what the traces are, per-layer statistics, real vs synthetic, sweeps.
std::string render_real(const json& real, bool quick) {
  if (real.empty()) return "";
  std::string md = "\n## Real model\n\n";
  md += "Real traces of a small pretrained language model over a real text (`./scripts/record-real-traces.sh`, "
        "recorder/README.md). A **score trace** holds the model's **attention scores**, not a DSA indexer's: the "
        "closest real signal (DSA trains its indexer to match the head-summed attention). A **key trace** holds the "
        "keys and queries of a **lightning indexer distilled** for the model that way, which spin's indexer scores. "
        "Each is read at its own top-k and at a second one (scaled to the context as 2048 of 64K, or DSA's "
        "2048).\n\n";
  for (const json& r : real) {
    const json& a = r["all_keep"]["summary"];
    const json& syn = r["synthetic_doc_qa_10k_same_shape"]["summary"];
    md += fmt::format("### {} — {} ({}, {} trace), top-k {}\n\n", r["label"].get<std::string>(),
                      r["model"].get<std::string>(), r["source"].get<std::string>(),
                      r.value("kind", std::string("scores")) == "keys" ? "key" : "score", r["topk"].get<int>());
    md += "All-keep statistics, mean (min–max over layers), beside the generator's doc-qa-10k at the same context, "
          "steps and top-k:\n\n| statistic | real | synthetic |\n|---|---:|---:|\n";
    for (const auto& [key, name] : std::vector<std::pair<std::string, std::string>>{
             {"prev_step_topk_recall", "prev-iter top-k recall"},
             {"prev_step_block_pearson", "Pearson of consecutive block scores (max-pooled)"},
             {"topk_block_share", "blocks holding ≥ 1 top-k entry"}}) {
      md += fmt::format("| {} | {} | {} |\n", name, range_cell(a[key]), range_cell(syn[key]));
    }
    md += "\n<details><summary>per layer</summary>\n\n| layer | prev-iter top-k recall | block Pearson | blocks with ≥ 1 "
          "top-k |\n|---:|---:|---:|---:|\n";
    for (const json& l : r["all_keep"]["layers"]) {
      md += fmt::format("| {} | {} | {} | {} |\n", l["layer"].get<int>(), number_cell(l["prev_step_topk_recall"]),
                        number_cell(l["prev_step_block_pearson"]), number_cell(l["topk_block_share"]));
    }
    md += "\n</details>\n\nClosed loop, mean recall / p99 miss (realised sparsity):\n\n";
    md += render_sweep_tables(r["sweep"], real_sparsities(quick));
    if (!r["mtp"].empty()) md += render_mtp(r["mtp"]) + "\n";
  }
  return md;
}

std::string render_report(const EvalOptions& o, int requests, const Results& res) {
  std::string md = "# spin eval report\n\n";
  md += fmt::format("Seed {}, {} request(s) per scenario{}. Predictor config (sweeps vary target_sparsity): `{}`\n\n", o.seed, requests,
                    o.quick ? ", quick mode" : "", o.base_config.to_string());
  md += "Every number is measured against all-keep (the full indexer) on the same trace; recall is token-level "
        "top-k recall, miss = 1 − recall, percentiles are nearest-rank. Rows whose context holds ≤ topk entries are "
        "exact by construction and excluded (counted in results.json). Prefills are observations, not samples: step 0 of "
        "each trace and every step whose ctx_len grows by more than its rows (a tool output, a new turn) are observed "
        "in full by every predictor (prefill computed those scores anyway), the same for every MTP update mode.\n\n";
  for (const auto& [name, sc] : res.scenarios.items()) {
    if (sc["workload"].get<std::string>().rfind("recorded trace", 0) != 0) continue;
    md += fmt::format("Trace `{}`: {}.", name, sc["workload"].get<std::string>());
    if (!sc["skipped_predictors"].empty()) {
      std::string list;
      for (const auto& p : sc["skipped_predictors"]) list += (list.empty() ? "" : ", ") + p.get<std::string>();
      md += fmt::format(" Not run on it: {} (they need the indexer's keys and queries, or a block probe at their "
                        "block size, which this score trace lacks; or a geometry this trace does not have).", list);
    }
    md += "\n\n";
  }
  md += render_calibration(res.calibration);
  md += render_predictors(res.predictors);
  md += render_sweep(res.sweep, o.quick);
  md += render_equal_cost(res.equal_cost, res.sweep);
  md += render_mtp(res.mtp);
  md += render_pooling(res.pooling);
  md += render_beyond(res.beyond);
  md += render_real(res.real_model, o.quick);
  return md;
}

}  // namespace

// The built-in scenarios but the long-context tasks (niah-mk-128k, mrcr-256k, mrcr-1m and their
// -mtp): 128K–1M entries times every predictor and budget is an hour here, so they are asked for
// by name (spin eval --scenario niah-mk-128k ...), not run by default.
std::vector<std::string> default_scenarios() {
  std::vector<std::string> names;
  for (const std::string& n : scenario_names())
    if (!n.starts_with("niah-") && !n.starts_with("mrcr-")) names.push_back(n);
  return names;
}

// compute (run_scenario) → results (add_results) → renderer (render_report); the tool draws the plots.
Result<EvalSummary> run_eval(const EvalOptions& o) {
  SPIN_RETURN_IF_ERROR(o.base_config.validate());
  std::vector<std::string> scenarios = o.scenarios;
  if (scenarios.empty() && o.traces.empty()) {  // real traces sit beside the scenarios
    scenarios = o.quick ? std::vector<std::string>{"doc-qa-10k", "doc-qa-94k", "needle-shift", "agentic",
                                                   "doc-qa-10k-mtp"}
                        : default_scenarios();
  }
  if (mkdir(o.out_dir.c_str(), 0755) != 0 && errno != EEXIST) {
    return io_error("cannot create output directory {}", o.out_dir);
  }
  const int threads = o.threads > 0 ? o.threads : omp_get_max_threads();
  const int requests = o.requests > 0 ? o.requests : (o.quick ? 1 : 3);
  const auto started = std::chrono::steady_clock::now();
  std::map<std::string, CalibrationTarget> targets;
  for (const CalibrationTarget& t : paper_targets()) targets[t.scenario] = t;

  Results res;
  for (size_t si = 0; si < scenarios.size(); ++si) {
    const std::string& name = scenarios[si];
    const double base_fraction = static_cast<double>(si) / static_cast<double>(scenarios.size());
    const double share = 1.0 / static_cast<double>(scenarios.size());
    auto report = [&](const std::string& stage, double f) {
      if (o.progress) o.progress(fmt::format("[{}/{}] {}: {}", si + 1, scenarios.size(), name, stage), base_fraction + share * f);
    };
    auto run = run_scenario(o, name, requests, threads, report);
    if (!run.ok()) return run.status();
    add_results(run.value(), requests, targets, &res);
  }
  for (size_t ti = 0; ti < o.traces.size(); ++ti) {
    const std::string& path = o.traces[ti];
    auto report = [&](const std::string& stage, double f) {
      if (o.progress) o.progress(fmt::format("[trace {}/{}] {}: {}", ti + 1, o.traces.size(), path, stage), f);
    };
    auto run = run_trace_file(o, path, threads, report);
    if (!run.ok()) return run.status();
    add_results(run.value(), 1, targets, &res);
  }
  for (size_t ri = 0; ri < o.real_traces.size(); ++ri) {
    const std::string& path = o.real_traces[ri];
    auto report = [&](const std::string& stage, double f) {
      if (o.progress) o.progress(fmt::format("[real {}/{}] {}: {}", ri + 1, o.real_traces.size(), path, stage), f);
    };
    auto runs = run_real_trace(o, path, threads, report);
    if (!runs.ok()) return runs.status();
    for (const RealRun& rr : runs.value()) add_real_results(rr, &res);
  }
  res.equal_cost = equal_cost_json(res.sweep);
  json results = {{"seed", o.seed}, {"quick", o.quick}, {"config", o.base_config.to_string()}};
  if (!res.scenarios.empty()) results["scenarios"] = res.scenarios;
  results["calibration"] = res.calibration;
  results["predictors"] = res.predictors;
  results["sweep"] = res.sweep;
  results["equal_cost"] = res.equal_cost;
  results["beyond"] = res.beyond;
  results["mtp"] = res.mtp;
  results["pooling"] = res.pooling;
  if (!res.real_model.empty()) results["real_model"] = res.real_model;
  res.timing["total_s"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  // Beside the times: what they were measured on (it varies with the machine, as they do).
  res.timing["machine"] = {{"cpu", cpu_model_name()}, {"kernels", cpu_summary()}, {"spin_cpu", cpu_cap_name()},
                           {"threads", threads}};
  results["timing"] = res.timing;

  std::string md = render_report(o, requests, res);
  EvalSummary summary;
  md += fmt::format("\nTotal time {:.1f} s on {} threads; CPU: {}.\n", res.timing["total_s"].get<double>(), threads,
                    cpu_summary());
  summary.report_md = md;
  summary.results_path = o.out_dir + "/results.json";
  SPIN_RETURN_IF_ERROR(write_file_atomic(o.out_dir + "/report.md", md));
  SPIN_RETURN_IF_ERROR(write_file_atomic(summary.results_path, results.dump(2) + "\n"));
  return summary;
}

}  // namespace spin
