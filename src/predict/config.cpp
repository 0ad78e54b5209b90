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

#include "core/errors.h"
#include "spin/predict.h"

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

template <typename E>
Status parse_enum(Result<E> r, E* out) {
  if (!r.ok()) return r.status();
  *out = r.value();
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

Status PredictorConfig::validate() const {
  // Written as !(in range) so that NaN fails too.
  if (!(target_sparsity >= 0.0 && target_sparsity < 1.0))
    return invalid_argument("target_sparsity {} is outside [0, 1)", target_sparsity);
  if (explicit_budget_blocks < -1)
    return invalid_argument("explicit_budget_blocks {} must be -1 (use target_sparsity) or ≥ 0",
                            explicit_budget_blocks);
  if (sink_blocks < 0) return invalid_argument("sink_blocks {} must be ≥ 0", sink_blocks);
  if (local_blocks < 0) return invalid_argument("local_blocks {} must be ≥ 0", local_blocks);
  if (!(explore_ratio >= 0.0 && explore_ratio <= 1.0))
    return invalid_argument("explore_ratio {} is outside [0, 1]", explore_ratio);
  if (!(alpha > 0.0 && alpha <= 1.0)) return invalid_argument("alpha {} is outside (0, 1]", alpha);
  if (!(beta > 0.0 && beta <= 1.0)) return invalid_argument("beta {} is outside (0, 1]", beta);
  if (!(combine_weight >= 0.0 && combine_weight <= 1.0))
    return invalid_argument("combine_weight {} is outside [0, 1]", combine_weight);
  if (page_size <= 0) return invalid_argument("page_size {} must be > 0", page_size);
  if (block_pages <= 0) return invalid_argument("block_pages {} must be > 0", block_pages);
  // 2^20 entries per block keeps every block·entries product far inside int64 and the per-block
  // hit counts inside int32; real blocks are 64–256 entries.
  if (static_cast<int64_t>(page_size) * block_pages > (int64_t{1} << 20))
    return invalid_argument("page_size·block_pages = {} exceeds the supported 2^20 entries",
                            static_cast<int64_t>(page_size) * block_pages);
  if (topk <= 0) return invalid_argument("topk {} must be > 0", topk);
  if (!(probe_share >= 0.0 && probe_share <= 1.0))
    return invalid_argument("probe_share {} is outside [0, 1]", probe_share);
  if (!(probe_blend >= 0.0 && probe_blend <= 1.0))
    return invalid_argument("probe_blend {} is outside [0, 1]", probe_blend);
  if (probe_adapt != 0 && probe_adapt != 1)
    return invalid_argument("probe_adapt {} must be 0 or 1", probe_adapt);
  if (probe_interval < 1) return invalid_argument("probe_interval {} must be ≥ 1", probe_interval);
  if (probe_entries < 0 || (probe_entries > 0 && block_entries() % probe_entries != 0))
    return invalid_argument(
        "probe_entries {} must be 0 (one key per block) or divide the block's {} entries",
        probe_entries, block_entries());
  if (!(budget_move_max >= 0.0 && budget_move_max < 1.0))
    return invalid_argument("budget_move_max {} is outside [0, 1)", budget_move_max);
  if (!name_in(kBudgetMovesNames, budget_moves))
    return invalid_argument("budget_moves {} unknown; supported: {}",
                            static_cast<int>(budget_moves), names_list(kBudgetMovesNames));
  if (!name_in(kPoolingNames, pooling))
    return invalid_argument("pooling {} unknown; supported: {}", static_cast<int>(pooling),
                            names_list(kPoolingNames));
  if (!name_in(kExploreNames, explore_policy))
    return invalid_argument("explore_policy {} unknown; supported: {}",
                            static_cast<int>(explore_policy), names_list(kExploreNames));
  if (!name_in(kCombineNames, combine))
    return invalid_argument("combine {} unknown; supported: {}", static_cast<int>(combine),
                            names_list(kCombineNames));
  if (!name_in(kMtpNames, mtp_update))
    return invalid_argument("mtp_update {} unknown; supported: {}", static_cast<int>(mtp_update),
                            names_list(kMtpNames));
  return ok_status();
}

std::string PredictorConfig::to_string() const {
  // {} prints doubles in the shortest form that reads back to the same value.
  return fmt::format(
      "target_sparsity={} explicit_budget_blocks={} sink_blocks={} local_blocks={} "
      "explore_ratio={} explore_policy={} alpha={} beta={} combine={} combine_weight={} "
      "pooling={} mtp_update={} probe_share={} probe_blend={} probe_adapt={} probe_interval={} probe_entries={} "
      "budget_moves={} budget_move_max={} page_size={} block_pages={} topk={} seed={}",
      target_sparsity, explicit_budget_blocks, sink_blocks, local_blocks, explore_ratio,
      explore_policy_name(explore_policy), alpha, beta, combine_name(combine), combine_weight,
      pooling_name(pooling), mtp_update_name(mtp_update), probe_share, probe_blend, probe_adapt, probe_interval,
      probe_entries, budget_moves_name(budget_moves), budget_move_max, page_size, block_pages,
      topk, seed);
}

Status PredictorConfig::set(const std::string& key, const std::string& value) {
  if (key == "target_sparsity") return parse_double(key, value, &target_sparsity);
  if (key == "explicit_budget_blocks") return parse_int(key, value, &explicit_budget_blocks);
  if (key == "sink_blocks") return parse_int(key, value, &sink_blocks);
  if (key == "local_blocks") return parse_int(key, value, &local_blocks);
  if (key == "explore_ratio") return parse_double(key, value, &explore_ratio);
  if (key == "explore_policy") return parse_enum(explore_policy_from_name(value), &explore_policy);
  if (key == "alpha") return parse_double(key, value, &alpha);
  if (key == "beta") return parse_double(key, value, &beta);
  if (key == "combine") return parse_enum(combine_from_name(value), &combine);
  if (key == "combine_weight") return parse_double(key, value, &combine_weight);
  if (key == "pooling") return parse_enum(pooling_from_name(value), &pooling);
  if (key == "mtp_update") return parse_enum(mtp_update_from_name(value), &mtp_update);
  if (key == "probe_share") return parse_double(key, value, &probe_share);
  if (key == "probe_blend") return parse_double(key, value, &probe_blend);
  if (key == "probe_adapt") return parse_int(key, value, &probe_adapt);
  if (key == "probe_interval") return parse_int(key, value, &probe_interval);
  if (key == "probe_entries") return parse_int(key, value, &probe_entries);
  if (key == "budget_moves") return parse_enum(budget_moves_from_name(value), &budget_moves);
  if (key == "budget_move_max") return parse_double(key, value, &budget_move_max);
  if (key == "page_size") return parse_int(key, value, &page_size);
  if (key == "block_pages") return parse_int(key, value, &block_pages);
  if (key == "topk") return parse_int(key, value, &topk);
  if (key == "seed") return parse_int(key, value, &seed);
  return invalid_argument(
      "unknown predictor config key '{}'; supported: target_sparsity, explicit_budget_blocks, "
      "sink_blocks, local_blocks, explore_ratio, explore_policy, alpha, beta, combine, "
      "combine_weight, pooling, mtp_update, probe_share, probe_blend, probe_adapt, probe_interval, probe_entries, "
      "budget_moves, budget_move_max, page_size, block_pages, topk, seed",
      key);
}

Status PredictorConfig::parse(std::string_view pairs) {
  const auto is_sep = [](char c) { return c == ' ' || c == ',' || c == '\n' || c == '\t'; };
  size_t i = 0;
  while (i < pairs.size()) {
    while (i < pairs.size() && is_sep(pairs[i])) ++i;
    size_t j = i;
    while (j < pairs.size() && !is_sep(pairs[j])) ++j;
    if (j > i) {
      const std::string_view item = pairs.substr(i, j - i);
      const size_t eq = item.find('=');
      if (eq == std::string_view::npos || eq == 0)
        return invalid_argument("'{}' is not a key=value pair", item);
      SPIN_RETURN_IF_ERROR(set(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))));
    }
    i = j;
  }
  return ok_status();
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
