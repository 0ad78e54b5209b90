"""The device predictors' selection fused into one Triton kernel: one program per (slot, layer)
group computes every row's set — forced blocks, the exploration draw, the history ranking — their
union and its ascending ids, in one launch for a whole step (Serving.select_layers) or a layer.

The torch code in _select.py (_choose + _compact_ids) is its reference: the same keys, the same
arithmetic, tested bit for bit against it and against the C++ library. What it changes is the
launch count (one instead of ~60 torch kernels a call) and the memory traffic (the state is read
once; the per-row key arrays never leave registers).

"The k smallest keys" without a sort: keys are distinct uint64 — (value << 32 | block) — so the
chosen set is unique: the k-th smallest value is found bit by bit (32 rounds of a count over the
row), every key below it is in, and the ties at it go to the lowest blocks (a prefix count):
exactly k keys, the same set as the library's quickselect.
"""

import torch
import triton
import triton.language as tl

from ._state import GAIN_WARMUP

_GOLDEN = 0x9E3779B97F4A7C15
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB


@triton.jit
def _mix64(x):
    """spin::mix64 (SplitMix64's finaliser) on uint64."""
    x = x ^ (x >> 30)
    x = x * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 27)
    x = x * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def _smallest(value, mask, k, RADIX: tl.constexpr):
    """The k smallest of the keys (value << 32 | block) under `mask`, as a mask (k = 0: none):
    the library's key order — the k-th smallest uint32 value t over every lane (lanes outside
    the mask count as 0xFFFFFFFF), then the ties at t by lowest block (a prefix count) — not 64
    rounds on the key."""
    value = tl.where(mask, value, 0xFFFFFFFF)
    if RADIX:
        prefix = _kth_radix(value, k)
    else:
        prefix = _kth_bitwise(value, k)
    below = tl.sum((mask & (value < prefix)).to(tl.int32), axis=0)
    tie = (mask & (value == prefix)).to(tl.int32)
    rank = tl.cumsum(tie, axis=0) - tie  # ties before this block
    return mask & ((value < prefix) | ((tie != 0) & (rank < k - below))) & (k > 0)


@triton.jit
def _kth_bitwise(value, k):
    """The k-th smallest of value (1 ≤ k ≤ lanes; 0 for k = 0) bit by bit: the largest t with
    fewer than k lanes below it, 32 rounds of a count over the row."""
    prefix = tl.zeros((), dtype=tl.uint32)
    bit = tl.full((), 0x80000000, tl.uint32)
    for _ in range(32):  # the highest bit first
        trial = prefix | bit
        below = tl.sum((value < trial).to(tl.int32), axis=0)
        prefix = tl.where(below < k, trial, prefix)
        bit = bit >> 1
    return prefix


@triton.jit
def _kth_radix(value, k):
    """The same k-th smallest by an 8-bit radix select: four rounds, each a 256-bin histogram
    of the next byte among the lanes that match the bytes decided so far, the byte where the
    running count reaches what is left of k, and the lanes below it taken off k."""
    prefix = tl.zeros((), dtype=tl.uint32)
    decided = tl.zeros((), dtype=tl.uint32)
    left = k.to(tl.int32)
    bins = tl.arange(0, 256)
    for r in tl.static_range(4):
        shift = 24 - 8 * r
        digit = ((value >> shift) & 0xFF).to(tl.int32)
        hist = tl.histogram(digit, 256, mask=(value & decided) == prefix)
        d = tl.sum((tl.cumsum(hist, axis=0) < left).to(tl.int32), axis=0)
        left = left - tl.sum(tl.where(bins < d, hist, 0), axis=0)
        prefix = prefix | (d.to(tl.uint32) << shift)
        decided = decided | (tl.full((), 0xFF, tl.uint32) << shift)
    return prefix


