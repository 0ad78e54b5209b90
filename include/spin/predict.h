// spin/predict.h — SPIN's block predictors: which KV blocks the lightning indexer should score.
//
// Exposes: the typed predictor config and its presets, the budget arithmetic, the row scores a
// predictor observes, and every predictor of the registry (predictor_names()) behind one
// interface: budgeted selection (forced → exploration → prediction), observation, and the
// speculative-decoding (MTP) pending buffers and their replay.
// The per-(request, layer) state (slot EMA, last_seen, relative-offset EMA: predict/block_state.h)
// and the pooling of scores into per-block observations (predict/pooling.h) stay behind src/; what
// the key- and truth-reading predictors take besides (hisa's cache and query, the oracle's top-k)
// is in spin/predictor_inputs.h. It does not score anything itself (the kernels do), and it never
// allocates per call once warmed up.
// What SPIN computes, in brief: ARCHITECTURE.md.
//
// Protocol, per request (one BlockPredictor object per request, all of its indexer layers):
//
//   for each decode step t (strictly increasing):
//     for each indexer layer l (increasing order; prev-layer and indexcache read layer l-1 / the
//                               nearest full layer of the SAME step):
//       select(l, {step=t, num_entries, next_n}, &sel)     // sel.blocks = union to score once
//       ... the indexer scores sel.blocks for all next_n rows, top-k runs ...
//       observe(l, j, row_scores_j) for every row j in 0..next_n-1   // buffered, pending
//     commit(accepted)                                     // replays rows per mtp_update; closes t
//
// commit() is required after every step, also for plain decode (next_n = 1, accepted = 0): one
// rule for every case. Any call out of this order returns kFailedPrecondition and changes nothing.
// Blocks: block b holds request-local entries [b·E, (b+1)·E) with E = page_size · block_pages.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "spin/geometry.h"
#include "spin/numerics.h"
#include "spin/status.h"

namespace spin {

struct PredictorInputs;  // spin/predictor_inputs.h

// ---------------------------------------------------------------------------------------------
// Enums and their names (the names are what configs, CLIs and reports use).

enum class Pooling { kMax, kMean, kTopkHits, kLse };  // "max" "mean" "topk-hits" "lse"
enum class ExplorePolicy { kUniform, kStalest };      // "uniform" "stalest"
enum class Combine { kMax, kWeighted };               // "max" "weighted"
enum class MtpUpdate { kPrefix, kRow0, kAllRows };    // "prefix" "row0" "all-rows"
enum class BudgetMoves { kNone, kLayers, kSteps, kBoth };  // "none" "layers" "steps" "both"

const char* pooling_name(Pooling v);
const char* explore_policy_name(ExplorePolicy v);
const char* combine_name(Combine v);
const char* mtp_update_name(MtpUpdate v);
const char* budget_moves_name(BudgetMoves v);
Result<Pooling> pooling_from_name(std::string_view name);
Result<ExplorePolicy> explore_policy_from_name(std::string_view name);
Result<Combine> combine_from_name(std::string_view name);
Result<MtpUpdate> mtp_update_from_name(std::string_view name);
Result<BudgetMoves> budget_moves_from_name(std::string_view name);

// ---------------------------------------------------------------------------------------------
// Config: one typed struct, printed with every result.

// recent_blocks' bound: the window ranks at 2^19 - distance, above every EMA value and exact in
// float32 (src/predict/select_rules.h).
inline constexpr int32_t kMaxRecentBlocks = 1 << 18;

struct PredictorConfig {
  // One line per field; the measurements behind each default: docs/results.md "Why the defaults".
  double target_sparsity = 0.3;         // [0, 1): budget = ceil((1 - s) · n_blocks)
  int32_t explicit_budget_blocks = -1;  // ≥ 0 overrides target_sparsity; -1 = use sparsity
  int32_t sink_blocks = 1;              // forced: the first blocks (attention sinks)
  int32_t local_blocks = 2;             // forced: the newest blocks (hold never-scored entries)
  double explore_ratio = 0.1;           // spin: share of the budget drawn at random (adapt moves it per layer)
  double explore_churn = 0.1;           // adapt=0: share = ratio·min(1, layer churn EMA / this); 0 = always ratio
  ExplorePolicy explore_policy = ExplorePolicy::kUniform;  // which unranked blocks exploration draws
  double alpha = 0.5;                   // slot[b] ← (1-alpha)·slot[b] + alpha·x
  double beta = 0.1;                    // offset[bucket] ← (1-beta)·offset + beta·x
  Combine combine = Combine::kWeighted;  // p[b] = max(slot, offset) or w·slot + (1-w)·offset
  double combine_weight = 0.8;          // w of Combine::kWeighted
  int32_t topk_first = 1;               // spin: the last top-k's blocks rank first, most hits first
  int32_t recent_blocks = 16;           // spin: the newest blocks rank next, newest first (0 = none)
  int32_t adapt = 1;                    // spin: 1 = per layer, exploration by its yield, additions by their gain
  Pooling pooling = Pooling::kMax;      // how a block's entry scores become one observation x[b]
  double pool_depth = 0.2;              // spin, max pooling: x = the m-th best, m from this share (pool_rank)
  MtpUpdate mtp_update = MtpUpdate::kPrefix;  // which rows of an MTP step update the state
  double probe_share = 0.5;             // spin-hybrid: budget share the pooled-key probe chooses
  double probe_blend = 0.0;             // spin-hybrid: history's rank mixes in z(probe) by this weight
  int32_t probe_adapt = 0;              // spin-hybrid: 1 = each layer's probe share follows its hits
  int32_t probe_interval = 1;           // spin-hybrid: probe every n-th step, explore uniformly between
  int32_t probe_entries = 0;            // spin-hybrid: entries per pooled key (0 = one key per block)
  BudgetMoves budget_moves = BudgetMoves::kNone;  // spin: budgets move between layers/steps at equal mean
  double budget_move_max = 0.5;         // a moved budget stays in [1 - max, 1 + max] × the fixed one
  int32_t page_size = kDefaultPageSize;  // entries per cache page
  int32_t block_pages = 1;              // pages per block
  int32_t topk = 2048;                  // the indexer's top-k (V3.2: 2048)
  uint64_t seed = 0;                    // keys every random draw with (request, layer, step)

