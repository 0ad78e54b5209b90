// spin_dsa.Serving: the batched, slot-indexed serving API (spin/serving.h) for an engine.
// select() returns a zero-copy view of a buffer the object preallocated ([max_requests ·
// max_next_n, max_blocks] int32): valid until the next select, or written into `out`.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <memory>
#include <vector>

#include "common.h"
#include "spin/serving.h"

namespace spin_py {

namespace {

class Serving {
 public:
  Serving(int32_t max_requests, int32_t num_layers, int64_t max_entries, const std::string& predictor,
          nb::handle config, int32_t max_next_n, int32_t compress_ratio) {
    spin::ServingOptions o;
    o.predictor = predictor;
    o.config = config_from(config);
    o.max_requests = max_requests;
    o.num_layers = num_layers;
    o.max_entries = max_entries;
    o.max_next_n = max_next_n;
    o.compress_ratio = compress_ratio;
    auto r = spin::ServingPredictor::create(o);
    if (!r.ok()) raise_status(r.status());
    s_ = std::move(r).value();
    const size_t rows = static_cast<size_t>(max_requests) * static_cast<size_t>(max_next_n);
    blocks_.assign(rows * static_cast<size_t>(s_->max_blocks()), -1);
    counts_.assign(rows, 0);
  }

  nb::object select(nb::handle slots_obj, int32_t layer, nb::handle seq_lens_obj,
                    int32_t next_n, nb::handle out) {
    InArray slots = as_index_array(slots_obj, "int32");
    InArray seq = as_index_array(seq_lens_obj, "int64");
    if (slots.ndim() != 1) raise_value("slots: expected one dimension [batch]");
    if (seq.ndim() != 1 || seq.shape(0) != slots.shape(0))
      raise_value("seq_lens: expected shape [batch] like slots");
    const int32_t batch = static_cast<int32_t>(slots.shape(0));
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(std::max(next_n, 0));
    const size_t cols = static_cast<size_t>(s_->max_blocks());
    int32_t* dst = blocks_.data();
    int64_t stride = static_cast<int64_t>(cols);
    OutArray o;
    if (!out.is_none()) {
      o = nb::cast<OutArray>(out);
      dst = array_data<int32_t>(o, "out", 2);
      if (o.shape(0) < rows || o.shape(1) < cols)
        raise_value("out: expected at least [" + std::to_string(rows) + ", " + std::to_string(cols) +
                    "] (rows = batch · next_n, max_blocks)");
      stride = static_cast<int64_t>(o.shape(1));
    } else if (rows > blocks_.size() / std::max<size_t>(cols, 1)) {
      raise_value("select: batch · next_n is above max_requests · max_next_n");
    }
    check(s_->select(static_cast<const int32_t*>(slots.data()), batch, layer,
                     static_cast<const int64_t*>(seq.data()), next_n, dst, stride, counts_.data()));
    if (!out.is_none()) return nb::borrow(out);
    nb::object self = nb::find(this);  // the view keeps this object (and its buffer) alive
    return nb::cast(nb::ndarray<nb::numpy, int32_t>(blocks_.data(), {rows, cols}, self));
  }

  nb::ndarray<nb::numpy, int32_t> counts(size_t rows) {
    nb::object self = nb::find(this);
    rows = std::min(rows, counts_.size());
    return nb::ndarray<nb::numpy, int32_t>(counts_.data(), {rows}, self);
  }

  void observe(nb::handle slots_obj, int32_t layer, const InArray& logits, nb::handle topk_obj) {
    InArray slots = as_index_array(slots_obj, "int32");
    const float* l = array_data<const float>(logits, "logits", 2);
    const int32_t* tk = nullptr;
    int64_t tk_stride = 0;
    InArray topk;
    if (!topk_obj.is_none()) {
      topk = nb::cast<InArray>(topk_obj);
      tk = array_data<const int32_t>(topk, "topk", 2);
      if (topk.shape(0) != logits.shape(0)) raise_value("topk: expected as many rows as logits");
      tk_stride = static_cast<int64_t>(topk.shape(1));
    }
    check_rows(slots, logits.shape(0), "logits");
    check(s_->observe(static_cast<const int32_t*>(slots.data()), static_cast<int32_t>(slots.shape(0)),
                      layer, l, static_cast<int64_t>(logits.shape(1)),
                      static_cast<int64_t>(logits.shape(1)), tk, tk_stride));
  }

