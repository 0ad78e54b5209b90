// `spin trace gen` (a synthetic trace), `spin trace info` (describe and validate a trace) and
// `spin trace convert --to scores` (a key trace's all-keep indexer scores as a score trace).
#include <fmt/format.h>

#include "cli.h"
#include "spin/files.h"
#include "spin/settings.h"
#include "spin/lab/replay.h"
#include "spin/trace.h"
#include "spin/lab/workload.h"

namespace spin::cli {
namespace {

struct GenArgs {
  std::string scenario = "doc-qa-10k", out;
  int64_t context = 0;
  int32_t steps = 0, layers = 0, next_n = 0;  // 0: not given, the scenario's own value
  uint64_t seed = 1;
  std::vector<std::string> settings;  // --set: workload fields, key=value, after the options above
};

double trace_bytes(const WorkloadParams& p) { return workload_trace_bytes(p); }

int run_gen(const GenArgs& a) {
  auto params = scenario_params(a.scenario);
  if (!params.ok()) return fail(params.status());
  if (a.context > 0) params->prompt_tokens = a.context;
  if (a.steps > 0) params->steps = a.steps;
  if (a.layers > 0) params->layers = a.layers;
  if (a.next_n > 0) params->next_n = a.next_n;
  params->seed = a.seed;
  for (const std::string& text : a.settings) {
    auto kv = split_setting(text);
    if (!kv.ok()) return usage_error("--set " + kv.status().message());
    if (Status s = params->set(kv->key, kv->value); !s.ok()) return usage_error(s.message());
  }
  if (Status s = params->validate(); !s.ok()) return usage_error(s.message());
  const double bytes = trace_bytes(params.value());
  // The trace is built whole in memory and then written; twice its size covers the working set.
  if (Status s = check_fits_in_memory(2 * bytes, fmt::format("a {:.1f} GiB trace", bytes / 1073741824.0)); !s.ok()) {
    return fail(s);
  }
  auto trace = generate_workload(params.value());
  if (!trace.ok()) return fail(trace.status());
  if (Status s = write_trace(trace.value(), a.out); !s.ok()) return fail(s);
  auto reader = TraceReader::open(a.out);
  if (!reader.ok()) return fail(reader.status());
  fmt::print("{}", describe(reader.value()));
  return 0;
}

int run_info(const std::string& file) {
  auto reader = TraceReader::open(file);
  if (!reader.ok()) return fail(reader.status());
  fmt::print("{}", describe(reader.value()));
  return 0;
}

struct ConvertArgs {
  std::string file, out, to = "scores";
};

// A key trace → the score trace of its all-keep scores (what an engine's logits buffer would have
// held): replaying either gives the same metrics for every score-only predictor.
int run_convert(const ConvertArgs& a) {
  const std::vector<std::string> inputs = {a.file};
  if (Status s = check_output_path(a.out, inputs); !s.ok()) return fail(s);
  auto reader = TraceReader::open(a.file);
  if (!reader.ok()) return fail(reader.status());
  if (reader->kind() == TraceKind::kScores) {
    return usage_error(a.file + " is already a score trace (kind=scores); --to scores converts a key trace");
  }
  const TraceMeta& m = reader->meta();
  double cells = 0;
  for (int l = 0; l < m.num_layers; ++l) cells += static_cast<double>(reader->entries(l));
  const double out_bytes = cells * static_cast<double>(reader->steps()) * m.next_n * 4;
  if (Status s = check_fits_in_memory(replay_memory_bytes(reader.value(), false) + out_bytes,
                                      "converting " + a.file);
      !s.ok()) {
    return fail(s);
  }
  const Trace trace = reader->to_trace();
  Progress progress;
  ScoreOptions so;
  so.progress = [&](int64_t d, int64_t t) {
    progress.update("scoring (all-keep)", static_cast<double>(d) / static_cast<double>(t));
  };
  auto scores = all_keep_score_trace(trace, so);
  progress.done();
  if (!scores.ok()) return fail(Status(scores.status().code(), a.file + ": " + scores.status().message()));
  if (Status s = write_score_trace(scores.value(), a.out); !s.ok()) return fail(s);
  auto written = TraceReader::open(a.out);
  if (!written.ok()) return fail(written.status());
  fmt::print("{}", describe(written.value()));
  return 0;
}

}  // namespace

std::vector<Command> add_trace_commands(CLI::App& app) {
  CLI::App* trace = app.add_subcommand("trace", "write or describe trace files");
  trace->require_subcommand(1);
  auto gen = std::make_shared<GenArgs>();
  CLI::App* gen_cmd = trace->add_subcommand("gen", "generate a synthetic trace");
  gen_cmd->add_option("--scenario", gen->scenario, "built-in scenario")->check(one_of(scenario_names(), "scenario"));
  gen_cmd->add_option("--out", gen->out, "output file")->required()->check(output_file());
  gen_cmd->add_option("--context", gen->context, "prompt tokens (default: the scenario's)")
      ->check(int_range(1, kMaxContext));
  gen_cmd->add_option("--steps", gen->steps, "decode steps (default: the scenario's)")->check(int_range(1, 1 << 20));
  gen_cmd->add_option("--layers", gen->layers, "indexer layers (default: the scenario's)")
      ->check(int_range(1, kTraceMaxLayers));
  gen_cmd->add_option("--next-n", gen->next_n, "rows per step, 1 + draft tokens (default: the scenario's)")
      ->check(int_range(1, 4));
  gen_cmd->add_option("--seed", gen->seed, "seed (any 64-bit value)");
  gen_cmd->add_option("--set", gen->settings, "other workload fields, key=value (e.g. target_query=12)");
  auto info_file = std::make_shared<std::string>();
  CLI::App* info_cmd = trace->add_subcommand("info", "describe and validate a trace file");
  info_cmd->add_option("file", *info_file, "trace file")->required();
  auto convert = std::make_shared<ConvertArgs>();
  CLI::App* convert_cmd = trace->add_subcommand("convert", "convert a key trace to the score trace of its all-keep scores");
  convert_cmd->add_option("file", convert->file, "key trace file")->required();
  convert_cmd->add_option("--to", convert->to, "target kind")->check(one_of({"scores"}, "trace kind"));
  convert_cmd->add_option("--out", convert->out, "output file")->required()->check(output_file());
  return {{gen_cmd, [gen] { return run_gen(*gen); }},
          {info_cmd, [info_file] { return run_info(*info_file); }},
          {convert_cmd, [convert] { return run_convert(*convert); }}};
}

}  // namespace spin::cli
