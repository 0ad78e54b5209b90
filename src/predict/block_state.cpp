// BlockState (predict/block_state.h): the per-(request, layer) SPIN state — slot EMA + last_seen per block
// and the relative-offset EMA over bucketed distances. Updated in O(observed blocks), grown by
// appending blocks, never rebuilt from history.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>

#include "predict/block_state.h"

namespace spin {

int32_t offset_bucket(int64_t distance) {
  if (distance < kOffsetExactDistances) return static_cast<int32_t>(distance);
  // h = floor(log2 d) ≥ 6; the two bits below the leading one pick a quarter of the octave.
  const int h = static_cast<int>(std::bit_width(static_cast<uint64_t>(distance))) - 1;
  const int64_t quarter = (distance >> (h - 2)) & 3;
  return static_cast<int32_t>(kOffsetExactDistances + (h - 6) * kOffsetBucketsPerOctave + quarter);
}

int64_t offset_fixed_point(float x) {
  return static_cast<int64_t>(std::nearbyint(static_cast<double>(x) * kOffsetMeanScale));
}

float offset_mean(int64_t fixed_sum, int64_t count) {
  return static_cast<float>(static_cast<double>(fixed_sum) / kOffsetMeanScale /
                            static_cast<double>(count));
}

void BlockState::ensure_blocks(int64_t n_blocks) {
  if (n_blocks <= this->n_blocks()) return;
  const size_t n = static_cast<size_t>(n_blocks);
  slot_.resize(n, 0);
  last_seen_.resize(n, kNeverSeen);
  // The farthest distance a row of this context can see is n_blocks - 1.
  const size_t buckets = static_cast<size_t>(offset_bucket(n_blocks - 1)) + 1;
  if (buckets > offset_.size()) {
    offset_.resize(buckets, 0.0f);
    offset_count_.resize(buckets, 0);
  }
}

void BlockState::truncate(int64_t n_blocks) {
  if (n_blocks >= this->n_blocks()) return;
  const size_t n = static_cast<size_t>(std::max<int64_t>(0, n_blocks));
  slot_.resize(n);
  last_seen_.resize(n);
  // Offsets describe distances, not blocks: they stay valid for the shorter context.
}

void BlockState::apply(const PooledRow& row, int32_t step) {
  if (row.blocks.empty()) return;
  ensure_blocks(std::max<int64_t>(row.newest_block, row.blocks.back()) + 1);
  const size_t n = row.blocks.size();
  // Blocks ascend, so distances descend and buckets come in runs: one pass, no scratch, each x
  // rounded to binary16 once for its slot and its bucket. One offset EMA update per bucket per
  // row (with the run's mean) so a wide far bucket does not get dozens of updates from a single
  // step while a near bucket gets one.
  size_t i = 0;
  while (i < n) {
    const int32_t bucket = offset_bucket(row.newest_block - row.blocks[i]);
    int64_t sum = 0;
    size_t j = i;
    for (; j < n && offset_bucket(row.newest_block - row.blocks[j]) == bucket; ++j) {
      const size_t b = static_cast<size_t>(row.blocks[j]);
      const float x = round_to_half(row.x[j]);
      const float old = half_to_float(slot_[b]);
      const float ema = last_seen_[b] == kNeverSeen ? x : (1.0f - alpha_) * old + alpha_ * x;
      slot_[b] = half_from_float(ema);
      last_seen_[b] = step;
      sum += offset_fixed_point(x);
    }
    const float mean = offset_mean(sum, static_cast<int64_t>(j - i));
    float& o = offset_[static_cast<size_t>(bucket)];
    int32_t& count = offset_count_[static_cast<size_t>(bucket)];
    o = count == 0 ? mean : (1.0f - beta_) * o + beta_ * mean;
    if (count < INT32_MAX) ++count;
    i = j;
  }
}

void BlockState::reserve(int64_t n_blocks) {
  if (n_blocks < 1) return;
  const size_t n = static_cast<size_t>(n_blocks);
  slot_.reserve(n);
  last_seen_.reserve(n);
  const size_t buckets = static_cast<size_t>(offset_bucket(n_blocks - 1)) + 1;
  offset_.reserve(buckets);
  offset_count_.reserve(buckets);
}

void BlockState::reset() {
  // clear() keeps the capacity: a reset request regrows without reallocating.
  slot_.clear();
  last_seen_.clear();
  offset_.clear();
  offset_count_.clear();
}

size_t BlockState::memory_bytes() const {
  return slot_.size() * kStateBytesPerBlock + offset_.size() * kStateBytesPerOffsetBucket;
}

}  // namespace spin
