// Internal to src/engine: where a decode step's indexer inputs come from. The engine asks one
// InputSource for every entry's key, every row's query and head weights, each step's context and
// the drafts verification accepts; the source is synthetic (random, keyed on the seed: see
// synthetic_inputs.cpp) or replays a key trace's IndexerInputs (trace_inputs.cpp). Latents and
// attention queries are synthetic for either source: no trace carries them.
#pragma once

#include <cstdint>
#include <memory>

#include "spin/lab/engine.h"
#include "spin/geometry.h"
#include "spin/status.h"

namespace spin::engine_inputs {

// The RNG stream tags: each kind of random data has its own stream per (seed, layer, request,
// position), so any two engines with the same seed hold the same data.
enum : uint64_t { kTagIndexKey = 11, kTagLatent, kTagIndexQuery, kTagAttnQuery, kTagAccept };

class InputSource {
 public:
  virtual ~InputSource() = default;

  // A request must start from a prompt the source can feed.
  virtual Status check_prompt(int64_t prompt_tokens) const = 0;
  // A request's `step` must exist and agree with the engine's context of `tokens_with_rows`.
  virtual Status check_step(int64_t request_id, int64_t step, int64_t tokens_with_rows) const = 0;
  // The context of a request's `step` (its `tokens` plus the rows, or further after a jump).
  virtual int64_t step_context(int64_t step, int64_t tokens) const = 0;
  // Whether `step` (> 0) grew the context by more than its rows (a prefill, as in replay).
  virtual bool context_jumps(int64_t step) const = 0;
  // Draft tokens of a request's `step` that verification accepts.
  virtual int32_t accepted_drafts(int64_t request_id, int64_t step) const = 0;
  // Indexer key [128] and scale of entry `e` of layer `l`.
  virtual void index_key(int32_t l, int64_t request_id, int64_t e, uint8_t* key, float* scale) const = 0;
  // Indexer query [heads, 128] and head weights [heads] of row `row` of a request's `step`, whose
  // token sits at `position`.
  virtual void index_query(int32_t l, int64_t request_id, int64_t step, int32_t row, int64_t position, uint8_t* q,
                           float* w) const = 0;
};

std::unique_ptr<InputSource> make_synthetic_inputs(const EngineConfig& c);
// Over c.inputs (borrowed: it must outlive the source), checked by check_trace_inputs.
std::unique_ptr<InputSource> make_trace_inputs(const EngineConfig& c);

inline std::unique_ptr<InputSource> make_input_source(const EngineConfig& c) {
  return c.inputs != nullptr ? make_trace_inputs(c) : make_synthetic_inputs(c);
}

// Inputs that cannot feed this engine's shape are refused before anything is allocated.
Status check_trace_inputs(const EngineConfig& c, int64_t max_tokens);

// Random e4m3 code that is never a NaN code.
inline uint8_t random_code(uint64_t bits) {
  const uint8_t c = static_cast<uint8_t>(bits);
  return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(c & 0xFE) : c;
}

// A random MLA latent entry in `dtype`'s page layout, keyed on (seed, layer, request, entry).
void write_random_latent(uint64_t seed, int32_t l, int64_t request_id, int64_t e, LatentDtype dtype, uint8_t* entry);
// A random bf16 attention query [attn_heads, 576], keyed on (seed, layer, request, position).
void write_random_attn_query(uint64_t seed, int32_t l, int64_t request_id, int64_t position, int32_t attn_heads,
                             uint16_t* q);

}  // namespace spin::engine_inputs
