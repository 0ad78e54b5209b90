// The `spin` command: a thin front end over the library and the benchmarks. It parses flags,
// calls one function per subcommand, prints errors and sets the exit code — nothing else.
#include <CLI/CLI.hpp>
#include <fmt/format.h>

#include "bench_common.h"

int main(int argc, char** argv) {
  CLI::App app{"spin — shadow predictive indexer for DeepSeek sparse attention (CPU reference)"};
  app.require_subcommand(1);

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

  CLI11_PARSE(app, argc, argv);

  if (bench_indexer->parsed()) {
    if (indexer_context > 0) indexer.contexts = {indexer_context};
    return spin::bench::run_indexer_bench(indexer);
  }
  if (bench_topk->parsed()) {
    if (topk_context > 0) topk.contexts = {topk_context};
    return spin::bench::run_topk_bench(topk);
  }
  return 0;
}
