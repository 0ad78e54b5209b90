"""The device path's three plain containers. Serving builds them once; every kernel launch and
torch reference takes them as explicit arguments (nothing reads a Serving's fields):

- Spec: what a Serving is — its sizes and the predictor's rule, Python values (the kernels'
  constants and arguments).
- Tables: device tensors that never change — the library's per-block-count tables
  (spin_dsa._core.selection_tables), the offset buckets, ids, the EMAs' float32 scalars.
- State: the per-slot tensors a step reads and writes — the library's BlockState per (slot,
  layer), the last top-k's hits, explore_churn's share, and the open step's rows.
"""

from dataclasses import dataclass

import numpy as np
import torch

from spin_dsa import _core

from . import _hash

# Predictors whose choice reads only their own state (what a device can keep without the key
# cache or the true top-k). spin with explore_ratio=0 is "spin without exploration".
PARTS = {
    #              fill     slot   offset explore alpha_from_config step_reuse
    "all-keep":   ("all",    False, False, False, False, False),
    "random":     ("random", False, False, False, False, False),
    "prev-iter":  ("ranked", True,  False, False, False, False),
    "ema-slot":   ("ranked", True,  False, False, True,  False),
    "ema-offset": ("ranked", False, True,  False, True,  False),
    "spin":       ("ranked", True,  True,  True,  True,  False),
    "step-reuse": ("ranked", False, False, False, True,  True),
}


# The ranking's constants, the library's own (include/spin/selection_tables.h). The Triton
# kernels compile the same values in as literals (tests/device/test_tables.py checks them).
_LIB = _core.selection_constants()
OFFSET_SCALE = _LIB["offset_mean_scale"]  # the offset EMA's fixed-point scale, 2^30
TOPK_FIRST_BASE = _LIB["topk_first_base"]  # topk_first's blocks rank from 2^20
RECENT_BASE = _LIB["recent_base"]  # recent_blocks' blocks rank at 2^19 - distance
UNKNOWN_BASE = _LIB["unknown_base"]  # a block nothing is known about ranks at -2 - distance
TOPK_HITS_CAP = _LIB["topk_hits_cap"]  # hits capped at 2^20 - 1 under topk_first
CHURN_KEEP, CHURN_WEIGHT = _LIB["churn_ema_keep"], _LIB["churn_ema_weight"]  # the churn EMA
GAIN_WEIGHT = _LIB["additions_gain_weight"]  # adapt: the additions' gain EMA
GAIN_WARMUP = _LIB["additions_gain_warmup"]  # ... acted on after this many measured steps
FLT_MAX = float(np.finfo(np.float32).max)
INT64_MAX = (1 << 63) - 1