  int32_t block_entries() const { return page_size * block_pages; }

  // Ranges: target_sparsity in [0,1), explore_ratio, explore_churn and combine_weight in [0,1],
  // alpha and beta in (0,1], topk_first and adapt 0 or 1, recent_blocks in [0, kMaxRecentBlocks],
  // pool_depth in [0, 1],
  // page_size, block_pages, topk > 0, page_size·block_pages ≤ 2^20, sink/local ≥ 0,
  // explicit_budget_blocks ≥ -1, enums known.
  Status validate() const;
  // One line "key=value key=value ..." in field order; parse() of it gives the same config.
  std::string to_string() const;
  // Sets one field by name from text (the field names above; enums by their names); the key
  // "preset" applies a preset (apply_preset).
  Status set(const std::string& key, const std::string& value);
  // Applies "key=value" pairs separated by spaces, commas or newlines, in order (so a preset's
  // fields can be overridden by pairs after it); stops at the first error.
  Status parse(std::string_view pairs);
  // Sets the fields of a named preset (preset_names()) over this config: "paper" is SPIN as
  // published (α 0.5, 5 % uniform exploration, max pooling, no additions), "default" sets the same
  // fields back to their defaults. Budget and geometry fields are left as they are.
  Status apply_preset(std::string_view name);
};

// The key set() and parse() read as a preset name ("preset=paper").
inline constexpr const char* kPresetKey = "preset";
// The preset names apply_preset accepts: "default", "paper".
const std::vector<std::string>& preset_names();

// Blocks top-k needs: ceil(topk / block_entries).
int64_t blocks_for_topk(const PredictorConfig& config);
// Budget for a row that sees n_blocks blocks: ceil((1 - s)·n) (or the explicit count), clamped up
// to blocks_for_topk and to the forced-block count, and down to n_blocks.
int64_t budget_blocks(const PredictorConfig& config, int64_t n_blocks);
// Blocks holding `entries` entries: ceil(entries / block_entries).
int64_t blocks_for_entries(const PredictorConfig& config, int64_t entries);

// ---------------------------------------------------------------------------------------------
// Observation: one row's indexer scores, and their pooling into per-block values x[b].

struct RowScores {
  const float* scores = nullptr;  // [num_cols] request-local positions; -inf = not scored
  int64_t num_cols = 0;           // width of `scores` (≥ visible_entries; columns beyond unread)
  int64_t visible_entries = 0;    // entries this row sees
  const int32_t* scored_blocks = nullptr;  // [num_scored_blocks] strictly ascending block ids
                                           // (an MTP step's union; blocks past `visible` skipped)
  int64_t num_scored_blocks = 0;
  // Optional: the top-k kernel's output for this row ([topk] positions, -1 padded). When given,
  // pooling uses it (O(topk)) instead of selecting the k-th score itself (O(scored entries)).
  const int32_t* topk_positions = nullptr;
};

// ---------------------------------------------------------------------------------------------
// Selection.

struct StepInput {
  int64_t step = 0;                      // decode step of this request: ≥ 0, < 2^31, increasing
  int64_t num_entries = 0;               // entries in this layer's cache incl. the step's rows
  int32_t next_n = 1;                    // rows this step, 1..kMaxNextN
  const int64_t* visible_entries = nullptr;  // optional [next_n] override of visible_entries() (V4)
  // What a predictor reads besides its own state (the oracle's true top-k, hisa's keys and query,
  // a probe): spin/predictor_inputs.h. Null for the predictors that read only their own state —
  // every one the serving API runs.
  const PredictorInputs* inputs = nullptr;
  bool want_scores = false;              // fill Selection::row_scores
};

struct Selection {
  std::vector<int32_t> blocks;                   // union of the rows' sets: score these once
  std::vector<std::vector<int32_t>> row_blocks;  // [next_n] each row's set, sorted unique
  std::vector<int32_t> row_budget;               // [next_n] = row_blocks[j].size()
  std::vector<int32_t> row_explored;             // [next_n] blocks that came from exploration
                                                 // (uniform draws, or the probe's picks)
  // [next_n] probe work of the row in entry-equivalents: each pooled key scored with the row's
  // query costs heads·128 multiply-adds, the work of scoring one entry (hisa, spin-hybrid).
  std::vector<int64_t> row_probed;
  // Wall time of this select spent in the probe's own pooling and scoring (and in a predictor's
  // per-step checks, nanoseconds): what a cost accounting that charges the probe by its
  // multiply-adds (row_probed) takes out of the measured select time. Pooling a new entry costs
  // 128 adds, 1/heads of scoring it, and is not counted in row_probed.
  double probe_seconds = 0;
  // [next_n][row n_blocks] the ranking key p[b] (higher = keep first), when want_scores.
  std::vector<std::vector<float>> row_scores;
};

// ---------------------------------------------------------------------------------------------
// The predictor interface. One object per request; not thread-safe (use one per thread/request).

class BlockPredictor {
 public:
  virtual ~BlockPredictor() = default;

