// PredictorBase (see predictor_base.h): the protocol, selection and MTP replay every predictor
// shares. Selection of one row with budget B among its n visible blocks, all in O(n):
//   1. forced: the newest local_blocks and the first sink_blocks (budget_blocks() makes room);
//   2. exploration (explores() only): E = min(round(explore_share(layer)·B), B - forced) of the rest,
//      `uniform`: the E smallest counter hashes rng.at(b) (top 32 bits) with rng keyed on (seed,
//      request, layer, step) — a uniformly random subset, and the same draw for every row of a
//      step, so MTP rows explore the same blocks and the union stays small; `stalest`: oldest
//      last_seen first, never-seen oldest of all, ties to the lower index;
//   3. prediction: the highest rank() p[b] fill the rest, ties to the lower index;
//   3b. a probing row (probe_quota() > 0: hisa, spin-hybrid) skips 2 and keeps its quota for last:
//      history (3) fills the budget minus the quota, then the highest probe() q[b] among the
//      blocks left — the probe spends its share where history did not already look.
// The budget is budget_blocks(), moved between layers and steps by config().budget_moves for the
// predictors that opt in (budget_moves.h; the adaptive probe share: probe_share.h).
// Selecting the smallest keys (kselect.h) where a key is (value, then index) — a strict total
// order — makes the chosen set unique, independent of the selection algorithm; the set is then
// emitted in index order.
#include "predict/predictor_base.h"

#include <algorithm>
#include <bit>
#include <chrono>
#include <cfloat>
#include <climits>
#include <cmath>
#include <new>
#include <utility>

#include "core/errors.h"
#include "predict/kselect.h"
#include "predict/select_rules.h"
#include "spin/rng.h"

