// Quality metrics (see spin/lab/metrics.h for the definitions and the decisions).
#include "spin/lab/metrics.h"

#include <algorithm>
#include <cmath>

namespace spin {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

// The distinct valid (>= 0) values of `v`, sorted ascending, into `out`. Top-k outputs are
// already sorted and distinct (spin/topk.h), so the sort is usually skipped.
void valid_set(std::span<const int32_t> v, std::vector<int32_t>& out) {
  out.clear();
  for (int32_t x : v)
    if (x >= 0) out.push_back(x);
  if (!std::is_sorted(out.begin(), out.end())) std::sort(out.begin(), out.end());
  out.erase(std::unique(out.begin(), out.end()), out.end());
}

template <typename T>
double pearson_impl(const T* x, const T* y, int64_t n) {
  if (n < 2 || x == nullptr || y == nullptr) return kNaN;
  double mx = 0.0, my = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    if (!std::isfinite(x[i]) || !std::isfinite(y[i])) return kNaN;
    mx += static_cast<double>(x[i]);
    my += static_cast<double>(y[i]);
  }
  mx /= static_cast<double>(n);
  my /= static_cast<double>(n);
  double sxx = 0.0, syy = 0.0, sxy = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const double dx = static_cast<double>(x[i]) - mx;
    const double dy = static_cast<double>(y[i]) - my;
    sxx += dx * dx;
    syy += dy * dy;
    sxy += dx * dy;
  }
  if (sxx == 0.0 || syy == 0.0) return kNaN;  // a constant vector: correlation undefined
  return std::clamp(sxy / std::sqrt(sxx * syy), -1.0, 1.0);
}

}  // namespace

double recall(std::span<const int32_t> topk_spin, std::span<const int32_t> topk_full) {
  thread_local std::vector<int32_t> a, b;
  valid_set(topk_full, b);
  if (b.empty()) return 1.0;  // nothing visible: nothing to miss
  valid_set(topk_spin, a);
  size_t i = 0, j = 0, hits = 0;
  while (i < a.size() && j < b.size()) {
    if (a[i] < b[j]) {
      ++i;
    } else if (b[j] < a[i]) {
      ++j;
    } else {
      ++hits, ++i, ++j;
    }
  }
  return static_cast<double>(hits) / static_cast<double>(b.size());
}

double block_recall(std::span<const int32_t> selected_blocks, std::span<const int32_t> topk_full,
                    int64_t block_entries) {
  if (block_entries < 1) return kNaN;
  thread_local std::vector<int32_t> blocks, b;
  valid_set(topk_full, b);
  if (b.empty()) return 1.0;
  valid_set(selected_blocks, blocks);
  size_t hits = 0;
  for (int32_t pos : b) {
    const int64_t blk = pos / block_entries;
    if (std::binary_search(blocks.begin(), blocks.end(), blk,
                           [](int64_t u, int64_t v) { return u < v; })) {
      ++hits;
    }
  }
  return static_cast<double>(hits) / static_cast<double>(b.size());
}

double pearson(const float* x, const float* y, int64_t n) { return pearson_impl(x, y, n); }
double pearson(const double* x, const double* y, int64_t n) { return pearson_impl(x, y, n); }

double sparsity(int64_t scored, int64_t visible) {
  if (visible <= 0) return 0.0;
  return 1.0 - static_cast<double>(scored) / static_cast<double>(visible);
}

int64_t nearest_rank(double p, int64_t n) {
  if (n <= 0) return 0;
  p = std::clamp(std::isnan(p) ? 0.0 : p, 0.0, 100.0);
  const double r = p * static_cast<double>(n) / 100.0;
  const auto k = static_cast<int64_t>(std::ceil(r - 1e-9 * r));
  return std::clamp<int64_t>(k, 1, n);
}

// ---------------------------------------------------------------------------------------------
// SampleStats

void SampleStats::add(double x) {
  if (std::isnan(x)) {
    ++nan_count_;
    return;
  }
  if (!values_.empty() && x < values_.back()) sorted_ = false;
  values_.push_back(x);
  sum_ += x;
}

void SampleStats::merge(const SampleStats& other) {
  if (other.values_.empty()) {
    nan_count_ += other.nan_count_;
    return;
  }
  if (!values_.empty() && (!other.sorted_ || other.values_.front() < values_.back())) {
    sorted_ = false;
  } else if (values_.empty()) {
    sorted_ = other.sorted_;
  }
  values_.insert(values_.end(), other.values_.begin(), other.values_.end());
  sum_ += other.sum_;
  nan_count_ += other.nan_count_;
}

double SampleStats::mean() const {
  return values_.empty() ? kNaN : sum_ / static_cast<double>(values_.size());
}

double SampleStats::max() const {
  if (values_.empty()) return kNaN;
  if (sorted_) return values_.back();
  return *std::max_element(values_.begin(), values_.end());
}

double SampleStats::min() const {
  if (values_.empty()) return kNaN;
  if (sorted_) return values_.front();
  return *std::min_element(values_.begin(), values_.end());
}

double SampleStats::percentile(double p) const {
  if (values_.empty()) return kNaN;
  if (!sorted_) {
    std::sort(values_.begin(), values_.end());
    sorted_ = true;
  }
  return values_[static_cast<size_t>(nearest_rank(p, count()) - 1)];
}

SampleStats::Summary SampleStats::summary() const {
  Summary s;
  s.count = count();
  s.nan_count = nan_count_;
  if (values_.empty()) return s;
  s.mean = mean();
  s.p50 = percentile(50);
  s.p99 = percentile(99);
  s.max = max();
  return s;
}

// ---------------------------------------------------------------------------------------------
// QualityStats

void QualityStats::add(const RowQuality& row) {
  ++samples_;
  if (row.visible_entries <= topk_) {
    ++exact_;
    return;
  }
  recall_.add(row.recall);
  miss_.add(std::isnan(row.recall) ? kNaN : 1.0 - row.recall);
  block_recall_.add(row.block_recall);
  if (row.scored_entries >= 0) {
    sparsity_.add(spin::sparsity(row.scored_entries, row.visible_entries));
    visible_sum_ += static_cast<double>(row.visible_entries);
    scored_sum_ += static_cast<double>(row.scored_entries);
    probe_sum_ += static_cast<double>(row.probe_entries);
  }
  if (row.scored_blocks >= 0 && row.visible_blocks > 0) {
    block_sparsity_.add(spin::sparsity(row.scored_blocks, row.visible_blocks));
  }
  pearson_.add(row.pearson);
  topk_recall_.add(row.topk_recall);
}

double QualityStats::work_fraction() const {
  return visible_sum_ > 0 ? (scored_sum_ + probe_sum_) / visible_sum_ : kNaN;
}

double QualityStats::probe_fraction() const {
  return visible_sum_ > 0 ? probe_sum_ / visible_sum_ : kNaN;
}

bool QualityStats::merge(const QualityStats& other) {
  if (other.topk_ != topk_) return false;
  samples_ += other.samples_;
  exact_ += other.exact_;
  recall_.merge(other.recall_);
  miss_.merge(other.miss_);
  block_recall_.merge(other.block_recall_);
  sparsity_.merge(other.sparsity_);
  block_sparsity_.merge(other.block_sparsity_);
  pearson_.merge(other.pearson_);
  topk_recall_.merge(other.topk_recall_);
  visible_sum_ += other.visible_sum_;
  scored_sum_ += other.scored_sum_;
  probe_sum_ += other.probe_sum_;
  return true;
}

}  // namespace spin
