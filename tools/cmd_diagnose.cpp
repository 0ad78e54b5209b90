// `spin diagnose`: the GPU cost model of spin/diagnose.h as a table (and JSON) — what a vLLM user
// asks before adopting spin: how much of a decode step the indexer is, and what skipping buys.
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli.h"
#include "spin/diagnose.h"
#include "spin/files.h"

namespace spin::cli {
namespace {

struct DiagnoseArgs {
  std::string model = "deepseek-v3.2";
  std::string gpu = "h200";
  int64_t context = 131072;
  int32_t batch = 1;
  int32_t next_n = 1;
  std::vector<double> sparsities = {0.0, 0.3, 0.4, 0.5, 0.6, 0.7};
  std::string json;
};

nlohmann::json stages_json(const StageTimes& t) {
  return {{"indexer_us", t.indexer_us}, {"topk_us", t.topk_us}, {"attention_us", t.attention_us},
          {"predictor_us", t.predictor_us}};
}

nlohmann::json result_json(const DiagnoseResult& r) {
  const DiagnoseInput& in = r.input;
  nlohmann::json rows = nlohmann::json::array();
  for (const DiagnoseRow& row : r.rows) {
    rows.push_back({{"sparsity", row.sparsity}, {"topk_scored_only", stages_json(row.scored_topk)},
                    {"topk_full_row", stages_json(row.full_topk)}, {"path_ms_topk_scored_only", row.path_ms_scored},
                    {"path_ms_topk_full_row", row.path_ms_full}, {"speedup_topk_scored_only", row.speedup_scored},
                    {"speedup_topk_full_row", row.speedup_full}});
  }
  return {{"model", in.model.name}, {"gpu", in.gpu.name}, {"context", in.context}, {"entries", r.entries},
          {"batch", in.batch}, {"next_n", in.next_n}, {"indexer_layers", in.model.indexer_layers},
          {"indexer_share", r.indexer_share}, {"topk_share_of_indexer", r.topk_share_of_indexer},
          {"rows", rows}, {"sources", in.gpu.sources},
          {"note", "a cost model of the attention path (indexer, top-k, sparse MLA), not a measurement"}};
}

void print_result(const DiagnoseResult& r) {
  const DiagnoseInput& in = r.input;
  const DiagnoseRow& dense = r.rows.front();
  fmt::print("spin diagnose — {} on {}: context {} tokens ({} indexer entries), batch {}, next_n {}, {} indexer layers\n",
             in.model.name, in.gpu.name, in.context, r.entries, in.batch, in.next_n, in.model.indexer_layers);
  fmt::print("attention path per decode step (indexer + top-k + sparse MLA over the indexer layers; MoE/MLP not "
             "modelled). At sparsity {:.2f}: indexer + top-k are {:.0f} % of it, and the top-k is {:.0f} % of "
             "indexer + top-k.\n\n",
             dense.sparsity, 100 * r.indexer_share, 100 * r.topk_share_of_indexer);
  fmt::print("{:>8} {:>11} {:>14} {:>14} {:>10} {:>8} {:>16} {:>16}\n", "sparsity", "indexer_us", "topk_us scored",
             "topk_us full", "attn_us", "spin_us", "path_ms sc/full", "speedup sc/full");
  for (const DiagnoseRow& row : r.rows) {
    fmt::print("{:>8.2f} {:>11.1f} {:>14.1f} {:>14.1f} {:>10.1f} {:>8.2f} {:>7.2f} / {:>6.2f} {:>7.3f}x / {:>5.3f}x\n",
               row.sparsity, row.scored_topk.indexer_us, row.scored_topk.topk_us, row.full_topk.topk_us,
               row.scored_topk.attention_us, row.scored_topk.predictor_us, row.path_ms_scored, row.path_ms_full,
               row.speedup_scored, row.speedup_full);
  }
  fmt::print("\n\"scored\": top-k reads only the scored blocks' entries (spin's top-k); \"full\": it reads the whole "
             "-inf-padded row (today's GPU kernels). spin_us: select + observe at spin's measured CPU share.\n"
             "A model, not a measurement. Figures it rests on:\n");
  for (const std::string& s : in.gpu.sources) fmt::print("  - {}\n", s);
}

int run_diagnose(const DiagnoseArgs& a) {
  auto model = model_preset(a.model);
  if (!model.ok()) return usage_error(model.status().message());
  auto gpu = gpu_preset(a.gpu);
  if (!gpu.ok()) return usage_error(gpu.status().message());
  if (!a.json.empty()) {
    if (Status s = check_output_path(a.json); !s.ok()) return fail(s);
  }
  DiagnoseInput in;
  in.model = model.value();
  in.gpu = gpu.value();
  in.context = a.context;
  in.batch = a.batch;
  in.next_n = a.next_n;
  in.sparsities = a.sparsities;
  if (in.sparsities.empty() || in.sparsities.front() != 0.0) in.sparsities.insert(in.sparsities.begin(), 0.0);
  auto result = diagnose(in);
  if (!result.ok()) return fail(result.status());
  print_result(result.value());
  if (!a.json.empty()) {
    if (Status s = write_file_atomic(a.json, result_json(result.value()).dump(2) + "\n"); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace

std::vector<Command> add_diagnose_command(CLI::App& app) {
  auto a = std::make_shared<DiagnoseArgs>();
  CLI::App* cmd = app.add_subcommand("diagnose", "will spin help? the indexer's share of a GPU decode step, and "
                                                 "what skipping buys (a cost model with its sources)");
  cmd->add_option("--model", a->model, "model preset")->check(one_of(model_preset_names(), "model"));
  cmd->add_option("--gpu", a->gpu, "GPU preset")->check(one_of(gpu_preset_names(), "gpu"));
  cmd->add_option("--context", a->context, "tokens per request")->check(int_range(1, int64_t{1} << 26));
  cmd->add_option("--batch", a->batch, "concurrent requests")->check(int_range(1, 65536));
  cmd->add_option("--next-n", a->next_n, "rows per request (MTP verification)")->check(int_range(1, 4));
  cmd->add_option("--sparsity", a->sparsities, "skipped share of the indexer's blocks (0 is always shown)")
      ->check(real_range(0, 1, true));
  cmd->add_option("--json", a->json, "also write the estimate as JSON")->check(output_file());
  return {{cmd, [a] { return run_diagnose(*a); }}};
}

}  // namespace spin::cli
