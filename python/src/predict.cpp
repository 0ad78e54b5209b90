// spin_dsa.Predictor / make_predictor / PredictorConfig helpers: the per-request research API
// (spin/predict.h), one object per request, all of its indexer layers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/variant.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "common.h"
#include "spin/cache.h"
#include "spin/geometry.h"
#include "spin/indexer.h"
#include "spin/predict.h"
#include "spin/predictor_inputs.h"
#include "spin/selection_tables.h"

namespace spin_py {

spin::PredictorConfig config_from(nb::handle obj) {
  spin::PredictorConfig config;
  if (obj.is_none()) return config;
  if (nb::isinstance<nb::str>(obj)) {
    check(config.parse(nb::cast<std::string>(obj)));
  } else if (nb::isinstance<nb::dict>(obj)) {
    // A dict's "preset" applies first, wherever it stands, so that its other keys override it.
    const nb::dict d = nb::borrow<nb::dict>(obj);
    if (d.contains(spin::kPresetKey)) check(config.apply_preset(nb::cast<std::string>(nb::str(d[spin::kPresetKey]))));
    for (auto [k, v] : d) {
      const std::string key = nb::cast<std::string>(nb::str(k));
      if (key == spin::kPresetKey) continue;
      std::string value = nb::cast<std::string>(nb::str(v));
      check(config.set(key, value));
    }
  } else {
    raise_type("config: expected None, a dict or a 'key=value ...' string");
  }
  check(config.validate());
  return config;
}

nb::dict config_dict(const spin::PredictorConfig& config) {
  nb::dict out;
  const std::string text = config.to_string();
  size_t i = 0;
  while (i < text.size()) {
    size_t end = text.find(' ', i);
    if (end == std::string::npos) end = text.size();
    const std::string pair = text.substr(i, end - i);
    const size_t eq = pair.find('=');
    if (eq != std::string::npos) {
      const std::string key = pair.substr(0, eq), value = pair.substr(eq + 1);
      nb::object v;
      try {
        size_t used = 0;
        const long long as_int = std::stoll(value, &used);
        if (used == value.size()) v = nb::int_(as_int);
      } catch (...) {
      }
      if (!v.is_valid()) {
        try {
          size_t used = 0;
          const double as_double = std::stod(value, &used);
          if (used == value.size()) v = nb::float_(as_double);
        } catch (...) {
        }
      }
      if (!v.is_valid()) v = nb::str(value.c_str());
      out[key.c_str()] = v;
    }
    i = end + 1;
  }
  return out;
}

namespace {

// One request's predictor and, per layer, what its last select chose (observe needs the scored
// blocks and the rows' visible counts of the open step).
class Predictor {
 public:
  explicit Predictor(std::unique_ptr<spin::BlockPredictor> p)
      : p_(std::move(p)), layers_(static_cast<size_t>(p_->num_layers())) {}

  nb::ndarray<nb::numpy, int32_t> select(int64_t layer_arg, int64_t step, int64_t num_entries,
                                         int64_t next_n_arg, IndexArg visible_entries, IndexArg true_topk,
                                         ArrayArg k, ArrayArg k_scale, ArrayArg q, ArrayArg w) {
    CallGuard guard(*busy_, "Predictor.select");
    const int32_t layer = layer_index(layer_arg);
    const int32_t next_n = int_arg(next_n_arg, "next_n", 1, spin::kMaxNextN);
    if (step < 0) raise_value("step: " + std::to_string(step) + " is negative");
    if (num_entries < 0 || num_entries > (int64_t{1} << 31))
      raise_value("num_entries: " + std::to_string(num_entries) + " is outside 0..2^31");
    LayerSel& l = layers_[static_cast<size_t>(layer)];
    spin::StepInput in;
    in.step = step;
    in.num_entries = num_entries;
    in.next_n = next_n;
    IndexArray<int64_t> vis;
    IndexArray<int32_t> tk;
    spin::PredictorInputs inputs;  // the oracle's true top-k; nothing else reaches Python
    in.inputs = &inputs;
    if (!visible_entries.is_none()) {
      vis = index_i64(visible_entries, {"visible_entries", {next_n}, 0, num_entries, "next_n", false});
      in.visible_entries = vis.data;
    }
    if (!true_topk.is_none()) {
      tk = index_i32(true_topk, {"true_topk", {next_n, p_->config().topk}, -1, std::max<int64_t>(num_entries - 1, -1),
                                 "[next_n, topk]"});
      inputs.true_topk = tk.data;
    }
    spin::HisaView hisa;
    if (key_view(num_entries, next_n, k, k_scale, q, w, &hisa)) inputs.hisa = &hisa;
    check(p_->select(layer, in, &l.sel));
    l.next_n = next_n;
    for (int32_t j = 0; j < next_n && j < spin::kMaxNextN; ++j) {
      l.visible[static_cast<size_t>(j)] =
          in.visible_entries ? in.visible_entries[j] : spin::visible_entries(num_entries, next_n, j);
    }
    std::vector<int32_t> blocks = l.sel.blocks;
    const size_t n = blocks.size();
    return owned_array(std::move(blocks), {n});
  }