def blocks_for_entries(entries, block_entries):
    """The library's blocks_for_entries, ceil(entries / block_entries), for an int, a numpy array
    or a tensor alike."""
    return -(-entries // block_entries)


def _f32(v):
    """v rounded to float32, as a Python float (exact: kernel arguments and torch scalars take
    the library's float32 operands unchanged)."""
    return float(np.float32(v))


@dataclass(frozen=True)
class Spec:
    predictor: str
    config: dict
    max_requests: int
    num_layers: int
    max_entries: int
    max_next_n: int
    compress_ratio: int
    dense_blocks: int          # rows seeing at most this many blocks keep them all
    block_entries: int
    max_blocks: int
    width: int                 # the widest union of a request's rows' blocks any step can need
    n_buckets: int             # offset buckets at max_blocks
    # The rule (src/predict/predictor_ema.cpp, predictor_base.cpp).
    fill: str                  # "all", "random" or "ranked"
    use_slot: bool
    use_offset: bool
    explores: bool
    step_reuse: bool
    topk_first: bool           # spin ranks the last top-k's blocks first
    explore_churn: bool        # spin scales exploration by the top-k's churn
    adapt: bool                # spin adapts each layer's share and additions (config adapt=1)
    recent: int                # recent_blocks: the newest blocks rank right after those
    share0: float              # a layer's exploration share before it measured anything
    keeps_topk: bool           # the last top-k's hits are read at select
    needs_hits: bool           # ... or pooled (topk-hits)
    ages: bool                 # stalest exploration orders by last_seen's step
    deep_pool: bool            # max pooling at a rank above 1 somewhere
    hits_dtype: torch.dtype    # the narrowest integer holding a block's top-k hits
    hits_row: int              # a pending hits row, padded to whole 32-bit words
    hits_lanes: int            # hits per 32-bit word
    # The EMAs' float32 operands as Python floats (kernel arguments).
    alpha: float
    one_minus_alpha: float
    beta: float
    one_minus_beta: float
    w: float
    one_minus_w: float

    @property
    def pad_slot(self):
        """The state row of the rows an engine pads a batch with (never added)."""
        return self.max_requests


@dataclass(frozen=True)
class Tables:
    budget: torch.Tensor       # per block count n: the budget (explore_churn's counts)
    left: torch.Tensor         # ... what the forced blocks leave of it
    keep_all: torch.Tensor     # ... whether a row keeps every block (bool, and int32 for Triton)
    keep_all_i32: torch.Tensor
    n_explore: torch.Tensor    # ... exploration and history counts at the fixed share
    n_history: torch.Tensor
    pool_rank: torch.Tensor    # ... max pooling's rank (int32)
    bucket: torch.Tensor       # the offset bucket per distance, each bucket's distances [lo, hi)
    dist_lo: torch.Tensor
    dist_hi: torch.Tensor
    block_ids: torch.Tensor    # 0..max_blocks - 1, int64 and int32
    block_ids32: torch.Tensor
    layer_ids: torch.Tensor
    counter: torch.Tensor      # the exploration hash's counter offsets
    # Device scalars: under CUDA-graph capture nothing may copy from the host.
    alpha: torch.Tensor
    one_minus_alpha: torch.Tensor
    beta: torch.Tensor
    one_minus_beta: torch.Tensor
    w: torch.Tensor
    one_minus_w: torch.Tensor
    churn_constants: torch.Tensor  # keep, weight, explore_ratio, explore_churn (float64)
    # adapt's float64 operands: its share's step, floor and ceiling (each times explore_ratio, as
    # the library multiplies them), its fall, the additions' gain weight.
    adapt_constants: torch.Tensor
    nan: torch.Tensor          # binary16: empties pending_x
    nan64: torch.Tensor        # float64: empties gain
    true: torch.Tensor
    zero_hits: torch.Tensor
    zero_sum: torch.Tensor
    zero_count: torch.Tensor


def build(predictor, config, max_requests, num_layers, max_entries, max_next_n, compress_ratio,
          dense_blocks, device):
    """(Spec, Tables) of a Serving: per block count n (0..max_blocks) the budget, the forced
    blocks, the exploration and history counts and whether the row keeps everything — all
    functions of n alone, tabulated by the library; here only which of them the predictor uses
    and the device's own dense_blocks."""
    c = config
    fill, use_slot, use_offset, explores, alpha_from_config, step_reuse = PARTS[predictor]
    block_entries = int(c["page_size"]) * int(c["block_pages"])
    n_max = blocks_for_entries(int(max_entries), block_entries)
    t = _core.selection_tables(c, n_max)
    n = np.arange(n_max + 1, dtype=np.int64)
    budget = t["budget"]
    keep_all = (budget >= n) | (fill == "all") | (n <= dense_blocks)
    left = np.where(keep_all, 0, budget - t["forced"])
    if fill == "random":
        explore = left
    elif explores:  # llround(explore_ratio · budget), at most what is left
        explore = np.where(keep_all, 0, t["explore"])
    else:
        explore = np.zeros_like(left)
    widest = n_max if fill == "all" else max(int(budget[n_max]), dense_blocks)
    # Max pooling's rank per block count (PredictorConfig::pool_depth; 1 outside spin's family).
    rank = t["pool_rank"] if explores else np.ones_like(budget)
    topk_first = explores and c["topk_first"] == 1
    adapt = explores and c["adapt"] == 1
    explore_churn = explores and c["explore_churn"] > 0 and not adapt  # adapt has its own share
    keeps_topk = step_reuse or topk_first or explore_churn
    needs_hits = keeps_topk or c["pooling"] == "topk-hits"
    # A block holds at most min(topk, block entries) of a top-k: the narrowest integer that
    # counts them (uint8 at spin's defaults: a quarter of int32's bytes, the same values).
    most = min(int(c["topk"]), block_entries)
    hits_dtype = torch.uint8 if most <= 255 else torch.int16 if most <= 32767 else torch.int32
    hits_blocks = n_max if needs_hits else 0
    alpha = c["alpha"] if alpha_from_config else 1.0
    w = c["combine_weight"]
    spec = Spec(
        predictor=predictor, config=c, max_requests=int(max_requests), num_layers=int(num_layers),
        max_entries=int(max_entries), max_next_n=int(max_next_n),
        compress_ratio=int(compress_ratio), dense_blocks=int(dense_blocks),
        block_entries=block_entries, max_blocks=n_max,
        width=min(n_max, int(max_next_n) * widest), n_buckets=len(t["bucket_lo"]),
        fill=fill, use_slot=use_slot, use_offset=use_offset, explores=explores,
        step_reuse=step_reuse, topk_first=topk_first, explore_churn=explore_churn, adapt=adapt,
        recent=int(c["recent_blocks"]) if explores else 0,
        share0=0.0 if explore_churn else float(c["explore_ratio"]),
        keeps_topk=keeps_topk, needs_hits=needs_hits,
        ages=explores and c["explore_policy"] == "stalest",
        deep_pool=c["pooling"] == "max" and int(rank.max()) > 1, hits_dtype=hits_dtype,
        hits_row=-(-(hits_blocks + 1) // 4) * 4,
        hits_lanes=4 // torch.empty((), dtype=hits_dtype).element_size(),
        alpha=_f32(alpha), one_minus_alpha=_f32(np.float32(1) - np.float32(alpha)),
        beta=_f32(c["beta"]), one_minus_beta=_f32(np.float32(1) - np.float32(c["beta"])),
        w=_f32(w), one_minus_w=_f32(np.float32(1) - np.float32(w)))
    dev = device
    on = lambda a: torch.from_numpy(a).to(dev)
    f32 = lambda v: torch.tensor(v, dtype=torch.float32, device=dev)
    block_ids = torch.arange(n_max, dtype=torch.int64, device=dev)
    keep = on(keep_all)
    tables = Tables(
        budget=on(budget), left=on(left), keep_all=keep, keep_all_i32=keep.to(torch.int32),
        n_explore=on(explore), n_history=on(left - explore),
        pool_rank=on(rank.astype(np.int32)), bucket=on(t["offset_bucket"]),
        dist_lo=on(t["bucket_lo"]), dist_hi=on(t["bucket_hi"]), block_ids=block_ids,
        block_ids32=block_ids.to(torch.int32),
        layer_ids=torch.arange(int(num_layers), dtype=torch.int64, device=dev),
        counter=_hash.counter_offsets(n_max, dev),
        alpha=f32(spec.alpha), one_minus_alpha=f32(spec.one_minus_alpha), beta=f32(spec.beta),
        one_minus_beta=f32(spec.one_minus_beta), w=f32(spec.w), one_minus_w=f32(spec.one_minus_w),
        churn_constants=torch.tensor(  # the close kernel's float64 operands
            [CHURN_KEEP, CHURN_WEIGHT, float(c["explore_ratio"]),
             float(c["explore_churn"]) or 1.0], dtype=torch.float64, device=dev),
        adapt_constants=torch.tensor(_adapt_constants(float(c["explore_ratio"])),
                                     dtype=torch.float64, device=dev),
        nan=torch.full((), float("nan"), dtype=torch.float16, device=dev),
        nan64=torch.full((), float("nan"), dtype=torch.float64, device=dev),
        true=torch.ones((), dtype=torch.bool, device=dev),
        zero_hits=torch.zeros((), dtype=hits_dtype, device=dev),
        zero_sum=torch.zeros((), dtype=torch.int64, device=dev),
        zero_count=torch.zeros((), dtype=torch.int32, device=dev))
    return spec, tables


def _adapt_constants(ratio):
    """Tables.adapt_constants: products in float64, as the library's commit forms them."""
    return [_LIB["explore_share_step"] * ratio, _LIB["explore_share_floor"] * ratio,
            _LIB["explore_share_ceiling"] * ratio, _LIB["explore_share_fall"], GAIN_WEIGHT]


@dataclass
class State:
    # Persistent state per (slot, layer): the library's BlockState, and the last top-k's hits.
    slot_ema: torch.Tensor       # [R, L, N] binary16 (the library's), NaN: never observed
    last_seen: torch.Tensor      # [R, L, N] int32 step, only for stalest exploration (else N = 0)
    offset_ema: torch.Tensor     # [R, L, K] float32
    offset_count: torch.Tensor   # [R, L, K] int32
    prev_hits: torch.Tensor      # [R, L, N] hits_dtype (N = 0 where nothing reads them)
    churn_ema: torch.Tensor      # [R, L] float64: explore_churn's top-k churn EMA, -1 unmeasured
    explore_share: torch.Tensor  # [R, L] float64: the exploration share (explore_churn's or adapt's)
    additions_gain: torch.Tensor  # [R, L] float64: adapt's gain EMA of spin's additions (< 0: off,
    gain_steps: torch.Tensor      # [R, L] int32: once measured on GAIN_WARMUP steps, counted here)
    # The open step. Row 0 is replayed in every mtp_update mode, so observe applies its slot EMA
    # at once (nothing reads a (slot, layer)'s state between its observe and the commit) and
    # keeps its offset observations as fixed-point sums per bucket, which commit applies in the
    # library's order; rows 1.. (MTP drafts) wait for the acceptance: their pooled observation,
    # binary16 as the state takes it (NaN = block not observed; a last column takes the
    # padding's scatter), and every row's hits, counted by the observe kernel with 32-bit
    # atomics on the word holding a block's lanes (a count never carries into its neighbour's).
    row0_sum: torch.Tensor       # [R, L, K] int64
    row0_count: torch.Tensor     # [R, L, K] int32
    pending_x: torch.Tensor      # [R, L, J - 1, N + 1] binary16
    pending_hits: torch.Tensor   # [R, L, J, hits_row] hits_dtype
    pending_newest: torch.Tensor  # [R, L, J] int64: each row's newest block
    # adapt's measurements of the open step, taken at observe from the state select read (before
    # row 0 moves it; commit reads them): each row's gain of the additions (NaN: none measured),
    # and row 0's exploration yield — the blocks explored, the top-k hits of the novel ones
    # (those history would not have picked), those of as many of history's lowest picks, and
    # how many those are (0 where nothing was recorded).
    gain: torch.Tensor           # [R, L, J] float64 (J = 0 without adapt)
    explore_yield: torch.Tensor  # [R, L, 4] int64 (4 = 0 without adapt)
    selected: torch.Tensor       # [R, L] bool: layers selected in the open step
    prefill_open: torch.Tensor   # [R] bool: the open step is a prefill (no churn measured)
    open_next_n: torch.Tensor    # [R] int64: the open step's rows
    opened: torch.Tensor         # [R] int64: tokens cached before them (commit's acceptance)
    visible: torch.Tensor        # [R, L, J] int64: entries each row sees
    step: torch.Tensor           # [R] int64: steps committed
    req_key: torch.Tensor        # [R] int64: the exploration hash's request key

    @classmethod
    def allocate(cls, spec, device):
        """Every slot's state, one row more than max_requests: pad_slot, for the rows an engine
        pads a batch with to a captured graph's size (never added; what it selects is scored
        for nothing)."""
        R, L, N, K, J = (spec.max_requests + 1, spec.num_layers, spec.max_blocks, spec.n_buckets,
                         spec.max_next_n)
        full = lambda shape, v, dtype: torch.full(shape, v, dtype=dtype, device=device)
        hits_blocks = N if spec.needs_hits else 0
        return cls(
            slot_ema=full((R, L, N), float("nan"), torch.float16),
            last_seen=full((R, L, N if spec.ages else 0), -1, torch.int32),
            offset_ema=full((R, L, K), 0.0, torch.float32),
            offset_count=full((R, L, K), 0, torch.int32),
            prev_hits=full((R, L, hits_blocks), 0, spec.hits_dtype),
            churn_ema=full((R, L), -1.0, torch.float64),
            explore_share=full((R, L), spec.share0, torch.float64),
            additions_gain=full((R, L if spec.adapt else 0), 0.0, torch.float64),
            gain_steps=full((R, L if spec.adapt else 0), 0, torch.int32),
            row0_sum=full((R, L, K), 0, torch.int64),
            row0_count=full((R, L, K), 0, torch.int32),
            pending_x=full((R, L, J - 1, N + 1), float("nan"), torch.float16),
            pending_hits=full((R, L, J, spec.hits_row), 0, spec.hits_dtype),
            pending_newest=full((R, L, J), 0, torch.int64),
            gain=full((R, L, J if spec.adapt else 0), float("nan"), torch.float64),
            explore_yield=full((R, L, 4 if spec.adapt else 0), 0, torch.int64),
            selected=full((R, L), False, torch.bool),
            prefill_open=full((R,), False, torch.bool),
            open_next_n=full((R,), 1, torch.int64),
            opened=full((R,), 0, torch.int64),  # the pad slot's stays 0
            visible=full((R, L, J), 0, torch.int64),
            step=full((R,), 0, torch.int64),
            req_key=full((R,), 0, torch.int64))

    def reset(self, slot, share0):
        """A slot's state as a new request finds it (Serving.add)."""
        for t, v in ((self.slot_ema, float("nan")), (self.last_seen, -1), (self.offset_ema, 0.0),
                     (self.offset_count, 0), (self.prev_hits, 0), (self.selected, False),
                     (self.step, 0), (self.churn_ema, -1.0), (self.explore_share, share0),
                     (self.additions_gain, 0.0), (self.gain_steps, 0), (self.prefill_open, False)):
            t[slot].fill_(v)

    @property
    def memory_bytes(self):
        """Bytes of every tensor of the state (the pad slot's row included)."""
        return sum(t.numel() * t.element_size() for t in vars(self).values())


class SlotUpdate:
    """The batch's slots' state gathered once (every layer, or one), updated row by row, stored
    back: BlockState::apply as the slot part (each observed block's EMA and last-seen) and the
    offset part (one EMA update per touched bucket with its mean, from a fixed-point sum)."""

    def __init__(self, spec, tables, state, S, layer=None):
        self.spec, self.tables, self.state, self.S = spec, tables, state, S
        at = S if layer is None else (S, layer)
        self.slot = state.slot_ema[at].float()  # NaN: never observed
        self.seen = state.last_seen[at] if spec.ages else None
        self.offset = state.offset_ema[at]
        self.count = state.offset_count[at]
        self.step = state.step[S].int().view(-1, *([1] * (self.slot.dim() - 1)))

    def apply(self, x, newest, use):
        """One pending row per (slot, layer) where `use`: x [batch, L, N] (NaN = not observed),
        newest [batch, L]."""
        observed = self.apply_slot(x, use.unsqueeze(-1))
        self.apply_offsets(*self.bucket_sums(x, newest, observed))

    def apply_slot(self, x, use):
        """The slot EMA (x taken at binary16, the EMA rounded to it) and last-seen of every
        observed block where `use` (broadcast over blocks); returns which blocks were observed."""
        observed = ~torch.isnan(x) & use
        x0 = torch.where(observed, x, torch.zeros_like(x)).half().float()
        ema = self.tables.one_minus_alpha * self.slot + self.tables.alpha * x0
        updated = torch.where(torch.isnan(self.slot), x0, ema).half().float()
        self.slot = torch.where(observed, updated, self.slot)
        if self.seen is not None:
            self.seen = torch.where(observed, self.step, self.seen)
        return observed

    def bucket_sums(self, x, newest, observed):
        """Per bucket of distance from `newest`: the observed values' fixed-point sum (int64)
        and count."""
        K = self.spec.n_buckets
        farthest = self.tables.bucket.shape[0] - 1
        d = (newest.unsqueeze(-1) - self.tables.block_ids).clamp(min=0, max=farthest)
        bucket = torch.where(observed, self.tables.bucket[d], K)
        x0 = torch.where(observed, x, torch.zeros_like(x)).half().float()  # at binary16
        fixed = torch.where(observed, torch.round(x0.double() * OFFSET_SCALE).long(), 0)
        shape = (*bucket.shape[:-1], K + 1)
        sums = torch.zeros(shape, dtype=torch.int64, device=x.device).scatter_add_(-1, bucket,
                                                                                   fixed)
        ns = torch.zeros(shape, dtype=torch.int64, device=x.device).scatter_add_(
            -1, bucket, observed.long())
        return sums[..., :K], ns[..., :K]

    def apply_offsets(self, sums, ns):
        """One offset-EMA update per bucket with a count, by the bucket's mean."""
        touched = ns > 0
        mean = (sums.double() / OFFSET_SCALE / ns.clamp(min=1).double()).float()
        ema = self.tables.one_minus_beta * self.offset + self.tables.beta * mean
        updated = torch.where(self.count == 0, mean, ema)
        self.offset = torch.where(touched, updated, self.offset)
        self.count = self.count + touched.int()

    def store(self):
        state, S = self.state, self.S
        state.slot_ema[S] = self.slot.half()
        if self.seen is not None:
            state.last_seen[S] = self.seen
        state.offset_ema[S] = self.offset
        state.offset_count[S] = self.count
