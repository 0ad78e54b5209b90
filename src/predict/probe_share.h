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
// PredictorConfig::adapt's exploration share, in units of explore_ratio: it rises by up to half of
// it per step within [1/2, 4] of it, and falls by only a quarter of that move (kExploreShareFall).
// Why the floor is half (the paper's uniform 5 % at the default ratio 0.1) and the fall is slow:
// exploration's worth is mostly in later steps (an explored block feeds the EMA, so the next
// steps rank it), which the per-step yield does not see; a layer whose yield dipped for a few
// stable steps used to drop to a quarter and then missed the next focus shift — doc-qa's worst
// rows (p99 miss). Measured in docs/results.md ("One default on every regime").
inline constexpr double kExploreShareStep = 0.5;
inline constexpr double kExploreShareFall = 0.25;  // the share of a downward move taken per step
inline constexpr double kExploreShareFloor = 0.5;
inline constexpr double kExploreShareCeiling = 4.0;
// adapt's additions gain: an EMA of this weight, ~8 steps of memory (a layer's regime, not one
// step's luck; PredictorBase::score_rankings), acted on once the layer has measured it on
// kAdditionsGainWarmup steps: from 0, one step's dip turned a stable layer's additions off
// (cached-507k-mtp lost 0.06–0.10 of mean recall; docs/results.md "adapt is the default").
inline constexpr double kAdditionsGainWeight = 0.125;
inline constexpr int32_t kAdditionsGainWarmup = 8;

struct ProbeShareState {
  std::vector<int32_t> probe_picked, margin_picked;  // row 0's picks of the open step, ascending
  int64_t slots = 0;                                 // blocks the share spent (probe_picked may hold fewer)
  double share = -1;                                 // -1: the configured share

  double current(double configured) const { return share >= 0 ? share : configured; }
  // After a select of row 0: the share spent n_slots blocks, of which picked[0, n_picked) count
  // (block in the low 32 bits: the probe's picks, or exploration's that history would not have
  // made), and history[0, n_history) hold history's choice (keys ~order(p) << 32 | block); the
  // share is judged against as many of history's lowest-ranked picks. `scratch` is reused.
  void record(const uint64_t* picked, int64_t n_picked, int64_t n_slots, const uint64_t* history, int64_t n_history,
              std::vector<uint64_t>* scratch);
  // At commit, with row 0's pooled observation: moves the share by up to `step` toward whichever
  // side paid more hits per block, within [floor, ceiling] — a fall only by `fall` (in (0, 1]) of
  // that move — and forgets the picks. With s the share, rp and rm the hits per block of the
  // share's and history's picks (no move when rp + rm = 0, or nothing was recorded), in double:
  //   d = (rp - rm) / (rp + rm);  t = clamp(s + step · d, floor, ceiling)
  //   share = t ≥ s or fall = 1 ? t : s + fall · (t - s)
  void update(const PooledRow& row0, double configured, double step, double floor, double ceiling,
              double fall = 1.0);
  void reset() {
    probe_picked.clear();
    margin_picked.clear();
    slots = 0;
    share = -1;
  }
};

}  // namespace spin
