// Trace files, schema version 1 (see spin/trace.h for the schema and the decisions).
//
// One validator serves both directions: the reader turns the file's tensors into typed views after
// checking dtype and shape, validate_trace turns a Trace's vectors into the same views after
// checking sizes, and check_values then applies the value rules to either.
#include "spin/trace.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <limits>
#include <cstring>

#include "core/errors.h"
#include "eval/safetensors.h"
#include "spin/numerics.h"

namespace spin {

static_assert(kTraceHeadDim == kIndexerHeadDim, "trace rows are indexer head vectors");

namespace {

constexpr int64_t kD = kTraceHeadDim;

// ---------------------------------------------------------------------------------------------
// Views shared by the reader and the in-memory validator

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

// ---------------------------------------------------------------------------------------------
// Score traces: the same ctx_len / accepted rules, then each row's visible prefix.

struct ScoreViews {
  int64_t steps = 0;
  std::span<const int64_t> ctx_len;
  std::span<const int32_t> accepted;
  std::vector<int64_t> entries;                // [layers]
  std::vector<std::span<const float>> scores;  // [layers][steps, next_n, entries]
  int32_t probe_block_entries = 0;             // 0: no probe
  std::vector<std::span<const float>> probe;   // [layers][steps, next_n, probe blocks], or empty
};

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

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

// IEEE half → float (exact: every F16 value is an F32 value).
float f16_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu, man = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (man << 13);  // inf / NaN
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (man << 13);
  } else if (man == 0) {
    bits = sign;
  } else {  // subnormal: man · 2^-24
    const float v = static_cast<float>(man) * 5.9604644775390625e-8f;
    std::memcpy(&bits, &v, 4);
    bits |= sign;
  }
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
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

// ---------------------------------------------------------------------------------------------
// Reading from a file

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

}  // namespace

struct TraceReader::Impl {
  explicit Impl(st::SafetensorsFile f) : file(std::move(f)) {}
  st::SafetensorsFile file;
  TraceMeta meta;
  TraceViews v;
  ScoreViews sv;  // kind=scores
  std::vector<std::unique_ptr<uint8_t[]>> owned;  // aligned copies of unaligned tensors
  std::vector<std::vector<float>> widened;        // F16 / BF16 scores as F32

  // Fetches `name` and checks its dtype and shape. `-1` in `want` accepts any size (reported in
  // `got_dims`). U8 tensors also accept F8_E4M3 (what safetensors.torch writes for
  // torch.float8_e4m3fn): the bytes are the same.
  Result<st::TensorView> get(const std::string& name, st::Dtype dtype,
                             std::vector<int64_t> want) {
    const std::string& where = file.label();
    if (!file.contains(name)) return data_loss("{}: missing tensor {}", where, name);
    Result<st::TensorView> r = file.tensor(name);
    if (!r.ok()) return r.status();
    const st::TensorView& t = r.value();
    const bool dtype_ok = t.dtype == dtype ||
                          (dtype == st::Dtype::kU8 && t.dtype == st::Dtype::kF8E4M3);
    if (!dtype_ok) {
      return data_loss("{}: tensor {} has dtype {}, expected {}{}", where, name,
                       st::dtype_name(t.dtype), st::dtype_name(dtype),
                       dtype == st::Dtype::kU8 ? " (or F8_E4M3)" : "");
    }
    bool shape_ok = t.shape.size() == want.size();
    for (size_t i = 0; shape_ok && i < want.size(); ++i)
      shape_ok = want[i] < 0 || want[i] == t.shape[i];
    if (!shape_ok) {
      std::string w = "[";
      for (size_t i = 0; i < want.size(); ++i)
        w += (i ? ", " : "") + (want[i] < 0 ? std::string("any") : std::to_string(want[i]));
      return data_loss("{}: tensor {} has shape {}, expected {}", where, name, shape_str(t.shape),
                       w + "]");
    }
    return r;
  }

