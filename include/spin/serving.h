// spin/serving.h — the serving API (the serving contract): one object for a whole
// batch, what an inference engine (vLLM, SGLang) calls at every decode step of every indexer layer.
//
// State is indexed by a request *slot* that the engine owns (vLLM's req_index), for
// max_requests × num_layers × max_blocks blocks, all sized at create(): after it, select / observe
// / commit / add / drop allocate nothing (tests/serving_predictor_test.cpp counts allocations) —
// as long as next_n stays the same from step to step (a step with fewer rows than the one before
// lets the predictor's per-row selection buffers go, and the next larger step regrows them once).
// Exploration is keyed on the request id given to add(), never on the slot, so tensor-parallel
// ranks (or two objects holding the same request in different slots) select the same blocks.
//
// Per decode step, for a batch of B active slots with next_n rows each (rows = B · next_n, row
// i·next_n + j is row j of slots[i]):
//
//   for each indexer layer l (increasing):
//     select(slots, l, seq_lens, next_n, blocks)  // blocks int32 [rows, max_blocks], ascending,
//                                                 // -1 padded: the blocks to score for that row
//     ... the indexer scores them (block-masked), top-k runs over what was scored ...
//     observe(slots, l, logits[rows, cols], topk[rows, k] or null)      // full-width logits rows
//       or observe_scored(slots, l, scored[rows, max_blocks · E], topk)  // the scored blocks only
//   commit(slots, accepted[B])                    // draft tokens accepted, 0..next_n-1 (0: plain)
//
// The blocks of every row of a request are the union of its rows' sets (the union is scored once
// for all next_n rows, as in DecodeEngine and replay), so a select/observe/commit loop over a
// trace gives exactly `spin replay`'s selections. seq_lens[i] counts the request's tokens in the
// cache including this step's next_n rows (vLLM's seq_lens); row j sees
// visible_entries(seq_len, next_n, j, compress_ratio) entries (spin/geometry.h).
//
// Lifecycle: add(slot, request_id) for a new (or resumed) request — its state starts empty;
// drop(slot) when it finishes or is preempted (a resumed request is add()ed again). Each slot
// numbers its own steps from 0. prefill(...) observes a prompt's full indexer rows (or a tool
// output's), which the engine computes anyway, as one step of its own (not a decode step).
//
// Not thread-safe: one object per engine worker (per TP rank); calls come from one thread.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "spin/predict.h"
#include "spin/status.h"

namespace spin {

struct ServingOptions {
  std::string predictor = "spin";  // a predictor whose registry row can_serve (spin/predict.h):
                                   // not oracle, hisa, spin-hybrid(-ic2), which read the true
                                   // top-k or the key cache that serving does not have
  PredictorConfig config;
  int32_t max_requests = 0;        // slots: 0..max_requests-1
  int32_t num_layers = 0;          // indexer layers
  int64_t max_entries = 0;         // the longest context (cache entries) any request reaches
  int32_t max_next_n = 1;          // rows per step, 1..kMaxNextN
  int32_t compress_ratio = 1;      // tokens per entry: 1 (V3.2), 4 (V4 CSA layers)

  Status validate() const;
};

class ServingPredictor {
 public:
  // Validates the options, refuses (kResourceExhausted, in GiB) what would not fit the memory
  // budget of spin/memory.h before allocating anything, then allocates every slot's state and
  // every buffer.
  static Result<std::unique_ptr<ServingPredictor>> create(const ServingOptions& options);
  ~ServingPredictor();
  ServingPredictor(const ServingPredictor&) = delete;
  ServingPredictor& operator=(const ServingPredictor&) = delete;

  const ServingOptions& options() const;
  // Columns of a select output row: blocks_for_entries(config, max_entries).
  int32_t max_blocks() const;
  int32_t block_entries() const;

  // Starts request `request_id` in `slot` (which must be free); its state is empty.
  Status add(int32_t slot, int64_t request_id);
  // Frees `slot` (finished or preempted); an open step of it is discarded.
  Status drop(int32_t slot);
  bool active(int32_t slot) const;
  int64_t request_id(int32_t slot) const;  // -1 when the slot is free
  int64_t step(int32_t slot) const;        // steps committed in the slot (prefill included)
  int32_t open_next_n(int32_t slot) const; // rows of the slot's open step, 0 when none is open

  // Writes the blocks of each of the batch · next_n rows to blocks[row · blocks_stride + c]
  // (c < max_blocks; ascending, -1 after the last), and their count to counts[row] when counts is
  // not null. Slots must be active and distinct; the first select of a step opens it.
  Status select(const int32_t* slots, int32_t batch, int32_t layer, const int64_t* seq_lens,
                int32_t next_n, int32_t* blocks, int64_t blocks_stride, int32_t* counts = nullptr);
  // The rows' indexer logits (request-local positions, [rows, logits_stride], logits_cols ≥ every
  // row's visible entries; only the selected blocks' entries are read: -inf = scored, lowest;
  // NaN/+inf are errors) and optionally their top-k ([rows, topk_stride], the first config.topk
  // read, -1 padded). Must follow select(slots, layer) of the open step; the same slots in the
  // same order, all of them (another list is kInvalidArgument: its rows would be misread).
  Status observe(const int32_t* slots, int32_t batch, int32_t layer, const float* logits,
                 int64_t logits_stride, int64_t logits_cols, const int32_t* topk = nullptr,
                 int64_t topk_stride = 0);
  // Same, with only the scored blocks' logits: row r holds, for its c-th selected block (the
  // order select wrote), block_entries() entries at columns [c·E, (c+1)·E) (entries past the
  // row's visible count are not read). scored_stride ≥ counts[r] · E.
  Status observe_scored(const int32_t* slots, int32_t batch, int32_t layer, const float* scored,
                        int64_t scored_stride, const int32_t* topk = nullptr,
                        int64_t topk_stride = 0);
  // Closes the open step of every slot in `slots`: accepted[i] draft tokens of slots[i] accepted.
  Status commit(const int32_t* slots, int32_t batch, const int32_t* accepted);

  // A prompt's (or appended tool output's) full indexer scores for `layer`: one row per slot,
  // [batch, logits_stride], the last prompt token's row over seq_lens[i] entries (all scored).
  // Each row goes at once to BlockPredictor::observe_prefill (replay's prefill path) at the slot's
  // step number; the caller closes the prefill with commit() (accepted 0) after the last layer,
  // which advances the step as replay's prefill step does, so later steps explore alike. No
  // select or decode step may be open in the slot. It is not a decode step: nothing measures it.
  Status prefill(const int32_t* slots, int32_t batch, int32_t layer, const int64_t* seq_lens,
                 const float* logits, int64_t logits_stride);

  // Bytes of persistent state and preallocated buffers.
  size_t memory_bytes() const;

 private:
  struct Impl;
  explicit ServingPredictor(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace spin
