// Reading trace files: the safetensors container (trace/safetensors.h) checked against the schema
// (trace/trace_schema.h) before anything is exposed, then typed views over the mapped bytes.
#include <algorithm>
#include <charconv>
#include <cstring>

#include "core/errors.h"
#include "trace/safetensors.h"
#include "trace/trace_schema.h"
#include "spin/numerics.h"
#include "spin/trace.h"

namespace spin {

using namespace trace_schema;

namespace {

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
