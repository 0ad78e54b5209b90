// ServingPredictor (spin/serving.h): the batched, slot-indexed front of the predictors. Owns one
// BlockPredictor per slot, created and reserve()d at create() for the largest context and next_n,
// and the per-slot Selection they write into; add() rebinds a slot's predictor to a request id
// (reset, capacity kept), so the steady state allocates nothing. It validates every argument of a
// batch call before touching any slot, so a rejected call changes nothing; an error the
// predictor itself reports (protocol order) names the slot and request.
#include "spin/serving.h"

#include <algorithm>
#include <array>
#include <new>
#include <vector>

#include "core/errors.h"
#include "spin/memory.h"

namespace spin {

Status ServingOptions::validate() const {
  const PredictorInfo* info = find_predictor(predictor);
  if (info == nullptr) return invalid_argument("serving: unknown predictor '{}'", predictor);
  if (!info->can_serve)
    return invalid_argument("serving: predictor {} reads {}, which serving does not have; use it "
                            "through replay",
                            predictor, predictor_reads_name(info->reads));
  SPIN_RETURN_IF_ERROR(config.validate());
  if (max_requests < 1 || max_requests > (1 << 20))
    return invalid_argument("serving: max_requests {} is outside 1..2^20", max_requests);
  if (num_layers < 1 || num_layers > 1024)
    return invalid_argument("serving: num_layers {} is outside 1..1024", num_layers);
  if (max_next_n < 1 || max_next_n > kMaxNextN)
    return invalid_argument("serving: max_next_n {} is outside 1..{}", max_next_n, kMaxNextN);
  if (compress_ratio < 1 || compress_ratio > 64)
    return invalid_argument("serving: compress_ratio {} is outside 1..64", compress_ratio);
  if (max_entries < 1 || max_entries > (int64_t{1} << 31))
    return invalid_argument("serving: max_entries {} is outside 1..2^31", max_entries);
  return ok_status();
}

namespace {

// What create() reserves (capacities, not the sizes in use): per slot its predictor's own
// (spin::planned_bytes: state, pending rows, scratch) and the Selection; once the scatter row and
// the block list. In double, so that an absurd request is measured (and refused) instead of
// overflowing.
double planned_bytes(const ServingOptions& o, int64_t max_blocks) {
  const double n = static_cast<double>(max_blocks);
  const double entries = static_cast<double>(o.max_entries);
  const PredictorInfo* info = find_predictor(o.predictor);  // validate() checked the name
  const double predictor = spin::planned_bytes(*info, o.config, o.num_layers, o.max_entries, o.max_next_n);
  const double per_slot = predictor + n * sizeof(int32_t) * (1 + o.max_next_n);
  return o.max_requests * per_slot + entries * sizeof(float) + n * sizeof(int32_t);
}

}  // namespace

struct ServingPredictor::Impl {
  struct Slot {
    std::unique_ptr<BlockPredictor> predictor;
    bool active = false;
    int64_t request_id = -1;
    int64_t step = 0;           // the next step number of this slot
    bool open = false;          // a step is open (selected, not committed)
    bool prefill = false;       // the open step is a prefill (observed at once; commit closes it)
    int32_t next_n = 0;         // rows of the open step
    int32_t layer = -1;         // the layer of the last select (observe must match it)
    bool observed = true;       // that layer's rows were observed
    uint64_t select_call = 0;   // which select() call opened that layer (observe must repeat its
    int32_t select_pos = 0;     // slots in its order: the rows of logits are laid out by it)
    int32_t select_batch = 0;
    std::array<int64_t, kMaxNextN> visible{};
    Selection sel;
  };

  ServingOptions options;
  int32_t max_blocks = 0;
  int32_t block_entries = 0;
  std::vector<Slot> slots;
  std::vector<uint32_t> seen;  // per slot: the batch epoch it was last listed in (duplicates)
  uint32_t epoch = 0;
  uint64_t select_calls = 0;   // numbers select() calls, so observe can tell them apart
  std::vector<float> scatter;       // [max_entries] observe_scored's full-width row
  std::vector<int32_t> all_blocks;  // [max_blocks] 0..max_blocks-1 (prefill scores everything)

