// `spin trace gen` (a synthetic trace) and `spin trace info` (describe and validate a trace).
#include <fmt/format.h>

#include "cli.h"
#include "spin/files.h"
#include "spin/trace.h"
#include "spin/workload.h"

namespace spin::cli {
namespace {

struct GenArgs {
  std::string scenario = "doc-qa-10k", out;
  int64_t context = 0;
  int32_t steps = 0, layers = 0, next_n = 0;  // 0: not given, the scenario's own value
  uint64_t seed = 1;
};

// Bytes of the trace the generator holds in memory (and then writes): per layer the keys and
// scales of every entry, and the queries and weights of every row.
double trace_bytes(const WorkloadParams& p) {
  const double rows = static_cast<double>(p.steps) * p.next_n;
  const double bursts = p.burst_steps > 0 ? static_cast<double>(p.steps / p.burst_steps + 1) : 0.0;
  const double entries = static_cast<double>(p.prompt_tokens) + rows + bursts * static_cast<double>(p.tool_tokens);
  const double per_layer = entries * (kTraceHeadDim + 4) + rows * p.num_heads * (kTraceHeadDim + 4);
  return per_layer * p.layers;
}

int run_gen(const GenArgs& a) {
  auto params = scenario_params(a.scenario);
  if (!params.ok()) return fail(params.status());
  if (a.context > 0) params->prompt_tokens = a.context;
  if (a.steps > 0) params->steps = a.steps;
  if (a.layers > 0) params->layers = a.layers;
  if (a.next_n > 0) params->next_n = a.next_n;
  params->seed = a.seed;
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
  auto info_file = std::make_shared<std::string>();
  CLI::App* info_cmd = trace->add_subcommand("info", "describe and validate a trace file");
  info_cmd->add_option("file", *info_file, "trace file")->required();
  return {{gen_cmd, [gen] { return run_gen(*gen); }}, {info_cmd, [info_file] { return run_info(*info_file); }}};
}

}  // namespace spin::cli
