// `spin eval`'s runners: every job of a scenario over its requests (generated traces), of a
// recorded trace file, and of a real-model trace at each top-k; and run_eval, which runs them all
// and writes results.json and report.md.
#include <fmt/format.h>
#include <omp.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <functional>

#include <nlohmann/json.hpp>

#include "core/atomic_file.h"
#include "core/errors.h"
#include "eval/eval_internal.h"
#include "spin/cpu.h"
#include "spin/trace.h"

namespace spin {
namespace eval_internal {

double JobResult::overhead_fraction() const {
  const double full = indexer_entry_seconds * quality.visible_entries_sum();
  return full > 0 ? overhead_seconds / full : NAN;
}

namespace {

// ---- Compute: one scenario, every job, every request ----------------------------------------

using Progress = std::function<void(const std::string& stage, double fraction)>;

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
      part[j] = {r->quality, r->predictor_seconds, r->overhead_seconds, r->indexer_entry_seconds, {}};
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
    run->out[j].per_request.push_back({part[j].quality.recall().mean(), part[j].quality.miss().percentile(99),
                                       part[j].quality.sparsity().mean()});
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

// ---- Real-model traces --------------------------------------------------------------------

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

}  // namespace
}  // namespace eval_internal

using namespace eval_internal;

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
  res.equal_cost = equal_cost_rows(res.sweep);
  auto verdict = eval_verdict(res);
  if (!verdict.ok()) return verdict.status();
  res.verdict = std::move(verdict).value();
  const double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  const nlohmann::json results = results_json(o, res, total_s, threads);

  std::string md = render_report(o, requests, res);
  EvalSummary summary;
  md += fmt::format("\nTotal time {:.1f} s on {} threads; CPU: {}.\n", total_s, threads, cpu_summary());
  summary.report_md = md;
  summary.results_path = o.out_dir + "/results.json";
  SPIN_RETURN_IF_ERROR(write_file_atomic(o.out_dir + "/report.md", md));
  SPIN_RETURN_IF_ERROR(write_file_atomic(summary.results_path, results.dump(2) + "\n"));
  return summary;
}

}  // namespace spin
