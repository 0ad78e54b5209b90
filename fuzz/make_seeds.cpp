// Writes a few small valid trace files into the directory given as argv[1]: the fuzzer's seed
// corpus (plain decode, MTP with draft keys, V4-style compress ratio 4), and score traces (kind=scores)
// of the same shapes, two of them with a block probe (layer.{l}.probe).
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "spin/trace.h"

namespace {

spin::Trace tiny(int layers, int next_n, int ratio, bool draft) {
  spin::Trace t;
  t.meta.model = "fuzz-seed";
  t.meta.num_layers = layers;
  t.meta.next_n = next_n;
  t.meta.num_heads = 2;
  t.meta.page_size = 4;
  t.meta.topk = 4;
  t.meta.compress_ratio = ratio;
  const int steps = 3;
  const int entries = 8;
  for (int s = 0; s < steps; ++s) t.ctx_len.push_back((entries - 2 + s) * ratio);
  if (next_n > 1) {
    for (int s = 0; s < steps; ++s) t.accepted.push_back(s % next_n);
  }
  uint32_t x = 12345;
  auto code = [&x] {
    x = x * 1664525u + 1013904223u;
    const auto c = static_cast<uint8_t>(x >> 24);
    return (c & 0x7F) == 0x7F ? static_cast<uint8_t>(0x7E) : c;
  };
  for (int l = 0; l < layers; ++l) {
    spin::TraceLayer L;
    for (int i = 0; i < entries * 128; ++i) L.k.push_back(code());
    for (int i = 0; i < entries; ++i) L.k_scale.push_back(std::ldexp(1.0f, i % 5 - 3));
    for (int i = 0; i < steps * next_n * 2 * 128; ++i) L.q.push_back(code());
    for (int i = 0; i < steps * next_n * 2; ++i) L.w.push_back(0.25f * static_cast<float>(i - 3));
    if (draft) {
      for (int i = 0; i < steps * (next_n - 1) * 128; ++i) L.k_draft.push_back(code());
      for (int i = 0; i < steps * (next_n - 1); ++i) L.k_draft_scale.push_back(0.125f);
    }
    t.layers.push_back(std::move(L));
  }
  return t;
}

// A score trace of the same shape: scores in [-4, 4), -inf sprinkled in, NaN padding past each
// row's visible prefix.
spin::ScoreTrace tiny_scores(int layers, int next_n, int ratio) {
  const spin::Trace keys = tiny(layers, next_n, ratio, false);
  spin::ScoreTrace t;
  t.meta = keys.meta;
  t.meta.kind = spin::TraceKind::kScores;
  t.ctx_len = keys.ctx_len;
  t.accepted = keys.accepted;
  const int64_t entries = 8;
  uint32_t x = 777;
  for (int l = 0; l < layers; ++l) {
    t.entries.push_back(entries);
    std::vector<float>& v = t.scores.emplace_back();
    for (int64_t s = 0; s < t.steps(); ++s) {
      for (int j = 0; j < next_n; ++j) {
        const int64_t visible = spin::visible_entries(t.ctx_len[s], next_n, j, ratio);
        for (int64_t e = 0; e < entries; ++e) {
          x = x * 1664525u + 1013904223u;
          float f = static_cast<float>(x >> 8) / static_cast<float>(1 << 21) - 4.0f;
          if (e % 5 == 3) f = -INFINITY;
          if (e >= visible) f = NAN;
          v.push_back(f);
        }
      }
    }
  }
  return t;
}

// The same score trace with a block probe of `probe_entries` entries per block (0 = page_size):
// values in [-2, 2), one -inf and one FLT_MAX (hisa's "no committed entry") per row, NaN padding
// past each row's visible blocks.
spin::ScoreTrace with_probe(spin::ScoreTrace t, int32_t probe_entries) {
  t.probe_block_entries = probe_entries;
  uint32_t x = 4242;
  for (int l = 0; l < t.meta.num_layers; ++l) {
    std::vector<float>& v = t.probe.emplace_back();
    const int64_t blocks = t.probe_blocks(l);
    for (int64_t s = 0; s < t.steps(); ++s) {
      for (int j = 0; j < t.meta.next_n; ++j) {
        const int64_t visible = spin::visible_entries(t.ctx_len[s], t.meta.next_n, j, t.meta.compress_ratio);
        const int64_t seen = (visible + t.probe_entries() - 1) / t.probe_entries();
        for (int64_t b = 0; b < blocks; ++b) {
          x = x * 1664525u + 1013904223u;
          float f = static_cast<float>(x >> 8) / static_cast<float>(1 << 22) - 2.0f;
          if (b == 0) f = -INFINITY;
          if (b == seen - 1) f = 3.4028235e38f;
          if (b >= seen) f = NAN;
          v.push_back(f);
        }
      }
    }
  }
  return t;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s OUT_DIR\n", argv[0]);
    return 2;
  }
  const std::string dir = argv[1];
  const struct {
    const char* name;
    spin::Trace trace;
  } seeds[] = {{"plain.safetensors", tiny(1, 1, 1, false)},
               {"mtp_draft.safetensors", tiny(2, 3, 1, true)},
               {"mtp.safetensors", tiny(1, 2, 1, false)},
               {"v4_ratio4.safetensors", tiny(1, 1, 4, false)}};
  for (const auto& s : seeds) {
    const spin::Status st = spin::write_trace(s.trace, dir + "/" + s.name);
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name, st.to_string().c_str());
      return 1;
    }
  }
  const struct {
    const char* name;
    spin::ScoreTrace trace;
  } score_seeds[] = {{"scores_plain.safetensors", tiny_scores(1, 1, 1)},
                     {"scores_mtp.safetensors", tiny_scores(2, 3, 1)},
                     {"scores_v4_ratio4.safetensors", tiny_scores(1, 1, 4)},
                     {"scores_probe_plain.safetensors", with_probe(tiny_scores(1, 1, 1), 0)},
                     {"scores_probe_mtp.safetensors", with_probe(tiny_scores(2, 3, 1), 2)}};
  for (const auto& s : score_seeds) {
    const spin::Status st = spin::write_score_trace(s.trace, dir + "/" + s.name);
    if (!st.ok()) {
      std::fprintf(stderr, "%s: %s\n", s.name, st.to_string().c_str());
      return 1;
    }
  }
  return 0;
}