  virtual const std::string& name() const = 0;
  virtual const PredictorConfig& config() const = 0;
  virtual int32_t num_layers() const = 0;
  virtual int64_t request_id() const = 0;

  // Chooses each row's blocks for `layer` at in.step and their union. Reuses `out`'s capacity.
  virtual Status select(int32_t layer, const StepInput& in, Selection* out) = 0;
  // Buffers row `row`'s scores for `layer` of the open step (pending until commit).
  virtual Status observe(int32_t layer, int32_t row, const RowScores& scores) = 0;
  // Closes the open step: `accepted` draft tokens (0..next_n-1) were accepted; replays rows per
  // config().mtp_update (prefix: 0..accepted in order; row0: row 0; all-rows: every row).
  virtual Status commit(int32_t accepted) = 0;

  // A prefill observation: a row the engine scored in full outside a decode step — the prompt, or
  // a tool output appended mid-conversation, whose indexer scores prefill computes anyway. It
  // updates `layer`'s state at once (no pending buffer, no commit; the same for every mtp_update,
  // so all modes start from the same state), with blocks stamped as seen at `step`. Only between
  // steps (none open); `step` must follow the last committed step, or equal the last prefill's
  // (more layers and rows of the same prefill, rows in order); the next decode step must follow it.
  virtual Status observe_prefill(int32_t layer, int64_t step, const RowScores& scores) = 0;

