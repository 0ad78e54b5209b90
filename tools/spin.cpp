// The `spin` command: a thin front end over the library and the benchmarks. It parses flags,
// calls one function per subcommand, draws progress, prints errors and sets the exit code.
#include <CLI/CLI.hpp>
#include <fmt/format.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>

#include "bench_common.h"
#include "spin/calibrate.h"
#include "spin/eval.h"
#include "spin/files.h"
#include "spin/replay.h"
#include "spin/trace.h"
#include "spin/workload.h"

namespace {

int fail(const spin::Status& status) {
  fmt::print(stderr, "spin: error: {}\n", status.to_string());
  return 1;
}

// A one-line progress bar on a terminal; on a pipe or file, one line per new stage label.
class Progress {
 public:
  void update(const std::string& stage, double fraction) {
    const bool tty = isatty(fileno(stderr));
    const auto now = std::chrono::steady_clock::now();
    if (tty) {
      if (now - last_ < std::chrono::milliseconds(100) && fraction < 1.0) return;
      last_ = now;
      const int width = 30;
      const int filled = static_cast<int>(fraction * width + 0.5);
      fmt::print(stderr, "\r\033[K[{}{}] {:3.0f}%  {}", std::string(static_cast<size_t>(filled), '#'),
                 std::string(static_cast<size_t>(width - filled), '.'), 100 * fraction, stage);
      dirty_ = true;
    } else {
      const std::string key = stage.substr(0, stage.find(':'));
      const std::string kind = stage.substr(stage.find(':') + 1, 10);
      if (key + kind != last_stage_) {
        fmt::print(stderr, "{:3.0f}%  {}\n", 100 * fraction, stage);
        last_stage_ = key + kind;
      }
    }
  }
  void done() {
    if (dirty_) fmt::print(stderr, "\r\033[K");
    dirty_ = false;
  }

 private:
  std::chrono::steady_clock::time_point last_{};
  std::string last_stage_;
  bool dirty_ = false;
};

spin::Status apply_sets(spin::PredictorConfig& config, const std::vector<std::string>& sets) {
  for (const std::string& s : sets) SPIN_RETURN_IF_ERROR(config.parse(s));
  return config.validate();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"spin — shadow predictive indexer for DeepSeek sparse attention (CPU reference)"};
  app.require_subcommand(1);

  // ---- eval --------------------------------------------------------------------------------------
  spin::EvalOptions eval;
  std::vector<std::string> eval_sets;
  CLI::App* eval_cmd = app.add_subcommand("eval", "the main job: predictors vs all-keep on the built-in scenarios");
  eval_cmd->add_option("--scenario", eval.scenarios, "scenarios to run (default: all built-in)");
  eval_cmd->add_flag("--quick", eval.quick, "shorter runs and fewer points (≤ 2 minutes)");
  eval_cmd->add_option("--out", eval.out_dir, "output directory (report.md, results.json, plots)");
  eval_cmd->add_option("--seed", eval.seed, "workload seed");
  eval_cmd->add_option("--threads", eval.threads, "threads (0 = all)");
  eval_cmd->add_option("--set", eval_sets, "predictor config overrides, key=value (see `spin config`)");

  // ---- replay ------------------------------------------------------------------------------------
  std::string replay_file, replay_json, replay_dump;
  spin::ReplayOptions replay;
  double replay_sparsity = -1, replay_explore = -1;
  std::string replay_pooling, replay_mtp;
  std::vector<std::string> replay_sets;
  CLI::App* replay_cmd = app.add_subcommand("replay", "replay a trace through a predictor, measured against all-keep");
  replay_cmd->add_option("file", replay_file, "trace file (spin trace gen, or recorded)")->required();
  replay_cmd->add_option("--predictor", replay.predictor, "predictor name (see spin config)");
  replay_cmd->add_option("--sparsity", replay_sparsity, "target block sparsity in [0, 1)");
  replay_cmd->add_option("--explore", replay_explore, "exploration share of the budget");
  replay_cmd->add_option("--pooling", replay_pooling, "max | mean | topk-hits | lse");
  replay_cmd->add_option("--mtp-update", replay_mtp, "prefix | row0 | all-rows");
  replay_cmd->add_flag("--open-loop", replay.open_loop, "the predictor sees every step's full scores");
  bool replay_cold = false;
  replay_cmd->add_flag("--cold-start", replay_cold, "do not give step 0's full scores (prefill) to the predictor");
  replay_cmd->add_option("--set", replay_sets, "other config fields, key=value");
  replay_cmd->add_option("--json", replay_json, "write the metrics as one JSON object");
  replay_cmd->add_option("--dump-topk", replay_dump, "write layer.{l}.topk i32 [steps, next_n, topk] (safetensors)");

