// spin_dsa.indexer_scores / spin_dsa.topk: the kernels (spin/indexer.h, spin/topk.h) over numpy
// arrays or torch CPU tensors, in place: inputs are read where they are, the output is written
// into `out` when given (else a new array).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <limits>
#include <string>
#include <vector>

#include "common.h"
#include "spin/cpu.h"
#include "spin/lab/diagnose.h"
#include "spin/lab/engine.h"
#include "spin/geometry.h"
#include "spin/indexer.h"
#include "spin/memory.h"
#include "spin/topk.h"

namespace spin_py {

namespace {

spin::IndexerImpl indexer_impl(const std::string& name) {
  if (name == "auto") return spin::IndexerImpl::kAuto;
  for (spin::IndexerImpl i : spin::indexer_impls())
    if (name == spin::indexer_impl_name(i)) return i;
  std::string known = "auto";
  for (spin::IndexerImpl i : spin::indexer_impls()) known += std::string(", ") + spin::indexer_impl_name(i);
  raise_value("impl: unknown indexer implementation '" + name + "' (known: " + known + ")");
}

// Writes into `out` (float32 [rows, >= cols]) or a new array (sized against the memory budget
// first: a huge logits_cols or context is refused in GiB, not as a std::bad_alloc).
ArrayOut float_out(ArrayOut out, size_t rows, size_t cols, float** data, int64_t* stride) {
  if (!out.is_none()) {
    OutArray o = out_array(out, "out");
    *data = array_data<float>(o, "out", 2);
    if (o.shape(0) != rows || o.shape(1) < cols)
      raise_value("out: expected float32 [" + std::to_string(rows) + ", >= " + std::to_string(cols) + "], got " +
                  shape_text(o));
    *stride = static_cast<int64_t>(o.shape(1));
    return out;
  }
  const int64_t cells = checked_mul(static_cast<int64_t>(rows), static_cast<int64_t>(cols), "logits");
  check_fits(static_cast<double>(cells) * sizeof(float),
             "indexer_scores: logits [" + std::to_string(rows) + ", " + std::to_string(cols) + "]");
  auto arr = owned_array(std::vector<float>(static_cast<size_t>(cells)), {rows, cols});
  *data = arr.data();
  *stride = static_cast<int64_t>(cols);
  return nb::borrow<ArrayOut>(nb::cast(arr));
}

// `out` must not share a byte with an input the kernel reads while it writes.
template <typename A>
void check_no_alias(float* out, size_t out_bytes, const A& input, const char* name) {
  if (overlaps(out, out_bytes, input.data(), input.nbytes()))
    raise_value(std::string("out: shares memory with ") + name + " (pass a separate array)");
}

// A block mask (block_ids with block_offsets [masks + 1]): offsets within the ids, both or neither.
struct BlockMask {
  IndexArray<int32_t> ids, offsets;
  bool present = false;
};
BlockMask block_mask(nb::handle ids_obj, nb::handle offsets_obj, int64_t masks, const char* masks_text) {
  BlockMask m;
  if (ids_obj.is_none() && offsets_obj.is_none()) return m;
  if (ids_obj.is_none() || offsets_obj.is_none())
    raise_value(std::string(ids_obj.is_none() ? "block_ids" : "block_offsets") +
                ": expected with " + (ids_obj.is_none() ? "block_offsets" : "block_ids") + " (a mask needs both)");
  m.ids = index_i32(ids_obj, {"block_ids", {-1}, 0, INT32_MAX});
  m.offsets = index_i32(offsets_obj, {"block_offsets", {masks + 1}, 0, m.ids.dim(0), masks_text});
  m.present = true;
  return m;
}

ArrayOut indexer(ArrayArg key_cache_obj, IndexArg block_table_obj, IndexArg context_lens_obj, ArrayArg q_obj,
                 ArrayArg weights_obj, int64_t page_size, int64_t compress_ratio, IndexArg block_ids_obj,
                 IndexArg block_offsets_obj, int64_t block_pages, int64_t logits_cols, ArrayOut out,
                 const std::string& impl_name, int64_t threads) {
  // Scalars first: nothing below may divide by compress_ratio or start threads before they hold.
  spin::IndexerParams p;
  p.page_size = int_arg(page_size, "page_size", 1, 1 << 16);
  p.compress_ratio = int_arg(compress_ratio, "compress_ratio", 1, 64);
  p.block_pages = int_arg(block_pages, "block_pages", 1, 1 << 16);
  const spin::IndexerOptions options{indexer_impl(impl_name), threads_arg(threads)};
  InArray key_cache = in_array(key_cache_obj, "key_cache");
  p.key_cache = array_data<const uint8_t>(key_cache, "key_cache", -1);
  const int64_t page_bytes = spin::IndexerPageLayout{p.page_size}.page_bytes();
  if (key_cache.nbytes() % static_cast<size_t>(page_bytes) != 0)
    raise_value("key_cache: " + std::to_string(key_cache.nbytes()) + " bytes is not a whole number of " +
                std::to_string(page_bytes) + "-byte pages (page_size " + std::to_string(p.page_size) + ")");
  const size_t num_pages = key_cache.nbytes() / static_cast<size_t>(page_bytes);
  if (num_pages > INT32_MAX) raise_value("key_cache: " + std::to_string(num_pages) + " pages do not fit int32");
  p.num_pages = static_cast<int32_t>(num_pages);
  const auto cl = index_i64(context_lens_obj, {"context_lens", {-1}, 0, int64_t{1} << 40, nullptr, false});
  const int64_t batch = cl.dim(0);
  p.batch = static_cast<int32_t>(batch);
  p.context_lens = cl.data;
  const auto bt = index_i32(block_table_obj, {"block_table", {batch, -1}, INT32_MIN, INT32_MAX, "len(context_lens)"});
  if (bt.dim(1) > INT32_MAX) raise_value("block_table: more than 2^31 - 1 pages per request");
  p.block_table = bt.data;
  p.block_table_stride = static_cast<int32_t>(bt.dim(1));
  InArray q = in_array(q_obj, "q");
  p.q = array_data<const uint8_t>(q, "q", 4);
  if (static_cast<int64_t>(q.shape(0)) != batch || q.shape(3) != 128 || q.shape(1) < 1 ||
      q.shape(1) > static_cast<size_t>(spin::kMaxNextN) || q.shape(2) < 1 || q.shape(2) > 1024)
    raise_value("q: expected uint8 [batch = " + std::to_string(batch) + ", next_n 1.." +
                std::to_string(spin::kMaxNextN) + ", heads, 128], got " + shape_text(q));
  p.next_n = static_cast<int32_t>(q.shape(1));
  p.num_heads = static_cast<int32_t>(q.shape(2));
  InArray weights = in_array(weights_obj, "weights");
  p.weights = array_data<const float>(weights, "weights", 3);
  if (weights.shape(0) != q.shape(0) || weights.shape(1) != q.shape(1) || weights.shape(2) != q.shape(2))
    raise_value("weights: expected float32 [batch, next_n, heads] like q " + shape_text(q) + ", got " +
                shape_text(weights));
  const BlockMask mask = block_mask(block_ids_obj, block_offsets_obj, batch, "len(context_lens) + 1");
  if (mask.present) {
    p.block_ids = mask.ids.data;
    p.block_offsets = mask.offsets.data;
  }
  int64_t most = 1;
  for (int64_t b = 0; b < batch; ++b)
    most = std::max(most, spin::visible_entries(p.context_lens[b], p.next_n, p.next_n - 1, p.compress_ratio));
  if (logits_cols < 0) logits_cols = most;
  if (logits_cols > INT32_MAX) raise_value("logits_cols: " + std::to_string(logits_cols) + " is above 2^31 - 1");
  const size_t rows = static_cast<size_t>(batch) * static_cast<size_t>(p.next_n);
  ArrayOut result = float_out(out, rows, static_cast<size_t>(logits_cols), &p.logits, &p.logits_stride);
  p.logits_cols = logits_cols;
  const size_t out_bytes = rows * static_cast<size_t>(p.logits_stride) * sizeof(float);
  check_no_alias(p.logits, out_bytes, key_cache, "key_cache");
  check_no_alias(p.logits, out_bytes, q, "q");
  check_no_alias(p.logits, out_bytes, weights, "weights");
  spin::Status st;
  {
    nb::gil_scoped_release release;  // only library code below: every argument is checked above
    st = spin::indexer_scores(p, options);
  }
  check(st);
  return result;
}

ArrayOut topk(ArrayArg scores_obj, int64_t k, IndexArg visible_obj, IndexArg block_ids_obj,
              IndexArg block_offsets_obj, int64_t rows_per_mask, int64_t block_entries, ArrayOut out,
              int64_t threads) {
  spin::TopkParams p;
  p.topk = int_arg(k, "k", 1, INT32_MAX);
  const int nthreads = threads_arg(threads);
  InArray scores = in_array(scores_obj, "scores");
  p.scores = array_data<const float>(scores, "scores", 2);
  if (scores.shape(0) > INT32_MAX || scores.shape(1) > INT32_MAX)
    raise_value("scores: " + shape_text(scores) + " is above 2^31 - 1 rows or columns");
  const int64_t rows = static_cast<int64_t>(scores.shape(0));
  p.rows = static_cast<int32_t>(rows);
  p.cols = static_cast<int64_t>(scores.shape(1));
  p.scores_stride = p.cols;
  IndexArray<int64_t> vis;
  if (!visible_obj.is_none()) {
    vis = index_i64(visible_obj, {"visible_entries", {rows}, 0, p.cols, "scores rows"});
    p.visible_entries = vis.data;
  }
  BlockMask mask;
  if (!block_offsets_obj.is_none() || !block_ids_obj.is_none()) {
    p.rows_per_mask = int_arg(rows_per_mask, "rows_per_mask", 1, INT32_MAX);
    if (rows % p.rows_per_mask != 0)
      raise_value("rows_per_mask: " + std::to_string(rows) + " rows are not a multiple of " +
                  std::to_string(p.rows_per_mask));
    if (block_entries < 1 || block_entries > INT32_MAX)
      raise_value("block_entries: " + std::to_string(block_entries) + " is outside 1..2^31 - 1 (a mask needs it)");
    p.block_entries = block_entries;
    mask = block_mask(block_ids_obj, block_offsets_obj, rows / p.rows_per_mask, "rows / rows_per_mask + 1");
    // A block wholly past the scores' columns is no block of these rows.
    const int64_t n_blocks = (p.cols + block_entries - 1) / block_entries;
    for (int64_t i = 0; i < mask.ids.size(); ++i)
      if (mask.ids.data[i] >= n_blocks)
        raise_range("block_ids[" + std::to_string(i) + "] = " + std::to_string(mask.ids.data[i]) +
                    " is past the " + std::to_string(n_blocks) + " blocks of " + std::to_string(p.cols) + " columns");
    p.block_ids = mask.ids.data;
    p.block_offsets = mask.offsets.data;
  }
  ArrayOut result;
  if (!out.is_none()) {
    OutArray o = out_array(out, "out");
    p.out = array_data<int32_t>(o, "out", 2);
    if (static_cast<int64_t>(o.shape(0)) != rows || o.shape(1) < static_cast<size_t>(p.topk))
      raise_value("out: expected int32 [rows = " + std::to_string(rows) + ", >= k = " + std::to_string(p.topk) +
                  "], got " + shape_text(o));
    p.out_stride = static_cast<int64_t>(o.shape(1));
    const size_t out_bytes = static_cast<size_t>(rows) * static_cast<size_t>(p.out_stride) * sizeof(int32_t);
    if (overlaps(p.out, out_bytes, p.scores, scores.nbytes())) raise_value("out: shares memory with scores");
    if (vis.held.is_valid() && overlaps(p.out, out_bytes, vis.data, vis.held.nbytes()))
      raise_value("out: shares memory with visible_entries");
    if (mask.present && mask.ids.held.is_valid() && overlaps(p.out, out_bytes, mask.ids.data, mask.ids.held.nbytes()))
      raise_value("out: shares memory with block_ids");
    if (mask.present && mask.offsets.held.is_valid() &&
        overlaps(p.out, out_bytes, mask.offsets.data, mask.offsets.held.nbytes()))
      raise_value("out: shares memory with block_offsets");
    result = out;
  } else {
    const int64_t cells = checked_mul(rows, p.topk, "topk output");
    check_fits(static_cast<double>(cells) * sizeof(int32_t),
               "topk: output [" + std::to_string(rows) + ", " + std::to_string(p.topk) + "]");
    auto arr = owned_array(std::vector<int32_t>(static_cast<size_t>(cells), -1),
                           {static_cast<size_t>(rows), static_cast<size_t>(p.topk)});
    p.out = arr.data();
    p.out_stride = p.topk;
    result = nb::borrow<ArrayOut>(nb::cast(arr));
  }
  spin::Status st;
  {
    nb::gil_scoped_release release;
    st = spin::topk(p, {spin::TopkImpl::kAuto, nthreads});
  }
  check(st);
  return result;
}

// The visibility rule (spin/geometry.h) for a batch, in the row order of every kernel here.
nb::ndarray<nb::numpy, int64_t> visible_entries(IndexArg context_lens_obj, int64_t next_n, int64_t compress_ratio) {
  const int32_t n = int_arg(next_n, "next_n", 1, spin::kMaxNextN);
  const int32_t ratio = int_arg(compress_ratio, "compress_ratio", 1, INT32_MAX);
  const auto ctx = index_i64(context_lens_obj, {"context_lens", {-1}, 0, INT64_MAX, nullptr, false});
  const int64_t rows = checked_mul(ctx.dim(0), n, "visible_entries");
  std::vector<int64_t> out(static_cast<size_t>(rows));
  for (int64_t i = 0; i < ctx.dim(0); ++i)
    for (int32_t j = 0; j < n; ++j)
      out[static_cast<size_t>(i * n + j)] = spin::visible_entries(ctx.data[i], n, j, ratio);
  return owned_array(std::move(out), {static_cast<size_t>(rows)});
}

}  // namespace

nb::dict diagnose(const std::string& model, const std::string& gpu, int64_t context, int64_t batch,
                  int64_t next_n, FloatsArg sparsities, double other_ms) {
  spin::DiagnoseInput in;
  auto mp = spin::model_preset(model);
  if (!mp.ok()) raise_status(mp.status());
  auto gp = spin::gpu_preset(gpu);
  if (!gp.ok()) raise_status(gp.status());
  in.model = mp.value();
  in.gpu = gp.value();
  in.context = context;
  in.batch = int_arg(batch, "batch", 1, INT32_MAX);
  in.next_n = int_arg(next_n, "next_n", 1, spin::kMaxNextN);
  in.other_ms = other_ms;
  if (!sparsities.is_none()) {
    in.sparsities.clear();
    nb::object items;
    try {
      items = nb::list(sparsities);
    } catch (nb::python_error&) {
      raise_type("sparsities: expected a sequence of floats");
    }
    for (nb::handle s : items) {
      double v = 0;
      if (!nb::try_cast(s, v) || nb::isinstance<nb::bool_>(s)) raise_type("sparsities: expected floats, got " +
                                                                           nb::cast<std::string>(nb::repr(s)));
      in.sparsities.push_back(v);
    }
  }
  auto r = spin::diagnose(in);
  if (!r.ok()) raise_status(r.status());
  return nb::cast<nb::dict>(nb::module_::import_("json").attr("loads")(spin::diagnose_json(r.value())));
}

void bind_kernels(nb::module_& m) {
  m.def("diagnose", &diagnose, nb::arg("model") = "deepseek-v3.2", nb::arg("gpu") = "h200",
        nb::arg("context") = 131072, nb::arg("batch") = 1, nb::arg("next_n") = 1,
        nb::arg("sparsities") = nb::none(), nb::arg("other_ms") = 0.0,
        "The paper model of one GPU decode step (include/spin/lab/diagnose.h, `spin diagnose --json`): "
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
  m.attr("INDEXER_ENTRY_BYTES") = spin::kEntryBytes;  // one key of an indexer cache page
  m.def("visible_entries", &visible_entries, nb::arg("context_lens"), nb::arg("next_n") = 1,
        nb::arg("compress_ratio") = 1,
        "Entries each row of a step sees (include/spin/geometry.h): int64 [batch·next_n], row j of "
        "request i at i·next_n + j, max(0, context_len - next_n + j + 1) // compress_ratio. "
        "context_lens: tokens cached per request including the step's next_n rows.");
  m.def("topk", &topk, nb::arg("scores"), nb::arg("k"), nb::arg("visible_entries") = nb::none(),
        nb::arg("block_ids") = nb::none(), nb::arg("block_offsets") = nb::none(),
        nb::arg("rows_per_mask") = 1, nb::arg("block_entries") = 0, nb::arg("out") = nb::none(),
        nb::arg("threads") = 0,
        "Per-row top-k (include/spin/topk.h): int32 [rows, k] positions, ascending, -1 padded; ties "
        "to the lower position. With a block mask only the scored blocks' entries are read.");
}

}  // namespace spin_py