@triton.jit
def _rank_value(p):
    """Highest p first: ~float_order(sanitize(p)), the high half of the library's key."""
    p = tl.where(p >= -3.4028234663852886e38, p, -3.4028234663852886e38)
    sign = tl.full((), 0x80000000, tl.uint32)
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)  # x ^ ones is ~x (the interpreter's ~ overflows)
    bits = p.to(tl.uint32, bitcast=True)
    bits = tl.where(bits == sign, tl.zeros((), tl.uint32), bits)  # -0 orders as +0
    order = tl.where((bits & sign) != 0, bits ^ ones, bits | sign)
    return order ^ ones


@triton.jit
def _explore_value(block, use, s, layer, state, LAST_SEEN, REQ_KEY, STEP, COUNTER,
                   STALEST: tl.constexpr):
    """The exploration order's high half for each block id (use: which lanes are real):
    stalest's age, or the library's counter hash of (request, layer, step) — mark_explored."""
    if STALEST:
        seen = tl.load(LAST_SEEN + state + block, mask=use, other=-1)
        return (seen + 1).to(tl.uint32)  # age: never seen (-1) is the oldest
    key = tl.load(REQ_KEY + s).to(tl.uint64, bitcast=True)
    key = _mix64(key + 0x9E3779B97F4A7C15) ^ layer.to(tl.uint64)
    key = _mix64(key + 0x9E3779B97F4A7C15) ^ tl.load(STEP + s).to(tl.uint64)
    key = _mix64(key ^ 0x9E3779B97F4A7C15)
    counter = tl.load(COUNTER + block, mask=use, other=0).to(tl.uint64, bitcast=True)
    return (_mix64(key + counter) >> 32).to(tl.uint32)


@triton.jit
def _keeps_additions(group, ADDITIONS_GAIN, GAIN_STEPS, gain_warmup):
    """adapt: whether (slot, layer) `group` ranks with spin's additions — its gain of them ≥ 0,
    or measured on fewer than gain_warmup steps (PredictorBase::keeps_additions)."""
    return (tl.load(ADDITIONS_GAIN + group) >= 0.0) | (tl.load(GAIN_STEPS + group) < gain_warmup)


@triton.jit
def _explore_counts(share, n, BUDGET, LEFT):
    """A row of n blocks: min(llround(share · budget), left) explored, the rest of what the
    forced blocks leave to history — select_row's counts at a (slot, layer)'s own share."""
    x = share * tl.load(BUDGET + n).to(tl.float64)
    whole = tl.floor(x)
    left = tl.load(LEFT + n)
    n_explore = tl.minimum((whole + (x - whole >= 0.5).to(tl.float64)).to(tl.int64), left)
    return n_explore, left - n_explore


@triton.jit
def _rank(slot, known_slot, offset, known_offset, hits, d, recent, w, one_minus_w, additions,
          USE_SLOT: tl.constexpr, USE_OFFSET: tl.constexpr, STEP_REUSE: tl.constexpr,
          COMBINE_MAX: tl.constexpr, TOPK_FIRST: tl.constexpr):
    """p of blocks d behind the row's newest, as the library's ema_rank / step-reuse rank them
    (predictor_ema.cpp), spin's additions where `additions`: the slot EMA (NaN: never observed),
    the offset EMA of the block's distance bucket, the last top-k's hits."""
    p = -2.0 - d.to(tl.float32)  # nothing known: newest first
    if STEP_REUSE:
        p = tl.where(hits > 0, hits.to(tl.float32), p)
    else:
        if USE_OFFSET:
            p = tl.where(known_offset, offset, p)
        if USE_SLOT:
            p = tl.where(known_slot, slot, p)
        if USE_SLOT and USE_OFFSET:
            if COMBINE_MAX:
                both = tl.maximum(slot, offset)
            else:  # launched without fp fusion: two roundings, as the library
                both = w * slot + one_minus_w * offset
            p = tl.where(known_slot & known_offset, both, p)
        # recent_blocks (0 but for spin's family): newest first below the last top-k
        # (kRecentBase = 2^19)
        recent_p = tl.where(d < recent, 524288.0 - d.to(tl.float32), p)
        p = tl.where(additions, recent_p, p)
        if TOPK_FIRST:  # above every p, most hits first (kTopkFirstBase = 2^20), ties by
            # p in eighths (PredictorBase::hit_tie_level; hits capped at 2^20 - 1)
            quarter = tl.floor((p + 1.0) * 4.0)
            level = tl.where(quarter > 0, tl.minimum(quarter, 7.0), 0.0) * 0.125
            raised = (1048576.0 + tl.minimum(hits, 1048575).to(tl.float32)) + level
            p = tl.where(additions, tl.where(hits > 0, raised, p), p)
    return p