  // ---- trace -------------------------------------------------------------------------------------
  CLI::App* trace_cmd = app.add_subcommand("trace", "write or describe trace files");
  trace_cmd->require_subcommand(1);
  std::string gen_scenario = "doc-qa-10k", gen_out;
  int64_t gen_context = 0;
  int gen_steps = 0, gen_layers = 0, gen_next_n = 0;
  uint64_t gen_seed = 1;
  CLI::App* gen_cmd = trace_cmd->add_subcommand("gen", "generate a synthetic trace");
  gen_cmd->add_option("--scenario", gen_scenario, "built-in scenario");
  gen_cmd->add_option("--out", gen_out, "output file")->required();
  gen_cmd->add_option("--context", gen_context, "prompt tokens (overrides the scenario)");
  gen_cmd->add_option("--steps", gen_steps, "decode steps");
  gen_cmd->add_option("--layers", gen_layers, "indexer layers");
  gen_cmd->add_option("--next-n", gen_next_n, "rows per step (MTP)");
  gen_cmd->add_option("--seed", gen_seed, "seed");
  std::string info_file;
  CLI::App* info_cmd = trace_cmd->add_subcommand("info", "describe a trace file");
  info_cmd->add_option("file", info_file)->required();

  // ---- calibrate ---------------------------------------------------------------------------------
  bool calibrate_write = false;
  spin::CalibrationOptions calibrate_options;
  CLI::App* calibrate_cmd = app.add_subcommand("calibrate", "fit the workload generator to the paper's statistics");
  calibrate_cmd->add_flag("--write", calibrate_write, "write data/calibration.json (rebuild to use it)");
  calibrate_cmd->add_option("--iterations", calibrate_options.iterations, "Gauss–Newton iterations");

  // ---- config ------------------------------------------------------------------------------------
  CLI::App* config_cmd = app.add_subcommand("config", "print the predictor config defaults and predictor names");

  // ---- bench -------------------------------------------------------------------------------------
  CLI::App* bench = app.add_subcommand("bench", "kernel and predictor benchmarks");
  bench->require_subcommand(1);
  spin::bench::IndexerBenchOptions indexer;
  int64_t indexer_context = 0;
  CLI::App* bench_indexer = bench->add_subcommand("indexer", "lightning-indexer kernel, full and block-masked");
  bench_indexer->add_option("--context", indexer_context, "run one context size (entries) instead of 8K–512K");
  bench_indexer->add_option("--rows", indexer.rows, "query rows per request (MTP next_n)")->expected(1, 4);
  bench_indexer->add_option("--sparsity", indexer.sparsities, "block sparsities to run (0 = full)");
  bench_indexer->add_option("--impl", indexer.impl, "auto | avx512bf16 | portable | reference");
  bench_indexer->add_option("--threads", indexer.threads, "threads (0 = all)");
  bench_indexer->add_option("--min-time", indexer.min_seconds, "seconds of timed runs per point");
  bench_indexer->add_option("--json", indexer.json_path, "write one JSON record per point to FILE");
  spin::bench::TopkBenchOptions topk;
  int64_t topk_context = 0;
  CLI::App* bench_topk = bench->add_subcommand("topk", "top-k selection vs std::nth_element");
  bench_topk->add_option("--context", topk_context, "run one context size instead of 8K–512K");
  bench_topk->add_option("--topk", topk.topk, "k");
  bench_topk->add_option("--threads", topk.threads, "threads");
  bench_topk->add_option("--min-time", topk.min_seconds, "seconds of timed runs per point");
  bench_topk->add_option("--json", topk.json_path, "write one JSON record per point to FILE");

  spin::bench::PredictorBenchOptions predictor_bench;
  int64_t predictor_context = 0;
  CLI::App* bench_predictor = bench->add_subcommand("predictor", "select + observe cost vs the full indexer");
  bench_predictor->add_option("--context", predictor_context, "run one context size instead of 8K–512K");
  bench_predictor->add_option("--predictor", predictor_bench.predictor, "predictor name");
  bench_predictor->add_option("--sparsity", predictor_bench.sparsity, "target sparsity");
  bench_predictor->add_option("--steps", predictor_bench.steps, "timed decode steps");
  bench_predictor->add_option("--threads", predictor_bench.threads, "indexer threads (0 = all)");
  bench_predictor->add_option("--json", predictor_bench.json_path, "write one JSON record per point to FILE");

