// spin/lab/replay.h — replays a trace through a predictor and measures it against all-keep.
//
// Two steps, so that many predictors and budgets share the expensive part:
//   1. score_trace(): runs the real indexer kernel (all blocks scored: all-keep) and the real
//      top-k for every (layer, step, row) of the trace, on a paged cache built from the trace.
//      This is the ground truth of every metric (spin/lab/metrics.h).
//   2. replay(): walks (step, layer, row) in decode order through a predictor.
//      closed loop: the predictor selects blocks; only their scores exist for it (the indexer
//        output with -inf elsewhere — bitwise what the block-masked kernel writes); top-k runs on
//        those; the predictor observes what it scored; MTP commits replay per mtp_update.
//      open loop: the predictor observes every step's full scores (the paper's predictor
//        comparison) and is judged by the Pearson of its block ranking against the true pooled
//        block scores, and by the recall of the blocks it would have selected.
// MTP rows of a draft position use the final sequence's entries (k_draft is not replayed).
// A score trace (kind=scores, spin/trace.h) skips step 1's kernels: its recorded scores are the
// all-keep scores, and the real top-k runs on them; every predictor that needs only scores then
// replays it exactly as a key trace with those scores. A predictor that needs keys
// (predictor_needs_keys: hisa) replays it only when it carries a block probe (layer.{l}.probe),
// and refuses in one line otherwise.
//
// Prefill is an observation. A step is replayed as a prefill when the engine scored it in full
// anyway: step 0 (the prompt's last token, with warm_start) and every step whose ctx_len grows by
// more than its rows (a tool output or a new turn appended mid-conversation: prefill_jumps). Its
// rows 0..accepted go to BlockPredictor::observe_prefill in full — the same for every MTP update
// mode, so prefix, row0 and all-rows start from the same state — and it is not a sample.
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/replay.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "spin/lab/metrics.h"
#include "spin/predict.h"
#include "spin/status.h"
#include "spin/trace.h"

