// Synthetic indexer workloads (see spin/lab/workload.h for the model and every parameter).
#include "spin/lab/workload.h"
#include "spin/settings.h"

#include <nlohmann/json.hpp>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>
#include <set>
#include <sstream>

#include "core/errors.h"
#include "spin/cache.h"
#include "spin/memory.h"
#include "spin/numerics.h"
#include "spin/rng.h"

namespace spin {

extern const char* const kCalibrationJson;  // generated from data/calibration.json

namespace {

constexpr int kDim = kIndexerHeadDim;
constexpr int kRopePairs = 32;  // dims [0, 32) and [32, 64) form the NeoX half-split pairs

// Stream tags: one counter-based stream per decision, so adding a draw never shifts another.
enum : uint64_t {
  kTagTopic = 1, kTagSegment, kTagSalience, kTagKeyNoise, kTagFocus, kTagHead, kTagQueryNoise,
  kTagWeights, kTagAccept, kTagGlobal, kTagNeedle, kTagTarget,
};

using Vec = std::array<float, kDim>;

void normal_fill(CounterRng& rng, float* out, int n, double scale) {
  for (int i = 0; i < n; i += 2) {
    double u1 = rng.uniform();
    const double u2 = rng.uniform();
    if (u1 < 1e-300) u1 = 1e-300;
    const double r = std::sqrt(-2.0 * std::log(u1)) * scale;
    out[i] = static_cast<float>(r * std::cos(6.283185307179586 * u2));
    if (i + 1 < n) out[i + 1] = static_cast<float>(r * std::sin(6.283185307179586 * u2));
  }
}

Vec random_unit(CounterRng& rng) {
  Vec v{};
  normal_fill(rng, v.data(), kDim, 1.0);
  double norm = 0;
  for (float x : v) norm += double{x} * x;
  const float inv = static_cast<float>(1.0 / std::sqrt(norm));
  for (float& x : v) x *= inv;
  return v;
}

void normalise(Vec& v) {
  double norm = 0;
  for (float x : v) norm += double{x} * x;
  if (norm <= 0) return;
  const float inv = static_cast<float>(1.0 / std::sqrt(norm));
  for (float& x : v) x *= inv;
}

// DeepSeek-V3.2 indexer rotary frequencies: base 10000, YaRN factor 40 over the ramp [10, 23].
const std::array<float, kRopePairs>& rope_frequencies() {
  static const std::array<float, kRopePairs> freqs = [] {
    std::array<float, kRopePairs> f{};
    for (int i = 0; i < kRopePairs; ++i) {
      const double base = std::pow(10000.0, -static_cast<double>(i) / kRopePairs);
      const double ramp = std::clamp((i - 10.0) / 13.0, 0.0, 1.0);
      f[i] = static_cast<float>(base * (1 - ramp) + base / 40.0 * ramp);
    }
    return f;
  }();
  return freqs;
}

void add_rope(float* v, int64_t position, double weight) {
  const auto& freqs = rope_frequencies();
  const float amplitude = static_cast<float>(weight / std::sqrt(double{kRopePairs}));
  for (int i = 0; i < kRopePairs; ++i) {
    const float angle = static_cast<float>(position) * freqs[i];  // fp32 angle, as the model does
    v[i] += amplitude * std::cos(angle);
    v[i + kRopePairs] += amplitude * std::sin(angle);
  }
}

struct Segment {
  int64_t begin = 0;
  int64_t end = 0;
  Vec direction{};
  bool focusable = true;  // prompt and tool segments; decode and sink spans are not
};

struct FocusState {
  std::vector<int32_t> segments;  // focus_segments segment ids
  std::vector<double> weights;
  std::set<int32_t> attended;
};

struct ShiftEvent {
  bool happened = false;
  size_t slot = 0;
  int32_t target = -1;
};

int32_t pick_segment(CounterRng& rng, const std::vector<Segment>& segments, const std::set<int32_t>& attended,
                     bool needle) {
  std::vector<int32_t> candidates;
  for (int32_t g = 0; g < static_cast<int32_t>(segments.size()); ++g) {
    if (segments[g].focusable && (!needle || !attended.count(g))) candidates.push_back(g);
  }
  if (candidates.empty()) {
    for (int32_t g = 0; g < static_cast<int32_t>(segments.size()); ++g) {
      if (segments[g].focusable) candidates.push_back(g);
    }
  }
  if (candidates.empty()) return -1;
  return candidates[rng.below(candidates.size())];
}

Vec focus_vector(const FocusState& f, const std::vector<Segment>& segments) {
  Vec v{};
  for (size_t i = 0; i < f.segments.size(); ++i) {
    if (f.segments[i] < 0) continue;
    const Vec& d = segments[f.segments[i]].direction;
    for (int k = 0; k < kDim; ++k) v[k] += static_cast<float>(f.weights[i]) * d[k];
  }
  normalise(v);
  return v;
}

// Field table for set()/to_string(): name → (getter as text, setter from text).
struct Field {
  const char* name;
  std::function<std::string(const WorkloadParams&)> get;
  std::function<bool(WorkloadParams&, const std::string&)> put;
  // 0: always printed; a quiet group g ≥ 1: to_string() leaves the group out while every field of
  // it holds its default (fields added after traces were published keep those traces' bytes).
  int quiet = 0;
};

template <typename T>
Field field(const char* name, T WorkloadParams::*member, int quiet = 0) {
  return {name,
          [member](const WorkloadParams& p) {
            if constexpr (std::is_same_v<T, std::string>) {
              return p.*member;
            } else {
              std::ostringstream os;
              os << p.*member;
              return os.str();
            }
          },
          [member](WorkloadParams& p, const std::string& text) {
            if constexpr (std::is_same_v<T, std::string>) {
              p.*member = text;
              return true;
            } else {
              std::istringstream is(text);
              T v{};
              is >> v;
              if (!is || !is.eof()) return false;
              p.*member = v;
              return true;
            }
          },
          quiet};
}

// A field added after traces were published: see WorkloadParams (to_string keeps their bytes).
template <typename T>
Field quiet_field(const char* name, T WorkloadParams::*member) {
  return field(name, member, /*quiet=*/1);
}
// The second group: the per-layer stability fields (volatile_layers, volatile_noise).
template <typename T>
Field layer_field(const char* name, T WorkloadParams::*member) {
  return field(name, member, /*quiet=*/2);
}

const std::vector<Field>& fields() {
  static const std::vector<Field> table = {
      field("scenario", &WorkloadParams::scenario), field("prompt_tokens", &WorkloadParams::prompt_tokens),
      field("steps", &WorkloadParams::steps), field("layers", &WorkloadParams::layers),
      field("next_n", &WorkloadParams::next_n), field("acceptance_rate", &WorkloadParams::acceptance_rate),
      field("num_heads", &WorkloadParams::num_heads), field("page_size", &WorkloadParams::page_size),
      field("topk", &WorkloadParams::topk), field("segment_tokens", &WorkloadParams::segment_tokens),
      field("num_topics", &WorkloadParams::num_topics), field("sink_tokens", &WorkloadParams::sink_tokens),
      field("key_topic", &WorkloadParams::key_topic), field("key_salience", &WorkloadParams::key_salience),
      field("salience_sigma", &WorkloadParams::salience_sigma), field("salience_run", &WorkloadParams::salience_run),
      field("salience_run_share", &WorkloadParams::salience_run_share), field("key_noise", &WorkloadParams::key_noise),
      field("rope_weight", &WorkloadParams::rope_weight), field("focus_segments", &WorkloadParams::focus_segments),
      field("focus_weight", &WorkloadParams::focus_weight), field("focus_drift", &WorkloadParams::focus_drift),
      field("shift_prob", &WorkloadParams::shift_prob), field("needle_prob", &WorkloadParams::needle_prob),
      field("layer_correlation", &WorkloadParams::layer_correlation),
      field("head_spread", &WorkloadParams::head_spread), field("query_salience", &WorkloadParams::query_salience),
      field("sink_query", &WorkloadParams::sink_query), field("query_noise", &WorkloadParams::query_noise),
      field("head_noise", &WorkloadParams::head_noise),
      field("layer_volatility", &WorkloadParams::layer_volatility), field("burst_steps", &WorkloadParams::burst_steps),
      field("tool_tokens", &WorkloadParams::tool_tokens), field("tool_focus_prob", &WorkloadParams::tool_focus_prob),
      quiet_field("segment_own", &WorkloadParams::segment_own), quiet_field("needles", &WorkloadParams::needles),
      quiet_field("needle_distractors", &WorkloadParams::needle_distractors),
      quiet_field("needle_tokens", &WorkloadParams::needle_tokens),
      quiet_field("needle_similarity", &WorkloadParams::needle_similarity),
      quiet_field("needle_key", &WorkloadParams::needle_key),
      quiet_field("target_period", &WorkloadParams::target_period),
      quiet_field("target_dwell", &WorkloadParams::target_dwell),
      quiet_field("target_query", &WorkloadParams::target_query),
      layer_field("volatile_layers", &WorkloadParams::volatile_layers),
      layer_field("volatile_noise", &WorkloadParams::volatile_noise),
      layer_field("layer_noise", &WorkloadParams::layer_noise),
      field("seed", &WorkloadParams::seed),
  };
  return table;
}

}  // namespace

Status WorkloadParams::set(const std::string& key, const std::string& value) {
  for (const Field& f : fields()) {
    if (key == f.name) {
      WorkloadParams copy = *this;
      if (!f.put(copy, value)) return invalid_argument("workload field '{}': cannot parse '{}'", key, value);
      *this = copy;
      return ok_status();
    }
  }
  std::string names;
  for (const Field& f : fields()) names += std::string(names.empty() ? "" : ", ") + f.name;
  return invalid_argument("unknown workload field '{}' (known: {})", key, names);
}

std::string WorkloadParams::to_string() const {
  static const WorkloadParams defaults;
  // A quiet group's fields go together: all of them as soon as one is set, so a trace that uses
  // them says how, and none while all hold their defaults (the traces that predate them).
  std::array<bool, 3> group_set{};
  for (const Field& f : fields()) group_set[f.quiet] = group_set[f.quiet] || f.get(*this) != f.get(defaults);
  std::string out;
  for (const Field& f : fields()) {
    const std::string value = f.get(*this);
    if (f.quiet > 0 && !group_set[f.quiet]) continue;
    out += std::string(out.empty() ? "" : " ") + f.name + "=" + value;
  }
  return out;
}

namespace {

// The retrieval-target fields (needles, MRCR rounds).
Status validate_targets(const WorkloadParams& p) {
  if (!(p.segment_own >= 0 && p.segment_own <= 10)) {
    return invalid_argument("segment_own must be in [0, 10], got {}", p.segment_own);
  }
  if (p.needles < 0 || p.needle_distractors < 0) return invalid_argument("needles and needle_distractors must be ≥ 0");
  if (p.needle_tokens < 1) return invalid_argument("needle_tokens must be ≥ 1, got {}", p.needle_tokens);
  if (!(p.needle_similarity >= 0 && p.needle_similarity < 1)) {
    return invalid_argument("needle_similarity must be in [0, 1), got {}", p.needle_similarity);
  }
  // Every needle gets its own stretch of the prompt after the sinks, with room to move in it.
  const int64_t spans = int64_t{p.needles} + p.needle_distractors;
  if (spans > 0 && (p.prompt_tokens - p.sink_tokens) / spans <= p.needle_tokens) {
    return invalid_argument("{} needles of {} tokens do not fit in a prompt of {} tokens", spans, p.needle_tokens,
                            p.prompt_tokens);
  }
  if (p.needle_distractors > 0 && p.needles == 0) {
    return invalid_argument("needle_distractors need needles ≥ 1 to ask for");
  }
  if (p.target_period < 0 || p.target_dwell < 0 || p.target_dwell > p.target_period) {
    return invalid_argument("target_period must be ≥ 0 and target_dwell in [0, target_period], got {} and {}",
                            p.target_period, p.target_dwell);
  }
  if (p.needles > 0 && p.target_period == 0) return invalid_argument("needles need target_period ≥ 1 (when to ask)");
  for (double v : {p.target_query, p.needle_key}) {
    if (!(v >= 0 && std::isfinite(v))) {
      return invalid_argument("target_query and needle_key must be finite and ≥ 0 (got {})", v);
    }
  }
  return ok_status();
}

}  // namespace

Status WorkloadParams::validate() const {
  if (prompt_tokens < 1) return invalid_argument("prompt_tokens must be ≥ 1, got {}", prompt_tokens);
  if (steps < 1) return invalid_argument("steps must be ≥ 1, got {}", steps);
  if (layers < 1) return invalid_argument("layers must be ≥ 1, got {}", layers);
  if (next_n < 1 || next_n > 4) return invalid_argument("next_n must be in [1, 4], got {}", next_n);
  if (!(acceptance_rate >= 0 && acceptance_rate <= 1)) {
    return invalid_argument("acceptance_rate must be in [0, 1], got {}", acceptance_rate);
  }
  if (num_heads < 1 || num_heads > 128) return invalid_argument("num_heads must be in [1, 128], got {}", num_heads);
  if (page_size < 1 || topk < 1) return invalid_argument("page_size and topk must be ≥ 1");
  if (salience_run < 1 || !(salience_run_share >= 0 && salience_run_share <= 1)) {
    return invalid_argument("salience_run must be ≥ 1 and salience_run_share in [0, 1]");
  }
  if (segment_tokens < 1 || num_topics < 1 || focus_segments < 1) {
    return invalid_argument("segment_tokens, num_topics and focus_segments must be ≥ 1");
  }
  if (sink_tokens < 0 || sink_tokens >= prompt_tokens) {
    return invalid_argument("sink_tokens must be in [0, prompt_tokens), got {}", sink_tokens);
  }
  for (double p : {shift_prob, needle_prob, layer_correlation, tool_focus_prob}) {
    if (!(p >= 0 && p <= 1)) return invalid_argument("probabilities must be in [0, 1] (got {})", p);
  }
  for (double v : {key_topic, key_salience, salience_sigma, key_noise, rope_weight, focus_weight, focus_drift,
                   head_spread, query_salience, sink_query, query_noise, head_noise}) {
    if (!(v >= 0 && std::isfinite(v))) return invalid_argument("weights and noise scales must be finite and ≥ 0 (got {})", v);
  }
  if (!(layer_volatility >= 0 && layer_volatility <= 3)) {
    return invalid_argument("layer_volatility must be in [0, 3], got {}", layer_volatility);
  }
  if (burst_steps < 0 || tool_tokens < 0) return invalid_argument("burst_steps and tool_tokens must be ≥ 0");
  if (volatile_layers < 0 || !(volatile_noise >= 0 && volatile_noise <= 1000) ||
      !(layer_noise >= 0 && layer_noise <= 1000)) {
    return invalid_argument("volatile_layers must be ≥ 0, volatile_noise and layer_noise in [0, 1000], got {}, {} "
                            "and {}", volatile_layers, volatile_noise, layer_noise);
  }
  return validate_targets(*this);
}


namespace {

// The built-in scenarios: each base scenario's settings on top of the WorkloadParams defaults (in
// set()'s key=value form), before calibration; every base also has an "-mtp" variant (kMtpSettings).
struct ScenarioDef {
  const char* name;
  const char* settings;
  // The calibration entries (data/calibration.json) it takes its knobs from: its own, or else
  // interpolated between those whose names start with "<family>-" (each model's own points).
  const char* family = "doc-qa";
};
constexpr ScenarioDef kScenarios[] = {
    {"doc-qa-10k", "prompt_tokens=9700 steps=64 layers=4"},  // the paper's ~9.7K prompts
    // query_noise and head_spread: the calibration's starting point (long contexts churn more).
    {"doc-qa-94k", "prompt_tokens=94000 steps=32 layers=4 segment_tokens=3000 num_topics=24 query_noise=9.0 "
                   "head_spread=9.0"},
    {"agentic", "prompt_tokens=30000 steps=64 layers=4 segment_tokens=2000 burst_steps=16 tool_tokens=3000"},
    {"needle-shift", "prompt_tokens=32000 steps=64 layers=4 segment_tokens=1000 num_topics=32 shift_prob=0.15 "
                     "needle_prob=0.9"},
    {"cached-507k", "prompt_tokens=507000 steps=12 layers=2 segment_tokens=4000 num_topics=48"},
    // RULER-like multi-key NIAH at 128K, where pooled indexers fell (0.93 / 1.0 / 1.0 at 32K →
    // 0.43 / 0.36 / 0.21 at 128K): 8 asked needles of 8 tokens among 56 look-alike distractors;
    // a new needle every 6 steps, asked for 4 of them. The bar a needle entry must clear (the
    // k-th score) moves ~4× from step to step with the shared query noise; target_query 40 with
    // needle_key 3 clears it at every step (needle_key 1 lost whole episodes, ~0.78 of the asked
    // entries in the all-keep top-k); needle_similarity 0.3 keeps the other needles below it.
    {"niah-mk-128k", "prompt_tokens=128000 steps=48 layers=4 segment_tokens=3000 num_topics=24 needles=8 "
                     "needle_distractors=56 needle_tokens=8 needle_similarity=0.3 needle_key=3 target_period=6 "
                     "target_dwell=4 target_query=40"},
    // MRCR-like multi-round co-reference: 2000-token turns on 8 topics (~16 look-alikes each,
    // cosine 0.66 with segment_own 0.5); every 4 steps a round asks for one earlier turn. The
    // question pulls the top-k toward all the look-alikes, the asked one holding ~35 % of it
    // (target_query 28; above that the look-alikes grow with it).
    {"mrcr-256k", "prompt_tokens=256000 steps=48 layers=4 segment_tokens=2000 num_topics=8 segment_own=0.5 "
                  "target_period=4 target_query=28"},
    {"mrcr-1m", "prompt_tokens=1000000 steps=24 layers=2 segment_tokens=4000 num_topics=16 segment_own=0.5 "
                "target_period=4 target_query=28"},
    // DeepSeek-V4 Flash, calibrated to the SPIN paper's prev-iter figures on it (Pearson 0.876 /
    // 0.849, top-k recall 0.751 / 0.577 at 9.7K / 94K prompts): its CSA layers index one entry per
    // 4 tokens (2425 / 23500 entries) and keep the top 512. Segments in entries, as doc-qa's / 4.
    {"v4flash-10k", "prompt_tokens=2425 steps=64 layers=4 topk=512 segment_tokens=375 sink_tokens=1", "v4flash"},
    {"v4flash-94k", "prompt_tokens=23500 steps=32 layers=4 topk=512 segment_tokens=750 num_topics=24 sink_tokens=1 "
                    "query_noise=9.0 head_spread=9.0", "v4flash"},
    // Layers that differ as GVR measured DeepSeek-V3.2 decoding a 68,665-token SWE-bench prompt:
    // ~1.5 % consecutive-step top-k overlap in layers 0–1, 35–50 % in the middle ones. Six layers
    // on doc-qa's calibration at 68K; measured (seed 1, 16 steps): layers 0–1 0.066 / 0.054 (the
    // recency and sink entries every query keeps), layers 2–5 0.44–0.50. GVR's ~60 % with a
    // one-position shift is not modelled: these keys have no per-token diagonal.
    {"layers-68k", "prompt_tokens=68665 steps=32 layers=6 segment_tokens=3000 num_topics=24 layer_volatility=0 "
                   "volatile_layers=2 volatile_noise=40 layer_noise=1.6"},
};
constexpr const char* kMtpSuffix = "-mtp";
constexpr const char* kMtpSettings = "next_n=3 acceptance_rate=0.7";

// Applies space-separated key=value settings of the table above with WorkloadParams::set.
Status apply_settings(std::string_view settings, WorkloadParams& p) {
  return for_each_setting(settings, [&p](const std::string& key, const std::string& value) { return p.set(key, value); });
}

}  // namespace

const std::vector<std::string>& scenario_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> n;
    for (const ScenarioDef& d : kScenarios) n.emplace_back(d.name);
    for (const ScenarioDef& d : kScenarios) n.push_back(std::string(d.name) + kMtpSuffix);
    return n;
  }();
  return names;
}