  template <typename T>
  std::span<const T> typed(const st::TensorView& t) {
    const uint8_t* p = t.data;
    if (!t.aligned()) {  // hand-written files may misalign; copy those (rare, small)
      owned.emplace_back(new uint8_t[t.nbytes]);
      std::memcpy(owned.back().get(), t.data, t.nbytes);
      p = owned.back().get();
    }
    return {reinterpret_cast<const T*>(p), t.nbytes / sizeof(T)};
  }

  // Stray layer tensors: a layer beyond num_layers or an unknown per-layer name.
  Status check_layer_names(std::initializer_list<std::string_view> known, const char* kind_words) {
    const std::string& where = file.label();
    const TraceMeta& m = meta;
    for (const std::string& name : file.names()) {
      if (name.rfind("layer.", 0) != 0) continue;
      const char* b = name.data() + 6;
      const char* e = name.data() + name.size();
      int64_t l = -1;
      const auto [p, ec] = std::from_chars(b, e, l);
      if (ec != std::errc() || p == e || *p != '.' || p == b ||
          std::string_view(b, static_cast<size_t>(p - b)) != std::to_string(l)) {
        return data_loss("{}: tensor {} does not follow layer.{{l}}.{{name}}", where, name);
      }
      if (l < 0 || l >= m.num_layers) {
        return data_loss("{}: tensor {} is beyond metadata num_layers = {} (layers 0..{}): "
                         "layer count mismatch",
                         where, name, m.num_layers, m.num_layers - 1);
      }
      const std::string_view suffix(p + 1, static_cast<size_t>(e - p - 1));
      if (std::find(known.begin(), known.end(), suffix) == known.end()) {
        return data_loss("{}: unknown tensor {} ({})", where, name, kind_words);
      }
    }
    return ok_status();
  }

  // A score trace: ctx_len, accepted, then layer.{l}.scores [steps, next_n, entries] per layer.
  Status load_scores() {
    const std::string& where = file.label();
    const TraceMeta& m = meta;
    auto ctx = get("ctx_len", st::Dtype::kI64, {-1});
    if (!ctx.ok()) return ctx.status();
    sv.steps = ctx->shape[0];
    if (sv.steps < 1) return data_loss("{}: ctx_len is empty, expected >= 1 step", where);
    sv.ctx_len = typed<int64_t>(ctx.value());
    if (m.next_n > 1 || file.contains("accepted")) {
      if (!file.contains("accepted")) {
        return data_loss("{}: missing tensor accepted (I32 [steps], required since next_n = {} > 1)", where, m.next_n);
      }
      auto acc = get("accepted", st::Dtype::kI32, {sv.steps});
      if (!acc.ok()) return acc.status();
      sv.accepted = typed<int32_t>(acc.value());
    }
    for (int l = 0; l < m.num_layers; ++l) {
      auto t = float_tensor(layer_name(l, "scores"), -1, "entries");
      if (!t.ok()) return t.status();
      sv.entries.push_back(t->shape[2]);
      sv.scores.push_back(widen(t.value()));
    }
    SPIN_RETURN_IF_ERROR(load_probe());
    SPIN_RETURN_IF_ERROR(
        check_layer_names({"scores", "probe"}, "the per-layer tensors of a score trace are scores and probe"));
    return check_score_values(m, sv, where);
  }

