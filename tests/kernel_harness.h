// The one kernel-test harness the indexer, attention and top-k tests share (ggml's and FlashMLA's
// habits): outputs are poisoned before a run and guarded by poisoned bytes on both sides
// (GuardedBuffer), every fast implementation is checked against the reference with the fast one
// run first (so stale memory cannot hide a reference bug), and a result must be bitwise identical
// over 20 reruns that alternate 1 and 2 threads.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "spin/attention.h"
#include "spin/indexer.h"
#include "spin/topk.h"

namespace spin::testing {

// What an output buffer holds before a kernel runs; a value no kernel computes on test data.
inline constexpr float kPoisonScore = 12345.678f;
inline constexpr int32_t kPoisonIndex = -77;

// A buffer with poisoned guard regions before and after the payload: any write outside the
// payload is caught by guards_intact().
template <typename T>
class GuardedBuffer {
 public:
  static constexpr size_t kGuard = 64;
  GuardedBuffer(size_t n, T poison) : data_(n + 2 * kGuard, poison), poison_(poison), n_(n) {
    std::fill(data_.begin(), data_.end(), poison);
  }
  T* data() { return data_.data() + kGuard; }
  const T* data() const { return data_.data() + kGuard; }
  size_t size() const { return n_; }
  bool guards_intact() const {
    for (size_t i = 0; i < kGuard; ++i) {
      if (!same(data_[i]) || !same(data_[kGuard + n_ + i])) return false;
    }
    return true;
  }
  // [first, first + count) of the payload still holds the poison (a region the kernel must skip).
  bool untouched(size_t first, size_t count) const {
    for (size_t i = first; i < first + count; ++i) {
      if (!same(data_[kGuard + i])) return false;
    }
    return true;
  }
  std::vector<T> payload() const { return std::vector<T>(data(), data() + n_); }

 private:
  bool same(const T& v) const { return std::memcmp(&v, &poison_, sizeof(T)) == 0; }
  std::vector<T> data_;
  T poison_;
  size_t n_;
};

// Bitwise equality of two results (memcmp, so -0.0 ≠ +0.0 and a NaN equals itself).
template <typename T>
bool bitwise_equal(const std::vector<T>& a, const std::vector<T>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(T)) == 0);
}

// Per kernel family: its fast implementations on this CPU, the reference, and their names.
template <typename Impl>
struct KernelFamily;

template <>
struct KernelFamily<IndexerImpl> {
  static constexpr IndexerImpl kReference = IndexerImpl::kReference;
  static std::vector<IndexerImpl> fast() {
    std::vector<IndexerImpl> impls;  // every SIMD path this CPU can run, and the portable one
    for (IndexerImpl impl : indexer_impls()) {
      if (impl != IndexerImpl::kReference && indexer_impl_supported(impl)) impls.push_back(impl);
    }
    return impls;
  }
  static const char* name(IndexerImpl impl) { return indexer_impl_name(impl); }
};

template <>
struct KernelFamily<AttentionImpl> {
  static constexpr AttentionImpl kReference = AttentionImpl::kReference;
  static std::vector<AttentionImpl> fast() {
    std::vector<AttentionImpl> impls;  // every SIMD path this CPU can run, and the portable one
    for (AttentionImpl impl : attention_impls()) {
      if (impl != AttentionImpl::kReference && attention_impl_supported(impl)) impls.push_back(impl);
    }
    return impls;
  }
  static const char* name(AttentionImpl impl) { return attention_impl_name(impl); }
};

template <>
struct KernelFamily<TopkImpl> {
  static constexpr TopkImpl kReference = TopkImpl::kReference;
  static std::vector<TopkImpl> fast() { return {TopkImpl::kRadix}; }
  static const char* name(TopkImpl impl) { return topk_impl_name(impl); }
};

template <typename Impl>
std::vector<Impl> fast_impls() {
  return KernelFamily<Impl>::fast();
}

// For every fast implementation: run(impl) first, then run(reference), then check(impl, fast, ref).
template <typename Impl, typename Run, typename Check>
void for_each_fast_impl_against_reference(const Run& run, const Check& check) {
  for (Impl impl : fast_impls<Impl>()) {
    SCOPED_TRACE(KernelFamily<Impl>::name(impl));
    const auto fast = run(impl);
    const auto ref = run(KernelFamily<Impl>::kReference);
    check(impl, fast, ref);
  }
}

// A failing call's status: the code, and a message that names what is wrong (`needle`).
inline void expect_status(const Status& s, StatusCode code, const std::string& needle) {
  EXPECT_EQ(s.code(), code) << s.to_string();
  EXPECT_NE(s.message().find(needle), std::string::npos) << "message: " << s.message();
}

// run(threads) 21 times — once on 1 thread, then 20 reruns alternating 1 and 2 threads — and
// every result bitwise equal to the first (DeepGEMM reruns 20 times). Returns the first.
template <typename Run>
auto expect_deterministic_across_threads(const Run& run, const std::string& what) {
  const auto first = run(1);
  for (int rerun = 0; rerun < 20; ++rerun) {
    const auto again = run(1 + rerun % 2);
    EXPECT_TRUE(bitwise_equal(first, again)) << what << " rerun " << rerun << " on " << 1 + rerun % 2 << " threads";
    if (!bitwise_equal(first, again)) break;
  }
  return first;
}

}  // namespace spin::testing