namespace {

// Calibrated knobs (spin calibrate --write → data/calibration.json, compiled in). A calibrated
// scenario uses its own; any other interpolates each knob linearly in log(prompt_tokens) between
// the calibrated scenarios with the nearest shorter and longer prompts, clamped at the ends — the
// paper gives two context lengths, so that is all the data there is.
// A table that is there but unreadable is an error, not an uncalibrated build: every scenario
// would silently fall back to the defaults and every report would change.
Status apply_calibration(const std::string& base, const std::string& family, WorkloadParams& p) {
  if (std::string_view(kCalibrationJson).find_first_not_of(" \t\r\n") == std::string_view::npos) {
    return ok_status();  // no table compiled in: the defaults above
  }
  const nlohmann::json table = nlohmann::json::parse(kCalibrationJson, nullptr, /*allow_exceptions=*/false);
  if (!table.is_object() || !table.contains("scenarios") || !table["scenarios"].is_object()) {
    return data_loss("the compiled-in data/calibration.json is not a calibration table (no \"scenarios\" "
                     "object); rerun `spin calibrate --write data/calibration.json` and rebuild");
  }
  struct Point {
    double log_tokens;
    std::map<std::string, double> knobs;
  };
  std::vector<Point> points;
  for (const auto& [name, entry] : table["scenarios"].items()) {
    if (table["scenarios"].contains(base) && name != base) continue;  // its own calibration wins
    if (name != base && name.rfind(family + "-", 0) != 0) continue;   // another model's points
    if (!entry.is_object() || !entry.contains("params") || !entry["params"].is_object() ||
        !entry.contains("prompt_tokens") || !entry["prompt_tokens"].is_number())
      return data_loss("data/calibration.json: scenario {} lacks params or prompt_tokens", name);
    Point pt{std::log(entry["prompt_tokens"].get<double>()), {}};
    for (const auto& [key, value] : entry["params"].items()) {
      // Written as strings (the exact decimal calibrate printed) or numbers.
      const std::string text = value.is_string() ? value.get<std::string>() : value.dump();
      char* end = nullptr;
      const double v = std::strtod(text.c_str(), &end);
      if (text.empty() || end != text.c_str() + text.size() || !std::isfinite(v))
        return data_loss("data/calibration.json: scenario {} param {} = {} is not a number", name, key, text);
      pt.knobs[key] = v;
    }
    points.push_back(pt);
  }
  if (points.empty()) return ok_status();
  std::sort(points.begin(), points.end(), [](const Point& a, const Point& b) { return a.log_tokens < b.log_tokens; });
  const double x = std::log(static_cast<double>(p.prompt_tokens));
  size_t hi = 0;
  while (hi < points.size() && points[hi].log_tokens < x) ++hi;
  const Point& a = points[hi == 0 ? 0 : hi - 1];
  const Point& b = points[hi == points.size() ? points.size() - 1 : hi];
  const double t = b.log_tokens > a.log_tokens ? std::clamp((x - a.log_tokens) / (b.log_tokens - a.log_tokens), 0.0, 1.0) : 0.0;
  for (const auto& [key, value] : a.knobs) {
    const double other = b.knobs.count(key) ? b.knobs.at(key) : value;
    SPIN_RETURN_IF_ERROR(p.set(key, fmt::format("{}", value + t * (other - value))));
  }
  return ok_status();
}

}  // namespace

