// Sparse MLA attention: the latent cache byte layout (exact round trips), every fast
// implementation against the double-accumulation reference on hostile shapes (page sizes, topk
// with -1 holes and duplicates, head counts, both dtypes, extra window indices, empty rows),
// guard bytes, semantics (duplicates, order, extras), bitwise determinism across reruns, threads
// and head grouping, a loose check against full precision, and validation errors.
//
// Tolerance (fast vs reference): both see the same bf16 q and the same cache bytes, so the only
// differences are fp32 accumulation order and the exp2 polynomial. A score summed in fp32 from
// terms of size A = scale · Σ_d |q_d · k_d| is off by ≲ √576 · 2^-24 · A ≈ 1.5e-6 · A (random-walk
// rounding), which shifts each weight by that much relative and o by at most that times |v|:
//   max_d |o - o_ref| ≤ 1e-5 · max_d |o_ref| + 1e-6 · A_max · max_{s,d} |v_s[d]|   per (row, head)
//   |lse - lse_ref| ≤ 1e-5 · (1 + |lse_ref|) + 1e-6 · A_max
// (measured worst: 0.22 of the bound). Far tighter than FlashMLA's bf16-output 1e-3.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <numeric>
#include <string>
#include <vector>

#include "kernel_harness.h"
#include "spin/attention.h"
#include "spin/numerics.h"
#include "spin/rng.h"
#include "test_util.h"

namespace spin {
namespace {

using testing::GuardedBuffer;
using testing::kPoisonScore;

std::vector<AttentionImpl> fast_impls() { return testing::fast_impls<AttentionImpl>(); }

// A seeded problem: a scattered paged latent cache, bf16 queries, index lists with holes.
struct AttnCase {
  std::string name;
  LatentDtype dtype = LatentDtype::kFp8;
  int32_t page_size = 64;
  int32_t num_heads = 128;
  int32_t next_n = 1;
  int32_t topk = 0;
  int32_t n_extra = 0;
  std::vector<int64_t> entries;  // entries written per request
  double hole_rate = 0.1;        // share of -1 among indices
  double dup_rate = 0.05;        // share of indices that repeat an earlier one of the row
  double score_spread = 1.0;     // scales q: larger = peakier softmax
  std::vector<int64_t> empty_rows;  // rows whose every index is -1
  // Built:
  std::vector<uint8_t> cache;
  int32_t num_pages = 0;
  std::vector<int32_t> block_table;
  int32_t block_table_stride = 0;
  std::vector<uint16_t> q;
  std::vector<float> q_fp32;         // q before bf16 rounding
  std::vector<float> values_fp32;    // entries before encoding, [request][entry][576]
  std::vector<int64_t> value_offsets;
  std::vector<int32_t> indices;
  std::vector<int32_t> extra;
  std::vector<int64_t> visible;
  float softmax_scale = 0.0f;

  int32_t batch() const { return static_cast<int32_t>(entries.size()); }
  int64_t rows() const { return int64_t{batch()} * next_n; }

