// `spin bench topk`: radix-select top-k against the sorting reference and a plain
// std::nth_element baseline, per row, on indexer-like scores (-inf for a tenth of the entries).
// Reproduce with: spin bench topk --json topk.json
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "bench_common.h"
#include "spin/rng.h"
#include "spin/topk.h"

namespace spin::bench {
namespace {

// The baseline an engineer would write first: nth_element on (score, position) pairs with the
// same tie rule, then sort the chosen positions.
void nth_element_topk(const std::vector<float>& scores, int32_t k, std::vector<std::pair<float, int32_t>>& pairs,
                      std::vector<int32_t>& out) {
  pairs.clear();
  for (size_t i = 0; i < scores.size(); ++i) {
    if (std::isfinite(scores[i])) pairs.emplace_back(scores[i], static_cast<int32_t>(i));
  }
  const size_t take = std::min(pairs.size(), static_cast<size_t>(k));
  auto better = [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; };
  std::nth_element(pairs.begin(), pairs.begin() + static_cast<std::ptrdiff_t>(take), pairs.end(), better);
  out.resize(take);
  for (size_t i = 0; i < take; ++i) out[i] = pairs[i].second;
  std::sort(out.begin(), out.end());
}

}  // namespace

int run_topk_bench(const TopkBenchOptions& options) {
  fmt::print("spin bench topk — k = {}, one row, {} thread(s)\n\n", options.topk, options.threads);
  fmt::print("{:>8} {:>12} {:>14} {:>12} {:>10} {:>12}\n", "context", "radix_us", "nth_element_us", "sort_ref_us",
             "vs_nth", "Mentries/s");
  nlohmann::json records = nlohmann::json::array();
  for (int64_t context : options.contexts) {
    CounterRng rng(stream_key(0x70C, static_cast<uint64_t>(context)));
    std::vector<float> scores(static_cast<size_t>(context));
    for (float& s : scores) {
      s = rng.uniform() < 0.1 ? -std::numeric_limits<float>::infinity() : static_cast<float>(rng.normal());
    }
    std::vector<int32_t> out(options.topk);
    TopkParams params{scores.data(), context, 1, context, nullptr, options.topk, out.data(), options.topk};
    const Timing radix = time_it([&] { (void)topk(params, {TopkImpl::kRadix, options.threads}); }, options.min_seconds);
    const Timing ref = time_it([&] { (void)topk(params, {TopkImpl::kReference, options.threads}); }, options.min_seconds);
    std::vector<std::pair<float, int32_t>> pairs;
    std::vector<int32_t> nth_out;
    const Timing nth = time_it([&] { nth_element_topk(scores, options.topk, pairs, nth_out); }, options.min_seconds);
    const double rate = static_cast<double>(context) / radix.median_us;
    fmt::print("{:>8} {:>12.1f} {:>14.1f} {:>12.1f} {:>9.2f}x {:>12.1f}\n", context, radix.median_us, nth.median_us,
               ref.median_us, nth.median_us / radix.median_us, rate);
    std::fflush(stdout);
    nlohmann::json record = machine_json(options.threads);
    record.update({{"bench", "topk"}, {"context", context}, {"topk", options.topk}, {"rows", 1},
                   {"time_us", radix.median_us}, {"nth_element_us", nth.median_us}, {"reference_us", ref.median_us},
                   {"speedup_vs_nth_element", nth.median_us / radix.median_us}, {"mentries_per_s", rate}});
    records.push_back(record);
  }
  return finish_records(options.json_path, records);
}

}  // namespace spin::bench
