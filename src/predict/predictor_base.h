// PredictorBase: what every predictor shares — the select/observe/commit protocol and its errors,
// per-layer BlockState and MTP pending buffers, the budget and forced blocks, exploration, the
// O(n_blocks) fill, and the union. A concrete predictor only says how a row's blocks rank
// (rank()), whether a layer keeps everything (fill()), and whether it explores.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "predict/block_state.h"
#include "predict/budget_moves.h"
#include "predict/probe_share.h"
#include "spin/predict.h"
#include "spin/predictor_inputs.h"

namespace spin {

class PredictorBase : public BlockPredictor {
 public:
  PredictorBase(std::string name, const PredictorConfig& config, int32_t num_layers,
                int64_t request_id, double alpha, double beta);

  const std::string& name() const final { return name_; }
  const PredictorConfig& config() const final { return config_; }
  int32_t num_layers() const final { return num_layers_; }
  int64_t request_id() const final { return request_id_; }

  Status select(int32_t layer, const StepInput& in, Selection* out) final;
  Status observe(int32_t layer, int32_t row, const RowScores& scores) final;
  Status commit(int32_t accepted) final;
  Status observe_prefill(int32_t layer, int64_t step, const RowScores& scores) final;
  void reset() final;
  Result<std::unique_ptr<BlockPredictor>> fork(int64_t request_id,
                                               int64_t shared_entries) const final;
  Status reserve(int64_t max_entries, int32_t max_next_n) final;
  void rebind(int64_t request_id) final;
  // A layer's state (tests read it: state_of in tests/predict_testing.h).
  const BlockState& state(int32_t layer) const;
  size_t memory_bytes() const final;
  // What reserve(max_entries, max_next_n) makes one request hold (spin::planned_bytes), plus
  // `extra_per_block` bytes per block per layer of a predictor's own (hisa's pooled keys).
  static double planned_bytes(const PredictorConfig& config, int32_t num_layers, int64_t max_entries,
                              int32_t max_next_n, double extra_per_block);

  // Blocks nothing is known about rank below every observed x (x ≥ -1), newest first: -2 - d is
  // exact in float for distances below 2^24 blocks (2^30 entries at page 64).
  static float unknown_score(int64_t distance) { return -2.0f - static_cast<float>(distance); }
  // p's tie level among blocks of equal hits: p in quarters of [-1, 1] (a max-pooled x's range;
  // the newest blocks' raised ranks land in the top one), as 0, 1/8, ..., 7/8.
  static float hit_tie_level(float p);

 protected:
  enum class Fill {
    kAll,     // every visible block (all-keep, indexcache full layers)
    kRanked,  // forced, then exploration (if explores()), then the highest rank()
    kRandom,  // forced, then uniform random blocks
  };
  struct RowContext {
    int32_t layer;
    int32_t row;
    int64_t step;
    int64_t visible_entries;   // entries the row sees
    int64_t n_blocks;  // blocks the row sees; the newest is n_blocks - 1
    const StepInput* in;
  };

  static void fill_unknown(float* p, int64_t n_blocks);