  SparseAttentionParams params(float* out, float* lse) const {
    SparseAttentionParams p;
    p.latent_cache = cache.data();
    p.dtype = dtype;
    p.page_size = page_size;
    p.num_pages = num_pages;
    p.block_table = block_table.data();
    p.block_table_stride = block_table_stride;
    p.batch = batch();
    p.next_n = next_n;
    p.visible_entries = visible.data();
    p.num_heads = num_heads;
    p.q = q.data();
    p.softmax_scale = softmax_scale;
    p.indices = indices.empty() ? nullptr : indices.data();
    p.topk = topk;
    p.extra_indices = extra.empty() ? nullptr : extra.data();
    p.n_extra = n_extra;
    p.out = out;
    p.lse = lse;
    return p;
  }
};

void fill_indices(CounterRng& rng, const AttnCase& c, int64_t n_entries, int32_t count, bool empty, int32_t* out) {
  for (int32_t i = 0; i < count; ++i) {
    if (empty || n_entries == 0 || rng.uniform() < c.hole_rate) {
      out[i] = -1;
    } else if (i > 0 && rng.uniform() < c.dup_rate) {
      out[i] = out[rng.below(static_cast<uint64_t>(i))];  // may copy a -1: still a hole
    } else {
      out[i] = static_cast<int32_t>(rng.below(static_cast<uint64_t>(n_entries)));
    }
  }
}

void build_case(AttnCase& c, uint64_t seed) {
  CounterRng rng(stream_key(seed, 0xA77E));
  const int32_t batch = c.batch();
  std::vector<int64_t> pages_per(batch);
  int64_t total_pages = 0;
  for (int32_t b = 0; b < batch; ++b) {
    pages_per[b] = (c.entries[b] + c.page_size - 1) / c.page_size;
    total_pages += pages_per[b];
  }
  c.num_pages = static_cast<int32_t>(total_pages + 3);  // a few pages no request owns
  std::vector<int32_t> perm(c.num_pages);
  std::iota(perm.begin(), perm.end(), 0);
  for (int32_t i = c.num_pages - 1; i > 0; --i) std::swap(perm[i], perm[rng.below(i + 1)]);
  c.block_table_stride = static_cast<int32_t>(std::max<int64_t>(1, *std::max_element(pages_per.begin(), pages_per.end())) + 1);
  c.block_table.assign(static_cast<size_t>(batch) * c.block_table_stride, -7);  // junk past the end
  auto cache = LatentCache::create(c.dtype, c.page_size, c.num_pages);
  ASSERT_TRUE(cache.ok()) << cache.status().to_string();
  // Random bytes everywhere first (bf16 NaNs included), so stale or unowned data would show.
  for (size_t i = 0; i < cache->size_bytes(); ++i) cache->data()[i] = static_cast<uint8_t>(rng.next_u64());
  int32_t next_page = 0;
  c.values_fp32.clear();
  c.value_offsets.assign(batch, 0);
  for (int32_t b = 0; b < batch; ++b) {
    for (int64_t i = 0; i < pages_per[b]; ++i) c.block_table[b * c.block_table_stride + i] = perm[next_page++];
    const int64_t n = c.entries[b];
    c.value_offsets[b] = static_cast<int64_t>(c.values_fp32.size()) / kMlaHeadDim;
    std::vector<float> values(static_cast<size_t>(n) * kMlaHeadDim);
    for (int64_t e = 0; e < n; ++e) {
      const double magnitude = std::exp(0.5 * rng.normal());  // varied tile scales
      for (int32_t d = 0; d < kMlaHeadDim; ++d) {
        values[e * kMlaHeadDim + d] = static_cast<float>(magnitude * rng.normal());
      }
    }
    c.values_fp32.insert(c.values_fp32.end(), values.begin(), values.end());
    ASSERT_TRUE(cache->write(c.block_table.data() + b * c.block_table_stride, pages_per[b], 0, values.data(), n).ok());
  }
  c.cache.assign(cache->data(), cache->data() + cache->size_bytes());
  const int64_t rows = c.rows();
  c.q_fp32.resize(static_cast<size_t>(rows) * c.num_heads * kMlaHeadDim);
  c.q.resize(c.q_fp32.size());
  for (size_t i = 0; i < c.q_fp32.size(); ++i) {
    c.q_fp32[i] = static_cast<float>(c.score_spread * rng.normal());
    c.q[i] = bf16_from_float(c.q_fp32[i]);
  }
  c.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kMlaHeadDim));
  c.indices.assign(static_cast<size_t>(rows) * c.topk, -1);
  c.extra.assign(static_cast<size_t>(rows) * c.n_extra, -1);
  c.visible.assign(rows, 0);
  for (int64_t row = 0; row < rows; ++row) {
    const int32_t b = static_cast<int32_t>(row / c.next_n);
    // Row j of next_n sees all but the last next_n-1-j entries (its own and earlier drafts).
    const int64_t visible = visible_entries(c.entries[b], c.next_n, static_cast<int32_t>(row % c.next_n));
    c.visible[row] = visible;
    const bool empty = std::find(c.empty_rows.begin(), c.empty_rows.end(), row) != c.empty_rows.end();
    fill_indices(rng, c, visible, c.topk, empty, c.indices.data() + row * c.topk);
    fill_indices(rng, c, visible, c.n_extra, empty, c.extra.data() + row * c.n_extra);
  }
}

struct AttnRun {
  std::vector<float> out;  // [rows, heads, 512]
  std::vector<float> lse;  // [rows, heads]
};
bool bitwise_equal(const AttnRun& a, const AttnRun& b) {
  return testing::bitwise_equal(a.out, b.out) && testing::bitwise_equal(a.lse, b.lse);
}

struct RunOptions {
  int threads = 0;
  int heads_per_task = 0;
  bool with_lse = true;             // false: lse is null and must stay untouched
  bool bf16_probabilities = true;   // AttentionOptions::bf16_probabilities
};

AttnRun run(const AttnCase& c, AttentionImpl impl, const RunOptions& o = {}) {
  const int64_t rows = c.rows();
  GuardedBuffer<float> out(static_cast<size_t>(rows * c.num_heads * kMlaLatentDim), kPoisonScore);
  GuardedBuffer<float> lse(static_cast<size_t>(rows * c.num_heads), kPoisonScore);
  const SparseAttentionParams p = c.params(out.data(), o.with_lse ? lse.data() : nullptr);
  AttentionOptions options;
  options.impl = impl;
  options.num_threads = o.threads;
  options.heads_per_task = o.heads_per_task;
  options.bf16_probabilities = o.bf16_probabilities;
  const Status status = sparse_attention(p, options);
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(out.guards_intact()) << c.name << " " << attention_impl_name(impl) << ": wrote outside out";
  EXPECT_TRUE(lse.guards_intact()) << c.name << " " << attention_impl_name(impl) << ": wrote outside lse";
  if (!o.with_lse) {
    EXPECT_TRUE(lse.untouched(0, lse.size())) << "lse written though null";
  }
  return {out.payload(), lse.payload()};
}

