// ServingPredictor (spin/serving.h): output format, equality with the per-request BlockPredictor
// it wraps, determinism keyed on the request id (not the slot), the add/drop/preempt lifecycle,
// every refusal, observe_scored == observe, the prefill path, and no allocation per step (global
// operator new is counted in this binary).
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <new>
#include <utility>
#include <algorithm>
#include <vector>

#include "spin/predict.h"
#include "spin/serving.h"

namespace {

std::atomic<bool> g_counting{false};
std::atomic<int64_t> g_allocations{0};

}  // namespace

// Counted only while g_counting is set (the window of a test's steady-state steps). malloc/free
// on both sides; GCC's pairing check cannot see that through the inlined std::allocator.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmismatched-new-delete"
#endif
void* operator new(size_t n) {
  if (g_counting.load(std::memory_order_relaxed)) g_allocations.fetch_add(1, std::memory_order_relaxed);
  if (void* p = std::malloc(n == 0 ? 1 : n)) return p;
  throw std::bad_alloc();
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, size_t) noexcept { std::free(p); }

namespace spin {
namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Deterministic synthetic indexer scores of (request, layer, step, row, position): a few "hot"
// regions that move slowly, plus hash noise.
float synth_score(int64_t request, int32_t layer, int64_t step, int32_t row, int64_t pos) {
  uint64_t h = static_cast<uint64_t>(request * 1000003 + layer * 7919 + (step + row) * 104729 + pos * 31);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdULL;
  h ^= h >> 33;
  const double noise = static_cast<double>(h % 10000) / 10000.0;
  const double hot = std::cos(static_cast<double>(pos) / (40.0 + 7.0 * layer) + 0.01 * static_cast<double>(step + request));
  return static_cast<float>(2.0 * hot + noise);
}

PredictorConfig small_config() {
  PredictorConfig c;
  c.page_size = 16;
  c.topk = 32;
  c.target_sparsity = 0.5;
  c.explore_ratio = 0.2;
  return c;
}

ServingOptions small_options(int32_t max_requests = 4, int32_t max_next_n = 1) {
  ServingOptions o;
  o.predictor = "spin";
  o.config = small_config();
  o.max_requests = max_requests;
  o.num_layers = 3;
  o.max_entries = 2048;
  o.max_next_n = max_next_n;
  return o;
}

std::unique_ptr<ServingPredictor> make(const ServingOptions& o) {
  auto r = ServingPredictor::create(o);
  EXPECT_TRUE(r.ok()) << r.status().to_string();
  return std::move(r).value();
}

// Drives one decode step of `slots` (request ids `rids`, tokens `seq`) through a serving object:
// select → full-width logits (the selected blocks' scores, -inf elsewhere) → observe, every layer,
// then commit. Returns every row's blocks, layer-major.
struct StepDriver {
  explicit StepDriver(ServingPredictor* serving, int32_t rows = 1) : s(serving), next_n(rows) {}
  ServingPredictor* s;
  int32_t next_n;
  std::vector<int32_t> blocks, counts;
  std::vector<float> logits;
  std::vector<std::vector<int32_t>> step(const std::vector<int32_t>& slots, const std::vector<int64_t>& rids,
                                         const std::vector<int64_t>& seq, int64_t step_no,
                                         const std::vector<int32_t>& accepted) {
    const int32_t batch = static_cast<int32_t>(slots.size());
    const int64_t cols = s->max_blocks();
    const int64_t rows = int64_t{batch} * next_n;
    const int64_t E = s->block_entries();
    const int64_t width = s->options().max_entries;
    blocks.assign(static_cast<size_t>(rows * cols), 7);
    counts.assign(static_cast<size_t>(rows), 0);
    logits.assign(static_cast<size_t>(rows * width), kNegInf);
    std::vector<std::vector<int32_t>> out;
    for (int32_t l = 0; l < s->options().num_layers; ++l) {
      Status st = s->select(slots.data(), batch, l, seq.data(), next_n, blocks.data(), cols, counts.data());
      EXPECT_TRUE(st.ok()) << st.to_string();
      for (int64_t r = 0; r < rows; ++r) {
        const int64_t i = r / next_n;
        const int32_t j = static_cast<int32_t>(r % next_n);
        const int64_t visible = visible_entries(seq[i], next_n, j);
        float* row = logits.data() + r * width;
        std::fill(row, row + width, kNegInf);
        std::vector<int32_t> got;
        for (int64_t c = 0; c < counts[r]; ++c) {
          const int32_t b = blocks[r * cols + c];
          got.push_back(b);
          for (int64_t p = b * E; p < std::min<int64_t>((b + 1) * E, visible); ++p)
            row[p] = synth_score(rids[i], l, step_no, j, p);
        }
        out.push_back(got);
      }
      st = s->observe(slots.data(), batch, l, logits.data(), width, width);
      EXPECT_TRUE(st.ok()) << st.to_string();
    }
    Status st = s->commit(slots.data(), batch, accepted.data());
    EXPECT_TRUE(st.ok()) << st.to_string();
    return out;
  }
};

TEST(ServingPredictor, RefusesBadOptions) {
  ServingOptions o = small_options();
  o.predictor = "oracle";
  EXPECT_EQ(ServingPredictor::create(o).status().code(), StatusCode::kInvalidArgument);
  o.predictor = "hisa";
  EXPECT_EQ(ServingPredictor::create(o).status().code(), StatusCode::kInvalidArgument);
  o.predictor = "nope";
  EXPECT_EQ(ServingPredictor::create(o).status().code(), StatusCode::kInvalidArgument);
  o = small_options();
  o.max_requests = 0;
  EXPECT_EQ(ServingPredictor::create(o).status().code(), StatusCode::kInvalidArgument);
  o = small_options();
  o.max_next_n = kMaxNextN + 1;
  EXPECT_EQ(ServingPredictor::create(o).status().code(), StatusCode::kInvalidArgument);
  o = small_options();
  o.config.target_sparsity = 1.5;
  EXPECT_EQ(ServingPredictor::create(o).status().code(), StatusCode::kInvalidArgument);
}

TEST(ServingPredictor, SelectIsAscendingPaddedAndEqualsTheBlockPredictor) {
  auto s = make(small_options());
  ASSERT_EQ(s->max_blocks(), 2048 / 16);
  ASSERT_TRUE(s->add(2, 41).ok());
  ASSERT_TRUE(s->add(0, 42).ok());
  auto ref41 = make_predictor("spin", small_config(), 3, 41);
  auto ref42 = make_predictor("spin", small_config(), 3, 42);
  ASSERT_TRUE(ref41.ok() && ref42.ok());
  BlockPredictor* refs[2] = {ref41.value().get(), ref42.value().get()};
  StepDriver d{s.get()};
  const std::vector<int32_t> slots = {2, 0};
  const std::vector<int64_t> rids = {41, 42};
  Selection sel;
  for (int64_t t = 0; t < 12; ++t) {
    const std::vector<int64_t> seq = {1000 + t, 700 + 3 * t};
    auto got = d.step(slots, rids, seq, t, {0, 0});
    // Format of the last layer's output: ascending, -1 after the count.
    const int64_t cols = s->max_blocks();
    for (int64_t r = 0; r < 2; ++r) {
      for (int64_t c = 1; c < d.counts[r]; ++c) EXPECT_LT(d.blocks[r * cols + c - 1], d.blocks[r * cols + c]);
      for (int64_t c = d.counts[r]; c < cols; ++c) ASSERT_EQ(d.blocks[r * cols + c], -1);
      EXPECT_EQ(d.counts[r], budget_blocks(small_config(), (seq[r] + 15) / 16));
    }
    // The same protocol through the per-request predictor gives the same blocks.
    for (int32_t i = 0; i < 2; ++i) {
      for (int32_t l = 0; l < 3; ++l) {
        StepInput in;
        in.step = t;
        in.num_entries = seq[i];
        ASSERT_TRUE(refs[i]->select(l, in, &sel).ok());
        ASSERT_EQ(sel.blocks, got[static_cast<size_t>(l * 2 + i)]) << "step " << t << " layer " << l;
        std::vector<float> row(static_cast<size_t>(seq[i]), kNegInf);
        for (int32_t b : sel.blocks)
          for (int64_t p = b * 16; p < std::min<int64_t>((b + 1) * 16, seq[i]); ++p)
            row[p] = synth_score(rids[i], l, t, 0, p);
        RowScores rs{row.data(), seq[i], seq[i], sel.blocks.data(), static_cast<int64_t>(sel.blocks.size()), nullptr};
        ASSERT_TRUE(refs[i]->observe(l, 0, rs).ok());
      }
      ASSERT_TRUE(refs[i]->commit(0).ok());
    }
  }
}

TEST(ServingPredictor, KeyedOnRequestIdNotSlot) {
  auto a = make(small_options());
  auto b = make(small_options());
  ASSERT_TRUE(a->add(0, 5).ok() && a->add(1, 6).ok());
  ASSERT_TRUE(b->add(3, 6).ok() && b->add(2, 5).ok());
  StepDriver da{a.get()}, db{b.get()};
  for (int64_t t = 0; t < 8; ++t) {
    auto ga = da.step({0, 1}, {5, 6}, {900 + t, 1500 + t}, t, {0, 0});
    auto gb = db.step({2, 3}, {5, 6}, {900 + t, 1500 + t}, t, {0, 0});
    ASSERT_EQ(ga, gb) << "step " << t;
  }
  // Another request id in the same slot explores other blocks.
  auto c = make(small_options());
  ASSERT_TRUE(c->add(0, 5).ok() && c->add(1, 99).ok());
  auto e = make(small_options());
  ASSERT_TRUE(e->add(0, 5).ok() && e->add(1, 6).ok());
  StepDriver dc{c.get()}, de{e.get()};
  bool differs = false;
  for (int64_t t = 0; t < 8; ++t) {
    auto gc = dc.step({0, 1}, {5, 6}, {900 + t, 1500 + t}, t, {0, 0});  // same scores as request 6
    auto ge = de.step({0, 1}, {5, 6}, {900 + t, 1500 + t}, t, {0, 0});
    differs |= gc[1] != ge[1];
  }
  EXPECT_TRUE(differs);
}

TEST(ServingPredictor, LifecycleAddDropPreempt) {
  auto s = make(small_options());
  const int32_t slot = 1;
  const int64_t seq = 800;
  std::vector<int32_t> blocks(static_cast<size_t>(s->max_blocks()));
  EXPECT_EQ(s->select(&slot, 1, 0, &seq, 1, blocks.data(), s->max_blocks()).code(),
            StatusCode::kFailedPrecondition);  // free slot
  ASSERT_TRUE(s->add(slot, 10).ok());
  EXPECT_EQ(s->add(slot, 11).code(), StatusCode::kFailedPrecondition);  // occupied
  EXPECT_EQ(s->add(4, 11).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s->add(-1, 11).code(), StatusCode::kOutOfRange);
  EXPECT_TRUE(s->active(slot));
  EXPECT_EQ(s->request_id(slot), 10);
  StepDriver d{s.get()};
  std::vector<std::vector<std::vector<int32_t>>> first;
  for (int64_t t = 0; t < 5; ++t) first.push_back(d.step({slot}, {10}, {seq + t}, t, {0}));
  EXPECT_EQ(s->step(slot), 5);
  // Preempted mid-step: drop discards the open step; the slot is free.
  ASSERT_TRUE(s->select(&slot, 1, 0, &seq, 1, blocks.data(), s->max_blocks()).ok());
  ASSERT_TRUE(s->drop(slot).ok());
  EXPECT_FALSE(s->active(slot));
  EXPECT_EQ(s->drop(slot).code(), StatusCode::kFailedPrecondition);
  // Resumed (in another slot): starts empty, so it repeats the first run exactly.
  ASSERT_TRUE(s->add(3, 10).ok());
  for (int64_t t = 0; t < 5; ++t) EXPECT_EQ(d.step({3}, {10}, {seq + t}, t, {0}), first[t]) << t;
  // A new request reusing slot 1 is independent of what slot 1 held.
  ASSERT_TRUE(s->add(slot, 10).ok());
  EXPECT_EQ(d.step({slot}, {10}, {seq}, 0, {0}), first[0]);
}

TEST(ServingPredictor, RefusesBadCalls) {
  auto s = make(small_options());
  ASSERT_TRUE(s->add(0, 1).ok() && s->add(1, 2).ok());
  const int32_t cols = s->max_blocks();
  std::vector<int32_t> blocks(static_cast<size_t>(4 * cols));
  const int32_t dup[2] = {0, 0};
  const int32_t two[2] = {0, 1};
  const int64_t seq[2] = {500, 600};
  EXPECT_EQ(s->select(dup, 2, 0, seq, 1, blocks.data(), cols).code(), StatusCode::kInvalidArgument);
  const int32_t bad[1] = {9};
  EXPECT_EQ(s->select(bad, 1, 0, seq, 1, blocks.data(), cols).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s->select(two, 2, 3, seq, 1, blocks.data(), cols).code(), StatusCode::kOutOfRange);
  EXPECT_EQ(s->select(two, 2, 0, seq, 2, blocks.data(), cols).code(), StatusCode::kInvalidArgument);  // > max_next_n
  EXPECT_EQ(s->select(two, 2, 0, seq, 1, blocks.data(), cols - 1).code(), StatusCode::kInvalidArgument);
  const int64_t too_long[2] = {500, 5000};
  EXPECT_EQ(s->select(two, 2, 0, too_long, 1, blocks.data(), cols).code(), StatusCode::kResourceExhausted);
  const int64_t zero[2] = {500, 0};
  EXPECT_EQ(s->select(two, 2, 0, zero, 1, blocks.data(), cols).code(), StatusCode::kInvalidArgument);
  std::vector<float> logits(2 * 600, 0.0f);
  EXPECT_EQ(s->observe(two, 2, 0, logits.data(), 600, 600).code(), StatusCode::kFailedPrecondition);
  const int32_t acc[2] = {0, 0};
  EXPECT_EQ(s->commit(two, 2, acc).code(), StatusCode::kFailedPrecondition);
  // A refused call changed nothing: the protocol still starts cleanly.
  ASSERT_TRUE(s->select(two, 2, 0, seq, 1, blocks.data(), cols).ok());
  EXPECT_EQ(s->commit(two, 2, acc).code(), StatusCode::kFailedPrecondition);  // not observed
  EXPECT_EQ(s->observe(two, 2, 0, logits.data(), 600, 400).code(), StatusCode::kInvalidArgument);  // too narrow
  logits[5] = std::numeric_limits<float>::quiet_NaN();
  const Status nan = s->observe(two, 2, 0, logits.data(), 600, 600);
  EXPECT_EQ(nan.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(nan.message().find("NaN"), std::string::npos) << nan.message();
  EXPECT_NE(nan.message().find("slot 0"), std::string::npos) << nan.message();
}

// Observe must list the select's slots, all of them, in its order — another list would
// read one request's logits rows as another's. open_next_n tells a binding how many rows to expect.
TEST(ServingPredictor, ObserveMustRepeatTheSelectSlots) {
  auto s = make(small_options(4, 2));
  for (int32_t slot = 0; slot < 3; ++slot) ASSERT_TRUE(s->add(slot, 10 + slot).ok());
  const int32_t cols = s->max_blocks();
  std::vector<int32_t> blocks(static_cast<size_t>(8 * cols));
  const int32_t two[2] = {0, 1}, swapped[2] = {1, 0}, one[1] = {0}, three[3] = {0, 1, 2};
  const int64_t seq[3] = {500, 600, 700};
  EXPECT_EQ(s->open_next_n(0), 0);
  ASSERT_TRUE(s->select(two, 2, 0, seq, 2, blocks.data(), cols).ok());
  EXPECT_EQ(s->open_next_n(0), 2);
  EXPECT_EQ(s->open_next_n(2), 0);   // active, nothing open
  EXPECT_EQ(s->open_next_n(99), 0);  // outside the object
  std::vector<float> logits(4 * 700, 0.0f);
  const Status other_order = s->observe(swapped, 2, 0, logits.data(), 700, 700);
  EXPECT_EQ(other_order.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(other_order.message().find("same order"), std::string::npos) << other_order.message();
  EXPECT_EQ(s->observe(one, 1, 0, logits.data(), 700, 700).code(), StatusCode::kInvalidArgument);  // fewer
  EXPECT_EQ(s->observe(three, 3, 0, logits.data(), 700, 700).code(), StatusCode::kFailedPrecondition);  // slot 2 not selected
  // Two selects of one layer in two sub-batches: each observe must match its own.
  ASSERT_TRUE(s->observe(two, 2, 0, logits.data(), 700, 700).ok());
  ASSERT_TRUE(s->select(one, 1, 1, seq, 2, blocks.data(), cols).ok());
  ASSERT_TRUE(s->select(two + 1, 1, 1, seq + 1, 2, blocks.data(), cols).ok());
  EXPECT_EQ(s->observe(two, 2, 1, logits.data(), 700, 700).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(s->observe(one, 1, 1, logits.data(), 700, 700).ok());
  EXPECT_TRUE(s->observe(two + 1, 1, 1, logits.data(), 700, 700).ok());
}

// A size that cannot fit is refused at create(), in GiB, before any slot is allocated.
TEST(ServingPredictor, RefusesWhatWouldNotFitBeforeAllocating) {
  ServingOptions o = small_options();
  o.max_requests = 1 << 20;
  o.num_layers = 1024;
  o.max_entries = int64_t{1} << 31;
  auto r = ServingPredictor::create(o);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), StatusCode::kResourceExhausted);
  EXPECT_NE(r.status().message().find("GiB"), std::string::npos) << r.status().message();
  // What it plans is what memory_bytes() reports for one that fits.
  auto small = make(small_options());
  EXPECT_GT(small->memory_bytes(), size_t{0});
}

TEST(ServingPredictor, ObserveScoredEqualsObserve) {
  auto a = make(small_options());
  auto b = make(small_options());
  ASSERT_TRUE(a->add(0, 3).ok() && b->add(0, 3).ok());
  const int32_t slot = 0;
  const int32_t cols = a->max_blocks();
  const int64_t E = a->block_entries();
  std::vector<int32_t> ba(static_cast<size_t>(cols)), bb(static_cast<size_t>(cols)), ca(1), cb(1);
  for (int64_t t = 0; t < 10; ++t) {
    const int64_t seq = 1200 + 5 * t;
    for (int32_t l = 0; l < 3; ++l) {
      ASSERT_TRUE(a->select(&slot, 1, l, &seq, 1, ba.data(), cols, ca.data()).ok());
      ASSERT_TRUE(b->select(&slot, 1, l, &seq, 1, bb.data(), cols, cb.data()).ok());
      ASSERT_EQ(ba, bb);
      std::vector<float> full(static_cast<size_t>(seq), kNegInf), compact(static_cast<size_t>(ca[0] * E), 123.0f);
      for (int32_t c = 0; c < ca[0]; ++c) {
        for (int64_t e = 0; e < E; ++e) {
          const int64_t p = ba[c] * E + e;
          if (p >= seq) break;
          full[p] = compact[c * E + e] = synth_score(3, l, t, 0, p);
        }
      }
      ASSERT_TRUE(a->observe(&slot, 1, l, full.data(), seq, seq).ok());
      ASSERT_TRUE(b->observe_scored(&slot, 1, l, compact.data(), ca[0] * E).ok());
    }
    const int32_t acc = 0;
    ASSERT_TRUE(a->commit(&slot, 1, &acc).ok() && b->commit(&slot, 1, &acc).ok());
  }
}

TEST(ServingPredictor, MtpRowsShareTheUnionAndCommitAccepts) {
  auto s = make(small_options(4, 3));
  ASSERT_TRUE(s->add(1, 8).ok());
  StepDriver d{s.get(), 3};
  for (int64_t t = 0; t < 6; ++t) {
    auto got = d.step({1}, {8}, {1000 + 3 * t}, t, {static_cast<int32_t>(t % 3)});
    for (size_t r = 0; r < got.size(); r += 3) {
      EXPECT_EQ(got[r], got[r + 1]);
      EXPECT_EQ(got[r], got[r + 2]);
    }
  }
  const int32_t slot = 1;
  const int64_t seq = 2000;
  std::vector<int32_t> blocks(static_cast<size_t>(3 * s->max_blocks()));
  ASSERT_TRUE(s->select(&slot, 1, 0, &seq, 3, blocks.data(), s->max_blocks()).ok());
  std::vector<float> logits(3 * 2000, 0.0f);
  ASSERT_TRUE(s->observe(&slot, 1, 0, logits.data(), 2000, 2000).ok());
  for (int32_t l = 1; l < 3; ++l) {
    ASSERT_TRUE(s->select(&slot, 1, l, &seq, 3, blocks.data(), s->max_blocks()).ok());
    ASSERT_TRUE(s->observe(&slot, 1, l, logits.data(), 2000, 2000).ok());
  }
  const int32_t too_many = 3;
  EXPECT_EQ(s->commit(&slot, 1, &too_many).code(), StatusCode::kInvalidArgument);
  const int32_t two = 2;
  EXPECT_TRUE(s->commit(&slot, 1, &two).ok());
}

TEST(ServingPredictor, PrefillIsObservedInFull) {
  // After a prefill that scores a hot region, the first decode step predicts it: the blocks holding
  // the prefill's best scores are selected.
  auto s = make(small_options());
  ASSERT_TRUE(s->add(0, 1).ok());
  const int32_t slot = 0;
  const int64_t seq = 1600;
  std::vector<float> row(static_cast<size_t>(seq), 0.0f);
  for (int64_t p = 800; p < 832; ++p) row[p] = 10.0f;  // blocks 50 and 51
  for (int32_t l = 0; l < 3; ++l) ASSERT_TRUE(s->prefill(&slot, 1, l, &seq, row.data(), seq).ok());
  const int32_t acc = 0;
  ASSERT_TRUE(s->commit(&slot, 1, &acc).ok());
  EXPECT_EQ(s->step(slot), 1);
  std::vector<int32_t> blocks(static_cast<size_t>(s->max_blocks()));
  const int64_t next = seq + 1;
  ASSERT_TRUE(s->select(&slot, 1, 0, &next, 1, blocks.data(), s->max_blocks()).ok());
  EXPECT_NE(std::find(blocks.begin(), blocks.end(), 50), blocks.end());
  EXPECT_NE(std::find(blocks.begin(), blocks.end(), 51), blocks.end());
}

TEST(ServingPredictor, NoAllocationPerStep) {
  // Sized for 4 requests, 2 rows, 2048 entries: after create() and add(), steps over every context
  // length up to the maximum (and with and without the kernel's top-k) allocate nothing.
  // The counter sees allocations (a test that cannot fail proves nothing).
  g_allocations = 0;
  g_counting = true;
  auto* probe = new std::vector<int32_t>(10);
  g_counting = false;
  delete probe;
  ASSERT_GE(g_allocations.load(), 2);
  ServingOptions o = small_options(4, 2);
  auto s = make(o);
  const std::vector<int32_t> slots = {3, 0, 1};
  const int64_t cols = s->max_blocks();
  const int64_t E = s->block_entries();
  std::vector<int32_t> blocks(static_cast<size_t>(3 * 2 * cols)), counts(6);
  std::vector<float> logits(static_cast<size_t>(6 * o.max_entries), kNegInf);
  std::vector<float> compact(static_cast<size_t>(6 * o.max_entries), 0.0f);
  std::vector<int32_t> topk(static_cast<size_t>(6 * o.config.topk), -1);
  std::vector<int32_t> accepted = {1, 0, 1};
  std::vector<int64_t> seq(3);
  std::vector<std::pair<float, int32_t>> cand;
  cand.reserve(static_cast<size_t>(o.max_entries));
  for (int32_t round = 0; round < 2; ++round) {
    for (size_t i = 0; i < slots.size(); ++i) ASSERT_TRUE(s->add(slots[i], 100 + static_cast<int64_t>(i) + round).ok());
    g_allocations = 0;
    g_counting = true;
    for (int64_t t = 0; t < 40; ++t) {
      for (size_t i = 0; i < 3; ++i) seq[i] = std::min<int64_t>(o.max_entries, 100 + 50 * t + 300 * static_cast<int64_t>(i));
      for (int32_t l = 0; l < o.num_layers; ++l) {
        ASSERT_TRUE(s->select(slots.data(), 3, l, seq.data(), 2, blocks.data(), cols, counts.data()).ok());
        for (int64_t r = 0; r < 6; ++r) {
          const int64_t vis = visible_entries(seq[r / 2], 2, static_cast<int32_t>(r % 2));
          cand.clear();  // within its reserved capacity: no allocation
          for (int64_t c = 0; c < counts[r]; ++c) {
            const int32_t b = blocks[r * cols + c];
            for (int64_t p = b * E; p < std::min<int64_t>((b + 1) * E, vis); ++p) {
              const float v = synth_score(slots[r / 2], l, t, 0, p);
              logits[r * o.max_entries + p] = v;
              compact[r * o.max_entries + c * E + (p - b * E)] = v;
              cand.emplace_back(-v, static_cast<int32_t>(p));
            }
          }
          // The row's true top-k over what was scored: (score desc, position asc), then ascending.
          const size_t k = std::min(cand.size(), static_cast<size_t>(o.config.topk));
          std::partial_sort(cand.begin(), cand.begin() + static_cast<int64_t>(k), cand.end());
          int32_t* top = topk.data() + r * o.config.topk;
          std::fill(top, top + o.config.topk, -1);
          for (size_t i = 0; i < k; ++i) top[i] = cand[i].second;
          std::sort(top, top + k);
        }
        Status st = (t + l) % 3 == 0 ? s->observe(slots.data(), 3, l, logits.data(), o.max_entries, o.max_entries)
                    : (t + l) % 3 == 1
                        ? s->observe(slots.data(), 3, l, logits.data(), o.max_entries, o.max_entries, topk.data(), o.config.topk)
                        : s->observe_scored(slots.data(), 3, l, compact.data(), o.max_entries, topk.data(), o.config.topk);
        ASSERT_TRUE(st.ok()) << st.to_string();
      }
      ASSERT_TRUE(s->commit(slots.data(), 3, accepted.data()).ok());
    }
    g_counting = false;
    EXPECT_EQ(g_allocations.load(), 0) << "round " << round;
    for (int32_t slot : slots) ASSERT_TRUE(s->drop(slot).ok());
  }
  EXPECT_GT(s->memory_bytes(), size_t{0});
}

}  // namespace
}  // namespace spin
