// `spin bench indexer|topk|predictor|attention|quant|decode`: flags and their checks; the benchmarks themselves
// live in bench/ (one file each, with their reproduction commands).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <filesystem>

#include "bench_common.h"
#include "cli.h"
#include "spin/attention.h"
#include "spin/lab/engine.h"
#include "spin/indexer.h"
#include "spin/predict.h"
#include "spin/lab/workload.h"

namespace spin::cli {
namespace {

using bench::DecodeBenchOptions;
using bench::IndexerBenchOptions;
using bench::PredictorBenchOptions;
using bench::TopkBenchOptions;

// `--context N` replaces the default sweep with one context; absent, the sweep runs.
CLI::Option* add_context(CLI::App* cmd, std::vector<int64_t>& contexts, const char* help) {
  return cmd
      ->add_option_function<int64_t>("--context", [&contexts](int64_t c) { contexts = {c}; }, help)
      ->check(int_range(1, kMaxContext));
}

// Bytes of keys and scores (132 per entry) a benchmark lays out for its largest context.
double largest_cache_bytes(const std::vector<int64_t>& contexts, double copies) {
  int64_t largest = 0;
  for (int64_t c : contexts) largest = std::max(largest, c);
  return copies * static_cast<double>(largest) * (128 + 4 + 4 * 4);
}

// Runs a kernel benchmark unless its largest context cannot fit in this machine's memory.
template <typename Options>
int run_if_it_fits(const Options& o, const char* what, int (*run)(const Options&)) {
  if (Status s = check_fits_in_memory(largest_cache_bytes(o.contexts, 1), what); !s.ok()) return fail(s);
  return run(o);
}

int run_decode(const DecodeBenchOptions& o) {
  auto model = model_preset(o.model);
  if (!model.ok()) return usage_error(model.status().message());
  if (o.layers > model->indexer_layers) {
    return usage_error(fmt::format("--layers {} is more than the {} indexer layers of {}", o.layers,
                                   model->indexer_layers, model->name));
  }
  return bench::run_decode_bench(o);  // the engine refuses, in GiB, a pool larger than memory
}

// --source: "random", a scenario name, or a regular file to open as a key trace.
CLI::Validator decode_source() {
  return CLI::Validator(
      [](const std::string& v) -> std::string {
        const auto& names = scenario_names();
        if (v == "random" || std::find(names.begin(), names.end(), v) != names.end()) return "";
        if (std::filesystem::is_regular_file(v)) return "";
        return fmt::format("--source: '{}' is neither random, a scenario ({}) nor a trace file", v,
                           fmt::join(names, ", "));
      },
      "random|SCENARIO|TRACE");
}

CLI::Validator indexer_paths() {
  return kernel_path(indexer_impls(), indexer_impl_name, indexer_impl_supported, indexer_best_impl);
}

CLI::Validator attention_paths() {
  return kernel_path(attention_impls(), attention_impl_name, attention_impl_supported, attention_best_impl);
}

void add_common(CLI::App* cmd, int& threads_value, std::string& json_path) {
  cmd->add_option("--threads", threads_value, "threads (0 = all)")->check(threads());
  cmd->add_option("--json", json_path, "write one JSON record per point to FILE")->check(output_file());
}

}  // namespace

std::vector<Command> add_bench_commands(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "kernel and predictor benchmarks");
  bench->require_subcommand(1);

  auto indexer = std::make_shared<IndexerBenchOptions>();
  CLI::App* indexer_cmd = bench->add_subcommand("indexer", "lightning-indexer kernel, full and block-masked");
  add_context(indexer_cmd, indexer->contexts, "run one context size (entries) instead of 8K–512K");
  indexer_cmd->add_option("--rows", indexer->rows, "query rows per request (MTP next_n), one or more")
      ->check(int_range(1, 4));
  indexer_cmd->add_option("--sparsity", indexer->sparsities, "block sparsities to run (0 = full)")->check(sparsity());
  indexer_cmd->add_option("--impl", indexer->impl, "kernel path (a path this CPU lacks is refused)")
      ->check(indexer_paths());
  indexer_cmd->add_option("--min-time", indexer->min_seconds, "seconds of timed runs per point")
      ->check(positive_seconds());
  add_common(indexer_cmd, indexer->threads, indexer->json_path);

  auto topk = std::make_shared<TopkBenchOptions>();
  CLI::App* topk_cmd = bench->add_subcommand("topk", "top-k selection vs std::nth_element");
  add_context(topk_cmd, topk->contexts, "run one context size instead of 8K–512K");
  topk_cmd->add_option("--topk", topk->topk, "k")->check(int_range(1, 65536));
  topk_cmd->add_option("--min-time", topk->min_seconds, "seconds of timed runs per point")->check(positive_seconds());
  topk_cmd->add_option("--sparsity", topk->sparsity,
                       "also mask this share of 64-entry blocks: full -inf-padded row vs scored entries only")
      ->check(sparsity());
  add_common(topk_cmd, topk->threads, topk->json_path);

  auto predictor = std::make_shared<PredictorBenchOptions>();
  CLI::App* predictor_cmd = bench->add_subcommand("predictor", "select + observe cost vs the full indexer");
  add_context(predictor_cmd, predictor->contexts, "run one context size instead of 8K–512K");
  predictor_cmd->add_option("--predictor", predictor->predictor, "predictor name")
      ->check(one_of(predictor_names(), "predictor"));
  predictor_cmd->add_option("--sparsity", predictor->sparsity, "target sparsity")->check(sparsity());
  predictor_cmd->add_option("--steps", predictor->steps, "timed decode steps")->check(int_range(1, 1000000));
  predictor_cmd->add_option("--set", predictor->settings, "predictor config overrides, \"key=value ...\" (see spin config)");
  add_common(predictor_cmd, predictor->threads, predictor->json_path);