bool row_is_empty(const AttnCase& c, int64_t row) {
  for (int32_t i = 0; i < c.topk; ++i) {
    if (c.indices[row * c.topk + i] >= 0) return false;
  }
  for (int32_t i = 0; i < c.n_extra; ++i) {
    if (c.extra[row * c.n_extra + i] >= 0) return false;
  }
  return true;
}

// Scales of a row's error: the largest |v| over the latent dims of its selected entries, and per
// head the largest scale · Σ_d |q_d · k_d| (the size of the terms a score is summed from).
struct RowMagnitudes {
  double vmax = 0.0;
  std::vector<double> score_terms;  // [heads]
};
RowMagnitudes row_magnitudes(const AttnCase& c, int64_t row) {
  const int32_t b = static_cast<int32_t>(row / c.next_n);
  const LatentPageLayout layout{c.dtype, c.page_size};
  RowMagnitudes r;
  r.score_terms.assign(c.num_heads, 0.0);
  std::vector<float> k(kMlaHeadDim);
  auto visit = [&](int32_t s) {
    if (s < 0) return;
    const int32_t phys = c.block_table[b * c.block_table_stride + s / c.page_size];
    decode_latent_entry(c.dtype, c.cache.data() + phys * layout.page_bytes() + layout.entry_offset(s % c.page_size),
                        k.data());
    for (int32_t d = 0; d < kMlaLatentDim; ++d) r.vmax = std::max(r.vmax, std::fabs(double{k[d]}));
    for (int32_t h = 0; h < c.num_heads; ++h) {
      const uint16_t* q = c.q.data() + (row * c.num_heads + h) * kMlaHeadDim;
      float terms = 0.0f;
      for (int32_t d = 0; d < kMlaHeadDim; ++d) terms += std::fabs(bf16_to_float(q[d]) * k[d]);
      r.score_terms[h] = std::max(r.score_terms[h], double{c.softmax_scale} * terms);
    }
  };
  for (int32_t i = 0; i < c.topk; ++i) visit(c.indices[row * c.topk + i]);
  for (int32_t i = 0; i < c.n_extra; ++i) visit(c.extra[row * c.n_extra + i]);
  return r;
}

// The probabilities the fast run multiplied V with (AttentionOptions::bf16_probabilities).
enum class Probabilities { kFp32, kBf16 };

// Returns the worst error relative to the tolerance (≤ 1 passes).
// Probabilities::kBf16: the fast run rounded probabilities to bf16 (|Δo| ≤ 2^-9 · max|v| more, see
// attention.h; 2^-8 allows for the normaliser being summed from the unrounded probabilities).
double expect_matches_reference(const AttnCase& c, const AttnRun& fast, const AttnRun& ref, AttentionImpl impl,
                                const std::vector<RowMagnitudes>& mags, Probabilities probs = Probabilities::kFp32) {
  const bool bf16_p = probs == Probabilities::kBf16;
  double worst = 0.0;
  for (int64_t row = 0; row < c.rows(); ++row) {
    const bool empty = row_is_empty(c, row);
    const RowMagnitudes& mag = mags[row];
    for (int32_t h = 0; h < c.num_heads; ++h) {
      const size_t base = static_cast<size_t>((row * c.num_heads + h) * kMlaLatentDim);
      const float lse_f = fast.lse[row * c.num_heads + h];
      const float lse_r = ref.lse[row * c.num_heads + h];
      if (empty) {
        for (int32_t d = 0; d < kMlaLatentDim; ++d) {
          EXPECT_EQ(std::bit_cast<uint32_t>(fast.out[base + d]), 0u) << c.name << " empty row " << row << " must be +0";
          EXPECT_EQ(std::bit_cast<uint32_t>(ref.out[base + d]), 0u) << c.name << " reference empty row " << row;
        }
        EXPECT_TRUE(std::isinf(lse_f) && lse_f < 0) << c.name << " row " << row << " lse " << lse_f;
        EXPECT_TRUE(std::isinf(lse_r) && lse_r < 0) << c.name << " row " << row << " reference lse " << lse_r;
        continue;
      }
      double ref_max = 0.0;
      for (int32_t d = 0; d < kMlaLatentDim; ++d) ref_max = std::max(ref_max, std::fabs(double{ref.out[base + d]}));
      const double tolerance =
          1e-5 * ref_max + 1e-6 * mag.score_terms[h] * mag.vmax + (bf16_p ? 0x1p-8 * mag.vmax : 0.0) + 1e-30;
      for (int32_t d = 0; d < kMlaLatentDim; ++d) {
        const double err = std::fabs(double{fast.out[base + d]} - ref.out[base + d]);
        worst = std::max(worst, err / tolerance);
        if (!(err <= tolerance)) {
          ADD_FAILURE() << c.name << " " << attention_impl_name(impl) << " row " << row << " head " << h << " dim " << d
                        << ": " << fast.out[base + d] << " vs " << ref.out[base + d] << " (tolerance " << tolerance
                        << ")";
          return worst;
        }
      }
      const double lse_tol = 1e-5 * (1.0 + std::fabs(double{lse_r})) + 1e-6 * mag.score_terms[h];
      worst = std::max(worst, std::fabs(double{lse_f} - lse_r) / lse_tol);
      if (!(std::fabs(double{lse_f} - lse_r) <= lse_tol)) {
        ADD_FAILURE() << c.name << " " << attention_impl_name(impl) << " row " << row << " head " << h << " lse "
                      << lse_f << " vs " << lse_r;
        return worst;
      }
    }
  }
  return worst;
}