  // A score-like tensor: F32, F16 or BF16 of shape [steps, next_n, cols] (cols < 0: any).
  Result<st::TensorView> float_tensor(const std::string& name, int64_t cols, const char* cols_name) {
    const std::string& where = file.label();
    if (!file.contains(name)) return data_loss("{}: missing tensor {}", where, name);
    auto r = file.tensor(name);
    if (!r.ok()) return r.status();
    const st::TensorView& t = r.value();
    if (t.dtype != st::Dtype::kF32 && t.dtype != st::Dtype::kF16 && t.dtype != st::Dtype::kBF16) {
      return data_loss("{}: tensor {} has dtype {}, expected F32 (or F16, BF16)", where, name, st::dtype_name(t.dtype));
    }
    if (t.shape.size() != 3 || t.shape[0] != sv.steps || t.shape[1] != meta.next_n || (cols >= 0 && t.shape[2] != cols)) {
      return data_loss("{}: tensor {} has shape {}, expected [{}, {}, {}] (steps, next_n, {})", where, name,
                       shape_str(t.shape), sv.steps, meta.next_n, cols >= 0 ? std::to_string(cols) : "any", cols_name);
    }
    return r;
  }

  // F32 in place; F16 / BF16 widened once (exact), read byte-wise so alignment never matters.
  std::span<const float> widen(const st::TensorView& t) {
    if (t.dtype == st::Dtype::kF32) return typed<float>(t);
    std::vector<float>& f = widened.emplace_back(static_cast<size_t>(t.numel()));
    for (size_t i = 0; i < f.size(); ++i) {
      const uint16_t h = static_cast<uint16_t>(t.data[2 * i] | (t.data[2 * i + 1] << 8));
      f[i] = t.dtype == st::Dtype::kF16 ? f16_to_float(h) : bf16_to_float(h);
    }
    return f;
  }

  // The optional block probe: metadata probe_block_entries (taken out of meta.extra) and
  // layer.{l}.probe [steps, next_n, ceil(entries / probe_block_entries)] for every layer or none.
  Status load_probe() {
    const std::string& where = file.label();
    int present_at = -1;  // the first layer with a probe
    for (int l = 0; l < meta.num_layers && present_at < 0; ++l) present_at = file.contains(layer_name(l, "probe")) ? l : -1;
    const bool present = present_at >= 0;
    const auto md = meta.extra.find("probe_block_entries");
    if (md != meta.extra.end() && !present) {
      return data_loss("{}: metadata probe_block_entries is set but there is no tensor {}", where,
                       layer_name(0, "probe"));
    }
    if (!present) return ok_status();
    int32_t pbe = meta.page_size;
    if (md != meta.extra.end()) {
      SPIN_RETURN_IF_ERROR(parse_int_meta(meta.extra, "probe_block_entries", where, &pbe));
      if (Status s = check_probe_block_entries(pbe, where); !s.ok()) return data_loss("{}", s.message());
      meta.extra.erase(md);
    }
    sv.probe_block_entries = pbe;
    for (int l = 0; l < meta.num_layers; ++l) {
      const std::string name = layer_name(l, "probe");
      if (!file.contains(name)) {
        return data_loss("{}: a probe must be given for every layer or none: {} is present but {} is missing", where,
                         layer_name(present_at, "probe"), name);
      }
      auto t = float_tensor(name, ceil_div(sv.entries[l], pbe), "ceil(entries / probe_block_entries) blocks");
      if (!t.ok()) return t.status();
      sv.probe.push_back(widen(t.value()));
    }
    return ok_status();
  }