  virtual Fill fill(int32_t layer) const {
    (void)layer;
    return Fill::kRanked;
  }
  virtual bool explores() const { return false; }
  // Whether config().budget_moves applies (spin, spin-hybrid); the others keep the fixed budget.
  virtual bool moves_budget() const { return false; }
  // The exploration share of `layer`'s budget: explore_ratio · min(1, churn EMA / explore_churn),
  // 0 until the layer has measured its churn; explore_ratio with explore_churn 0
  // (PredictorConfig::explore_churn). With adapt: the layer's own share, moved at each commit by
  // what exploration found, within [1/2, 4] × explore_ratio (probe_share.h).
  double explore_share(int32_t layer) const;
  // Max pooling's rank for an observed row: pool_rank() for spin's family (explores(): its
  // PredictorConfig::pool_depth), 1 (the block's best) for every other predictor.
  int64_t observation_rank(const RowScores& scores) const;
  // The probe's share of `layer`'s budget: config().probe_share, or with probe_adapt where the last
  // steps' top-k fell (see update_probe_share).
  double probe_share(int32_t layer) const;
  // Blocks of the row's budget the probe chooses (hisa: all of them, spin-hybrid: its share on
  // probe steps), after the forced blocks and history's choice; 0 = no probe this row. `left` is
  // the budget after the forced blocks. On a probing row there is no uniform exploration.
  virtual int64_t probe_quota(const RowContext& row, int64_t budget, int64_t left) const {
    (void)row;
    (void)budget;
    (void)left;
    return 0;
  }
  // q[0..n_blocks): the probe's score of every block for the row (higher kept first); *work =
  // pooled keys scored (entry-equivalents, Selection::row_probed).
  virtual Status probe(const RowContext& row, float* q, int64_t* work);
  // Once per select, before any row: predictor-specific checks of `in`, cache updates.
  virtual Status prepare(int32_t layer, const StepInput& in);
  // p[0..n_blocks): the row's ranking key, higher kept first; ties go to the lower block index.
  virtual Status rank(const RowContext& row, float* p) = 0;
  virtual std::unique_ptr<PredictorBase> clone() const = 0;
  virtual void on_reset() {}
  virtual void on_fork(int64_t shared_entries) { (void)shared_entries; }
  virtual size_t extra_memory_bytes() const { return 0; }
  // adapt (spin, spin-ic2): the row's ranking as configured into `with` and without spin's
  // additions (the last top-k first, the recency window) into `without`, from the state as select
  // saw it; false where the predictor has no such pair for the layer (then nothing is measured).
  virtual bool rank_pair(const RowContext& row, float* with, float* without) {
    (void)row;
    (void)with;
    (void)without;
    return false;
  }
  // adapt: whether `layer` keeps spin's additions (its measured advantage is ≥ 0, or not yet
  // measured on kAdditionsGainWarmup steps).
  bool keeps_additions(int32_t layer) const {
    const Layer& l = layers_[static_cast<size_t>(layer)];
    return config_.adapt == 0 || l.gain_steps < kAdditionsGainWarmup || l.additions_gain >= 0.0;
  }
  // reserve() for what a predictor keeps itself (hisa's pooled keys); kInvalidArgument if it
  // cannot promise allocation-free steps.
  virtual Status on_reserve(int64_t max_blocks) {
    (void)max_blocks;
    return ok_status();
  }

  const BlockState& layer_state(int32_t layer) const { return layers_[layer].state; }
  // The row's budget: the fixed budget_blocks(), moved by config().budget_moves when
  // moves_budget() (see predictor_base.cpp), clamped as budget_blocks() clamps.
  int64_t row_budget(const RowContext& row) const;
  // This step's pooled observation of (layer, row) if it was observed in the open step `step`
  // (pending, not committed); nullptr otherwise.
  const PooledRow* current_observation(int32_t layer, int32_t row, int64_t step) const;
  // Layer sharing (indexcache, the stacks): `layer` reuses `full`'s rows of the open step, so
  // they must have been observed; kFailedPrecondition naming both otherwise.
  Status check_layer_observed(int32_t full, int32_t layer, const StepInput& in) const;
  // p = the recency default, raised to the hit count of every block holding `full`'s top-k of
  // this step (same row): most hits first.
  void rank_by_layer_topk(const RowContext& row, int32_t full, float* p) const;
  // How raise_previous_topk orders blocks with the same hit count.
  enum class HitTies {
    kIndex,  // the lower block first (selection's tie rule): step-reuse
    kRank,   // the higher p first, in eighths (hit_tie_level): spin's topk_first
  };
  // p[b] = base + hits for every block b < row.n_blocks that held the last committed step's top-k
  // of the row's layer (from the last replayed row): those blocks rank by their hit count, most
  // first, above every p below `base` (step-reuse: base 0 over the recency default; spin's
  // topk_first: above its EMA ranking). HitTies::kRank adds hit_tie_level(p[b]) and caps hits at
  // 2^20 - 1: exact in float32 for base = 2^20, where floats step by 1/8.
  void raise_previous_topk(const RowContext& row, float base, HitTies ties, float* p) const;
  // The step's inputs beyond own state; all null when the caller passed none.
  static const PredictorInputs& inputs_of(const StepInput& in) {
    static const PredictorInputs kNone;
    return in.inputs != nullptr ? *in.inputs : kNone;
  }
  // Row `row`'s block probe (PredictorInputs::block_probe; row.n_blocks values, checked against the
  // stride and block size in select), or nullptr when the step has none.
  static const float* probe_row(const RowContext& row) {
    const PredictorInputs& in = inputs_of(*row.in);
    return in.block_probe ? in.block_probe + int64_t{row.row} * in.block_probe_stride : nullptr;
  }
  // A recorded probe (PredictorInputs::block_probe) into q; *work = the blocks it scored, one pooled key
  // each: every visible block but those holding only drafts (+FLT_MAX, "keep": nothing pooled).
  static void copy_block_probe(const RowContext& row, float* q, int64_t* work);
  static int64_t visible_entries(const StepInput& in, int32_t row) {
    return in.visible_entries ? in.visible_entries[row]
                              : spin::visible_entries(in.num_entries, in.next_n, row);
  }