// Hostile shapes, cycled so every value of each dimension meets several of the others.
std::vector<AttnCase> hostile_cases() {
  std::vector<AttnCase> cases;
  CounterRng rng(stream_key(2025));
  const int32_t page_sizes[] = {1, 5, 64, 69};
  const int32_t topks[] = {0, 1, 7, 2048};
  const int32_t head_counts[] = {1, 7, 64, 128};
  const int32_t extras[] = {0, 5, 128};
  int id = 0;
  for (int32_t topk : topks) {
    for (int32_t page_size : page_sizes) {
      AttnCase c;
      c.topk = topk;
      c.page_size = page_size;
      c.num_heads = head_counts[(id + id / 4) % 4];
      c.dtype = id % 2 == 0 ? LatentDtype::kFp8 : LatentDtype::kBf16;
      c.n_extra = extras[id % 3];
      if (topk == 0 && c.n_extra == 0) c.n_extra = 5;  // still something to attend for most rows
      c.next_n = 1 + static_cast<int32_t>(id % 3);
      // topk 2048 with 128 heads costs the reference ~0.3 s a row: keep those cases small.
      const bool big = topk == 2048;
      const int32_t batch = big ? 1 : 1 + static_cast<int32_t>(rng.below(3));
      const int64_t mean = big ? 3000 : (page_size == 1 ? 40 : 300);
      for (int32_t b = 0; b < batch; ++b) {
        c.entries.push_back(static_cast<int64_t>((0.7 + 0.6 * rng.uniform()) * static_cast<double>(mean)));
      }
      if (id % 4 == 1) c.entries.push_back(0);  // a request with nothing cached: its rows are empty
      // A short request (fewer entries than topk) whose last row selects nothing.
      c.entries.push_back(1 + static_cast<int64_t>(rng.below(20)));
      c.empty_rows.push_back(c.rows() - 1);
      c.hole_rate = id % 3 == 0 ? 0.3 : 0.05;
      c.dup_rate = id % 2 == 0 ? 0.1 : 0.0;
      c.score_spread = id % 4 == 2 ? 4.0 : 1.0;  // some peaky rows
      c.name = std::string(latent_dtype_name(c.dtype)) + "_page" + std::to_string(page_size) + "_topk" +
               std::to_string(topk) + "_extra" + std::to_string(c.n_extra) + "_heads" + std::to_string(c.num_heads) +
               "_rows" + std::to_string(c.next_n) + "_batch" + std::to_string(c.entries.size());
      cases.push_back(std::move(c));
      ++id;
    }
  }
  // The production shapes: V3.2 (128 heads, topk 2048, fp8) and V4-Flash (64 heads, 512 + 128 window).
  AttnCase v32;
  v32.name = "v32_fp8_heads128_topk2048";
  v32.num_heads = 128;
  v32.topk = 2048;
  v32.entries = {5000};
  v32.hole_rate = 0.02;
  cases.push_back(v32);
  AttnCase v4;
  v4.name = "v4flash_bf16_heads64_topk512_extra128";
  v4.dtype = LatentDtype::kBf16;
  v4.num_heads = 64;
  v4.topk = 512;
  v4.n_extra = 128;
  v4.next_n = 2;
  v4.entries = {1500, 700};
  cases.push_back(v4);
  return cases;
}

TEST(AttentionKernel, FastMatchesReferenceOnHostileShapes) {
  int seed = 0;
  double worst = 0.0;
  for (AttnCase& c : hostile_cases()) {
    SCOPED_TRACE(c.name);
    build_case(c, ++seed);
    std::vector<AttnRun> fast;  // fp32 P·V: the tight bound
    for (AttentionImpl impl : fast_impls()) fast.push_back(run(c, impl, {.bf16_probabilities = false}));
    std::vector<AttnRun> fast_bf16p;  // bf16 P·V (the default): the tight bound + 2^-8 · max|v|
    for (AttentionImpl impl : fast_impls()) fast_bf16p.push_back(run(c, impl));
    const AttnRun ref = run(c, AttentionImpl::kReference);  // after the fast runs: stale memory cannot hide a bug
    std::vector<RowMagnitudes> mags;
    for (int64_t row = 0; row < c.rows(); ++row) mags.push_back(row_magnitudes(c, row));
    for (size_t i = 0; i < fast.size(); ++i) {
      worst = std::max(worst, expect_matches_reference(c, fast[i], ref, fast_impls()[i], mags));
      expect_matches_reference(c, fast_bf16p[i], ref, fast_impls()[i], mags, Probabilities::kBf16);
    }
  }
  std::printf("worst error / tolerance over all cases: %.3g\n", worst);
}

