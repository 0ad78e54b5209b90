// Pooling: one row's indexer scores → one normalised value x[b] per scored block (a predictor's
// observation, ARCHITECTURE.md). Normalisation and the pooling modes are defined next to PooledRow
// in predict/pooling.h; this file owns the validation of the row and the passes that compute them.
//
// With the kernel's top-k (topk_positions), the scored entries are read ONCE:
//   k-th:   kth and row max from the top-k positions (O(topk));
//   pool:   every visible entry of every scored block: reject NaN/+inf, skip -inf (not scored),
//           per-block max / sum / lse and top-k hits, then x[b]; afterwards the top-k is checked
//           against the counts (how many entries lie above / at its smallest score).
// Without it, a first pass validates, takes the row max and copies the values, nth_element finds
// the k-th, and the pool pass follows; ties at the k-th score go to lower positions first (the
// top-k tie rule of spin/topk.h: score descending, position ascending).
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <limits>
#include <vector>


#include "predict/pooling.h"

#include "core/errors.h"

namespace spin {

void PooledRow::clear() {
  visible_entries = 0;
  newest_block = -1;
  scored_entries = 0;
  kth_score = 0.0;
  max_score = 0.0;
  blocks.clear();
  x.clear();
  topk_hits.clear();
}

namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

const char* non_finite_name(float s) { return std::isnan(s) ? "NaN" : "+inf"; }

Status non_finite_error(int64_t pos, int32_t block, float s) {
  return invalid_argument(
      "score at position {} (block {}) is {}; scored entries must be finite (-inf marks an entry "
      "that was not scored)",
      pos, block, non_finite_name(s));
}

// Relative value → x: identity above 0, r/(1-r) below (monotone, bounded by -1).
float squash(double r) { return static_cast<float>(r >= 0.0 ? r : r / (1.0 - r)); }

// The scalar tail of both scans below: entries one by one, sums in double.
void scan_tail(const float* s, int64_t len, float kth, detail::BlockScan* out) {
  for (int64_t pos = 0; pos < len; ++pos) {
    const float v = s[pos];
    if (v == -kInf) continue;
    out->non_finite |= !(std::fabs(v) < kInf);
    ++out->n;
    out->sum += v;
    out->max = std::max(out->max, v);
    out->greater += v > kth;
    out->equal += v == kth;
  }
}

// Folds the lanes' partial results into out in lane order (then the tail follows).
void fold_lanes(const float* sum, const float* max, detail::BlockScan* out) {
  for (int i = 0; i < detail::kScanLanes; ++i) {
    out->sum += sum[i];
    out->max = std::max(out->max, max[i]);
  }
}

}  // namespace