  void observe_scored(nb::handle slots_obj, int32_t layer, const InArray& scored, nb::handle topk_obj) {
    InArray slots = as_index_array(slots_obj, "int32");
    const float* l = array_data<const float>(scored, "scored", 2);
    const int32_t* tk = nullptr;
    int64_t tk_stride = 0;
    InArray topk;
    if (!topk_obj.is_none()) {
      topk = nb::cast<InArray>(topk_obj);
      tk = array_data<const int32_t>(topk, "topk", 2);
      if (topk.shape(0) != scored.shape(0)) raise_value("topk: expected as many rows as scored");
      tk_stride = static_cast<int64_t>(topk.shape(1));
    }
    check_rows(slots, scored.shape(0), "scored");
    check(s_->observe_scored(static_cast<const int32_t*>(slots.data()),
                             static_cast<int32_t>(slots.shape(0)), layer, l,
                             static_cast<int64_t>(scored.shape(1)), tk, tk_stride));
  }

  void commit(nb::handle slots_obj, nb::handle accepted_obj) {
    InArray slots = as_index_array(slots_obj, "int32");
    if (slots.ndim() != 1) raise_value("slots: expected one dimension [batch]");
    const size_t batch = slots.shape(0);
    std::vector<int32_t> zeros;
    const int32_t* acc = nullptr;
    InArray accepted;
    if (accepted_obj.is_none()) {
      zeros.assign(batch, 0);
      acc = zeros.data();
    } else {
      accepted = as_index_array(accepted_obj, "int32");
      if (accepted.ndim() != 1 || accepted.shape(0) != batch)
        raise_value("accepted: expected shape [batch] like slots");
      acc = static_cast<const int32_t*>(accepted.data());
    }
    check(s_->commit(static_cast<const int32_t*>(slots.data()), static_cast<int32_t>(batch), acc));
  }

  void prefill(nb::handle slots_obj, int32_t layer, nb::handle seq_lens_obj, const InArray& logits) {
    InArray slots = as_index_array(slots_obj, "int32");
    InArray seq = as_index_array(seq_lens_obj, "int64");
    const float* l = array_data<const float>(logits, "logits", 2);
    if (slots.ndim() != 1 || seq.ndim() != 1 || seq.shape(0) != slots.shape(0) ||
        logits.shape(0) != slots.shape(0))
      raise_value("prefill: slots, seq_lens and logits rows must all be [batch]");
    check(s_->prefill(static_cast<const int32_t*>(slots.data()), static_cast<int32_t>(slots.shape(0)),
                      layer, static_cast<const int64_t*>(seq.data()), l,
                      static_cast<int64_t>(logits.shape(1))));
  }

  spin::ServingPredictor& get() { return *s_; }

