// The predictor registry: one row per predictor — its name, what it reads, whether serving can run
// it, whether it explores, and its factory. Every layer asks this
// table (make_predictor, the engine, replay, eval, serving, reserve, the Python package) instead
// of comparing names. Adding a predictor: its own file (a PredictorBase subclass and a factory
// function), the factory's declaration and one row below.
#include <algorithm>
#include <string>
#include <vector>

#include "core/errors.h"
#include "predict/hisa.h"
#include "predict/predictor_base.h"
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

// One row per predictor, in predictor_names()' order. can_serve: reads only its own state (serving
// has no key cache and no true top-k) and keeps no per-entry memory that grows.
const std::vector<Row>& rows() {
  static const std::vector<Row> kRows = {
      {{.name = "all-keep", .can_serve = true, .keeps_all = true}, make_all_keep},
      {{.name = "random", .can_serve = true}, make_random},
      {{.name = "prev-iter", .can_serve = true, .reuses_previous_topk = true}, make_prev_iter},
      {{.name = "prev-layer", .can_serve = true}, make_prev_layer},
      {{.name = "ema-slot", .can_serve = true}, make_ema_slot},
      {{.name = "ema-offset", .can_serve = true}, make_ema_offset},
      {{.name = "spin", .can_serve = true, .explores = true}, make_spin},
      {{.name = "oracle", .reads = R::kTrueTopk}, make_oracle},
      {{.name = "step-reuse", .can_serve = true, .reuses_previous_topk = true}, make_step_reuse},
      {{.name = "hisa", .reads = R::kKeys}, make_hisa},
      {{.name = "indexcache-2", .can_serve = true}, make_indexcache_2},
      {{.name = "indexcache-4", .can_serve = true}, make_indexcache_4},
      {{.name = "spin-hybrid", .reads = R::kKeys, .explores = true}, make_spin_hybrid},
      {{.name = "spin-ic2", .can_serve = true, .explores = true}, make_spin_ic2},
      {{.name = "spin-hybrid-ic2", .reads = R::kKeys, .explores = true}, make_spin_hybrid_ic2},
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

double planned_bytes(const PredictorInfo& info, const PredictorConfig& config, int32_t num_layers,
                     int64_t max_entries, int32_t max_next_n) {
  // The pooled keys of hisa (one per block) and of the hybrid's probe (one per probe_entries).
  double keys_per_block = 0;
  if (info.reads == PredictorReads::kKeys) {
    const bool hybrid = info.explores;
    keys_per_block = hybrid && config.probe_entries > 0
                         ? static_cast<double>(config.block_entries() / config.probe_entries)
                         : 1.0;
  }
  return PredictorBase::planned_bytes(config, num_layers, max_entries, max_next_n,
                                      keys_per_block * static_cast<double>(kHisaBytesPerBlock));
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