Result<WorkloadParams> scenario_params(std::string_view name) {
  std::string base(name);
  const std::string suffix = kMtpSuffix;
  const bool mtp = base.size() > suffix.size() && base.substr(base.size() - suffix.size()) == suffix;
  if (mtp) base = base.substr(0, base.size() - suffix.size());
  const ScenarioDef* def = nullptr;
  for (const ScenarioDef& d : kScenarios) {
    if (base == d.name) def = &d;
  }
  if (def == nullptr) {
    std::string names;
    for (const std::string& n : scenario_names()) names += (names.empty() ? "" : ", ") + n;
    return invalid_argument("unknown scenario '{}' (built in: {})", name, names);
  }
  WorkloadParams p;
  p.scenario = std::string(name);
  SPIN_RETURN_IF_ERROR(apply_settings(def->settings, p));
  if (mtp) SPIN_RETURN_IF_ERROR(apply_settings(kMtpSettings, p));
  SPIN_RETURN_IF_ERROR(apply_calibration(base, def->family, p));
  return p;
}

namespace {

// ---- generate_workload's stages, in the order it runs them ----------------------------------

// The fixed directions of the indexer space and the segments laid over the context.
struct Needle {
  int64_t begin = 0;
  int64_t end = 0;
  Vec direction{};
  bool asked = false;  // a target; otherwise a look-alike distractor
};

struct World {
  Vec v_sink{}, v_sal{};
  std::vector<Vec> topics;
  std::vector<Segment> segments;
  std::vector<Needle> needles;  // in position order

