// Adaptive probe share: recording what the share traded and moving it (probe_share.h).
#include "predict/probe_share.h"

#include <algorithm>

#include "predict/kselect.h"

namespace spin {

void ProbeShareState::record(const uint64_t* picked, int64_t n_picked, int64_t n_slots, const uint64_t* history,
                             int64_t n_history, std::vector<uint64_t>* scratch) {
  slots = n_slots;
  probe_picked.clear();
  for (int64_t i = 0; i < n_picked; ++i) probe_picked.push_back(static_cast<int32_t>(picked[i] & 0xFFFFFFFFu));
  // History's lowest-ranked blocks are its largest keys: the smallest of the inverted keys.
  std::vector<uint64_t>& margin = *scratch;
  margin.assign(history, history + n_history);
  for (uint64_t& k : margin) k = ~(k | 0xFFFFFFFFu) | (k & 0xFFFFFFFFu);
  const int64_t m = std::min(n_history, slots);
  select_smallest(margin.data(), n_history, m);
  margin_picked.clear();
  for (int64_t i = 0; i < m; ++i) margin_picked.push_back(static_cast<int32_t>(margin[i] & 0xFFFFFFFFu));
  std::sort(probe_picked.begin(), probe_picked.end());
  std::sort(margin_picked.begin(), margin_picked.end());
}

void ProbeShareState::update(const PooledRow& row0, double configured, double step, double floor, double ceiling,
                             double fall) {
  if (slots == 0 || margin_picked.empty()) return;
  const auto hits_in = [&](const std::vector<int32_t>& picked) {
    int64_t hits = 0;
    size_t k = 0;
    for (size_t i = 0; i < row0.blocks.size(); ++i) {
      while (k < picked.size() && picked[k] < row0.blocks[i]) ++k;
      if (k < picked.size() && picked[k] == row0.blocks[i]) hits += row0.topk_hits[i];
    }
    return static_cast<double>(hits);
  };
  const double rp = hits_in(probe_picked) / static_cast<double>(slots);
  const double rm = hits_in(margin_picked) / static_cast<double>(margin_picked.size());
  probe_picked.clear();
  margin_picked.clear();
  slots = 0;
  if (rp + rm <= 0) return;
  const double s = current(configured);
  const double target = std::clamp(s + step * (rp - rm) / (rp + rm), floor, ceiling);
  share = target >= s || fall >= 1.0 ? target : s + fall * (target - s);  // fall 1: exactly the target
}

}  // namespace spin
