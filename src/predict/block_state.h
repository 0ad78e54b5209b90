// BlockState: SPIN's state of one (request, indexer layer) — slot EMA and last_seen per block,
// and the relative-offset EMA. Internal to spin_predict; PredictorBase::state() hands it to tests.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "predict/pooling.h"
#include "spin/numerics.h"
#include "spin/predict.h"

namespace spin {

// Offset buckets: distance d (in blocks) maps to bucket d while d < kOffsetExactDistances, then to
// kOffsetBucketsPerOctave log-spaced buckets per doubling: bucket(d) = 64 + 4·(floor(log2 d) − 6)
// + (the two bits after d's leading bit). Distances 64..127 → buckets of 16, 128..255 → 32, ...
inline constexpr int64_t kOffsetExactDistances = 64;
inline constexpr int64_t kOffsetBucketsPerOctave = 4;
int32_t offset_bucket(int64_t distance);  // distance ≥ 0

// The offset EMA's per-bucket mean sums the observations in fixed point (x · 2^30, rounded to
// nearest-even), an integer sum that is the same in any order: the device path
// (python/spin_dsa/device) sums a bucket with one scatter-add and gets this library's bits. |x| ≤
// 1 + ln(2^20) for every pooling, so a bucket of up to 2^28 blocks cannot overflow; 2^-30 is far
// below a float's resolution at the EMA's scale (x ~ 1).
inline constexpr double kOffsetMeanScale = 1073741824.0;  // 2^30
int64_t offset_fixed_point(float x);
// The mean of `count` observations whose fixed-point sum is fixed_sum, as the EMA takes it.
float offset_mean(int64_t fixed_sum, int64_t count);

// The slot EMA is kept in binary16 (spin/numerics.h): an observation |x| ≤ 1 + ln(2^20) needs
// none of float's range, and 11 significant bits order blocks as well as 24 do (docs/results.md,
// "the slot EMA in binary16"); it halves the state a GPU keeps per block and lets the device hold
// an MTP draft row's observations in 2 bytes. So apply() takes each observation at binary16 (x
// rounded to the nearest half, ties to even) — for the slot and the offset EMA alike — and rounds
// the slot's float32 update (no fused multiply-add) back to binary16. (A caveat for very small
// alpha: an update smaller than half a binary16 step near the slot's value is lost — at alpha
// 0.01 an EMA at 0.9 fed 0.95 stops at 0.926; spin's alpha is 0.5, the tested range 0.3–1.)
// Persistent state bytes per block per (request, layer): binary16 slot + int32 last_seen.
inline constexpr size_t kStateBytesPerBlock = 6;
// Per offset bucket: float EMA + int32 update count.
inline constexpr size_t kStateBytesPerOffsetBucket = 8;

// last_seen of a block that was never observed (older than every step, which are ≥ 0).
inline constexpr int32_t kNeverSeen = -1;

class BlockState {
 public:
  BlockState() = default;
  BlockState(double alpha, double beta)
      : alpha_(static_cast<float>(alpha)), beta_(static_cast<float>(beta)) {}

  // Grows to n_blocks (new blocks: never seen). Never shrinks; amortised O(new blocks).
  void ensure_blocks(int64_t n_blocks);
  // Drops blocks ≥ n_blocks (prefix sharing of a shorter context).
  void truncate(int64_t n_blocks);
  // Applies one row's observation at `step` (each x taken at binary16): slot EMA + last_seen for
  // every observed block, then one offset EMA update per touched bucket with the mean x of the
  // row's blocks in that bucket.
  // O(observed blocks).
  void apply(const PooledRow& row, int32_t step);
  void reset();
  // Capacity for n_blocks blocks (and the offset buckets they reach): later growth up to it does
  // not allocate.
  void reserve(int64_t n_blocks);

  int64_t n_blocks() const { return static_cast<int64_t>(slot_.size()); }
  bool seen(int64_t b) const { return last_seen_[b] != kNeverSeen; }
  float slot(int64_t b) const { return half_to_float(slot_[b]); }
  int32_t last_seen(int64_t b) const { return last_seen_[b]; }
  int64_t n_offset_buckets() const { return static_cast<int64_t>(offset_.size()); }
  bool offset_known(int32_t bucket) const {
    return bucket < n_offset_buckets() && offset_count_[bucket] > 0;
  }
  float offset(int32_t bucket) const { return offset_[bucket]; }
  int32_t offset_updates(int32_t bucket) const { return offset_count_[bucket]; }
  float alpha() const { return alpha_; }
  float beta() const { return beta_; }
  // n_blocks · kStateBytesPerBlock + buckets · kStateBytesPerOffsetBucket.
  size_t memory_bytes() const;

 private:
  float alpha_ = 0.5f;
  float beta_ = 0.1f;
  std::vector<uint16_t> slot_;  // binary16 bits
  std::vector<int32_t> last_seen_;
  std::vector<float> offset_;
  std::vector<int32_t> offset_count_;
};

}  // namespace spin
