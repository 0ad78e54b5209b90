// The engine's indexer inputs replayed from a key trace (IndexerInputs): every request replays the
// same keys, queries, head weights, contexts and accepted drafts from step 0.
#include <cstring>

#include "core/errors.h"
#include "engine/inputs.h"
#include "spin/predict.h"

namespace spin::engine_inputs {

namespace {

class TraceInputs final : public InputSource {
 public:
  explicit TraceInputs(const EngineConfig& c) : in_(*c.inputs), next_n_(c.next_n), index_heads_(c.model.index_heads) {}

  Status check_prompt(int64_t prompt_tokens) const override {
    if (prompt_tokens != in_.prompt_tokens()) {
      return invalid_argument("a request replaying inputs starts from their prompt of {} tokens, got {}",
                              in_.prompt_tokens(), prompt_tokens);
    }
    return ok_status();
  }

  Status check_step(int64_t request_id, int64_t step, int64_t tokens_with_rows) const override {
    if (step >= in_.steps) {
      return out_of_range("request {} has replayed all {} steps of its inputs", request_id, in_.steps);
    }
    if (in_.ctx_len[step] < tokens_with_rows) {
      return failed_precondition("request {} is at {} tokens but step {} of its inputs has ctx_len {}", request_id,
                                 tokens_with_rows, step, in_.ctx_len[step]);
    }
    return ok_status();
  }

  // The recorded context, which may jump further than the rows: agentic traces append a tool
  // output between steps (the engine writes it as a prompt).
  int64_t step_context(int64_t step, int64_t) const override { return in_.ctx_len[step]; }

  bool context_jumps(int64_t step) const override {
    return context_jump_is_prefill(in_.ctx_len[step - 1], in_.ctx_len[step], next_n_);
  }

  int32_t accepted_drafts(int64_t, int64_t step) const override {
    return in_.accepted != nullptr ? in_.accepted[step] : 0;
  }

  void index_key(int32_t l, int64_t, int64_t e, uint8_t* key, float* scale) const override {
    std::memcpy(key, in_.keys[l] + e * kIndexerHeadDim, kIndexerHeadDim);
    std::memcpy(scale, in_.key_scales[l] + e, 4);
  }

  void index_query(int32_t l, int64_t, int64_t step, int32_t row, int64_t, uint8_t* q, float* w) const override {
    const int64_t q_size = int64_t{index_heads_} * kIndexerHeadDim;
    const int64_t trace_row = step * next_n_ + row;
    std::memcpy(q, in_.queries[l] + trace_row * q_size, static_cast<size_t>(q_size));
    std::memcpy(w, in_.weights[l] + trace_row * index_heads_, static_cast<size_t>(index_heads_) * 4);
  }

 private:
  const IndexerInputs& in_;
  int32_t next_n_;
  int32_t index_heads_;
};

}  // namespace

std::unique_ptr<InputSource> make_trace_inputs(const EngineConfig& c) { return std::make_unique<TraceInputs>(c); }

Status check_trace_inputs(const EngineConfig& c, int64_t max_tokens) {
  const IndexerInputs* in = c.inputs;
  if (in == nullptr) return ok_status();
  const auto layers = static_cast<size_t>(c.layers);
  if (in->keys.size() < layers || in->key_scales.size() < layers || in->queries.size() < layers ||
      in->weights.size() < layers) {
    return invalid_argument("the inputs hold {} layers, the engine simulates {}", in->keys.size(), c.layers);
  }
  if (in->steps < 1 || in->ctx_len == nullptr) return invalid_argument("the inputs hold no steps");
  if (in->next_n != c.next_n) return invalid_argument("the inputs have next_n {}, the engine {}", in->next_n, c.next_n);
  if (in->next_n > 1 && in->accepted == nullptr) return invalid_argument("MTP inputs need their accepted counts");
  if (in->num_heads != c.model.index_heads) {
    return invalid_argument("the inputs have {} indexer heads, {} has {}", in->num_heads, c.model.name,
                            c.model.index_heads);
  }
  const int64_t last = in->ctx_len[in->steps - 1];
  if (in->prompt_tokens() < 1 || last > max_tokens + c.next_n || last / c.model.compress_ratio > in->entries) {
    return invalid_argument("the inputs' contexts ({} to {} tokens) do not fit {} entries and max_tokens {}",
                            in->ctx_len[0], last, in->entries, max_tokens);
  }
  return ok_status();
}

}  // namespace spin::engine_inputs
