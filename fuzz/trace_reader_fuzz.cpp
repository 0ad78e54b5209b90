// libFuzzer target: arbitrary bytes as a trace file, then a replay of whatever is accepted.
// The reader must return a Status with a message for every malformed input, never crash, never
// read outside the input (ASan), never hit undefined behaviour (UBSan); whatever it accepts must
// be fully usable, must satisfy the writer's own validation (the two sides of the schema agree),
// and must replay: all-keep scoring and closed- and open-loop replays of a few predictors
// succeed on every accepted trace (a trace the reader accepts and replay refuses is a bug in one
// of them), with recall in [0, 1].
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "spin/replay.h"
#include "spin/trace.h"

namespace {

// Small enough to replay within the fuzzer's time per input.
bool small_enough(const spin::TraceReader& t) {
  int64_t work = 0;
  for (int l = 0; l < t.num_layers(); ++l) work += t.entries(l) * t.steps() * t.meta().next_n * t.meta().num_heads;
  return work <= 4'000'000 && t.meta().topk <= 4096;
}

void replay_all(const spin::TraceReader& reader) {
  const spin::Trace trace = reader.to_trace();
  spin::ScoreOptions so;
  so.threads = 1;
  auto scored = spin::score_trace(trace, so);
  if (!scored.ok()) {
    std::fprintf(stderr, "scoring an accepted trace failed: %s\n", scored.status().to_string().c_str());
    __builtin_trap();
  }
  for (const char* predictor : {"spin", "prev-iter", "hisa", "oracle"}) {
    for (bool open_loop : {false, true}) {
      spin::ReplayOptions o;
      o.predictor = predictor;
      o.open_loop = open_loop;
      o.keep_topk = !open_loop;
      o.config.target_sparsity = 0.5;
      auto r = spin::replay(trace, *scored.value(), o);
      if (!r.ok()) {
        std::fprintf(stderr, "replay of an accepted trace failed (%s): %s\n", predictor, r.status().to_string().c_str());
        __builtin_trap();
      }
      const double recall = r->quality.recall().mean();
      if (!open_loop && r->quality.samples() > r->quality.exact_by_construction() && !(recall >= 0 && recall <= 1)) {
        __builtin_trap();
      }
      const auto facts = spin::trace_facts(*scored.value(), r->config.block_entries());
      if (spin::replay_json("<fuzz>", r.value(), facts).empty()) __builtin_trap();
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto r = spin::TraceReader::from_memory(data, size);
  if (!r.ok()) {
    if (r.status().message().empty()) __builtin_trap();  // every error says what was wrong
    return 0;
  }
  const spin::TraceReader& t = r.value();
  const std::string summary = spin::describe(t);
  if (summary.empty()) __builtin_trap();
  // Touch every view (ASan checks the bounds of each byte read).
  uint64_t acc = 0;
  for (int l = 0; l < t.num_layers(); ++l) {
    for (uint8_t b : t.k(l)) acc += b;
    for (float s : t.k_scale(l)) acc += s > 0.0f;
    for (int64_t s = 0; s < t.steps(); ++s) {
      for (int j = 0; j < t.meta().next_n; ++j) {
        for (uint8_t b : t.q(l, s, j)) acc += b;
        for (float w : t.w(l, s, j)) acc += w > 0.0f;
        if (t.visible_entries(s, j) > t.entries(l)) __builtin_trap();
      }
      for (uint8_t b : t.k_draft(l, s)) acc += b;
      for (float x : t.k_draft_scale(l, s)) acc += x > 0.0f;
    }
  }
  if (!spin::validate_trace(t.to_trace()).ok()) __builtin_trap();
  if (small_enough(t)) replay_all(t);
  return acc == 0xFFFFFFFFFFFFFFFFull ? 1 : 0;  // keep `acc` alive
}