  nb::ndarray<nb::numpy, int32_t> row_blocks(int64_t layer, int64_t row) {
    check_layer(layer);
    const LayerSel& l = layers_[static_cast<size_t>(layer)];
    if (row < 0 || row >= static_cast<int32_t>(l.sel.row_blocks.size()))
      raise_value("row " + std::to_string(row) + " is outside the last select's rows");
    std::vector<int32_t> blocks = l.sel.row_blocks[static_cast<size_t>(row)];
    const size_t n = blocks.size();
    return owned_array(std::move(blocks), {n});
  }

  void observe(int64_t layer_arg, int64_t row_arg, ArrayArg scores_obj, IndexArg topk, IndexArg scored_blocks) {
    CallGuard guard(*busy_, "Predictor.observe");
    const int32_t layer = layer_index(layer_arg);
    const LayerSel& l = layers_[static_cast<size_t>(layer)];
    if (row_arg < 0 || row_arg >= l.next_n || row_arg >= spin::kMaxNextN)
      raise_value("observe: row " + std::to_string(row_arg) + " is outside the last select's " +
                  std::to_string(l.next_n) + " rows of layer " + std::to_string(layer));
    const int32_t row = static_cast<int32_t>(row_arg);
    spin::RowScores rs;
    InArray scores = in_array(scores_obj, "scores");
    rs.scores = array_data<const float>(scores, "scores", 1);
    rs.num_cols = static_cast<int64_t>(scores.shape(0));
    rs.visible_entries = l.visible[static_cast<size_t>(row)];
    if (rs.num_cols < rs.visible_entries)
      raise_value("scores: " + std::to_string(rs.num_cols) + " entries, but row " +
                  std::to_string(row) + " sees " + std::to_string(rs.visible_entries));
    IndexArray<int32_t> sb, tk;
    if (scored_blocks.is_none()) {
      rs.scored_blocks = l.sel.blocks.data();
      rs.num_scored_blocks = static_cast<int64_t>(l.sel.blocks.size());
    } else {
      // Any block of the step (the union covers the step's widest row), none past it.
      int64_t widest = 0;
      for (int32_t j = 0; j < l.next_n; ++j) widest = std::max(widest, l.visible[static_cast<size_t>(j)]);
      const int64_t E = p_->config().block_entries();
      sb = index_i32(scored_blocks, {"scored_blocks", {-1}, 0, std::max<int64_t>((widest + E - 1) / E - 1, 0)});
      rs.scored_blocks = sb.data;
      rs.num_scored_blocks = sb.dim(0);
    }
    if (!topk.is_none()) {
      tk = index_i32(topk, {"topk", {p_->config().topk}, -1, std::max<int64_t>(rs.visible_entries - 1, -1),
                            "config topk, -1 padded"});
      rs.topk_positions = tk.data;
    }
    check(p_->observe(layer, row, rs));
  }

  void commit(int64_t accepted) {
    CallGuard guard(*busy_, "Predictor.commit");
    check(p_->commit(int_arg(accepted, "accepted", 0, spin::kMaxNextN - 1)));
  }
  void reset() {
    CallGuard guard(*busy_, "Predictor.reset");
    p_->reset();
  }
  Predictor fork(int64_t request_id, int64_t shared_entries) const {
    auto r = p_->fork(request_id, shared_entries);
    if (!r.ok()) raise_status(r.status());
    return Predictor(std::move(r).value());
  }
  spin::BlockPredictor& get() { return *p_; }