  // Checks the file against the schema (metadata, every tensor's dtype and shape, the values)
  // before anything is exposed; ~80 lines, one check after another in the order of the schema.
  Status load() {
    const std::string& where = file.label();
    SPIN_RETURN_IF_ERROR(parse_meta(file.metadata(), where, &meta));
    // The limits, before any size is used; in a file, a broken rule is a corrupt file.
    if (Status s = check_meta(meta, where); !s.ok()) return data_loss("{}", s.message());
    if (meta.kind == TraceKind::kScores) return load_scores();
    const TraceMeta& m = meta;
    // ctx_len fixes the number of steps.
    auto ctx = get("ctx_len", st::Dtype::kI64, {-1});
    if (!ctx.ok()) return ctx.status();
    v.steps = ctx->shape[0];
    if (v.steps < 1) return data_loss("{}: ctx_len is empty, expected >= 1 step", where);
    v.ctx_len = typed<int64_t>(ctx.value());
    const int64_t steps = v.steps;
    if (m.next_n > 1 || file.contains("accepted")) {
      auto acc = get("accepted", st::Dtype::kI32, {steps});
      if (!acc.ok()) return acc.status();
      v.accepted = typed<int32_t>(acc.value());
    }
    v.has_draft = file.contains(layer_name(0, "k_draft"));
    if (v.has_draft && m.next_n == 1) {
      return data_loss("{}: tensor {} is present but next_n = 1 (no draft tokens)", where,
                       layer_name(0, "k_draft"));
    }
    for (int l = 0; l < m.num_layers; ++l) {
      LayerViews lv;
      auto k = get(layer_name(l, "k"), st::Dtype::kU8, {-1, kD});
      if (!k.ok()) return k.status();
      lv.entries = k->shape[0];
      lv.k = typed<uint8_t>(k.value());
      auto ks = get(layer_name(l, "k_scale"), st::Dtype::kF32, {lv.entries});
      if (!ks.ok()) return ks.status();
      lv.k_scale = typed<float>(ks.value());
      auto q = get(layer_name(l, "q"), st::Dtype::kU8, {steps, m.next_n, m.num_heads, kD});
      if (!q.ok()) return q.status();
      lv.q = typed<uint8_t>(q.value());
      auto w = get(layer_name(l, "w"), st::Dtype::kF32, {steps, m.next_n, m.num_heads});
      if (!w.ok()) return w.status();
      lv.w = typed<float>(w.value());
      const bool draft = file.contains(layer_name(l, "k_draft"));
      if (draft != v.has_draft) {
        return data_loss("{}: draft keys must be given for every layer or none: {} is {} but {} "
                         "is {}",
                         where, layer_name(0, "k_draft"), v.has_draft ? "present" : "missing",
                         layer_name(l, "k_draft"), draft ? "present" : "missing");
      }
      if (draft) {
        auto kd = get(layer_name(l, "k_draft"), st::Dtype::kU8, {steps, m.next_n - 1, kD});
        if (!kd.ok()) return kd.status();
        lv.k_draft = typed<uint8_t>(kd.value());
        auto kds = get(layer_name(l, "k_draft_scale"), st::Dtype::kF32, {steps, m.next_n - 1});
        if (!kds.ok()) return kds.status();
        lv.k_draft_scale = typed<float>(kds.value());
      } else if (file.contains(layer_name(l, "k_draft_scale"))) {
        return data_loss("{}: tensor {} is present without {}", where,
                         layer_name(l, "k_draft_scale"), layer_name(l, "k_draft"));
      }
      v.layers.push_back(lv);
    }
    SPIN_RETURN_IF_ERROR(check_layer_names({"k", "k_scale", "q", "w", "k_draft", "k_draft_scale"},
                                           "per-layer tensors are k, k_scale, q, w, k_draft, k_draft_scale"));
    return check_values(m, v, where);
  }
};

// ---------------------------------------------------------------------------------------------
// Public API

const char* trace_kind_name(TraceKind kind) { return kind == TraceKind::kScores ? "scores" : "keys"; }

Status validate_score_trace(const ScoreTrace& trace) {
  ScoreViews v;
  return score_views(trace, &v);
}

