// spin_dsa trace I/O (spin/trace.h), the workload generator (spin/workload.h) and replay
// (spin/replay.h). Trace tensors come back as zero-copy numpy views: into the file mapping
// (TraceReader) or into the owning Trace's vectors; each view keeps its owner alive.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/shared_ptr.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <memory>
#include <string>

#include "common.h"
#include "spin/replay.h"
#include "spin/trace.h"
#include "spin/workload.h"

namespace spin_py {

namespace {

template <typename T>
nb::ndarray<nb::numpy, const T> view(const T* data, std::initializer_list<size_t> shape, nb::handle owner) {
  return nb::ndarray<nb::numpy, const T>(data, shape, owner);
}

nb::dict meta_dict(const spin::TraceMeta& m) {
  nb::dict d;
  d["model"] = m.model;
  d["num_layers"] = m.num_layers;
  d["next_n"] = m.next_n;
  d["num_heads"] = m.num_heads;
  d["page_size"] = m.page_size;
  d["topk"] = m.topk;
  d["compress_ratio"] = m.compress_ratio;
  nb::dict extra;
  for (const auto& [k, v] : m.extra) extra[k.c_str()] = v;
  d["extra"] = extra;
  return d;
}

// An owning trace (generated, converted or built from arrays), shared with ScoredTrace.
struct PyTrace {
  std::shared_ptr<spin::Trace> t;
};

struct PyScored {
  std::shared_ptr<spin::Trace> trace;
  std::shared_ptr<const spin::ScoredTrace> scored;
  std::string path;  // "" when not read from a file
};

void check_layer(int32_t layer, int32_t n) {
  if (layer < 0 || layer >= n)
    check(spin::Status(spin::StatusCode::kOutOfRange,
                       "layer " + std::to_string(layer) + " is outside [0, " + std::to_string(n) + ")"));
}

template <typename T>
std::vector<T> copy_array(const InArray& a, const char* name, int ndim) {
  const T* d = array_data<const T>(a, name, ndim);
  return std::vector<T>(d, d + a.size());
}

// TraceMeta from a Python dict: the known fields by name, anything else kept in `extra`.
spin::TraceMeta parse_meta(nb::dict meta) {
  spin::TraceMeta m;
  for (auto [k, v] : meta) {
    const std::string key = nb::cast<std::string>(k);
    if (key == "model") m.model = nb::cast<std::string>(v);
    else if (key == "num_layers") m.num_layers = nb::cast<int32_t>(v);
    else if (key == "next_n") m.next_n = nb::cast<int32_t>(v);
    else if (key == "num_heads") m.num_heads = nb::cast<int32_t>(v);
    else if (key == "page_size") m.page_size = nb::cast<int32_t>(v);
    else if (key == "topk") m.topk = nb::cast<int32_t>(v);
    else if (key == "compress_ratio") m.compress_ratio = nb::cast<int32_t>(v);
    else if (key == "extra") {
      for (auto [ek, ev] : nb::cast<nb::dict>(v)) m.extra[nb::cast<std::string>(ek)] = nb::cast<std::string>(nb::str(ev));
    } else {
      m.extra[key] = nb::cast<std::string>(nb::str(v));
    }
  }
  return m;
}

PyTrace make_trace(nb::dict meta, nb::handle ctx_len, nb::list layers, nb::handle accepted) {
  auto t = std::make_shared<spin::Trace>();
  spin::TraceMeta& m = t->meta;
  m = parse_meta(meta);
  if (!meta.contains("num_layers")) m.num_layers = static_cast<int32_t>(nb::len(layers));
  t->ctx_len = copy_array<int64_t>(as_index_array(ctx_len, "int64"), "ctx_len", 1);
  if (!accepted.is_none()) t->accepted = copy_array<int32_t>(as_index_array(accepted, "int32"), "accepted", 1);
  for (nb::handle l : layers) {
    nb::dict d = nb::cast<nb::dict>(l);
    spin::TraceLayer tl;
    tl.k = copy_array<uint8_t>(nb::cast<InArray>(d["k"]), "k", 2);
    tl.k_scale = copy_array<float>(nb::cast<InArray>(d["k_scale"]), "k_scale", 1);
    tl.q = copy_array<uint8_t>(nb::cast<InArray>(d["q"]), "q", 4);
    tl.w = copy_array<float>(nb::cast<InArray>(d["w"]), "w", 3);
    if (d.contains("k_draft")) {
      tl.k_draft = copy_array<uint8_t>(nb::cast<InArray>(d["k_draft"]), "k_draft", 3);
      tl.k_draft_scale = copy_array<float>(nb::cast<InArray>(d["k_draft_scale"]), "k_draft_scale", 2);
    }
    t->layers.push_back(std::move(tl));
  }
  check(spin::validate_trace(*t));
  return PyTrace{std::move(t)};
}

// A score trace (kind=scores) from arrays: scores one float32 [steps, next_n, entries] per layer.
// Validated and written atomically by the library (spin::write_score_trace).
void write_score_trace(nb::dict meta, nb::handle ctx_len, nb::list scores, const std::string& path,
                       nb::handle accepted) {
  spin::ScoreTrace t;
  t.meta = parse_meta(meta);
  t.meta.kind = spin::TraceKind::kScores;
  if (!meta.contains("num_layers")) t.meta.num_layers = static_cast<int32_t>(nb::len(scores));
  t.ctx_len = copy_array<int64_t>(as_index_array(ctx_len, "int64"), "ctx_len", 1);
  if (!accepted.is_none()) t.accepted = copy_array<int32_t>(as_index_array(accepted, "int32"), "accepted", 1);
  for (nb::handle l : scores) {
    InArray a = nb::cast<InArray>(l);
    t.scores.push_back(copy_array<float>(a, "scores", 3));
    if (a.shape(0) != t.ctx_len.size() || static_cast<int64_t>(a.shape(1)) != t.meta.next_n)
      raise_value("scores: expected float32 [steps, next_n, entries] per layer with steps = len(ctx_len) = " +
                  std::to_string(t.ctx_len.size()) + " and next_n = " + std::to_string(t.meta.next_n));
    t.entries.push_back(static_cast<int64_t>(a.shape(2)));
  }
  const spin::Status st = [&] {
    nb::gil_scoped_release release;
    return spin::write_score_trace(t, path);
  }();
  check(st);
}

PyScored score(nb::handle trace, int threads) {
  PyScored out;
  if (nb::isinstance<nb::str>(trace)) {
    out.path = nb::cast<std::string>(trace);
    auto r = spin::read_trace(out.path);
    if (!r.ok()) raise_status(r.status());
    out.trace = std::make_shared<spin::Trace>(std::move(r).value());
  } else if (nb::isinstance<PyTrace>(trace)) {
    out.trace = nb::cast<PyTrace&>(trace).t;
  } else if (nb::isinstance<spin::TraceReader>(trace)) {
    const spin::TraceReader& r = nb::cast<const spin::TraceReader&>(trace);
    out.path = r.path();
    out.trace = std::make_shared<spin::Trace>(r.to_trace());
  } else {
    raise_type("trace: expected a path, a Trace or a TraceReader");
  }
  spin::ScoreOptions o;
  o.threads = threads;
  spin::Result<std::shared_ptr<const spin::ScoredTrace>> r = [&] {
    nb::gil_scoped_release release;
    return spin::score_trace(*out.trace, o);
  }();
  if (!r.ok()) raise_status(r.status());
  out.scored = std::move(r).value();
  return out;
}

nb::dict replay(const PyScored& s, const std::string& predictor, nb::handle config, bool open_loop,
                bool warm_start, bool keep_topk) {
  spin::ReplayOptions o;
  o.predictor = predictor;
  o.config = config_from(config);
  o.config.page_size = s.trace->meta.page_size;  // replay takes both from the trace
  o.config.topk = s.trace->meta.topk;
  o.open_loop = open_loop;
  o.warm_start = warm_start;
  o.keep_topk = keep_topk;
  spin::Result<spin::ReplayResult> r = [&] {
    nb::gil_scoped_release release;
    return spin::replay(*s.trace, *s.scored, o);
  }();
  if (!r.ok()) raise_status(r.status());
  const spin::TraceFacts facts = spin::trace_facts(*s.scored, r->config.block_entries());
  const std::string json = spin::replay_json(s.path, r.value(), facts);
  nb::dict out = nb::cast<nb::dict>(nb::module_::import_("json").attr("loads")(json));
  if (keep_topk) {
    nb::list layers;
    const int64_t rows = s.trace->steps() * s.trace->meta.next_n;
    const size_t k = static_cast<size_t>(r->config.topk);
    for (const auto& layer : r->topk) {
      std::vector<int32_t> flat;
      flat.reserve(static_cast<size_t>(rows) * k);
      for (const auto& row : layer) flat.insert(flat.end(), row.begin(), row.end());
      layers.append(owned_array(std::move(flat), {static_cast<size_t>(rows), k}));
    }
    out["topk"] = layers;
  }
  return out;
}

}  // namespace

void bind_trace(nb::module_& m) {
  nb::class_<spin::TraceReader>(m, "TraceReader",
                                "A validated trace file (include/spin/trace.h), memory-mapped; "
                                "tensors are zero-copy read-only views into the mapping.")
      .def_static(
          "open",
          [](const std::string& path) {
            auto r = spin::TraceReader::open(path);
            if (!r.ok()) raise_status(r.status());
            return std::move(r).value();
          },
          nb::arg("path"), "Opens and validates a trace file.")
      .def_prop_ro("meta", [](const spin::TraceReader& r) { return meta_dict(r.meta()); })
      .def_prop_ro("num_layers", &spin::TraceReader::num_layers)
      .def_prop_ro("steps", &spin::TraceReader::steps)
      .def_prop_ro("path", &spin::TraceReader::path)
      .def_prop_ro("file_size", &spin::TraceReader::file_size)
      .def("entries", [](const spin::TraceReader& r, int32_t l) { check_layer(l, r.num_layers()); return r.entries(l); }, nb::arg("layer"))
      .def("visible_entries", &spin::TraceReader::visible_entries, nb::arg("step"), nb::arg("row"))
      .def_prop_ro("ctx_len", [](nb::handle self) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        return view(r.ctx_len().data(), {r.ctx_len().size()}, self);
      })
      .def_prop_ro("accepted", [](nb::handle self) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        return view(r.accepted().data(), {r.accepted().size()}, self);
      })
      .def("k", [](nb::handle self, int32_t l) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        check_layer(l, r.num_layers());
        return view(r.k(l).data(), {static_cast<size_t>(r.entries(l)), 128}, self);
      }, nb::arg("layer"), "e4m3 key codes, uint8 [entries, 128] (a view).")
      .def("k_scale", [](nb::handle self, int32_t l) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        check_layer(l, r.num_layers());
        return view(r.k_scale(l).data(), {static_cast<size_t>(r.entries(l))}, self);
      }, nb::arg("layer"), "key scales, float32 [entries] (a view).")
      .def("q", [](nb::handle self, int32_t l) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        check_layer(l, r.num_layers());
        const auto& m = r.meta();
        return view(r.q(l).data(), {static_cast<size_t>(r.steps()), static_cast<size_t>(m.next_n),
                                    static_cast<size_t>(m.num_heads), 128}, self);
      }, nb::arg("layer"), "e4m3 query codes, uint8 [steps, next_n, heads, 128] (a view).")
      .def("w", [](nb::handle self, int32_t l) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        check_layer(l, r.num_layers());
        const auto& m = r.meta();
        return view(r.w(l).data(), {static_cast<size_t>(r.steps()), static_cast<size_t>(m.next_n),
                                    static_cast<size_t>(m.num_heads)}, self);
      }, nb::arg("layer"), "head weights, float32 [steps, next_n, heads] (a view).")
      .def_prop_ro("kind", [](const spin::TraceReader& r) { return std::string(spin::trace_kind_name(r.kind())); })
      .def("scores", [](nb::handle self, int32_t l) {
        auto& r = nb::cast<const spin::TraceReader&>(self);
        check_layer(l, r.num_layers());
        if (r.kind() != spin::TraceKind::kScores)
          check(spin::Status(spin::StatusCode::kFailedPrecondition, "scores: " + r.path() + " is a key trace (kind=keys)"));
        return view(r.scores(l).data(), {static_cast<size_t>(r.steps()), static_cast<size_t>(r.meta().next_n),
                                         static_cast<size_t>(r.entries(l))}, self);
      }, nb::arg("layer"), "A score trace's logits, float32 [steps, next_n, entries] (a view).")
      .def("to_trace", [](const spin::TraceReader& r) { return PyTrace{std::make_shared<spin::Trace>(r.to_trace())}; },
           "Copies the whole trace into memory.")
      .def("describe", [](const spin::TraceReader& r) { return spin::describe(r); });

  nb::class_<PyTrace>(m, "Trace", "An in-memory trace (generated, or built with make_trace).")
      .def_prop_ro("meta", [](const PyTrace& t) { return meta_dict(t.t->meta); })
      .def_prop_ro("num_layers", [](const PyTrace& t) { return t.t->meta.num_layers; })
      .def_prop_ro("steps", [](const PyTrace& t) { return t.t->steps(); })
      .def("entries", [](const PyTrace& t, int32_t l) {
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
      .def("k", [](nb::handle self, int32_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].k.data(), {t.layers[l].k_scale.size(), 128}, self);
      }, nb::arg("layer"))
      .def("k_scale", [](nb::handle self, int32_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].k_scale.data(), {t.layers[l].k_scale.size()}, self);
      }, nb::arg("layer"))
      .def("q", [](nb::handle self, int32_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].q.data(), {static_cast<size_t>(t.steps()), static_cast<size_t>(t.meta.next_n),
                                           static_cast<size_t>(t.meta.num_heads), 128}, self);
      }, nb::arg("layer"))
      .def("w", [](nb::handle self, int32_t l) {
        auto& t = *nb::cast<const PyTrace&>(self).t;
        check_layer(l, t.meta.num_layers);
        return view(t.layers[l].w.data(), {static_cast<size_t>(t.steps()), static_cast<size_t>(t.meta.next_n),
                                           static_cast<size_t>(t.meta.num_heads)}, self);
      }, nb::arg("layer"))
      .def("write", [](const PyTrace& t, const std::string& path) { check(spin::write_trace(*t.t, path)); },
           nb::arg("path"), "Validates, then writes atomically (spin/trace.h schema).");

  m.def("open_trace", [](const std::string& path) {
    auto r = spin::TraceReader::open(path);
    if (!r.ok()) raise_status(r.status());
    return std::move(r).value();
  }, nb::arg("path"), "Opens and validates a trace file (memory-mapped TraceReader).");
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
  m.def("write_trace", [](const PyTrace& t, const std::string& path) { check(spin::write_trace(*t.t, path)); },
        nb::arg("trace"), nb::arg("path"));

  m.def("scenario_names", &spin::scenario_names, "The built-in workload scenarios.");
  m.def("workload_params", [](const std::string& scenario) {
    auto p = spin::scenario_params(scenario);
    if (!p.ok()) raise_status(p.status());
    return p->to_string();
  }, nb::arg("scenario"), "A scenario's generator parameters as 'key=value ...'.");
  m.def(
      "generate_workload",
      [](nb::handle scenario, nb::kwargs params) {
        spin::WorkloadParams p;
        if (!scenario.is_none()) {
          auto r = spin::scenario_params(nb::cast<std::string>(scenario));
          if (!r.ok()) raise_status(r.status());
          p = std::move(r).value();
        }
        for (auto [k, v] : params) check(p.set(nb::cast<std::string>(k), nb::cast<std::string>(nb::str(v))));
        check(p.validate());
        spin::Result<spin::Trace> r = [&] {
          nb::gil_scoped_release release;
          return spin::generate_workload(p);
        }();
        if (!r.ok()) raise_status(r.status());
        return PyTrace{std::make_shared<spin::Trace>(std::move(r).value())};
      },
      nb::arg("scenario") = nb::none(), nb::arg("params"),
      "Generates a synthetic trace (include/spin/workload.h): a scenario name and/or generator "
      "fields as keywords (prompt_tokens=..., steps=..., layers=..., next_n=..., seed=...).");

  nb::class_<PyScored>(m, "ScoredTrace",
                       "A trace with its all-keep ground truth (the real indexer and top-k over "
                       "every block), shared by every replay of it.")
      .def_prop_ro("path", [](const PyScored& s) { return s.path; })
      .def("facts", [](const PyScored& s, int32_t block_entries) {
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
        "Scores a trace (a path, Trace or TraceReader) with the all-keep indexer and top-k.");
  m.def("replay", &replay, nb::arg("scored"), nb::arg("predictor") = "spin",
        nb::arg("config") = nb::none(), nb::arg("open_loop") = false, nb::arg("warm_start") = true,
        nb::arg("keep_topk") = false,
        "Replays a ScoredTrace through a predictor; returns the metrics dict of `spin replay --json` "
        "(recall_mean, miss_p50/p99/max, block_recall_mean, sparsity_mean, ...), plus 'topk' (per "
        "layer int32 [steps · next_n, topk]) with keep_topk.");
}

}  // namespace spin_py
