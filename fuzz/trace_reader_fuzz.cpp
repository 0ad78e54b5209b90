// libFuzzer target: arbitrary bytes as a trace file. The reader must return a Status with a
// message for every malformed input, never crash, never read outside the input (ASan), never hit
// undefined behaviour (UBSan); and whatever it accepts must be fully usable and must satisfy the
// writer's own validation (the two sides of the schema agree).
#include <cstddef>
#include <cstdint>
#include <string>

#include "spin/trace.h"

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
  return acc == 0xFFFFFFFFFFFFFFFFull ? 1 : 0;  // keep `acc` alive
}