@triton.jit(do_not_specialize=["batch", "pad_slot"])
def select_kernel(SLOT, LAYER, SEQ_LENS, SLOT_EMA, LAST_SEEN, OFFSET_EMA, OFFSET_COUNT, PREV_HITS,
                  REQ_KEY, STEP, N_EXPLORE, N_HISTORY, KEEP_ALL, BUCKET, COUNTER, SHARE, BUDGET,
                  LEFT, OUT, COUNTS, SELECTED, OPEN_NEXT_N, OPENED, VISIBLE, PENDING_X, PENDING_HITS,
                  ROW0_SUM, ROW0_COUNT, ADDITIONS_GAIN, GAIN_STEPS, GAIN, EXPLORE_YIELD,
                  batch, pad_slot, num_layers, n_blocks, n_buckets, width, max_next_n, hits_row,
                  compress_ratio, block_entries, max_entries, sink, local, recent, w, one_minus_w,
                  gain_warmup, NEXT_N: tl.constexpr, BLOCK: tl.constexpr, RANKED: tl.constexpr,
                  RANDOM: tl.constexpr, EXPLORES: tl.constexpr, STALEST: tl.constexpr,
                  USE_SLOT: tl.constexpr, USE_OFFSET: tl.constexpr, STEP_REUSE: tl.constexpr,
                  COMBINE_MAX: tl.constexpr, TOPK_FIRST: tl.constexpr,
                  EXPLORE_CHURN: tl.constexpr, ADAPT: tl.constexpr, HITS: tl.constexpr,
                  RADIX: tl.constexpr):
    g = tl.program_id(0)  # group g = (layer LAYER[g // batch], batch row g % batch), layer-major
    i = g % batch
    s = tl.load(SLOT + i)
    layer = tl.load(LAYER + g // batch)
    b = tl.arange(0, BLOCK).to(tl.int64)
    inside = b < n_blocks
    group = s * num_layers + layer
    state = group * n_blocks
    offsets = group * n_buckets
    seq_len = tl.load(SEQ_LENS + i).to(tl.int64)
    # First, while no row is live in registers (the select proper does not read what it writes).
    _open_step(s, group, seq_len, g < batch, SELECTED, OPEN_NEXT_N, OPENED, PENDING_X,
               PENDING_HITS, ROW0_SUM, ROW0_COUNT, GAIN, EXPLORE_YIELD, pad_slot, n_blocks,
               n_buckets, max_next_n, hits_row, NEXT_N, BLOCK, HITS, ADAPT)

    if RANDOM or EXPLORES:  # the step's draw, the same for every row of the request
        explore_value = _explore_value(b, inside, s, layer, state, LAST_SEEN, REQ_KEY, STEP,
                                       COUNTER, STALEST and not RANDOM)
    if EXPLORE_CHURN or ADAPT:  # this (slot, layer)'s share of the budget, float64 as the library's
        share = tl.load(SHARE + s * num_layers + layer)
    keeps = s >= 0  # spin's additions: always (adapt: while the layer's gain of them is ≥ 0)
    if ADAPT:
        keeps = _keeps_additions(s * num_layers + layer, ADDITIONS_GAIN, GAIN_STEPS, gain_warmup)
    hits = tl.zeros([BLOCK], tl.int32)
    slot = tl.zeros([BLOCK], tl.float32)
    known_slot = b < 0
    offset = slot
    known_offset = known_slot
    if RANKED:
        if STEP_REUSE or TOPK_FIRST:
            hits = tl.load(PREV_HITS + state + b, mask=inside, other=0).to(tl.int32)
        if not STEP_REUSE:
            # binary16, NaN where never observed (State.slot_ema)
            slot = tl.load(SLOT_EMA + state + b, mask=inside, other=float("nan")).to(tl.float32)
            known_slot = slot == slot

    union = b < 0
    for j in range(NEXT_N):
        # Entries row j sees (_paging.visible_entries, capped at max_entries), in blocks.
        visible = tl.minimum(tl.maximum(seq_len - NEXT_N + 1 + j, 0) // compress_ratio,
                             max_entries)
        tl.store(VISIBLE + group * max_next_n + j, visible)
        n = (visible + block_entries - 1) // block_entries
        valid = b < n
        forced = valid & ((b < sink) | (b >= n - local))
        candidate = valid & ~forced
        chosen = forced
        if EXPLORE_CHURN or ADAPT:
            n_explore, n_history = _explore_counts(share, n, BUDGET, LEFT)
        else:
            n_explore = tl.load(N_EXPLORE + n)
            n_history = tl.load(N_HISTORY + n)
        if RANDOM or EXPLORES:
            picked = _smallest(explore_value, candidate, n_explore, RADIX)
            chosen = chosen | picked
            candidate = candidate & ~picked
        if RANKED:
            d = tl.maximum(n - 1 - b, 0)
            if not STEP_REUSE:
                bucket = tl.load(BUCKET + tl.minimum(d, n_blocks - 1), mask=inside, other=0)
                offset = tl.load(OFFSET_EMA + offsets + bucket, mask=inside, other=0.0)
                known_offset = tl.load(OFFSET_COUNT + offsets + bucket, mask=inside, other=0) > 0
            p = _rank(slot, known_slot, offset, known_offset, hits, d, recent, w, one_minus_w,
                      keeps, USE_SLOT, USE_OFFSET, STEP_REUSE, COMBINE_MAX, TOPK_FIRST)
            chosen = chosen | _smallest(_rank_value(p), candidate, n_history, RADIX)
        keep_all = tl.load(KEEP_ALL + n) != 0
        chosen = tl.where(keep_all, valid, chosen)
        union = union | chosen

    # The union's ids, ascending, -1 after them: every row of the request carries them.
    count = tl.sum(union.to(tl.int32), axis=0)
    position = tl.cumsum(union.to(tl.int32), axis=0) - 1
    pad = tl.full([BLOCK], -1, tl.int32)
    for j in range(NEXT_N):
        row = g * NEXT_N + j
        tl.store(OUT + row * width + position, b.to(tl.int32), mask=union & (position < width))
        tl.store(OUT + row * width + b, pad, mask=(b >= count) & (b < width))
        tl.store(COUNTS + row, count)


@triton.jit
def _open_step(s, group, seq_len, first_layer, SELECTED, OPEN_NEXT_N, OPENED, PENDING_X,
               PENDING_HITS, ROW0_SUM, ROW0_COUNT, GAIN, EXPLORE_YIELD, pad_slot, n_blocks,
               n_buckets, max_next_n, hits_row, NEXT_N: tl.constexpr, BLOCK: tl.constexpr,
               HITS: tl.constexpr, ADAPT: tl.constexpr):
    """The step opened for (slot, layer): its pending rows emptied (observe writes only the
    blocks it observes: NaN / 0 elsewhere, the last column included), the layer flagged selected
    but on the pad slot, which never opens a step (its rows would update one state in a racy
    order); once per slot, its rows and the tokens cached before them (commit's acceptance)."""
    b = tl.arange(0, BLOCK).to(tl.int64)
    for j in range(max_next_n - 1):  # the draft rows' observations
        row = group * (max_next_n - 1) + j
        tl.store(PENDING_X + row * (n_blocks + 1) + b, tl.full([BLOCK], float("nan"), tl.float16),
                 mask=b < n_blocks)
        tl.store(PENDING_X + row * (n_blocks + 1) + n_blocks, float("nan"))
    for k0 in range(0, n_buckets, BLOCK):  # row 0's offset sums
        k = k0 + b
        tl.store(ROW0_SUM + group * n_buckets + k, tl.zeros([BLOCK], tl.int64), mask=k < n_buckets)
        tl.store(ROW0_COUNT + group * n_buckets + k, tl.zeros([BLOCK], tl.int32),
                 mask=k < n_buckets)
    for j in range(max_next_n):
        row = group * max_next_n + j
        if HITS:  # rows of hits_row ≥ n_blocks + 1 lanes (the rest of a row is never written)
            zero = tl.zeros([BLOCK], tl.int32).to(PENDING_HITS.dtype.element_ty)
            tl.store(PENDING_HITS + row * hits_row + b, zero, mask=b < n_blocks)
            tl.store(PENDING_HITS + row * hits_row + n_blocks,
                     tl.zeros((), tl.int32).to(PENDING_HITS.dtype.element_ty))
    if ADAPT:  # nothing measured yet (the observe kernel measures; _adapt.py)
        for j in range(max_next_n):
            tl.store(GAIN + group * max_next_n + j, float("nan"))
        q = tl.arange(0, 4)
        tl.store(EXPLORE_YIELD + group * 4 + q, tl.zeros([4], tl.int64))
    tl.store(SELECTED + group, (s != pad_slot).to(tl.uint8))
    if first_layer & (s != pad_slot):
        tl.store(OPEN_NEXT_N + s, NEXT_N)
        tl.store(OPENED + s, seq_len - NEXT_N)


def launch(spec, tables, state, S, layers, seq_lens, next_n, out, counts, radix=False):
    """select_kernel over every (layer of `layers`, slot of S) group, layer-major: S int64
    [batch], layers int64 [n_layers] (device), seq_lens int [batch]; writes out [n_layers ·
    batch · next_n, width] int32 (every row of a request the same), counts [n_layers · batch ·
    next_n] int32, and opens the step (_select.open_step's bookkeeping) — the select's one
    launch."""
    batch = S.shape[0]
    groups = layers.shape[0] * batch
    if groups == 0:
        return
    block = triton.next_power_of_2(max(spec.max_blocks, 16))
    c = spec.config
    select_kernel[(groups,)](
        S, layers, seq_lens, state.slot_ema, state.last_seen, state.offset_ema, state.offset_count,
        state.prev_hits, state.req_key, state.step, tables.n_explore, tables.n_history,
        tables.keep_all_i32, tables.bucket, tables.counter, state.explore_share, tables.budget,
        tables.left, out, counts, state.selected.view(torch.uint8), state.open_next_n,
        state.opened, state.visible, state.pending_x, state.pending_hits, state.row0_sum,
        state.row0_count, state.additions_gain, state.gain_steps, state.gain, state.explore_yield,
        batch,
        spec.pad_slot, spec.num_layers, spec.max_blocks, spec.n_buckets,
        spec.width, spec.max_next_n, spec.hits_row, spec.compress_ratio, spec.block_entries,
        spec.max_entries, int(c["sink_blocks"]), int(c["local_blocks"]), spec.recent, spec.w,
        spec.one_minus_w, GAIN_WARMUP,
        NEXT_N=next_n, BLOCK=block, RANKED=spec.fill == "ranked", RANDOM=spec.fill == "random",
        EXPLORES=spec.explores, STALEST=c["explore_policy"] == "stalest",
        USE_SLOT=spec.use_slot, USE_OFFSET=spec.use_offset, STEP_REUSE=spec.step_reuse,
        COMBINE_MAX=c["combine"] == "max", TOPK_FIRST=spec.topk_first,
        EXPLORE_CHURN=spec.explore_churn, ADAPT=spec.adapt, HITS=spec.needs_hits, RADIX=radix,
        # ptxas on sm_90a (NEXT_N 2): 2048 blocks at 4 warps 162 registers, 4096 at 8 189, 8192
        # at 16 128 (a 52-byte spill); at 8 warps 8192 would take 255 and spill more.
        num_warps=16 if block >= 8192 else 8 if block >= 4096 else 4, enable_fp_fusion=False)
