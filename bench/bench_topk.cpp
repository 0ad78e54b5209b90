// `spin bench topk`: radix-select top-k against the sorting reference and a plain
// std::nth_element baseline, per row, on indexer-like scores (-inf for a tenth of the entries).
// With --sparsity S it also masks S of the row's 64-entry blocks (the first and the two newest
// always kept, then the blocks with the highest scores: what a good predictor scores) and times,
// in the same run, the radix top-k over the full -inf-padded row against the one that reads only
// the scored blocks (TopkParams::block_ids), next to the ideal 1/(1-S).
// Reproduce with: spin bench topk --json topk.json   (masked: spin bench topk --sparsity 0.5)
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "bench_common.h"
#include "spin/cpu.h"
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

constexpr int64_t kBenchBlockEntries = 64;  // page 64, one page per block

// Kept block ids (ascending) for a row at sparsity s: sinks and locals, then the highest maxima.
std::vector<int32_t> realistic_mask(const std::vector<float>& scores, double sparsity) {
  const int64_t n = static_cast<int64_t>(scores.size());
  const int64_t n_blocks = (n + kBenchBlockEntries - 1) / kBenchBlockEntries;
  const int64_t budget = std::clamp<int64_t>(
      static_cast<int64_t>(std::ceil((1.0 - sparsity) * static_cast<double>(n_blocks))), std::min<int64_t>(3, n_blocks),
      n_blocks);
  std::vector<std::pair<float, int32_t>> by_max;
  for (int64_t b = 0; b < n_blocks; ++b) {
    float m = -std::numeric_limits<float>::infinity();
    for (int64_t e = b * kBenchBlockEntries; e < std::min(n, (b + 1) * kBenchBlockEntries); ++e) {
      if (std::isfinite(scores[e])) m = std::max(m, scores[e]);
    }
    const bool forced = b == 0 || b >= n_blocks - 2;
    by_max.emplace_back(forced ? std::numeric_limits<float>::max() : m, static_cast<int32_t>(b));
  }
  std::sort(by_max.begin(), by_max.end(),
            [](const auto& a, const auto& b) { return a.first != b.first ? a.first > b.first : a.second < b.second; });
  std::vector<int32_t> ids;
  for (int64_t i = 0; i < budget; ++i) ids.push_back(by_max[i].second);
  std::sort(ids.begin(), ids.end());
  return ids;
}

}  // namespace

int run_topk_bench(const TopkBenchOptions& options) {
  fmt::print("spin bench topk — k = {}, one row, {} thread(s)\ncpu: {}\n\n", options.topk, options.threads, cpu_summary());
  const bool masked = options.sparsity > 0;
  fmt::print("{:>8} {:>12} {:>14} {:>12} {:>10} {:>12}", "context", "radix_us", "nth_element_us", "sort_ref_us",
             "vs_nth", "Mentries/s");
  if (masked) {
    fmt::print(" | sparsity {:.2f}: {:>12} {:>14} {:>8} {:>7}", options.sparsity, "padded_row_us", "scored_only_us",
               "gain", "ideal");
  }
  fmt::print("\n");
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
    fmt::print("{:>8} {:>12.1f} {:>14.1f} {:>12.1f} {:>9.2f}x {:>12.1f}", context, radix.median_us, nth.median_us,
               ref.median_us, nth.median_us / radix.median_us, rate);
    nlohmann::json record = machine_json(options.threads);
    record.update({{"bench", "topk"}, {"context", context}, {"topk", options.topk}, {"rows", 1},
                   {"time_us", radix.median_us}, {"nth_element_us", nth.median_us}, {"reference_us", ref.median_us},
                   {"speedup_vs_nth_element", nth.median_us / radix.median_us}, {"mentries_per_s", rate}});
    if (masked) {
      // The same masked row two ways: the -inf-padded buffer the indexer writes, read in full, and
      // only the scored blocks' entries. Both must give the same answer (checked once here).
      const std::vector<int32_t> ids = realistic_mask(scores, options.sparsity);
      std::vector<float> padded(scores.size(), -std::numeric_limits<float>::infinity());
      for (int32_t b : ids) {
        const int64_t first = b * kBenchBlockEntries, last = std::min(context, first + kBenchBlockEntries);
        std::copy(scores.begin() + first, scores.begin() + last, padded.begin() + first);
      }
      const int32_t offsets[2] = {0, static_cast<int32_t>(ids.size())};
      TopkParams full = params;
      full.scores = padded.data();
      TopkParams scored = full;
      scored.block_ids = ids.data();
      scored.block_offsets = offsets;
      scored.block_entries = kBenchBlockEntries;
      std::vector<int32_t> out_scored(options.topk);
      scored.out = out_scored.data();
      (void)topk(full, {TopkImpl::kRadix, options.threads});
      (void)topk(scored, {TopkImpl::kRadix, options.threads});
      if (out != out_scored) {
        fmt::print(stderr, "\nscored-only top-k differs from the padded-row top-k at context {}\n", context);
        return 1;
      }
      const Timing t_full = time_it([&] { (void)topk(full, {TopkImpl::kRadix, options.threads}); }, options.min_seconds);
      const Timing t_scored =
          time_it([&] { (void)topk(scored, {TopkImpl::kRadix, options.threads}); }, options.min_seconds);
      const double realised = 1.0 - static_cast<double>(ids.size()) /
                                        static_cast<double>((context + kBenchBlockEntries - 1) / kBenchBlockEntries);
      const double gain = t_full.median_us / t_scored.median_us;
      fmt::print(" | {:>23} {:>12.1f} {:>14.1f} {:>7.2f}x {:>6.2f}x", fmt::format("(realised {:.2f})", realised),
                 t_full.median_us, t_scored.median_us, gain, 1.0 / (1.0 - realised));
      record.update({{"sparsity", options.sparsity}, {"realised_sparsity", realised}, {"block_entries", kBenchBlockEntries},
                     {"padded_row_us", t_full.median_us}, {"scored_only_us", t_scored.median_us},
                     {"scored_only_gain", gain}, {"ideal_gain", 1.0 / (1.0 - realised)}});
    }
    fmt::print("\n");
    std::fflush(stdout);
    records.push_back(record);
  }
  return finish_records(options.json_path, records);
}

}  // namespace spin::bench
