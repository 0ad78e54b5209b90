// `spin diagnose`: the paper model of one GPU decode step (spin/lab/diagnose.h) — indexer, top-k and
// sparse attention times, the indexer's share, and spin's gain per sparsity, each figure sourced.
#include <fmt/format.h>

#include "cli.h"
#include "spin/lab/diagnose.h"
#include "spin/lab/model.h"
#include "spin/files.h"

namespace spin::cli {
namespace {

struct DiagnoseArgs {
  std::string model = "deepseek-v3.2", gpu = "h200", out;
  int64_t context = 131072;
  int32_t batch = 1, next_n = 1;
  std::vector<double> sparsities;
  double other_ms = 0;
  bool json = false;
};

int run_diagnose(const DiagnoseArgs& a) {
  auto model = model_preset(a.model);
  if (!model.ok()) return usage_error(model.status().message());
  auto gpu = gpu_preset(a.gpu);
  if (!gpu.ok()) return usage_error(gpu.status().message());
  DiagnoseInput in;
  in.model = model.value();
  in.gpu = gpu.value();
  in.context = a.context;
  in.batch = a.batch;
  in.next_n = a.next_n;
  if (!a.sparsities.empty()) in.sparsities = a.sparsities;
  in.other_ms = a.other_ms;
  if (Status s = in.validate(); !s.ok()) return usage_error(s.message());
  auto r = diagnose(in);
  if (!r.ok()) return fail(r.status());
  const std::string json = diagnose_json(r.value());
  fmt::print("{}", a.json ? json : diagnose_text(r.value()));
  if (!a.out.empty()) {
    if (Status s = write_file_atomic(a.out, json); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace

std::vector<Command> add_diagnose_command(CLI::App& app) {
  auto a = std::make_shared<DiagnoseArgs>();
  CLI::App* cmd = app.add_subcommand(
      "diagnose", "paper model of a GPU decode step: indexer / top-k / attention times and spin's gain per sparsity");
  cmd->add_option("--model", a->model, "model preset")->check(one_of(model_preset_names(), "model"));
  cmd->add_option("--gpu", a->gpu, "GPU preset")->check(one_of(gpu_preset_names(), "GPU"));
  cmd->add_option("--context", a->context, "tokens cached per request")->check(int_range(1, kMaxContext));
  cmd->add_option("--batch", a->batch, "requests decoding together")->check(int_range(1, 65536));
  cmd->add_option("--next-n", a->next_n, "rows per request (1 + MTP drafts)")->check(int_range(1, 4));
  cmd->add_option("--sparsity", a->sparsities, "target sparsities (default 0, 0.1 ... 0.6)")->check(sparsity());
  cmd->add_option("--other-ms", a->other_ms, "the rest of the decode step in ms (MoE, projections; default 0)")
      ->check(real_range(0, 1e6, true));
  cmd->add_flag("--json", a->json, "print the JSON record instead of the table");
  cmd->add_option("--out", a->out, "also write the JSON record to FILE")->check(output_file());
  return {{cmd, [a] { return run_diagnose(*a); }}};
}

}  // namespace spin::cli