Status write_score_trace(const ScoreTrace& t, const std::string& path) {
  ScoreViews v;
  SPIN_RETURN_IF_ERROR(score_views(t, &v));
  const TraceMeta& m = t.meta;
  const int64_t steps = t.steps();
  std::vector<st::TensorSpec> specs;
  specs.push_back({"ctx_len", st::Dtype::kI64, {steps}, t.ctx_len.data(), t.ctx_len.size() * 8});
  if (!t.accepted.empty()) {
    specs.push_back({"accepted", st::Dtype::kI32, {steps}, t.accepted.data(), t.accepted.size() * 4});
  }
  for (int l = 0; l < m.num_layers; ++l) {
    specs.push_back({layer_name(l, "scores"), st::Dtype::kF32, {steps, m.next_n, t.entries[l]}, t.scores[l].data(),
                     t.scores[l].size() * 4});
    if (t.has_probe()) {
      specs.push_back({layer_name(l, "probe"), st::Dtype::kF32, {steps, m.next_n, t.probe_blocks(l)},
                       t.probe[l].data(), t.probe[l].size() * 4});
    }
  }
  std::map<std::string, std::string> md = meta_to_strings(m);
  if (t.has_probe()) md["probe_block_entries"] = std::to_string(t.probe_entries());  // explicit, never defaulted
  return st::write_safetensors(path, specs, md);
}

Status validate_trace(const Trace& trace) {
  TraceViews v;
  return trace_views(trace, &v);
}

Status write_trace(const Trace& t, const std::string& path) {
  TraceViews v;
  SPIN_RETURN_IF_ERROR(trace_views(t, &v));
  const TraceMeta& m = t.meta;
  const int64_t steps = t.steps();
  std::vector<st::TensorSpec> specs;
  auto add = [&](std::string name, st::Dtype dtype, std::vector<int64_t> shape, const void* data,
                 size_t nbytes) {
    specs.push_back({std::move(name), dtype, std::move(shape), data, nbytes});
  };
  add("ctx_len", st::Dtype::kI64, {steps}, t.ctx_len.data(), t.ctx_len.size() * 8);
  if (!t.accepted.empty()) {
    add("accepted", st::Dtype::kI32, {steps}, t.accepted.data(), t.accepted.size() * 4);
  }
  for (int l = 0; l < m.num_layers; ++l) {
    const TraceLayer& L = t.layers[l];
    const int64_t entries = static_cast<int64_t>(L.k_scale.size());
    add(layer_name(l, "k"), st::Dtype::kU8, {entries, kD}, L.k.data(), L.k.size());
    add(layer_name(l, "k_scale"), st::Dtype::kF32, {entries}, L.k_scale.data(),
        L.k_scale.size() * 4);
    add(layer_name(l, "q"), st::Dtype::kU8, {steps, m.next_n, m.num_heads, kD}, L.q.data(),
        L.q.size());
    add(layer_name(l, "w"), st::Dtype::kF32, {steps, m.next_n, m.num_heads}, L.w.data(),
        L.w.size() * 4);
    if (v.has_draft) {
      add(layer_name(l, "k_draft"), st::Dtype::kU8, {steps, m.next_n - 1, kD}, L.k_draft.data(),
          L.k_draft.size());
      add(layer_name(l, "k_draft_scale"), st::Dtype::kF32, {steps, m.next_n - 1},
          L.k_draft_scale.data(), L.k_draft_scale.size() * 4);
    }
  }
  return st::write_safetensors(path, specs, meta_to_strings(m));
}

