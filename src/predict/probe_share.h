// Adaptive probe share (PredictorConfig::probe_adapt, off by default: it lifts mean recall on most
// scenarios but costs p99 miss where the top-k jumps). After each probing select of row 0 the
// layer records the probe's picks and as many of history's lowest-ranked picks (the blocks the
// share trades between them); at commit, the share moves by up to kProbeShareStep toward whichever
// paid more top-k hits per block, within [kProbeShareFloor · probe_share, kProbeShareCeiling]:
// never so low that a jump of the top-k finds no probe.
#pragma once

#include <cstdint>
#include <vector>

#include "predict/pooling.h"

namespace spin {

inline constexpr double kProbeShareStep = 0.15;     // the largest move of the share per step
inline constexpr double kProbeShareFloor = 0.5;     // × the configured share: the lowest it goes
inline constexpr double kProbeShareCeiling = 0.95;  // the highest: history keeps a few blocks

struct ProbeShareState {
  std::vector<int32_t> probe_picked, margin_picked;  // row 0's picks of the open step, ascending
  double share = -1;                                 // -1: the configured share

  double current(double configured) const { return share >= 0 ? share : configured; }
  // After a probing select of row 0: keys[first, first + n_history) hold history's choice (keys
  // ~order(p) << 32 | block) and the n_probe keys after them the probe's. `scratch` is reused.
  void record(const uint64_t* keys, int64_t first, int64_t n_history, int64_t n_probe,
              std::vector<uint64_t>* scratch);
  // At commit, with row 0's pooled observation: moves the share and forgets the picks.
  void update(const PooledRow& row0, double configured);
  void reset() {
    probe_picked.clear();
    margin_picked.clear();
    share = -1;
  }
};

}  // namespace spin
