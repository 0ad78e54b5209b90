// `spin bench indexer`: the lightning-indexer kernel at the real DeepSeek-V3.2 shape
// (64 heads × 128 dims, page 64), full and block-masked, rows 1 and 2.
//
// Reports median time, GFLOP/s (2·64·128 FLOP per scored entry per row), GB/s (132 B per scored
// entry, read once for all rows), peak_fraction against the machine peak (the best of bf16 dot and
// FMA) measured in the same run on the same threads, path_peak_fraction ("own") against the peak
// of the forced path's own instruction (bench_common.h), and speedup_vs_full for masked runs next to the ideal 1/(1-s).
// Reproduce the README numbers with: spin bench indexer --json indexer.json
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <numeric>
#include <vector>

#include "bench_common.h"
#include "spin/cpu.h"
#include "spin/cache.h"
#include "spin/indexer.h"
#include "spin/rng.h"

namespace spin::bench {
namespace {

constexpr int32_t kHeads = 64;
constexpr int32_t kPageSize = 64;

struct Problem {
  int64_t entries = 0;
  std::vector<uint8_t> cache;
  std::vector<int32_t> block_table;
  std::vector<uint8_t> q;
  std::vector<float> weights;
  std::vector<float> logits;
  int32_t num_pages = 0;
};

// Random e4m3 codes (never the NaN codes) and power-of-two scales; pages scattered at random.
Problem make_problem(int64_t entries, int rows) {
  Problem p;
  p.entries = entries;
  p.num_pages = static_cast<int32_t>((entries + kPageSize - 1) / kPageSize);
  const IndexerPageLayout layout{kPageSize};
  p.cache.resize(static_cast<size_t>(layout.page_bytes()) * p.num_pages);
  CounterRng rng(stream_key(0xBE7C, static_cast<uint64_t>(entries)));
  auto code = [&] { return static_cast<uint8_t>(rng.below(0x7E) | (rng.below(2) << 7)); };
  for (int32_t page = 0; page < p.num_pages; ++page) {
    uint8_t* base = p.cache.data() + page * layout.page_bytes();
    for (int32_t o = 0; o < kPageSize; ++o) {
      for (int d = 0; d < kIndexerHeadDim; ++d) base[layout.value_offset(o) + d] = code();
      const float scale = std::ldexp(1.0f, -static_cast<int>(rng.below(8)));
      std::memcpy(base + layout.scale_offset(o), &scale, 4);
    }
  }
  p.block_table.resize(p.num_pages);
  std::iota(p.block_table.begin(), p.block_table.end(), 0);
  for (int32_t i = p.num_pages - 1; i > 0; --i) std::swap(p.block_table[i], p.block_table[rng.below(i + 1)]);
  p.q.resize(static_cast<size_t>(rows) * kHeads * kIndexerHeadDim);
  for (uint8_t& c : p.q) c = code();
  p.weights.resize(static_cast<size_t>(rows) * kHeads);
  for (float& w : p.weights) w = static_cast<float>(rng.normal() * 0.01);
  p.logits.resize(static_cast<size_t>(rows) * entries);
  return p;
}

// One request scoring every entry of `prob` with `rows` query rows.
IndexerParams full_params(Problem& prob, const int64_t* ctx_len, int rows) {
  IndexerParams params;
  params.key_cache = prob.cache.data();
  params.page_size = kPageSize;
  params.num_pages = prob.num_pages;
  params.block_table = prob.block_table.data();
  params.block_table_stride = prob.num_pages;
  params.batch = 1;
  params.context_lens = ctx_len;
  params.next_n = rows;
  params.num_heads = kHeads;
  params.q = prob.q.data();
  params.weights = prob.weights.data();
  params.logits = prob.logits.data();
  params.logits_stride = prob.entries;
  params.logits_cols = prob.entries;
  return params;
}

// Exactly ceil((1-s)·n_blocks) blocks, drawn uniformly without replacement, sorted.
std::vector<int32_t> pick_blocks(int32_t n_blocks, double sparsity, uint64_t seed) {
  const int32_t keep = static_cast<int32_t>(std::ceil((1.0 - sparsity) * n_blocks - 1e-9));
  std::vector<int32_t> all(n_blocks);
  std::iota(all.begin(), all.end(), 0);
  CounterRng rng(stream_key(seed));
  for (int32_t i = 0; i < keep; ++i) std::swap(all[i], all[i + rng.below(n_blocks - i)]);
  all.resize(keep);
  std::sort(all.begin(), all.end());
  return all;
}

}  // namespace

double time_full_indexer_us(int64_t context, int threads, double min_seconds) {
  Problem prob = make_problem(context, 1);
  const int64_t ctx_len = context;
  const IndexerParams params = full_params(prob, &ctx_len, 1);
  return time_it([&] { (void)indexer_scores(params, {IndexerImpl::kAuto, threads}); }, min_seconds).median_us;
}

int run_indexer_bench(const IndexerBenchOptions& options) {
  IndexerImpl impl = IndexerImpl::kAuto;
  for (IndexerImpl i : indexer_impls()) {
    if (options.impl == indexer_impl_name(i)) impl = i;
  }
  if (impl == IndexerImpl::kAuto && options.impl != "auto") {
    fmt::print(stderr, "spin: error: unknown --impl '{}'\n", options.impl);
    return 2;
  }
  if (!indexer_impl_supported(impl)) {
    fmt::print(stderr, "spin: error: --impl {}: {} (it runs {})\n", options.impl, cpu_lacks_note(options.impl),
               indexer_impl_name(indexer_best_impl()));
    return 2;
  }
  const IndexerImpl resolved = impl == IndexerImpl::kAuto ? indexer_best_impl() : impl;
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  const MachinePeak peak = measure_peak(threads);
  const MachinePeak own = measure_path_peak(indexer_impl_name(resolved), threads);
  fmt::print("spin bench indexer — V3.2 shape: {} heads × {} dims, page {}, impl {}, {} threads\n", kHeads,
             kIndexerHeadDim, kPageSize, indexer_impl_name(resolved), threads);
  fmt::print("cpu: {}\n", cpu_summary());
  std::fflush(stdout);
  print_peaks(peak, own);
  fmt::print("{:>8} {:>4} {:>8} {:>8} {:>11} {:>9} {:>8} {:>6} {:>6} {:>9} {:>7}\n", "context", "rows", "sparsity",
             "realised", "time_us", "GFLOP/s", "GB/s", "peak", "own", "vs_full", "ideal");
  nlohmann::json records = nlohmann::json::array();
  for (int64_t context : options.contexts) {
    for (int rows : options.rows) {
      Problem prob = make_problem(context, rows);
      const int64_t ctx_len = context;  // entries incl. this step's rows: the last row sees all
      const IndexerParams params = full_params(prob, &ctx_len, rows);
      double full_us = 0;
      for (double sparsity : options.sparsities) {
        std::vector<int32_t> blocks;
        int32_t offsets[2] = {0, 0};
        IndexerParams run = params;
        int64_t scored = context;
        if (sparsity > 0) {
          blocks = pick_blocks(prob.num_pages, sparsity, static_cast<uint64_t>(context * 7 + rows));
          offsets[1] = static_cast<int32_t>(blocks.size());
          run.block_ids = blocks.data();
          run.block_offsets = offsets;
          scored = 0;
          for (int32_t b : blocks) scored += std::min<int64_t>(kPageSize, context - int64_t{b} * kPageSize);
        }
        IndexerOptions kernel_options{impl, threads};
        Status status = validate_indexer_params(run);
        if (!status.ok()) {
          fmt::print(stderr, "spin: error: {}\n", status.to_string());
          return 1;
        }
        const Timing t = time_it([&] { (void)indexer_scores(run, kernel_options); }, options.min_seconds);
        if (sparsity == 0) full_us = t.median_us;
        // Earlier MTP rows see up to rows-1 fewer entries; that is < 4 of `scored` and ignored here.
        const double flop = 2.0 * kHeads * kIndexerHeadDim * static_cast<double>(scored) * rows;
        const double gflops = flop / (t.median_us * 1e3);
        const double gbps = static_cast<double>(scored) * kEntryBytes / (t.median_us * 1e3);
        const double realised = 1.0 - static_cast<double>(scored) / static_cast<double>(context);
        const double speedup = full_us > 0 ? full_us / t.median_us : 0.0;
        const double ideal = 1.0 / (1.0 - realised);
        fmt::print("{:>8} {:>4} {:>8.2f} {:>8.3f} {:>11.1f} {:>9.1f} {:>8.2f} {} {} {:>8.3f}x {:>6.3f}x\n",
                   context, rows, sparsity, realised, t.median_us, gflops, gbps, own_peak_cell(gflops, peak),
                   own_peak_cell(gflops, own), sparsity > 0 ? speedup : 1.0, ideal);
        std::fflush(stdout);
        nlohmann::json record = machine_json(threads);
        record.update({{"bench", "indexer"}, {"impl", indexer_impl_name(resolved)}, {"heads", kHeads},
                       {"page_size", kPageSize}, {"context", context}, {"rows", rows}, {"sparsity", sparsity},
                       {"sparsity_realised", realised}, {"time_us", t.median_us}, {"time_us_min", t.min_us},
                       {"runs", t.runs}, {"gflops", gflops}, {"gbps", gbps}, {"peak_gflops", peak.gflops},
                       {"peak_instruction", peak.instruction}, {"peak_fraction", peak.gflops > 0 ? gflops / peak.gflops : 0.0},
                       {"path_peak_gflops", own.gflops}, {"path_peak_instruction", own.instruction},
                       {"path_peak_fraction", own.gflops > 0 ? gflops / own.gflops : 0.0},
                       {"speedup_vs_full", sparsity > 0 ? speedup : 1.0}, {"ideal_speedup", ideal}});
        records.push_back(record);
      }
    }
  }
  return finish_records(options.json_path, records);
}

}  // namespace spin::bench