  spin::bench::DecodeBenchOptions decode;
  int64_t decode_context = 0;
  CLI::App* bench_decode = bench->add_subcommand("decode", "batched decode steps: predictor vs all-keep, stage breakdown");
  bench_decode->add_option("--model", decode.model, "deepseek-v3.2 | deepseek-v4-flash | deepseek-v4-pro");
  bench_decode->add_option("--context", decode_context, "indexer entries per request (default: 32K and 128K)");
  bench_decode->add_option("--batch", decode.batch, "concurrent requests");
  bench_decode->add_option("--layers", decode.layers, "indexer layers simulated (stated in the output)");
  bench_decode->add_option("--steps", decode.steps, "timed decode steps");
  bench_decode->add_option("--sparsity", decode.sparsities, "target sparsities of the predictor runs");
  bench_decode->add_option("--predictor", decode.predictor, "predictor name");
  bench_decode->add_option("--next-n", decode.next_n, "rows per request (MTP verification)");
  bench_decode->add_option("--acceptance", decode.acceptance_rate, "MTP draft acceptance rate");
  bench_decode->add_option("--latent", decode.latent, "fp8 | bf16 latent cache");
  bench_decode->add_option("--path-share", decode.path_share, "share of a full model step the attention path takes (projection only)");
  bench_decode->add_option("--threads", decode.threads, "threads (0 = all)");
  bench_decode->add_option("--json", decode.json_path, "write one JSON record per run to FILE");

  CLI11_PARSE(app, argc, argv);

