// `spin bench attention`: the sparse MLA decode kernel at DeepSeek's shapes (V3.2: 128 heads,
// top-k 2048; V4-Flash: `--heads 64 --topk 512`), over a paged latent cache of 128K entries with
// scattered pages and random selected entries, with the same columns as `spin bench indexer`.
//
// FLOP per row: heads · selected · (576 + 512) · 2 (QK^T over the 576-dim key, P·V over the
// 512-dim latent); bytes: selected · entry bytes (656 fp8, 1152 bf16), read once per row.
// peak_fraction is against the machine peak measured in the same run on the same threads;
// path_peak_fraction ("own") against the peak of the path's own instruction (bench_common.h).
// --probabilities picks AttentionOptions::bf16_probabilities; the header and records say which P
// precision the path actually computed (only avx512bf16 rounds P to bf16).
// Reproduce with: spin bench attention --json attention.json
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <vector>

#include "bench_common.h"
#include "spin/cpu.h"
#include "spin/attention.h"
#include "spin/rng.h"

namespace spin::bench {
namespace {

constexpr int32_t kPageSize = 64;
constexpr int64_t kCacheEntries = 131072;

struct Problem {
  std::vector<uint8_t> cache;
  std::vector<int32_t> block_table;
  std::vector<uint16_t> q;
  std::vector<int32_t> indices;
  std::vector<float> out, lse;
  int32_t num_pages = 0;
};

uint16_t random_bf16(CounterRng& rng) {  // |x| in [2^-4, 2): no overflow, no denormals
  const uint32_t exponent = 123 + static_cast<uint32_t>(rng.below(4));
  const uint32_t bits = (static_cast<uint32_t>(rng.below(2)) << 15) | (exponent << 7) | static_cast<uint32_t>(rng.below(128));
  return static_cast<uint16_t>(bits);
}

Problem make_problem(LatentDtype dtype, int32_t rows, int32_t heads, int32_t topk) {
  Problem p;
  const LatentPageLayout layout{dtype, kPageSize};
  p.num_pages = static_cast<int32_t>(kCacheEntries / kPageSize);
  p.cache.resize(static_cast<size_t>(layout.page_bytes()) * p.num_pages);
  CounterRng rng(stream_key(0xA77E, static_cast<uint64_t>(heads) * 4096 + topk));
  for (int64_t e = 0; e < kCacheEntries; ++e) {
    uint8_t* entry = p.cache.data() + e * layout.entry_bytes();
    if (dtype == LatentDtype::kBf16) {
      for (int32_t d = 0; d < kMlaHeadDim; ++d) {
        const uint16_t v = random_bf16(rng);
        std::memcpy(entry + 2 * d, &v, 2);
      }
      continue;
    }
    for (int32_t d = 0; d < kMlaLatentDim; ++d) entry[d] = static_cast<uint8_t>(rng.below(0x7E) | (rng.below(2) << 7));
    for (int32_t t = 0; t < kMlaNumTiles; ++t) {
      const float scale = std::ldexp(1.0f, -6 - static_cast<int>(rng.below(3)));
      std::memcpy(entry + LatentPageLayout::kFp8ScaleOffset + 4 * t, &scale, 4);
    }
    for (int32_t j = 0; j < kMlaRopeDim; ++j) {
      const uint16_t v = random_bf16(rng);
      std::memcpy(entry + LatentPageLayout::kFp8RopeOffset + 2 * j, &v, 2);
    }
  }
  p.block_table.resize(p.num_pages);
  std::iota(p.block_table.begin(), p.block_table.end(), 0);
  for (int32_t i = p.num_pages - 1; i > 0; --i) std::swap(p.block_table[i], p.block_table[rng.below(i + 1)]);
  p.q.resize(static_cast<size_t>(rows) * heads * kMlaHeadDim);
  for (uint16_t& v : p.q) v = random_bf16(rng);
  // Each row selects `topk` distinct random entries, ascending (as top-k hands them over).
  std::vector<int32_t> all(kCacheEntries);
  std::iota(all.begin(), all.end(), 0);
  for (int32_t r = 0; r < rows; ++r) {
    for (int32_t i = 0; i < topk; ++i) std::swap(all[i], all[i + rng.below(kCacheEntries - i)]);
    std::vector<int32_t> row(all.begin(), all.begin() + topk);
    std::sort(row.begin(), row.end());
    p.indices.insert(p.indices.end(), row.begin(), row.end());
  }
  p.out.resize(static_cast<size_t>(rows) * heads * kMlaLatentDim);
  p.lse.resize(static_cast<size_t>(rows) * heads);
  return p;
}

}  // namespace

int run_attention_bench(const AttentionBenchOptions& options) {
  AttentionImpl impl = AttentionImpl::kAuto;
  for (AttentionImpl i : attention_impls()) {
    if (options.impl == attention_impl_name(i)) impl = i;
  }
  if (impl == AttentionImpl::kAuto && options.impl != "auto") {
    fmt::print(stderr, "spin: error: unknown --impl '{}'\n", options.impl);
    return 2;
  }
  if (!attention_impl_supported(impl)) {
    fmt::print(stderr, "spin: error: --impl {}: {} (it runs {})\n", options.impl, cpu_lacks_note(options.impl),
               attention_impl_name(attention_best_impl()));
    return 2;
  }
  const AttentionImpl resolved = impl == AttentionImpl::kAuto ? attention_best_impl() : impl;
  const LatentDtype dtype = options.latent == "bf16" ? LatentDtype::kBf16 : LatentDtype::kFp8;
  const int threads = options.threads > 0 ? options.threads : omp_get_max_threads();
  const MachinePeak peak = measure_peak(threads);
  const MachinePeak own = measure_path_peak(attention_impl_name(resolved), threads);
  const bool bf16_p = options.probabilities == "bf16" && resolved == AttentionImpl::kAvx512Bf16;
  const char* p_precision = bf16_p ? "bf16" : "fp32";  // what the path computes, not what was asked
  fmt::print("spin bench attention — {} heads, top-k {}, latent {}, page {}, impl {}, P {}, {} threads\n",
             options.heads, options.topk, latent_dtype_name(dtype), kPageSize, attention_impl_name(resolved),
             p_precision, threads);
  fmt::print("cpu: {}\n", cpu_summary());
  std::fflush(stdout);
  print_peaks(peak, own);
  fmt::print("{:>5} {:>6} {:>6} {:>11} {:>9} {:>8} {:>6} {:>6}\n", "rows", "heads", "topk", "time_us", "GFLOP/s",
             "GB/s", "peak", "own");
  nlohmann::json records = nlohmann::json::array();
  const LatentPageLayout layout{dtype, kPageSize};
  for (int32_t rows : options.rows) {
    Problem prob = make_problem(dtype, rows, options.heads, options.topk);
    SparseAttentionParams params;
    params.latent_cache = prob.cache.data();
    params.dtype = dtype;
    params.page_size = kPageSize;
    params.num_pages = prob.num_pages;
    params.block_table = prob.block_table.data();
    params.block_table_stride = prob.num_pages;
    params.batch = rows;  // one row per request: every row has its own entries
    params.next_n = 1;
    std::vector<int32_t> tables(static_cast<size_t>(rows) * prob.num_pages);
    for (int32_t r = 0; r < rows; ++r) std::copy(prob.block_table.begin(), prob.block_table.end(), tables.begin() + int64_t{r} * prob.num_pages);
    params.block_table = tables.data();
    params.num_heads = options.heads;
    params.q = prob.q.data();
    params.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kMlaHeadDim));
    params.indices = prob.indices.data();
    params.topk = options.topk;
    params.out = prob.out.data();
    params.lse = prob.lse.data();
    if (Status s = validate_sparse_attention_params(params); !s.ok()) {
      fmt::print(stderr, "spin: error: {}\n", s.to_string());
      return 1;
    }
    AttentionOptions kernel_options;
    kernel_options.impl = impl;
    kernel_options.num_threads = threads;
    kernel_options.bf16_probabilities = options.probabilities == "bf16";
    const Timing t = time_it([&] { (void)sparse_attention(params, kernel_options); }, options.min_seconds);
    const double flop = 2.0 * options.heads * options.topk * (kMlaHeadDim + kMlaLatentDim) * rows;
    const double gflops = flop / (t.median_us * 1e3);
    const double gbps = static_cast<double>(options.topk) * rows * static_cast<double>(layout.entry_bytes()) /
                        (t.median_us * 1e3);
    fmt::print("{:>5} {:>6} {:>6} {:>11.1f} {:>9.1f} {:>8.2f} {} {}\n", rows, options.heads, options.topk,
               t.median_us, gflops, gbps, own_peak_cell(gflops, peak), own_peak_cell(gflops, own));
    std::fflush(stdout);
    nlohmann::json record = machine_json(threads);
    record.update({{"bench", "attention"}, {"impl", attention_impl_name(resolved)}, {"heads", options.heads},
                   {"topk", options.topk}, {"latent", latent_dtype_name(dtype)}, {"probabilities", p_precision}, {"rows", rows},
                   {"time_us", t.median_us}, {"time_us_min", t.min_us}, {"runs", t.runs}, {"gflops", gflops},
                   {"gbps", gbps}, {"peak_gflops", peak.gflops}, {"peak_instruction", peak.instruction},
                   {"peak_fraction", peak.gflops > 0 ? gflops / peak.gflops : 0.0}, {"path_peak_gflops", own.gflops},
                   {"path_peak_instruction", own.instruction},
                   {"path_peak_fraction", own.gflops > 0 ? gflops / own.gflops : 0.0}});
    records.push_back(record);
  }
  return finish_records(options.json_path, records);
}

}  // namespace spin::bench