 private:
  struct Layer {
    BlockState state;
    std::array<PooledRow, kMaxNextN> pending;
    std::array<int64_t, kMaxNextN> visible_entries{};
    bool selected = false;  // in the open step
    uint32_t observed = 0;  // bit j: row j observed in the open step
    std::vector<int32_t> prev_topk_blocks;
    std::vector<int32_t> prev_topk_hits;
    BudgetMoveState moves;  // budget_moves: the layer's churn and loan (budget_moves.h)
    ProbeShareState share;  // probe_adapt: the layer's share now (probe_share.h)
    // adapt: the layer's exploration share, moved by what exploration found (probe_share.h's
    // rule: its picks against as many of history's lowest-ranked ones, top-k hits per block).
    ProbeShareState explore;
    // adapt: EMA of how much more of each step's top-k the ranking with spin's additions put
    // first than the one without (score_rankings); < 0 = this layer ranks without them.
    double additions_gain = 0;
    int32_t gain_steps = 0;  // steps the gain was measured on, up to kAdditionsGainWarmup
  };

  Status check_step_input(int32_t layer, const StepInput& in) const;
  Status check_block_probe(const StepInput& in) const;
  Status select_row(const RowContext& ctx, Fill f, std::vector<int32_t>* blocks, int32_t* explored,
                    int64_t* probed, double* probe_seconds, std::vector<float>* scores);
  // select_row's stages over mark_ (0 = not selected, 1 forced, 2 explored, 3 predicted) and the
  // candidate keys_ (ordering value << 32 | block). mark_forced returns the candidates' count.
  int64_t mark_forced(int64_t n);
  void mark_explored(const RowContext& ctx, Fill f, int64_t n_cand, int64_t n_explore);
  // The `left` highest p among keys_[first, first + n_rest) get mark `tag`.
  void mark_ranked(const float* p, int64_t first, int64_t n_rest, int64_t left, uint8_t tag);
  void record_exploration(int32_t layer, const float* p, int64_t n_explore, int64_t n_history);
  // adapt at commit, before the state moves: updates `l`'s additions_gain from its newest
  // replayed row (`row`, `visible` entries), see predictor_base.cpp.
  void score_rankings(int32_t layer, int32_t row, int64_t visible);
  // Top-k entries of `newest` in the `m` observed blocks that rank highest by p (forced excluded).
  int64_t hits_in_top(const PooledRow& newest, const float* p, int64_t n_blocks, int64_t m);

  std::string name_;
  PredictorConfig config_;
  int32_t num_layers_;
  int64_t request_id_;
  std::vector<Layer> layers_;

  // Protocol: at most one open step; steps strictly increase across commits.
  bool open_ = false;
  int64_t open_step_ = -1;
  int32_t open_next_n_ = 0;
  int64_t last_committed_ = -1;
  bool last_was_prefill_ = false;  // last_committed_ is a prefill: more of its rows may come
  PooledRow prefill_row_;          // scratch of observe_prefill

  // Scratch reused across calls (sized to the largest context seen).
  std::vector<float> p_;
  std::vector<float> q_;  // the probe's scores
  std::vector<uint64_t> margin_;  // ProbeShareState::record's scratch
  std::vector<uint64_t> novel_;   // record_exploration's scratch
  std::vector<uint8_t> mark_;
  std::vector<uint64_t> keys_;  // (ordering key << 32 | block) of the candidates
  PoolScratch pool_scratch_;
};

}  // namespace spin
