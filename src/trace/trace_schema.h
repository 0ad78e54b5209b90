// Internal to src/trace: the trace schema that the reader (trace_reader.cpp) and the writer
// (trace_writer.cpp) share. A trace, whether in a file or in memory, is first turned into typed
// views (checking dtype and shape, or sizes), and the same value rules then apply to either.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "spin/status.h"
#include "spin/trace.h"

namespace spin::trace_schema {

inline constexpr int64_t kD = kTraceHeadDim;

struct LayerViews {
  int64_t entries = 0;
  std::span<const uint8_t> k, q, k_draft;
  std::span<const float> k_scale, w, k_draft_scale;
};

struct TraceViews {
  int64_t steps = 0;
  std::span<const int64_t> ctx_len;
  std::span<const int32_t> accepted;
  bool has_draft = false;
  std::vector<LayerViews> layers;
};

struct ScoreViews {
  int64_t steps = 0;
  std::span<const int64_t> ctx_len;
  std::span<const int32_t> accepted;
  std::vector<int64_t> entries;                // [layers]
  std::vector<std::span<const float>> scores;  // [layers][steps, next_n, entries]
  int32_t probe_block_entries = 0;             // 0: no probe
  std::vector<std::span<const float>> probe;   // [layers][steps, next_n, probe blocks], or empty
};

std::string layer_name(int l, const char* what);
// The product of `factors`, false on a negative factor or overflow.
bool checked_mul(std::initializer_list<int64_t> factors, int64_t* out);
inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The metadata limits, before any size is used.
Status check_meta(const TraceMeta& m, const std::string& where);
// The value rules of a key trace and of a score trace (data_loss naming the first fault).
Status check_values(const TraceMeta& m, const TraceViews& v, const std::string& where);
Status check_score_values(const TraceMeta& m, const ScoreViews& v, const std::string& where);
// metadata probe_block_entries: 1..kTraceMaxProbeBlockEntries.
Status check_probe_block_entries(int64_t value, const std::string& where);

// Metadata (de)serialisation: the safetensors string map <-> TraceMeta.
Status parse_int_meta(const std::map<std::string, std::string>& md, const char* key,
                      const std::string& where, int32_t* out);
Status parse_meta(const std::map<std::string, std::string>& md, const std::string& where,
                  TraceMeta* m);
std::map<std::string, std::string> meta_to_strings(const TraceMeta& m);

// In-memory traces as views, checked (sizes, then the value rules).
Status trace_views(const Trace& t, TraceViews* v);
Status score_views(const ScoreTrace& t, ScoreViews* v);

}  // namespace spin::trace_schema
