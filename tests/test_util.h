// Shared helpers for the tests: seeded random indexer problems on a scattered paged cache.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "spin/cache.h"
#include "spin/indexer.h"
#include "spin/rng.h"

namespace spin::testing {

// How many times slower than native this run is expected to be: SPIN_TEST_SLOWDOWN (1..100,
// default 1), set by the aarch64 test preset, whose tests run under qemu-user. Tests with wall-clock
// limits stretch them by it, and tests that count work done in a time budget expect less of it.
inline int test_slowdown() {
  const char* v = std::getenv("SPIN_TEST_SLOWDOWN");
  const int n = v != nullptr ? std::atoi(v) : 1;
  return std::clamp(n, 1, 100);
}

// A fresh directory under the system temp dir, removed with everything in it on destruction.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "spin_test_XXXXXX").string();
    path_ = mkdtemp(tmpl.data());
  }
  ~TempDir() { std::filesystem::remove_all(path_); }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  std::string file(const std::string& name) const { return (std::filesystem::path(path_) / name).string(); }
  // File names in the directory, sorted.
  std::vector<std::string> entries() const {
    std::vector<std::string> out;
    for (const auto& e : std::filesystem::directory_iterator(path_)) out.push_back(e.path().filename());
    std::sort(out.begin(), out.end());
    return out;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

struct IndexerCase {
  std::string name;
  int32_t page_size = 64;
  int32_t num_heads = 64;
  int32_t next_n = 1;
  int32_t compress_ratio = 1;
  int32_t block_pages = 1;
  std::vector<int64_t> context_lens;  // tokens, per request
  // Built data:
  std::vector<uint8_t> cache;
  int32_t num_pages = 0;
  std::vector<int32_t> block_table;
  int32_t block_table_stride = 0;
  std::vector<uint8_t> q;
  std::vector<float> weights;
  std::vector<float> q_fp32;    // the unquantised queries behind q (for loose checks)
  std::vector<float> keys_fp32;  // unquantised keys, [request][entry][128]
  std::vector<int64_t> key_offsets;  // request b's keys start at key_offsets[b] entries
  int64_t max_entries = 0;

  int64_t entries(int32_t b) const {
    return visible_entries(context_lens[b], next_n, next_n - 1, compress_ratio);
  }

  IndexerParams params(float* logits, int64_t stride) const {
    IndexerParams p;
    p.key_cache = cache.data();
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.block_table = block_table.data();
    p.block_table_stride = block_table_stride;
    p.batch = static_cast<int32_t>(context_lens.size());
    p.context_lens = context_lens.data();
    p.next_n = next_n;
    p.compress_ratio = compress_ratio;
    p.num_heads = num_heads;
    p.q = q.data();
    p.weights = weights.data();
    p.block_pages = block_pages;
    p.logits = logits;
    p.logits_stride = stride;
    p.logits_cols = std::max<int64_t>(max_entries, 1);
    return p;
  }
};

// Fills the case's cache (pages scattered by a random permutation), queries and weights.
inline void build_case(IndexerCase& c, uint64_t seed) {
  CounterRng rng(stream_key(seed, 0xCA5E));
  const int32_t batch = static_cast<int32_t>(c.context_lens.size());
  std::vector<int64_t> pages_per(batch);
  int64_t total_pages = 0;
  c.max_entries = 0;
  for (int32_t b = 0; b < batch; ++b) {
    const int64_t n = c.entries(b);
    c.max_entries = std::max(c.max_entries, n);
    pages_per[b] = (n + c.page_size - 1) / c.page_size;
    total_pages += pages_per[b];
  }
  c.num_pages = static_cast<int32_t>(total_pages + 3);  // a few pages no request owns
  std::vector<int32_t> perm(c.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int32_t i = c.num_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  c.block_table_stride = static_cast<int32_t>(
      std::max<int64_t>(1, *std::max_element(pages_per.begin(), pages_per.end())) + 1);
  c.block_table.assign(static_cast<size_t>(batch) * c.block_table_stride, -7);  // junk past the end
  auto cache = IndexerKeyCache::create(c.page_size, c.num_pages);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  // Fill every page (including unowned ones) with random bytes first, so stale data is visible.
  for (size_t i = 0; i < cache->size_bytes(); ++i) cache->data()[i] = static_cast<uint8_t>(rng.next_u64());
  int32_t next_page = 0;
  c.key_offsets.assign(batch, 0);
  c.keys_fp32.clear();
  for (int32_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < pages_per[b]; ++i) c.block_table[b * c.block_table_stride + i] = perm[next_page++];
    const int64_t n = c.entries(b);
    c.key_offsets[b] = static_cast<int64_t>(c.keys_fp32.size()) / kIndexerHeadDim;
    std::vector<float> keys(static_cast<size_t>(n) * kIndexerHeadDim);
    for (int64_t e = 0; e < n; ++e) {
      const double magnitude = std::exp(rng.normal());  // keys of varied scale → varied k_scale
      for (int d = 0; d < kIndexerHeadDim; ++d) keys[e * kIndexerHeadDim + d] = static_cast<float>(magnitude * rng.normal());
    }
    c.keys_fp32.insert(c.keys_fp32.end(), keys.begin(), keys.end());
    ASSERT_TRUE(cache->write_keys(c.block_table.data() + b * c.block_table_stride, pages_per[b], 0, keys.data(), n).ok());
  }
  c.cache.assign(cache->data(), cache->data() + cache->size_bytes());
  const int64_t rows = int64_t{batch} * c.next_n;
  c.q_fp32.resize(static_cast<size_t>(rows) * c.num_heads * kIndexerHeadDim);
  std::vector<float> raw_w(static_cast<size_t>(rows) * c.num_heads);
  for (float& v : c.q_fp32) v = static_cast<float>(rng.normal());
  for (float& v : raw_w) v = static_cast<float>(rng.normal());  // negative weights too
  c.q.resize(c.q_fp32.size());
  c.weights.resize(raw_w.size());
  ASSERT_TRUE(quantize_queries(c.q_fp32.data(), raw_w.data(), static_cast<int32_t>(rows), c.num_heads, c.q.data(),
                               c.weights.data()).ok());
}

}  // namespace spin::testing