 private:
  // hisa's and spin-hybrid's input (PredictorInputs::hisa) from one layer's keys in the key
  // trace's layout (include/spin/trace.h: k U8 [entries, 128] e4m3, k_scale F32 [entries]) and the
  // step's query (q U8 [next_n, heads, 128], w F32 [next_n, heads], every scale folded into w).
  // The keys are written into a scratch paged cache (identity page table) that lives only for the
  // select: the predictors copy what they keep (hisa's pooled sums), so one scratch serves every
  // layer. All four or none; returns whether they were given.
  bool key_view(int64_t num_entries, int32_t next_n, nb::handle k_obj, nb::handle ks_obj, nb::handle q_obj,
                nb::handle w_obj, spin::HisaView* view) {
    const int given = !k_obj.is_none() + !ks_obj.is_none() + !q_obj.is_none() + !w_obj.is_none();
    if (given == 0) return false;
    if (given != 4) raise_value("select: k, k_scale, q and w go together (the keys and the query); got " +
                                std::to_string(given) + " of the 4");
    InArray k = in_array(k_obj, "k"), ks = in_array(ks_obj, "k_scale"), q = in_array(q_obj, "q"),
            w = in_array(w_obj, "w");
    const uint8_t* kd = array_data<const uint8_t>(k, "k", 2);
    const float* ksd = array_data<const float>(ks, "k_scale", 1);
    const uint8_t* qd = array_data<const uint8_t>(q, "q", 3);
    const float* wd = array_data<const float>(w, "w", 2);
    const int64_t rows = static_cast<int64_t>(k.shape(0));
    if (k.shape(1) != spin::kIndexerHeadDim)
      raise_value("k: expected [entries, 128] e4m3 codes, got " + shape_text(k));
    if (rows < num_entries)
      raise_value("k: " + std::to_string(rows) + " entries, fewer than num_entries " + std::to_string(num_entries));
    if (static_cast<int64_t>(ks.shape(0)) != rows)
      raise_value("k_scale: expected [" + std::to_string(rows) + "] (like k), got " + shape_text(ks));
    const int64_t heads = static_cast<int64_t>(q.shape(1));
    if (static_cast<int64_t>(q.shape(0)) != next_n || heads < 1 || heads > spin::kMaxIndexerHeads ||
        q.shape(2) != spin::kIndexerHeadDim)
      raise_value("q: expected [next_n=" + std::to_string(next_n) + ", heads (1.." +
                  std::to_string(spin::kMaxIndexerHeads) + "), 128], got " + shape_text(q));
    if (static_cast<int64_t>(w.shape(0)) != next_n || static_cast<int64_t>(w.shape(1)) != heads)
      raise_value("w: expected [" + std::to_string(next_n) + ", " + std::to_string(heads) + "] (like q), got " +
                  shape_text(w));
    const int32_t ps = p_->config().page_size;
    const int64_t pages = std::max<int64_t>(1, (rows + ps - 1) / ps);
    if (pages > (int64_t{1} << 30)) raise_value("k: too many entries (" + std::to_string(rows) + ")");
    if (!scratch_ || scratch_->num_pages() < pages) {
      check_fits(static_cast<double>(pages) * ps * spin::kEntryBytes, "the key scratch cache");
      auto c = spin::IndexerKeyCache::create(ps, static_cast<int32_t>(pages));
      if (!c.ok()) raise_status(c.status());
      scratch_ = std::make_unique<spin::IndexerKeyCache>(std::move(c).value());
      identity_.resize(static_cast<size_t>(pages));
      for (size_t i = 0; i < identity_.size(); ++i) identity_[i] = static_cast<int32_t>(i);
    }
    check(scratch_->write_quantized(identity_.data(), pages, 0, kd, ksd, rows));
    view->key_cache = scratch_->data();
    view->page_size = ps;
    view->block_table = identity_.data();
    view->num_entries = num_entries;
    view->q = qd;
    view->w = wd;
    view->num_heads = static_cast<int32_t>(heads);
    view->num_cache_pages = scratch_->num_pages();
    return true;
  }