namespace detail {

BlockScan scan_block_reference(const float* s, int64_t len, float kth) {
  BlockScan out;
  const int64_t body = len / kScanLanes * kScanLanes;
  float sum[kScanLanes], max[kScanLanes];
  std::fill_n(sum, kScanLanes, 0.0f);
  std::fill_n(max, kScanLanes, -kInf);
  for (int64_t pos = 0; pos < body; ++pos) {
    const float v = s[pos];
    const int lane = static_cast<int>(pos % kScanLanes);
    max[lane] = v > max[lane] ? v : max[lane];  // -inf and NaN never replace it
    if (v == -kInf) continue;
    out.non_finite |= !(std::fabs(v) < kInf);
    ++out.n;
    sum[lane] += v;
    out.greater += v > kth;
    out.equal += v == kth;
  }
  fold_lanes(sum, max, &out);
  scan_tail(s + body, len - body, kth, &out);
  return out;
}

// The same arithmetic four entries at a time with the compiler's generic vectors (SSE2 on x86-64,
// NEON on aarch64: baseline, no dispatch; GCC does not vectorise the scalar loop because of its
// float compares): 2.5 → ~0.6 ns per entry on the dev machine. A -inf entry adds +0 to its lane
// sum — the identity, as a lane sum that starts at +0 is never -0 — and nothing to the counts (kth
// is a finite score, so -inf is never above or equal to it).
BlockScan scan_block(const float* s, int64_t len, float kth) {
  using F4 = float __attribute__((vector_size(16)));
  using I4 = int32_t __attribute__((vector_size(16)));
  static_assert(kScanLanes == 4, "one F4 per step");
  BlockScan out;
  const int64_t body = len / kScanLanes * kScanLanes;
  F4 sum = F4{}, max = F4{} - kInf;
  I4 n = I4{}, greater = n, equal = n, bad = n;
  for (int64_t pos = 0; pos < body; pos += kScanLanes) {
    F4 v;
    std::memcpy(&v, s + pos, sizeof(v));
    const I4 bits = std::bit_cast<I4>(v);
    const I4 valid = v != -kInf;  // a true lane is -1
    n -= valid;
    sum += std::bit_cast<F4>(valid & bits);
    const I4 above = v > max;
    max = std::bit_cast<F4>((above & bits) | (~above & std::bit_cast<I4>(max)));
    greater -= v > kth;
    equal -= v == kth;
    // NaN: |bits| above the infinity pattern; +inf: exactly it (-inf has the sign bit set).
    bad |= ((bits & 0x7FFFFFFF) > 0x7F800000) | (bits == 0x7F800000);
  }
  float lane_sum[kScanLanes], lane_max[kScanLanes];
  for (int i = 0; i < kScanLanes; ++i) {
    lane_sum[i] = sum[i];
    lane_max[i] = max[i];
    out.n += n[i];
    out.greater += greater[i];
    out.equal += equal[i];
    out.non_finite |= bad[i] != 0;
  }
  fold_lanes(lane_sum, lane_max, &out);
  scan_tail(s + body, len - body, kth, &out);
  return out;
}

}  // namespace detail

