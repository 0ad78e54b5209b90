// Adaptive probe share: recording what the share traded and moving it (probe_share.h).
#include "predict/probe_share.h"

#include <algorithm>

#include "predict/kselect.h"

namespace spin {

void ProbeShareState::record(const uint64_t* keys, int64_t first, int64_t n_history, int64_t n_probe,
                             std::vector<uint64_t>* scratch) {
  probe_picked.clear();
  for (int64_t i = first + n_history; i < first + n_history + n_probe; ++i)
    probe_picked.push_back(static_cast<int32_t>(keys[i] & 0xFFFFFFFFu));
  // History's lowest-ranked blocks are its largest keys: the smallest of the inverted keys.
  std::vector<uint64_t>& margin = *scratch;
  margin.assign(keys + first, keys + first + n_history);
  for (uint64_t& k : margin) k = ~(k | 0xFFFFFFFFu) | (k & 0xFFFFFFFFu);
  const int64_t m = std::min(n_history, n_probe);
  select_smallest(margin.data(), n_history, m);
  margin_picked.clear();
  for (int64_t i = 0; i < m; ++i) margin_picked.push_back(static_cast<int32_t>(margin[i] & 0xFFFFFFFFu));
  std::sort(probe_picked.begin(), probe_picked.end());
  std::sort(margin_picked.begin(), margin_picked.end());
}

void ProbeShareState::update(const PooledRow& row0, double configured) {
  if (probe_picked.empty() || margin_picked.empty()) return;
  const auto hits_in = [&](const std::vector<int32_t>& picked) {
    int64_t hits = 0;
    size_t k = 0;
    for (size_t i = 0; i < row0.blocks.size(); ++i) {
      while (k < picked.size() && picked[k] < row0.blocks[i]) ++k;
      if (k < picked.size() && picked[k] == row0.blocks[i]) hits += row0.topk_hits[i];
    }
    return static_cast<double>(hits);
  };
  const double rp = hits_in(probe_picked) / static_cast<double>(probe_picked.size());
  const double rm = hits_in(margin_picked) / static_cast<double>(margin_picked.size());
  probe_picked.clear();
  margin_picked.clear();
  if (rp + rm <= 0) return;
  const double s = current(configured);
  share = std::clamp(s + kProbeShareStep * (rp - rm) / (rp + rm), kProbeShareFloor * configured, kProbeShareCeiling);
}

}  // namespace spin
