// `spin replay FILE`: one trace through one predictor, measured against all-keep.
//
// Order of checks, all before the expensive all-keep scoring: flags (while parsing), outputs
// (writable, not the input, not each other), flag combinations, the trace's header and values
// (TraceReader::open), flags against the trace's own values, memory. A flag that contradicts
// the trace (`--set topk=1024` on a top-k 2048 trace) is an error, never a silent loser.
#include <fmt/format.h>

#include <map>

#include "cli.h"
#include "spin/files.h"
#include "spin/predict.h"
#include "spin/lab/replay.h"
#include "spin/settings.h"
#include "spin/trace.h"

namespace spin::cli {
namespace {

struct ReplayArgs {
  std::string file, json, dump;
  ReplayOptions options;
  bool cold_start = false;
  bool decode_jumps = false;
  int32_t topk = 0;  // --topk: 0 = the trace's own
  // Config fields set on the command line, in order: --sparsity, --explore, --pooling and
  // --mtp-update are spelled as the config keys they set, so the library checks them all alike.
  struct Field {
    std::string flag, key, value;
  };
  std::vector<Field> fields;
  std::vector<std::string> sets;
  std::string preset;  // --preset: applied before every field
};

Status apply_config(ReplayArgs& a) {
  if (!a.preset.empty()) {
    if (Status st = a.options.config.apply_preset(a.preset); !st.ok()) return invalid_argument_status("--preset: " + st.message());
  }
  for (const std::string& s : a.sets) {
    auto kv = split_setting(s);
    if (!kv.ok()) return invalid_argument_status("--set " + kv.status().message());
    a.fields.push_back({"--set", kv->key, kv->value});
  }
  for (const auto& [flag, key, value] : a.fields) {
    // Validated after each field, so that the message names the flag that broke a rule.
    Status st = a.options.config.set(key, value);
    if (st.ok()) st = a.options.config.validate();
    if (!st.ok()) return invalid_argument_status(flag + ": " + st.message());
  }
  return ok_status();
}

// page_size and topk come from the trace (topk from --topk where given); a different value on the
// command line is refused.
Status check_against_trace(const ReplayArgs& a, const TraceMeta& meta) {
  const int32_t topk = a.topk > 0 ? a.topk : meta.topk;
  const std::map<std::string, int32_t> from_trace = {{"page_size", meta.page_size}, {"topk", topk}};
  for (const auto& [flag, key, value] : a.fields) {
    const auto it = from_trace.find(key);
    if (it == from_trace.end()) continue;
    const int32_t mine = key == "topk" ? a.options.config.topk : a.options.config.page_size;
    if (mine != it->second) {
      return invalid_argument_status(fmt::format(
          "{} {}={} contradicts the trace, whose {} is {} (replay measures against the trace's own "
          "top-k, or --topk's, and page layout; drop the flag, or use --topk for another top-k)",
          flag, key, value, key, it->second));
    }
  }
  return ok_status();
}

Status check_outputs(const ReplayArgs& a) {
  const std::vector<std::string> inputs = {a.file};
  if (!a.json.empty()) SPIN_RETURN_IF_ERROR(check_output_path(a.json, inputs));
  if (!a.dump.empty()) SPIN_RETURN_IF_ERROR(check_output_path(a.dump, inputs));
  if (!a.json.empty() && !a.dump.empty()) {
    auto j = resolve_output_path(a.json), d = resolve_output_path(a.dump);
    if (j.ok() && d.ok() && j.value() == d.value()) {
      return invalid_argument_status("--json and --dump-topk name the same file " + a.json);
    }
  }
  return ok_status();
}

int run_replay_command(ReplayArgs& a) {
  if (Status s = apply_config(a); !s.ok()) return usage_error(s.message());
  if (a.options.open_loop && !a.dump.empty()) {
    return usage_error("--dump-topk needs a closed-loop replay: an open-loop replay has no top-k of its own");
  }
  if (Status s = check_outputs(a); !s.ok()) return fail(s);
  auto reader = TraceReader::open(a.file);
  if (!reader.ok()) return fail(reader.status());
  if (Status s = check_against_trace(a, reader->meta()); !s.ok()) return usage_error(s.message());
  const bool score_only = reader->kind() == TraceKind::kScores;
  if (score_only && predictor_needs_keys(a.options.predictor) && !reader->has_probe()) {
    return usage_error(fmt::format("{}: --predictor {} needs the indexer's keys and queries or a block probe, and "
                                   "this score trace (kind=scores) has no layer.{{l}}.probe; replay a key trace, a "
                                   "score trace with a probe, or a score-only predictor",
                                   a.file, a.options.predictor));
  }
  const bool keep_topk = !a.dump.empty();
  if (Status s = check_fits_in_memory(replay_memory_bytes(reader.value(), keep_topk), "replaying " + a.file); !s.ok()) {
    return fail(s);
  }
  // A key trace is scored by the real indexer; a score trace's scores are the all-keep truth.
  Trace trace;
  ScoreTrace score_trace_data;
  if (score_only) {
    score_trace_data = reader->to_score_trace();
  } else {
    trace = reader->to_trace();
  }
  const int64_t steps = reader->steps();
  const int32_t next_n = reader->meta().next_n;
  Progress progress;
  ScoreOptions so;
  so.topk = a.topk;
  so.progress = [&](int64_t d, int64_t t) {
    progress.update(score_only ? "top-k of the recorded scores" : "scoring (all-keep)",
                    0.5 * static_cast<double>(d) / static_cast<double>(t));
  };
  auto scored = score_only ? score_trace(score_trace_data, so) : score_trace(trace, so);
  if (!scored.ok()) return fail(Status(scored.status().code(), a.file + ": " + scored.status().message()));
  a.options.keep_topk = keep_topk;
  a.options.warm_start = !a.cold_start;
  a.options.prefill_jumps = !a.decode_jumps;
  a.options.progress = [&](int64_t d, int64_t t) {
    progress.update("replaying " + a.options.predictor, 0.5 + 0.5 * static_cast<double>(d) / static_cast<double>(t));
  };
  auto result = score_only ? replay(*scored.value(), a.options) : replay(trace, *scored.value(), a.options);
  progress.done();
  if (!result.ok()) return fail(Status(result.status().code(), a.file + ": " + result.status().message()));
  const std::string json =
      replay_json(a.file, result.value(), trace_facts(*scored.value(), a.options.config.block_entries()));
  fmt::print("{}", json);
  // The dump first: the JSON record, written last, says the whole replay succeeded.
  if (keep_topk) {
    if (Status s = write_topk_dump(a.dump, steps, next_n, result.value()); !s.ok()) return fail(s);
  }
  if (!a.json.empty()) {
    if (Status s = write_file_atomic(a.json, json); !s.ok()) return fail(s);
  }
  return 0;
}

}  // namespace

std::vector<Command> add_replay_command(CLI::App& app) {
  auto a = std::make_shared<ReplayArgs>();
  CLI::App* cmd = app.add_subcommand("replay", "replay a trace through a predictor, measured against all-keep");
  cmd->add_option("file", a->file, "trace file (spin trace gen, or recorded)")->required();
  cmd->add_option("--predictor", a->options.predictor, "predictor name (see spin config)")
      ->check(one_of(predictor_names(), "predictor"));
  const auto field = [&](const char* flag, const char* key, const char* help) {
    return cmd->add_option_function<std::string>(
        flag, [a, flag, key](const std::string& v) { a->fields.push_back({flag, key, v}); }, help);
  };
  field("--sparsity", "target_sparsity", "target block sparsity in [0, 1)")->check(sparsity());
  field("--explore", "explore_ratio", "exploration share of the budget, in [0, 1]");
  field("--pooling", "pooling", "max | mean | topk-hits | lse");
  field("--mtp-update", "mtp_update", "prefix | row0 | all-rows");
  cmd->add_option("--topk", a->topk,
                  "measure at this top-k instead of the trace's own: the truth is the top-k of the same scores "
                  "(a top-k 256 recording read at DSA's 2048)")
      ->check(int_range(1, kTraceMaxTopk));
  cmd->add_flag("--open-loop", a->options.open_loop, "the predictor sees every step's full scores");
  cmd->add_flag("--cold-start", a->cold_start, "do not give step 0's full scores (prefill) to the predictor");
  cmd->add_flag("--decode-jumps", a->decode_jumps,
                "replay a step whose ctx_len grows by more than its rows (a tool output, a new turn) as plain "
                "decode, not as an observed prefill");
  cmd->add_option("--from-step", a->options.count_from_step, "count samples from this step on (the replay runs whole)")
      ->check(int_range(0, int64_t{1} << 31));
  cmd->add_option("--to-step", a->options.count_to_step, "count samples before this step only")
      ->check(int_range(1, int64_t{1} << 31));
  cmd->add_option("--preset", a->preset, "config preset, applied before the other fields: default | paper (SPIN as published)")
      ->check(one_of(preset_names(), "preset"));
  cmd->add_option("--set", a->sets, "other config fields, key=value (see spin config)");
  cmd->add_option("--json", a->json, "write the metrics as one JSON object")->check(output_file());
  cmd->add_option("--dump-topk", a->dump, "write layer.{l}.topk i32 [steps, next_n, topk] (safetensors)")
      ->check(output_file());
  return {{cmd, [a] { return run_replay_command(*a); }}};
}

}  // namespace spin::cli
