// spin_dsa.Serving: the batched, slot-indexed serving API (spin/serving.h) for an engine.
// select() returns a zero-copy view of a buffer the object preallocated ([max_requests ·
// max_next_n, max_blocks] int32): valid until the next select, or written into `out`.
// Every argument goes through common.h's layer: slots in 0..max_requests-1 (copied unless int32
// C-contiguous), seq_lens and accepted shaped like slots, logits rows exactly batch · next_n of the
// open step, `out` never sharing memory with an input; one call at a time (CallGuard).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <atomic>
#include <memory>
#include <vector>

#include "common.h"
#include "spin/serving.h"

namespace spin_py {

namespace {

class Serving {
 public:
  Serving(int64_t max_requests, int64_t num_layers, int64_t max_entries, const std::string& predictor,
          ConfigArg config, int64_t max_next_n, int64_t compress_ratio) {
    spin::ServingOptions o;
    o.predictor = predictor;
    o.config = config_from(config);
    o.max_requests = int_arg(max_requests, "max_requests", 1, 1 << 20);
    o.num_layers = int_arg(num_layers, "num_layers", 1, 1024);
    o.max_entries = max_entries;
    o.max_next_n = int_arg(max_next_n, "max_next_n", 1, spin::kMaxNextN);
    o.compress_ratio = int_arg(compress_ratio, "compress_ratio", 1, 64);
    check(o.validate());
    auto r = spin::ServingPredictor::create(o);  // refuses, in GiB, what would not fit
    if (!r.ok()) raise_status(r.status());
    s_ = std::move(r).value();
    const int64_t rows = int64_t{o.max_requests} * o.max_next_n;
    const int64_t cells = checked_mul(rows, s_->max_blocks(), "select buffer");
    check_fits(static_cast<double>(cells) * sizeof(int32_t), "serving: the select buffer");
    blocks_.assign(static_cast<size_t>(cells), -1);
    counts_.assign(static_cast<size_t>(rows), 0);
  }

  ArrayOut select(IndexArg slots_obj, int64_t layer, IndexArg seq_lens_obj, int64_t next_n, ArrayOut out) {
    CallGuard guard(busy_, "Serving.select");
    const int32_t nn = int_arg(next_n, "next_n", 1, spin::kMaxNextN);  // the library names max_next_n
    const int32_t l = int_arg(layer, "layer", 0, s_->options().num_layers - 1);
    const auto slots = slot_array(slots_obj);
    const int64_t batch = slots.dim(0);
    const auto seq = index_i64(seq_lens_obj, {"seq_lens", {batch}, 0, INT64_MAX, "slots", false});
    const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(nn);
    const size_t cols = static_cast<size_t>(s_->max_blocks());
    int32_t* dst = blocks_.data();
    int64_t stride = static_cast<int64_t>(cols);
    OutArray o;
    if (!out.is_none()) {
      o = out_array(out, "out");
      dst = array_data<int32_t>(o, "out", 2);
      if (o.shape(0) < rows || o.shape(1) < cols)
        raise_value("out: expected at least [" + std::to_string(rows) + ", " + std::to_string(cols) +
                    "] (rows = batch · next_n, max_blocks), got " + shape_text(o));
      stride = static_cast<int64_t>(o.shape(1));
      // select writes `out` while it reads slots and seq_lens: a shared byte would be misread.
      const size_t out_bytes = o.shape(0) * static_cast<size_t>(stride) * sizeof(int32_t);
      if (overlaps(dst, out_bytes, slots.data, static_cast<size_t>(batch) * sizeof(int32_t)))
        raise_value("out: shares memory with slots (pass a separate array)");
      if (overlaps(dst, out_bytes, seq.data, static_cast<size_t>(batch) * sizeof(int64_t)))
        raise_value("out: shares memory with seq_lens (pass a separate array)");
    } else if (rows > counts_.size()) {
      raise_value("select: batch · next_n = " + std::to_string(rows) + " is above max_requests · max_next_n = " +
                  std::to_string(counts_.size()));
    }
    last_rows_ = 0;  // a refused select leaves no rows to read
    check(s_->select(slots.data, static_cast<int32_t>(batch), l, seq.data, nn, dst, stride, counts_.data()));
    last_rows_ = rows;
    if (!out.is_none()) return out;
    nb::object self = nb::find(this);  // the view keeps this object (and its buffer) alive
    return nb::borrow<ArrayOut>(nb::cast(nb::ndarray<nb::numpy, int32_t>(blocks_.data(), {rows, cols}, self)));
  }

  // Only the rows the last select wrote: the buffer's other entries are older selects' counts.
  nb::ndarray<nb::numpy, int32_t> counts(int64_t rows) {
    if (rows < 0 || static_cast<uint64_t>(rows) > last_rows_)
      raise_value("rows: " + std::to_string(rows) + " is outside 0.." + std::to_string(last_rows_) +
                  " (the rows the last select wrote)");
    nb::object self = nb::find(this);
    return nb::ndarray<nb::numpy, int32_t>(counts_.data(), {static_cast<size_t>(rows)}, self);
  }

