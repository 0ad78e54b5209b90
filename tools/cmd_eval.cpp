// `spin eval` (the main job), `spin calibrate` and `spin config`.
#include <fmt/format.h>

#include <cstdio>

#include "cli.h"
#include "plots.h"
#include "spin/lab/calibrate.h"
#include "spin/lab/eval.h"
#include "spin/files.h"
#include "spin/predict.h"
#include "spin/lab/replay.h"
#include "spin/trace.h"
#include "spin/lab/workload.h"

namespace spin::cli {
namespace {

struct EvalArgs {
  EvalOptions options;
  std::string preset;  // --preset: applied before --set
  std::vector<std::string> sets;
  std::vector<std::string> plot_predictors = default_plot_predictors();
};

// The sweep plots from results.json, linked at the end of report.md (rewritten whole).
Status add_plots(const EvalArgs& a, EvalSummary* summary, std::vector<std::string>* pngs) {
  const bool all = a.plot_predictors.size() == 1 && a.plot_predictors[0] == "all";
  auto plots = draw_sweep_plots(a.options.out_dir, summary->results_path,
                                all ? std::vector<std::string>{} : a.plot_predictors);
  if (!plots.ok()) return plots.status();
  std::string section = "\n## Plots\n\n";
  for (const std::string& p : plots->pngs) section += "![](" + p.substr(p.find_last_of('/') + 1) + ")\n";
  if (!plots->note.empty()) section += plots->note + "\n";
  summary->report_md += section;
  *pngs = plots->pngs;
  return write_file_atomic(a.options.out_dir + "/report.md", summary->report_md);
}

int run_eval_command(EvalArgs& a) {
  if (!a.preset.empty()) {
    if (Status st = a.options.base_config.apply_preset(a.preset); !st.ok()) return usage_error("--preset: " + st.message());
  }
  for (const std::string& s : a.sets) {
    if (Status st = a.options.base_config.parse(s); !st.ok()) return usage_error("--set " + s + ": " + st.message());
  }
  if (Status st = a.options.base_config.validate(); !st.ok()) return usage_error("--set: " + st.message());
  std::vector<std::string> all = a.options.traces;
  all.insert(all.end(), a.options.real_traces.begin(), a.options.real_traces.end());
  for (const std::string& t : all) {  // every trace checked before any work starts
    auto reader = TraceReader::open(t);
    if (!reader.ok()) return fail(reader.status());
    if (Status s = check_fits_in_memory(replay_memory_bytes(reader.value(), false), "evaluating " + t); !s.ok()) {
      return fail(s);
    }
  }
  Progress progress;
  a.options.progress = [&](const std::string& stage, double f) { progress.update(stage, f); };
  auto summary = run_eval(a.options);
  progress.done();
  if (!summary.ok()) return fail(summary.status());
  std::vector<std::string> pngs;
  if (Status s = add_plots(a, &summary.value(), &pngs); !s.ok()) return fail(s);
  fmt::print("{}\nwrote {}/report.md, {}", summary->report_md, a.options.out_dir, summary->results_path);
  for (const std::string& p : pngs) fmt::print(", {}", p);
  fmt::print("\n");
  return 0;
}

// `path`: where --write puts the table ("" = not written); the generator compiles in
// data/calibration.json, so writing there and rebuilding is how a new calibration takes effect.
int run_calibrate_command(CalibrationOptions& options, const std::string& path) {
  const bool write = !path.empty();
  if (write) {
    if (Status s = check_output_path(path); !s.ok()) return fail(s);
  }
  std::vector<CalibrationResult> results;
  options.progress = [](const std::string& line) {
    fmt::print("{}\n", line);
    std::fflush(stdout);
  };
  for (const CalibrationTarget& target : paper_targets()) {
    fmt::print("calibrating {} to Pearson {:.3f}, top-k recall {:.3f}\n", target.scenario, target.pearson,
               target.topk_recall);
    auto r = calibrate(target, options);
    if (!r.ok()) return fail(r.status());
    fmt::print("→ {}: query_noise={:.4f} head_spread={:.4f} salience_sigma={:.4f}: Pearson {:.3f}, top-k recall {:.3f}\n",
               target.scenario, r->params.query_noise, r->params.head_spread, r->params.salience_sigma,
               r->achieved.pearson, r->achieved.topk_recall);
    results.push_back(r.value());
  }
  if (write) {
    if (Status s = write_calibration(path, results, "spin calibrate --write"); !s.ok()) return fail(s);
    fmt::print("wrote {} (rebuild to compile it in)\n", path);
  }
  return 0;
}

int run_config_command() {
  fmt::print("defaults: {}\npredictors:", PredictorConfig{}.to_string());
  for (const std::string& n : predictor_names()) fmt::print(" {}", n);
  fmt::print("\npresets:");
  for (const std::string& n : preset_names()) fmt::print(" {}", n);
  fmt::print("\nscenarios:");
  for (const std::string& n : scenario_names()) fmt::print(" {}", n);
  fmt::print("\n");
  return 0;
}

}  // namespace

std::vector<Command> add_eval_commands(CLI::App& app) {
  auto eval = std::make_shared<EvalArgs>();
  CLI::App* eval_cmd = app.add_subcommand("eval", "the main job: predictors vs all-keep on the built-in scenarios");
  eval_cmd->add_option("--scenario", eval->options.scenarios, "scenarios to run (default: all built-in but the long-context niah-*/mrcr-*)")
      ->check(one_of(scenario_names(), "scenario"));
  eval_cmd->add_option("--trace", eval->options.traces,
                       "recorded trace files (key or score traces) to evaluate as well (alone, without --scenario)");
  eval_cmd->add_option("--real", eval->options.real_traces,
                       "real-model traces (./scripts/record-real-traces.sh) for the report's real-model section");
  eval_cmd->add_flag("--quick", eval->options.quick, "shorter runs and fewer points (seconds, not minutes)");
  eval_cmd->add_option("--out", eval->options.out_dir, "output directory (report.md, results.json, plots)")
      ->check(output_dir());
  eval_cmd->add_option("--seed", eval->options.seed, "workload seed (any 64-bit value)");
  eval_cmd->add_option("--threads", eval->options.threads, "threads (0 = all)")->check(threads());
  eval_cmd->add_option("--requests", eval->options.requests,
                       "requests (seeds) per scenario (default 3, 1 with --quick)")
      ->check(CLI::Range(1, 64));
  eval_cmd->add_option("--preset", eval->preset, "predictor config preset, applied before --set: default | paper (SPIN as published)")
      ->check(one_of(preset_names(), "preset"));
  eval_cmd->add_option("--set", eval->sets, "predictor config overrides, key=value (see `spin config`)");
  eval_cmd->add_option("--plot-predictors", eval->plot_predictors,
                       "sweep labels to plot, or `all` (default: spin spin-hybrid hisa step-reuse prev-iter oracle)")
      ->delimiter(',');

  auto calibrate_options = std::make_shared<CalibrationOptions>();
  auto calibrate_write = std::make_shared<std::string>();
  CLI::App* calibrate_cmd = app.add_subcommand("calibrate", "fit the workload generator to the paper's statistics");
  calibrate_cmd->add_option("--write", *calibrate_write,
                            "write the fitted table to PATH (data/calibration.json is the one compiled in: "
                            "write it there and rebuild to use it)")
      ->check(output_file());
  calibrate_cmd->add_option("--iterations", calibrate_options->iterations, "Gauss–Newton iterations")
      ->check(int_range(1, 100));

  CLI::App* config_cmd = app.add_subcommand("config", "print the predictor config defaults and predictor names");
  return {{eval_cmd, [eval] { return run_eval_command(*eval); }},
          {calibrate_cmd, [calibrate_options, calibrate_write] {
             return run_calibrate_command(*calibrate_options, *calibrate_write);
           }},
          {config_cmd, [] { return run_config_command(); }}};
}

}  // namespace spin::cli
