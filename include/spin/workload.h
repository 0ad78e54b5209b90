// spin/workload.h — synthetic indexer workloads with documented, calibrated dynamics.
//
// No DSA weights can be downloaded here, so quality is measured on generated traces whose
// structure is spelled out below and whose two headline statistics (all-keep prev-iter Pearson of
// block scores and token top-k recall between consecutive steps) are calibrated to the SPIN
// paper's values by `spin calibrate`. Every key and query goes through the real quantisation path
// (UE8M0 scale + e4m3), and the result is an ordinary trace (spin/trace.h), so a generated
// workload and a recorded one are replayed by exactly the same code.
//
// The model, per indexer layer l (head dim 128; the first 64 dims carry the rotary part):
//   key of entry s in segment g:
//     k_s = key_topic·u_g + key_salience·z_s·v_sal + rope(s) + key_noise·n_{l,s}
//     u_g      unit direction of segment g: a mix of its topic (segments share num_topics topics,
//              so look-alike documents exist) and its own direction;
//     z_s      per-entry salience, log-normal with spread salience_sigma (scatters top-k entries
//              across the whole context, as real indexer top-k is); a share salience_run_share of
//              its log-variance is common to runs of salience_run tokens (salient phrases): blocks
//              stay stable while which of their tokens make the top-k churns;
//     rope(s)  NeoX half-split rotary features at position s with the V3.2 base 10000: q·k then
//              carries a real relative-position kernel (recency);
//     n        isotropic noise, fresh per layer;
//     sink entries (the first sink_tokens) are key_topic·v_sink instead of a segment direction.
//   query of head h, row at position p, step t:
//     q = focus_weight·f_{l,t} + head_spread·η_{l,h} + query_salience·v_sal + sink_query·v_sink
//         + rope(p) + query_noise·ε_{l,t,row} + head_noise·ε_{l,t,row,h}
//     f_{l,t}  the layer's focus: a weighted mix of focus_segments segments; weights random-walk
//              (focus_drift), and with probability shift_prob per step one focus segment jumps —
//              to a segment never attended before with probability needle_prob (needles);
//              layer l repeats layer l-1's jump with probability layer_correlation;
//     ε        per-step noise shared by all heads (what makes top-k churn between steps); each
//              MTP row draws its own (a drafted token is a different token); its scale varies
//              per layer by layer_volatility (real layers churn at different rates).
//   decoding appends one entry per accepted token, drawn from the current focus of layer 0;
//   agentic scenarios append tool_tokens tokens of a fresh segment every burst_steps steps.
// Head weights are 1 + 0.3·N(0,1) per (layer, head); queries are quantised with
// quantize_queries (q scale and 128^-0.5·64^-0.5 folded into the weights).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "spin/status.h"
#include "spin/trace.h"

namespace spin {

struct WorkloadParams {
  std::string scenario = "custom";
  // Shape.
  int64_t prompt_tokens = 10000;   // context before the first decode step
  int32_t steps = 64;              // decode steps recorded
  int32_t layers = 4;              // indexer layers recorded
  int32_t next_n = 1;              // rows per step: 1, or 2..4 for MTP verification
  double acceptance_rate = 0.7;    // MTP: each draft token accepted with this probability, in order
  int32_t num_heads = 64;
  int32_t page_size = kDefaultPageSize;
  int32_t topk = 2048;
  // Content.
  int64_t segment_tokens = 1500;   // mean segment (document, turn) length; lengths 0.5–1.5× mean
  int32_t num_topics = 12;         // segments draw their topic from this many directions
  int32_t sink_tokens = 4;
  double key_topic = 1.0;
  double key_salience = 1.0;
  double salience_sigma = 1.4;
  int32_t salience_run = 32;        // tokens per run sharing a salience component (phrases)
  double salience_run_share = 0.0;  // share of log-salience variance that is per run, in [0, 1]
  double key_noise = 2.0;
  double rope_weight = 0.7;
  // Queries.
  int32_t focus_segments = 4;
  double focus_weight = 2.0;
  double focus_drift = 0.05;
  double shift_prob = 0.02;
  double needle_prob = 0.5;
  double layer_correlation = 0.7;
  double head_spread = 3.0;
  double query_salience = 1.0;
  double sink_query = 1.0;
  double query_noise = 6.0;
  double head_noise = 0.3;
  // Layers churn at different rates: layer l's query_noise is scaled by exp(layer_volatility · z_l),
  // z_l fixed quantiles of unit variance alternating low / high (the same for every seed). 0 =
  // every layer alike; the calibration (data/calibration.json) is fitted with the default.
  double layer_volatility = 0.5;
  // Agentic traffic: a tool output of tool_tokens every burst_steps decode steps (0 = never).
  int32_t burst_steps = 0;
  int64_t tool_tokens = 0;
  double tool_focus_prob = 0.7;    // chance the focus jumps to the new tool output
  uint64_t seed = 1;

  Status validate() const;
  // Sets one field by name (the names above) from text.
  Status set(const std::string& key, const std::string& value);
  // "key=value ..." of every field, in order.
  std::string to_string() const;
};

// The built-in scenarios: doc-qa-10k, doc-qa-94k, agentic, needle-shift, cached-507k, each also
// with an "-mtp" suffix (next_n 3, acceptance 0.7). Parameters come from the calibration table
// that `spin calibrate` writes (data/calibration.json, compiled in).
const std::vector<std::string>& scenario_names();
Result<WorkloadParams> scenario_params(std::string_view name);

// Generates the trace (deterministic per seed, independent of thread count).
Result<Trace> generate_workload(const WorkloadParams& params);

}  // namespace spin