  struct LayerSel {
    spin::Selection sel;
    int32_t next_n = 0;
    std::array<int64_t, spin::kMaxNextN> visible{};
  };
  void check_layer(int64_t layer) const {
    if (layer < 0 || layer >= p_->num_layers()) {
      check(spin::Status(spin::StatusCode::kOutOfRange,
                         p_->name() + ": layer " + std::to_string(layer) + " is outside [0, " +
                             std::to_string(p_->num_layers()) + ")"));
    }
  }
  int32_t layer_index(int64_t layer) const {
    check_layer(layer);
    return static_cast<int32_t>(layer);
  }
  std::unique_ptr<spin::BlockPredictor> p_;
  // One call at a time (not thread-safe); on the heap so that the object stays movable.
  std::unique_ptr<std::atomic<bool>> busy_ = std::make_unique<std::atomic<bool>>(false);
  std::vector<LayerSel> layers_;
  std::unique_ptr<spin::IndexerKeyCache> scratch_;  // key_view's cache, reused across selects
  std::vector<int32_t> identity_;                   // its page table: logical page i = physical i
};

}  // namespace

void bind_predict(nb::module_& m) {
  m.def("predictor_names", &spin::predictor_names, "The predictor names make_predictor accepts.");
  m.def(
      "predictor_info",
      []() -> nb::typed<nb::list, nb::typed<nb::dict, nb::str, std::variant<nb::str, bool>>> {
        nb::list rows;
        for (const spin::PredictorInfo& info : spin::predictor_registry()) {
          nb::dict row;
          row["name"] = info.name;
          row["reads"] = spin::predictor_reads_name(info.reads);
          row["can_serve"] = info.can_serve;
          row["explores"] = info.explores;
          row["keeps_all"] = info.keeps_all;
          row["reuses_previous_topk"] = info.reuses_previous_topk;
          rows.append(row);
        }
        return rows;
      },
      "The predictor registry, one dict per predictor in predictor_names() order: name, reads "
      "('own-state', 'keys' or 'true-topk'), can_serve (Serving runs it), explores, keeps_all, "
      "reuses_previous_topk.");
  m.def("preset_names", &spin::preset_names,
        "The config presets: 'default', 'paper' (SPIN as published). Give one as config key 'preset'.");
  m.def("default_config", [] { return config_dict(spin::PredictorConfig{}); },
        "The PredictorConfig defaults as a dict (include/spin/predict.h documents each field).");
  m.def("check_config", [](ConfigArg c) { return config_dict(config_from(c)); }, nb::arg("config").none(),
        "Validates a config (dict or 'key=value ...') and returns it complete, as a dict.");
  m.def("budget_blocks",
        [](ConfigArg c, int64_t n_blocks) {
          if (n_blocks < 0 || n_blocks > (int64_t{1} << 31))
            raise_value("n_blocks: " + std::to_string(n_blocks) + " is outside 0..2^31");
          return spin::budget_blocks(config_from(c), n_blocks);
        },
        nb::arg("config").none(), nb::arg("n_blocks"),
        "Blocks scored for a row that sees n_blocks blocks: ceil((1 - s)·n), at least what top-k needs.");
  m.def(
      "selection_tables",
      [](ConfigArg c, int64_t max_blocks) -> nb::typed<nb::dict, nb::str, nb::ndarray<nb::numpy, int64_t>> {
        const spin::PredictorConfig config = config_from(c);
        spin::Result<spin::SelectionTables> r = [&] {
          nb::gil_scoped_release release;
          return spin::selection_tables(config, max_blocks);
        }();
        if (!r.ok()) raise_status(r.status());
        spin::SelectionTables t = std::move(r).value();
        nb::dict out;
        const auto put = [&out](const char* name, std::vector<int64_t>&& v) {
          const size_t size = v.size();
          out[name] = owned_array(std::move(v), {size});
        };
        put("budget", std::move(t.budget));
        put("forced", std::move(t.forced));
        put("explore", std::move(t.explore));
        put("history", std::move(t.history));
        put("pool_rank", std::move(t.pool_rank));
        put("offset_bucket", std::vector<int64_t>(t.offset_bucket.begin(), t.offset_bucket.end()));
        put("bucket_lo", std::move(t.bucket_lo));
        put("bucket_hi", std::move(t.bucket_hi));
        return out;
      },
      nb::arg("config").none(), nb::arg("max_blocks"),
      "The selection rules that depend on a row's block count alone, as int64 arrays "
      "(include/spin/selection_tables.h): by block count n in 0..max_blocks budget, forced, explore "
      "(at the fixed explore_ratio), history and pool_rank; by distance d in 0..max(1, max_blocks) - 1 "
      "offset_bucket; by offset bucket its distances [bucket_lo, bucket_hi).");
  m.def(
      "selection_constants",
      [] {
        const spin::SelectionConstants k = spin::selection_constants();
        nb::typed<nb::dict, nb::str, std::variant<int64_t, double>> out;
        out["offset_mean_scale"] = k.offset_mean_scale;
        out["offset_exact_distances"] = k.offset_exact_distances;
        out["offset_buckets_per_octave"] = k.offset_buckets_per_octave;
        out["topk_first_base"] = static_cast<double>(k.topk_first_base);
        out["topk_hits_cap"] = k.topk_hits_cap;
        out["recent_base"] = static_cast<double>(k.recent_base);
        out["unknown_base"] = static_cast<double>(k.unknown_base);
        out["churn_ema_keep"] = k.churn_ema_keep;
        out["churn_ema_weight"] = k.churn_ema_weight;
        out["explore_share_step"] = k.explore_share_step;
        out["explore_share_fall"] = k.explore_share_fall;
        out["explore_share_floor"] = k.explore_share_floor;
        out["explore_share_ceiling"] = k.explore_share_ceiling;
        out["additions_gain_weight"] = k.additions_gain_weight;
        out["additions_gain_warmup"] = k.additions_gain_warmup;
        return out;
      },
      "The ranking's constants (include/spin/selection_tables.h): offset_mean_scale, "
      "offset_exact_distances, offset_buckets_per_octave, topk_first_base, topk_hits_cap, "
      "recent_base, unknown_base, churn_ema_keep, churn_ema_weight, explore_share_step, "
      "explore_share_fall, explore_share_floor, explore_share_ceiling, additions_gain_weight, "
      "additions_gain_warmup.");
  m.def("hit_tie_level", &spin::hit_tie_level, nb::arg("p"),
        "spin's topk_first tie level of a float32 ranking value p: p in quarters of [-1, 1], as 0, "
        "1/8, ..., 7/8 (NaN: 0).");

  nb::class_<Predictor>(m, "Predictor",
                        "One request's block predictor over all of its indexer layers "
                        "(include/spin/predict.h). Per step: select every layer, observe every row, "
                        "then commit(accepted).")
      .def_prop_ro("name", [](Predictor& p) { return p.get().name(); })
      .def_prop_ro("num_layers", [](Predictor& p) { return p.get().num_layers(); })
      .def_prop_ro("request_id", [](Predictor& p) { return p.get().request_id(); })
      .def_prop_ro("config", [](Predictor& p) { return config_dict(p.get().config()); })
      .def_prop_ro("memory_bytes", [](Predictor& p) { return p.get().memory_bytes(); })
      .def("select", &Predictor::select, nb::arg("layer"), nb::arg("step"), nb::arg("num_entries"),
           nb::arg("next_n") = 1, nb::arg("visible_entries") = nb::none(),
           nb::arg("true_topk") = nb::none(), nb::arg("k") = nb::none(), nb::arg("k_scale") = nb::none(),
           nb::arg("q") = nb::none(), nb::arg("w") = nb::none(),
           "Blocks to score for `layer` at decode `step` (int32, ascending: the union of the next_n "
           "rows' sets). num_entries: entries in the cache including the step's rows. "
           "visible_entries: optional int64 [next_n] override (V4); true_topk: int32 [next_n, topk] "
           "(oracle only). k, k_scale, q, w (all four or none; hisa, spin-hybrid): the layer's "
           "indexer keys as a key trace holds them (uint8 [>= num_entries, 128] e4m3, float32 "
           "[same] scales) and the step's query (uint8 [next_n, heads, 128], float32 [next_n, "
           "heads] weights with every scale folded in).")
      .def("row_blocks", &Predictor::row_blocks, nb::arg("layer"), nb::arg("row"),
           "Row `row`'s own set from the last select of `layer` (int32, ascending).")
      .def("observe", &Predictor::observe, nb::arg("layer"), nb::arg("row"), nb::arg("scores"),
           nb::arg("topk") = nb::none(), nb::arg("scored_blocks") = nb::none(),
           "Buffers row `row`'s indexer scores (float32 [>= visible entries], request-local; only "
           "the scored blocks' entries are read; -inf = scored, lowest; NaN/+inf raise) for the "
           "open step. topk: optional int32 [topk] positions from the top-k kernel, -1 padded. "
           "scored_blocks: what was scored, default the last select's blocks.")
      .def("commit", &Predictor::commit, nb::arg("accepted") = 0,
           "Closes the step: `accepted` draft tokens (0..next_n-1) were accepted; rows replay per "
           "config mtp_update.")
      .def("reset", &Predictor::reset, "Forgets every observation (config and request id stay).")
      .def("fork", &Predictor::fork, nb::arg("request_id"), nb::arg("shared_entries") = -1,
           "A copy for a request sharing this one's first shared_entries entries (-1: all).");

  m.def(
      "make_predictor",
      [](const std::string& name, ConfigArg config, int64_t num_layers, int64_t request_id) {
        auto r = spin::make_predictor(name, config_from(config), int_arg(num_layers, "num_layers", 1, 1024),
                                      request_id);
        if (!r.ok()) raise_status(r.status());
        return Predictor(std::move(r).value());
      },
      nb::arg("name") = "spin", nb::arg("config").none() = nb::none(), nb::arg("num_layers") = 1,
      nb::arg("request_id") = 0,
      "Creates a predictor by name (predictor_names()) for one request with num_layers indexer "
      "layers. config: None, a dict or a 'key=value ...' string of PredictorConfig fields.");
}

}  // namespace spin_py
