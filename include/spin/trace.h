// spin/trace.h — recorded indexer inputs of one request: the trace file, schema version 1.
//
// A trace is a safetensors file (8-byte little-endian header length, JSON header, raw tensors), so a PyTorch/vLLM user can write it with the
// `safetensors` package (examples/record_trace.py shows how, with numpy only):
//
//   metadata (all values are strings, as safetensors requires):
//     format=spin-trace  version=1  model=<free text>  num_layers  next_n  num_heads
//     page_size  topk  compress_ratio          (other keys are kept in TraceMeta::extra)
//   per indexer layer l in 0..num_layers-1:
//     layer.{l}.k            U8  [entries, 128]          e4m3 key codes
//     layer.{l}.k_scale      F32 [entries]               per-entry key scale, finite and > 0
//     layer.{l}.q            U8  [steps, next_n, heads, 128]   e4m3 query codes
//     layer.{l}.w            F32 [steps, next_n, heads]  head weights, every scale folded in
//     layer.{l}.k_draft      U8  [steps, next_n-1, 128]  optional (MTP): draft keys a row saw
//     layer.{l}.k_draft_scale F32 [steps, next_n-1]      present iff k_draft is
//   shared:
//     ctx_len   I64 [steps]  tokens in the cache at the step, including its own next_n rows
//     accepted  I32 [steps]  MTP (required when next_n > 1): draft tokens accepted, 0..next_n-1
//
// Visibility. Row j (0..next_n-1) of step s is token t = ctx_len[s] - next_n + j and sees entries
// [0, visible) with visible = floor((t + 1) / compress_ratio) (spin/geometry.h's visible_entries): with compress_ratio 1 (V3.2) a token
// is an entry and this is [0, ctx_len - next_n + j + 1); with 4 (V4 CSA) it is the
// V4 rule "row s is visible iff s < floor((t+1)/4)". ctx_len therefore counts tokens.
//
// Decisions (where the schema above leaves room):
// - ctx_len must be strictly increasing: every decode step appends at least one token.
// - ctx_len[s] >= next_n (row 0 sees the step's own token), and the last step's last row may see
//   at most the layer's entries: floor(ctx_len[last] / compress_ratio) <= entries.
// - steps >= 1, and no size above the kTraceMax* limits below; head weights small enough that no
//   fp32 score can overflow (Σ_h |w| · 128 · 448² · max(1, max k_scale) ≤ FLT_MAX); e4m3 NaN codes (0x7F, 0xFF) in k, q or k_draft are rejected, as are non-finite w
//   and scales that are not finite and > 0. Extra tensors not starting with "layer." are ignored;
//   an unknown "layer.*" tensor is an error (it is most likely a misspelling).
// - Layers are numbered 0..num_layers-1 (indexer layers in model order, not model layer ids);
//   entries may differ between layers (each must cover the last step).
// - k, q and k_draft may also be stored as F8_E4M3 (what safetensors.torch writes for
//   torch.float8_e4m3fn): the bytes are the same. The writer always writes U8.
// - Views are zero-copy into the reader's bytes (the file read into memory up to
//   kTraceCopyBelowBytes, else its mapping); a tensor that a hand-written file puts at an offset
//   misaligned for its dtype is copied once at open (write_trace and the Python package align).
//
// Score traces (metadata kind=scores; kind=keys or no kind = the key trace above): what a serving
// engine's indexer logits buffer holds, recordable from vLLM, SGLang or a real model without the
// indexer's inputs (examples/record_score_trace.py):
//   metadata: format=spin-trace version=1 kind=scores model num_layers next_n page_size topk
//             compress_ratio (num_heads optional: a score trace has no heads)
//   per layer l:  layer.{l}.scores  F32 (or F16, BF16) [steps, next_n, entries]
//   shared:       ctx_len I64 [steps] as above; accepted I32 [steps] when next_n > 1
// Row j of step s sees the first visible_entries(ctx_len[s], next_n, j, compress_ratio) columns;
// columns at or beyond that are ignored whatever they hold (NaN padding included); inside, -inf
// means "scored, lowest" and NaN or +inf is an error naming layer, step, row and column. The same
// ctx_len / accepted rules as a key trace apply, and entries must cover the last step's last row.
// F16 and BF16 are widened to F32 once at open (exact); the writer always writes F32.
//
// The block probe (optional): what a query-guided predictor reads besides scores — this step's
// query scored against one pooled key per block, e.g. hisa's mean-pooled committed keys
// (predict/hisa.h) — so that such a predictor can replay a score trace:
//   metadata:     probe_block_entries  entries per pooled key (>= 1, <= 2^20; default page_size)
//   per layer l:  layer.{l}.probe  F32 (or F16, BF16) [steps, next_n, blocks],
//                 blocks = ceil(entries / probe_block_entries) of that layer's scores
// Every layer has one or none does. Row j of step s sees its first
// ceil(visible_entries / probe_block_entries) blocks; blocks beyond are ignored whatever they
// hold; inside, higher = more promising, -inf = lowest, and NaN or +inf is an error (+FLT_MAX is
// legal: hisa's "no committed entry yet, keep it"). probe_block_entries without probes is an error.
// A predictor that needs keys (predictor_needs_keys(): hisa) replays a score trace only when it
// carries the probe (at the predictor's block size); without it, it refuses in one line.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "spin/geometry.h"
#include "spin/status.h"