// An entry listed twice is two softmax terms; order and -1 holes change nothing but rounding;
// extra indices are the same as appending them to the top-k list (bitwise: same entry order).
TEST(AttentionKernel, DuplicatesHolesOrderAndExtras) {
  AttnCase c;
  c.name = "semantics";
  c.num_heads = 7;
  c.page_size = 5;
  c.entries = {40};
  c.dtype = LatentDtype::kBf16;
  c.topk = 3;
  build_case(c, 77);
  c.visible = {40};
  auto run_with = [&](std::vector<int32_t> indices, std::vector<int32_t> extra, AttentionImpl impl) {
    AttnCase k = c;
    k.topk = static_cast<int32_t>(indices.size());
    k.n_extra = static_cast<int32_t>(extra.size());
    k.indices = std::move(indices);
    k.extra = std::move(extra);
    // Semantics, not precision: fp32 P·V (the hostile-shape test covers bf16 P against the reference).
    return run(k, impl, {.bf16_probabilities = false});
  };
  for (AttentionImpl impl : {AttentionImpl::kReference, AttentionImpl::kPortable, attention_best_impl()}) {
    SCOPED_TRACE(attention_impl_name(impl));
    // Duplicates: {a, a, b} weighs a twice — compare with the closed form from the reference scores.
    const AttnRun dup = run_with({3, 3, 17}, {}, impl);
    const AttnRun single_a = run_with({3}, {}, impl);
    const AttnRun single_b = run_with({17}, {}, impl);
    const AttnRun pair = run_with({3, 17}, {}, impl);
    for (int32_t h = 0; h < c.num_heads; ++h) {
      // lse of {a} and {b} are the scores themselves; {a, a, b}: ln(2e^a + e^b).
      const double sa = single_a.lse[h], sb = single_b.lse[h];
      const double expected_lse = std::log(2 * std::exp(sa) + std::exp(sb));
      const double pair_lse = std::log(std::exp(sa) + std::exp(sb));
      EXPECT_NEAR(dup.lse[h], expected_lse, 1e-5 * (1 + std::fabs(expected_lse)));
      EXPECT_NEAR(pair.lse[h], pair_lse, 1e-5 * (1 + std::fabs(pair_lse)));
      EXPECT_GT(expected_lse - pair_lse, 1e-3) << "the data must tell a duplicate from a deduplicated pair";
      const double wa = 2 * std::exp(sa - expected_lse), wb = std::exp(sb - expected_lse);
      for (int32_t d = 0; d < kMlaLatentDim; ++d) {
        const double expected = wa * single_a.out[h * kMlaLatentDim + d] + wb * single_b.out[h * kMlaLatentDim + d];
        EXPECT_NEAR(dup.out[h * kMlaLatentDim + d], expected, 1e-4 * (1 + std::fabs(expected)));
      }
    }
    // Holes are skipped, extras are appended: bitwise equal to the compacted, concatenated list.
    const AttnRun compact = run_with({3, 17, 25, 9, 30}, {}, impl);
    const AttnRun holes = run_with({-1, 3, -1, 17, 25, -1}, {-1, 9, 30, -1}, impl);
    EXPECT_EQ(std::memcmp(compact.out.data(), holes.out.data(), compact.out.size() * 4), 0);
    EXPECT_EQ(std::memcmp(compact.lse.data(), holes.lse.data(), compact.lse.size() * 4), 0);
    // Order only changes rounding.
    const AttnRun reversed = run_with({30, 9, 25, 17, 3}, {}, impl);
    for (size_t i = 0; i < compact.out.size(); ++i) EXPECT_NEAR(compact.out[i], reversed.out[i], 1e-5);
    // Without lse the output is the same and lse stays untouched (checked inside run()).
    AttnCase k = c;
    k.indices = {3, 17, 25, 9, 30};
    k.topk = 5;
    const AttnRun no_lse = run(k, impl, {.with_lse = false, .bf16_probabilities = false});
    EXPECT_EQ(std::memcmp(compact.out.data(), no_lse.out.data(), compact.out.size() * 4), 0);
  }
}