  auto attention = std::make_shared<bench::AttentionBenchOptions>();
  CLI::App* attention_cmd = bench->add_subcommand("attention", "sparse MLA decode kernel over the top-k (V3.2 / V4 shapes)");
  attention_cmd->add_option("--rows", attention->rows, "query rows, one or more (each its own request)")
      ->check(int_range(1, 256));
  attention_cmd->add_option("--heads", attention->heads, "attention heads (V3.2 128, V4-Flash 64)")->check(int_range(1, 128));
  attention_cmd->add_option("--topk", attention->topk, "selected entries per row")->check(int_range(1, 65536));
  attention_cmd->add_option("--latent", attention->latent, "latent cache format")->check(one_of({"fp8", "bf16"}, "--latent"));
  attention_cmd->add_option("--impl", attention->impl, "kernel path (a path this CPU lacks is refused)")
      ->check(attention_paths());
  attention_cmd->add_option("--probabilities", attention->probabilities,
                            "P precision before P·V: bf16 (FlashMLA's; only the avx512bf16 path rounds P, every "
                            "other path computes P·V in fp32 either way) or fp32")
      ->check(one_of({"bf16", "fp32"}, "--probabilities"));
  attention_cmd->add_option("--min-time", attention->min_seconds, "seconds of timed runs per point")
      ->check(positive_seconds());
  add_common(attention_cmd, attention->threads, attention->json_path);

  auto quant = std::make_shared<bench::QuantBenchOptions>();
  CLI::App* quant_cmd = bench->add_subcommand("quant", "key and query quantisers: vectorised vs scalar reference");
  quant_cmd->add_option("--entries", quant->entries, "128-dim vectors per timed pass")->check(int_range(64, 1 << 24));
  quant_cmd->add_option("--min-time", quant->min_seconds, "seconds of timed runs per point")->check(positive_seconds());
  quant_cmd->add_option("--json", quant->json_path, "write one JSON record per point to FILE")->check(output_file());

  auto decode = std::make_shared<DecodeBenchOptions>();
  CLI::App* decode_cmd = bench->add_subcommand("decode", "batched decode steps: predictor vs all-keep, stage breakdown");
  decode_cmd->add_option("--model", decode->model, "model preset")->check(one_of(model_preset_names(), "model"));
  CLI::Option* context_opt = add_context(decode_cmd, decode->contexts, "indexer entries per request (default: 32K and 128K)");
  decode_cmd->add_option("--batch", decode->batch, "concurrent requests")->check(int_range(1, 1024));
  decode_cmd->add_option("--layers", decode->layers, "indexer layers simulated (stated in the output)")
      ->check(int_range(1, 1024));
  decode_cmd->add_option("--steps", decode->steps, "timed decode steps")->check(int_range(1, 100000));
  decode_cmd->add_option("--sparsity", decode->sparsities, "target sparsities of the predictor runs")->check(sparsity());
  decode_cmd->add_option("--predictor", decode->predictor, "predictor name")->check(one_of(predictor_names(), "predictor"));
  CLI::Option* next_n_opt = decode_cmd->add_option("--next-n", decode->next_n, "rows per request (MTP verification)")
                                ->check(int_range(1, 4));
  CLI::Option* acceptance_opt =
      decode_cmd->add_option("--acceptance", decode->acceptance_rate, "MTP draft acceptance rate")
          ->check(real_range(0, 1));
  decode_cmd->add_option("--source", decode->source,
                         "indexer keys, queries and acceptance: random, a scenario (generated), or a key trace file")
      ->check(decode_source());
  decode_cmd->add_option("--indexer-impl", decode->indexer_impl, "indexer kernel path (a path this CPU lacks is refused)")
      ->check(indexer_paths());
  decode_cmd->add_option("--attention-impl", decode->attention_impl, "attention kernel path (a path this CPU lacks is refused)")
      ->check(attention_paths());
  decode_cmd->add_option("--latent", decode->latent, "latent cache format")->check(one_of({"fp8", "bf16"}, "--latent"));
  decode_cmd->add_option("--path-share", decode->path_share,
                         "share of a full model step the attention path takes (projection only)")
      ->check(real_range(0.01, 1));
  add_common(decode_cmd, decode->threads, decode->json_path);

  return {{indexer_cmd, [indexer] { return run_if_it_fits(*indexer, "this indexer benchmark", bench::run_indexer_bench); }},
          {topk_cmd, [topk] { return run_if_it_fits(*topk, "this top-k benchmark", bench::run_topk_bench); }},
          {quant_cmd, [quant] { return bench::run_quant_bench(*quant); }},
          {predictor_cmd,
           [predictor] { return run_if_it_fits(*predictor, "this predictor benchmark", bench::run_predictor_bench); }},
          {attention_cmd, [attention] { return bench::run_attention_bench(*attention); }},
          {decode_cmd, [decode, context_opt, next_n_opt, acceptance_opt] {
             // A replayed source fixes the context, the rows and the acceptance: a flag for them would be ignored.
             for (const CLI::Option* given : {context_opt, next_n_opt, acceptance_opt}) {
               if (decode->source != "random" && given->count() > 0) {
                 return usage_error(fmt::format("{} comes from --source {}; drop one of them", given->get_name(),
                                                decode->source));
               }
             }
             return run_decode(*decode);
           }}};
}

}  // namespace spin::cli