  void observe(IndexArg slots_obj, int64_t layer, ArrayArg logits_obj, ArrayArg topk_obj) {
    CallGuard guard(busy_, "Serving.observe");
    const int32_t l = int_arg(layer, "layer", 0, s_->options().num_layers - 1);
    const auto slots = slot_array(slots_obj);
    InArray logits = in_array(logits_obj, "logits");
    const float* lg = array_data<const float>(logits, "logits", 2);
    check_rows(slots, logits.shape(0), "logits");
    InArray topk;
    int64_t tk_stride = 0;
    const int32_t* tk = topk_rows(topk_obj, logits.shape(0), &topk, &tk_stride);
    check(s_->observe(slots.data, static_cast<int32_t>(slots.dim(0)), l, lg,
                      static_cast<int64_t>(logits.shape(1)), static_cast<int64_t>(logits.shape(1)), tk,
                      tk_stride));
  }

  void observe_scored(IndexArg slots_obj, int64_t layer, ArrayArg scored_obj, ArrayArg topk_obj) {
    CallGuard guard(busy_, "Serving.observe_scored");
    const int32_t l = int_arg(layer, "layer", 0, s_->options().num_layers - 1);
    const auto slots = slot_array(slots_obj);
    InArray scored = in_array(scored_obj, "scored");
    const float* sc = array_data<const float>(scored, "scored", 2);
    check_rows(slots, scored.shape(0), "scored");
    InArray topk;
    int64_t tk_stride = 0;
    const int32_t* tk = topk_rows(topk_obj, scored.shape(0), &topk, &tk_stride);
    check(s_->observe_scored(slots.data, static_cast<int32_t>(slots.dim(0)), l, sc,
                             static_cast<int64_t>(scored.shape(1)), tk, tk_stride));
  }

  void commit(IndexArg slots_obj, IndexArg accepted_obj) {
    CallGuard guard(busy_, "Serving.commit");
    const auto slots = slot_array(slots_obj);
    const int64_t batch = slots.dim(0);
    std::vector<int32_t> zeros;
    const int32_t* acc = nullptr;
    IndexArray<int32_t> accepted;
    if (accepted_obj.is_none()) {
      zeros.assign(static_cast<size_t>(batch), 0);
      acc = zeros.data();
    } else {
      accepted = index_i32(accepted_obj, {"accepted", {batch}, 0, spin::kMaxNextN - 1, "slots", false});
      acc = accepted.data;
    }
    check(s_->commit(slots.data, static_cast<int32_t>(batch), acc));
  }

  void prefill(IndexArg slots_obj, int64_t layer, IndexArg seq_lens_obj, ArrayArg logits_obj) {
    CallGuard guard(busy_, "Serving.prefill");
    const int32_t l = int_arg(layer, "layer", 0, s_->options().num_layers - 1);
    const auto slots = slot_array(slots_obj);
    const int64_t batch = slots.dim(0);
    const auto seq = index_i64(seq_lens_obj, {"seq_lens", {batch}, 0, INT64_MAX, "slots", false});
    InArray logits = in_array(logits_obj, "logits");
    const float* lg = array_data<const float>(logits, "logits", 2);
    if (static_cast<int64_t>(logits.shape(0)) != batch)
      raise_value("logits: expected [batch, >= seq_len] rows with batch = len(slots) = " + std::to_string(batch) +
                  ", got " + shape_text(logits));
    check(s_->prefill(slots.data, static_cast<int32_t>(batch), l, seq.data, lg,
                      static_cast<int64_t>(logits.shape(1))));
  }

  spin::ServingPredictor& get() { return *s_; }
  int32_t slot_arg(int64_t slot) const {
    if (slot < 0 || slot >= s_->options().max_requests)
      raise_range("slot: " + std::to_string(slot) + " is outside 0.." + std::to_string(s_->options().max_requests - 1));
    return static_cast<int32_t>(slot);
  }
  // Queries answer "free" for any slot outside the object, as the library does (no int32 wrap).
  static int32_t query_slot(int64_t slot) { return slot < 0 || slot > INT32_MAX ? -1 : static_cast<int32_t>(slot); }
  std::atomic<bool>& busy() { return busy_; }

