// Indexer kernels: every fast implementation against the double-accumulation reference on hostile
// shapes; masks, -inf positions and guard bytes exact; reruns and thread counts bitwise identical.
#include <gtest/gtest.h>

#include <cstdio>
#include <random>
#include <cstring>
#include <cmath>
#include <cstdlib>
#include <string>

#include "kernel_harness.h"
#include "spin/attention.h"
#include "spin/cpu.h"
#include "spin/memory.h"
#include "spin/numerics.h"
#include "test_util.h"

#if defined(__aarch64__) && defined(__linux__)
#include <asm/hwcap.h>
#include <sys/auxv.h>
#endif

namespace spin {
namespace {

using testing::fast_impls;
using testing::GuardedBuffer;
using testing::IndexerCase;

struct ScoreRun {
  std::vector<float> logits;  // rows × stride
  int64_t stride = 0;
  int64_t cols = 0;
};
bool bitwise_equal(const ScoreRun& a, const ScoreRun& b) { return testing::bitwise_equal(a.logits, b.logits); }

// A block mask in IndexerParams' CSR form.
struct BlockMask {
  std::vector<int32_t> ids;
  std::vector<int32_t> offsets;  // [batch + 1]
};

struct RunOptions {
  const BlockMask* mask = nullptr;  // null: score every visible entry
  int threads = 0;
};

ScoreRun run(const IndexerCase& c, IndexerImpl impl, const RunOptions& o = {}) {
  const int64_t rows = static_cast<int64_t>(c.context_lens.size()) * c.next_n;
  const int64_t stride = std::max<int64_t>(c.max_entries, 1) + 3;  // stride > cols: the gap must stay poisoned
  GuardedBuffer<float> out(static_cast<size_t>(rows * stride), testing::kPoisonScore);
  IndexerParams p = c.params(out.data(), stride);
  if (o.mask != nullptr) {
    p.block_ids = o.mask->ids.data();
    p.block_offsets = o.mask->offsets.data();
  }
  IndexerOptions options;
  options.impl = impl;
  options.num_threads = o.threads;
  const Status status = indexer_scores(p, options);
  EXPECT_TRUE(status.ok()) << status.to_string();
  EXPECT_TRUE(out.guards_intact()) << c.name << " " << indexer_impl_name(impl) << ": wrote outside the buffer";
  for (int64_t r = 0; r < rows; ++r) {
    EXPECT_TRUE(out.untouched(static_cast<size_t>(r * stride + p.logits_cols), static_cast<size_t>(stride - p.logits_cols)))
        << c.name << ": wrote past logits_cols in row " << r;
  }
  return {out.payload(), stride, p.logits_cols};
}

// |Σ| of the absolute terms of I[r,s]: the scale against which summation-order error is judged.
double magnitude(const IndexerCase& c, int64_t row, int32_t b, int64_t s) {
  const IndexerPageLayout layout{c.page_size};
  const int32_t phys = c.block_table[b * c.block_table_stride + s / c.page_size];
  const uint8_t* page = c.cache.data() + phys * layout.page_bytes();
  const int32_t o = static_cast<int32_t>(s % c.page_size);
  float scale;
  std::memcpy(&scale, page + layout.scale_offset(o), 4);
  double total = 0;
  for (int32_t h = 0; h < c.num_heads; ++h) {
    double dot = 0;
    for (int d = 0; d < kIndexerHeadDim; ++d) {
      dot += std::fabs(double{e4m3_to_float(c.q[(row * c.num_heads + h) * kIndexerHeadDim + d])} *
                       e4m3_to_float(page[layout.value_offset(o) + d]));
    }
    total += std::fabs(c.weights[row * c.num_heads + h]) * dot;
  }
  return scale * total;
}

// Adds the finite entries it compared to *checked (the callers check that a test compared
// something; an ASSERT needs a void function).
void expect_matches_reference(const IndexerCase& c, const ScoreRun& fast, const ScoreRun& ref, IndexerImpl impl,
                              int64_t* checked) {
  const int32_t batch = static_cast<int32_t>(c.context_lens.size());
  for (int32_t b = 0; b < batch; ++b) {
    for (int32_t r = 0; r < c.next_n; ++r) {
      const int64_t row = int64_t{b} * c.next_n + r;
      for (int64_t s = 0; s < fast.cols; ++s) {
        const float f = fast.logits[row * fast.stride + s];
        const float e = ref.logits[row * ref.stride + s];
        if (std::isinf(e)) {
          ASSERT_TRUE(std::isinf(f) && f < 0) << c.name << " " << indexer_impl_name(impl) << " row " << row
                                              << " entry " << s << ": expected -inf, got " << f;
          continue;
        }
        ASSERT_TRUE(std::isfinite(f)) << c.name << " row " << row << " entry " << s;
        // fp32 accumulation in another order: error ≤ ~n·2^-24 of the absolute-term sum.
        const double tolerance = 2e-5 * magnitude(c, row, b, s) + 1e-30;
        ASSERT_LE(std::fabs(double{f} - e), tolerance)
            << c.name << " " << indexer_impl_name(impl) << " row " << row << " entry " << s;
        ++*checked;
      }
    }
  }
}

// Hostile shapes: page sizes 1/5/61/64/69, empty and tiny contexts, ragged lengths, MTP rows,
// V4 compression, head counts that are not multiples of 16.
std::vector<IndexerCase> hostile_cases() {
  std::vector<IndexerCase> cases;
  CounterRng rng(stream_key(2024));
  const int32_t page_sizes[] = {1, 5, 61, 64, 69};
  int id = 0;
  for (int32_t page_size : page_sizes) {
    for (int32_t next_n = 1; next_n <= 4; ++next_n) {
      IndexerCase c;
      c.page_size = page_size;
      c.next_n = next_n;
      c.num_heads = (id % 3 == 0) ? 64 : (id % 3 == 1 ? 7 : 100);
      c.compress_ratio = (id % 4 == 3) ? 4 : 1;
      c.block_pages = 1 + static_cast<int32_t>(id % 3);
      const int64_t mean = page_size == 1 ? 40 : 300;
      const int32_t batch = 1 + static_cast<int32_t>(rng.below(4));
      for (int32_t b = 0; b < batch; ++b) {
        const double ragged = 0.7 + 0.6 * rng.uniform();
        c.context_lens.push_back(static_cast<int64_t>(ragged * static_cast<double>(mean)) * c.compress_ratio);
      }
      if (id % 5 == 0) c.context_lens.push_back(0);                 // nothing cached
      if (id % 5 == 1) c.context_lens.push_back(next_n - 1);        // rows that see nothing
      if (id % 5 == 2) c.context_lens.push_back(next_n);            // first row sees one entry
      c.name = "page" + std::to_string(page_size) + "_rows" + std::to_string(next_n) + "_heads" +
               std::to_string(c.num_heads) + "_ratio" + std::to_string(c.compress_ratio) + "_batch" +
               std::to_string(c.context_lens.size());
      cases.push_back(std::move(c));
      ++id;
    }
  }
  return cases;
}

TEST(IndexerKernel, FastMatchesReferenceOnHostileShapes) {
  int seed = 0;
  int64_t checked = 0;
  for (IndexerCase& c : hostile_cases()) {
    SCOPED_TRACE(c.name);
    testing::build_case(c, ++seed);
    testing::for_each_fast_impl_against_reference<IndexerImpl>(
        [&](IndexerImpl impl) { return run(c, impl); },
        [&](IndexerImpl impl, const ScoreRun& fast, const ScoreRun& ref) {
          expect_matches_reference(c, fast, ref, impl, &checked);
        });
  }
  EXPECT_GT(checked, 0) << "no finite entry was compared";
}

// Random block masks: the masked run equals the full run bitwise on selected entries, -inf elsewhere.
TEST(IndexerKernel, MaskedEqualsFullOnSelectedBlocks) {
  int seed = 100;
  int64_t checked = 0;
  for (IndexerCase& c : hostile_cases()) {
    SCOPED_TRACE(c.name);
    testing::build_case(c, ++seed);
    CounterRng rng(stream_key(seed, 7));
    const int32_t batch = static_cast<int32_t>(c.context_lens.size());
    const int64_t block_entries = int64_t{c.block_pages} * c.page_size;
    BlockMask mask;
    mask.offsets = {0};
    std::vector<std::vector<char>> keep(batch);
    for (int32_t b = 0; b < batch; ++b) {
      const int64_t n_blocks = (c.entries(b) + block_entries - 1) / block_entries;
      keep[b].assign(n_blocks, 0);
      for (int64_t blk = 0; blk < n_blocks; ++blk) {
        if (rng.uniform() < 0.5) {
          mask.ids.push_back(static_cast<int32_t>(blk));
          keep[b][blk] = 1;
        }
      }
      mask.offsets.push_back(static_cast<int32_t>(mask.ids.size()));
    }
    for (IndexerImpl impl : fast_impls<IndexerImpl>()) {
      const ScoreRun masked = run(c, impl, {.mask = &mask});
      const ScoreRun full = run(c, impl);
      const ScoreRun ref_masked = run(c, IndexerImpl::kReference, {.mask = &mask});
      for (int32_t b = 0; b < batch; ++b) {
        for (int32_t r = 0; r < c.next_n; ++r) {
          const int64_t row = int64_t{b} * c.next_n + r;
          for (int64_t s = 0; s < masked.cols; ++s) {
            const float m = masked.logits[row * masked.stride + s];
            const bool selected = s < c.entries(b) && keep[b][s / block_entries];
            if (selected) {
              ASSERT_EQ(std::memcmp(&m, &full.logits[row * full.stride + s], 4), 0) << "row " << row << " entry " << s;
            } else {
              ASSERT_TRUE(std::isinf(m) && m < 0) << "row " << row << " entry " << s << " not selected but " << m;
            }
          }
        }
      }
      expect_matches_reference(c, masked, ref_masked, impl, &checked);
    }
  }
  EXPECT_GT(checked, 0) << "no finite entry was compared";
}

TEST(IndexerKernel, BitwiseDeterministicAcrossRerunsAndThreads) {
  IndexerCase c;
  c.name = "determinism";
  c.next_n = 2;
  c.context_lens = {5000, 3100, 64, 1};
  testing::build_case(c, 99);
  for (IndexerImpl impl : fast_impls<IndexerImpl>()) {
    testing::expect_deterministic_across_threads([&](int threads) { return run(c, impl, {.threads = threads}); },
                                                 indexer_impl_name(impl));
  }
}

// The quantised path against full precision: a loose check that quantisation, scale folding and
// the kernel agree with the unquantised math (cosine similarity of the score vectors).
TEST(IndexerKernel, QuantisedScoresTrackFullPrecision) {
  IndexerCase c;
  c.name = "full-precision";
  c.context_lens = {700};
  testing::build_case(c, 5);
  const ScoreRun fast = run(c, indexer_best_impl());
  const float fold = 1.0f / std::sqrt(128.0f) / std::sqrt(64.0f);
  double dot = 0, norm_a = 0, norm_b = 0;
  std::vector<float> raw_w(c.num_heads);
  // Recover the raw weights: quantize_queries scaled them by q_scale · fold; redo with q_scale.
  for (int32_t h = 0; h < c.num_heads; ++h) {
    float amax = 0;
    for (int d = 0; d < 128; ++d) amax = std::max(amax, std::fabs(c.q_fp32[h * 128 + d]));
    raw_w[h] = c.weights[h] / (ue8m0_scale(amax) * fold);
  }
  for (int64_t s = 0; s < c.entries(0); ++s) {
    double exact = 0;
    for (int32_t h = 0; h < c.num_heads; ++h) {
      double qk = 0;
      for (int d = 0; d < 128; ++d) qk += double{c.q_fp32[h * 128 + d]} * c.keys_fp32[s * 128 + d];
      exact += raw_w[h] * fold * std::max(qk, 0.0);
    }
    const double got = fast.logits[s];
    dot += exact * got;
    norm_a += exact * exact;
    norm_b += got * got;
  }
  EXPECT_GT(dot / std::sqrt(norm_a * norm_b), 0.99);
}

TEST(IndexerValidation, RejectsBadArgumentsWithClearErrors) {
  IndexerCase c;
  c.context_lens = {200, 100};
  testing::build_case(c, 3);
  std::vector<float> out(2 * 1000);
  auto expect_error = [&](IndexerParams p, StatusCode code, const std::string& needle) {
    testing::expect_status(indexer_scores(p), code, needle);
  };
  const IndexerParams good = c.params(out.data(), 1000);
  ASSERT_TRUE(indexer_scores(good).ok());
  IndexerParams p = good;
  p.page_size = 0;
  expect_error(p, StatusCode::kInvalidArgument, "page_size");
  p = good;
  p.next_n = 5;
  expect_error(p, StatusCode::kInvalidArgument, "next_n");
  p = good;
  p.next_n = 0;
  expect_error(p, StatusCode::kInvalidArgument, "next_n");
  p = good;
  p.num_heads = 0;
  expect_error(p, StatusCode::kInvalidArgument, "num_heads");
  p = good;
  p.logits_cols = 150;
  expect_error(p, StatusCode::kInvalidArgument, "logits_cols");
  p = good;
  p.num_pages = 1;
  expect_error(p, StatusCode::kOutOfRange, "block_table");
  p = good;
  std::vector<float> bad_w = c.weights;
  bad_w[70] = std::numeric_limits<float>::quiet_NaN();
  p.weights = bad_w.data();
  expect_error(p, StatusCode::kInvalidArgument, "request 1, row 0, head 6");
  p = good;
  std::vector<int32_t> ids = {0, 2, 1};
  std::vector<int32_t> offsets = {0, 3, 3};
  p.block_ids = ids.data();
  p.block_offsets = offsets.data();
  expect_error(p, StatusCode::kInvalidArgument, "sorted");
  ids = {0, 4};
  offsets = {0, 2, 2};
  expect_error(p, StatusCode::kOutOfRange, "block 4");
  p = good;
  p.block_offsets = offsets.data();
  expect_error(p, StatusCode::kInvalidArgument, "block_ids is null");
  p = good;
  std::vector<int64_t> lens = {-1, 5};
  p.context_lens = lens.data();
  expect_error(p, StatusCode::kInvalidArgument, "negative");
  p = good;
  p.compress_ratio = 0;
  expect_error(p, StatusCode::kInvalidArgument, "compress_ratio");
  // A thread count above the machine's is refused, not handed to OpenMP.
  testing::expect_status(indexer_scores(good, {IndexerImpl::kAuto, max_threads() + 1}), StatusCode::kInvalidArgument,
                         "num_threads");
  testing::expect_status(indexer_scores(good, {IndexerImpl::kAuto, -1}), StatusCode::kInvalidArgument, "num_threads");
  EXPECT_TRUE(indexer_scores(good, {IndexerImpl::kAuto, max_threads()}).ok());
  testing::expect_status(indexer_scores(good, {static_cast<IndexerImpl>(99), 0}), StatusCode::kInvalidArgument,
                         "not a known implementation");
}

// Every path this CPU lacks (on x86 at least neon, on aarch64 every x86 path) is refused by name
// before anything is written; the ones it has include its ISA's own (neon on every aarch64 CPU).
TEST(IndexerDispatch, PathsThisCpuLacksAreRefusedByName) {
  IndexerCase c;
  c.name = "dispatch";
  c.context_lens = {100};
  testing::build_case(c, 5);
  int refused = 0;
  for (IndexerImpl impl : indexer_impls()) {
    if (indexer_impl_supported(impl)) continue;
    std::vector<float> out(static_cast<size_t>(c.max_entries) + 1, 7.0f);
    const Status status = indexer_scores(c.params(out.data(), c.max_entries + 1), {impl, 1});
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << indexer_impl_name(impl);
    EXPECT_NE(status.message().find(indexer_impl_name(impl)), std::string::npos) << status.message();
    EXPECT_EQ(out[0], 7.0f) << indexer_impl_name(impl) << " wrote before refusing";
    ++refused;
  }
  EXPECT_GE(refused, 1);
  if (cpu_cap_name() != "native") return;  // capped (SPIN_CPU): CpuCap.* checks what runs
#if defined(__aarch64__)
  // Both Arm paths are tested wherever BFDOT exists (fast_impls holds every supported path); the
  // cross build also runs this suite on a qemu CPU model without BF16 (tests/CMakeLists.txt).
  EXPECT_TRUE(indexer_impl_supported(IndexerImpl::kNeon));
  EXPECT_EQ(indexer_best_impl(), indexer_impl_supported(IndexerImpl::kNeonBf16) ? IndexerImpl::kNeonBf16
                                                                                   : IndexerImpl::kNeon);
  std::printf("aarch64: neon_bf16 %s\n", indexer_impl_supported(IndexerImpl::kNeonBf16) ? "supported" : "not supported");
#else
  EXPECT_FALSE(indexer_impl_supported(IndexerImpl::kNeon));
  EXPECT_FALSE(indexer_impl_supported(IndexerImpl::kNeonBf16));
#endif
}

// --- The SPIN_CPU cap (spin/cpu.h). ctest runs this file again under SPIN_CPU=avx512f, avx2 and
// portable (aarch64: neon and portable; tests/CMakeLists.txt); each run checks the cap against the
// CPU's own features, read here independently of the library.

// A path's place among its ISA's levels (higher = wider); 0 for the paths every CPU runs.
int level_rank(const std::string& name) {
  if (name == "avx512bf16") return 3;
  if (name == "avx512f") return 2;
  if (name == "avx2") return 1;
  if (name == "neon_bf16") return 2;
  if (name == "neon") return 1;
  return 0;
}

bool cpu_itself_has(const std::string& name) {
#if defined(__x86_64__)
  __builtin_cpu_init();
  const bool avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  if (name == "avx512bf16") return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512vbmi");
  if (name == "avx512f") return __builtin_cpu_supports("avx512f");
  if (name == "avx2") return avx2;
  return name == "portable" || name == "reference";
#elif defined(__aarch64__)
#if defined(__linux__) && defined(HWCAP2_BF16)
  if (name == "neon_bf16") return (getauxval(AT_HWCAP2) & HWCAP2_BF16) != 0;
#endif
  return name == "neon" || name == "portable" || name == "reference";
#else
  return name == "portable" || name == "reference";
#endif
}

TEST(CpuCap, EveryPathRunsExactlyWhereTheCpuHasItAndTheCapAllowsIt) {
  const char* env = std::getenv("SPIN_CPU");
  const std::string cap = env != nullptr && *env != '\0' ? env : "native";
  ASSERT_TRUE(cpu_cap_status().ok()) << cpu_cap_status().message();
  EXPECT_EQ(cpu_cap_name(), cap);
  const int ceiling = cap == "native" ? 99 : level_rank(cap);
  auto allowed = [&](const std::string& name) { return cpu_itself_has(name) && level_rank(name) <= ceiling; };
  for (IndexerImpl impl : indexer_impls()) {
    EXPECT_EQ(indexer_impl_supported(impl), allowed(indexer_impl_name(impl))) << indexer_impl_name(impl);
  }
  for (AttentionImpl impl : attention_impls()) {
    EXPECT_EQ(attention_impl_supported(impl), allowed(attention_impl_name(impl))) << attention_impl_name(impl);
  }
  EXPECT_TRUE(indexer_impl_supported(indexer_best_impl()));
  EXPECT_TRUE(attention_impl_supported(attention_best_impl()));
  std::printf("SPIN_CPU=%s: indexer auto = %s, attention auto = %s\n%s\n", cap.c_str(),
              indexer_impl_name(indexer_best_impl()), attention_impl_name(attention_best_impl()), cpu_summary().c_str());
  if (cap == "native") {
    EXPECT_EQ(cpu_summary().find("SPIN_CPU"), std::string::npos) << cpu_summary();
    return;
  }
  EXPECT_NE(cpu_summary().find("SPIN_CPU=" + cap), std::string::npos) << cpu_summary();
  // A path the CPU has but the cap leaves out is refused naming the cap, and writes nothing.
  IndexerCase c;
  c.name = "capped";
  c.context_lens = {100};
  testing::build_case(c, 5);
  for (IndexerImpl impl : indexer_impls()) {
    if (!cpu_itself_has(indexer_impl_name(impl)) || allowed(indexer_impl_name(impl))) continue;
    std::vector<float> out(static_cast<size_t>(c.max_entries) + 1, 7.0f);
    const Status status = indexer_scores(c.params(out.data(), c.max_entries + 1), {impl, 1});
    EXPECT_EQ(status.code(), StatusCode::kInvalidArgument) << indexer_impl_name(impl);
    EXPECT_NE(status.message().find("SPIN_CPU=" + cap), std::string::npos) << status.message();
    EXPECT_EQ(out[0], 7.0f) << indexer_impl_name(impl) << " wrote before refusing";
  }
}

// --- score_fp32_keys: the indexer formula over fp32 (pooled) keys, hisa's and spin-hybrid's probe.

struct Fp32KeysCase {
  int64_t count;
  int32_t heads;
};

// Keys with mixed signs and magnitudes (some rows all-negative against the query, so every head's
// ReLU is zero), queries and weights of both signs.
void fill_fp32_keys_case(const Fp32KeysCase& c, uint32_t seed, std::vector<float>* keys, std::vector<float>* q,
                         std::vector<float>* w) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  keys->resize(static_cast<size_t>(c.count) * 128);
  q->resize(static_cast<size_t>(c.heads) * 128);
  w->resize(static_cast<size_t>(c.heads));
  for (float& x : *q) x = u(rng);
  for (float& x : *w) x = u(rng) * 2.0f;
  for (int64_t i = 0; i < c.count; ++i) {
    const float scale = std::ldexp(1.0f, static_cast<int>(rng() % 40) - 20);  // 2^-20 .. 2^19
    for (int d = 0; d < 128; ++d) {
      float x = u(rng) * scale;
      if (i % 7 == 3) x = -std::fabs((*q)[static_cast<size_t>(d)]) * scale;  // anti-aligned with head 0
      if (i % 11 == 5) x = 0.0f;
      (*keys)[static_cast<size_t>(i * 128 + d)] = x;
    }
  }
}

TEST(Fp32Keys, EveryPathMatchesTheReferenceOnHostileShapes) {
  const Fp32KeysCase cases[] = {{0, 64}, {1, 1}, {5, 3}, {6, 16}, {7, 17}, {13, 64}, {64, 128}, {4097, 64}, {9, 1024}};
  uint32_t seed = 1;
  for (const Fp32KeysCase& c : cases) {
    SCOPED_TRACE(::testing::Message() << "count " << c.count << ", heads " << c.heads);
    std::vector<float> keys, q, w;
    fill_fp32_keys_case(c, seed++, &keys, &q, &w);
    std::vector<float> ref(static_cast<size_t>(c.count));
    ASSERT_TRUE(score_fp32_keys(keys.data(), c.count, q.data(), w.data(), c.heads, ref.data(), IndexerImpl::kReference).ok());
    for (IndexerImpl impl : fast_impls<IndexerImpl>()) {
      SCOPED_TRACE(indexer_impl_name(impl));
      GuardedBuffer<float> out(static_cast<size_t>(c.count), 7.5f);
      ASSERT_TRUE(score_fp32_keys(keys.data(), c.count, q.data(), w.data(), c.heads, out.data(), impl).ok());
      EXPECT_TRUE(out.guards_intact());
      GuardedBuffer<float> again(static_cast<size_t>(c.count), -3.0f);
      ASSERT_TRUE(score_fp32_keys(keys.data(), c.count, q.data(), w.data(), c.heads, again.data(), impl).ok());
      EXPECT_EQ(std::memcmp(out.data(), again.data(), sizeof(float) * static_cast<size_t>(c.count)), 0)
          << "not deterministic";
      for (int64_t i = 0; i < c.count; ++i) {
        // fp32 against double: a few ulps of the sum of |terms| (each dot's and the head sum's).
        double bound = 0;
        for (int32_t h = 0; h < c.heads; ++h) {
          double abs_dot = 0;
          for (int d = 0; d < 128; ++d) abs_dot += std::fabs(double{keys[static_cast<size_t>(i * 128 + d)]} * q[static_cast<size_t>(h * 128 + d)]);
          bound += std::fabs(double{w[static_cast<size_t>(h)]}) * abs_dot;
        }
        ASSERT_LE(std::fabs(double{out.data()[i]} - ref[static_cast<size_t>(i)]), 1e-5 * bound + 1e-30)
            << "key " << i << ": " << out.data()[i] << " vs " << ref[static_cast<size_t>(i)];
      }
    }
  }
}

TEST(Fp32Keys, BadArgumentsAndMissingPathsAreRefusedByName) {
  std::vector<float> keys(128, 1.0f), q(128, 1.0f), w(1, 1.0f), out(1, 7.0f);
  EXPECT_NE(score_fp32_keys(keys.data(), -1, q.data(), w.data(), 1, out.data()).message().find("count"), std::string::npos);
  EXPECT_NE(score_fp32_keys(keys.data(), 1, q.data(), w.data(), 0, out.data()).message().find("heads"), std::string::npos);
  EXPECT_NE(score_fp32_keys(nullptr, 1, q.data(), w.data(), 1, out.data()).message().find("null"), std::string::npos);
  EXPECT_TRUE(score_fp32_keys(nullptr, 0, q.data(), w.data(), 1, nullptr).ok());  // nothing to score
  for (IndexerImpl impl : indexer_impls()) {
    if (indexer_impl_supported(impl)) continue;
    const Status st = score_fp32_keys(keys.data(), 1, q.data(), w.data(), 1, out.data(), impl);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << indexer_impl_name(impl);
    EXPECT_NE(st.message().find(indexer_impl_name(impl)), std::string::npos) << st.message();
    EXPECT_EQ(out[0], 7.0f) << indexer_impl_name(impl) << " wrote before refusing";
  }
  ASSERT_TRUE(score_fp32_keys(keys.data(), 1, q.data(), w.data(), 1, out.data()).ok());
  EXPECT_EQ(out[0], 128.0f);  // exact: 128 products of 1, one head of weight 1
}

}  // namespace
}  // namespace spin