TEST(AttentionKernel, BitwiseDeterministicAcrossRerunsThreadsAndHeadGroups) {
  AttnCase c;
  c.name = "determinism";
  c.num_heads = 128;
  c.topk = 300;
  c.n_extra = 20;
  c.next_n = 2;
  c.entries = {2000, 400};
  c.empty_rows = {3};
  build_case(c, 99);
  for (AttentionImpl impl : fast_impls()) {
    const AttnRun first = testing::expect_deterministic_across_threads(
        [&](int threads) { return run(c, impl, {.threads = threads}); }, attention_impl_name(impl));
    // Head grouping (every SIMD kernel splits a row's heads into tasks) moves heads between
    // threads and micro-tiles, never changes their arithmetic.
    if (impl == AttentionImpl::kPortable) continue;
    for (int group : {16, 32, 64, 128}) {
      for (int threads : {1, 2, 3}) {
        const AttnRun again = run(c, impl, {.threads = threads, .heads_per_task = group});
        ASSERT_EQ(std::memcmp(first.out.data(), again.out.data(), first.out.size() * 4), 0)
            << "heads_per_task " << group << " threads " << threads;
        ASSERT_EQ(std::memcmp(first.lse.data(), again.lse.data(), first.lse.size() * 4), 0);
      }
    }
  }
  // A row's result does not depend on the rest of the batch: run request 1 alone.
  AttnCase alone = c;
  alone.entries = {400};
  build_case(alone, 99);  // different data; copy request 1's rows into it instead
  alone.cache = c.cache;
  alone.num_pages = c.num_pages;
  alone.block_table.assign(c.block_table.begin() + c.block_table_stride, c.block_table.end());
  alone.block_table_stride = c.block_table_stride;
  const size_t q_row = static_cast<size_t>(c.num_heads) * kMlaHeadDim;
  alone.q.assign(c.q.begin() + 2 * q_row, c.q.end());
  alone.indices.assign(c.indices.begin() + 2 * c.topk, c.indices.end());
  alone.extra.assign(c.extra.begin() + 2 * c.n_extra, c.extra.end());
  alone.visible.assign(c.visible.begin() + 2, c.visible.end());
  for (AttentionImpl impl : fast_impls()) {
    const AttnRun both = run(c, impl);
    const AttnRun one = run(alone, impl);
    const size_t o_row = static_cast<size_t>(c.num_heads) * kMlaLatentDim;
    EXPECT_EQ(std::memcmp(both.out.data() + 2 * o_row, one.out.data(), 2 * o_row * 4), 0) << attention_impl_name(impl);
  }
}

// The quantised path against full precision: fp32 q and unquantised entries in double vs the
// fast kernel on bf16 q and the fp8 / bf16 cache (loose: relative L2 error of o per row).
TEST(AttentionKernel, QuantisedOutputTracksFullPrecision) {
  for (LatentDtype dtype : {LatentDtype::kFp8, LatentDtype::kBf16}) {
    AttnCase c;
    c.name = std::string("full-precision-") + latent_dtype_name(dtype);
    c.dtype = dtype;
    c.num_heads = 16;
    c.topk = 256;
    c.entries = {1000};
    c.hole_rate = 0.0;
    c.dup_rate = 0.0;
    c.score_spread = 2.0;
    build_case(c, 5);
    const AttnRun fast = run(c, attention_best_impl());
    double err2 = 0, norm2 = 0;
    for (int32_t h = 0; h < c.num_heads; ++h) {
      std::vector<double> s(c.topk);
      double m = -1e300;
      for (int32_t i = 0; i < c.topk; ++i) {
        const float* v = c.values_fp32.data() + static_cast<size_t>(c.indices[i]) * kMlaHeadDim;
        double dot = 0;
        for (int32_t d = 0; d < kMlaHeadDim; ++d) dot += double{c.q_fp32[h * kMlaHeadDim + d]} * v[d];
        s[i] = c.softmax_scale * dot;
        m = std::max(m, s[i]);
      }
      double l = 0;
      std::vector<double> o(kMlaLatentDim, 0.0);
      for (int32_t i = 0; i < c.topk; ++i) {
        const double w = std::exp(s[i] - m);
        l += w;
        const float* v = c.values_fp32.data() + static_cast<size_t>(c.indices[i]) * kMlaHeadDim;
        for (int32_t d = 0; d < kMlaLatentDim; ++d) o[d] += w * v[d];
      }
      for (int32_t d = 0; d < kMlaLatentDim; ++d) {
        const double exact = o[d] / l;
        err2 += (fast.out[h * kMlaLatentDim + d] - exact) * (fast.out[h * kMlaLatentDim + d] - exact);
        norm2 += exact * exact;
      }
    }
    const double rel = std::sqrt(err2 / norm2);
    EXPECT_LT(rel, dtype == LatentDtype::kFp8 ? 0.08 : 0.02) << c.name;
    std::printf("%s: relative L2 error vs full precision %.4f\n", c.name.c_str(), rel);
  }
}

// ---------------------------------------------------------------------------------------------
// Latent cache layout

