// Budget moves (PredictorConfig::budget_moves, off by default: it measured worse): budgets that
// move between the layers of a step and between steps at the same mean. A layer's churn — the
// share of its newest top-k's entries that lie in blocks which did not hold the one before
// (counted in blocks before the second real-data ablation, docs/results.md; entries, because
// recall counts entries) — is what a fixed budget gets wrong: a stable layer's blocks are found
// with few, a churning layer needs more.
// (The churn EMA also scales spin's exploration share, with or without budget moves:
// PredictorConfig::explore_churn.)
//   layers: factor = churn_ema(l) / mean over the measured layers, clamped to 1 ± budget_move_max,
//           then the factors of a step renormalised to mean 1 — the same total budget per step;
//   steps:  after a step whose churn exceeds kShiftChurnRatio × its EMA (a shift), the layer
//           spends 1 + budget_move_max, and pays it back at 1 - budget_move_max on the next calm
//           steps until nothing is borrowed — the same budget over time, within one step's loan;
//   both:   the product.
// Everything reads committed steps only, so every row of a step and every replay agree.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "predict/pooling.h"
#include "spin/predict.h"

namespace spin {

// A step shifted when its churn rose above this multiple of the layer's churn EMA.
inline constexpr double kShiftChurnRatio = 1.5;
// The churn EMA keeps kChurnEmaKeep of itself and takes kChurnEmaWeight of the newest step.
inline constexpr double kChurnEmaKeep = 0.8;
inline constexpr double kChurnEmaWeight = 0.2;
static_assert(kChurnEmaKeep + kChurnEmaWeight == 1.0);

// One layer's churn, its EMA, and what steps mode has borrowed.
struct BudgetMoveState {
  double churn = -1;      // -1: not measured yet
  double churn_ema = -1;
  double borrowed = 0;    // extra budget share spent after a shift, paid back on calm steps

  // The last committed step shifted.
  bool shifted() const { return churn >= 0 && churn_ema > 0 && churn > kShiftChurnRatio * churn_ema; }
  // At commit, with the newest replayed row and the blocks of the layer's top-k before it
  // (ascending): the churn, its EMA and the loan move on.
  void update(const std::vector<int32_t>& before, const PooledRow& newest, double move_max);
};

// The factor `layer`'s fixed budget is multiplied by under `mode` (1 for kNone); state_of(i) is
// layer i's state, i < num_layers.
double budget_move_factor(BudgetMoves mode, double move_max, int32_t num_layers, int32_t layer,
                          const std::function<const BudgetMoveState&(int32_t)>& state_of);

}  // namespace spin
