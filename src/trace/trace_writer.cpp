// Writing trace files: a Trace or ScoreTrace is checked against the schema (trace/trace_schema.h),
// then written as safetensors tensors plus the metadata strings (atomically, by the container).
#include "core/errors.h"
#include "trace/safetensors.h"
#include "trace/trace_schema.h"
#include "spin/trace.h"

namespace spin {

using namespace trace_schema;

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

}  // namespace spin