namespace spin {

inline constexpr int kTraceVersion = 1;
inline constexpr const char* kTraceFormat = "spin-trace";
inline constexpr int kTraceHeadDim = 128;  // indexer head dim, = kIndexerHeadDim

// The largest sizes a trace may claim, checked before anything is allocated (real models sit far
// below: DeepSeek-V3.2 has 61 indexer layers, 64 heads, top-k 2048, page 64, next_n ≤ 4; V4 a
// compress ratio of 4; 1M tokens of context is 2^20 entries).
inline constexpr int32_t kTraceMaxLayers = 1024;
inline constexpr int32_t kTraceMaxNextN = 16;
inline constexpr int32_t kTraceMaxHeads = 1024;
inline constexpr int32_t kTraceMaxPageSize = 65536;
inline constexpr int32_t kTraceMaxTopk = 65536;
inline constexpr int32_t kTraceMaxCompressRatio = 64;
inline constexpr int64_t kTraceMaxEntries = int64_t{1} << 26;
inline constexpr int64_t kTraceMaxSteps = int64_t{1} << 20;
inline constexpr int32_t kTraceMaxProbeBlockEntries = int32_t{1} << 20;  // = the largest block

// What a trace file holds: the indexer's inputs (keys, queries, weights) or its output scores.
enum class TraceKind { kKeys, kScores };
const char* trace_kind_name(TraceKind kind);  // "keys" "scores" (the metadata spelling)

struct TraceMeta {
  TraceKind kind = TraceKind::kKeys;  // metadata "kind"; absent = keys
  std::string model;          // free text, e.g. "deepseek-v3.2" or "synthetic:doc-qa-10k"
  int32_t num_layers = 0;     // indexer layers in the trace
  int32_t next_n = 1;         // rows per step: 1 + draft tokens
  int32_t num_heads = 64;     // indexer heads
  int32_t page_size = kDefaultPageSize;     // entries per cache page
  int32_t topk = 2048;        // indexer top-k of the model
  int32_t compress_ratio = 1; // tokens per entry: 1 (V3.2), 4 (V4 CSA)
  std::map<std::string, std::string> extra;  // other metadata keys, kept as they are
};

// One indexer layer of an in-memory trace. Shapes as in the schema above; k_draft and
// k_draft_scale are empty when the trace has no draft keys.
struct TraceLayer {
  std::vector<uint8_t> k;              // [entries, 128]
  std::vector<float> k_scale;          // [entries]
  std::vector<uint8_t> q;              // [steps, next_n, heads, 128]
  std::vector<float> w;                // [steps, next_n, heads]
  std::vector<uint8_t> k_draft;        // [steps, next_n-1, 128] or empty
  std::vector<float> k_draft_scale;    // [steps, next_n-1] or empty
};

// An owning trace, for generators and writers.
struct Trace {
  TraceMeta meta;
  std::vector<int64_t> ctx_len;   // [steps]
  std::vector<int32_t> accepted;  // [steps], or empty when next_n == 1
  std::vector<TraceLayer> layers; // [num_layers]

  int64_t steps() const { return static_cast<int64_t>(ctx_len.size()); }
};

// An owning score trace (kind=scores). meta.kind must be kScores; meta.num_heads is not used.
struct ScoreTrace {
  TraceMeta meta;
  std::vector<int64_t> ctx_len;   // [steps]
  std::vector<int32_t> accepted;  // [steps], or empty when next_n == 1
  std::vector<int64_t> entries;   // [num_layers] columns of each layer's scores
  std::vector<std::vector<float>> scores;  // [num_layers][steps, next_n, entries]
  // The optional block probe (see above): empty, or [num_layers][steps, next_n, probe_blocks(l)].
  std::vector<std::vector<float>> probe;
  int32_t probe_block_entries = 0;  // metadata probe_block_entries; 0 = page_size

