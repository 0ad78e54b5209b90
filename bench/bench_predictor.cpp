// `spin bench predictor`: what SPIN itself costs per (request, indexer layer, step) — select +
// observe + commit on a realistic row — next to the full indexer kernel at the same context
// (overhead_fraction = predictor time / full-indexer time, rows 1, V3.2 shape; cost_fraction = the
// entries its selection scores over the full indexer's, plus that overhead).
// Reproduce with: spin bench predictor --json predictor.json
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "bench_common.h"
#include "spin/cpu.h"
#include "spin/indexer.h"
#include "spin/predict.h"
#include "spin/rng.h"
#include "spin/settings.h"
#include "spin/topk.h"

namespace spin::bench {

// A predictor call that fails ends the benchmark with the one error line every command prints.
static int report_failure(const Status& s) {
  fmt::print(stderr, "spin: error: {}\n", s.to_string());
  return 1;
}


// The benchmark's config: the defaults at `sparsity`, then the --set overrides, checked.
static Result<PredictorConfig> bench_config(const PredictorBenchOptions& options) {
  PredictorConfig config;
  config.target_sparsity = options.sparsity;
  for (const std::string& item : options.settings) {
    const Result<Setting> kv = split_setting(item);
    if (!kv.ok()) return kv.status();
    SPIN_RETURN_IF_ERROR(config.set(kv->key, kv->value));
  }
  SPIN_RETURN_IF_ERROR(config.validate());
  return config;
}

int run_predictor_bench(const PredictorBenchOptions& options) {
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  const Result<PredictorConfig> configured = bench_config(options);
  if (!configured.ok()) return report_failure(configured.status());
  fmt::print("spin bench predictor — {} at sparsity {:.2f}{}{}, page 64, top-k 2048, rows 1; indexer on {} threads\n",
             options.predictor, options.sparsity, options.settings.empty() ? "" : ", ",
             fmt::join(options.settings, " "), threads);
  fmt::print("cpu: {}\n\n", cpu_summary());
  fmt::print("{:>8} {:>7} {:>12} {:>12} {:>12} {:>14} {:>10}\n", "context", "blocks", "select_us", "observe_us",
             "total_us", "indexer_us", "overhead");
  nlohmann::json records = nlohmann::json::array();
  for (int64_t context : options.contexts) {
    auto made = make_predictor(options.predictor, configured.value(), 1, 0);
    if (!made.ok()) {
      fmt::print(stderr, "spin: error: {}\n", made.status().to_string());
      return 1;
    }
    std::unique_ptr<BlockPredictor> predictor = std::move(made).value();
    // A score row with block structure (block level + entry noise), like an indexer row.
    CounterRng rng(stream_key(0xB7ED, static_cast<uint64_t>(context)));
    std::vector<float> scores(static_cast<size_t>(context));
    const int64_t n_blocks = (context + 63) / 64;
    std::vector<float> level(static_cast<size_t>(n_blocks));
    for (float& l : level) l = static_cast<float>(rng.normal());
    for (int64_t e = 0; e < context; ++e) scores[e] = level[e / 64] + 0.3f * static_cast<float>(rng.normal());
    std::vector<float> masked(scores.size());
    std::vector<int32_t> topk_out(2048);
    Selection sel;
    const int steps = options.steps;
    double select_us = 0, observe_us = 0;
    int64_t scored_entries = 0;  // over the timed steps: the work the selection causes
    for (int step = 0; step < steps + 3; ++step) {  // 3 warm-up steps
      StepInput in;
      in.step = step;
      in.num_entries = context;
      const auto t0 = std::chrono::steady_clock::now();
      if (Status s = predictor->select(0, in, &sel); !s.ok()) return report_failure(s);
      const auto t1 = std::chrono::steady_clock::now();
      // What the engine would have after the masked indexer and top-k (not timed here).
      std::fill(masked.begin(), masked.end(), -std::numeric_limits<float>::infinity());
      for (int32_t b : sel.blocks) {
        for (int64_t e = int64_t{b} * 64; e < std::min<int64_t>(context, (int64_t{b} + 1) * 64); ++e) masked[e] = scores[e];
      }
      TopkParams tp{masked.data(), context, 1, context, nullptr, 2048, topk_out.data(), 2048};
      (void)topk(tp, {TopkImpl::kAuto, 1});
      RowScores rs;
      rs.scores = masked.data();
      rs.num_cols = context;
      rs.visible_entries = context;
      rs.scored_blocks = sel.blocks.data();
      rs.num_scored_blocks = static_cast<int64_t>(sel.blocks.size());
      rs.topk_positions = topk_out.data();
      const auto t2 = std::chrono::steady_clock::now();
      if (Status s = predictor->observe(0, 0, rs); !s.ok()) return report_failure(s);
      if (Status s = predictor->commit(0); !s.ok()) return report_failure(s);
      const auto t3 = std::chrono::steady_clock::now();
      if (step >= 3) {
        for (int32_t b : sel.blocks) scored_entries += std::min<int64_t>(64, context - int64_t{b} * 64);
        select_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
        observe_us += std::chrono::duration<double, std::micro>(t3 - t2).count();
      }
    }
    select_us /= steps;
    observe_us /= steps;
    const double indexer_us = time_full_indexer_us(context, threads, options.min_seconds);
    const double total = select_us + observe_us;
    const double overhead = total / indexer_us;
    // cost_fraction: entries scored over the full indexer's, plus the overhead.
    const double work = static_cast<double>(scored_entries) / (static_cast<double>(context) * steps);
    fmt::print("{:>8} {:>7} {:>12.1f} {:>12.1f} {:>12.1f} {:>14.1f} {:>10.4f}\n", context, n_blocks, select_us,
               observe_us, total, indexer_us, overhead);
    std::fflush(stdout);
    nlohmann::json record = machine_json(threads);
    record.update({{"bench", "predictor"}, {"predictor", options.predictor},
                   {"context", context}, {"rows", 1},
                   {"blocks", n_blocks}, {"sparsity", options.sparsity}, {"select_us", select_us},
                   {"observe_us", observe_us}, {"time_us", total}, {"indexer_full_us", indexer_us},
                   {"overhead_fraction", overhead}, {"work_fraction", work}, {"cost_fraction", work + overhead},
                   {"state_bytes", predictor->memory_bytes()},
                   {"config", configured->to_string()}});
    records.push_back(record);
  }
  return finish_records(options.json_path, records);
}

}  // namespace spin::bench
