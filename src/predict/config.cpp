// Predictor config: enum names, validation, one-line printing, key=value parsing, and the budget
// arithmetic every predictor shares (budget = ceil((1 - target_sparsity) · n_blocks), never below
// what top-k needs; selection = forced → exploration → prediction, spin/predict.h).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <system_error>
#include <vector>

#include "core/errors.h"
#include "spin/predict.h"
#include "spin/settings.h"

namespace spin {
namespace {

// One table per enum keeps name ↔ value in a single place.
template <typename E>
struct NameOf {
  E value;
  const char* name;
};
constexpr NameOf<Pooling> kPoolingNames[] = {{Pooling::kMax, "max"},
                                             {Pooling::kMean, "mean"},
                                             {Pooling::kTopkHits, "topk-hits"},
                                             {Pooling::kLse, "lse"}};
constexpr NameOf<ExplorePolicy> kExploreNames[] = {{ExplorePolicy::kUniform, "uniform"},
                                                   {ExplorePolicy::kStalest, "stalest"}};
constexpr NameOf<Combine> kCombineNames[] = {{Combine::kMax, "max"},
                                             {Combine::kWeighted, "weighted"}};
constexpr NameOf<MtpUpdate> kMtpNames[] = {
    {MtpUpdate::kPrefix, "prefix"}, {MtpUpdate::kRow0, "row0"}, {MtpUpdate::kAllRows, "all-rows"}};
constexpr NameOf<BudgetMoves> kBudgetMovesNames[] = {{BudgetMoves::kNone, "none"},
                                                     {BudgetMoves::kLayers, "layers"},
                                                     {BudgetMoves::kSteps, "steps"},
                                                     {BudgetMoves::kBoth, "both"}};

// The name of `v` in `table`; nullptr for a value outside the enum.
template <typename E, size_t N>
const char* name_in(const NameOf<E> (&table)[N], E v) {
  for (const auto& e : table)
    if (e.value == v) return e.name;
  return nullptr;
}

// The same, "?" for a value outside the enum (what the *_name functions print).
template <typename E, size_t N>
const char* printable_name(const NameOf<E> (&table)[N], E v) {
  const char* n = name_in(table, v);
  return n ? n : "?";
}

template <typename E, size_t N>
std::string names_list(const NameOf<E> (&table)[N]) {
  std::string s;
  for (const auto& e : table) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

template <typename E, size_t N>
Result<E> value_in(const NameOf<E> (&table)[N], std::string_view name, const char* what) {
  for (const auto& e : table)
    if (name == e.name) return e.value;
  return invalid_argument("unknown {} '{}'; supported: {}", what, name, names_list(table));
}

Status parse_double(const std::string& key, const std::string& text, double* out) {
  double v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty() || !std::isfinite(v))
    return invalid_argument("{}: '{}' is not a finite number", key, text);
  *out = v;
  return ok_status();
}

template <typename Int>
Status parse_int(const std::string& key, const std::string& text, Int* out) {
  Int v = 0;
  const char* end = text.data() + text.size();
  const auto [ptr, ec] = std::from_chars(text.data(), end, v);
  if (ec != std::errc() || ptr != end || text.empty())
    return invalid_argument("{}: '{}' is not an integer in range", key, text);
  *out = v;
  return ok_status();
}

}  // namespace

const char* pooling_name(Pooling v) { return printable_name(kPoolingNames, v); }
const char* explore_policy_name(ExplorePolicy v) { return printable_name(kExploreNames, v); }
const char* combine_name(Combine v) { return printable_name(kCombineNames, v); }
const char* mtp_update_name(MtpUpdate v) { return printable_name(kMtpNames, v); }
const char* budget_moves_name(BudgetMoves v) { return printable_name(kBudgetMovesNames, v); }
Result<Pooling> pooling_from_name(std::string_view name) {
  return value_in(kPoolingNames, name, "pooling");
}
Result<ExplorePolicy> explore_policy_from_name(std::string_view name) {
  return value_in(kExploreNames, name, "explore_policy");
}
Result<Combine> combine_from_name(std::string_view name) {
  return value_in(kCombineNames, name, "combine");
}
Result<MtpUpdate> mtp_update_from_name(std::string_view name) {
  return value_in(kMtpNames, name, "mtp_update");
}
Result<BudgetMoves> budget_moves_from_name(std::string_view name) {
  return value_in(kBudgetMovesNames, name, "budget_moves");
}

namespace {

// ---- The field table: each PredictorConfig field once, with how it prints, parses and checks ----

using Config = PredictorConfig;

struct Field {
  const char* name;
  std::string (*print)(const Config& c);
  Status (*set)(Config& c, const std::string& key, const std::string& text);
  Status (*check)(const Config& c, const char* name);  // its own range (cross-field: kRules)
};

template <auto M>
std::string print_value(const Config& c) {
  return fmt::format("{}", c.*M);  // doubles in the shortest form that reads back the same
}
template <auto M, const auto& Table>
std::string print_enum(const Config& c) {
  return printable_name(Table, c.*M);
}
template <auto M>
Status set_double(Config& c, const std::string& key, const std::string& text) {
  return parse_double(key, text, &(c.*M));
}
template <auto M>
Status set_int(Config& c, const std::string& key, const std::string& text) {
  return parse_int(key, text, &(c.*M));
}
template <auto M, const auto& Table>
Status set_enum(Config& c, const std::string& key, const std::string& text) {
  auto v = value_in(Table, text, key.c_str());
  if (!v.ok()) return v.status();
  c.*M = v.value();
  return ok_status();
}
template <auto M, const auto& Table>
Status check_enum(const Config& c, const char* name) {
  if (name_in(Table, c.*M)) return ok_status();
  return invalid_argument("{} {} unknown; supported: {}", name, static_cast<int>(c.*M), names_list(Table));
}

Status no_check(const Config&, const char*) { return ok_status(); }

// Written as !(in range) so that NaN fails too.
const Field kFields[] = {
    {"target_sparsity", print_value<&Config::target_sparsity>, set_double<&Config::target_sparsity>,
     [](const Config& c, const char*) {
       return c.target_sparsity >= 0.0 && c.target_sparsity < 1.0
                  ? ok_status()
                  : invalid_argument("target_sparsity {} is outside [0, 1)", c.target_sparsity);
     }},
    {"explicit_budget_blocks", print_value<&Config::explicit_budget_blocks>, set_int<&Config::explicit_budget_blocks>,
     [](const Config& c, const char*) {
       return c.explicit_budget_blocks >= -1
                  ? ok_status()
                  : invalid_argument("explicit_budget_blocks {} must be -1 (use target_sparsity) or ≥ 0",
                                     c.explicit_budget_blocks);
     }},
    {"sink_blocks", print_value<&Config::sink_blocks>, set_int<&Config::sink_blocks>,
     [](const Config& c, const char*) {
       return c.sink_blocks >= 0 ? ok_status() : invalid_argument("sink_blocks {} must be ≥ 0", c.sink_blocks);
     }},
    {"local_blocks", print_value<&Config::local_blocks>, set_int<&Config::local_blocks>,
     [](const Config& c, const char*) {
       return c.local_blocks >= 0 ? ok_status() : invalid_argument("local_blocks {} must be ≥ 0", c.local_blocks);
     }},
    {"explore_ratio", print_value<&Config::explore_ratio>, set_double<&Config::explore_ratio>,
     [](const Config& c, const char*) {
       return c.explore_ratio >= 0.0 && c.explore_ratio <= 1.0
                  ? ok_status()
                  : invalid_argument("explore_ratio {} is outside [0, 1]", c.explore_ratio);
     }},
    {"explore_churn", print_value<&Config::explore_churn>, set_double<&Config::explore_churn>,
     [](const Config& c, const char*) {
       return c.explore_churn >= 0.0 && c.explore_churn <= 1.0
                  ? ok_status()
                  : invalid_argument("explore_churn {} is outside [0, 1]", c.explore_churn);
     }},
    {"explore_policy", print_enum<&Config::explore_policy, kExploreNames>,
     set_enum<&Config::explore_policy, kExploreNames>, check_enum<&Config::explore_policy, kExploreNames>},
    {"alpha", print_value<&Config::alpha>, set_double<&Config::alpha>,
     [](const Config& c, const char*) {
       return c.alpha > 0.0 && c.alpha <= 1.0 ? ok_status() : invalid_argument("alpha {} is outside (0, 1]", c.alpha);
     }},
    {"beta", print_value<&Config::beta>, set_double<&Config::beta>,
     [](const Config& c, const char*) {
       return c.beta > 0.0 && c.beta <= 1.0 ? ok_status() : invalid_argument("beta {} is outside (0, 1]", c.beta);
     }},
    {"combine", print_enum<&Config::combine, kCombineNames>, set_enum<&Config::combine, kCombineNames>,
     check_enum<&Config::combine, kCombineNames>},
    {"combine_weight", print_value<&Config::combine_weight>, set_double<&Config::combine_weight>,
     [](const Config& c, const char*) {
       return c.combine_weight >= 0.0 && c.combine_weight <= 1.0
                  ? ok_status()
                  : invalid_argument("combine_weight {} is outside [0, 1]", c.combine_weight);
     }},
    {"topk_first", print_value<&Config::topk_first>, set_int<&Config::topk_first>,
     [](const Config& c, const char*) {
       return c.topk_first == 0 || c.topk_first == 1 ? ok_status()
                                                     : invalid_argument("topk_first {} must be 0 or 1", c.topk_first);
     }},
    {"recent_blocks", print_value<&Config::recent_blocks>, set_int<&Config::recent_blocks>,
     [](const Config& c, const char*) {
       return c.recent_blocks >= 0 && c.recent_blocks <= kMaxRecentBlocks
                  ? ok_status()
                  : invalid_argument("recent_blocks {} is outside [0, {}]", c.recent_blocks, kMaxRecentBlocks);
     }},
    {"adapt", print_value<&Config::adapt>, set_int<&Config::adapt>,
     [](const Config& c, const char*) {
       return c.adapt == 0 || c.adapt == 1 ? ok_status()
                                                     : invalid_argument("adapt {} must be 0 or 1", c.adapt);
     }},
    {"pooling", print_enum<&Config::pooling, kPoolingNames>, set_enum<&Config::pooling, kPoolingNames>,
     check_enum<&Config::pooling, kPoolingNames>},
    {"pool_depth", print_value<&Config::pool_depth>, set_double<&Config::pool_depth>,
     [](const Config& c, const char*) {
       return c.pool_depth >= 0.0 && c.pool_depth <= 1.0
                  ? ok_status()
                  : invalid_argument("pool_depth {} is outside [0, 1]", c.pool_depth);
     }},
    {"mtp_update", print_enum<&Config::mtp_update, kMtpNames>, set_enum<&Config::mtp_update, kMtpNames>,
     check_enum<&Config::mtp_update, kMtpNames>},
    {"probe_share", print_value<&Config::probe_share>, set_double<&Config::probe_share>,
     [](const Config& c, const char*) {
       return c.probe_share >= 0.0 && c.probe_share <= 1.0
                  ? ok_status()
                  : invalid_argument("probe_share {} is outside [0, 1]", c.probe_share);
     }},
    {"probe_blend", print_value<&Config::probe_blend>, set_double<&Config::probe_blend>,
     [](const Config& c, const char*) {
       return c.probe_blend >= 0.0 && c.probe_blend <= 1.0
                  ? ok_status()
                  : invalid_argument("probe_blend {} is outside [0, 1]", c.probe_blend);
     }},
    {"probe_adapt", print_value<&Config::probe_adapt>, set_int<&Config::probe_adapt>,
     [](const Config& c, const char*) {
       return c.probe_adapt == 0 || c.probe_adapt == 1 ? ok_status()
                                                       : invalid_argument("probe_adapt {} must be 0 or 1", c.probe_adapt);
     }},
    {"probe_interval", print_value<&Config::probe_interval>, set_int<&Config::probe_interval>,
     [](const Config& c, const char*) {
       return c.probe_interval >= 1 ? ok_status() : invalid_argument("probe_interval {} must be ≥ 1", c.probe_interval);
     }},
    {"probe_entries", print_value<&Config::probe_entries>, set_int<&Config::probe_entries>, no_check},  // kRules
    {"budget_moves", print_enum<&Config::budget_moves, kBudgetMovesNames>,
     set_enum<&Config::budget_moves, kBudgetMovesNames>, check_enum<&Config::budget_moves, kBudgetMovesNames>},
    {"budget_move_max", print_value<&Config::budget_move_max>, set_double<&Config::budget_move_max>,
     [](const Config& c, const char*) {
       return c.budget_move_max >= 0.0 && c.budget_move_max < 1.0
                  ? ok_status()
                  : invalid_argument("budget_move_max {} is outside [0, 1)", c.budget_move_max);
     }},
    {"page_size", print_value<&Config::page_size>, set_int<&Config::page_size>,
     [](const Config& c, const char*) {
       return c.page_size > 0 ? ok_status() : invalid_argument("page_size {} must be > 0", c.page_size);
     }},
    {"block_pages", print_value<&Config::block_pages>, set_int<&Config::block_pages>,
     [](const Config& c, const char*) {
       return c.block_pages > 0 ? ok_status() : invalid_argument("block_pages {} must be > 0", c.block_pages);
     }},
    {"topk", print_value<&Config::topk>, set_int<&Config::topk>,
     [](const Config& c, const char*) { return c.topk > 0 ? ok_status() : invalid_argument("topk {} must be > 0", c.topk); }},
    {"seed", print_value<&Config::seed>, set_int<&Config::seed>, no_check},
};

// Rules over several fields, checked after every field's own range.
Status check_block_size(const Config& c) {
  // 2^20 entries per block keeps every block·entries product far inside int64 and the per-block
  // hit counts inside int32; real blocks are 64–256 entries.
  const int64_t entries = static_cast<int64_t>(c.page_size) * c.block_pages;
  if (entries > (int64_t{1} << 20))
    return invalid_argument("page_size·block_pages = {} exceeds the supported 2^20 entries", entries);
  return ok_status();
}
Status check_probe_entries(const Config& c) {
  if (c.probe_entries < 0 || (c.probe_entries > 0 && c.block_entries() % c.probe_entries != 0))
    return invalid_argument("probe_entries {} must be 0 (one key per block) or divide the block's {} entries",
                            c.probe_entries, c.block_entries());
  return ok_status();
}
constexpr Status (*kRules[])(const Config&) = {check_block_size, check_probe_entries};

std::string field_names() {
  std::string s;
  for (const Field& f : kFields) s += (s.empty() ? "" : ", ") + std::string(f.name);
  return s;
}

}  // namespace

Status PredictorConfig::validate() const {
  for (const Field& f : kFields) SPIN_RETURN_IF_ERROR(f.check(*this, f.name));
  for (auto rule : kRules) SPIN_RETURN_IF_ERROR(rule(*this));
  return ok_status();
}

std::string PredictorConfig::to_string() const {
  std::string s;
  for (const Field& f : kFields) s += fmt::format("{}{}={}", s.empty() ? "" : " ", f.name, f.print(*this));
  return s;
}

namespace {

// Named presets: fields set in order over the current config. "paper" is SPIN as published
// (arXiv 2610.09025; ../shared/reference/peers_dec2026.md §1): EMA α 0.5, 5 % uniform random
// exploration at every step (not scaled by churn), max pooling of a block's best score, and none of
// spin's additions (the last top-k's blocks first, the recency window, deep pooling, moving budgets).
// "default" sets the same fields back to PredictorConfig{}'s values, so it undoes any preset.
struct Preset {
  const char* name;
  const char* fields;  // "key=value ..." ("" = the keys of the other presets, at the defaults)
};
constexpr Preset kPresets[] = {
    {"default", ""},
    {"paper",
     "alpha=0.5 explore_ratio=0.05 explore_churn=0 explore_policy=uniform pooling=max pool_depth=0 "
     "topk_first=0 recent_blocks=0 adapt=0 budget_moves=none"},
};

std::string preset_list() {
  std::string s;
  for (const Preset& p : kPresets) s += (s.empty() ? "" : ", ") + std::string(p.name);
  return s;
}

// The default config's value of every key some preset sets: what "default" applies.
std::string default_fields() {
  const PredictorConfig defaults;
  std::string out;
  for (const Preset& p : kPresets) {
    (void)for_each_setting(p.fields, [&](const std::string& key, const std::string&) {
      for (const Field& f : kFields)
        if (key == f.name && out.find(key + "=") == std::string::npos)
          out += fmt::format("{}{}={}", out.empty() ? "" : " ", key, f.print(defaults));
      return ok_status();
    });
  }
  return out;
}

}  // namespace

const std::vector<std::string>& preset_names() {
  static const std::vector<std::string> kNames = [] {
    std::vector<std::string> names;
    for (const Preset& p : kPresets) names.emplace_back(p.name);
    return names;
  }();
  return kNames;
}

Status PredictorConfig::apply_preset(std::string_view name) {
  for (const Preset& p : kPresets) {
    if (name != p.name) continue;
    const std::string fields = *p.fields != '\0' ? std::string(p.fields) : default_fields();
    return parse(fields);
  }
  return invalid_argument("unknown preset '{}'; supported: {}", name, preset_list());
}

Status PredictorConfig::set(const std::string& key, const std::string& value) {
  if (key == kPresetKey) return apply_preset(value);
  for (const Field& f : kFields) {
    if (key == f.name) return f.set(*this, key, value);
  }
  return invalid_argument("unknown predictor config key '{}'; supported: {}, {}", key, kPresetKey, field_names());
}

Status PredictorConfig::parse(std::string_view pairs) {
  return for_each_setting(pairs, [this](const std::string& key, const std::string& value) { return set(key, value); });
}

int64_t blocks_for_entries(const PredictorConfig& config, int64_t entries) {
  const int64_t e = config.block_entries();
  return entries <= 0 ? 0 : (entries + e - 1) / e;
}

int64_t blocks_for_topk(const PredictorConfig& config) {
  return blocks_for_entries(config, config.topk);
}

int64_t budget_blocks(const PredictorConfig& config, int64_t n_blocks) {
  if (n_blocks <= 0) return 0;
  int64_t b;
  if (config.explicit_budget_blocks >= 0) {
    b = config.explicit_budget_blocks;
  } else {
    // The 1e-9 keeps (1 - 0.3)·10 = 7.000000000000001 from rounding up to 8.
    const double raw = (1.0 - config.target_sparsity) * static_cast<double>(n_blocks);
    b = static_cast<int64_t>(std::ceil(raw - 1e-9));
  }
  // Never below what top-k needs, nor below the forced blocks (so they always fit).
  const int64_t forced =
      std::min<int64_t>(n_blocks, static_cast<int64_t>(config.sink_blocks) + config.local_blocks);
  b = std::max({b, blocks_for_topk(config), forced});
  return std::min(b, n_blocks);
}

}  // namespace spin
