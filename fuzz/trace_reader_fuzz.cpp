// libFuzzer target: arbitrary bytes as a trace file (either kind: keys or scores), then a replay of
// whatever is accepted.
// The reader must return a Status with a message for every malformed input, never crash, never
// read outside the input (ASan), never hit undefined behaviour (UBSan); whatever it accepts must
// be fully usable, must satisfy the writer's own validation (the two sides of the schema agree),
// and must replay: all-keep scoring and closed- and open-loop replays of a few predictors
// succeed on every accepted trace (a trace the reader accepts and replay refuses is a bug in one
// of them), with recall in [0, 1]. A score trace replays every score-only predictor the same way,
// and hisa (which needs keys) is refused with a message, never run.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>

#include "spin/lab/replay.h"
#include "spin/trace.h"

namespace {

// Small enough to replay within the fuzzer's time per input.
bool small_enough(const spin::TraceReader& t) {
  int64_t work = 0;
  const int64_t heads = t.kind() == spin::TraceKind::kScores ? 1 : t.meta().num_heads;
  for (int l = 0; l < t.num_layers(); ++l) work += t.entries(l) * t.steps() * t.meta().next_n * heads;
  return work <= 4'000'000 && t.meta().topk <= 4096;
}

void check_replay(const spin::Result<spin::ReplayResult>& r, const spin::ScoredTrace& scored, const char* predictor,
                  bool open_loop) {
  if (!r.ok()) {
    std::fprintf(stderr, "replay of an accepted trace failed (%s): %s\n", predictor, r.status().to_string().c_str());
    __builtin_trap();
  }
  const double recall = r->quality.recall().mean();
  if (!open_loop && r->quality.samples() > r->quality.exact_by_construction() && !(recall >= 0 && recall <= 1)) {
    __builtin_trap();
  }
  const auto facts = spin::trace_facts(scored, r->config.block_entries());
  if (spin::replay_json("<fuzz>", r.value(), facts).empty()) __builtin_trap();
}

void replay_scores(const spin::TraceReader& reader) {
  const spin::ScoreTrace trace = reader.to_score_trace();
  if (!spin::validate_score_trace(trace).ok()) __builtin_trap();  // reader and writer agree
  spin::ScoreOptions so;
  so.threads = 1;
  auto scored = spin::score_trace(trace, so);
  if (!scored.ok()) {
    std::fprintf(stderr, "top-k of an accepted score trace failed: %s\n", scored.status().to_string().c_str());
    __builtin_trap();
  }
  for (const char* predictor : {"spin", "prev-iter", "step-reuse", "oracle", "hisa"}) {
    for (bool open_loop : {false, true}) {
      spin::ReplayOptions o;
      o.predictor = predictor;
      o.open_loop = open_loop;
      o.keep_topk = !open_loop;
      o.config.target_sparsity = 0.5;
      auto r = spin::replay(*scored.value(), o);
      // hisa replays a score trace only through a probe pooled at its block size (replay takes
      // the page size from the trace).
      const bool probe_fits = spin::has_probe(*scored.value()) &&
                              spin::probe_block_entries(*scored.value()) ==
                                  reader.meta().page_size * o.config.block_pages;
      if (spin::predictor_needs_keys(predictor) && !probe_fits) {
        if (r.ok() || r.status().message().empty()) __builtin_trap();  // refused, with a reason
        continue;
      }
      check_replay(r, *scored.value(), predictor, open_loop);
    }
  }
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
      check_replay(spin::replay(trace, *scored.value(), o), *scored.value(), predictor, open_loop);
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
  if (t.kind() == spin::TraceKind::kScores) {
    // Touch every row's visible prefix: finite or -inf, never NaN or +inf.
    uint64_t finite = 0;
    for (int l = 0; l < t.num_layers(); ++l) {
      for (int64_t s = 0; s < t.steps(); ++s) {
        for (int j = 0; j < t.meta().next_n; ++j) {
          const auto row = t.scores(l, s, j);
          const int64_t visible = t.visible_entries(s, j);
          if (visible > t.entries(l) || static_cast<int64_t>(row.size()) != t.entries(l)) __builtin_trap();
          for (int64_t e = 0; e < visible; ++e) {
            if (std::isnan(row[e]) || row[e] == INFINITY) __builtin_trap();
            finite += std::isfinite(row[e]);
          }
        }
      }
    }
    if (small_enough(t)) replay_scores(t);
    return finite == 0xFFFFFFFFFFFFFFFFull ? 1 : 0;
  }
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