namespace spin {
namespace {

// A uint32 that orders like the float (no NaN: select_row maps those to -FLT_MAX first).
uint32_t float_order(float v) {
  const uint32_t bits = std::bit_cast<uint32_t>(v + 0.0f);  // + 0 turns -0 into +0
  return (bits & 0x80000000u) ? ~bits : bits | 0x80000000u;
}

// NaN and -inf from a predictor (e.g. a NaN in a cached key) would break the strict order.
float sanitize(float v) { return v >= -FLT_MAX ? v : -FLT_MAX; }

}  // namespace

PredictorBase::PredictorBase(std::string name, const PredictorConfig& config, int32_t num_layers,
                             int64_t request_id, double alpha, double beta)
    : name_(std::move(name)),
      config_(config),
      num_layers_(num_layers),
      request_id_(request_id),
      layers_(static_cast<size_t>(num_layers)) {
  for (Layer& l : layers_) l.state = BlockState(alpha, beta);
}

void PredictorBase::fill_unknown(float* p, int64_t n_blocks) {
  for (int64_t b = 0; b < n_blocks; ++b) p[b] = unknown_score(n_blocks - 1 - b);
}

Status PredictorBase::prepare(int32_t layer, const StepInput& in) {
  (void)layer;
  (void)in;
  return ok_status();
}

const PooledRow* PredictorBase::current_observation(int32_t layer, int32_t row,
                                                    int64_t step) const {
  if (layer < 0 || layer >= num_layers_ || !open_ || open_step_ != step) return nullptr;
  const Layer& l = layers_[static_cast<size_t>(layer)];
  if (!l.selected || row < 0 || row >= open_next_n_ || !(l.observed >> row & 1u)) return nullptr;
  return &l.pending[static_cast<size_t>(row)];
}

Status PredictorBase::check_layer_observed(int32_t full, int32_t layer, const StepInput& in) const {
  for (int32_t j = 0; j < in.next_n; ++j)
    if (!current_observation(full, j, in.step))
      return failed_precondition(
          "{}: layer {} reuses full layer {}'s top-k at step {}, but its row {} has not been "
          "observed yet; run layers in increasing order",
          name_, layer, full, in.step, j);
  return ok_status();
}

void PredictorBase::rank_by_layer_topk(const RowContext& row, int32_t full, float* p) const {
  fill_unknown(p, row.n_blocks);
  const PooledRow* obs = current_observation(full, row.row, row.step);
  for (size_t i = 0; i < obs->blocks.size() && obs->blocks[i] < row.n_blocks; ++i)
    if (obs->topk_hits[i] > 0) p[obs->blocks[i]] = static_cast<float>(obs->topk_hits[i]);
}

void PredictorBase::raise_previous_topk(const RowContext& row, float base, HitTies ties, float* p) const {
  const Layer& l = layers_[static_cast<size_t>(row.layer)];
  for (size_t i = 0; i < l.prev_topk_blocks.size() && l.prev_topk_blocks[i] < row.n_blocks; ++i) {
    float& v = p[l.prev_topk_blocks[i]];
    if (ties == HitTies::kIndex) {
      v = base + static_cast<float>(l.prev_topk_hits[i]);
    } else {  // only one block can hold 2^20 hits, so the cap never reorders two
      v = base + static_cast<float>(std::min(l.prev_topk_hits[i], kTopkHitsCap)) + hit_tie_level(v);
    }
  }
}

float PredictorBase::hit_tie_level(float p) {
  const float quarter = std::floor((p + 1.0f) * 4.0f);  // NaN fails the test below: level 0
  return (quarter > 0.0f ? std::min(quarter, 7.0f) : 0.0f) * 0.125f;
}

const BlockState& PredictorBase::state(int32_t layer) const {
  static const BlockState kEmpty;
  if (layer < 0 || layer >= num_layers_) return kEmpty;
  return layers_[static_cast<size_t>(layer)].state;
}

size_t PredictorBase::memory_bytes() const {
  size_t bytes = extra_memory_bytes();
  for (const Layer& l : layers_) bytes += l.state.memory_bytes();
  return bytes;
}

// A probe must hold every row's blocks at the predictor's block size: probe_row() relies on it.
Status PredictorBase::check_block_probe(const StepInput& step) const {
  const PredictorInputs& in = inputs_of(step);
  if (in.block_probe == nullptr) return ok_status();
  if (in.block_probe_entries != config_.block_entries())
    return invalid_argument("{}: block_probe_entries {} differs from the config's block_entries {} "
                            "(page_size {} x block_pages {})",
                            name_, in.block_probe_entries, config_.block_entries(), config_.page_size,
                            config_.block_pages);
  for (int32_t j = 0; j < step.next_n; ++j) {
    const int64_t n = blocks_for_entries(config_, visible_entries(step, j));
    if (in.block_probe_stride < n)
      return invalid_argument("{}: block_probe_stride {} is below row {}'s {} blocks", name_,
                              in.block_probe_stride, j, n);
  }
  return ok_status();
}

Status PredictorBase::check_step_input(int32_t layer, const StepInput& in) const {
  if (layer < 0 || layer >= num_layers_)
    return invalid_argument("{}: layer {} is outside [0, {})", name_, layer, num_layers_);
  if (in.next_n < 1 || in.next_n > kMaxNextN)
    return invalid_argument("{}: next_n {} is outside the supported 1..{}", name_, in.next_n,
                            kMaxNextN);
  // last_seen is stored as int32 (6 bytes of state per block with the binary16 slot, not 10).
  if (in.step < 0 || in.step > INT32_MAX)
    return invalid_argument("{}: step {} is outside [0, 2^31)", name_, in.step);
  if (in.num_entries < 0) return invalid_argument("{}: num_entries {} < 0", name_, in.num_entries);
  if (in.visible_entries) {
    for (int32_t j = 0; j < in.next_n; ++j)
      if (in.visible_entries[j] < 0 || in.visible_entries[j] > in.num_entries)
        return invalid_argument("{}: visible_entries[{}] = {} is outside [0, num_entries = {}]", name_,
                                j, in.visible_entries[j], in.num_entries);
  }
  SPIN_RETURN_IF_ERROR(check_block_probe(in));
  // Protocol: select(step) → observe every row → commit(accepted) → next step.
  if (open_) {
    if (in.step != open_step_)
      return failed_precondition(
          "{}: step {} is still open; call commit(accepted) before selecting step {}", name_,
          open_step_, in.step);
    if (in.next_n != open_next_n_)
      return invalid_argument("{}: next_n {} differs from the open step's next_n {}", name_,
                              in.next_n, open_next_n_);
    if (layers_[static_cast<size_t>(layer)].selected)
      return failed_precondition("{}: layer {} was already selected in step {}", name_, layer,
                                 in.step);
  } else if (in.step <= last_committed_) {
    return failed_precondition("{}: step {} is not after the last committed step {}", name_,
                               in.step, last_committed_);
  }
  return ok_status();
}

Status PredictorBase::select(int32_t layer, const StepInput& in, Selection* out) {
  if (out == nullptr) return invalid_argument("{}: select: out is null", name_);
  SPIN_RETURN_IF_ERROR(check_step_input(layer, in));
  // prepare() is where a probing predictor folds new entries into its pooled keys (the whole
  // prompt at the first step: prefill work in a serving engine): probe time, like the scoring.
  const auto t0 = std::chrono::steady_clock::now();
  SPIN_RETURN_IF_ERROR(prepare(layer, in));
  const double prepare_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();

  Layer& l = layers_[static_cast<size_t>(layer)];
  const Fill f = fill(layer);
  const size_t rows = static_cast<size_t>(in.next_n);
  int64_t max_blocks = 0;
  std::array<int64_t, kMaxNextN> visible{};
  for (int32_t j = 0; j < in.next_n; ++j) {
    visible[static_cast<size_t>(j)] = visible_entries(in, j);
    max_blocks = std::max(max_blocks, blocks_for_entries(config_, visible[static_cast<size_t>(j)]));
  }
  l.state.ensure_blocks(max_blocks);
  const size_t n_max = static_cast<size_t>(max_blocks);
  if (p_.size() < n_max) {
    p_.resize(n_max);
    q_.resize(n_max);
    mark_.resize(n_max);
    keys_.resize(n_max);
  }

  out->row_blocks.resize(rows);
  out->row_budget.assign(rows, 0);
  out->row_explored.assign(rows, 0);
  out->row_probed.assign(rows, 0);
  out->probe_seconds = prepare_seconds;
  out->row_scores.resize(in.want_scores ? rows : 0);
  for (int32_t j = 0; j < in.next_n; ++j) {
    const size_t uj = static_cast<size_t>(j);
    const RowContext ctx{layer, j, in.step, visible[uj], blocks_for_entries(config_, visible[uj]),
                         &in};
    SPIN_RETURN_IF_ERROR(select_row(ctx, f, &out->row_blocks[uj], &out->row_explored[uj],
                                    &out->row_probed[uj], &out->probe_seconds,
                                    in.want_scores ? &out->row_scores[uj] : nullptr));
    out->row_budget[uj] = static_cast<int32_t>(out->row_blocks[uj].size());
  }

  // Union of the rows' sets, in index order.
  std::fill(mark_.begin(), mark_.begin() + static_cast<ptrdiff_t>(n_max), uint8_t{0});
  for (size_t j = 0; j < rows; ++j)
    for (const int32_t b : out->row_blocks[j]) mark_[static_cast<size_t>(b)] = 1;
  out->blocks.resize(n_max);
  size_t count = 0;
  for (size_t b = 0; b < n_max; ++b) {
    out->blocks[count] = static_cast<int32_t>(b);
    count += mark_[b] != 0;
  }
  out->blocks.resize(count);

  // Success: only now does the protocol state move.
  open_ = true;
  open_step_ = in.step;
  open_next_n_ = in.next_n;
  l.selected = true;
  l.observed = 0;
  l.visible_entries = visible;
  return ok_status();
}

Status PredictorBase::select_row(const RowContext& ctx, Fill f, std::vector<int32_t>* blocks,
                                 int32_t* explored, int64_t* probed, double* probe_seconds,
                                 std::vector<float>* scores) {
  blocks->clear();
  *explored = 0;
  const int64_t n = ctx.n_blocks;
  if (n == 0) {
    if (scores) scores->clear();
    return ok_status();
  }
  float* p = p_.data();
  bool ranked = false;
  const auto rank_once = [&]() -> Status {
    if (!ranked) {
      SPIN_RETURN_IF_ERROR(rank(ctx, p));
      ranked = true;
    }
    return ok_status();
  };
  if (scores) {
    SPIN_RETURN_IF_ERROR(rank_once());
    scores->resize(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; ++b) (*scores)[static_cast<size_t>(b)] = sanitize(p[b]);
  }

  const int64_t budget = row_budget(ctx);
  if (f == Fill::kAll || budget >= n) {
    blocks->resize(static_cast<size_t>(n));
    for (int64_t b = 0; b < n; ++b) (*blocks)[static_cast<size_t>(b)] = static_cast<int32_t>(b);
    return ok_status();
  }

  // 1. Forced.
  const int64_t n_cand = mark_forced(n);
  int64_t left = budget - (n - n_cand);  // budget_blocks() guarantees forced ≤ budget

  // 2. Exploration (or the whole fill, for random), unless the probe takes its place.
  const int64_t n_probe = f == Fill::kRanked ? std::min(probe_quota(ctx, budget, left), left) : 0;
  int64_t n_explore = 0;
  if (f == Fill::kRandom) {
    n_explore = left;
  } else if (explores() && n_probe == 0) {
    n_explore = explore_count(explore_share(ctx.layer), budget, left);
  }
  if (n_explore > 0) {
    mark_explored(ctx, f, n_cand, n_explore);
    left -= n_explore;
    *explored = static_cast<int32_t>(n_explore);
  }
  const bool record_yield = config_.adapt && explores() && ctx.row == 0 && n_explore > 0;

  // 3. Prediction: the highest p first, then the probe's quota from what is left.
  const int64_t n_history = left - n_probe;
  if (n_history > 0) {
    SPIN_RETURN_IF_ERROR(rank_once());
    mark_ranked(p, n_explore, n_cand - n_explore, n_history, 3);
    if (record_yield) record_exploration(ctx.layer, p, n_explore, n_history);
  }
  if (n_probe > 0) {
    const auto t0 = std::chrono::steady_clock::now();
    SPIN_RETURN_IF_ERROR(probe(ctx, q_.data(), probed));
    *probe_seconds +=
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    mark_ranked(q_.data(), n_explore + n_history, n_cand - n_explore - n_history, n_probe, 4);
    *explored = static_cast<int32_t>(n_probe);  // the probe spends the exploration share
    if (config_.probe_adapt && ctx.row == 0 && n_history > 0)
      layers_[static_cast<size_t>(ctx.layer)].share.record(keys_.data() + n_explore + n_history, n_probe, n_probe,
                                                           keys_.data() + n_explore, n_history, &margin_);
  }

  blocks->resize(static_cast<size_t>(n));
  int32_t* o = blocks->data();
  const uint8_t* mark = mark_.data();
  int64_t count = 0;
  for (int64_t b = 0; b < n; ++b) {
    o[count] = static_cast<int32_t>(b);
    count += mark[b] != 0;
  }
  blocks->resize(static_cast<size_t>(count));
  return ok_status();
}

// adapt: what exploration found against as many of history's lowest-ranked picks. An explored
// block history would have picked anyway (ranked above its lowest pick) found nothing new: it is
// left out of the yield but its slot still counts. keys_[0, n_explore) hold the explored blocks,
// keys_[n_explore, + n_history) history's picks.
void PredictorBase::record_exploration(int32_t layer, const float* p, int64_t n_explore, int64_t n_history) {
  uint64_t* keys = keys_.data();
  uint64_t cutoff = 0;  // history's lowest-ranked pick: its largest key
  for (int64_t i = n_explore; i < n_explore + n_history; ++i) cutoff = std::max(cutoff, keys[i]);
  novel_.clear();
  for (int64_t i = 0; i < n_explore; ++i) {
    const uint64_t b = keys[i] & 0xFFFFFFFFu;
    if ((static_cast<uint64_t>(~float_order(sanitize(p[b]))) << 32 | b) > cutoff) novel_.push_back(b);
  }
  layers_[static_cast<size_t>(layer)].explore.record(novel_.data(), static_cast<int64_t>(novel_.size()), n_explore,
                                                     keys + n_explore, n_history, &margin_);
}

int64_t PredictorBase::mark_forced(int64_t n) {
  uint8_t* mark = mark_.data();
  std::fill(mark, mark + n, uint8_t{0});
  const ForcedRanges forced = forced_ranges(config_, n);
  for (int64_t b = forced.local_begin; b < n; ++b) mark[b] = 1;
  for (int64_t b = 0; b < forced.sink_end; ++b) mark[b] = 1;
  // Candidates as 64-bit keys (ordering value << 32 | block): nth_element then compares plain
  // integers — no indirection, and the block index in the low half is the tie rule.
  uint64_t* keys = keys_.data();
  int64_t n_cand = 0;
  for (int64_t b = 0; b < n; ++b) {  // branch-free compaction: marks are unpredictable
    keys[n_cand] = static_cast<uint64_t>(b);
    n_cand += mark[b] == 0;
  }
  return n_cand;
}

void PredictorBase::mark_explored(const RowContext& ctx, Fill f, int64_t n_cand, int64_t n_explore) {
  uint64_t* keys = keys_.data();
  if (f == Fill::kRandom || config_.explore_policy == ExplorePolicy::kUniform) {
    // The top 32 bits of a counter hash per block: a uniformly random order (ties, 2^-32 rare,
    // fall to the lower block), the same for every row of the step.
    const CounterRng rng(stream_key(config_.seed, static_cast<uint64_t>(request_id_),
                                    static_cast<uint64_t>(ctx.layer),
                                    static_cast<uint64_t>(ctx.step)));
    for (int64_t i = 0; i < n_cand; ++i)
      keys[i] = (rng.at(keys[i]) & 0xFFFFFFFF00000000ULL) | keys[i];
  } else {
    // Oldest last_seen first; never seen (-1) maps to 0, older than every step.
    const BlockState& st = layers_[static_cast<size_t>(ctx.layer)].state;
    for (int64_t i = 0; i < n_cand; ++i) {
      const uint64_t age = static_cast<uint32_t>(st.last_seen(static_cast<int64_t>(keys[i])) + 1);
      keys[i] = age << 32 | keys[i];
    }
  }
  select_smallest(keys, n_cand, n_explore);
  uint8_t* mark = mark_.data();
  for (int64_t i = 0; i < n_explore; ++i) mark[keys[i] & 0xFFFFFFFFu] = 2;
}

void PredictorBase::mark_ranked(const float* p, int64_t first, int64_t n_rest, int64_t left,
                                uint8_t tag) {
  // The highest p first, as ascending keys of ~order(p). select_smallest leaves the chosen keys
  // in rest[0, left) and the others after them, so a second call ranks what the first left.
  uint64_t* rest = keys_.data() + first;
  for (int64_t i = 0; i < n_rest; ++i) {
    const uint64_t b = rest[i] & 0xFFFFFFFFu;
    rest[i] = static_cast<uint64_t>(~float_order(sanitize(p[b]))) << 32 | b;
  }
  select_smallest(rest, n_rest, left);
  uint8_t* mark = mark_.data();
  for (int64_t i = 0; i < left; ++i) mark[rest[i] & 0xFFFFFFFFu] = tag;
}

void PredictorBase::copy_block_probe(const RowContext& row, float* q, int64_t* work) {
  const float* probe = probe_row(row);
  int64_t scored = 0;
  for (int64_t b = 0; b < row.n_blocks; ++b) {
    q[b] = probe[b];
    scored += probe[b] != FLT_MAX;
  }
  *work = scored;
}

Status PredictorBase::probe(const RowContext& row, float* q, int64_t* work) {
  (void)row;
  (void)q;
  (void)work;
  return failed_precondition("{}: has no probe", name_);
}

int64_t PredictorBase::row_budget(const RowContext& row) const {
  const int64_t fixed = budget_blocks(config_, row.n_blocks);
  if (!moves_budget() || config_.budget_moves == BudgetMoves::kNone) return fixed;
  const double factor =
      budget_move_factor(config_.budget_moves, config_.budget_move_max, num_layers_, row.layer,
                         [this](int32_t i) -> const BudgetMoveState& { return layers_[static_cast<size_t>(i)].moves; });
  if (factor == 1.0) return fixed;
  const auto moved = static_cast<int64_t>(std::llround(static_cast<double>(fixed) * factor));
  const int64_t forced = std::min<int64_t>(
      row.n_blocks, static_cast<int64_t>(config_.sink_blocks) + config_.local_blocks);
  return std::min(std::max({moved, blocks_for_topk(config_), forced}), row.n_blocks);
}

double PredictorBase::explore_share(int32_t layer) const {
  if (config_.adapt) return layers_[static_cast<size_t>(layer)].explore.current(config_.explore_ratio);
  const double churn = layers_[static_cast<size_t>(layer)].moves.churn_ema;
  if (config_.explore_churn <= 0) return config_.explore_ratio;
  if (churn < 0) return 0.0;  // not measured yet: the state is fresh from a prefill (or empty)
  return config_.explore_ratio * std::min(1.0, churn / config_.explore_churn);
}

int64_t PredictorBase::observation_rank(const RowScores& scores) const {
  return explores() ? pool_rank(config_, blocks_for_entries(config_, scores.visible_entries)) : 1;
}

double PredictorBase::probe_share(int32_t layer) const {
  const ProbeShareState& s = layers_[static_cast<size_t>(layer)].share;
  return config_.probe_adapt ? s.current(config_.probe_share) : config_.probe_share;
}

Status PredictorBase::observe(int32_t layer, int32_t row, const RowScores& scores) {
  if (layer < 0 || layer >= num_layers_)
    return invalid_argument("{}: layer {} is outside [0, {})", name_, layer, num_layers_);
  Layer& l = layers_[static_cast<size_t>(layer)];
  if (!open_ || !l.selected)
    return failed_precondition(
        "{}: observe(layer {}) without a select of that layer in an open "
        "step; the protocol is select → observe every row → commit",
        name_, layer);
  if (row < 0 || row >= open_next_n_)
    return invalid_argument("{}: row {} is outside the open step's {} rows", name_, row,
                            open_next_n_);
  if (l.observed >> row & 1u)
    return failed_precondition("{}: layer {} row {} was already observed in step {}", name_, layer,
                               row, open_step_);
  const size_t ur = static_cast<size_t>(row);
  if (scores.visible_entries != l.visible_entries[ur])
    return invalid_argument(
        "{}: layer {} row {}: visible {} differs from the {} entries the row "
        "saw at select",
        name_, layer, row, scores.visible_entries, l.visible_entries[ur]);
  SPIN_RETURN_IF_ERROR(pool_row(config_, scores, &l.pending[ur], &pool_scratch_, observation_rank(scores)));
  l.observed |= 1u << row;
  return ok_status();
}

Status PredictorBase::commit(int32_t accepted) {
  if (!open_) {
    if (last_committed_ >= 0)
      return failed_precondition(
          "{}: nothing pending: step {} was already committed; select the "
          "next step first",
          name_, last_committed_);
    return failed_precondition(
        "{}: nothing pending: no step is open (select, observe every row, "
        "then commit)",
        name_);
  }
  if (accepted < 0 || accepted >= open_next_n_)
    return invalid_argument("{}: accepted {} is outside 0..{} (next_n - 1)", name_, accepted,
                            open_next_n_ - 1);
  const uint32_t all_rows = (1u << open_next_n_) - 1u;
  for (int32_t li = 0; li < num_layers_; ++li) {
    const Layer& l = layers_[static_cast<size_t>(li)];
    if (!l.selected || l.observed == all_rows) continue;
    int32_t j = 0;
    while (l.observed >> j & 1u) ++j;
    return failed_precondition(
        "{}: commit of step {}: layer {} row {} was selected but not "
        "observed",
        name_, open_step_, li, j);
  }

  // Replay: prefix-valid rows 0..accepted in order (default), row 0 only, or every row.
  int32_t first = 0, last = accepted;
  if (config_.mtp_update == MtpUpdate::kRow0) last = 0;
  if (config_.mtp_update == MtpUpdate::kAllRows) last = open_next_n_ - 1;
  const int32_t step = static_cast<int32_t>(open_step_);
  for (int32_t li = 0; li < num_layers_; ++li) {
    Layer& l = layers_[static_cast<size_t>(li)];
    if (!l.selected) continue;
    if (config_.adapt) score_rankings(li, last, l.visible_entries[static_cast<size_t>(last)]);
    for (int32_t j = first; j <= last; ++j) l.state.apply(l.pending[static_cast<size_t>(j)], step);
    // step-reuse reads the top-k of the newest replayed row: the last token the model kept.
    const PooledRow& newest = l.pending[static_cast<size_t>(last)];
    l.moves.update(l.prev_topk_blocks, newest, config_.budget_move_max);
    if (config_.probe_adapt)
      l.share.update(l.pending[0], config_.probe_share, kProbeShareStep, kProbeShareFloor * config_.probe_share,
                     kProbeShareCeiling);
    // adapt: rises at once when exploration pays, falls a quarter as fast, never below half of
    // explore_ratio (probe_share.h says why).
    if (config_.adapt)
      l.explore.update(l.pending[0], config_.explore_ratio, kExploreShareStep * config_.explore_ratio,
                       kExploreShareFloor * config_.explore_ratio, kExploreShareCeiling * config_.explore_ratio,
                       kExploreShareFall);
    l.prev_topk_blocks.clear();
    l.prev_topk_hits.clear();
    for (size_t i = 0; i < newest.blocks.size(); ++i) {
      if (newest.topk_hits[i] == 0) continue;
      l.prev_topk_blocks.push_back(newest.blocks[i]);
      l.prev_topk_hits.push_back(newest.topk_hits[i]);
    }
    l.selected = false;
    l.observed = 0;
  }
  open_ = false;
  last_committed_ = open_step_;
  last_was_prefill_ = false;
  return ok_status();
}

// adapt's measurement. Both rankings are scored on what the step observed: among the blocks
// it scored (the forced ones left out, as every ranking keeps them), the m that rank highest by
// each, m = the blocks that held the row's top-k — the tightest budget that could hold all of
// it. The ranking whose m blocks held more of the top-k ordered this layer's blocks better; the
// gain is their difference over the top-k's entries, averaged with weight kAdditionsGainWeight. Only
// blocks both rankings could be judged on count, so the one in use is not favoured by having
// chosen what was scored beyond them.
void PredictorBase::score_rankings(int32_t layer, int32_t row, int64_t visible) {
  Layer& l = layers_[static_cast<size_t>(layer)];
  const PooledRow& newest = l.pending[static_cast<size_t>(row)];
  const int64_t n = blocks_for_entries(config_, visible);
  if (n == 0) return;
  const RowContext ctx{layer, row, open_step_, visible, n, nullptr};
  if (!rank_pair(ctx, p_.data(), q_.data())) return;
  int64_t m = 0, total = 0;
  for (size_t i = 0; i < newest.blocks.size(); ++i) {
    m += newest.topk_hits[i] > 0;
    total += newest.topk_hits[i];
  }
  if (m == 0 || total == 0) return;
  const int64_t with = hits_in_top(newest, p_.data(), n, m);
  const int64_t without = hits_in_top(newest, q_.data(), n, m);
  const double gain = static_cast<double>(with - without) / static_cast<double>(total);
  l.additions_gain = (1.0 - kAdditionsGainWeight) * l.additions_gain + kAdditionsGainWeight * gain;
  l.gain_steps = std::min(l.gain_steps + 1, kAdditionsGainWarmup);
}

int64_t PredictorBase::hits_in_top(const PooledRow& newest, const float* p, int64_t n_blocks, int64_t m) {
  const int64_t sinks = config_.sink_blocks, first_local = n_blocks - config_.local_blocks;
  uint64_t* keys = keys_.data();
  int64_t count = 0;
  for (size_t i = 0; i < newest.blocks.size(); ++i) {
    const int64_t b = newest.blocks[i];
    if (b < sinks || b >= first_local || b >= n_blocks) continue;
    keys[count++] = static_cast<uint64_t>(~float_order(sanitize(p[b]))) << 32 | static_cast<uint64_t>(i);
  }
  const int64_t take = std::min(m, count);
  select_smallest(keys, count, take);
  int64_t hits = 0;
  for (int64_t k = 0; k < take; ++k) hits += newest.topk_hits[keys[k] & 0xFFFFFFFFu];
  return hits;
}

Status PredictorBase::observe_prefill(int32_t layer, int64_t step, const RowScores& scores) {
  if (layer < 0 || layer >= num_layers_)
    return invalid_argument("{}: layer {} is outside [0, {})", name_, layer, num_layers_);
  if (open_)
    return failed_precondition("{}: observe_prefill during open step {}; a prefill comes between steps (commit first)",
                               name_, open_step_);
  if (step < 0 || step > INT32_MAX) return invalid_argument("{}: step {} is outside [0, 2^31)", name_, step);
  if (step < last_committed_ || (step == last_committed_ && !last_was_prefill_))
    return failed_precondition("{}: prefill at step {} is not after the last committed step {}", name_, step,
                               last_committed_);
  Layer& l = layers_[static_cast<size_t>(layer)];
  l.state.ensure_blocks(blocks_for_entries(config_, scores.visible_entries));
  SPIN_RETURN_IF_ERROR(pool_row(config_, scores, &prefill_row_, &pool_scratch_, observation_rank(scores)));
  l.state.apply(prefill_row_, static_cast<int32_t>(step));
  // step-reuse reads the newest observed top-k: the prefill's last row is the newest token.
  l.prev_topk_blocks.clear();
  l.prev_topk_hits.clear();
  for (size_t i = 0; i < prefill_row_.blocks.size(); ++i) {
    if (prefill_row_.topk_hits[i] == 0) continue;
    l.prev_topk_blocks.push_back(prefill_row_.blocks[i]);
    l.prev_topk_hits.push_back(prefill_row_.topk_hits[i]);
  }
  last_committed_ = step;
  last_was_prefill_ = true;
  return ok_status();
}

void PredictorBase::reset() {
  for (Layer& l : layers_) {
    l.state.reset();
    for (PooledRow& r : l.pending) r.clear();
    l.visible_entries = {};
    l.selected = false;
    l.observed = 0;
    l.prev_topk_blocks.clear();
    l.prev_topk_hits.clear();
    l.moves = BudgetMoveState{};
    l.share.reset();
    l.additions_gain = 0;
    l.gain_steps = 0;
    l.explore.reset();
  }
  open_ = false;
  open_step_ = -1;
  open_next_n_ = 0;
  last_committed_ = -1;
  last_was_prefill_ = false;
  on_reset();
}

// Mirrors reserve() below: change one, change the other.
double PredictorBase::planned_bytes(const PredictorConfig& config, int32_t num_layers, int64_t max_entries,
                                    int32_t max_next_n, double extra_per_block) {
  const int64_t n_blocks = blocks_for_entries(config, max_entries);
  const double n = static_cast<double>(n_blocks);
  const double buckets = static_cast<double>(offset_bucket(std::max<int64_t>(0, n_blocks - 1))) + 1;
  const double pending_row = n * (sizeof(int32_t) + sizeof(float) + sizeof(int32_t));  // blocks, x, hits
  const double per_layer = n * kStateBytesPerBlock + buckets * kStateBytesPerOffsetBucket +
                           max_next_n * pending_row + n * 2 * sizeof(int32_t) + n * extra_per_block;
  // p_, q_, mark_, keys_, and pool_row's scratch (block_index, the scored values, one block's).
  const double scratch = n * (2 * sizeof(float) + sizeof(uint8_t) + sizeof(uint64_t) + sizeof(int32_t)) +
                         static_cast<double>(max_entries) * sizeof(float) +
                         static_cast<double>(config.block_entries()) * sizeof(float);
  return num_layers * per_layer + scratch;
}

Status PredictorBase::reserve(int64_t max_entries, int32_t max_next_n) {
  if (max_entries < 1 || max_entries > (int64_t{1} << 31))
    return invalid_argument("{}: reserve: max_entries {} is outside 1..2^31", name_, max_entries);
  if (max_next_n < 1 || max_next_n > kMaxNextN)
    return invalid_argument("{}: reserve: max_next_n {} is outside 1..{}", name_, max_next_n,
                            kMaxNextN);
  if (const PredictorInfo* info = find_predictor(name_); info == nullptr || !info->can_serve)
    return invalid_argument("{}: reserve: it reads {}, which grows with or comes from outside the "
                            "serving API; it cannot promise allocation-free steps",
                            name_, info ? predictor_reads_name(info->reads) : "what no registry row says");
  const int64_t n_blocks = blocks_for_entries(config_, max_entries);
  const size_t n = static_cast<size_t>(n_blocks);
  try {
    for (Layer& l : layers_) {
      l.state.reserve(n_blocks);
      for (int32_t j = 0; j < max_next_n; ++j) {
        PooledRow& r = l.pending[static_cast<size_t>(j)];
        r.blocks.reserve(n);
        r.x.reserve(n);
        r.topk_hits.reserve(n);
      }
      l.prev_topk_blocks.reserve(n);
      l.prev_topk_hits.reserve(n);
      l.explore.probe_picked.reserve(n);  // adapt's record of what exploration traded
      l.explore.margin_picked.reserve(n);
    }
    margin_.reserve(n);
    novel_.reserve(n);
    if (p_.size() < n) {
      p_.resize(n);
      q_.resize(n);
      mark_.resize(n);
      keys_.resize(n);
    }
    // pool_row's scratch: the scored values (k-th selection without the kernel's top-k), the
    // block → list index map (with it) and one block's values (pool_depth's m-th best); they
    // grow with resize, so size them now.
    if (pool_scratch_.values.size() < static_cast<size_t>(max_entries))
      pool_scratch_.values.resize(static_cast<size_t>(max_entries));
    if (pool_scratch_.block_index.size() < n) pool_scratch_.block_index.resize(n, -1);
    pool_scratch_.block_values.reserve(static_cast<size_t>(config_.block_entries()));
  } catch (const std::bad_alloc&) {
    return resource_exhausted("{}: reserve: no memory for {} blocks × {} layers", name_, n_blocks,
                              num_layers_);
  }
  return on_reserve(n_blocks);
}

void PredictorBase::rebind(int64_t request_id) {
  reset();
  request_id_ = request_id;
}

Result<std::unique_ptr<BlockPredictor>> PredictorBase::fork(int64_t request_id,
                                                            int64_t shared_entries) const {
  if (open_)
    return failed_precondition("{}: fork during open step {}; commit it first", name_, open_step_);
  if (shared_entries < -1)
    return invalid_argument("{}: fork: shared_entries {} must be -1 (all) or ≥ 0", name_,
                            shared_entries);
  std::unique_ptr<PredictorBase> child = clone();
  child->request_id_ = request_id;
  // The child numbers its own steps: any step ≥ 0 may come next. Old last_seen values only order
  // blocks by staleness, which stays meaningful.
  child->last_committed_ = -1;
  child->last_was_prefill_ = false;
  if (shared_entries >= 0) {
    const int64_t n = blocks_for_entries(config_, shared_entries);
    for (Layer& l : child->layers_) {
      l.state.truncate(n);
      size_t keep = 0;
      for (size_t i = 0; i < l.prev_topk_blocks.size(); ++i) {
        if (l.prev_topk_blocks[i] >= n) break;  // ascending
        ++keep;
      }
      l.prev_topk_blocks.resize(keep);
      l.prev_topk_hits.resize(keep);
    }
    child->on_fork(shared_entries);
  }
  return std::unique_ptr<BlockPredictor>(std::move(child));
}

}  // namespace spin
