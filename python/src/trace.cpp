// spin_dsa trace I/O (spin/trace.h), the workload generator (spin/lab/workload.h) and replay
// (spin/lab/replay.h). Trace tensors come back as zero-copy numpy views: into the file mapping
// (TraceReader) or into the owning Trace's vectors; each view keeps its owner alive.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <optional>
#include <string>

#include "common.h"
#include "spin/lab/replay.h"
#include "spin/trace.h"
#include "spin/lab/workload.h"

namespace spin_py {

namespace {

// For the stub (common.h): what score_trace and generate_workload take.
SPIN_PY_NAMED_OBJECT(TraceArg, "str | Trace | TraceReader");
SPIN_PY_NAMED_OBJECT(StrArg, "str");

template <typename T>
nb::ndarray<nb::numpy, const T> view(const T* data, std::initializer_list<size_t> shape, nb::handle owner) {
  return nb::ndarray<nb::numpy, const T>(data, shape, owner);
}

nb::dict meta_dict(const spin::TraceMeta& m) {
  nb::dict d;
  d["model"] = py_str(m.model);  // header text: a corrupt file's bytes are replaced, not raised
  d["num_layers"] = m.num_layers;
  d["next_n"] = m.next_n;
  d["num_heads"] = m.num_heads;
  d["page_size"] = m.page_size;
  d["topk"] = m.topk;
  d["compress_ratio"] = m.compress_ratio;
  nb::dict extra;
  for (const auto& [k, v] : m.extra) extra[py_str(k)] = py_str(v);
  d["extra"] = extra;
  return d;
}

// An owning trace (generated, converted or built from arrays), shared with ScoredTrace.
struct PyTrace {
  std::shared_ptr<spin::Trace> t;
};

struct PyScored {
  std::shared_ptr<spin::Trace> trace;  // a key trace's keys and queries; null for a score trace
  std::shared_ptr<const spin::ScoredTrace> scored;
  spin::TraceMeta meta;
  int64_t steps = 0;
  std::string path;  // "" when not read from a file
};

void check_layer(int64_t layer, int32_t n) {
  if (layer < 0 || layer >= n)
    check(spin::Status(spin::StatusCode::kOutOfRange,
                       "layer " + std::to_string(layer) + " is outside [0, " + std::to_string(n) + ")"));
}

template <typename T>
std::vector<T> copy_array(const InArray& a, const char* name, int ndim) {
  const T* d = array_data<const T>(a, name, ndim);
  check_fits(static_cast<double>(a.nbytes()), std::string(name) + " (copied into the trace)");
  return std::vector<T>(d, d + a.size());
}
template <typename T>
std::vector<T> copy_index(const IndexArray<T>& a) {
  return std::vector<T>(a.data, a.data + a.size());
}

// The live reader behind `self`: a mapped file that shrank since open is DataLoss here, before a
// view into its lost tail could be handed out (a read there would be SIGBUS).
const spin::TraceReader& live(nb::handle self) {
  const auto& r = nb::cast<const spin::TraceReader&>(self);
  check(r.check_unchanged());
  return r;
}
// k, k_scale, q and w exist only in a key trace: a score trace has none (empty spans).
const spin::TraceReader& keys_of(nb::handle self, int64_t layer, const char* what) {
  const auto& r = live(self);
  check_layer(layer, r.num_layers());
  if (r.kind() != spin::TraceKind::kKeys)
    check(spin::Status(spin::StatusCode::kFailedPrecondition,
                       std::string(what) + ": " + r.path() + " is a score trace (kind=scores): it holds no keys or queries"));
  return r;
}
spin::TraceReader open_reader(const std::string& path, int64_t copy_below_bytes) {
  if (copy_below_bytes < 0) raise_value("copy_below_bytes: " + std::to_string(copy_below_bytes) + " is negative");
  auto r = spin::TraceReader::open(path_arg(path, "path"), static_cast<uint64_t>(copy_below_bytes));
  if (!r.ok()) raise_status(r.status());
  return std::move(r).value();
}

// A layer entry of make_trace: the array under `key` of the dict, or InvalidType naming both.
InArray layer_array(nb::dict d, const char* key, size_t layer) {
  const std::string name = "layers[" + std::to_string(layer) + "]['" + key + "']";
  if (!d.contains(key)) raise_value(name + ": missing");
  return in_array(d[key], name.c_str());
}

// TraceMeta from a Python dict: the known fields by name, anything else kept in `extra`.
int32_t meta_int(nb::handle v, const std::string& key) {
  int overflow = 0;
  const long long x = PyLong_Check(v.ptr()) && !PyBool_Check(v.ptr()) ? PyLong_AsLongLongAndOverflow(v.ptr(), &overflow) : 0;
  if (!PyLong_Check(v.ptr()) || PyBool_Check(v.ptr()))
    raise_type("meta['" + key + "']: expected an int, got " + nb::cast<std::string>(nb::repr(v)));
  if (overflow != 0 || x < INT32_MIN || x > INT32_MAX)
    raise_value("meta['" + key + "']: " + nb::cast<std::string>(nb::repr(v)) + " does not fit int32");
  return static_cast<int32_t>(x);
}
// str(v) as UTF-8 (a lone surrogate cannot be written to a file's JSON header).
std::string meta_str(nb::handle v, const std::string& what) {
  nb::str text(v);
  Py_ssize_t n = 0;
  const char* utf8 = PyUnicode_AsUTF8AndSize(text.ptr(), &n);
  if (utf8 == nullptr) {
    PyErr_Clear();
    raise_type(what + ": not representable as UTF-8 text");
  }
  return std::string(utf8, static_cast<size_t>(n));
}

spin::TraceMeta parse_meta(nb::dict meta) {
  spin::TraceMeta m;
  for (auto [k, v] : meta) {
    if (!nb::isinstance<nb::str>(k)) raise_type("meta: keys must be str, got " + nb::cast<std::string>(nb::repr(k)));
    const std::string key = meta_str(k, "meta key");
    if (key == "model") m.model = meta_str(v, "meta['model']");
    else if (key == "num_layers") m.num_layers = meta_int(v, key);
    else if (key == "next_n") m.next_n = meta_int(v, key);
    else if (key == "num_heads") m.num_heads = meta_int(v, key);
    else if (key == "page_size") m.page_size = meta_int(v, key);
    else if (key == "topk") m.topk = meta_int(v, key);
    else if (key == "compress_ratio") m.compress_ratio = meta_int(v, key);
    else if (key == "extra") {
      if (!nb::isinstance<nb::dict>(v)) raise_type("meta['extra']: expected a dict");
      for (auto [ek, ev] : nb::borrow<nb::dict>(v)) m.extra[meta_str(ek, "meta['extra'] key")] = meta_str(ev, "meta['extra'] value");
    } else {
      m.extra[key] = meta_str(v, "meta['" + key + "']");
    }
  }
  return m;
}

PyTrace make_trace(nb::dict meta, IndexArg ctx_len, nb::typed<nb::list, nb::typed<nb::dict, nb::str, ArrayArg>> layers,
                   IndexArg accepted) {
  auto t = std::make_shared<spin::Trace>();
  spin::TraceMeta& m = t->meta;
  m = parse_meta(meta);
  if (!meta.contains("num_layers")) m.num_layers = static_cast<int32_t>(std::min<size_t>(nb::len(layers), INT32_MAX));
  t->ctx_len = copy_index(index_i64(ctx_len, {"ctx_len", {-1}, 0, INT64_MAX, nullptr, false}));
  const int64_t steps = static_cast<int64_t>(t->ctx_len.size());
  if (!accepted.is_none())
    t->accepted = copy_index(index_i32(accepted, {"accepted", {steps}, INT32_MIN, INT32_MAX, "ctx_len", false}));
  size_t i = 0;
  for (nb::handle l : layers) {
    if (!nb::isinstance<nb::dict>(l))
      raise_type("layers[" + std::to_string(i) + "]: expected a dict {k, k_scale, q, w[, k_draft, k_draft_scale]}");
    nb::dict d = nb::borrow<nb::dict>(l);
    spin::TraceLayer tl;
    const auto name = [i](const char* key) { return "layers[" + std::to_string(i) + "]['" + key + "']"; };
    tl.k = copy_array<uint8_t>(layer_array(d, "k", i), name("k").c_str(), 2);
    tl.k_scale = copy_array<float>(layer_array(d, "k_scale", i), name("k_scale").c_str(), 1);
    tl.q = copy_array<uint8_t>(layer_array(d, "q", i), name("q").c_str(), 4);
    tl.w = copy_array<float>(layer_array(d, "w", i), name("w").c_str(), 3);
    if (d.contains("k_draft")) {
      tl.k_draft = copy_array<uint8_t>(layer_array(d, "k_draft", i), name("k_draft").c_str(), 3);
      tl.k_draft_scale = copy_array<float>(layer_array(d, "k_draft_scale", i), name("k_draft_scale").c_str(), 2);
    }
    t->layers.push_back(std::move(tl));
    ++i;
  }
  check(spin::validate_trace(*t));
  return PyTrace{std::move(t)};
}

// A score trace (kind=scores) from arrays: scores one float32 [steps, next_n, entries] per layer.
// Validated and written atomically by the library (spin::write_score_trace).
void write_score_trace(nb::dict meta, IndexArg ctx_len, nb::typed<nb::list, F32ArrayArg> scores,
                       const std::string& path, IndexArg accepted) {
  spin::ScoreTrace t;
  t.meta = parse_meta(meta);
  t.meta.kind = spin::TraceKind::kScores;
  if (!meta.contains("num_layers")) t.meta.num_layers = static_cast<int32_t>(std::min<size_t>(nb::len(scores), INT32_MAX));
  const std::string out_path = path_arg(path, "path");
  t.ctx_len = copy_index(index_i64(ctx_len, {"ctx_len", {-1}, 0, INT64_MAX, nullptr, false}));
  const int64_t steps = static_cast<int64_t>(t.ctx_len.size());
  if (!accepted.is_none())
    t.accepted = copy_index(index_i32(accepted, {"accepted", {steps}, INT32_MIN, INT32_MAX, "ctx_len", false}));
  size_t i = 0;
  for (nb::handle l : scores) {
    const std::string name = "scores[" + std::to_string(i++) + "]";
    InArray a = in_array(l, name.c_str());
    array_data<const float>(a, name.c_str(), 3);  // shape checked before the copy
    if (a.shape(0) != t.ctx_len.size() || static_cast<int64_t>(a.shape(1)) != t.meta.next_n)
      raise_value(name + ": expected float32 [steps, next_n, entries] per layer with steps = len(ctx_len) = " +
                  std::to_string(t.ctx_len.size()) + " and next_n = " + std::to_string(t.meta.next_n) + ", got " +
                  shape_text(a));
    t.scores.push_back(copy_array<float>(a, name.c_str(), 3));
    t.entries.push_back(static_cast<int64_t>(a.shape(2)));
  }
  const spin::Status st = [&] {
    nb::gil_scoped_release release;
    return spin::write_score_trace(t, out_path);
  }();
  check(st);
}

// A key trace is scored by the real indexer; a score trace's scores are the all-keep truth (as
// `spin replay` reads either).
PyScored score(TraceArg trace, int64_t threads) {
  PyScored out;
  spin::ScoreOptions o;
  o.threads = threads_arg(threads);
  std::optional<spin::ScoreTrace> recorded;
  auto take = [&](const spin::TraceReader& r) {
    out.path = r.path();
    if (r.kind() == spin::TraceKind::kScores) {
      recorded = r.to_score_trace();
    } else {
      out.trace = std::make_shared<spin::Trace>(r.to_trace());
    }
  };
  if (nb::isinstance<nb::str>(trace)) {
    auto r = spin::TraceReader::open(path_arg(nb::cast<std::string>(trace), "trace"));
    if (!r.ok()) raise_status(r.status());
    take(r.value());
  } else if (nb::isinstance<PyTrace>(trace)) {
    out.trace = nb::cast<PyTrace&>(trace).t;
  } else if (nb::isinstance<spin::TraceReader>(trace)) {
    take(live(trace));
  } else {
    raise_type("trace: expected a path, a Trace or a TraceReader");
  }
  out.meta = recorded ? recorded->meta : out.trace->meta;
  out.steps = recorded ? recorded->steps() : out.trace->steps();
  spin::Result<std::shared_ptr<const spin::ScoredTrace>> r = [&] {
    nb::gil_scoped_release release;
    return recorded ? spin::score_trace(*recorded, o) : spin::score_trace(*out.trace, o);
  }();
  if (!r.ok()) raise_status(r.status());
  out.scored = std::move(r).value();
  return out;
}

nb::dict replay(const PyScored& s, const std::string& predictor, ConfigArg config, bool open_loop,
                bool warm_start, bool keep_topk) {
  spin::ReplayOptions o;
  o.predictor = predictor;
  o.config = config_from(config);
  o.config.page_size = s.meta.page_size;  // replay takes both from the trace
  o.config.topk = s.meta.topk;
  o.open_loop = open_loop;
  o.warm_start = warm_start;
  o.keep_topk = keep_topk;
  spin::Result<spin::ReplayResult> r = [&] {
    nb::gil_scoped_release release;
    return s.trace ? spin::replay(*s.trace, *s.scored, o) : spin::replay(*s.scored, o);
  }();
  if (!r.ok()) raise_status(r.status());
  const spin::TraceFacts facts = spin::trace_facts(*s.scored, r->config.block_entries());
  std::string json;
  try {
    json = spin::replay_json(s.path, r.value(), facts);
  } catch (const std::exception& e) {  // nlohmann refuses to dump invalid UTF-8 (a corrupt model name)
    check(spin::Status(spin::StatusCode::kDataLoss, std::string("replay: the report holds text that is not UTF-8 (") +
                                                        e.what() + ")"));
  }
  nb::dict out = nb::cast<nb::dict>(nb::module_::import_("json").attr("loads")(json));
  if (keep_topk) {
    nb::list layers;
    const int64_t rows = s.steps * s.meta.next_n;
    const size_t k = static_cast<size_t>(r->config.topk);
    for (const auto& layer : r->topk) {
      std::vector<int32_t> flat;
      flat.reserve(static_cast<size_t>(rows) * k);
      // Every row must be one the replay wrote: a short one would leave the array's tail unset.
      if (static_cast<int64_t>(layer.size()) != rows)
        check(spin::Status(spin::StatusCode::kFailedPrecondition, "replay kept " + std::to_string(layer.size()) +
                                                                     " top-k rows of " + std::to_string(rows)));
      for (const auto& row : layer) {
        if (row.size() != k)
          check(spin::Status(spin::StatusCode::kFailedPrecondition,
                             "replay kept a top-k row of " + std::to_string(row.size()) + " positions, not " + std::to_string(k)));
        flat.insert(flat.end(), row.begin(), row.end());
      }
      layers.append(owned_array(std::move(flat), {static_cast<size_t>(rows), k}));
    }
    out["topk"] = layers;
  }
  return out;
}

}  // namespace

void bind_trace(nb::module_& m) {
  nb::class_<spin::TraceReader>(m, "TraceReader",
                                "A validated trace file (include/spin/trace.h): read into memory up "
                                "to 256 MiB, memory-mapped above; tensors are zero-copy read-only views. "
                                "A mapped file truncated while open raises DataLoss at the next access.")
      .def_static(
          "open",
          [](const std::string& path, int64_t copy_below_bytes) {
            return open_reader(path, copy_below_bytes);
          },
          nb::arg("path"), nb::arg("copy_below_bytes") = int64_t(spin::kTraceCopyBelowBytes),
          "Opens and validates a trace file (read into memory up to copy_below_bytes, mapped above).")
      .def_prop_ro("meta", [](const spin::TraceReader& r) { return meta_dict(r.meta()); })
      .def_prop_ro("num_layers", &spin::TraceReader::num_layers)
      .def_prop_ro("steps", &spin::TraceReader::steps)
      .def_prop_ro("path", [](const spin::TraceReader& r) { return py_str(r.path()); })
      .def_prop_ro("file_size", &spin::TraceReader::file_size)
      .def_prop_ro("mapped", &spin::TraceReader::mapped,
                   "Whether the file is memory-mapped (above 256 MiB) rather than read into memory.")
      .def("entries", [](const spin::TraceReader& r, int64_t l) { check_layer(l, r.num_layers()); return r.entries(static_cast<int>(l)); }, nb::arg("layer"))
      .def("visible_entries", [](nb::handle self, int64_t step, int64_t row) {
        const auto& r = live(self);
        if (step < 0 || step >= r.steps())
          raise_range("step: " + std::to_string(step) + " is outside 0.." + std::to_string(r.steps() - 1));
        if (row < 0 || row >= r.meta().next_n)
          raise_range("row: " + std::to_string(row) + " is outside 0.." + std::to_string(r.meta().next_n - 1));
        return r.visible_entries(step, static_cast<int>(row));
      }, nb::arg("step"), nb::arg("row"))
      .def_prop_ro("ctx_len", [](nb::handle self) {
        auto& r = live(self);
        return view(r.ctx_len().data(), {r.ctx_len().size()}, self);
      })
      .def_prop_ro("accepted", [](nb::handle self) {
        auto& r = live(self);
        return view(r.accepted().data(), {r.accepted().size()}, self);
      })
      .def("k", [](nb::handle self, int64_t l) {
        auto& r = keys_of(self, l, "k");
        return view(r.k(static_cast<int>(l)).data(), {static_cast<size_t>(r.entries(static_cast<int>(l))), 128}, self);
      }, nb::arg("layer"), "e4m3 key codes, uint8 [entries, 128] (a view).")
      .def("k_scale", [](nb::handle self, int64_t l) {
        auto& r = keys_of(self, l, "k_scale");
        return view(r.k_scale(static_cast<int>(l)).data(), {static_cast<size_t>(r.entries(static_cast<int>(l)))}, self);
      }, nb::arg("layer"), "key scales, float32 [entries] (a view).")
      .def("q", [](nb::handle self, int64_t l) {
        auto& r = keys_of(self, l, "q");
        const auto& m = r.meta();
        return view(r.q(static_cast<int>(l)).data(), {static_cast<size_t>(r.steps()), static_cast<size_t>(m.next_n),
                                    static_cast<size_t>(m.num_heads), 128}, self);
      }, nb::arg("layer"), "e4m3 query codes, uint8 [steps, next_n, heads, 128] (a view).")
      .def("w", [](nb::handle self, int64_t l) {
        auto& r = keys_of(self, l, "w");
        const auto& m = r.meta();
        return view(r.w(static_cast<int>(l)).data(), {static_cast<size_t>(r.steps()), static_cast<size_t>(m.next_n),
                                    static_cast<size_t>(m.num_heads)}, self);
      }, nb::arg("layer"), "head weights, float32 [steps, next_n, heads] (a view).")
      .def_prop_ro("kind", [](const spin::TraceReader& r) { return std::string(spin::trace_kind_name(r.kind())); })
      .def("scores", [](nb::handle self, int64_t l) {
        auto& r = live(self);
        check_layer(l, r.num_layers());
        if (r.kind() != spin::TraceKind::kScores)
          check(spin::Status(spin::StatusCode::kFailedPrecondition, "scores: " + r.path() + " is a key trace (kind=keys)"));
        return view(r.scores(static_cast<int>(l)).data(), {static_cast<size_t>(r.steps()), static_cast<size_t>(r.meta().next_n),
                                         static_cast<size_t>(r.entries(static_cast<int>(l)))}, self);
      }, nb::arg("layer"), "A score trace's logits, float32 [steps, next_n, entries] (a view).")
      .def("to_trace", [](nb::handle self) {
        auto& r = live(self);
        if (r.kind() != spin::TraceKind::kKeys)
          check(spin::Status(spin::StatusCode::kFailedPrecondition, "to_trace: " + r.path() + " is a score trace (kind=scores)"));
        return PyTrace{std::make_shared<spin::Trace>(r.to_trace())};
      }, "Copies the whole trace into memory.")
      .def("describe", [](nb::handle self) { return py_str(spin::describe(live(self))); });

  nb::class_<PyTrace>(m, "Trace", "An in-memory trace (generated, or built with make_trace).")
      .def_prop_ro("meta", [](const PyTrace& t) { return meta_dict(t.t->meta); })
      .def_prop_ro("num_layers", [](const PyTrace& t) { return t.t->meta.num_layers; })
      .def_prop_ro("steps", [](const PyTrace& t) { return t.t->steps(); })
      .def("entries", [](const PyTrace& t, int64_t l) {
        check_layer(l, t.t->meta.num_layers);
        return static_cast<int64_t>(t.t->layers[l].k_scale.size());
      }, nb::arg("layer"))
      .def_prop_ro("ctx_len", [](nb::handle self) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        return view(t.ctx_len.data(), {t.ctx_len.size()}, self);
      })
      .def_prop_ro("accepted", [](nb::handle self) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        return view(t.accepted.data(), {t.accepted.size()}, self);
      })
      .def("k", [](nb::handle self, int64_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].k.data(), {t.layers[l].k_scale.size(), 128}, self);
      }, nb::arg("layer"))
      .def("k_scale", [](nb::handle self, int64_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].k_scale.data(), {t.layers[l].k_scale.size()}, self);
      }, nb::arg("layer"))
      .def("q", [](nb::handle self, int64_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].q.data(), {static_cast<size_t>(t.steps()), static_cast<size_t>(t.meta.next_n),
                                           static_cast<size_t>(t.meta.num_heads), 128}, self);
      }, nb::arg("layer"))
      .def("w", [](nb::handle self, int64_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].w.data(), {static_cast<size_t>(t.steps()), static_cast<size_t>(t.meta.next_n),
                                           static_cast<size_t>(t.meta.num_heads)}, self);
      }, nb::arg("layer"))
      .def("write", [](const PyTrace& t, const std::string& path) { check(spin::write_trace(*t.t, path_arg(path, "path"))); },
           nb::arg("path"), "Validates, then writes atomically (spin/trace.h schema).");

  m.def("open_trace", &open_reader, nb::arg("path"), nb::arg("copy_below_bytes") = int64_t(spin::kTraceCopyBelowBytes),
        "Opens and validates a trace file: a TraceReader, read into memory up to copy_below_bytes "
        "(256 MiB), memory-mapped above (a mapped file truncated while open raises DataLoss).");
  m.def("make_trace", &make_trace, nb::arg("meta"), nb::arg("ctx_len"), nb::arg("layers"),
        nb::arg("accepted") = nb::none(),
        "Builds a validated in-memory Trace: meta {model, num_layers, next_n, num_heads, page_size, "
        "topk, compress_ratio, extra}, ctx_len int64 [steps], layers [{k, k_scale, q, w[, k_draft, "
        "k_draft_scale]}], accepted int32 [steps] (MTP).");
  m.def("write_score_trace", &write_score_trace, nb::arg("meta"), nb::arg("ctx_len"), nb::arg("scores"),
        nb::arg("path"), nb::arg("accepted") = nb::none(),
        "Validates and writes a score trace (kind=scores) atomically: meta {model, next_n, page_size, "
        "topk, compress_ratio, extra}, ctx_len int64 [steps], scores [float32 [steps, next_n, "
        "entries] per layer], accepted int32 [steps] (next_n > 1).");
  m.def("write_trace", [](const PyTrace& t, const std::string& path) { check(spin::write_trace(*t.t, path_arg(path, "path"))); },
        nb::arg("trace"), nb::arg("path"));

  m.def("scenario_names", &spin::scenario_names, "The built-in workload scenarios.");
  m.def("workload_params", [](const std::string& scenario) {
    auto p = spin::scenario_params(scenario);
    if (!p.ok()) raise_status(p.status());
    return p->to_string();
  }, nb::arg("scenario"), "A scenario's generator parameters as 'key=value ...'.");
  m.def(
      "generate_workload",
      [](StrArg scenario, nb::kwargs params) {
        spin::WorkloadParams p;
        if (!scenario.is_none()) {
          if (!nb::isinstance<nb::str>(scenario)) raise_type("scenario: expected a name (str) or None");
          auto r = spin::scenario_params(nb::cast<std::string>(scenario));
          if (!r.ok()) raise_status(r.status());
          p = std::move(r).value();
        }
        for (auto [k, v] : params) {
          const std::string key = meta_str(k, "a keyword");
          if (nb::isinstance<nb::bool_>(v)) raise_type(key + ": expected a number, got a bool");
          const std::string value = meta_str(v, key);
          check(p.set(key, value));
        }
        check(p.validate());
        spin::Result<spin::Trace> r = [&] {
          nb::gil_scoped_release release;
          return spin::generate_workload(p);
        }();
        if (!r.ok()) raise_status(r.status());
        return PyTrace{std::make_shared<spin::Trace>(std::move(r).value())};
      },
      nb::arg("scenario") = nb::none(), nb::arg("params"),
      "Generates a synthetic trace (include/spin/lab/workload.h): a scenario name and/or generator "
      "fields as keywords (prompt_tokens=..., steps=..., layers=..., next_n=..., seed=...).");

  nb::class_<PyScored>(m, "ScoredTrace",
                       "A trace with its all-keep ground truth (the real indexer and top-k over "
                       "every block), shared by every replay of it.")
      .def_prop_ro("path", [](const PyScored& s) { return py_str(s.path); })
      .def("facts", [](const PyScored& s, int64_t block_entries_arg) {
        const int32_t block_entries = int_arg(block_entries_arg, "block_entries", 1, INT32_MAX);
        check(spin::check_trace_facts(*s.scored, block_entries));
        const spin::TraceFacts f = spin::trace_facts(*s.scored, block_entries);
        nb::dict d;
        d["samples"] = f.samples;
        d["exact_by_construction"] = f.exact_by_construction;
        d["topk_block_share"] = f.topk_block_share;
        d["prev_step_topk_recall"] = f.prev_step_topk_recall;
        d["mean_visible_entries"] = f.mean_visible_entries;
        return d;
      }, nb::arg("block_entries") = 64);
  m.def("score_trace", &score, nb::arg("trace"), nb::arg("threads") = 0,
        "The all-keep truth of a trace (a path, Trace or TraceReader): a key trace scored by the "
        "indexer over every block, a score trace's recorded scores; top-k by the real kernel.");
  m.def("replay", &replay, nb::arg("scored"), nb::arg("predictor") = "spin",
        nb::arg("config").none() = nb::none(), nb::arg("open_loop") = false, nb::arg("warm_start") = true,
        nb::arg("keep_topk") = false,
        "Replays a ScoredTrace through a predictor; returns the metrics dict of `spin replay --json` "
        "(recall_mean, miss_p50/p99/max, block_recall_mean, sparsity_mean, ...), plus 'topk' (per "
        "layer int32 [steps · next_n, topk]) with keep_topk.");
}

}  // namespace spin_py