TEST(LatentCache, Fp8BytesAreTheDocumentedLayoutAndRoundTripExactly) {
  CounterRng rng(stream_key(11));
  const int32_t page_size = 5;
  auto cache = LatentCache::create(LatentDtype::kFp8, page_size, 4);
  ASSERT_TRUE(cache.ok());
  EXPECT_EQ(cache->size_bytes(), size_t{4 * 5 * 656});
  EXPECT_EQ(reinterpret_cast<uintptr_t>(cache->data()) % 64, 0u);
  const std::vector<int32_t> pages = {2, 0, 3};
  const int64_t count = 12;  // positions 1..12 span logical pages 0..2
  std::vector<float> values(static_cast<size_t>(count) * kMlaHeadDim);
  for (int64_t e = 0; e < count; ++e) {
    for (int32_t d = 0; d < kMlaHeadDim; ++d) {
      // Tiles of wildly different magnitude, one tile all zeros (amax floor), tiny values.
      const int32_t tile = d / kMlaTileDim;
      const double mag = tile == 0 ? 1e-3 : (tile == 1 ? 300.0 : (tile == 2 ? 0.0 : 1e-6 * static_cast<double>(e + 1)));
      values[e * kMlaHeadDim + d] = static_cast<float>(mag * rng.normal());
    }
  }
  ASSERT_TRUE(cache->write(pages.data(), 3, 1, values.data(), count).ok());
  const LatentPageLayout layout = cache->layout();
  for (int64_t e = 0; e < count; ++e) {
    const int64_t pos = 1 + e;
    const uint8_t* entry = cache->data() + pages[pos / page_size] * layout.page_bytes() + (pos % page_size) * 656;
    const float* x = values.data() + e * kMlaHeadDim;
    for (int32_t t = 0; t < kMlaNumTiles; ++t) {
      uint8_t codes[kMlaTileDim];
      const float scale = quantize_e4m3_block128(x + t * kMlaTileDim, codes);
      float stored;
      std::memcpy(&stored, entry + 512 + 4 * t, 4);
      EXPECT_EQ(stored, scale) << "entry " << e << " tile " << t;
      EXPECT_EQ(std::memcmp(entry + t * kMlaTileDim, codes, kMlaTileDim), 0) << "entry " << e << " tile " << t;
      EXPECT_EQ(std::log2(scale), std::round(std::log2(scale))) << "UE8M0 scales are powers of two";
    }
    for (int32_t j = 0; j < kMlaRopeDim; ++j) {
      uint16_t bits;
      std::memcpy(&bits, entry + 528 + 2 * j, 2);
      EXPECT_EQ(bits, bf16_from_float(x[kMlaLatentDim + j]));
    }
    // Decode is exact (e4m3 · 2^k in fp32), and re-encoding the decoded values reproduces the bytes.
    std::vector<float> decoded(kMlaHeadDim);
    ASSERT_TRUE(cache->read_entry(pages.data(), 3, pos, decoded.data()).ok());
    for (int32_t d = 0; d < kMlaLatentDim; ++d) {
      float scale;
      std::memcpy(&scale, entry + 512 + 4 * (d / kMlaTileDim), 4);
      EXPECT_EQ(double{decoded[d]}, double{e4m3_to_float(entry[d])} * scale);
      EXPECT_EQ(bf16_to_float(bf16_from_float(decoded[d])), decoded[d]) << "fp8 · 2^k must be exact in bf16";
    }
    std::vector<uint8_t> again(656);
    encode_latent_entry(LatentDtype::kFp8, decoded.data(), again.data());
    EXPECT_EQ(std::memcmp(again.data(), entry, 656), 0) << "entry " << e;
  }
  // Untouched: position 0 (logical page 0, offset 0) and physical page 1.
  std::vector<uint8_t> zeros(656, 0);
  EXPECT_EQ(std::memcmp(cache->data() + 2 * layout.page_bytes(), zeros.data(), 656), 0);
  for (int64_t i = 0; i < layout.page_bytes(); ++i) ASSERT_EQ(cache->data()[layout.page_bytes() + i], 0);
}

TEST(LatentCache, Bf16BytesAreRoundedValues) {
  auto cache = LatentCache::create(LatentDtype::kBf16, 1, 2);
  ASSERT_TRUE(cache.ok());
  std::vector<float> values(kMlaHeadDim);
  for (int32_t d = 0; d < kMlaHeadDim; ++d) values[d] = 0.1f * static_cast<float>(d) - 20.0f;
  const int32_t pages[] = {1};
  ASSERT_TRUE(cache->write(pages, 1, 0, values.data(), 1).ok());
  std::vector<float> back(kMlaHeadDim);
  ASSERT_TRUE(cache->read_entry(pages, 1, 0, back.data()).ok());
  for (int32_t d = 0; d < kMlaHeadDim; ++d) {
    uint16_t bits;
    std::memcpy(&bits, cache->data() + 1152 + 2 * d, 2);
    EXPECT_EQ(bits, bf16_from_float(values[d]));
    EXPECT_EQ(back[d], bf16_to_float(bits));
  }
}

