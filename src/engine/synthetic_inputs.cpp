// Random-input synthesis: the engine's keys, queries, acceptance, latents and attention queries
// when no trace feeds it. Every value is drawn from a counter RNG keyed on the seed, the layer, the
// request and the position, so it does not depend on the batch, the thread count or the order.
#include <cmath>
#include <cstring>

#include "engine/inputs.h"
#include "spin/numerics.h"
#include "spin/rng.h"

namespace spin::engine_inputs {

namespace {

class SyntheticInputs final : public InputSource {
 public:
  explicit SyntheticInputs(const EngineConfig& c)
      : seed_(c.seed), next_n_(c.next_n), index_heads_(c.model.index_heads), acceptance_rate_(c.acceptance_rate) {}

  Status check_prompt(int64_t) const override { return ok_status(); }
  Status check_step(int64_t, int64_t, int64_t) const override { return ok_status(); }
  int64_t step_context(int64_t, int64_t tokens) const override { return tokens + next_n_; }
  bool context_jumps(int64_t) const override { return false; }

  // Each draft is accepted with probability acceptance_rate, until the first rejection.
  int32_t accepted_drafts(int64_t request_id, int64_t step) const override {
    int32_t accepted = 0;
    CounterRng rng(stream_key(seed_, kTagAccept, request_id, step));
    while (accepted < next_n_ - 1 && rng.uniform() < acceptance_rate_) ++accepted;
    return accepted;
  }

  void index_key(int32_t l, int64_t request_id, int64_t e, uint8_t* key, float* scale) const override {
    CounterRng rng(stream_key(seed_, kTagIndexKey, l, request_id, e));
    for (int d = 0; d < kIndexerHeadDim; d += 8) {
      const uint64_t bits = rng.next_u64();
      for (int i = 0; i < 8; ++i) key[d + i] = random_code(bits >> (8 * i));
    }
    const float s = std::ldexp(1.0f, -static_cast<int>(rng.below(6)));
    std::memcpy(scale, &s, 4);
  }

  void index_query(int32_t l, int64_t request_id, int64_t, int32_t, int64_t position, uint8_t* q,
                   float* w) const override {
    const int64_t q_size = int64_t{index_heads_} * kIndexerHeadDim;
    CounterRng qi(stream_key(seed_, kTagIndexQuery, l, request_id, position));
    for (int64_t i = 0; i < q_size; i += 8) {
      const uint64_t bits = qi.next_u64();
      for (int k = 0; k < 8; ++k) q[i + k] = random_code(bits >> (8 * k));
    }
    for (int32_t h = 0; h < index_heads_; ++h) w[h] = static_cast<float>(qi.uniform() * 0.02);
  }

 private:
  uint64_t seed_;
  int32_t next_n_;
  int32_t index_heads_;
  double acceptance_rate_;
};

}  // namespace

std::unique_ptr<InputSource> make_synthetic_inputs(const EngineConfig& c) {
  return std::make_unique<SyntheticInputs>(c);
}

void write_random_latent(uint64_t seed, int32_t l, int64_t request_id, int64_t e, LatentDtype dtype, uint8_t* entry) {
  CounterRng lrng(stream_key(seed, kTagLatent, l, request_id, e));
  if (dtype == LatentDtype::kFp8) {
    for (int d = 0; d < kMlaLatentDim; d += 8) {
      const uint64_t bits = lrng.next_u64();
      for (int i = 0; i < 8; ++i) entry[LatentPageLayout::kFp8LatentOffset + d + i] = random_code(bits >> (8 * i));
    }
    for (int t = 0; t < kMlaNumTiles; ++t) {
      const float s = 1.0f / 256;  // a UE8M0 power of two
      std::memcpy(entry + LatentPageLayout::kFp8ScaleOffset + 4 * t, &s, 4);
    }
    for (int j = 0; j < kMlaRopeDim; ++j) {
      const uint16_t v = bf16_from_float(static_cast<float>(lrng.uniform() * 2 - 1));
      std::memcpy(entry + LatentPageLayout::kFp8RopeOffset + 2 * j, &v, 2);
    }
  } else {
    for (int d = 0; d < kMlaHeadDim; ++d) {
      const uint16_t v = bf16_from_float(static_cast<float>(lrng.uniform() * 2 - 1));
      std::memcpy(entry + 2 * d, &v, 2);
    }
  }
}

void write_random_attn_query(uint64_t seed, int32_t l, int64_t request_id, int64_t position, int32_t attn_heads,
                             uint16_t* q) {
  CounterRng qa(stream_key(seed, kTagAttnQuery, l, request_id, position));
  for (int64_t i = 0; i < int64_t{attn_heads} * kMlaHeadDim; ++i) {
    q[i] = bf16_from_float(static_cast<float>(qa.uniform() - 0.5));
  }
}

}  // namespace spin::engine_inputs
