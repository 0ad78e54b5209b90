// Trace files, schema version 1 (see spin/trace.h for the schema and the decisions): the schema
// itself — metadata limits, value rules, metadata (de)serialisation and the in-memory views.
//
// One validator serves both directions: the reader (trace_reader.cpp) turns the file's tensors
// into typed views after checking dtype and shape, trace_views turns a Trace's vectors into the
// same views after checking sizes, and check_values then applies the value rules to either.
#include "trace/trace_schema.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <limits>

#include "core/errors.h"
#include "spin/numerics.h"

namespace spin {

static_assert(kTraceHeadDim == kIndexerHeadDim, "trace rows are indexer head vectors");

namespace trace_schema {

std::string layer_name(int l, const char* what) { return fmt::format("layer.{}.{}", l, what); }

bool checked_mul(std::initializer_list<int64_t> factors, int64_t* out) {
  int64_t p = 1;
  for (int64_t f : factors) {
    if (f < 0 || __builtin_mul_overflow(p, f, &p)) return false;
  }
  *out = p;
  return true;
}

Status check_meta(const TraceMeta& m, const std::string& where) {
  const struct {
    const char* name;
    int32_t value;
  } fields[] = {{"num_layers", m.num_layers}, {"next_n", m.next_n},
                {"num_heads", m.num_heads},   {"page_size", m.page_size},
                {"topk", m.topk},             {"compress_ratio", m.compress_ratio}};
  for (const auto& f : fields) {
    if (f.value < 1) {
      return invalid_argument("{}: metadata {} = {}, expected an integer >= 1", where, f.name,
                              f.value);
    }
  }
  const struct {
    const char* name;
    int32_t value, max;
  } limits[] = {{"num_layers", m.num_layers, kTraceMaxLayers}, {"next_n", m.next_n, kTraceMaxNextN},
                {"num_heads", m.num_heads, kTraceMaxHeads},    {"page_size", m.page_size, kTraceMaxPageSize},
                {"topk", m.topk, kTraceMaxTopk},               {"compress_ratio", m.compress_ratio, kTraceMaxCompressRatio}};
  for (const auto& f : limits) {
    if (f.value > f.max) {
      return invalid_argument("{}: metadata {} = {} is above the supported maximum {} (spin/trace.h)", where,
                              f.name, f.value, f.max);
    }
  }
  return ok_status();
}

namespace {

// ---------------------------------------------------------------------------------------------
// Value rules. Scans are written as branch-free reductions over chunks (they vectorise), and
// only a chunk that holds a fault is searched again for the message.

constexpr size_t kChunk = 4096;

bool is_nan_code(uint8_t b) { return (b & 0x7F) == 0x7F; }

// Index of the first e4m3 NaN code in `v`, or -1.
int64_t find_nan_code(std::span<const uint8_t> v) {
  for (size_t c = 0; c < v.size(); c += kChunk) {
    const size_t end = std::min(v.size(), c + kChunk);
    unsigned any = 0;
    for (size_t i = c; i < end; ++i) any |= static_cast<unsigned>(is_nan_code(v[i]));
    if (any != 0) {
      for (size_t i = c; i < end; ++i)
        if (is_nan_code(v[i])) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

bool bad_float(float x, bool positive) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  const bool non_finite = (bits & 0x7F800000u) == 0x7F800000u;
  return non_finite || (positive && !(x > 0.0f));
}

// Index of the first value that is not finite (or, with `positive`, not > 0), or -1.
int64_t find_bad_float(std::span<const float> v, bool positive) {
  for (size_t c = 0; c < v.size(); c += kChunk) {
    const size_t end = std::min(v.size(), c + kChunk);
    unsigned any = 0;
    for (size_t i = c; i < end; ++i) any |= static_cast<unsigned>(bad_float(v[i], positive));
    if (any != 0) {
      for (size_t i = c; i < end; ++i)
        if (bad_float(v[i], positive)) return static_cast<int64_t>(i);
    }
  }
  return -1;
}

// Writes a flat index as "[a, b, c]" for the dims of `shape`.
std::string unflatten(int64_t i, std::initializer_list<std::pair<const char*, int64_t>> shape) {
  std::vector<int64_t> idx;
  std::vector<std::pair<const char*, int64_t>> dims(shape);
  for (auto it = dims.rbegin(); it != dims.rend(); ++it) {
    idx.push_back(i % it->second);
    i /= it->second;
  }
  std::string s = "[";
  for (size_t d = 0; d < dims.size(); ++d) {
    if (d > 0) s += ", ";
    s += fmt::format("{} {}", dims[d].first, idx[dims.size() - 1 - d]);
  }
  return s + "]";
}

// Every fp32 score the indexer can compute from these weights is finite: the head sum
// Σ_h w[h]·ReLU(q·k) is at most Σ_h |w[h]| · 128 · 448² (e4m3 magnitudes are ≤ 448), and the score
// is that times k_scale — so both the sum and the score stay below FLT_MAX when
// Σ|w| · 128 · 448² · max(1, max k_scale) does. A weight that could push a score (or the sum
// before its scale: the fuzzer found w = 2e38 with k_scale = 1e-21) past FLT_MAX is refused here,
// naming its row, rather than as an inf deep in a replay.
Status check_weight_range(const TraceMeta& m, const TraceViews& v, int l, const std::string& where) {
  const LayerViews& L = v.layers[l];
  float max_scale = 1;
  for (float x : L.k_scale) max_scale = std::max(max_scale, x);
  for (float x : L.k_draft_scale) max_scale = std::max(max_scale, x);
  const double per_weight = double{kD} * 448.0 * 448.0 * max_scale;
  const int64_t rows = v.steps * m.next_n;
  for (int64_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (int64_t h = 0; h < m.num_heads; ++h) sum += std::fabs(L.w[r * m.num_heads + h]);
    if (sum * per_weight > std::numeric_limits<float>::max()) {
      return data_loss("{}: {} [step {}, row {}]: head weights with Σ|w| = {:.3g} can overflow fp32 scores "
                       "(bound Σ|w|·128·448²·max(1, k_scale) = {:.3g} > 3.4e38)",
                       where, layer_name(l, "w"), r / m.next_n, r % m.next_n, sum, sum * per_weight);
    }
  }
  return ok_status();
}

// Steps and entries a file claims, against the documented maxima.
Status check_sizes(const TraceMeta& m, const TraceViews& v, const std::string& where) {
  if (v.steps > kTraceMaxSteps) {
    return data_loss("{}: {} steps, above the supported maximum {} (spin/trace.h)", where, v.steps, kTraceMaxSteps);
  }
  for (int l = 0; l < m.num_layers; ++l) {
    if (v.layers[l].entries > kTraceMaxEntries) {
      return data_loss("{}: {} holds {} entries, above the supported maximum {} (spin/trace.h)", where,
                       layer_name(l, "k"), v.layers[l].entries, kTraceMaxEntries);
    }
  }
  return ok_status();
}

// ctx_len and accepted: the rules both kinds share.
Status check_ctx_accepted(const TraceMeta& m, int64_t steps, std::span<const int64_t> ctx_len,
                          std::span<const int32_t> accepted, const std::string& where) {
  const int64_t next_n = m.next_n;
  struct {
    std::span<const int64_t> ctx_len;
  } v{ctx_len};
  for (int64_t s = 0; s < steps; ++s) {
    const int64_t c = v.ctx_len[s];
    if (c < next_n) {
      return data_loss("{}: ctx_len[{}] = {} is below next_n = {} (the step's own rows are in "
                       "the cache, so row 0 sees at least one token)",
                       where, s, c, next_n);
    }
    if (s > 0 && c <= v.ctx_len[s - 1]) {
      return data_loss("{}: ctx_len is not strictly increasing: ctx_len[{}] = {} after "
                       "ctx_len[{}] = {} (every decode step appends at least one token)",
                       where, s, c, s - 1, v.ctx_len[s - 1]);
    }
  }
  for (size_t s = 0; s < accepted.size(); ++s) {
    const int32_t a = accepted[s];
    if (a < 0 || a > m.next_n - 1) {
      return data_loss("{}: accepted[{}] = {}, expected 0..{} (draft tokens accepted of "
                       "next_n - 1 = {})",
                       where, s, a, m.next_n - 1, m.next_n - 1);
    }
  }
  return ok_status();
}


}  // namespace

Status check_values(const TraceMeta& m, const TraceViews& v, const std::string& where) {
  const int64_t next_n = m.next_n, heads = m.num_heads;
  SPIN_RETURN_IF_ERROR(check_sizes(m, v, where));
  SPIN_RETURN_IF_ERROR(check_ctx_accepted(m, v.steps, v.ctx_len, v.accepted, where));
  const int64_t last_visible = v.ctx_len[v.steps - 1] / m.compress_ratio;
  for (int l = 0; l < m.num_layers; ++l) {
    if (last_visible > v.layers[l].entries) {
      return data_loss("{}: the last step (ctx_len {} tokens, compress_ratio {}) sees {} entries "
                       "but {} holds only {}",
                       where, v.ctx_len[v.steps - 1], m.compress_ratio, last_visible,
                       layer_name(l, "k"), v.layers[l].entries);
    }
  }
  // per layer tensors
  for (int l = 0; l < m.num_layers; ++l) {
    const LayerViews& L = v.layers[l];
    if (int64_t i = find_bad_float(L.k_scale, true); i >= 0) {
      return data_loss("{}: {}[{}] = {}, expected a finite scale > 0", where,
                       layer_name(l, "k_scale"), i, L.k_scale[i]);
    }
    if (int64_t i = find_bad_float(L.w, false); i >= 0) {
      return data_loss("{}: {}{} = {}, expected a finite weight", where, layer_name(l, "w"),
                       unflatten(i, {{"step", v.steps}, {"row", next_n}, {"head", heads}}),
                       L.w[i]);
    }
    SPIN_RETURN_IF_ERROR(check_weight_range(m, v, l, where));
    if (int64_t i = find_nan_code(L.k); i >= 0) {
      return data_loss("{}: {}{} holds the e4m3 NaN code {:#04x}", where, layer_name(l, "k"),
                       unflatten(i, {{"entry", L.entries}, {"dim", kD}}), L.k[i]);
    }
    if (int64_t i = find_nan_code(L.q); i >= 0) {
      return data_loss(
          "{}: {}{} holds the e4m3 NaN code {:#04x}", where, layer_name(l, "q"),
          unflatten(i, {{"step", v.steps}, {"row", next_n}, {"head", heads}, {"dim", kD}}),
          L.q[i]);
    }
    if (v.has_draft) {
      if (int64_t i = find_bad_float(L.k_draft_scale, true); i >= 0) {
        return data_loss("{}: {}{} = {}, expected a finite scale > 0", where,
                         layer_name(l, "k_draft_scale"),
                         unflatten(i, {{"step", v.steps}, {"draft", next_n - 1}}),
                         L.k_draft_scale[i]);
      }
      if (int64_t i = find_nan_code(L.k_draft); i >= 0) {
        return data_loss("{}: {}{} holds the e4m3 NaN code {:#04x}", where,
                         layer_name(l, "k_draft"),
                         unflatten(i, {{"step", v.steps}, {"draft", next_n - 1}, {"dim", kD}}),
                         L.k_draft[i]);
      }
    }
  }
  return ok_status();
}

namespace {

// ---------------------------------------------------------------------------------------------
// Score traces: the same ctx_len / accepted rules, then each row's visible prefix.

// NaN or +inf (-inf is a legal "scored, lowest").
bool bad_score(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, 4);
  return (bits & 0x7F800000u) == 0x7F800000u && bits != 0xFF800000u;
}

// The first NaN / +inf of each row's visible blocks (blocks past them are ignored, as columns are).
Status check_probe_values(const TraceMeta& m, const ScoreViews& v, const std::string& where) {
  const int64_t pbe = v.probe_block_entries;
  for (int l = 0; l < m.num_layers; ++l) {
    const int64_t blocks = ceil_div(v.entries[l], pbe);
    for (int64_t s = 0; s < v.steps; ++s) {
      for (int32_t j = 0; j < m.next_n; ++j) {
        const int64_t visible = ceil_div(spin::visible_entries(v.ctx_len[s], m.next_n, j, m.compress_ratio), pbe);
        const float* row = v.probe[l].data() + (s * m.next_n + j) * blocks;
        unsigned any = 0;
        for (int64_t b = 0; b < visible; ++b) any |= static_cast<unsigned>(bad_score(row[b]));
        if (any == 0) continue;
        for (int64_t b = 0; b < visible; ++b) {
          if (bad_score(row[b])) {
            return data_loss("{}: {}[step {}, row {}, block {}] = {} inside the row's {} visible blocks "
                             "(expected a finite probe score, or -inf for the lowest)",
                             where, layer_name(l, "probe"), s, j, b, row[b], visible);
          }
        }
      }
    }
  }
  return ok_status();
}

}  // namespace

Status check_score_values(const TraceMeta& m, const ScoreViews& v, const std::string& where) {
  if (v.steps > kTraceMaxSteps) {
    return data_loss("{}: {} steps, above the supported maximum {} (spin/trace.h)", where, v.steps, kTraceMaxSteps);
  }
  SPIN_RETURN_IF_ERROR(check_ctx_accepted(m, v.steps, v.ctx_len, v.accepted, where));
  const int64_t last_visible = v.ctx_len[v.steps - 1] / m.compress_ratio;
  for (int l = 0; l < m.num_layers; ++l) {
    const int64_t entries = v.entries[l];
    if (entries > kTraceMaxEntries) {
      return data_loss("{}: {} holds {} entries, above the supported maximum {} (spin/trace.h)", where,
                       layer_name(l, "scores"), entries, kTraceMaxEntries);
    }
    if (last_visible > entries) {
      return data_loss("{}: the last step (ctx_len {} tokens, compress_ratio {}) sees {} entries "
                       "but {} has only {} columns (entries < the visible prefix)",
                       where, v.ctx_len[v.steps - 1], m.compress_ratio, last_visible,
                       layer_name(l, "scores"), entries);
    }
    for (int64_t s = 0; s < v.steps; ++s) {
      for (int32_t j = 0; j < m.next_n; ++j) {
        const int64_t visible = spin::visible_entries(v.ctx_len[s], m.next_n, j, m.compress_ratio);
        const float* row = v.scores[l].data() + (s * m.next_n + j) * entries;
        unsigned any = 0;  // branch-free scan; only a faulty row is searched again
        for (int64_t e = 0; e < visible; ++e) any |= static_cast<unsigned>(bad_score(row[e]));
        if (any == 0) continue;
        for (int64_t e = 0; e < visible; ++e) {
          if (bad_score(row[e])) {
            return data_loss("{}: {}[step {}, row {}, entry {}] = {} inside the row's {} visible entries "
                             "(expected a finite score, or -inf for the lowest)",
                             where, layer_name(l, "scores"), s, j, e, row[e], visible);
          }
        }
      }
    }
  }
  return v.probe.empty() ? ok_status() : check_probe_values(m, v, where);
}

// metadata probe_block_entries: 1..kTraceMaxProbeBlockEntries.
Status check_probe_block_entries(int64_t value, const std::string& where) {
  if (value < 1 || value > kTraceMaxProbeBlockEntries) {
    return invalid_argument("{}: metadata probe_block_entries = {}, expected an integer in 1..{}", where, value,
                            kTraceMaxProbeBlockEntries);
  }
  return ok_status();
}

// ---------------------------------------------------------------------------------------------
// Metadata

Status parse_int_meta(const std::map<std::string, std::string>& md, const char* key,
                      const std::string& where, int32_t* out) {
  const auto it = md.find(key);
  if (it == md.end()) return data_loss("{}: metadata has no \"{}\"", where, key);
  const std::string& s = it->second;
  int64_t v = 0;
  const auto [p, ec] = std::from_chars(s.data(), s.data() + s.size(), v);
  if (ec != std::errc() || p != s.data() + s.size() || v < 1 || v > INT32_MAX) {
    return data_loss("{}: metadata {} = \"{}\", expected a decimal integer in 1..{}", where, key,
                     s, INT32_MAX);
  }
  *out = static_cast<int32_t>(v);
  return ok_status();
}

Status parse_meta(const std::map<std::string, std::string>& md, const std::string& where,
                  TraceMeta* m) {
  const auto fmt_it = md.find("format");
  if (fmt_it == md.end()) {
    return data_loss("{}: not a spin trace: safetensors metadata has no \"format\" (expected "
                     "format = \"{}\")",
                     where, kTraceFormat);
  }
  if (fmt_it->second != kTraceFormat) {
    return data_loss("{}: not a spin trace: metadata format = \"{}\", expected \"{}\"", where,
                     fmt_it->second, kTraceFormat);
  }
  const auto ver = md.find("version");
  if (ver == md.end()) return data_loss("{}: metadata has no \"version\"", where);
  if (ver->second != std::to_string(kTraceVersion)) {
    return data_loss("{}: trace version \"{}\" is not supported (this build reads version {})",
                     where, ver->second, kTraceVersion);
  }
  const auto kind = md.find("kind");
  if (kind == md.end() || kind->second == "keys") {
    m->kind = TraceKind::kKeys;
  } else if (kind->second == "scores") {
    m->kind = TraceKind::kScores;
  } else {
    return data_loss("{}: metadata kind = \"{}\", expected \"keys\" (indexer inputs) or \"scores\" "
                     "(indexer output)",
                     where, kind->second);
  }
  const auto model = md.find("model");
  if (model == md.end()) return data_loss("{}: metadata has no \"model\"", where);
  m->model = model->second;
  SPIN_RETURN_IF_ERROR(parse_int_meta(md, "num_layers", where, &m->num_layers));
  SPIN_RETURN_IF_ERROR(parse_int_meta(md, "next_n", where, &m->next_n));
  // A score trace has no heads: num_heads is optional there (kept when given).
  if (m->kind == TraceKind::kKeys || md.count("num_heads")) {
    SPIN_RETURN_IF_ERROR(parse_int_meta(md, "num_heads", where, &m->num_heads));
  }
  SPIN_RETURN_IF_ERROR(parse_int_meta(md, "page_size", where, &m->page_size));
  SPIN_RETURN_IF_ERROR(parse_int_meta(md, "topk", where, &m->topk));
  SPIN_RETURN_IF_ERROR(parse_int_meta(md, "compress_ratio", where, &m->compress_ratio));
  for (const auto& [k, val] : md) {
    if (k != "format" && k != "version" && k != "kind" && k != "model" && k != "num_layers" && k != "next_n" &&
        k != "num_heads" && k != "page_size" && k != "topk" && k != "compress_ratio") {
      m->extra[k] = val;
    }
  }
  return ok_status();
}

std::map<std::string, std::string> meta_to_strings(const TraceMeta& m) {
  std::map<std::string, std::string> md = m.extra;
  md["format"] = kTraceFormat;
  md["version"] = std::to_string(kTraceVersion);
  md["model"] = m.model;
  md["num_layers"] = std::to_string(m.num_layers);
  md["next_n"] = std::to_string(m.next_n);
  if (m.kind == TraceKind::kScores) {
    md["kind"] = trace_kind_name(m.kind);  // key traces keep the version-1 metadata unchanged
  } else {
    md["num_heads"] = std::to_string(m.num_heads);
  }
  md["page_size"] = std::to_string(m.page_size);
  md["topk"] = std::to_string(m.topk);
  md["compress_ratio"] = std::to_string(m.compress_ratio);
  return md;
}

// ---------------------------------------------------------------------------------------------
// In-memory traces

Status trace_views(const Trace& t, TraceViews* v) {
  const std::string where = "trace";
  const TraceMeta& m = t.meta;
  if (m.kind != TraceKind::kKeys) return invalid_argument("trace: meta.kind is scores; write it as a ScoreTrace");
  SPIN_RETURN_IF_ERROR(check_meta(m, where));
  if (t.ctx_len.empty()) return invalid_argument("trace: ctx_len is empty, expected >= 1 step");
  v->steps = t.steps();
  v->ctx_len = t.ctx_len;
  if (m.next_n > 1 && t.accepted.size() != t.ctx_len.size()) {
    return invalid_argument("trace: accepted has {} values, expected one per step ({}) since "
                            "next_n = {}",
                            t.accepted.size(), t.ctx_len.size(), m.next_n);
  }
  if (m.next_n == 1 && !t.accepted.empty() && t.accepted.size() != t.ctx_len.size()) {
    return invalid_argument("trace: accepted has {} values, expected 0 or {} (one per step)",
                            t.accepted.size(), t.ctx_len.size());
  }
  v->accepted = t.accepted;
  if (t.layers.size() != static_cast<size_t>(m.num_layers)) {
    return invalid_argument("trace: {} layers but meta.num_layers = {}", t.layers.size(),
                            m.num_layers);
  }
  int64_t q_size = 0, w_size = 0, draft_rows = 0;
  if (!checked_mul({v->steps, m.next_n, m.num_heads, kD}, &q_size) ||
      !checked_mul({v->steps, m.next_n, m.num_heads}, &w_size) ||
      !checked_mul({v->steps, m.next_n - 1}, &draft_rows)) {
    return invalid_argument("trace: steps x next_n x num_heads overflows");
  }
  v->has_draft = !t.layers[0].k_draft.empty() || !t.layers[0].k_draft_scale.empty();
  if (v->has_draft && m.next_n == 1) {
    return invalid_argument("trace: layer 0 has draft keys but next_n = 1 (no draft tokens)");
  }
  for (int l = 0; l < m.num_layers; ++l) {
    const TraceLayer& L = t.layers[l];
    LayerViews lv;
    lv.entries = static_cast<int64_t>(L.k_scale.size());
    if (L.k.size() != L.k_scale.size() * kD) {
      return invalid_argument("trace: {} has {} bytes, expected {} entries (from k_scale) x 128",
                              layer_name(l, "k"), L.k.size(), L.k_scale.size());
    }
    if (static_cast<int64_t>(L.q.size()) != q_size) {
      return invalid_argument("trace: {} has {} bytes, expected steps {} x next_n {} x heads {} "
                              "x 128 = {}",
                              layer_name(l, "q"), L.q.size(), v->steps, m.next_n, m.num_heads,
                              q_size);
    }
    if (static_cast<int64_t>(L.w.size()) != w_size) {
      return invalid_argument("trace: {} has {} values, expected steps {} x next_n {} x heads {} "
                              "= {}",
                              layer_name(l, "w"), L.w.size(), v->steps, m.next_n, m.num_heads,
                              w_size);
    }
    const bool draft = !L.k_draft.empty() || !L.k_draft_scale.empty();
    if (draft != v->has_draft) {
      return invalid_argument("trace: draft keys must be given for every layer or none; layer 0 "
                              "{} them, layer {} {}",
                              v->has_draft ? "has" : "lacks", l, draft ? "has" : "lacks");
    }
    if (draft && (static_cast<int64_t>(L.k_draft_scale.size()) != draft_rows ||
                  static_cast<int64_t>(L.k_draft.size()) != draft_rows * kD)) {
      return invalid_argument("trace: {} / k_draft_scale have {} / {} values, expected steps {} "
                              "x (next_n - 1) {} rows (x 128 for k_draft)",
                              layer_name(l, "k_draft"), L.k_draft.size(), L.k_draft_scale.size(),
                              v->steps, m.next_n - 1);
    }
    lv.k = L.k;
    lv.k_scale = L.k_scale;
    lv.q = L.q;
    lv.w = L.w;
    lv.k_draft = L.k_draft;
    lv.k_draft_scale = L.k_draft_scale;
    v->layers.push_back(lv);
  }
  return check_values(m, *v, where);
}

namespace {

// The in-memory probe: none, or one per layer of [steps, next_n, ceil(entries / probe_entries)].
Status probe_views(const ScoreTrace& t, ScoreViews* v) {
  const std::string where = "score trace";
  if (t.meta.extra.count("probe_block_entries")) {
    return invalid_argument("score trace: meta.extra holds probe_block_entries; set ScoreTrace::probe_block_entries");
  }
  if (t.probe.empty()) {
    if (t.probe_block_entries != 0) {
      return invalid_argument("score trace: probe_block_entries = {} but there is no probe (layer.{{l}}.probe)",
                              t.probe_block_entries);
    }
    return ok_status();
  }
  if (t.probe_block_entries != 0) SPIN_RETURN_IF_ERROR(check_probe_block_entries(t.probe_block_entries, where));
  if (t.probe.size() != t.scores.size()) {
    return invalid_argument("score trace: {} probe layers but {} score layers (a probe for every layer or none)",
                            t.probe.size(), t.scores.size());
  }
  v->probe_block_entries = t.probe_entries();
  for (int l = 0; l < t.meta.num_layers; ++l) {
    int64_t n = 0;
    const int64_t blocks = t.probe_blocks(l);
    if (!checked_mul({v->steps, t.meta.next_n, blocks}, &n) || static_cast<int64_t>(t.probe[l].size()) != n) {
      return invalid_argument("score trace: {} has {} values, expected steps {} x next_n {} x blocks {} "
                              "(ceil(entries {} / probe_block_entries {}))",
                              layer_name(l, "probe"), t.probe[l].size(), v->steps, t.meta.next_n, blocks,
                              t.entries[l], t.probe_entries());
    }
    v->probe.push_back(t.probe[l]);
  }
  return ok_status();
}

}  // namespace

Status score_views(const ScoreTrace& t, ScoreViews* v) {
  const std::string where = "score trace";
  const TraceMeta& m = t.meta;
  if (m.kind != TraceKind::kScores) return invalid_argument("score trace: meta.kind must be scores");
  SPIN_RETURN_IF_ERROR(check_meta(m, where));
  if (t.ctx_len.empty()) return invalid_argument("score trace: ctx_len is empty, expected >= 1 step");
  v->steps = t.steps();
  v->ctx_len = t.ctx_len;
  if ((m.next_n > 1 || !t.accepted.empty()) && t.accepted.size() != t.ctx_len.size()) {
    return invalid_argument("score trace: accepted has {} values, expected one per step ({}){}", t.accepted.size(),
                            t.ctx_len.size(), m.next_n > 1 ? " since next_n > 1" : "");
  }
  v->accepted = t.accepted;
  if (t.scores.size() != static_cast<size_t>(m.num_layers) || t.entries.size() != t.scores.size()) {
    return invalid_argument("score trace: {} score layers and {} entry counts but meta.num_layers = {}",
                            t.scores.size(), t.entries.size(), m.num_layers);
  }
  for (int l = 0; l < m.num_layers; ++l) {
    int64_t n = 0;
    if (!checked_mul({v->steps, m.next_n, t.entries[l]}, &n) || static_cast<int64_t>(t.scores[l].size()) != n) {
      return invalid_argument("score trace: {} has {} values, expected steps {} x next_n {} x entries {}",
                              layer_name(l, "scores"), t.scores[l].size(), v->steps, m.next_n, t.entries[l]);
    }
    v->entries.push_back(t.entries[l]);
    v->scores.push_back(t.scores[l]);
  }
  SPIN_RETURN_IF_ERROR(probe_views(t, v));
  return check_score_values(m, *v, where);
}

}  // namespace trace_schema

using namespace trace_schema;

const char* trace_kind_name(TraceKind kind) { return kind == TraceKind::kScores ? "scores" : "keys"; }

Status validate_score_trace(const ScoreTrace& trace) {
  ScoreViews v;
  return score_views(trace, &v);
}

Status validate_trace(const Trace& trace) {
  TraceViews v;
  return trace_views(trace, &v);
}

}  // namespace spin
