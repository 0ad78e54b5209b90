// Budget moves: the churn bookkeeping at commit and the factor a row's budget is moved by
// (budget_moves.h says what each mode does).
#include "predict/budget_moves.h"

#include <algorithm>

namespace spin {

void BudgetMoveState::update(const std::vector<int32_t>& before, const PooledRow& newest, double move_max) {
  // Entries, not blocks: recall counts entries, and a top-k that gains a few marginal blocks of
  // one entry each has barely moved.
  int64_t now = 0, kept = 0;
  size_t k = 0;
  for (size_t i = 0; i < newest.blocks.size(); ++i) {
    const int32_t hits = newest.topk_hits[i];
    if (hits == 0) continue;
    now += hits;
    while (k < before.size() && before[k] < newest.blocks[i]) ++k;
    if (k < before.size() && before[k] == newest.blocks[i]) kept += hits;
  }
  if (now == 0 || before.empty()) return;  // nothing to compare yet
  const double measured = 1.0 - static_cast<double>(kept) / static_cast<double>(now);
  // Steps mode's loan: a shift step borrows move_max, a calm step repays up to as much.
  if (shifted()) {  // the condition budget_move_factor() spent the loan on
    borrowed += move_max;
  } else if (borrowed > 0) {
    borrowed = std::max(0.0, borrowed - move_max);
  }
  churn = measured;
  churn_ema = churn_ema < 0 ? measured : kChurnEmaKeep * churn_ema + kChurnEmaWeight * measured;
}

double budget_move_factor(BudgetMoves mode, double move_max, int32_t num_layers, int32_t layer,
                          const std::function<const BudgetMoveState&(int32_t)>& state_of) {
  if (mode == BudgetMoves::kNone) return 1.0;
  const double m = move_max;
  double factor = 1.0;
  if (mode == BudgetMoves::kLayers || mode == BudgetMoves::kBoth) {
    double sum = 0, raw_self = 1.0;
    int32_t measured = 0;
    for (int32_t i = 0; i < num_layers; ++i)
      if (state_of(i).churn_ema >= 0) sum += state_of(i).churn_ema, ++measured;
    if (measured == num_layers && sum > 0) {
      const double mean = sum / measured;
      double total = 0;
      for (int32_t i = 0; i < num_layers; ++i) {
        const double f = std::clamp(state_of(i).churn_ema / mean, 1.0 - m, 1.0 + m);
        total += f;
        if (i == layer) raw_self = f;
      }
      factor *= raw_self * num_layers / total;
    }
  }
  if (mode == BudgetMoves::kSteps || mode == BudgetMoves::kBoth) {
    const BudgetMoveState& l = state_of(layer);
    if (l.shifted()) {
      factor *= 1.0 + m;
    } else if (l.borrowed > 0) {
      factor *= 1.0 - std::min(m, l.borrowed);
    }
  }
  return factor;
}

}  // namespace spin
