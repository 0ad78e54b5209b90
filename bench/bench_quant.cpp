// `spin bench quant`: the quantisers of the write and query paths, vectorised against their scalar
// reference, single thread (both are per-entry work on the caller's thread):
//   key:    quantize_e4m3_block128 vs quantize_e4m3_block128_reference over `entries` keys —
//           what IndexerKeyCache::write_keys does per entry after its finiteness check;
//   query:  quantize_queries (64 heads, V3.2) vs the same loop over the reference quantiser.
// Inputs are N(0, 1) keys with one outlier dim per entry (as real keys have), so the scale varies.
// ns per 128-dim entry, input GB/s (512 B of fp32 per entry) and the speedup; codes and scales of
// the two paths are compared on every run's output and must be bitwise equal.
// Reproduce with: spin bench quant --json quant.json
#include <fmt/format.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "bench_common.h"
#include "spin/cpu.h"
#include "spin/cache.h"
#include "spin/numerics.h"
#include "spin/rng.h"

namespace spin::bench {
namespace {

constexpr int32_t kQueryHeads = 64;

std::vector<float> make_keys(int64_t entries) {
  CounterRng rng(stream_key(0xC0DE));
  std::vector<float> x(static_cast<size_t>(entries) * kIndexerHeadDim);
  for (int64_t e = 0; e < entries; ++e) {
    for (int d = 0; d < kIndexerHeadDim; ++d) x[e * kIndexerHeadDim + d] = static_cast<float>(rng.normal());
    x[e * kIndexerHeadDim + e % kIndexerHeadDim] *= 40.0f;
  }
  return x;
}

// The query path on the reference quantiser: quantize_queries' loop, without its checks.
void quantize_queries_reference(const float* q, const float* w, int64_t heads_total, uint8_t* q8, float* w8) {
  const float fold = 1.0f / std::sqrt(float{kIndexerHeadDim}) / std::sqrt(static_cast<float>(kQueryHeads));
  for (int64_t i = 0; i < heads_total; ++i) {
    const float scale = quantize_e4m3_block128_reference(q + i * kIndexerHeadDim, q8 + i * kIndexerHeadDim);
    w8[i] = w[i] * scale * fold;
  }
}

struct Row {
  const char* what;
  Timing fast, reference;
  bool identical;
};

void print_row(const Row& r, int64_t entries) {
  const double n = static_cast<double>(entries);
  const double fast_ns = r.fast.median_us * 1e3 / n, ref_ns = r.reference.median_us * 1e3 / n;
  fmt::print("{:<7} {:>9} {:>11.2f} {:>10.2f} {:>11.2f} {:>10.2f} {:>8.2f}x {:>9}\n", r.what, entries, fast_ns,
             512.0 / fast_ns, ref_ns, 512.0 / ref_ns, ref_ns / fast_ns, r.identical ? "yes" : "NO");
}

}  // namespace

int run_quant_bench(const QuantBenchOptions& options) {
  const int64_t entries = options.entries;
  fmt::print("spin bench quant — {} entries of 128 dims, 1 thread; reference = the scalar quantiser\n", entries);
  fmt::print("cpu: {}\n\n", cpu_summary());
  fmt::print("{:<7} {:>9} {:>11} {:>10} {:>11} {:>10} {:>9} {:>9}\n", "path", "entries", "fast_ns", "fast_GB/s",
             "ref_ns", "ref_GB/s", "speedup", "bitwise");
  const std::vector<float> x = make_keys(entries);
  std::vector<uint8_t> codes(x.size()), ref_codes(x.size());
  std::vector<float> scales(static_cast<size_t>(entries)), ref_scales(scales.size());
  std::vector<float> weights(scales.size(), 0.5f);
  nlohmann::json records = nlohmann::json::array();
  auto record = [&](const Row& r) {
    print_row(r, entries);
    std::fflush(stdout);
    nlohmann::json j = machine_json(1);
    j.update({{"bench", "quant"}, {"path", r.what}, {"entries", entries},
              {"fast_ns_per_entry", r.fast.median_us * 1e3 / static_cast<double>(entries)},
              {"reference_ns_per_entry", r.reference.median_us * 1e3 / static_cast<double>(entries)},
              {"speedup", r.reference.median_us / r.fast.median_us}, {"bitwise_identical", r.identical}});
    records.push_back(j);
  };
  auto same = [&] {
    return std::memcmp(codes.data(), ref_codes.data(), codes.size()) == 0 &&
           std::memcmp(scales.data(), ref_scales.data(), scales.size() * sizeof(float)) == 0;
  };

  Row key{"key", {}, {}, false};
  key.fast = time_it([&] {
    for (int64_t e = 0; e < entries; ++e) scales[e] = quantize_e4m3_block128(&x[e * 128], &codes[e * 128]);
  }, options.min_seconds);
  key.reference = time_it([&] {
    for (int64_t e = 0; e < entries; ++e) {
      ref_scales[e] = quantize_e4m3_block128_reference(&x[e * 128], &ref_codes[e * 128]);
    }
  }, options.min_seconds);
  key.identical = same();
  record(key);

  // Queries: entries / 64 rows of 64 heads (the same number of 128-dim vectors).
  const int32_t rows = static_cast<int32_t>(entries / kQueryHeads);
  const int64_t heads_total = int64_t{rows} * kQueryHeads;
  Row query{"query", {}, {}, false};
  query.fast = time_it([&] {
    (void)quantize_queries(x.data(), weights.data(), rows, kQueryHeads, codes.data(), scales.data());
  }, options.min_seconds);
  query.reference = time_it([&] {
    quantize_queries_reference(x.data(), weights.data(), heads_total, ref_codes.data(), ref_scales.data());
  }, options.min_seconds);
  std::fill(codes.begin() + heads_total * 128, codes.end(), 0);
  std::fill(ref_codes.begin() + heads_total * 128, ref_codes.end(), 0);
  std::fill(scales.begin() + heads_total, scales.end(), 0.0f);
  std::fill(ref_scales.begin() + heads_total, ref_scales.end(), 0.0f);
  query.identical = same();
  record(query);
  return finish_records(options.json_path, records);
}

}  // namespace spin::bench
