// `spin advise`: the adoption answer for one deployment (spin/lab/advise.h) — the indexer's share of
// the decode step with the rest of the model and spin's own cost, per-request quality of spin's
// default and the paper's spin on the user's traces (or the built-in scenarios), the highest
// sparsity within the tolerance, the gain there, one verdict line and the `vllm serve` line; plus
// what spin does to the p99 step on this CPU's engine (`spin bench decode`'s paired run).
#include <fmt/format.h>

#include "bench_common.h"
#include "cli.h"
#include "spin/cpu.h"
#include "spin/files.h"
#include "spin/lab/advise.h"
#include "spin/lab/replay.h"
#include "spin/lab/workload.h"
#include "spin/predict.h"

namespace spin::cli {
namespace {

struct AdviseArgs {
  Deployment deployment;
  AdviseQualityOptions quality;
  double tolerance = kDefaultTolerance;
  bool cpu_tail = true;
  bool json = false;
  std::string out;
};

// Every trace opened and its geometry checked against the model before any work starts.
Status check_traces(const AdviseArgs& a, const ModelPreset& model) {
  for (const std::string& path : a.quality.traces) {
    auto reader = TraceReader::open(path);
    if (!reader.ok()) return reader.status();
    SPIN_RETURN_IF_ERROR(check_trace_geometry(path, reader->meta(), model, a.quality.at_model_topk));
    SPIN_RETURN_IF_ERROR(check_fits_in_memory(replay_memory_bytes(reader.value(), false), "advising on " + path));
  }
  return ok_status();
}

// The CPU engine's step tail, all-keep against spin at `sparsity`: a short paired run at the model's
// geometry (random keys: latency does not depend on what the keys say).
Result<Advice::CpuTail> measure_cpu_tail(const AdviseArgs& a, double sparsity) {
  bench::DecodeBenchOptions o;
  o.model = a.deployment.model;
  o.contexts = {32768};
  o.batch = 4;
  o.layers = 2;
  o.steps = 48;
  o.attn_err = false;
  o.threads = a.quality.threads;
  auto t = bench::measure_decode_tail(o, sparsity);
  if (!t.ok()) return t.status();
  return Advice::CpuTail{fmt::format("spin bench decode --model {} --context 32768 --batch 4 --layers 2 --steps 48",
                                     o.model),
                         cpu_summary(), sparsity, t->all_keep_p50_ms, t->all_keep_p99_ms, t->predictor_p50_ms,
                         t->predictor_p99_ms};
}

int run_advise(AdviseArgs& a) {
  if (Status s = a.deployment.validate(); !s.ok()) return usage_error(s.message());
  const ModelPreset model = model_preset(a.deployment.model).value();
  if (Status s = check_traces(a, model); !s.ok()) {
    return s.code() == StatusCode::kInvalidArgument ? usage_error(s.message()) : fail(s);
  }
  const std::vector<double>& sparsities =
      a.quality.sparsities.empty() ? default_advise_sparsities() : a.quality.sparsities;
  auto step = model_step(a.deployment, sparsities);
  if (!step.ok()) return fail(step.status());
  Progress progress;
  a.quality.progress = [&](const std::string& stage, double f) { progress.update("replaying " + stage, f); };
  auto quality = measure_advise_quality(model, a.deployment.next_n, a.quality);
  progress.done();
  if (!quality.ok()) return fail(quality.status());
  auto advice = recommend(step.value(), quality->points, a.tolerance,
                          a.quality.traces.empty() ? kOnScenarios : kOnYourTraces);
  if (!advice.ok()) return fail(advice.status());
  advice->sources_of_quality = quality->sources;
  if (a.cpu_tail) {
    auto tail = measure_cpu_tail(a, advice->recommended_sparsity.value_or(0.5));
    if (!tail.ok()) return fail(tail.status());
    advice->cpu_tail = tail.value();
  }
  const std::string json = advice_json(advice.value());
  fmt::print("{}", a.json ? json : advice_text(advice.value()));
  if (!a.out.empty()) {
    if (Status s = write_file_atomic(a.out, json); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace

std::vector<Command> add_advise_command(CLI::App& app) {
  auto a = std::make_shared<AdviseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "advise",
      "should I use spin? the indexer's share of your decode step, per-request quality on your traces, the "
      "highest sparsity within your tolerance, the gain there and the vllm serve line");
  cmd->footer(
      "Quality comes from your recorded traces (--trace, one request each; record mode writes them) or, without "
      "them, the built-in scenarios doc-qa-10k, doc-qa-94k, agentic and needle-shift: 3 requests each of 24 steps "
      "and 2 indexer layers by default (under a minute on 2 cores; raise --requests/--steps/--layers for more). "
      "The step is a paper model (spin diagnose's, with the rest of the model and spin's own cost added); the CPU "
      "tail is a short measured run of spin bench decode (--no-cpu-tail skips it).");
  Deployment& d = a->deployment;
  cmd->add_option("--model", d.model, "model preset (default deepseek-v3.2)")->check(one_of(model_preset_names(), "model"));
  cmd->add_option("--gpu", d.gpu, "GPU preset (default h200)")->check(one_of(gpu_preset_names(), "GPU"));
  cmd->add_option("--context", d.context, "tokens cached per request (default 131072)")->check(int_range(1, kMaxContext));
  cmd->add_option("--batch", d.batch, "requests decoding together (default 64)")->check(int_range(1, 65536));
  cmd->add_option("--next-n", d.next_n, "rows per request (1 + MTP drafts; default 1)")->check(int_range(1, kMaxNextN));
  cmd->add_option("--tp", d.tensor_parallel, "GPUs the weights are split over (tensor parallel; default 8)")
      ->check(int_range(1, 1024));
  cmd->add_option("--other-ms", d.other_ms, "the rest of the decode step in ms, instead of the modelled MoE and projections")
      ->check(real_range(0, 1e6, true));
  cmd->add_option("--trace", a->quality.traces, "your recorded trace file (key or score trace); repeatable");
  cmd->add_flag("--at-model-topk", a->quality.at_model_topk,
                "read traces at the model's top-k whatever they were recorded at (another model's traces; page size "
                "and compress ratio must still match)");
  cmd->add_option("--scenario", a->quality.scenarios, "built-in scenarios to replay (default without --trace: "
                                                      "doc-qa-10k doc-qa-94k agentic needle-shift)")
      ->check(one_of(scenario_names(), "scenario"));
  cmd->add_option("--tolerance", a->tolerance,
                  "the worst request's p99 miss you accept, in (0, 1) (default 0.5: the paper's RULER p99 miss at 50 %)")
      ->check(open_range(0, 1));
  cmd->add_option("--sparsity", a->quality.sparsities, "sparsities to weigh (default 0.2 ... 0.7)")->check(sparsity());
  cmd->add_option("--requests", a->quality.requests, "generated requests per scenario (default 3)")->check(int_range(1, 64));
  cmd->add_option("--steps", a->quality.steps, "decode steps per generated request (default 24)")->check(int_range(2, 4096));
  cmd->add_option("--layers", a->quality.layers, "indexer layers per generated request (default 2)")->check(int_range(1, 64));
  cmd->add_option("--seed", a->quality.seed, "workload seed");
  cmd->add_option("--threads", a->quality.threads, "threads (0 = all)")->check(threads());
  cmd->add_flag("!--no-cpu-tail", a->cpu_tail, "skip the CPU engine's step-latency run");
  cmd->add_flag("--json", a->json, "print the JSON record instead of the screen");
  cmd->add_option("--out", a->out, "also write the JSON record to FILE")->check(output_file());
  return {{cmd, [a] { return run_advise(*a); }}};
}

}  // namespace spin::cli