  // A segment [begin, end): a topic direction mixed with its own.
  void add_segment(const WorkloadParams& P, int64_t begin, int64_t end, bool focusable) {
    CounterRng rng(stream_key(P.seed, kTagSegment, segments.size()));
    const Vec& topic = topics[rng.below(topics.size())];
    Vec own = random_unit(rng);
    Segment seg;
    seg.begin = begin;
    seg.end = end;
    seg.focusable = focusable;
    const auto own_w = static_cast<float>(P.segment_own);  // 0.7 by default: the same float as 0.7f
    for (int k = 0; k < kDim; ++k) seg.direction[k] = 0.7f * topic[k] + own_w * own[k];
    normalise(seg.direction);
    segments.push_back(seg);
  }
};

// Needles at random depths: the prompt after the sinks is cut into one stretch per needle and each
// needle lands at a random offset in its own stretch (so they never overlap and cover every depth);
// which of them are asked for is a random choice of `needles` among all of them.
void place_needles(const WorkloadParams& P, World& w) {
  const int32_t total = P.needles + P.needle_distractors;
  if (total == 0) return;
  CounterRng rng(stream_key(P.seed, kTagNeedle));
  const Vec shared = random_unit(rng);
  const int64_t stretch = (P.prompt_tokens - P.sink_tokens) / total;
  const auto shared_w = static_cast<float>(std::sqrt(P.needle_similarity));
  const auto own_w = static_cast<float>(std::sqrt(1.0 - P.needle_similarity));
  for (int32_t i = 0; i < total; ++i) {
    CounterRng needle_rng(stream_key(P.seed, kTagNeedle, i));
    Needle n;
    n.begin = P.sink_tokens + i * stretch + static_cast<int64_t>(needle_rng.below(stretch - P.needle_tokens + 1));
    n.end = n.begin + P.needle_tokens;
    const Vec own = random_unit(needle_rng);
    for (int k = 0; k < kDim; ++k) n.direction[k] = shared_w * shared[k] + own_w * own[k];
    normalise(n.direction);
    w.needles.push_back(n);
  }
  // A partial Fisher–Yates shuffle picks the asked ones.
  std::vector<int32_t> order(static_cast<size_t>(total));
  for (int32_t i = 0; i < total; ++i) order[i] = i;
  for (int32_t i = 0; i < P.needles; ++i) {
    std::swap(order[i], order[i + rng.below(static_cast<uint64_t>(total - i))]);
    w.needles[order[i]].asked = true;
  }
}

// Shared directions, then the prompt: the sinks, then segments of 0.5–1.5× the mean length.
World make_prompt(const WorkloadParams& P) {
  World w;
  CounterRng global(stream_key(P.seed, kTagGlobal));
  w.v_sink = random_unit(global);
  w.v_sal = random_unit(global);
  w.topics.resize(static_cast<size_t>(P.num_topics));
  for (int32_t t = 0; t < P.num_topics; ++t) {
    CounterRng rng(stream_key(P.seed, kTagTopic, t));
    w.topics[t] = random_unit(rng);
  }
  CounterRng rng(stream_key(P.seed, kTagSegment, 0xFFFF));
  int64_t pos = P.sink_tokens;
  while (pos < P.prompt_tokens) {
    const auto len = static_cast<int64_t>(static_cast<double>(P.segment_tokens) * (0.5 + rng.uniform()));
    const int64_t end = std::min(P.prompt_tokens, pos + std::max<int64_t>(1, len));
    w.add_segment(P, pos, end, true);
    pos = end;
  }
  place_needles(P, w);
  return w;
}

// What the decode steps produced: each layer's focus per step, and the span each step decoded.
struct Timeline {
  std::vector<std::vector<Vec>> focus_at;            // [layer][step]
  std::vector<std::pair<int64_t, Vec>> decode_spans;  // (begin, direction) per step
  std::vector<WorkloadTarget> targets;               // the asking steps' targets, in step order
  std::vector<Vec> target_direction;                 // d_target of each of them
};

// A span the queries can ask for, and the direction the question carries.
struct TargetSpan {
  int64_t begin = 0;
  int64_t end = 0;
  const Vec* direction = nullptr;
};

// The candidates: the asked needles, or without needles the prompt's segments (MRCR's turns).
std::vector<TargetSpan> target_candidates(const World& w) {
  std::vector<TargetSpan> spans;
  for (const Needle& n : w.needles) {
    if (n.asked) spans.push_back({n.begin, n.end, &n.direction});
  }
  if (!w.needles.empty()) return spans;
  for (const Segment& g : w.segments) {
    if (g.focusable) spans.push_back({g.begin, g.end, &g.direction});
  }
  return spans;
}

// The retrieval schedule: episodes of target_period steps, each asking for a new target (never
// the previous one) during its first target_dwell steps (0 = the whole episode). The same target
// for every layer and MTP row: it is the question, not the layer's focus.
void schedule_targets(const WorkloadParams& P, const World& w, Timeline& tl) {
  if (P.target_period == 0) return;
  const std::vector<TargetSpan> candidates = target_candidates(w);
  if (candidates.empty()) return;
  const int32_t dwell = P.target_dwell == 0 ? P.target_period : P.target_dwell;
  int64_t current = -1;
  for (int32_t s = 0; s < P.steps; ++s) {
    const int32_t episode = s / P.target_period;
    if (s % P.target_period == 0) {
      CounterRng rng(stream_key(P.seed, kTagTarget, episode));
      if (candidates.size() == 1) {
        current = 0;
      } else {  // uniform over the others: draw among n-1 and skip past the current one
        auto pick = static_cast<int64_t>(rng.below(candidates.size() - (current >= 0 ? 1 : 0)));
        if (current >= 0 && pick >= current) ++pick;
        current = pick;
      }
    }
    if (s % P.target_period >= dwell) continue;
    const TargetSpan& t = candidates[static_cast<size_t>(current)];
    tl.targets.push_back({s, t.begin, t.end});
    tl.target_direction.push_back(*t.direction);
  }
}

// The step-by-step timeline: tool outputs appended between bursts, focus shifts (correlated across
// adjacent layers, sometimes onto never-attended needles) and drift, accepted drafts. Fills the
// trace's ctx_len and accepted; appends tool segments to the world.
Timeline simulate_steps(const WorkloadParams& P, World& w, Trace& trace) {
  const int32_t L = P.layers;
  const int32_t next_n = P.next_n;
  std::vector<FocusState> focus(static_cast<size_t>(L));
  for (int32_t l = 0; l < L; ++l) {
    CounterRng rng(stream_key(P.seed, kTagFocus, l, 0xF0C5));
    for (int32_t i = 0; i < P.focus_segments; ++i) {
      const int32_t g = pick_segment(rng, w.segments, focus[l].attended, false);
      focus[l].segments.push_back(g);
      focus[l].weights.push_back(0.5 + rng.uniform());
      focus[l].attended.insert(g);
    }
  }
  Timeline tl;
  tl.focus_at.resize(static_cast<size_t>(L));
  int64_t pos = P.prompt_tokens;
  for (int32_t s = 0; s < P.steps; ++s) {
    bool tool_output = false;
    if (P.burst_steps > 0 && s > 0 && s % P.burst_steps == 0 && P.tool_tokens > 0) {
      w.add_segment(P, pos, pos + P.tool_tokens, true);
      pos += P.tool_tokens;
      tool_output = true;
    }
    ShiftEvent previous;
    for (int32_t l = 0; l < L; ++l) {
      CounterRng rng(stream_key(P.seed, kTagFocus, l, s));
      FocusState& f = focus[l];
      ShiftEvent event;
      if (tool_output && rng.uniform() < P.tool_focus_prob) {
        event = {true, static_cast<size_t>(std::min_element(f.weights.begin(), f.weights.end()) - f.weights.begin()),
                 static_cast<int32_t>(w.segments.size() - 1)};
      } else if (l > 0 && previous.happened && rng.uniform() < P.layer_correlation) {
        event = previous;  // adjacent layers shift together
      } else if (rng.uniform() < P.shift_prob) {
        const bool needle = rng.uniform() < P.needle_prob;
        event = {true, static_cast<size_t>(rng.below(f.segments.size())),
                 pick_segment(rng, w.segments, f.attended, needle)};
      }
      if (event.happened && event.target >= 0) {
        f.segments[event.slot] = event.target;
        f.weights[event.slot] = 1.0 + rng.uniform();  // a fresh focus is strong
        f.attended.insert(event.target);
      }
      for (double& weight : f.weights) weight *= std::exp(P.focus_drift * rng.normal());
      tl.focus_at[l].push_back(focus_vector(f, w.segments));
      previous = event;
    }
    trace.ctx_len.push_back(pos + next_n);
    int32_t accepted = 0;
    if (next_n > 1) {
      CounterRng rng(stream_key(P.seed, kTagAccept, s));
      while (accepted < next_n - 1 && rng.uniform() < P.acceptance_rate) ++accepted;
      trace.accepted.push_back(accepted);
    }
    tl.decode_spans.emplace_back(pos, tl.focus_at[0].back());
    pos += (s + 1 < P.steps) ? accepted + 1 : next_n;  // the last step's rows all stay in the trace
  }
  schedule_targets(P, w, tl);
  return tl;
}

// Which direction each entry carries: sinks, segments, or the focus of the step that decoded it.
std::vector<const Vec*> entry_directions(const WorkloadParams& P, const World& w, const Timeline& tl,
                                         int64_t entries) {
  std::vector<const Vec*> dir(static_cast<size_t>(entries), nullptr);
  for (int64_t e = 0; e < std::min<int64_t>(P.sink_tokens, entries); ++e) dir[e] = &w.v_sink;
  for (const Segment& seg : w.segments) {
    for (int64_t e = seg.begin; e < std::min(seg.end, entries); ++e) dir[e] = &seg.direction;
  }
  for (const Needle& n : w.needles) {  // a needle replaces the haystack it sits in
    for (int64_t e = n.begin; e < n.end; ++e) dir[e] = &n.direction;
  }
  const auto& spans = tl.decode_spans;
  for (size_t i = 0; i < spans.size(); ++i) {
    const int64_t end = i + 1 < spans.size() ? spans[i + 1].first : entries;
    for (int64_t e = spans[i].first; e < end; ++e) {
      if (dir[e] == nullptr) dir[e] = &spans[i].second;
    }
  }
  for (int64_t e = 0; e < entries; ++e) {
    if (dir[e] == nullptr) dir[e] = &spans.back().second;  // tool gaps
  }
  return dir;
}

// Keys: per layer, per entry (direction + salience + noise + rope), quantised as the cache stores
// them; counter-based streams make this thread-count independent.
void make_keys(const WorkloadParams& P, const World& w, const std::vector<const Vec*>& entry_direction,
               Trace& trace) {
  const auto entries = static_cast<int64_t>(entry_direction.size());
  std::vector<float> salience(static_cast<size_t>(entries));
  const double run_weight = std::sqrt(P.salience_run_share);
  const double own_weight = std::sqrt(1.0 - P.salience_run_share);
  for (int64_t e = 0; e < entries; ++e) {
    CounterRng rng(stream_key(P.seed, kTagSalience, e));
    CounterRng run_rng(stream_key(P.seed, kTagSalience, 0x52554E, e / P.salience_run));
    const double g = run_weight * run_rng.normal() + own_weight * rng.normal();  // unit variance
    salience[e] = static_cast<float>(std::exp(P.salience_sigma * g - 0.5 * P.salience_sigma * P.salience_sigma));
  }
  // A needle's score comes from the question alone: without salience it is in nobody's top-k
  // until it is asked for, so history cannot know it beforehand.
  std::vector<uint8_t> needle(static_cast<size_t>(entries), 0);
  for (const Needle& n : w.needles) {
    std::fill(salience.begin() + n.begin, salience.begin() + n.end, 0.0f);
    std::fill(needle.begin() + n.begin, needle.begin() + n.end, uint8_t{1});
  }
  for (int32_t l = 0; l < P.layers; ++l) {
    TraceLayer& layer = trace.layers[l];
    layer.k.resize(static_cast<size_t>(entries) * kDim);
    layer.k_scale.resize(static_cast<size_t>(entries));
#pragma omp parallel for schedule(static)
    for (int64_t e = 0; e < entries; ++e) {
      CounterRng rng(stream_key(P.seed, kTagKeyNoise, l, e));
      float k[kDim];
      normal_fill(rng, k, kDim, P.key_noise / std::sqrt(double{kDim}));
      const Vec& dir = *entry_direction[e];
      const bool sink = e < P.sink_tokens;
      const float topic_w = static_cast<float>(needle[e] ? P.needle_key : P.key_topic);
      const float sal_w = sink ? 0.0f : static_cast<float>(P.key_salience) * salience[e];
      for (int d = 0; d < kDim; ++d) k[d] += topic_w * dir[d] + sal_w * w.v_sal[d];
      add_rope(k, e, P.rope_weight);
      layer.k_scale[e] = quantize_e4m3_block128(k, layer.k.data() + e * kDim);
    }
  }
}

// Queries: per layer, step, row and head (focus + head direction + salience + sink + noise + rope),
// quantised with the weights as vLLM's fused q-rope-quant does.
// Per-layer multipliers of query_noise: real models' layers churn at very different rates
// (SmolLM2's prev-iter top-k recall runs from 0.45 to 0.80 across its 30 layers). Layer l gets
// exp(layer_volatility · z_l), z_l evenly spaced over [-√3, √3] (unit variance, mean 0: the
// geometric mean stays 1), alternating low and high from layer to layer. Fixed, not drawn: every
// request (seed) has the same layers, so the calibrated means hold for any seed.
std::vector<double> layer_noise_scales(const WorkloadParams& P) {
  const int32_t L = P.layers;
  std::vector<double> scale(static_cast<size_t>(L), 1.0);
  for (int32_t l = 0; l < L && L >= 2; ++l) {
    const int32_t rank = l % 2 == 0 ? l / 2 : L - 1 - l / 2;  // 0, L-1, 1, L-2, ...
    const double z = std::sqrt(3.0) * (2.0 * (rank + 0.5) / L - 1.0);
    scale[l] = std::exp(P.layer_volatility * z);
  }
  for (int32_t l = 0; l < L; ++l) scale[l] *= l < P.volatile_layers ? P.volatile_noise : P.layer_noise;
  return scale;
}

// The direction step s's question asks for, or null on a step that asks nothing.
const Vec* asked_direction(const Timeline& tl, int32_t s) {
  const auto it = std::lower_bound(tl.targets.begin(), tl.targets.end(), s,
                                   [](const WorkloadTarget& t, int32_t step) { return t.step < step; });
  if (it == tl.targets.end() || it->step != s) return nullptr;
  return &tl.target_direction[static_cast<size_t>(it - tl.targets.begin())];
}

void make_queries(const WorkloadParams& P, const World& w, const Timeline& tl, Trace& trace) {
  const int32_t num_heads = P.num_heads;
  const int32_t next_n = P.next_n;
  const std::vector<double> noise_scale = layer_noise_scales(P);
  for (int32_t l = 0; l < P.layers; ++l) {
    TraceLayer& layer = trace.layers[l];
    std::vector<Vec> head_dir(static_cast<size_t>(num_heads));
    std::vector<float> raw_w(static_cast<size_t>(num_heads));
    for (int32_t h = 0; h < num_heads; ++h) {
      CounterRng rng(stream_key(P.seed, kTagHead, l, h));
      head_dir[h] = random_unit(rng);
      raw_w[h] = static_cast<float>(1.0 + 0.3 * rng.normal());
    }
    layer.q.resize(static_cast<size_t>(P.steps) * next_n * num_heads * kDim);
    layer.w.resize(static_cast<size_t>(P.steps) * next_n * num_heads);
#pragma omp parallel for schedule(static)
    for (int32_t s = 0; s < P.steps; ++s) {
      std::vector<float> q(static_cast<size_t>(next_n) * num_heads * kDim);
      std::vector<float> weights(static_cast<size_t>(next_n) * num_heads);
      const Vec& f = tl.focus_at[l][s];
      const Vec* target = asked_direction(tl, s);
      const auto target_w = static_cast<float>(P.target_query);
      for (int32_t j = 0; j < next_n; ++j) {
        // Each MTP row is its own token, so it draws its own per-step noise (the part that makes
        // top-k churn between tokens); otherwise draft rows would be row 0 shifted by a rope step
        // and prefix, row0 and all-rows replay could not be told apart. Row 0 keeps the stream a
        // plain trace has always used, so plain traces (and the calibration) are unchanged.
        CounterRng step_rng(j == 0 ? stream_key(P.seed, kTagQueryNoise, l, s)
                                   : stream_key(P.seed, kTagQueryNoise, l, s, 0x4D5450 /* "MTP" */, j));
        float shared_noise[kDim];
        normal_fill(step_rng, shared_noise, kDim, P.query_noise * noise_scale[l] / std::sqrt(double{kDim}));
        const int64_t position = trace.ctx_len[s] - next_n + j;
        for (int32_t h = 0; h < num_heads; ++h) {
          float* v = q.data() + (int64_t{j} * num_heads + h) * kDim;
          CounterRng rng(stream_key(P.seed, kTagQueryNoise, l, s, j, h));
          normal_fill(rng, v, kDim, P.head_noise / std::sqrt(double{kDim}));
          for (int d = 0; d < kDim; ++d) {
            v[d] += static_cast<float>(P.focus_weight) * f[d] + static_cast<float>(P.head_spread) * head_dir[h][d] +
                    static_cast<float>(P.query_salience) * w.v_sal[d] + static_cast<float>(P.sink_query) * w.v_sink[d] +
                    shared_noise[d];
          }
          if (target != nullptr) {
            for (int d = 0; d < kDim; ++d) v[d] += target_w * (*target)[d];
          }
          add_rope(v, position, P.rope_weight);
          weights[int64_t{j} * num_heads + h] = raw_w[h];
        }
      }
      const Status st = quantize_queries(q.data(), weights.data(), next_n, num_heads,
                                         layer.q.data() + static_cast<size_t>(s) * next_n * num_heads * kDim,
                                         layer.w.data() + static_cast<size_t>(s) * next_n * num_heads);
      (void)st;  // inputs are finite by construction
    }
  }
}

// "step:begin:end,..." — the metadata form of the targets (metadata values are strings).
std::string targets_text(const std::vector<WorkloadTarget>& targets) {
  std::string out;
  for (const WorkloadTarget& t : targets) {
    out += fmt::format("{}{}:{}:{}", out.empty() ? "" : ",", t.step, t.begin, t.end);
  }
  return out;
}

}  // namespace