  // Forgets every observation and the open step (config, layers, request id stay).
  virtual void reset() = 0;
  // A copy for a request that shares this one's first `shared_entries` entries (-1: all): state
  // truncated to the blocks holding them, no open step, new request id. Fails with a step open.
  virtual Result<std::unique_ptr<BlockPredictor>> fork(int64_t request_id,
                                                       int64_t shared_entries) const = 0;

  // Serving (spin/serving.h): sizes every buffer for contexts up to `max_entries` entries and up
  // to `max_next_n` rows, so that no later select/observe/commit within those limits allocates.
  // kInvalidArgument for limits out of range, kResourceExhausted when the memory is not there.
  virtual Status reserve(int64_t max_entries, int32_t max_next_n) = 0;
  // reset(), then continue as request `request_id` (a serving slot handed to a new request):
  // every buffer keeps its capacity, so nothing is allocated.
  virtual void rebind(int64_t request_id) = 0;

  // Persistent state of all layers: each layer's block and offset state, plus hisa's pooled keys.
  virtual size_t memory_bytes() const = 0;
};

// Whether a step whose context (tokens, its own next_n rows included) grew from `prev_ctx_len` to
// `ctx_len` appended a prefill (a tool output, a new turn) besides its rows: the engine scored those
// rows in full, so the step goes to observe_prefill, not select. One rule for replay, the engine
// and serving's callers.
inline bool context_jump_is_prefill(int64_t prev_ctx_len, int64_t ctx_len, int32_t next_n) {
  return ctx_len - prev_ctx_len > next_n;
}

// ---------------------------------------------------------------------------------------------
// The registry: one row per predictor (src/predict/registry.cpp), what every layer asks instead of
// comparing names.

// What a predictor reads besides its own state (the scores it observed).
enum class PredictorReads {
  kOwnState,  // nothing else
  kKeys,      // the key cache and the step's query (PredictorInputs::hisa), or a probe made from them
              // (PredictorInputs::block_probe; a score trace's layer.{l}.probe)
  kTrueTopk,  // this step's true top-k (PredictorInputs::true_topk): a bound, not a predictor to deploy
};
const char* predictor_reads_name(PredictorReads v);  // "own-state" "keys" "true-topk"

struct PredictorInfo {
  std::string name;
  PredictorReads reads = PredictorReads::kOwnState;
  bool can_serve = false;  // the serving API (spin/serving.h) runs it: it reads only its own state
  bool explores = false;   // spends explore_ratio of its budget on exploration draws
  bool keeps_all = false;  // scores every block (all-keep): an engine runs no predictor for it
  // Predicts a step's top-k blocks from the previous step's (prev-iter, step-reuse): replay's open
  // loop reports the previous step's top-k recall beside it, its ceiling.
  bool reuses_previous_topk = false;
};

// Every row, in a fixed order (the order predictor_names() lists).
const std::vector<PredictorInfo>& predictor_registry();
// The row of `name`; nullptr for a name make_predictor does not know.
const PredictorInfo* find_predictor(std::string_view name);

// Bytes one request's predictor `info` holds once reserve(max_entries, max_next_n) has run: every
// layer's state, pending rows and last top-k, its scratch, and the pooled keys of those that read
// keys. Computed without making one (in double, so an absurd size is measured, not overflowed):
// what the engine and serving plan their memory with.
double planned_bytes(const PredictorInfo& info, const PredictorConfig& config, int32_t num_layers,
                     int64_t max_entries, int32_t max_next_n);

// The predictor names make_predictor accepts, in the registry's order.
const std::vector<std::string>& predictor_names();

// Whether the predictor reads the keys (PredictorReads::kKeys): such a predictor replays a score
// trace only when it carries the probe (spin/trace.h, layer.{l}.probe).
bool predictor_needs_keys(std::string_view name);

// Creates a predictor by its registry name (predictor_names(); what each does:
// src/predict/registry.cpp and ARCHITECTURE.md). Validates the config.
Result<std::unique_ptr<BlockPredictor>> make_predictor(std::string_view name,
                                                       const PredictorConfig& config,
                                                       int32_t num_layers, int64_t request_id);

}  // namespace spin