TEST(LatentCache, WriteRejectsBadArgumentsAndWritesNothing) {
  auto cache = LatentCache::create(LatentDtype::kFp8, 4, 2);
  ASSERT_TRUE(cache.ok());
  std::vector<float> values(3 * kMlaHeadDim, 1.0f);
  const int32_t pages[] = {1, 0};
  EXPECT_EQ(cache->write(pages, 2, 6, values.data(), 3).code(), StatusCode::kOutOfRange);  // needs page 2
  const int32_t bad_pages[] = {1, 5};
  EXPECT_EQ(cache->write(bad_pages, 2, 2, values.data(), 3).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(cache->write(nullptr, 2, 0, values.data(), 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->write(pages, 2, -1, values.data(), 1).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(cache->write(pages, 2, 0, values.data(), -1).code(), StatusCode::kInvalidArgument);
  values[600] = std::numeric_limits<float>::infinity();
  const Status s = cache->write(pages, 2, 0, values.data(), 3);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("entry 1 dim 24"), std::string::npos) << s.message();
  for (size_t i = 0; i < cache->size_bytes(); ++i) ASSERT_EQ(cache->data()[i], 0) << "a failed write wrote";
  EXPECT_FALSE(LatentCache::create(LatentDtype::kFp8, 0, 1).ok());
  EXPECT_FALSE(LatentCache::create(static_cast<LatentDtype>(7), 4, 1).ok());
  float out[kMlaHeadDim];
  EXPECT_EQ(cache->read_entry(pages, 2, 8, out).code(), StatusCode::kOutOfRange);
}

// ---------------------------------------------------------------------------------------------
// Validation

TEST(AttentionValidation, RejectsBadArgumentsWithClearErrors) {
  AttnCase c;
  c.num_heads = 16;
  c.topk = 8;
  c.n_extra = 2;
  c.next_n = 2;
  c.entries = {100, 30};
  build_case(c, 3);
  std::vector<float> out(static_cast<size_t>(c.rows()) * c.num_heads * kMlaLatentDim);
  auto expect_error = [&](const SparseAttentionParams& p, StatusCode code, const std::string& needle) {
    testing::expect_status(sparse_attention(p), code, needle);
  };
  const SparseAttentionParams good = c.params(out.data(), nullptr);
  ASSERT_TRUE(sparse_attention(good).ok());
  SparseAttentionParams p = good;
  p.num_heads = 0;
  expect_error(p, StatusCode::kInvalidArgument, "num_heads");
  p.num_heads = 129;
  expect_error(p, StatusCode::kInvalidArgument, "num_heads");
  p = good;
  p.topk = -1;
  expect_error(p, StatusCode::kInvalidArgument, "topk");
  p = good;
  p.n_extra = -3;
  expect_error(p, StatusCode::kInvalidArgument, "n_extra");
  p = good;
  p.page_size = 0;
  expect_error(p, StatusCode::kInvalidArgument, "page_size");
  p = good;
  p.next_n = 5;
  expect_error(p, StatusCode::kInvalidArgument, "next_n");
  p = good;
  p.dtype = static_cast<LatentDtype>(3);
  expect_error(p, StatusCode::kInvalidArgument, "dtype");
  p = good;
  p.softmax_scale = std::numeric_limits<float>::quiet_NaN();
  expect_error(p, StatusCode::kInvalidArgument, "softmax_scale");
  p = good;
  p.q = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "q is null");
  p = good;
  p.out = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "out is null");
  p = good;
  p.indices = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "indices is null");
  p = good;
  p.extra_indices = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "extra_indices is null");
  p = good;
  p.block_table = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "block_table is null");
  p = good;
  p.latent_cache = nullptr;
  expect_error(p, StatusCode::kInvalidArgument, "latent_cache is null");
  {
    std::vector<uint16_t> q = c.q;
    q[static_cast<size_t>(3) * c.num_heads * kMlaHeadDim + 5 * kMlaHeadDim + 7] = 0x7FC0;  // NaN
    p = good;
    p.q = q.data();
    expect_error(p, StatusCode::kInvalidArgument, "q[3][5][7]");
  }
  {
    std::vector<int32_t> idx = c.indices;
    idx[1 * c.topk + 4] = -2;
    p = good;
    p.indices = idx.data();
    expect_error(p, StatusCode::kInvalidArgument, "indices[1][4] = -2");
    idx[1 * c.topk + 4] = static_cast<int32_t>(c.visible[1]);  // one past what row 1 sees
    expect_error(p, StatusCode::kOutOfRange, "sees only entries");
    p.visible_entries = nullptr;  // then only the page table bounds it: entry 99 is still mapped
    EXPECT_TRUE(sparse_attention(p).ok());
    idx[1 * c.topk + 4] = c.block_table_stride * c.page_size;
    expect_error(p, StatusCode::kOutOfRange, "block_table_stride");
  }
  {
    std::vector<int32_t> extra = c.extra;
    extra[2 * c.n_extra + 1] = 30;  // request 1 (rows 2, 3) has 30 entries: row 2 sees 29
    p = good;
    p.extra_indices = extra.data();
    expect_error(p, StatusCode::kOutOfRange, "extra_indices[2][1] = 30");
  }
  {
    std::vector<int32_t> table = c.block_table;
    std::vector<int32_t> idx = c.indices;
    idx[0] = 0;
    table[0] = c.num_pages;
    p = good;
    p.indices = idx.data();
    p.block_table = table.data();
    expect_error(p, StatusCode::kOutOfRange, "block_table[0][0]");
  }
  {
    std::vector<int64_t> visible = c.visible;
    visible[2] = -1;
    p = good;
    p.visible_entries = visible.data();
    expect_error(p, StatusCode::kInvalidArgument, "visible_entries[2]");
  }
  AttentionOptions options;
  options.heads_per_task = 48;
  EXPECT_EQ(sparse_attention(good, options).code(), StatusCode::kInvalidArgument);
  options = {};
  options.num_threads = -1;
  EXPECT_EQ(sparse_attention(good, options).code(), StatusCode::kInvalidArgument);
  // Nothing to do is fine, with or without pointers.
  SparseAttentionParams empty;
  empty.softmax_scale = 1.0f;
  EXPECT_TRUE(sparse_attention(empty).ok());
}

}  // namespace
}  // namespace spin
