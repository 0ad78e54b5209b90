// spin/lab/workload.h — synthetic indexer workloads with documented, calibrated dynamics.
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
//   segment directions mix topic and own as 0.7·topic + segment_own·own: a small segment_own
//   makes the turns of one topic near-identical look-alikes (MRCR's repeated requests).
// Retrieval targets (RULER-like multi-key needles, MRCR-like rounds; off by default):
//   needles: needles + needle_distractors spans of needle_tokens tokens (far shorter than a
//     block, so a block's mean-pooled key dilutes them) laid at random depths over the prompt;
//     their keys are needle_key·d_i + rope + noise, without salience, where
//     d_i = √needle_similarity·v_needle + √(1-needle_similarity)·own_i: every needle shares the
//     needle direction (the template "the magic number for X is"), each has its own key X.
//     Distractors are never asked for: they make the task multi-key (RULER MK-NIAH).
//   the schedule: every target_period steps an episode starts with a target drawn uniformly
//     (never the previous one) among the asked needles, or, without needles, among the prompt's
//     segments (MRCR's "the k-th poem about tapirs": one turn among look-alikes); for the first
//     target_dwell steps of the episode (0 = all of them) every head and row of every layer adds
//     target_query·d_target to its query (the question), the rest is ordinary haystack attention.
//     workload_targets() lists each step's target span; traces carry it as metadata "targets".
// Head weights are 1 + 0.3·N(0,1) per (layer, head); queries are quantised with
// quantize_queries (q scale and 128^-0.5·64^-0.5 folded into the weights).
#pragma once
#ifdef SPIN_FACE_ONLY
#error "spin/lab/workload.h is the research lab's; the engine's face (include/spin/*.h) must not need it"
#endif

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
  // Fields from here on are left out of to_string() while all are at their defaults, so that the
  // traces of the scenarios that predate them (whose metadata holds to_string()) keep their bytes.
  double segment_own = 0.7;        // weight of a segment's own direction next to its topic's 0.7
  // Retrieval targets (see the model above); the defaults switch them off.
  int32_t needles = 0;             // asked needles (0 = no needles)
  int32_t needle_distractors = 0;  // look-alike needles never asked for
  int32_t needle_tokens = 8;       // tokens per needle span
  double needle_similarity = 0.5;  // cosine between two needles' key directions, in [0, 1)
  double needle_key = 1.0;         // weight of d_i in a needle's key (key_topic's counterpart)
  int32_t target_period = 0;       // steps per retrieval episode (0 = no targets)
  int32_t target_dwell = 0;        // steps of an episode whose query asks for the target (0 = all)
  double target_query = 8.0;       // weight of the target's direction in the query
  // Layers that differ in stability, after calibration (a second quiet group for to_string):
  // the first volatile_layers layers' query_noise is scaled by volatile_noise (GVR measured ~1.5 %
  // consecutive-step top-k overlap in DeepSeek-V3.2's layers 0–1), every other layer's by
  // layer_noise (35–50 % in its middle layers), both besides layer_volatility's scale.
  int32_t volatile_layers = 0;
  double volatile_noise = 1.0;
  double layer_noise = 1.0;
  uint64_t seed = 1;

  Status validate() const;
  // Sets one field by name (the names above) from text.
  Status set(const std::string& key, const std::string& value);
  // "key=value ..." of every field, in order (those from segment_own on only when one of them is
  // not at its default).
  std::string to_string() const;
};

// The built-in scenarios: doc-qa-10k, doc-qa-94k, agentic, needle-shift, cached-507k, niah-mk-128k
// (multi-key needles), mrcr-256k and mrcr-1m (multi-round co-reference), v4flash-10k and
// v4flash-94k (DeepSeek-V4 Flash's statistics), layers-68k (layers of very different stability,
// as GVR measured on V3.2), each also with an "-mtp"
// suffix (next_n 3, acceptance 0.7). Parameters come from the calibration table
// that `spin calibrate` writes (data/calibration.json, compiled in).
const std::vector<std::string>& scenario_names();
Result<WorkloadParams> scenario_params(std::string_view name);

// Generates the trace (deterministic per seed, independent of thread count).
// Refuses (kResourceExhausted, in GiB, before generating) a trace whose working set — twice
// workload_trace_bytes — is over the memory budget of spin/memory.h, as `spin trace gen` does.
Result<Trace> generate_workload(const WorkloadParams& params);
// Bytes of the trace the generator holds in memory (and then writes): per layer the keys and
// scales of every entry, and the queries and weights of every row.
double workload_trace_bytes(const WorkloadParams& params);

// The span a decode step's query asks for (needle or turn), entries [begin, end).
struct WorkloadTarget {
  int32_t step = 0;
  int64_t begin = 0;
  int64_t end = 0;
};
// Every asking step's target, in step order (empty when target_period is 0); cheap: no keys are
// built. The same list generate_workload() writes as metadata "targets" ("step:begin:end,...").
Result<std::vector<WorkloadTarget>> workload_targets(const WorkloadParams& params);

}  // namespace spin