  std::string who(int32_t s) const {
    return fmt::format("serving: slot {} (request {})", s, slots[static_cast<size_t>(s)].request_id);
  }
  Status with_slot(const Status& st, int32_t s) const {
    if (st.ok()) return st;
    return {st.code(), who(s) + ": " + st.message()};
  }
  // Slots in range, active and distinct; an empty batch is fine.
  Status check_slots(const int32_t* ids, int32_t batch, const char* call) {
    if (batch < 0 || batch > options.max_requests)
      return invalid_argument("serving: {}: batch {} is outside 0..max_requests = {}", call, batch,
                              options.max_requests);
    if (batch > 0 && ids == nullptr) return invalid_argument("serving: {}: slots is null", call);
    if (++epoch == 0) {  // wrapped: forget every mark
      std::fill(seen.begin(), seen.end(), 0u);
      epoch = 1;
    }
    for (int32_t i = 0; i < batch; ++i) {
      const int32_t s = ids[i];
      if (s < 0 || s >= options.max_requests)
        return out_of_range("serving: {}: slots[{}] = {} is outside 0..{}", call, i, s,
                            options.max_requests - 1);
      if (!slots[static_cast<size_t>(s)].active)
        return failed_precondition("serving: {}: slot {} is free (add(slot, request_id) first)",
                                   call, s);
      if (seen[static_cast<size_t>(s)] == epoch)
        return invalid_argument("serving: {}: slot {} is listed twice", call, s);
      seen[static_cast<size_t>(s)] = epoch;
    }
    return ok_status();
  }
  Status check_layer(int32_t layer, const char* call) const {
    if (layer < 0 || layer >= options.num_layers)
      return out_of_range("serving: {}: layer {} is outside 0..{}", call, layer,
                          options.num_layers - 1);
    return ok_status();
  }
  // Entries row `row` of `next_n` sees at seq_len (tokens).
  int64_t visible(int64_t seq_len, int32_t next_n, int32_t row) const {
    return visible_entries(seq_len, next_n, row, options.compress_ratio);
  }
  // Step input of a slot; `vis` receives each row's visible entries.
  StepInput step_input(const Slot& slot, int64_t seq_len, int32_t next_n,
                       std::array<int64_t, kMaxNextN>& vis) const {
    for (int32_t j = 0; j < next_n; ++j) vis[static_cast<size_t>(j)] = visible(seq_len, next_n, j);
    StepInput in;
    in.step = slot.step;
    in.next_n = next_n;
    in.num_entries = vis[static_cast<size_t>(next_n - 1)];
    if (options.compress_ratio > 1) in.visible_entries = vis.data();
    return in;
  }
  Status check_seq_lens(const int64_t* seq_lens, int32_t batch, int32_t next_n,
                        const char* call) const {
    if (batch > 0 && seq_lens == nullptr) return invalid_argument("serving: {}: seq_lens is null", call);
    for (int32_t i = 0; i < batch; ++i) {
      if (seq_lens[i] < next_n)
        return invalid_argument("serving: {}: seq_lens[{}] = {} is below next_n = {} (it counts the "
                                "step's own rows)",
                                call, i, seq_lens[i], next_n);
      const int64_t entries = visible(seq_lens[i], next_n, next_n - 1);
      if (entries > options.max_entries)
        return resource_exhausted("serving: {}: seq_lens[{}] = {} needs {} entries, above "
                                  "max_entries = {} given at create()",
                                  call, i, seq_lens[i], entries, options.max_entries);
    }
    return ok_status();
  }
  // observe / observe_scored: every slot selected `layer` in its open step and not observed it.
  Status check_observe(const int32_t* ids, int32_t batch, int32_t layer, const char* call) {
    SPIN_RETURN_IF_ERROR(check_layer(layer, call));
    SPIN_RETURN_IF_ERROR(check_slots(ids, batch, call));
    for (int32_t i = 0; i < batch; ++i) {
      const Slot& slot = slots[static_cast<size_t>(ids[i])];
      if (!slot.open || slot.layer != layer || slot.observed)
        return failed_precondition("{}: {}(layer {}) must follow select(layer {}) of the open step",
                                   who(ids[i]), call, layer, layer);
    }
    // Row r of the logits belongs to slots[r / next_n] only if these are the select's slots, all
    // of them, in its order: another list would be read as the wrong requests' rows.
    for (int32_t i = 0; i < batch; ++i) {
      const Slot& slot = slots[static_cast<size_t>(ids[i])];
      const Slot& first = slots[static_cast<size_t>(ids[0])];
      if (slot.select_call != first.select_call || slot.select_pos != i || slot.select_batch != batch)
        return invalid_argument("serving: {}: slots must be those of select(layer {}) in the same order "
                                "(slots[{}] = {} was position {} of a select of {} slots; this call "
                                "lists {})",
                                call, layer, i, ids[i], slot.select_pos, slot.select_batch, batch);
    }
    return ok_status();
  }
  Status check_topk(const int32_t* topk, int64_t topk_stride, const char* call) const {
    if (topk != nullptr && topk_stride < options.config.topk)
      return invalid_argument("serving: {}: topk_stride {} is below topk = {}", call, topk_stride,
                              options.config.topk);
    return ok_status();
  }
};

ServingPredictor::ServingPredictor(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ServingPredictor::~ServingPredictor() = default;

Result<std::unique_ptr<ServingPredictor>> ServingPredictor::create(const ServingOptions& options) {
  SPIN_RETURN_IF_ERROR(options.validate());
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->block_entries = options.config.block_entries();
  const int64_t max_blocks = blocks_for_entries(options.config, options.max_entries);
  if (max_blocks > INT32_MAX) return invalid_argument("serving: {} blocks do not fit int32", max_blocks);
  impl->max_blocks = static_cast<int32_t>(max_blocks);
  // Refused before the first slot is allocated, in the CLI's GiB terms, not after touching part of it.
  SPIN_RETURN_IF_ERROR(check_fits_in_memory(
      planned_bytes(options, max_blocks),
      fmt::format("serving: {} slots × {} layers × {} blocks", options.max_requests, options.num_layers, max_blocks)));
  try {
    impl->slots.resize(static_cast<size_t>(options.max_requests));
    impl->seen.assign(static_cast<size_t>(options.max_requests), 0u);
    impl->scatter.assign(static_cast<size_t>(options.max_entries), 0.0f);
    impl->all_blocks.resize(static_cast<size_t>(max_blocks));
    for (int32_t b = 0; b < impl->max_blocks; ++b) impl->all_blocks[static_cast<size_t>(b)] = b;
    const size_t n = static_cast<size_t>(max_blocks);
    for (Impl::Slot& slot : impl->slots) {
      auto made = make_predictor(options.predictor, options.config, options.num_layers, -1);
      if (!made.ok()) return made.status();
      slot.predictor = std::move(made).value();
      SPIN_RETURN_IF_ERROR(slot.predictor->reserve(options.max_entries, options.max_next_n));
      Selection& sel = slot.sel;
      sel.blocks.reserve(n);
      sel.row_blocks.resize(static_cast<size_t>(options.max_next_n));
      for (auto& r : sel.row_blocks) r.reserve(n);
      sel.row_budget.reserve(kMaxNextN);
      sel.row_explored.reserve(kMaxNextN);
      sel.row_probed.reserve(kMaxNextN);
    }
  } catch (const std::bad_alloc&) {
    return resource_exhausted("serving: no memory for {} slots × {} layers × {} blocks",
                              options.max_requests, options.num_layers, max_blocks);
  }
  return std::unique_ptr<ServingPredictor>(new ServingPredictor(std::move(impl)));
}

const ServingOptions& ServingPredictor::options() const { return impl_->options; }
int32_t ServingPredictor::max_blocks() const { return impl_->max_blocks; }
int32_t ServingPredictor::block_entries() const { return impl_->block_entries; }

Status ServingPredictor::add(int32_t slot, int64_t request_id) {
  Impl& m = *impl_;
  if (slot < 0 || slot >= m.options.max_requests)
    return out_of_range("serving: add: slot {} is outside 0..{}", slot, m.options.max_requests - 1);
  if (request_id < 0) return invalid_argument("serving: add: request_id {} < 0", request_id);
  Impl::Slot& s = m.slots[static_cast<size_t>(slot)];
  if (s.active)
    return failed_precondition("serving: add: slot {} holds request {}; drop(slot) first", slot,
                               s.request_id);
  s.predictor->rebind(request_id);
  s.active = true;
  s.request_id = request_id;
  s.step = 0;
  s.open = false;
  s.prefill = false;
  s.layer = -1;
  s.observed = true;
  return ok_status();
}

Status ServingPredictor::drop(int32_t slot) {
  Impl& m = *impl_;
  if (slot < 0 || slot >= m.options.max_requests)
    return out_of_range("serving: drop: slot {} is outside 0..{}", slot, m.options.max_requests - 1);
  Impl::Slot& s = m.slots[static_cast<size_t>(slot)];
  if (!s.active) return failed_precondition("serving: drop: slot {} is already free", slot);
  s.predictor->reset();
  s.active = false;
  s.request_id = -1;
  s.open = false;
  s.prefill = false;
  return ok_status();
}

bool ServingPredictor::active(int32_t slot) const {
  return slot >= 0 && slot < impl_->options.max_requests && impl_->slots[static_cast<size_t>(slot)].active;
}
int64_t ServingPredictor::request_id(int32_t slot) const {
  return active(slot) ? impl_->slots[static_cast<size_t>(slot)].request_id : -1;
}
int64_t ServingPredictor::step(int32_t slot) const {
  return active(slot) ? impl_->slots[static_cast<size_t>(slot)].step : 0;
}
int32_t ServingPredictor::open_next_n(int32_t slot) const {
  if (!active(slot)) return 0;
  const Impl::Slot& s = impl_->slots[static_cast<size_t>(slot)];
  return s.open ? s.next_n : 0;
}

Status ServingPredictor::select(const int32_t* slots, int32_t batch, int32_t layer,
                                const int64_t* seq_lens, int32_t next_n, int32_t* blocks,
                                int64_t blocks_stride, int32_t* counts) {
  Impl& m = *impl_;
  SPIN_RETURN_IF_ERROR(m.check_layer(layer, "select"));
  if (next_n < 1 || next_n > m.options.max_next_n)
    return invalid_argument("serving: select: next_n {} is outside 1..max_next_n = {}", next_n,
                            m.options.max_next_n);
  SPIN_RETURN_IF_ERROR(m.check_slots(slots, batch, "select"));
  SPIN_RETURN_IF_ERROR(m.check_seq_lens(seq_lens, batch, next_n, "select"));
  if (batch > 0 && blocks == nullptr) return invalid_argument("serving: select: blocks is null");
  if (blocks_stride < m.max_blocks)
    return invalid_argument("serving: select: blocks_stride {} is below max_blocks = {}",
                            blocks_stride, m.max_blocks);
  for (int32_t i = 0; i < batch; ++i) {
    const Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    if (s.prefill)
      return failed_precondition("{}: select: a prefill is open; commit it first", m.who(slots[i]));
    if (s.open && s.next_n != next_n)
      return invalid_argument("{}: select: next_n {} differs from the open step's {}", m.who(slots[i]),
                              next_n, s.next_n);
    if (s.open && !s.observed)
      return failed_precondition("{}: select(layer {}): layer {} was selected but not observed",
                                 m.who(slots[i]), layer, s.layer);
  }
  const uint64_t call = ++m.select_calls;
  for (int32_t i = 0; i < batch; ++i) {
    Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    std::array<int64_t, kMaxNextN> vis{};
    const StepInput in = m.step_input(s, seq_lens[i], next_n, vis);
    SPIN_RETURN_IF_ERROR(m.with_slot(s.predictor->select(layer, in, &s.sel), slots[i]));
    s.open = true;
    s.next_n = next_n;
    s.layer = layer;
    s.observed = false;
    s.visible = vis;
    s.select_call = call;
    s.select_pos = i;
    s.select_batch = batch;
    const int64_t n = static_cast<int64_t>(s.sel.blocks.size());
    for (int32_t j = 0; j < next_n; ++j) {
      const int64_t r = int64_t{i} * next_n + j;
      int32_t* out = blocks + r * blocks_stride;
      std::copy(s.sel.blocks.begin(), s.sel.blocks.end(), out);
      std::fill(out + n, out + m.max_blocks, -1);
      if (counts) counts[r] = static_cast<int32_t>(n);
    }
  }
  return ok_status();
}

Status ServingPredictor::observe(const int32_t* slots, int32_t batch, int32_t layer,
                                 const float* logits, int64_t logits_stride, int64_t logits_cols,
                                 const int32_t* topk, int64_t topk_stride) {
  Impl& m = *impl_;
  SPIN_RETURN_IF_ERROR(m.check_observe(slots, batch, layer, "observe"));
  SPIN_RETURN_IF_ERROR(m.check_topk(topk, topk_stride, "observe"));
  if (batch > 0 && logits == nullptr) return invalid_argument("serving: observe: logits is null");
  if (logits_stride < logits_cols)
    return invalid_argument("serving: observe: logits_stride {} is below logits_cols {}",
                            logits_stride, logits_cols);
  for (int32_t i = 0; i < batch; ++i) {
    const Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    const int64_t need = s.visible[static_cast<size_t>(s.next_n - 1)];
    if (logits_cols < need)
      return invalid_argument("{}: observe: logits_cols {} is below the {} entries its rows see",
                              m.who(slots[i]), logits_cols, need);
  }
  for (int32_t i = 0; i < batch; ++i) {
    Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    for (int32_t j = 0; j < s.next_n; ++j) {
      const int64_t r = int64_t{i} * s.next_n + j;
      RowScores rs;
      rs.scores = logits + r * logits_stride;
      rs.num_cols = logits_cols;
      rs.visible_entries = s.visible[static_cast<size_t>(j)];
      rs.scored_blocks = s.sel.blocks.data();
      rs.num_scored_blocks = static_cast<int64_t>(s.sel.blocks.size());
      rs.topk_positions = topk ? topk + r * topk_stride : nullptr;
      SPIN_RETURN_IF_ERROR(m.with_slot(s.predictor->observe(layer, j, rs), slots[i]));
    }
    s.observed = true;
  }
  return ok_status();
}

Status ServingPredictor::observe_scored(const int32_t* slots, int32_t batch, int32_t layer,
                                        const float* scored, int64_t scored_stride,
                                        const int32_t* topk, int64_t topk_stride) {
  Impl& m = *impl_;
  SPIN_RETURN_IF_ERROR(m.check_observe(slots, batch, layer, "observe_scored"));
  SPIN_RETURN_IF_ERROR(m.check_topk(topk, topk_stride, "observe_scored"));
  if (batch > 0 && scored == nullptr) return invalid_argument("serving: observe_scored: scored is null");
  const int64_t E = m.block_entries;
  for (int32_t i = 0; i < batch; ++i) {
    const Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    const int64_t need = static_cast<int64_t>(s.sel.blocks.size()) * E;
    if (scored_stride < need)
      return invalid_argument("{}: observe_scored: scored_stride {} is below its {} blocks × {} entries",
                              m.who(slots[i]), scored_stride, s.sel.blocks.size(), E);
  }
  float* full = m.scatter.data();
  for (int32_t i = 0; i < batch; ++i) {
    Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    for (int32_t j = 0; j < s.next_n; ++j) {
      const int64_t r = int64_t{i} * s.next_n + j;
      const int64_t vis = s.visible[static_cast<size_t>(j)];
      const float* src = scored + r * scored_stride;
      // Scatter the compact row back to request-local positions; pooling reads only the scored
      // blocks' visible entries, so the rest of `full` is never looked at (no fill needed).
      for (size_t c = 0; c < s.sel.blocks.size(); ++c) {
        const int64_t begin = int64_t{s.sel.blocks[c]} * E;
        const int64_t len = std::min<int64_t>(E, vis - begin);
        if (len > 0) std::copy(src + static_cast<int64_t>(c) * E, src + static_cast<int64_t>(c) * E + len, full + begin);
      }
      RowScores rs;
      rs.scores = full;
      rs.num_cols = vis;
      rs.visible_entries = vis;
      rs.scored_blocks = s.sel.blocks.data();
      rs.num_scored_blocks = static_cast<int64_t>(s.sel.blocks.size());
      rs.topk_positions = topk ? topk + r * topk_stride : nullptr;
      SPIN_RETURN_IF_ERROR(m.with_slot(s.predictor->observe(layer, j, rs), slots[i]));
    }
    s.observed = true;
  }
  return ok_status();
}

Status ServingPredictor::commit(const int32_t* slots, int32_t batch, const int32_t* accepted) {
  Impl& m = *impl_;
  SPIN_RETURN_IF_ERROR(m.check_slots(slots, batch, "commit"));
  if (batch > 0 && accepted == nullptr) return invalid_argument("serving: commit: accepted is null");
  for (int32_t i = 0; i < batch; ++i) {
    const Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    if (!s.open)
      return failed_precondition("{}: commit: no step is open (select every layer first)",
                                 m.who(slots[i]));
    if (!s.observed)
      return failed_precondition("{}: commit: layer {} was selected but not observed",
                                 m.who(slots[i]), s.layer);
    if (accepted[i] < 0 || accepted[i] >= s.next_n)
      return invalid_argument("{}: commit: accepted[{}] = {} is outside 0..{} (next_n - 1)",
                              m.who(slots[i]), i, accepted[i], s.next_n - 1);
  }
  for (int32_t i = 0; i < batch; ++i) {
    Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    // A prefill's layers were observed at once (observe_prefill): commit only closes its step.
    if (!s.prefill) SPIN_RETURN_IF_ERROR(m.with_slot(s.predictor->commit(accepted[i]), slots[i]));
    s.open = false;
    s.prefill = false;
    s.layer = -1;
    ++s.step;
  }
  return ok_status();
}

Status ServingPredictor::prefill(const int32_t* slots, int32_t batch, int32_t layer,
                                 const int64_t* seq_lens, const float* logits,
                                 int64_t logits_stride) {
  Impl& m = *impl_;
  SPIN_RETURN_IF_ERROR(m.check_layer(layer, "prefill"));
  SPIN_RETURN_IF_ERROR(m.check_slots(slots, batch, "prefill"));
  SPIN_RETURN_IF_ERROR(m.check_seq_lens(seq_lens, batch, 1, "prefill"));
  if (batch > 0 && logits == nullptr) return invalid_argument("serving: prefill: logits is null");
  for (int32_t i = 0; i < batch; ++i) {
    const Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    if (s.open && !s.prefill)
      return failed_precondition("{}: prefill: a decode step is open; commit it first",
                                 m.who(slots[i]));
    if (logits_stride < m.visible(seq_lens[i], 1, 0))
      return invalid_argument("{}: prefill: logits_stride {} is below its {} entries",
                              m.who(slots[i]), logits_stride, m.visible(seq_lens[i], 1, 0));
  }
  // Replay's prefill path: the row goes to observe_prefill at the slot's step number, so the steps
  // that follow are numbered (and explore) as replay numbers them; commit() then closes the step.
  for (int32_t i = 0; i < batch; ++i) {
    Impl::Slot& s = m.slots[static_cast<size_t>(slots[i])];
    const int64_t vis = m.visible(seq_lens[i], 1, 0);
    RowScores rs;
    rs.scores = logits + int64_t{i} * logits_stride;
    rs.num_cols = vis;
    rs.visible_entries = vis;
    rs.scored_blocks = m.all_blocks.data();
    rs.num_scored_blocks = blocks_for_entries(m.options.config, vis);
    SPIN_RETURN_IF_ERROR(m.with_slot(s.predictor->observe_prefill(layer, s.step, rs), slots[i]));
    s.open = true;
    s.prefill = true;
    s.next_n = 1;
    s.layer = layer;
    s.observed = true;
    s.visible = {};
    s.visible[0] = vis;
  }
  return ok_status();
}

size_t ServingPredictor::memory_bytes() const {
  return static_cast<size_t>(planned_bytes(impl_->options, impl_->max_blocks));
}

}  // namespace spin