  int64_t steps() const { return static_cast<int64_t>(ctx_len.size()); }
  bool has_probe() const { return !probe.empty(); }
  int32_t probe_entries() const { return probe_block_entries > 0 ? probe_block_entries : meta.page_size; }
  int64_t probe_blocks(int layer) const { return (entries[layer] + probe_entries() - 1) / probe_entries(); }
  // Row `row` of step `step` of `layer`: entries[layer] floats (valid indices only).
  const float* row(int layer, int64_t step, int r) const {
    return scores[layer].data() + ((step * meta.next_n + r) * entries[layer]);
  }
  // The probe of that row: probe_blocks(layer) floats (has_probe() only).
  const float* probe_row(int layer, int64_t step, int r) const {
    return probe[layer].data() + ((step * meta.next_n + r) * probe_blocks(layer));
  }
};

// Checks every rule of the schema (sizes, values); the same checks the reader applies.
Status validate_trace(const Trace& trace);
Status validate_score_trace(const ScoreTrace& trace);
// Validates, then writes atomically (F32 scores), as write_trace.
Status write_score_trace(const ScoreTrace& trace, const std::string& path);

// Validates, then writes atomically (temporary file in the same directory, fsync, rename):
// an invalid trace or an I/O failure leaves nothing behind and an existing `path` untouched.
Status write_trace(const Trace& trace, const std::string& path);

// A validated trace file, read into memory or memory-mapped (or borrowed), read in place. Every view below is
// valid while the reader lives. Accessors take valid indices (layer < num_layers, step < steps,
// row < next_n); out of range they return empty spans / 0.
// Files up to this size are read into memory at open; larger ones are memory-mapped (see
// TraceReader::mapped). The cost of each is measured in the README's Python section.
inline constexpr uint64_t kTraceCopyBelowBytes = uint64_t{256} << 20;

class TraceReader {
 public:
  static Result<TraceReader> open(const std::string& path, uint64_t copy_below_bytes = kTraceCopyBelowBytes);
  // Validates `size` bytes at `data`; the caller keeps them alive and unchanged while the reader
  // (and any view from it) lives. For fuzzing and in-memory pipelines.
  static Result<TraceReader> from_memory(const void* data, size_t size);

  TraceReader(TraceReader&&) noexcept;
  TraceReader& operator=(TraceReader&&) noexcept;
  ~TraceReader();

  const TraceMeta& meta() const;
  TraceKind kind() const { return meta().kind; }
  int32_t num_layers() const { return meta().num_layers; }
  int64_t steps() const;
  int64_t entries(int layer) const;
  uint64_t file_size() const;
  const std::string& path() const;  // "<memory>" for from_memory
  // A file up to copy_below_bytes (256 MiB) is copied into memory at open (truncating or rewriting it afterwards
  // changes nothing the reader shows); a larger one is memory-mapped, and check_unchanged() is
  // kDataLoss once it is shorter than at open — reading a mapped file's lost tail would be SIGBUS,
  // so callers that hand out views of a long-lived reader (the Python bindings) call it first.
  bool mapped() const;
  Status check_unchanged() const;

  std::span<const int64_t> ctx_len() const;   // [steps]
  std::span<const int32_t> accepted() const;  // [steps], empty when absent
  bool has_draft_keys() const;
  // Entries row `row` of step `step` sees (see "Visibility" above).
  int64_t visible_entries(int64_t step, int row) const;

  std::span<const uint8_t> k(int layer) const;        // [entries, 128]
  std::span<const float> k_scale(int layer) const;    // [entries]
  std::span<const uint8_t> q(int layer) const;                 // [steps, next_n, heads, 128]
  std::span<const float> w(int layer) const;                   // [steps, next_n, heads]
  std::span<const uint8_t> q(int layer, int64_t step) const;  // [next_n, heads, 128]
  std::span<const uint8_t> q(int layer, int64_t step, int row) const;  // [heads, 128]
  std::span<const float> w(int layer, int64_t step) const;    // [next_n, heads]
  std::span<const float> w(int layer, int64_t step, int row) const;    // [heads]
  std::span<const uint8_t> k_draft(int layer, int64_t step) const;     // [next_n-1, 128]
  std::span<const float> k_draft_scale(int layer, int64_t step) const; // [next_n-1]

  // Score traces: [steps, next_n, entries] of `layer` as F32 (widened at open from F16/BF16), and
  // one row ([entries]; only its first visible_entries(step, row) columns mean anything).
  // Empty for a key trace; k, q, w and the draft views are empty for a score trace.
  std::span<const float> scores(int layer) const;
  std::span<const float> scores(int layer, int64_t step, int row) const;
  // The block probe, when the score trace carries one: [steps, next_n, probe_blocks(layer)] and
  // one row of it. Empty without a probe (has_probe() false, probe_block_entries() 0).
  bool has_probe() const;
  int32_t probe_block_entries() const;
  int64_t probe_blocks(int layer) const;
  std::span<const float> probe(int layer) const;
  std::span<const float> probe(int layer, int64_t step, int row) const;

  // Copies the whole trace into memory (to_trace: a key trace; to_score_trace: a score trace;
  // the other kind gives an empty trace).
  Trace to_trace() const;
  ScoreTrace to_score_trace() const;

 private:
  struct Impl;
  explicit TraceReader(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

// Reads and validates a trace file into memory (open + to_trace / to_score_trace); a file of the
// other kind is refused in one line naming its kind.
Result<Trace> read_trace(const std::string& path);
Result<ScoreTrace> read_score_trace(const std::string& path);

// A human-readable multi-line summary (for `spin trace info`): kind, model, layers, steps, next_n,
// heads, entries, ctx_len range, page_size, topk, compress_ratio, draft keys, block probe, size on disk.
std::string describe(const TraceReader& reader);

}  // namespace spin