namespace spin {

class ScoredTrace;  // opaque: caches, all-keep scores and top-k of one trace

struct ScoreOptions {
  int threads = 0;
  // The top-k of the ground truth (and so of every replay on it); 0 = the trace's. A real model's
  // trace is read at its own top-k and at one scaled to its context (2048 of 8K is a quarter).
  int32_t topk = 0;
  std::function<void(int64_t done, int64_t total)> progress;  // called after each (layer, step)
};
Result<std::shared_ptr<const ScoredTrace>> score_trace(const Trace& trace, const ScoreOptions& options = {});
// The ground truth of a score trace: its scores as recorded, top-k by the real kernel.
Result<std::shared_ptr<const ScoredTrace>> score_trace(const ScoreTrace& trace, const ScoreOptions& options = {});
// A key trace's all-keep indexer scores as a score trace (`spin trace convert --to scores`):
// same metadata and ctx_len / accepted, layer.{l}.scores [steps, next_n, entries] F32 with -inf
// beyond each row's visible prefix, plus the block probe layer.{l}.probe (probe_block_entries =
// page_size): exactly hisa's block score (mean-pooled committed keys, Σ_h w·ReLU(q·kbar)), so that
// hisa selects the same blocks on the key trace and on its converted score trace.
Result<ScoreTrace> all_keep_score_trace(const Trace& trace, const ScoreOptions& options = {});
// Whether a scored trace carries the keys and queries predictor_needs_keys() predictors read.
bool has_keys(const ScoredTrace& scored);
// Whether it carries a score trace's block probe (layer.{l}.probe), which such predictors read
// instead (PredictorInputs::block_probe) when the trace has no keys, and its entries per pooled key
// (0 without a probe). replay() hands the probe to every predictor whose block_entries match.
bool has_probe(const ScoredTrace& scored);
int32_t probe_block_entries(const ScoredTrace& scored);

// Per-trace facts of the all-keep ground truth.
struct TraceFacts {
  int64_t samples = 0;                 // (layer, step, row) triples
  int64_t exact_by_construction = 0;   // rows whose context holds ≤ topk entries
  double topk_block_share = 0;         // mean share of visible blocks holding ≥ 1 top-k entry
  double prev_step_topk_recall = 0;    // mean |TopK_{t-1} ∩ TopK_t| / k (row 0, steps ≥ 1)
  double prev_step_block_pearson = 0;  // mean Pearson of consecutive steps' max-pooled block scores (row 0)
  double mean_visible_entries = 0;
};
// Over every layer, or only `layer` (≥ 0): real models' layers differ a lot.
// block_entries must be ≥ 1 and layer < the trace's layers (check_trace_facts says why not);
// arguments it refuses give an all-zero TraceFacts, never a division by zero.
Status check_trace_facts(const ScoredTrace& scored, int32_t block_entries, int32_t layer = -1);
TraceFacts trace_facts(const ScoredTrace& scored, int32_t block_entries, int32_t layer = -1);

struct ReplayOptions {
  std::string predictor = "spin";
  PredictorConfig config;   // page_size and topk are taken from the trace
  bool open_loop = false;
  bool keep_topk = false;   // keep every row's top-k (for --dump-topk; open loop: the all-keep one)
  // Step 0 stands for prefill: DSA prefill scores every prompt entry anyway, so an engine has the
  // last prompt token's full indexer row before its first decode step. With warm_start the
  // predictor observes step 0 in full and step 0 is not counted as a sample (otherwise every
  // predictor's first step is a cold guess that dominates p99 miss). Same for every predictor.
  bool warm_start = true;
  // A step whose ctx_len grows by more than next_n over the previous one appended a prefill (tool
  // output, new turn): observed in full and not counted, as step 0. false replays it as decode.
  bool prefill_jumps = true;
  // Samples are counted only for steps in [count_from_step, count_to_step) (-1: to the end):
  // to read the metrics over a window (e.g. the steps after a tool burst). The replay runs whole.
  int64_t count_from_step = 0;
  int64_t count_to_step = -1;
  std::function<void(int64_t done, int64_t total)> progress;  // after each step
  // Called after each step is closed (committed, or observed as a prefill): tests read the
  // predictor's state here.
  std::function<void(int64_t step, const BlockPredictor& predictor)> after_step;
};

// Whether replay() treats step `step` as a prefill (see above) under these options.
bool replayed_as_prefill(const ScoredTrace& scored, int64_t step, const ReplayOptions& options);

struct ReplayResult {
  std::string predictor;
  PredictorConfig config;
  bool open_loop = false;
  QualityStats quality{2048};
  double predictor_seconds = 0;  // time in select + observe + commit
  // Cost: what the predictor's select + observe + commit took on the counted
  // steps, its probe's own scoring taken out (the probe is charged by its work instead,
  // QualityStats::work_fraction), and the full indexer's time per entry measured in the same
  // process (indexer_entry_seconds) to express it in indexer work.
  double overhead_seconds = 0;
  double indexer_entry_seconds = 0;
  double overhead_fraction() const;  // overhead_seconds / (indexer time of the visible entries)
  double cost_fraction() const;      // quality.work_fraction() + overhead_fraction()
  int64_t prefill_steps = 0;     // steps observed as prefills (not samples)
  // [layer][step · next_n + row][topk] when keep_topk (open loop: the all-keep top-k it saw).
  std::vector<std::vector<std::vector<int32_t>>> topk;
};

Result<ReplayResult> replay(const Trace& trace, const ScoredTrace& scored, const ReplayOptions& options);
// The same without the trace's keys and queries (a score trace, or any scored trace): a predictor
// that needs keys (hisa) is refused in one line unless `scored` carries a block probe; a scored
// key trace: use the overload above.
Result<ReplayResult> replay(const ScoredTrace& scored, const ReplayOptions& options);

// The full indexer's single-thread time per entry (one row, `num_heads` heads × 128, this CPU's
// fastest kernel), measured once per process and head count: best of several runs over a
// 32K-entry cache. The unit every cost_fraction converts seconds with.
double indexer_entry_seconds(int32_t num_heads);

// Bytes that read_trace() + score_trace() + replay() hold for this trace (the trace in memory, its
// caches, every row's all-keep scores and top-k, and the kept top-k): compared with the machine's
// memory before reading, so that a trace too large for it is refused up front, not by bad_alloc.
double replay_memory_bytes(const TraceReader& trace, bool keep_topk);

// The metrics of a replay as one JSON object (what `spin replay` prints and --json writes):
// trace, predictor, open_loop, config, samples, recall/miss percentiles, sparsities, Pearson, the
// trace's top-k block share, the predictor's own time and its cost (work_fraction,
// probe_fraction, overhead_fraction, cost_fraction). Non-finite values are written as null.
std::string replay_json(const std::string& trace_path, const ReplayResult& result, const TraceFacts& facts);

// Writes `layer.{l}.topk` i32 [steps, next_n, topk] (spin/topk.h format) atomically.
Status write_topk_dump(const std::string& path, const Trace& trace, const ReplayResult& result);
Status write_topk_dump(const std::string& path, int64_t steps, int32_t next_n, const ReplayResult& result);

}  // namespace spin