 private:
  IndexArray<int32_t> slot_array(nb::handle obj) const {
    return index_i32(obj, {"slots", {-1}, 0, s_->options().max_requests - 1});
  }
  // Rows of a logits array must be exactly batch · next_n of the open step (fewer would be read
  // past their end, more would be ignored).
  void check_rows(const IndexArray<int32_t>& slots, size_t rows, const char* name) const {
    const int64_t batch = slots.dim(0);
    if (batch == 0) {
      if (rows != 0) raise_value(std::string(name) + ": " + std::to_string(rows) + " rows for no slots");
      return;
    }
    const int32_t next_n = s_->open_next_n(slots.data[0]);
    if (next_n == 0) return;  // no open step: the library names the protocol error
    const int64_t want = batch * next_n;
    if (static_cast<int64_t>(rows) != want)
      raise_value(std::string(name) + ": expected batch · next_n = " + std::to_string(batch) + " · " +
                  std::to_string(next_n) + " = " + std::to_string(want) + " rows (the open step's), got " +
                  std::to_string(rows));
  }
  const int32_t* topk_rows(nb::handle obj, size_t rows, InArray* holder, int64_t* stride) const {
    if (obj.is_none()) return nullptr;
    *holder = in_array(obj, "topk");
    const int32_t* tk = array_data<const int32_t>(*holder, "topk", 2);
    if (holder->shape(0) != rows)
      raise_value("topk: expected " + std::to_string(rows) + " rows like the logits, got " + shape_text(*holder));
    if (static_cast<int64_t>(holder->shape(1)) < s_->options().config.topk)
      raise_value("topk: expected at least topk = " + std::to_string(s_->options().config.topk) + " columns, got " +
                  shape_text(*holder));
    *stride = static_cast<int64_t>(holder->shape(1));
    return tk;
  }
  std::unique_ptr<spin::ServingPredictor> s_;
  std::vector<int32_t> blocks_;
  std::vector<int32_t> counts_;
  size_t last_rows_ = 0;  // rows (batch · next_n) the last select wrote
  std::atomic<bool> busy_{false};
};

}  // namespace

void bind_serving(nb::module_& m) {
  nb::class_<Serving>(m, "Serving",
                      "The serving API (include/spin/serving.h): one object for the whole batch, "
                      "state indexed by request slot, every buffer preallocated. Per step: "
                      "select/observe every layer, then commit; add/drop slots as requests come "
                      "and go. Exploration is keyed on the request id, not the slot.")
      .def(nb::init<int64_t, int64_t, int64_t, const std::string&, ConfigArg, int64_t, int64_t>(),
           nb::arg("max_requests"), nb::arg("num_layers"), nb::arg("max_entries"),
           nb::arg("predictor") = "spin", nb::arg("config").none() = nb::none(), nb::arg("max_next_n") = 1,
           nb::arg("compress_ratio") = 1,
           "Allocates every slot's state for max_requests requests × num_layers indexer layers × "
           "the blocks of max_entries entries (contexts up to max_entries, up to max_next_n rows "
           "per step). predictor: any predictor_info() row with can_serve.")
      .def_prop_ro("max_blocks", [](Serving& s) { return s.get().max_blocks(); })
      .def_prop_ro("block_entries", [](Serving& s) { return s.get().block_entries(); })
      .def_prop_ro("memory_bytes", [](Serving& s) { return s.get().memory_bytes(); })
      .def_prop_ro("config", [](Serving& s) { return config_dict(s.get().options().config); })
      .def("add", [](Serving& s, int64_t slot, int64_t rid) {
             CallGuard guard(s.busy(), "Serving.add");
             check(s.get().add(s.slot_arg(slot), rid));
           },
           nb::arg("slot"), nb::arg("request_id"),
           "Starts request `request_id` in free `slot` (empty state).")
      .def("drop", [](Serving& s, int64_t slot) {
             CallGuard guard(s.busy(), "Serving.drop");
             check(s.get().drop(s.slot_arg(slot)));
           }, nb::arg("slot"),
           "Frees `slot` (finished or preempted request).")
      .def("active", [](Serving& s, int64_t slot) { return s.get().active(Serving::query_slot(slot)); }, nb::arg("slot"))
      .def("request_id", [](Serving& s, int64_t slot) { return s.get().request_id(Serving::query_slot(slot)); },
           nb::arg("slot"))
      .def("step", [](Serving& s, int64_t slot) { return s.get().step(Serving::query_slot(slot)); }, nb::arg("slot"))
      .def("select", &Serving::select, nb::arg("slots"), nb::arg("layer"),
           nb::arg("seq_lens"), nb::arg("next_n") = 1, nb::arg("out") = nb::none(),
           "Blocks to score: int32 [batch · next_n, max_blocks], row i·next_n + j for row j of "
           "slots[i], ascending, -1 padded (every row of a request gets its rows' union). "
           "seq_lens: tokens cached per slot including the step's rows. Without `out` the result "
           "is a view of the object's buffer, valid until the next select.")
      .def("counts", &Serving::counts, nb::arg("rows"),
           "Valid blocks per row of the last select (int32 [rows], a view; rows at most the batch · next_n it wrote).")
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