  if (eval_cmd->parsed()) {
    if (spin::Status s = apply_sets(eval.base_config, eval_sets); !s.ok()) return fail(s);
    Progress progress;
    eval.progress = [&](const std::string& stage, double f) { progress.update(stage, f); };
    auto summary = spin::run_eval(eval);
    progress.done();
    if (!summary.ok()) return fail(summary.status());
    fmt::print("{}\nwrote {}/report.md, {}", summary->report_md, eval.out_dir, summary->results_path);
    for (const std::string& p : summary->plots) fmt::print(", {}", p);
    fmt::print("\n");
    return 0;
  }
  if (replay_cmd->parsed()) {
    if (spin::Status s = apply_sets(replay.config, replay_sets); !s.ok()) return fail(s);
    if (replay_sparsity >= 0) replay.config.target_sparsity = replay_sparsity;
    if (replay_explore >= 0) replay.config.explore_ratio = replay_explore;
    if (!replay_pooling.empty()) {
      auto p = spin::pooling_from_name(replay_pooling);
      if (!p.ok()) return fail(p.status());
      replay.config.pooling = p.value();
    }
    if (!replay_mtp.empty()) {
      auto m = spin::mtp_update_from_name(replay_mtp);
      if (!m.ok()) return fail(m.status());
      replay.config.mtp_update = m.value();
    }
    auto trace = spin::read_trace(replay_file);
    if (!trace.ok()) return fail(trace.status());
    Progress progress;
    spin::ScoreOptions so;
    so.progress = [&](int64_t d, int64_t t) { progress.update("scoring (all-keep)", 0.5 * static_cast<double>(d) / static_cast<double>(t)); };
    auto scored = spin::score_trace(trace.value(), so);
    if (!scored.ok()) return fail(scored.status());
    replay.keep_topk = !replay_dump.empty();
    replay.warm_start = !replay_cold;
    replay.progress = [&](int64_t d, int64_t t) { progress.update("replaying " + replay.predictor, 0.5 + 0.5 * static_cast<double>(d) / static_cast<double>(t)); };
    auto result = spin::replay(trace.value(), *scored.value(), replay);
    progress.done();
    if (!result.ok()) return fail(result.status());
    const spin::QualityStats& q = result->quality;
    const spin::TraceFacts facts = spin::trace_facts(*scored.value(), replay.config.block_entries());
    nlohmann::json out = {
        {"trace", replay_file}, {"predictor", replay.predictor}, {"open_loop", replay.open_loop},
        {"config", result->config.to_string()}, {"samples", q.samples()},
        {"exact_by_construction", q.exact_by_construction()}, {"recall_mean", q.recall().mean()},
        {"miss_p50", q.miss().percentile(50)}, {"miss_p99", q.miss().percentile(99)}, {"miss_max", q.miss().max()},
        {"block_recall_mean", q.block_recall().mean()}, {"sparsity_mean", q.sparsity().mean()},
        {"block_sparsity_mean", q.block_sparsity().mean()}, {"pearson_mean", q.pearson().mean()},
        {"topk_recall_mean", q.topk_recall().mean()}, {"topk_block_share", facts.topk_block_share},
        {"predictor_seconds", result->predictor_seconds}};
    for (auto& [k, v] : out.items()) {
      if (v.is_number_float() && !std::isfinite(v.get<double>())) v = nullptr;  // JSON has no NaN
    }
    fmt::print("{}\n", out.dump(2));
    if (!replay_json.empty()) {
      if (spin::Status s = spin::write_file_atomic(replay_json, out.dump(2) + "\n"); !s.ok()) return fail(s);
    }
    if (!replay_dump.empty()) {
      if (spin::Status s = spin::write_topk_dump(replay_dump, trace.value(), result.value()); !s.ok()) return fail(s);
    }
    return 0;
  }
  if (gen_cmd->parsed()) {
    auto params = spin::scenario_params(gen_scenario);
    if (!params.ok()) return fail(params.status());
    if (gen_context > 0) params->prompt_tokens = gen_context;
    if (gen_steps > 0) params->steps = gen_steps;
    if (gen_layers > 0) params->layers = gen_layers;
    if (gen_next_n > 0) params->next_n = gen_next_n;
    params->seed = gen_seed;
    auto trace = spin::generate_workload(params.value());
    if (!trace.ok()) return fail(trace.status());
    if (spin::Status s = spin::write_trace(trace.value(), gen_out); !s.ok()) return fail(s);
    auto reader = spin::TraceReader::open(gen_out);
    if (!reader.ok()) return fail(reader.status());
    fmt::print("{}", spin::describe(reader.value()));
    return 0;
  }
  if (info_cmd->parsed()) {
    auto reader = spin::TraceReader::open(info_file);
    if (!reader.ok()) return fail(reader.status());
    fmt::print("{}", spin::describe(reader.value()));
    return 0;
  }
  if (calibrate_cmd->parsed()) {
    std::vector<spin::CalibrationResult> results;
    calibrate_options.progress = [](const std::string& line) { fmt::print("{}\n", line); std::fflush(stdout); };
    for (const spin::CalibrationTarget& target : spin::paper_targets()) {
      fmt::print("calibrating {} to Pearson {:.3f}, top-k recall {:.3f}\n", target.scenario, target.pearson, target.topk_recall);
      auto r = spin::calibrate(target, calibrate_options);
      if (!r.ok()) return fail(r.status());
      fmt::print("→ {}: query_noise={:.4f} head_spread={:.4f} salience_sigma={:.4f}: Pearson {:.3f}, top-k recall {:.3f}\n",
                 target.scenario, r->params.query_noise, r->params.head_spread, r->params.salience_sigma,
                 r->achieved.pearson, r->achieved.topk_recall);
      results.push_back(r.value());
    }
    if (calibrate_write) {
      const std::string path = std::string(SPIN_SOURCE_DIR) + "/data/calibration.json";
      if (spin::Status s = spin::write_calibration(path, results, "spin calibrate --write"); !s.ok()) return fail(s);
      fmt::print("wrote {} (rebuild to compile it in)\n", path);
    }
    return 0;
  }
  if (config_cmd->parsed()) {
    fmt::print("defaults: {}\npredictors:", spin::PredictorConfig{}.to_string());
    for (const std::string& n : spin::predictor_names()) fmt::print(" {}", n);
    fmt::print("\nscenarios:");
    for (const std::string& n : spin::scenario_names()) fmt::print(" {}", n);
    fmt::print("\n");
    return 0;
  }
  if (bench_indexer->parsed()) {
    if (indexer_context > 0) indexer.contexts = {indexer_context};
    return spin::bench::run_indexer_bench(indexer);
  }
  if (bench_predictor->parsed()) {
    if (predictor_context > 0) predictor_bench.contexts = {predictor_context};
    return spin::bench::run_predictor_bench(predictor_bench);
  }
  if (bench_decode->parsed()) {
    if (decode_context > 0) decode.contexts = {decode_context};
    return spin::bench::run_decode_bench(decode);
  }
  if (bench_topk->parsed()) {
    if (topk_context > 0) topk.contexts = {topk_context};
    return spin::bench::run_topk_bench(topk);
  }
  return 0;
}