double workload_trace_bytes(const WorkloadParams& p) {
  const double rows = static_cast<double>(p.steps) * p.next_n;
  const double bursts = p.burst_steps > 0 ? static_cast<double>(p.steps / p.burst_steps + 1) : 0.0;
  const double entries = static_cast<double>(p.prompt_tokens) + rows + bursts * static_cast<double>(p.tool_tokens);
  const double per_layer = entries * (kTraceHeadDim + 4) + rows * p.num_heads * (kTraceHeadDim + 4);
  return per_layer * p.layers;
}

Result<Trace> generate_workload(const WorkloadParams& P) {
  SPIN_RETURN_IF_ERROR(P.validate());
  // The trace is built whole in memory (and usually written); twice its size covers the working set.
  const double bytes = workload_trace_bytes(P);
  SPIN_RETURN_IF_ERROR(check_fits_in_memory(2 * bytes, fmt::format("a {:.1f} GiB trace", bytes / 1073741824.0)));
  World world = make_prompt(P);
  Trace trace;
  trace.meta.model = "synthetic:" + P.scenario;
  trace.meta.num_layers = P.layers;
  trace.meta.next_n = P.next_n;
  trace.meta.num_heads = P.num_heads;
  trace.meta.page_size = P.page_size;
  trace.meta.topk = P.topk;
  trace.meta.compress_ratio = 1;
  trace.meta.extra["workload"] = P.to_string();
  const Timeline timeline = simulate_steps(P, world, trace);
  const std::vector<const Vec*> directions = entry_directions(P, world, timeline, trace.ctx_len.back());
  trace.layers.resize(static_cast<size_t>(P.layers));
  make_keys(P, world, directions, trace);
  make_queries(P, world, timeline, trace);
  if (P.target_period > 0) trace.meta.extra["targets"] = targets_text(timeline.targets);
  SPIN_RETURN_IF_ERROR(validate_trace(trace));
  return trace;
}

Result<std::vector<WorkloadTarget>> workload_targets(const WorkloadParams& P) {
  SPIN_RETURN_IF_ERROR(P.validate());
  World world = make_prompt(P);
  Trace trace;  // simulate_steps fills its ctx_len; no keys or queries are built
  return simulate_steps(P, world, trace).targets;
}

}  // namespace spin
