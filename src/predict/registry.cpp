// The predictor registry: one row per predictor — its name, what it reads, whether serving can run
// it, whether it explores, where `spin eval` lists it, and its factory. Every layer asks this
// table (make_predictor, the engine, replay, eval, serving, reserve, the Python package) instead
// of comparing names. Adding a predictor: its own file (a PredictorBase subclass and a factory
// function), the factory's declaration and one row below.
#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.h"
#include "predict/registry.h"

namespace spin {

std::unique_ptr<BlockPredictor> make_all_keep(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_random(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_prev_iter(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_prev_layer(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_ema_slot(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_ema_offset(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_spin(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_oracle(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_step_reuse(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_hisa(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_indexcache_2(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_indexcache_4(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_spin_hybrid(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_spin_ic2(const PredictorArgs& a);
std::unique_ptr<BlockPredictor> make_spin_hybrid_ic2(const PredictorArgs& a);

namespace {

struct Row {
  PredictorInfo info;
  PredictorFactory make;
};

using R = PredictorReads;

// Columns: name, reads, can_serve, explores, keeps_all, reuses_previous_topk, eval places (open
// loop, sweep, recorded-trace sweep; 0 = not listed), factory. can_serve: reads only its own state
// (serving has no key cache and no true top-k) and keeps no per-entry memory that grows.
const std::vector<Row>& rows() {
  static const std::vector<Row> kRows = {
      {{"all-keep", R::kOwnState, true, false, true, false, {0, 0, 0}}, make_all_keep},
      {{"random", R::kOwnState, true, false, false, false, {8, 9, 4}}, make_random},
      {{"prev-iter", R::kOwnState, true, false, false, true, {1, 8, 2}}, make_prev_iter},
      {{"prev-layer", R::kOwnState, true, false, false, false, {2, 0, 0}}, make_prev_layer},
      {{"ema-slot", R::kOwnState, true, false, false, false, {3, 0, 0}}, make_ema_slot},
      {{"ema-offset", R::kOwnState, true, false, false, false, {4, 0, 0}}, make_ema_offset},
      {{"spin", R::kOwnState, true, true, false, false, {5, 0, 0}}, make_spin},  // eval: the headline
      {{"oracle", R::kTrueTopk, false, false, false, false, {9, 10, 5}}, make_oracle},
      {{"step-reuse", R::kOwnState, true, false, false, true, {7, 2, 1}}, make_step_reuse},
      {{"hisa", R::kKeys, false, false, false, false, {6, 3, 6}}, make_hisa},
      {{"indexcache-2", R::kOwnState, true, false, false, false, {0, 4, 3}}, make_indexcache_2},
      {{"indexcache-4", R::kOwnState, true, false, false, false, {0, 5, 0}}, make_indexcache_4},
      {{"spin-hybrid", R::kKeys, false, true, false, false, {0, 1, 7}}, make_spin_hybrid},
      {{"spin-ic2", R::kOwnState, true, true, false, false, {0, 6, 8}}, make_spin_ic2},
      {{"spin-hybrid-ic2", R::kKeys, false, true, false, false, {0, 7, 9}}, make_spin_hybrid_ic2},
  };
  return kRows;
}

const Row* find_row(std::string_view name) {
  for (const Row& r : rows()) {
    if (r.info.name == name) return &r;
  }
  return nullptr;
}

}  // namespace

const char* predictor_reads_name(PredictorReads v) {
  switch (v) {
    case PredictorReads::kOwnState: return "own-state";
    case PredictorReads::kKeys: return "keys";
    case PredictorReads::kTrueTopk: return "true-topk";
  }
  return "?";
}

const std::vector<PredictorInfo>& predictor_registry() {
  static const std::vector<PredictorInfo> kInfos = [] {
    std::vector<PredictorInfo> infos;
    for (const Row& r : rows()) infos.push_back(r.info);
    return infos;
  }();
  return kInfos;
}

const PredictorInfo* find_predictor(std::string_view name) {
  for (const PredictorInfo& info : predictor_registry()) {
    if (info.name == name) return &info;
  }
  return nullptr;
}

const std::vector<std::string>& predictor_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const Row& r : rows()) names.push_back(r.info.name);
    return names;
  }();
  return kNames;
}

bool predictor_needs_keys(std::string_view name) {
  const PredictorInfo* info = find_predictor(name);
  return info != nullptr && info->reads == PredictorReads::kKeys;
}

std::vector<std::string> eval_predictors(int32_t PredictorInfo::EvalPlaces::*table) {
  std::vector<const PredictorInfo*> listed;
  for (const PredictorInfo& info : predictor_registry()) {
    if (info.eval.*table > 0) listed.push_back(&info);
  }
  std::stable_sort(listed.begin(), listed.end(),
                   [table](const PredictorInfo* a, const PredictorInfo* b) { return a->eval.*table < b->eval.*table; });
  std::vector<std::string> names;
  for (const PredictorInfo* info : listed) names.push_back(info->name);
  return names;
}

Result<std::unique_ptr<BlockPredictor>> make_predictor(std::string_view name,
                                                       const PredictorConfig& config,
                                                       int32_t num_layers, int64_t request_id) {
  SPIN_RETURN_IF_ERROR(config.validate());
  if (num_layers < 1 || num_layers > 4096)
    return invalid_argument("num_layers {} is outside the supported 1..4096", num_layers);
  const Row* r = find_row(name);
  if (r == nullptr) {
    std::string list;
    for (const std::string& s : predictor_names()) list += (list.empty() ? "" : ", ") + s;
    return invalid_argument("unknown predictor '{}'; supported: {}", name, list);
  }
  return r->make(PredictorArgs{std::string(name), config, num_layers, request_id});
}

}  // namespace spin