namespace {

using detail::BlockScan;
using detail::scan_block;

// pool_row_impl's stages share the row, its list of scored blocks and what the k-th pass found.
struct RowView {
  const RowScores& row;
  int64_t e;           // entries per block
  int64_t vis_blocks;  // blocks the row sees
  const int32_t* sb;   // the scored block list
  int64_t nvis;        // the first nvis listed blocks lie inside the row's view
};

struct KthPass {
  double kth = 0.0;
  float row_max = -kInf;
  int64_t k_eff = 0;      // own: min(topk, scored entries); given: the valid positions
  int64_t ties_left = 0;  // own: entries equal to the k-th that are still in the top-k
};

// Sizes and pointers of the row, then the scored block list: ascending, non-negative.
Status check_row(const RowScores& row) {
  if (row.num_cols < 0 || row.visible_entries < 0 || row.visible_entries > row.num_cols)
    return invalid_argument("row scores: visible {} must lie in [0, num_cols = {}]", row.visible_entries,
                            row.num_cols);
  if (row.num_scored_blocks < 0)
    return invalid_argument("row scores: num_scored_blocks {} < 0", row.num_scored_blocks);
  if (row.num_scored_blocks > 0 && row.scored_blocks == nullptr)
    return invalid_argument("row scores: scored_blocks is null but num_scored_blocks = {}",
                            row.num_scored_blocks);
  if (row.num_scored_blocks > 0 && row.visible_entries > 0 && row.scores == nullptr)
    return invalid_argument("row scores: scores is null");
  return ok_status();
}

Status check_block_list(const int32_t* sb, int64_t nsb) {
  for (int64_t i = 0; i < nsb; ++i) {
    if (sb[i] < 0) return out_of_range("scored block {} (list index {}) is negative", sb[i], i);
    if (i > 0 && sb[i] <= sb[i - 1])
      return invalid_argument("scored blocks must be strictly ascending: {} follows {} at index {}",
                              sb[i], sb[i - 1], i);
  }
  return ok_status();
}

// Without the kernel's top-k: validates and copies the scored values, nth_element finds the k-th.
// Sets *empty when nothing was scored (then there is nothing to pool).
Status own_kth(const PredictorConfig& config, const RowView& v, PoolScratch* scratch, KthPass* k,
               bool* empty) {
  const RowScores& row = v.row;
  std::vector<float>& values = scratch->values;
  int64_t most = 0;  // an upper bound on the scored visible entries
  for (int64_t i = 0; i < v.nvis; ++i) most += std::min(v.e, row.visible_entries - v.sb[i] * v.e);
  if (static_cast<int64_t>(values.size()) < most) values.resize(static_cast<size_t>(most));
  float* copy = values.data();
  int64_t count = 0;  // a local (not out->...) keeps it in a register
  float row_max = -kInf;
  for (int64_t i = 0; i < v.nvis; ++i) {
    const int64_t end = std::min(v.sb[i] * v.e + v.e, row.visible_entries);
    for (int64_t pos = v.sb[i] * v.e; pos < end; ++pos) {
      const float s = row.scores[pos];
      if (s == -kInf) continue;
      if (!(std::fabs(s) < kInf)) return non_finite_error(pos, v.sb[i], s);
      row_max = std::max(row_max, s);
      copy[count++] = s;
    }
  }
  k->row_max = row_max;
  *empty = count == 0;
  if (count == 0) return ok_status();
  k->k_eff = std::min<int64_t>(config.topk, count);
  std::nth_element(copy, copy + (k->k_eff - 1), copy + count, std::greater<float>());
  k->kth = copy[k->k_eff - 1];
  int64_t greater = 0;
  for (int64_t i = 0; i < count; ++i) greater += copy[i] > k->kth;
  k->ties_left = k->k_eff - greater;
  return ok_status();
}

// With the kernel's top-k: the k-th and the row max from its positions (O(topk)), and the hits per
// scored-list index (compacted to observed blocks in the pool pass). The block → list index map
// costs O(listed blocks) to set and clear, not a search per position.
Status given_kth(const PredictorConfig& config, const RowView& v, PoolScratch* scratch,
                 std::vector<int32_t>* hits, KthPass* k) {
  const RowScores& row = v.row;
  hits->assign(static_cast<size_t>(v.nvis), 0);
  std::vector<int32_t>& index = scratch->block_index;
  if (static_cast<int64_t>(index.size()) < v.vis_blocks) index.resize(static_cast<size_t>(v.vis_blocks), -1);
  for (int64_t i = 0; i < v.nvis; ++i) index[static_cast<size_t>(v.sb[i])] = static_cast<int32_t>(i);
  const auto clear_index = [&] {
    for (int64_t i = 0; i < v.nvis; ++i) index[static_cast<size_t>(v.sb[i])] = -1;
  };
  k->kth = kInf;
  for (int32_t t = 0; t < config.topk; ++t) {
    const int32_t p = row.topk_positions[t];
    if (p == -1) continue;
    Status error;
    const int32_t b = p >= 0 ? static_cast<int32_t>(p / v.e) : -1;
    const float s = p >= 0 && p < row.visible_entries ? row.scores[p] : 0.0f;
    if (p < 0 || p >= row.visible_entries) {
      error = out_of_range("topk_positions[{}] = {} is outside the row's {} visible entries", t, p,
                           row.visible_entries);
    } else if (index[static_cast<size_t>(b)] < 0) {
      error = invalid_argument("topk_positions[{}] = {} lies in block {}, which was not scored", t, p, b);
    } else if (s == -kInf) {
      error = invalid_argument("topk_positions[{}] = {} holds -inf (an entry not scored)", t, p);
    } else if (!(std::fabs(s) < kInf)) {
      error = non_finite_error(p, b, s);
    }
    if (!error.ok()) {
      clear_index();
      return error;
    }
    ++(*hits)[static_cast<size_t>(index[static_cast<size_t>(b)])];
    k->kth = std::min(k->kth, static_cast<double>(s));
    k->row_max = std::max(k->row_max, s);
    ++k->k_eff;
  }
  clear_index();
  if (k->k_eff == 0) k->kth = 0.0;  // only consistent if nothing was scored: checked after pooling
  return ok_status();
}

// The rank-th largest scored (not -inf) value of scores[begin, end), or the smallest when fewer are
// scored; the block's max when rank is 1. Values, not positions: ties need no rule.
float ranked_max(const float* scores, int64_t begin, int64_t end, const BlockScan& scan, int64_t rank,
                 std::vector<float>* values) {
  if (rank <= 1) return scan.max;
  values->clear();
  for (int64_t pos = begin; pos < end; ++pos)
    if (scores[pos] != -kInf) values->push_back(scores[pos]);
  const auto nth = values->begin() + (std::min<int64_t>(rank, scan.n) - 1);
  std::nth_element(values->begin(), nth, values->end(), std::greater<float>());
  return *nth;
}

// The relative value r of one block (before squash), by the configured pooling.
double pooled_value(const PredictorConfig& config, const float* scores, int64_t begin, int64_t end,
                    const BlockScan& scan, double kth, double spread, int64_t rank,
                    std::vector<float>* values) {
  switch (config.pooling) {
    case Pooling::kMax: return (ranked_max(scores, begin, end, scan, rank, values) - kth) / spread;
    case Pooling::kMean: return (scan.sum / static_cast<double>(scan.n) - kth) / spread;
    case Pooling::kLse: {
      // log Σ exp(z) with z = (s - kth)/spread, shifted by the block's largest z for stability.
      const double m = (scan.max - kth) / spread;
      double acc = 0.0;
      for (int64_t pos = begin; pos < end; ++pos) {
        const float s = scores[pos];
        if (s != -kInf) acc += std::exp((s - kth) / spread - m);
      }
      return m + std::log(acc);
    }
    case Pooling::kTopkHits: break;
  }
  return 0.0;
}

// Totals of the pool pass, for the consistency check of a given top-k.
struct PoolTotals {
  int64_t count = 0, greater = 0, equal = 0;
};

// The pool pass: every visible entry of every scored block once — reject NaN/+inf, skip -inf —
// then x[b] and the block's top-k hits for each block with a scored entry.
Status pool_blocks(const PredictorConfig& config, const RowView& v, KthPass k, bool own_topk, int64_t rank,
                   PoolScratch* scratch, PooledRow* out, PoolTotals* totals) {
  const RowScores& row = v.row;
  std::vector<int32_t>& hits = out->topk_hits;
  double spread = static_cast<double>(k.row_max) - k.kth;
  if (!(spread > 0.0)) spread = (k.k_eff > 0 && k.row_max != 0.0f) ? std::fabs(double{k.row_max}) : 1.0;
  size_t n_out = 0;
  for (int64_t i = 0; i < v.nvis; ++i) {
    const int64_t begin = v.sb[i] * v.e;
    const int64_t end = std::min(begin + v.e, row.visible_entries);
    const BlockScan scan = scan_block(row.scores + begin, end - begin, static_cast<float>(k.kth));
    if (scan.non_finite) {  // find the first offender for the message
      for (int64_t pos = begin; pos < end; ++pos)
        if (row.scores[pos] != -kInf && !(std::fabs(row.scores[pos]) < kInf))
          return non_finite_error(pos, v.sb[i], row.scores[pos]);
    }
    if (scan.n == 0) continue;
    totals->count += scan.n;
    totals->greater += scan.greater;
    totals->equal += scan.equal;
    int64_t block_hits;
    if (own_topk) {
      const int64_t take = std::min(scan.equal, k.ties_left);
      k.ties_left -= take;
      block_hits = scan.greater + take;
    } else {
      block_hits = hits[static_cast<size_t>(i)];
    }
    const double r =
        pooled_value(config, row.scores, begin, end, scan, k.kth, spread, rank, &scratch->block_values);
    out->blocks.push_back(v.sb[i]);
    out->x.push_back(config.pooling == Pooling::kTopkHits
                         ? static_cast<float>(static_cast<double>(block_hits) / static_cast<double>(v.e))
                         : squash(r));
    if (own_topk) {
      hits.push_back(static_cast<int32_t>(block_hits));
    } else {
      hits[n_out] = static_cast<int32_t>(block_hits);  // n_out ≤ i: compaction is in place
    }
    ++n_out;
  }
  hits.resize(n_out);
  return ok_status();
}

// A given top-k must hold min(topk, scored entries) positions, and be the row's top-k.
Status check_given_topk(const PredictorConfig& config, const KthPass& k, const PoolTotals& t) {
  const int64_t want = std::min<int64_t>(config.topk, t.count);
  if (k.k_eff != want)
    return invalid_argument(
        "topk_positions holds {} positions but the row has {} scored entries; expected "
        "min(topk = {}, {}) = {}",
        k.k_eff, t.count, config.topk, t.count, want);
  if (k.k_eff > 0 && !(t.greater < k.k_eff && t.greater + t.equal >= k.k_eff))
    return invalid_argument(
        "topk_positions is not the row's top-{}: {} scored entries are above its smallest "
        "score {} and {} equal it",
        k.k_eff, t.greater, k.kth, t.equal);
  return ok_status();
}

Status pool_row_impl(const PredictorConfig& config, const RowScores& row, int64_t rank, PooledRow* out,
                     PoolScratch* scratch) {
  SPIN_RETURN_IF_ERROR(check_row(row));
  const int64_t e = config.block_entries();
  const int64_t vis_blocks = blocks_for_entries(config, row.visible_entries);
  out->visible_entries = row.visible_entries;
  out->newest_block = vis_blocks - 1;
  const int32_t* sb = row.scored_blocks;
  SPIN_RETURN_IF_ERROR(check_block_list(sb, row.num_scored_blocks));
  // Only the listed blocks the row can see matter: [0, nvis) of the list. Blocks past them are
  // skipped, not refused: an MTP union holds later rows' newest blocks, beyond earlier rows' view.
  const int64_t nvis =
      std::lower_bound(sb, sb + row.num_scored_blocks,
                       static_cast<int32_t>(std::min<int64_t>(vis_blocks, INT32_MAX))) -
      sb;
  const RowView v{row, e, vis_blocks, sb, nvis};
  const bool own_topk = row.topk_positions == nullptr;
  KthPass k;
  if (own_topk) {
    bool empty = false;
    SPIN_RETURN_IF_ERROR(own_kth(config, v, scratch, &k, &empty));
    if (empty) return ok_status();
  } else {
    SPIN_RETURN_IF_ERROR(given_kth(config, v, scratch, &out->topk_hits, &k));
  }
  out->kth_score = k.kth;
  out->max_score = k.k_eff > 0 ? k.row_max : 0.0;
  PoolTotals totals;
  SPIN_RETURN_IF_ERROR(pool_blocks(config, v, k, own_topk, rank, scratch, out, &totals));
  out->scored_entries = totals.count;
  if (!own_topk) SPIN_RETURN_IF_ERROR(check_given_topk(config, k, totals));
  return ok_status();
}

}  // namespace

Status pool_row(const PredictorConfig& config, const RowScores& row, PooledRow* out,
                std::vector<float>* values_scratch) {
  PoolScratch scratch;
  if (values_scratch) scratch.values.swap(*values_scratch);
  Status s = pool_row(config, row, out, &scratch);
  if (values_scratch) values_scratch->swap(scratch.values);
  return s;
}

int64_t pool_rank(const PredictorConfig& config, int64_t n_blocks) {
  const int64_t budget = budget_blocks(config, n_blocks);
  if (budget <= 0 || config.pool_depth <= 0.0) return 1;
  const double m = std::ceil(config.pool_depth * static_cast<double>(config.topk) / static_cast<double>(budget));
  return std::clamp<int64_t>(static_cast<int64_t>(m), 1, config.block_entries());
}

Status pool_row(const PredictorConfig& config, const RowScores& row, PooledRow* out,
                PoolScratch* scratch, int64_t rank) {
  if (out == nullptr) return invalid_argument("pool_row: out is null");
  out->clear();
  PoolScratch local;
  Status s = pool_row_impl(config, row, rank, out, scratch ? scratch : &local);
  if (!s.ok()) out->clear();  // never leave a half-pooled row behind
  return s;
}

}  // namespace spin
