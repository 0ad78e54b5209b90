// spin_dsa.indexer_scores / spin_dsa.topk: the kernels (spin/indexer.h, spin/topk.h) over numpy
// arrays or torch CPU tensors, in place: inputs are read where they are, the output is written
// into `out` when given (else a new array).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "spin/cpu.h"
#include "spin/diagnose.h"
#include "spin/engine.h"
#include "spin/geometry.h"
#include "spin/indexer.h"
#include "spin/topk.h"

namespace spin_py {

namespace {

spin::IndexerImpl indexer_impl(const std::string& name) {
  if (name == "auto") return spin::IndexerImpl::kAuto;
  for (spin::IndexerImpl i : spin::indexer_impls())
    if (name == spin::indexer_impl_name(i)) return i;
  raise_value("impl: unknown indexer implementation '" + name + "'");
}

// Writes into `out` (float32 [rows, >= cols]) or a new array.
nb::object float_out(nb::handle out, size_t rows, size_t cols, float** data, int64_t* stride) {
  if (!out.is_none()) {
    OutArray o = nb::cast<OutArray>(out);
    *data = array_data<float>(o, "out", 2);
    if (o.shape(0) != rows || o.shape(1) < cols)
      raise_value("out: expected [" + std::to_string(rows) + ", >= " + std::to_string(cols) + "]");
    *stride = static_cast<int64_t>(o.shape(1));
    return nb::borrow(out);
  }
  auto arr = owned_array(std::vector<float>(rows * cols), {rows, cols});
  *data = arr.data();
  *stride = static_cast<int64_t>(cols);
  return nb::cast(arr);
}

nb::object indexer(const InArray& key_cache, nb::handle block_table_obj, nb::handle context_lens_obj,
                   const InArray& q, const InArray& weights, int32_t page_size, int32_t compress_ratio,
                   nb::handle block_ids_obj, nb::handle block_offsets_obj, int32_t block_pages,
                   int64_t logits_cols, nb::handle out, const std::string& impl, int threads) {
  spin::IndexerParams p;
  p.key_cache = array_data<const uint8_t>(key_cache, "key_cache", -1);
  p.page_size = page_size;
  const int64_t page_bytes = spin::IndexerPageLayout{page_size}.page_bytes();
  if (page_size < 1 || key_cache.nbytes() % static_cast<size_t>(page_bytes) != 0)
    raise_value("key_cache: " + std::to_string(key_cache.nbytes()) + " bytes is not a whole number of " +
                std::to_string(page_bytes) + "-byte pages (page_size " + std::to_string(page_size) + ")");
  p.num_pages = static_cast<int32_t>(key_cache.nbytes() / static_cast<size_t>(page_bytes));
  InArray bt = as_index_array(block_table_obj, "int32");
  array_data<const int32_t>(bt, "block_table", 2);
  p.block_table = static_cast<const int32_t*>(bt.data());
  p.block_table_stride = static_cast<int32_t>(bt.shape(1));
  InArray cl = as_index_array(context_lens_obj, "int64");
  array_data<const int64_t>(cl, "context_lens", 1);
  p.batch = static_cast<int32_t>(cl.shape(0));
  p.context_lens = static_cast<const int64_t*>(cl.data());
  if (bt.shape(0) != cl.shape(0)) raise_value("block_table: expected [batch, max_pages] with batch = len(context_lens)");
  p.q = array_data<const uint8_t>(q, "q", 4);
  if (q.shape(0) != cl.shape(0) || q.shape(3) != 128)
    raise_value("q: expected uint8 [batch, next_n, heads, 128]");
  p.next_n = static_cast<int32_t>(q.shape(1));
  p.num_heads = static_cast<int32_t>(q.shape(2));
  p.weights = array_data<const float>(weights, "weights", 3);
  if (weights.shape(0) != q.shape(0) || weights.shape(1) != q.shape(1) || weights.shape(2) != q.shape(2))
    raise_value("weights: expected float32 [batch, next_n, heads] like q");
  p.compress_ratio = compress_ratio;
  InArray ids, offs;
  if (!block_offsets_obj.is_none()) {
    ids = as_index_array(block_ids_obj, "int32");
    offs = as_index_array(block_offsets_obj, "int32");
    p.block_ids = static_cast<const int32_t*>(ids.data());
    p.block_offsets = static_cast<const int32_t*>(offs.data());
    if (offs.ndim() != 1 || offs.shape(0) != cl.shape(0) + 1)
      raise_value("block_offsets: expected int32 [batch + 1]");
  }
  p.block_pages = block_pages;
  if (logits_cols < 0) {
    int64_t most = 1;
    for (int32_t b = 0; b < p.batch; ++b)
      most = std::max(most, spin::visible_entries(p.context_lens[b], p.next_n, p.next_n - 1, compress_ratio));
    logits_cols = most;
  }
  const size_t rows = static_cast<size_t>(p.batch) * static_cast<size_t>(p.next_n);
  nb::object result = float_out(out, rows, static_cast<size_t>(logits_cols), &p.logits, &p.logits_stride);
  p.logits_cols = logits_cols;
  spin::Status st;
  {
    nb::gil_scoped_release release;
    st = spin::indexer_scores(p, {indexer_impl(impl), threads});
  }
  check(st);
  return result;
}

nb::object topk(const InArray& scores, int32_t k, nb::handle visible_obj, nb::handle block_ids_obj,
                nb::handle block_offsets_obj, int32_t rows_per_mask, int64_t block_entries,
                nb::handle out, int threads) {
  spin::TopkParams p;
  p.scores = array_data<const float>(scores, "scores", 2);
  p.rows = static_cast<int32_t>(scores.shape(0));
  p.cols = static_cast<int64_t>(scores.shape(1));
  p.scores_stride = p.cols;
  p.topk = k;
  InArray vis, ids, offs;
  if (!visible_obj.is_none()) {
    vis = as_index_array(visible_obj, "int64");
    if (vis.ndim() != 1 || vis.shape(0) != scores.shape(0)) raise_value("visible_entries: expected int64 [rows]");
    p.visible_entries = static_cast<const int64_t*>(vis.data());
  }
  if (!block_offsets_obj.is_none()) {
    ids = as_index_array(block_ids_obj, "int32");
    offs = as_index_array(block_offsets_obj, "int32");
    p.block_ids = static_cast<const int32_t*>(ids.data());
    p.block_offsets = static_cast<const int32_t*>(offs.data());
    p.rows_per_mask = rows_per_mask;
    p.block_entries = block_entries;
    if (rows_per_mask < 1 || offs.ndim() != 1 || offs.shape(0) != scores.shape(0) / static_cast<size_t>(rows_per_mask) + 1)
      raise_value("block_offsets: expected int32 [rows / rows_per_mask + 1]");
  }
  const size_t rows = scores.shape(0);
  nb::object result;
  if (!out.is_none()) {
    OutArray o = nb::cast<OutArray>(out);
    p.out = array_data<int32_t>(o, "out", 2);
    if (o.shape(0) != rows || o.shape(1) < static_cast<size_t>(std::max(k, 0)))
      raise_value("out: expected int32 [rows, >= k]");
    p.out_stride = static_cast<int64_t>(o.shape(1));
    result = nb::borrow(out);
  } else {
    if (k < 1) check(spin::validate_topk_params(p));
    auto arr = owned_array(std::vector<int32_t>(rows * static_cast<size_t>(k)), {rows, static_cast<size_t>(k)});
    p.out = arr.data();
    p.out_stride = k;
    result = nb::cast(arr);
  }
  spin::Status st;
  {
    nb::gil_scoped_release release;
    st = spin::topk(p, {spin::TopkImpl::kAuto, threads});
  }
  check(st);
  return result;
}

}  // namespace

nb::dict diagnose(const std::string& model, const std::string& gpu, int64_t context, int32_t batch,
                  int32_t next_n, nb::handle sparsities, double other_ms) {
  spin::DiagnoseInput in;
  auto mp = spin::model_preset(model);
  if (!mp.ok()) raise_status(mp.status());
  auto gp = spin::gpu_preset(gpu);
  if (!gp.ok()) raise_status(gp.status());
  in.model = mp.value();
  in.gpu = gp.value();
  in.context = context;
  in.batch = batch;
  in.next_n = next_n;
  in.other_ms = other_ms;
  if (!sparsities.is_none()) {
    in.sparsities.clear();
    for (nb::handle s : sparsities) in.sparsities.push_back(nb::cast<double>(s));
  }
  auto r = spin::diagnose(in);
  if (!r.ok()) raise_status(r.status());
  return nb::cast<nb::dict>(nb::module_::import_("json").attr("loads")(spin::diagnose_json(r.value())));
}

void bind_kernels(nb::module_& m) {
  m.def("diagnose", &diagnose, nb::arg("model") = "deepseek-v3.2", nb::arg("gpu") = "h200",
        nb::arg("context") = 131072, nb::arg("batch") = 1, nb::arg("next_n") = 1,
        nb::arg("sparsities") = nb::none(), nb::arg("other_ms") = 0.0,
        "The paper model of one GPU decode step (include/spin/diagnose.h, `spin diagnose --json`): "
        "indexer / top-k / attention ms, the indexer's share and spin's gain per sparsity, with "
        "sources. gpu: h100, h200, b200.");
  m.def("indexer_impls", [] {
    std::vector<std::string> names;
    for (spin::IndexerImpl i : spin::indexer_impls())
      if (spin::indexer_impl_supported(i)) names.push_back(spin::indexer_impl_name(i));
    return names;
  }, "Indexer implementations this CPU runs, fastest first.");
  m.def("cpu_summary", [] { return spin::cpu_summary(); },
        "The CPU model and the kernel ISAs this process may use, with any SPIN_CPU cap (include/spin/cpu.h).");
  m.def("indexer_scores", &indexer, nb::arg("key_cache"), nb::arg("block_table"),
        nb::arg("context_lens"), nb::arg("q"), nb::arg("weights"), nb::arg("page_size") = 64,
        nb::arg("compress_ratio") = 1, nb::arg("block_ids") = nb::none(),
        nb::arg("block_offsets") = nb::none(), nb::arg("block_pages") = 1,
        nb::arg("logits_cols") = -1, nb::arg("out") = nb::none(), nb::arg("impl") = "auto",
        nb::arg("threads") = 0,
        "Lightning-indexer logits over the paged fp8 cache (include/spin/indexer.h): key_cache "
        "uint8 pages [num_pages, page_size·132] (e4m3 values then fp32 scales), block_table int32 "
        "[batch, max_pages], context_lens int64 [batch], q uint8 [batch, next_n, heads, 128], "
        "weights float32 [batch, next_n, heads]. Optional block mask: block_ids int32 (sorted per "
        "request) with block_offsets int32 [batch + 1]. Returns float32 [batch·next_n, cols], -inf "
        "where not scored.");
  m.def("topk", &topk, nb::arg("scores"), nb::arg("k"), nb::arg("visible_entries") = nb::none(),
        nb::arg("block_ids") = nb::none(), nb::arg("block_offsets") = nb::none(),
        nb::arg("rows_per_mask") = 1, nb::arg("block_entries") = 0, nb::arg("out") = nb::none(),
        nb::arg("threads") = 0,
        "Per-row top-k (include/spin/topk.h): int32 [rows, k] positions, ascending, -1 padded; ties "
        "to the lower position. With a block mask only the scored blocks' entries are read.");
}

}  // namespace spin_py
