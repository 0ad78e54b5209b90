// Paged indexer cache: byte layout, page allocation, request page tables, quantised writes.
#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <set>
#include <vector>

#include "spin/cache.h"
#include "spin/rng.h"

namespace spin {
namespace {

TEST(PageLayout, MatchesVllmBytes) {
  for (int32_t page_size : {1, 5, 61, 64, 69}) {
    const IndexerPageLayout layout{page_size};
    EXPECT_EQ(layout.page_bytes(), page_size * 132);
    for (int32_t o = 0; o < page_size; ++o) {
      EXPECT_EQ(layout.value_offset(o), o * 128);
      EXPECT_EQ(layout.scale_offset(o), page_size * 128 + 4 * o);
    }
  }
}

TEST(PageAllocator, LowestFirstExhaustionAndDoubleFree) {
  PageAllocator pool(3);
  int32_t a, b, c, d;
  ASSERT_TRUE(pool.allocate(&a).ok());
  ASSERT_TRUE(pool.allocate(&b).ok());
  ASSERT_TRUE(pool.allocate(&c).ok());
  EXPECT_EQ(a, 0);
  EXPECT_EQ(b, 1);
  EXPECT_EQ(c, 2);
  const Status exhausted = pool.allocate(&d);
  EXPECT_EQ(exhausted.code(), StatusCode::kResourceExhausted);
  EXPECT_NE(exhausted.message().find("exhausted"), std::string::npos);
  ASSERT_TRUE(pool.release(1).ok());
  EXPECT_EQ(pool.release(1).code(), StatusCode::kFailedPrecondition);
  EXPECT_EQ(pool.release(7).code(), StatusCode::kOutOfRange);
  ASSERT_TRUE(pool.allocate(&d).ok());
  EXPECT_EQ(d, 1);
}

TEST(RequestPages, ReserveIsAllOrNothing) {
  PageAllocator pool(5);
  RequestPages first, second;
  ASSERT_TRUE(first.reserve(130, 64, pool).ok());  // 3 pages
  EXPECT_EQ(first.pages().size(), 3u);
  ASSERT_TRUE(first.reserve(100, 64, pool).ok());  // shrinking asks for nothing
  EXPECT_EQ(first.pages().size(), 3u);
  EXPECT_EQ(second.reserve(64 * 3, 64, pool).code(), StatusCode::kResourceExhausted);
  EXPECT_TRUE(second.pages().empty());
  EXPECT_EQ(pool.num_free(), 2);  // the failed call gave back what it took
  ASSERT_TRUE(first.release_all(pool).ok());
  EXPECT_EQ(pool.num_free(), 5);
}

TEST(IndexerKeyCache, WritesLandAtTheDocumentedBytes) {
  for (int32_t page_size : {1, 5, 16, 61, 64, 69, 128}) {
    auto cache = IndexerKeyCache::create(page_size, 20);
    ASSERT_TRUE(cache.ok());
    std::vector<int32_t> pages = {7, 3, 19, 0, 11, 5, 2, 8, 14, 1, 4, 6, 9, 10, 12, 13, 15, 16, 17, 18};
    const int64_t count = std::min<int64_t>(int64_t{page_size} * 3 + 2, int64_t{page_size} * 20 - 9);
    CounterRng rng(stream_key(page_size));
    std::vector<float> keys(count * 128);
    for (float& k : keys) k = static_cast<float>(rng.normal() * 3);
    ASSERT_TRUE(cache->write_keys(pages.data(), 20, 9, keys.data(), count).ok());
    const IndexerPageLayout layout{page_size};
    for (int64_t i = 0; i < count; ++i) {
      const int64_t pos = 9 + i;
      const uint8_t* page = cache->data() + pages[pos / page_size] * layout.page_bytes();
      const int32_t o = static_cast<int32_t>(pos % page_size);
      uint8_t expect_codes[128];  // the scalar reference: the write path's vectorised quantiser matches it bitwise
      const float expect_scale = quantize_e4m3_block128_reference(keys.data() + i * 128, expect_codes);
      float scale;
      std::memcpy(&scale, page + layout.scale_offset(o), 4);
      ASSERT_EQ(std::bit_cast<uint32_t>(scale), std::bit_cast<uint32_t>(expect_scale));
      ASSERT_EQ(std::memcmp(page + layout.value_offset(o), expect_codes, 128), 0);
      uint8_t back[128];
      float back_scale;
      ASSERT_TRUE(cache->read_entry(pages.data(), 20, pos, back, &back_scale).ok());
      ASSERT_EQ(std::memcmp(back, expect_codes, 128), 0);
    }
  }
}

TEST(IndexerKeyCache, HadamardRotatesBeforeQuantising) {
  auto cache = IndexerKeyCache::create(64, 1);
  ASSERT_TRUE(cache.ok());
  std::vector<float> key(128, 0.0f);
  key[0] = 8.0f;  // H·e0/√128 = all entries 8/√128
  const int32_t page = 0;
  ASSERT_TRUE(cache->write_keys(&page, 1, 0, key.data(), 1, KeyQuantOptions{.hadamard = true}).ok());
  uint8_t codes[128];
  float scale;
  ASSERT_TRUE(cache->read_entry(&page, 1, 0, codes, &scale).ok());
  for (int d = 0; d < 128; ++d) EXPECT_NEAR(e4m3_to_float(codes[d]) * scale, 8.0f / std::sqrt(128.0f), 0.05f);
}

TEST(IndexerKeyCache, RejectsBadWrites) {
  auto cache = IndexerKeyCache::create(4, 2);
  ASSERT_TRUE(cache.ok());
  std::vector<int32_t> pages = {1, 0};
  std::vector<float> keys(128 * 3, 1.0f);
  EXPECT_EQ(cache->write_keys(pages.data(), 2, 6, keys.data(), 3).code(), StatusCode::kOutOfRange);  // needs page 2
  std::vector<int32_t> bad_pages = {1, 9};
  EXPECT_EQ(cache->write_keys(bad_pages.data(), 2, 3, keys.data(), 3).code(), StatusCode::kOutOfRange);
  keys[130] = std::numeric_limits<float>::quiet_NaN();
  const Status nan = cache->write_keys(pages.data(), 2, 0, keys.data(), 3);
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(nan.message().find("key 1 dim 2"), std::string::npos) << nan.message();
  EXPECT_EQ(IndexerKeyCache::create(0, 2).status().code(), StatusCode::kInvalidArgument);
  float bad_scale = 0.0f;
  uint8_t codes[128] = {};
  EXPECT_EQ(cache->write_quantized(pages.data(), 2, 0, codes, &bad_scale, 1).code(), StatusCode::kInvalidArgument);
}

TEST(QuantizeQueries, FoldsScalesIntoWeights) {
  CounterRng rng(stream_key(17));
  std::vector<float> q(2 * 64 * 128), w(2 * 64);
  for (float& v : q) v = static_cast<float>(rng.normal());
  for (float& v : w) v = static_cast<float>(rng.normal());
  std::vector<uint8_t> q8(q.size());
  std::vector<float> w8(w.size());
  ASSERT_TRUE(quantize_queries(q.data(), w.data(), 2, 64, q8.data(), w8.data()).ok());
  for (int i = 0; i < 128; ++i) {
    uint8_t codes[128];
    const float scale = quantize_e4m3_block128_reference(q.data() + i * 128, codes);
    EXPECT_EQ(std::memcmp(codes, q8.data() + i * 128, 128), 0);
    EXPECT_FLOAT_EQ(w8[i], w[i] * scale / std::sqrt(128.0f) / 8.0f);
  }
}

// The query quantiser on hostile rows — odd head counts, subnormal and all-equal heads, a head of
// zeros, huge magnitudes — bitwise against the scalar reference, with and without the rotation.
TEST(QuantizeQueries, MatchesTheScalarReferenceBitwise) {
  CounterRng rng(stream_key(23));
  for (int32_t heads : {1, 3, 64, 65}) {
    for (bool hadamard : {false, true}) {
      const int32_t rows = 3;
      const int64_t n = int64_t{rows} * heads;
      std::vector<float> q(n * 128), w(n);
      for (int64_t i = 0; i < n; ++i) {
        const int kind = static_cast<int>(i % 5);
        for (int d = 0; d < 128; ++d) {
          const double g = rng.normal();
          q[i * 128 + d] = kind == 0   ? static_cast<float>(g)
                           : kind == 1 ? static_cast<float>(g * 1e-41)  // subnormal
                           : kind == 2 ? 2.5f                           // all equal
                           : kind == 3 ? 0.0f
                                       : static_cast<float>(g * 1e37);
        }
        w[i] = static_cast<float>(rng.normal());
      }
      std::vector<uint8_t> q8(q.size());
      std::vector<float> w8(w.size());
      const KeyQuantOptions options{.hadamard = hadamard};
      ASSERT_TRUE(quantize_queries(q.data(), w.data(), rows, heads, q8.data(), w8.data(), options).ok());
      const float fold = 1.0f / std::sqrt(128.0f) / std::sqrt(static_cast<float>(heads));
      for (int64_t i = 0; i < n; ++i) {
        float v[128];
        std::memcpy(v, q.data() + i * 128, sizeof(v));
        if (hadamard) hadamard128(v);
        uint8_t codes[128];
        const float scale = quantize_e4m3_block128_reference(v, codes);
        ASSERT_EQ(std::memcmp(codes, q8.data() + i * 128, 128), 0) << heads << " heads, head " << i;
        ASSERT_EQ(std::bit_cast<uint32_t>(w8[i]), std::bit_cast<uint32_t>(w[i] * scale * fold)) << i;
      }
    }
  }
}

}  // namespace
}  // namespace spin