 private:
  // Rows of a logits array must be batch · next_n of the open step; the library checks next_n.
  static void check_rows(const InArray& slots, size_t rows, const char* name) {
    if (slots.ndim() != 1) raise_value("slots: expected one dimension [batch]");
    const size_t batch = slots.shape(0);
    if (batch == 0 ? rows != 0 : rows % batch != 0)
      raise_value(std::string(name) + ": " + std::to_string(rows) + " rows is not batch · next_n for batch " +
                  std::to_string(batch));
  }
  std::unique_ptr<spin::ServingPredictor> s_;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> counts_;
};

}  // namespace

void bind_serving(nb::module_& m) {
  nb::class_<Serving>(m, "Serving",
                      "The serving API (include/spin/serving.h): one object for the whole batch, "
                      "state indexed by request slot, every buffer preallocated. Per step: "
                      "select/observe every layer, then commit; add/drop slots as requests come "
                      "and go. Exploration is keyed on the request id, not the slot.")
      .def(nb::init<int32_t, int32_t, int64_t, const std::string&, nb::handle, int32_t, int32_t>(),
           nb::arg("max_requests"), nb::arg("num_layers"), nb::arg("max_entries"),
           nb::arg("predictor") = "spin", nb::arg("config") = nb::none(), nb::arg("max_next_n") = 1,
           nb::arg("compress_ratio") = 1,
           "Allocates every slot's state for max_requests requests × num_layers indexer layers × "
           "the blocks of max_entries entries (contexts up to max_entries, up to max_next_n rows "
           "per step). predictor: any predictor_names() entry but oracle and hisa.")
      .def_prop_ro("max_blocks", [](Serving& s) { return s.get().max_blocks(); })
      .def_prop_ro("block_entries", [](Serving& s) { return s.get().block_entries(); })
      .def_prop_ro("memory_bytes", [](Serving& s) { return s.get().memory_bytes(); })
      .def_prop_ro("config", [](Serving& s) { return config_dict(s.get().options().config); })
      .def("add", [](Serving& s, int32_t slot, int64_t rid) { check(s.get().add(slot, rid)); },
           nb::arg("slot"), nb::arg("request_id"),
           "Starts request `request_id` in free `slot` (empty state).")
      .def("drop", [](Serving& s, int32_t slot) { check(s.get().drop(slot)); }, nb::arg("slot"),
           "Frees `slot` (finished or preempted request).")
      .def("active", [](Serving& s, int32_t slot) { return s.get().active(slot); }, nb::arg("slot"))
      .def("request_id", [](Serving& s, int32_t slot) { return s.get().request_id(slot); },
           nb::arg("slot"))
      .def("step", [](Serving& s, int32_t slot) { return s.get().step(slot); }, nb::arg("slot"))
      .def("select", &Serving::select, nb::arg("slots"), nb::arg("layer"),
           nb::arg("seq_lens"), nb::arg("next_n") = 1, nb::arg("out") = nb::none(),
           "Blocks to score: int32 [batch · next_n, max_blocks], row i·next_n + j for row j of "
           "slots[i], ascending, -1 padded (every row of a request gets its rows' union). "
           "seq_lens: tokens cached per slot including the step's rows. Without `out` the result "
           "is a view of the object's buffer, valid until the next select.")
      .def("counts", &Serving::counts, nb::arg("rows"),
           "Valid blocks per row of the last select (int32 [rows], a view).")
      .def("observe", &Serving::observe, nb::arg("slots"), nb::arg("layer"), nb::arg("logits"),
           nb::arg("topk") = nb::none(),
           "The rows' indexer logits, float32 [batch · next_n, cols >= visible], request-local "
           "positions (only the selected blocks are read), and optionally their top-k int32 "
           "[rows, >= topk].")
      .def("observe_scored", &Serving::observe_scored, nb::arg("slots"), nb::arg("layer"),
           nb::arg("scored"), nb::arg("topk") = nb::none(),
           "Like observe, with only the scored blocks' logits: float32 [rows, >= count · "
           "block_entries], block c of the row's select output at columns [c·E, (c+1)·E).")
      .def("commit", &Serving::commit, nb::arg("slots"), nb::arg("accepted") = nb::none(),
           "Closes the step of every slot: accepted int32 [batch] draft tokens (None: all 0).")
      .def("prefill", &Serving::prefill, nb::arg("slots"), nb::arg("layer"), nb::arg("seq_lens"),
           nb::arg("logits"),
           "A prompt's full indexer row per slot (float32 [batch, >= seq_len entries]) for "
           "`layer`; commit(slots) after the last layer. Not a decode step.");
}

}  // namespace spin_py