TraceReader::TraceReader(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
TraceReader::TraceReader(TraceReader&&) noexcept = default;
TraceReader& TraceReader::operator=(TraceReader&&) noexcept = default;
TraceReader::~TraceReader() = default;

Result<TraceReader> TraceReader::open(const std::string& path, uint64_t copy_below_bytes) {
  auto file = st::SafetensorsFile::open(path, copy_below_bytes);
  if (!file.ok()) return file.status();
  auto impl = std::make_unique<Impl>(std::move(file).value());
  SPIN_RETURN_IF_ERROR(impl->load());
  return TraceReader(std::move(impl));
}

Result<TraceReader> TraceReader::from_memory(const void* data, size_t size) {
  auto file = st::SafetensorsFile::from_memory(data, size);
  if (!file.ok()) return file.status();
  auto impl = std::make_unique<Impl>(std::move(file).value());
  SPIN_RETURN_IF_ERROR(impl->load());
  return TraceReader(std::move(impl));
}

const TraceMeta& TraceReader::meta() const { return impl_->meta; }
int64_t TraceReader::steps() const { return kind() == TraceKind::kScores ? impl_->sv.steps : impl_->v.steps; }
uint64_t TraceReader::file_size() const { return impl_->file.file_size(); }
bool TraceReader::mapped() const { return impl_->file.mapped(); }
Status TraceReader::check_unchanged() const { return impl_->file.check_unchanged(); }
const std::string& TraceReader::path() const { return impl_->file.label(); }
std::span<const int64_t> TraceReader::ctx_len() const {
  return kind() == TraceKind::kScores ? impl_->sv.ctx_len : impl_->v.ctx_len;
}
std::span<const int32_t> TraceReader::accepted() const {
  return kind() == TraceKind::kScores ? impl_->sv.accepted : impl_->v.accepted;
}
bool TraceReader::has_draft_keys() const { return impl_->v.has_draft; }

int64_t TraceReader::entries(int layer) const {
  if (layer < 0 || layer >= num_layers()) return 0;
  return kind() == TraceKind::kScores ? impl_->sv.entries[layer] : impl_->v.layers[layer].entries;
}

std::span<const float> TraceReader::scores(int layer) const {
  if (kind() != TraceKind::kScores || layer < 0 || layer >= num_layers()) return {};
  return impl_->sv.scores[layer];
}

std::span<const float> TraceReader::scores(int layer, int64_t step, int row) const {
  if (kind() != TraceKind::kScores || layer < 0 || layer >= num_layers() || step < 0 || step >= steps() || row < 0 ||
      row >= meta().next_n)
    return {};
  const size_t n = static_cast<size_t>(impl_->sv.entries[layer]);
  return impl_->sv.scores[layer].subspan((static_cast<size_t>(step) * meta().next_n + row) * n, n);
}

bool TraceReader::has_probe() const { return kind() == TraceKind::kScores && !impl_->sv.probe.empty(); }
int32_t TraceReader::probe_block_entries() const { return has_probe() ? impl_->sv.probe_block_entries : 0; }
int64_t TraceReader::probe_blocks(int layer) const {
  if (!has_probe() || layer < 0 || layer >= num_layers()) return 0;
  return ceil_div(impl_->sv.entries[layer], impl_->sv.probe_block_entries);
}

std::span<const float> TraceReader::probe(int layer) const {
  if (!has_probe() || layer < 0 || layer >= num_layers()) return {};
  return impl_->sv.probe[layer];
}

std::span<const float> TraceReader::probe(int layer, int64_t step, int row) const {
  if (!has_probe() || layer < 0 || layer >= num_layers() || step < 0 || step >= steps() || row < 0 ||
      row >= meta().next_n)
    return {};
  const size_t n = static_cast<size_t>(probe_blocks(layer));
  return impl_->sv.probe[layer].subspan((static_cast<size_t>(step) * meta().next_n + row) * n, n);
}

int64_t TraceReader::visible_entries(int64_t step, int row) const {
  const TraceMeta& m = meta();
  if (step < 0 || step >= steps() || row < 0 || row >= m.next_n) return 0;
  return spin::visible_entries(ctx_len()[step], m.next_n, row, m.compress_ratio);
}

std::span<const uint8_t> TraceReader::k(int layer) const {
  if (kind() != TraceKind::kKeys || layer < 0 || layer >= num_layers()) return {};
  return impl_->v.layers[layer].k;
}
std::span<const float> TraceReader::k_scale(int layer) const {
  if (kind() != TraceKind::kKeys || layer < 0 || layer >= num_layers()) return {};
  return impl_->v.layers[layer].k_scale;
}
std::span<const uint8_t> TraceReader::q(int layer) const {
  if (kind() != TraceKind::kKeys || layer < 0 || layer >= num_layers()) return {};
  return impl_->v.layers[layer].q;
}
std::span<const float> TraceReader::w(int layer) const {
  if (kind() != TraceKind::kKeys || layer < 0 || layer >= num_layers()) return {};
  return impl_->v.layers[layer].w;
}
std::span<const uint8_t> TraceReader::q(int layer, int64_t step) const {
  if (kind() != TraceKind::kKeys || layer < 0 || layer >= num_layers() || step < 0 || step >= steps()) return {};
  const size_t n = static_cast<size_t>(meta().next_n) * meta().num_heads * kD;
  return impl_->v.layers[layer].q.subspan(static_cast<size_t>(step) * n, n);
}
std::span<const uint8_t> TraceReader::q(int layer, int64_t step, int row) const {
  if (row < 0 || row >= meta().next_n) return {};
  const size_t n = static_cast<size_t>(meta().num_heads) * kD;
  const auto s = q(layer, step);
  return s.empty() ? s : s.subspan(static_cast<size_t>(row) * n, n);
}
std::span<const float> TraceReader::w(int layer, int64_t step) const {
  if (kind() != TraceKind::kKeys || layer < 0 || layer >= num_layers() || step < 0 || step >= steps()) return {};
  const size_t n = static_cast<size_t>(meta().next_n) * meta().num_heads;
  return impl_->v.layers[layer].w.subspan(static_cast<size_t>(step) * n, n);
}
std::span<const float> TraceReader::w(int layer, int64_t step, int row) const {
  if (row < 0 || row >= meta().next_n) return {};
  const size_t n = static_cast<size_t>(meta().num_heads);
  const auto s = w(layer, step);
  return s.empty() ? s : s.subspan(static_cast<size_t>(row) * n, n);
}
std::span<const uint8_t> TraceReader::k_draft(int layer, int64_t step) const {
  if (!has_draft_keys() || layer < 0 || layer >= num_layers() || step < 0 || step >= steps())
    return {};
  const size_t n = static_cast<size_t>(meta().next_n - 1) * kD;
  return impl_->v.layers[layer].k_draft.subspan(static_cast<size_t>(step) * n, n);
}
std::span<const float> TraceReader::k_draft_scale(int layer, int64_t step) const {
  if (!has_draft_keys() || layer < 0 || layer >= num_layers() || step < 0 || step >= steps())
    return {};
  const size_t n = static_cast<size_t>(meta().next_n - 1);
  return impl_->v.layers[layer].k_draft_scale.subspan(static_cast<size_t>(step) * n, n);
}

ScoreTrace TraceReader::to_score_trace() const {
  ScoreTrace t;
  if (kind() != TraceKind::kScores) return t;
  t.meta = meta();
  const ScoreViews& v = impl_->sv;
  t.ctx_len.assign(v.ctx_len.begin(), v.ctx_len.end());
  t.accepted.assign(v.accepted.begin(), v.accepted.end());
  t.entries = v.entries;
  for (const auto& s : v.scores) t.scores.emplace_back(s.begin(), s.end());
  for (const auto& p : v.probe) t.probe.emplace_back(p.begin(), p.end());
  t.probe_block_entries = v.probe.empty() ? 0 : v.probe_block_entries;
  return t;
}

Trace TraceReader::to_trace() const {
  Trace t;
  if (kind() != TraceKind::kKeys) return t;
  t.meta = meta();
  const TraceViews& v = impl_->v;
  t.ctx_len.assign(v.ctx_len.begin(), v.ctx_len.end());
  t.accepted.assign(v.accepted.begin(), v.accepted.end());
  for (const LayerViews& lv : v.layers) {
    TraceLayer L;
    L.k.assign(lv.k.begin(), lv.k.end());
    L.k_scale.assign(lv.k_scale.begin(), lv.k_scale.end());
    L.q.assign(lv.q.begin(), lv.q.end());
    L.w.assign(lv.w.begin(), lv.w.end());
    L.k_draft.assign(lv.k_draft.begin(), lv.k_draft.end());
    L.k_draft_scale.assign(lv.k_draft_scale.begin(), lv.k_draft_scale.end());
    t.layers.push_back(std::move(L));
  }
  return t;
}

Result<Trace> read_trace(const std::string& path) {
  auto r = TraceReader::open(path);
  if (!r.ok()) return r.status();
  if (r->kind() != TraceKind::kKeys) {
    return failed_precondition("{}: a score trace (kind=scores), not a key trace: it has no keys or queries", path);
  }
  return r->to_trace();
}

Result<ScoreTrace> read_score_trace(const std::string& path) {
  auto r = TraceReader::open(path);
  if (!r.ok()) return r.status();
  if (r->kind() != TraceKind::kScores) {
    return failed_precondition("{}: a key trace (kind=keys), not a score trace (convert it: spin trace convert --to scores)",
                               path);
  }
  return r->to_score_trace();
}

std::string describe(const TraceReader& r) {
  const TraceMeta& m = r.meta();
  std::string s;
  auto line = [&s](const char* key, const std::string& value) {
    s += fmt::format("  {:<15} {}\n", key, value);
  };
  const double mib = static_cast<double>(r.file_size()) / (1024.0 * 1024.0);
  s += fmt::format("spin trace v{}: {} ({} bytes, {:.1f} MiB on disk)\n", kTraceVersion, r.path(),
                   r.file_size(), mib);
  line("kind", m.kind == TraceKind::kScores ? "scores (the indexer's output; no keys or queries)"
                                             : "keys (the indexer's inputs: keys, queries, weights)");
  line("model", m.model.empty() ? "(unnamed)" : m.model);
  line("indexer layers", std::to_string(m.num_layers));
  line("steps", std::to_string(r.steps()));
  std::string rows = std::to_string(m.next_n);
  if (m.next_n > 1) {
    double acc = 0;
    for (int32_t a : r.accepted()) acc += a;
    rows += fmt::format(" (MTP: {} draft tokens, mean accepted {:.2f}", m.next_n - 1,
                        acc / static_cast<double>(r.steps()));
    rows += m.kind == TraceKind::kScores ? std::string(")")
                                         : fmt::format(", draft keys {})", r.has_draft_keys() ? "recorded" : "not recorded");
  }
  line("rows per step", rows);
  if (m.kind == TraceKind::kKeys) line("heads", fmt::format("{} x {}", m.num_heads, kTraceHeadDim));
  int64_t emin = r.entries(0), emax = r.entries(0);
  for (int l = 1; l < m.num_layers; ++l) {
    emin = std::min(emin, r.entries(l));
    emax = std::max(emax, r.entries(l));
  }
  line("entries", emin == emax ? fmt::format("{} per layer", emin)
                               : fmt::format("{}..{} per layer", emin, emax));
  const auto ctx = r.ctx_len();
  line("ctx_len", fmt::format("{}..{} tokens", ctx.front(), ctx.back()));
  line("page_size", fmt::format("{} entries ({} pages at the last step)", m.page_size,
                                (ctx.back() / m.compress_ratio + m.page_size - 1) / m.page_size));
  line("topk", std::to_string(m.topk));
  line("compress_ratio", fmt::format("{} token(s) per entry", m.compress_ratio));
  if (m.kind == TraceKind::kScores) {
    line("block probe", r.has_probe() ? fmt::format("recorded, {} entries per pooled key ({} blocks per layer "
                                                    "at most; query-guided predictors such as hisa replay it)",
                                                    r.probe_block_entries(), r.probe_blocks(0))
                                      : std::string("not recorded (hisa cannot replay this trace)"));
  }
  for (const auto& [k, v] : m.extra) line(k.c_str(), v);
  return s;
}

}  // namespace spin
