"""commit fused into three Triton kernels. commit_kernel: one program per (slot, layer) of the
batch finishes the open step's replay into that layer's state: row 0's offset-EMA update from the
per-bucket sums its observe kept (observe applied its slot EMA already), then the accepted draft
rows 1..last in order from the pending rows — the slot EMA and last-seen of every observed block,
then one offset-EMA update per touched distance bucket with the bucket's mean — where the torch
reference (_commit.py over _state.SlotUpdate) runs ~70 kernels over [batch, layers, blocks]
temporaries. The last row is read inside the kernels (_last_row: given, or from the engine's
lengths).

The arithmetic is the reference's and the library's (src/predict/block_state.cpp): the EMAs as
separate float32 multiplies and adds (launched without fp fusion), each observation in fixed
point x·2^30 rounded to nearest-even, a bucket's mean as its integer sum / 2^30 / count in
float64. Buckets are ranges of distance (exact below 64, then four per octave), so a bucket's sum
is a sum over a range of blocks: no atomics, and an integer sum is the same in any order.
close_kernel (spin's topk_first / explore_churn, step-reuse): the newest replayed row's top-k
hits become the last top-k, and the churn EMA — where the torch ops gathered [batch, layers,
blocks] copies of the hits (an H200 measured the commit at 8.7 µs per layer at batch 64).
finish_kernel: each slot's step counted and its flags cleared.
"""

import torch
import triton
import triton.language as tl

from ._select_kernel import _open_step
from ._state import GAIN_WARMUP


@triton.jit
def _fixed_point(x):
    """round-half-even(x · 2^30) as int64 (std::nearbyint; |x · 2^30| < 2^45, so x + 0.5 is
    exact in float64)."""
    y = x.to(tl.float64) * 1073741824.0
    r = tl.floor(y + 0.5)
    tie_to_odd = ((r - y) == 0.5) & ((r.to(tl.int64) & 1) == 1)
    return tl.where(tie_to_odd, r - 1.0, r).to(tl.int64)


@triton.jit
def _offset_update(OFFSET_EMA, OFFSET_COUNT, at, fixed_sum, count, beta, one_minus_beta, mask):
    """One EMA update of the buckets at `at` with their mean; count 0: nothing touched."""
    touched = mask & (count > 0)
    mean = (fixed_sum.to(tl.float64) / 1073741824.0 / tl.maximum(count, 1).to(tl.float64))
    mean = mean.to(tl.float32)
    old = tl.load(OFFSET_EMA + at, mask=touched, other=0.0)
    n = tl.load(OFFSET_COUNT + at, mask=touched, other=0)
    new = tl.where(n == 0, mean, one_minus_beta * old + beta * mean)
    tl.store(OFFSET_EMA + at, new, mask=touched)
    tl.store(OFFSET_COUNT + at, n + 1, mask=touched)


# mtp_update's rule for the last row a commit replays, as _last_row's MODE.
_MODES = {"prefix": 0, "all-rows": 1, "row0": 2}


@triton.jit
def _last_row(i, s, ACCEPTED, SEQ_LENS, QUERY_LENS, OPENED, OPEN_NEXT_N, MODE: tl.constexpr,
              FROM_LENGTHS: tl.constexpr):
    """The last pending row of batch row i (slot s) that commit replays: the accepted draft
    tokens under mtp_update=prefix — given, or read off the engine's lengths (the tokens cached
    before this step's rows, less those before the open step's rows, less its sampled token) —
    every row or row 0 under the other modes; within the rows the step opened."""
    rows = tl.load(OPEN_NEXT_N + s)
    if MODE == 0:
        if FROM_LENGTHS:
            last = (tl.load(SEQ_LENS + i).to(tl.int64) - tl.load(QUERY_LENS + i).to(tl.int64)
                    - tl.load(OPENED + s) - 1)
        else:
            last = tl.load(ACCEPTED + i).to(tl.int64)
    elif MODE == 1:
        last = rows - 1
    else:
        last = rows * 0
    return tl.minimum(tl.maximum(last, 0), rows - 1)


@triton.jit(do_not_specialize=["batch"])
def commit_kernel(SLOT, ACCEPTED, SEQ_LENS, QUERY_LENS, OPENED, OPEN_NEXT_N, SELECTED, ROW0_SUM,
                  ROW0_COUNT, STEP, PENDING_X, PENDING_NEWEST, SLOT_EMA, LAST_SEEN,
                  OFFSET_EMA, OFFSET_COUNT, DIST_LO, DIST_HI, batch, num_layers, max_next_n,
                  n_blocks, n_buckets, alpha, one_minus_alpha, beta, one_minus_beta,
                  BLOCK: tl.constexpr, MODE: tl.constexpr, FROM_LENGTHS: tl.constexpr,
                  AGES: tl.constexpr, K_PAD: tl.constexpr):
    i = tl.program_id(0)
    layer = tl.program_id(1)
    s = tl.load(SLOT + i)
    selected = tl.load(SELECTED + s * num_layers + layer) != 0
    last = _last_row(i, s, ACCEPTED, SEQ_LENS, QUERY_LENS, OPENED, OPEN_NEXT_N, MODE, FROM_LENGTHS)
    last = tl.where(selected, last, -1)  # rows 0..last replay, in order
    step = tl.load(STEP + s).to(tl.int32)
    state = (s * num_layers + layer) * n_blocks
    offsets = (s * num_layers + layer) * n_buckets
    near = tl.arange(0, 64).to(tl.int64)
    # Row 0 (replayed wherever the layer was selected): observe applied its slot EMA and kept
    # its offset observations per bucket; their update now, as the library's apply ends row 0.
    kb = tl.arange(0, K_PAD)
    row0 = selected & (kb < n_buckets)
    _offset_update(OFFSET_EMA, OFFSET_COUNT, offsets + kb,
                   tl.load(ROW0_SUM + offsets + kb, mask=row0, other=0),
                   tl.load(ROW0_COUNT + offsets + kb, mask=row0, other=0), beta, one_minus_beta,
                   row0)
    tl.debug_barrier()
    for j in range(1, last + 1):  # the accepted draft rows, in order, from the pending rows
        pending = ((s * num_layers + layer) * (max_next_n - 1) + j - 1) * (n_blocks + 1)
        newest = tl.load(PENDING_NEWEST + (s * num_layers + layer) * max_next_n + j)
        # The slot EMA and last-seen of every observed block.
        for b0 in range(0, n_blocks, BLOCK):
            b = b0 + tl.arange(0, BLOCK).to(tl.int64)
            xs = tl.load(PENDING_X + pending + b, mask=b < n_blocks,
                         other=float("nan")).to(tl.float32)
            fresh = xs == xs
            old = tl.load(SLOT_EMA + state + b, mask=fresh, other=0.0).to(tl.float32)
            new = tl.where(old == old, one_minus_alpha * old + alpha * xs, xs)  # NaN: never seen
            tl.store(SLOT_EMA + state + b, new.to(tl.float16), mask=fresh)
            if AGES:  # stalest exploration's ages (State.last_seen)
                tl.store(LAST_SEEN + state + b, tl.zeros_like(b).to(tl.int32) + step, mask=fresh)
        # Buckets 0..63: one block each, at distance d.
        nb = newest - near
        xn = tl.load(PENDING_X + pending + nb, mask=nb >= 0, other=float("nan")).to(tl.float32)
        near_seen = xn == xn
        _offset_update(OFFSET_EMA, OFFSET_COUNT, offsets + near,
                       _fixed_point(tl.where(near_seen, xn, 0.0)), near_seen.to(tl.int32),
                       beta, one_minus_beta, near < n_buckets)
        # Buckets 64..: the blocks at distances [DIST_LO, DIST_HI), summed in fixed point.
        for k in range(64, n_buckets):
            hi_b = newest - tl.load(DIST_LO + k)      # inclusive
            lo_b = tl.maximum(newest - tl.load(DIST_HI + k) + 1, 0)
            total = tl.zeros((), tl.int64)
            count = tl.zeros((), tl.int32)
            for f0 in range(lo_b, hi_b + 1, BLOCK):
                f = f0 + tl.arange(0, BLOCK).to(tl.int64)
                xf = tl.load(PENDING_X + pending + f, mask=f <= hi_b,
                             other=float("nan")).to(tl.float32)
                far_seen = xf == xf
                total += tl.sum(_fixed_point(tl.where(far_seen, xf, 0.0)), axis=0)
                count += tl.sum(far_seen.to(tl.int32), axis=0)
            _offset_update(OFFSET_EMA, OFFSET_COUNT, offsets + k, total, count, beta,
                           one_minus_beta, hi_b >= 0)
        tl.debug_barrier()  # row j's state is what row j + 1 updates


def _per_slot_and_layer(kernel, spec, S, *args, **constexprs):
    """kernel with one program per (slot of S, layer), without fp contraction (the reference's
    roundings: separate multiplies and adds)."""
    if S.shape[0] == 0:
        return
    kernel[(S.shape[0], spec.num_layers)](
        *args, BLOCK=min(1024, triton.next_power_of_2(spec.max_blocks)), num_warps=4,
        enable_fp_fusion=False, **constexprs)


def _rows_args(spec, state, rows):
    """The kernels' arguments for the last replayed rows: rows = (accepted, seq_lens,
    query_lens), the unused ones None (Serving.commit checked them)."""
    accepted, seq_lens, query_lens = rows
    from_lengths = accepted is None
    given = seq_lens if from_lengths else accepted
    args = (given, given if seq_lens is None else seq_lens,
            given if query_lens is None else query_lens, state.opened, state.open_next_n)
    constexprs = dict(MODE=_MODES[spec.config["mtp_update"]], FROM_LENGTHS=from_lengths)
    return args, constexprs


def launch(spec, tables, state, S, rows):
    """commit_kernel over the batch's slots S (int64 [batch]) and every layer, rows 0..last."""
    row_args, constexprs = _rows_args(spec, state, rows)
    _per_slot_and_layer(
        commit_kernel, spec, S, S, *row_args, state.selected.view(torch.uint8), state.row0_sum,
        state.row0_count, state.step, state.pending_x, state.pending_newest, state.slot_ema,
        state.last_seen, state.offset_ema, state.offset_count, tables.dist_lo, tables.dist_hi,
        S.shape[0], spec.num_layers, spec.max_next_n, spec.max_blocks, spec.n_buckets, spec.alpha,
        spec.one_minus_alpha, spec.beta, spec.one_minus_beta,
        AGES=spec.ages, K_PAD=triton.next_power_of_2(spec.n_buckets), **constexprs)


@triton.jit
def close_kernel(SLOT, ACCEPTED, SEQ_LENS, QUERY_LENS, OPENED, OPEN_NEXT_N, SELECTED, PREFILL_OPEN,
                 PENDING_HITS, PREV_HITS, CHURN_EMA, EXPLORE_SHARE, CONSTANTS, ADDITIONS_GAIN,
                 GAIN_STEPS, GAIN, EXPLORE_YIELD, ADAPT_CONSTANTS, num_layers, max_next_n,
                 n_blocks, hits_row, gain_warmup,
                 KEEPS_TOPK: tl.constexpr, EXPLORE_CHURN: tl.constexpr, ADAPT: tl.constexpr,
                 BLOCK: tl.constexpr, MODE: tl.constexpr, FROM_LENGTHS: tl.constexpr):
    """The end of commit for one (slot, layer): the newest replayed row's top-k hits become the
    layer's last top-k (prev_hits) where it was selected and, with explore_churn, the churn EMA
    and the exploration share it gives — _commit._close / _measure_churn's torch ops, whose
    float64 operations this takes in the same order (CONSTANTS: keep, weight, explore_ratio,
    explore_churn as float64); with adapt, the additions' gain and the exploration share from
    what observe measured (_adapt.apply)."""
    i = tl.program_id(0)
    layer = tl.program_id(1)
    s = tl.load(SLOT + i)
    group = s * num_layers + layer
    selected = tl.load(SELECTED + group) != 0
    last = _last_row(i, s, ACCEPTED, SEQ_LENS, QUERY_LENS, OPENED, OPEN_NEXT_N, MODE, FROM_LENGTHS)
    if KEEPS_TOPK:
        _close_topk(s, group, selected, last, PREFILL_OPEN, PENDING_HITS, PREV_HITS, CHURN_EMA,
                    EXPLORE_SHARE, CONSTANTS, max_next_n, n_blocks, hits_row, EXPLORE_CHURN,
                    BLOCK)
    if ADAPT:
        decode = selected & (tl.load(PREFILL_OPEN + s) == 0)
        _close_adapt(group, decode, last, ADDITIONS_GAIN, GAIN_STEPS, GAIN, EXPLORE_YIELD,
                     EXPLORE_SHARE, ADAPT_CONSTANTS, max_next_n, gain_warmup)


@triton.jit
def _close_topk(s, group, selected, last, PREFILL_OPEN, PENDING_HITS, PREV_HITS, CHURN_EMA,
                EXPLORE_SHARE, CONSTANTS, max_next_n, n_blocks, hits_row,
                EXPLORE_CHURN: tl.constexpr, BLOCK: tl.constexpr):
    """The last top-k from the newest replayed row, and explore_churn's churn EMA and share."""
    newest = PENDING_HITS + (group * max_next_n + last) * hits_row
    prev = PREV_HITS + group * n_blocks
    now = tl.zeros((), tl.int64)
    kept = tl.zeros((), tl.int64)
    had = tl.zeros((), tl.int32)
    for b0 in range(0, n_blocks, BLOCK):
        b = b0 + tl.arange(0, BLOCK)
        inside = b < n_blocks
        hits = tl.load(newest + b, mask=inside, other=0).to(tl.int32)
        before = tl.load(prev + b, mask=inside, other=0).to(tl.int32)
        now += tl.sum(hits.to(tl.int64), axis=0)
        kept += tl.sum(tl.where(before > 0, hits, 0).to(tl.int64), axis=0)
        had = tl.maximum(had, tl.max((before > 0).to(tl.int32), axis=0))
        # Each program reads its own row first; the hits fit PREV_HITS' narrower integer.
        tl.store(prev + b, hits.to(PREV_HITS.dtype.element_ty), mask=inside & selected)
    if EXPLORE_CHURN:
        use = selected & (tl.load(PREFILL_OPEN + s) == 0) & (now > 0) & (had > 0)
        measured = 1.0 - kept.to(tl.float64) / tl.maximum(now, 1).to(tl.float64)
        old = tl.load(CHURN_EMA + group)
        keep, weight = tl.load(CONSTANTS), tl.load(CONSTANTS + 1)
        ema = tl.where(old < 0, measured, keep * old + weight * measured)
        ema = tl.where(use, ema, old)
        tl.store(CHURN_EMA + group, ema)
        ratio, c0 = tl.load(CONSTANTS + 2), tl.load(CONSTANTS + 3)
        scale = tl.minimum(ema / c0, 1.0)
        tl.store(EXPLORE_SHARE + group, tl.where(ema < 0, 0.0, ratio * scale))


@triton.jit
def _close_adapt(group, decode, last, ADDITIONS_GAIN, GAIN_STEPS, GAIN, EXPLORE_YIELD,
                 EXPLORE_SHARE, ADAPT_CONSTANTS, max_next_n, gain_warmup):
    """adapt at the commit of a decode step (_adapt.apply's float64 operations in its order):
    the additions' gain EMA from the newest replayed row's gain (NaN: none measured), the
    exploration share from row 0's yield — up at once, down by `fall` of the move, clamped."""
    step, floor = tl.load(ADAPT_CONSTANTS), tl.load(ADAPT_CONSTANTS + 1)
    ceiling, fall = tl.load(ADAPT_CONSTANTS + 2), tl.load(ADAPT_CONSTANTS + 3)
    weight = tl.load(ADAPT_CONSTANTS + 4)
    gain = tl.load(GAIN + group * max_next_n + last)
    old = tl.load(ADDITIONS_GAIN + group)
    moved = (1.0 - weight) * old + weight * gain
    measured = decode & (gain == gain)
    tl.store(ADDITIONS_GAIN + group, tl.where(measured, moved, old))
    steps = tl.load(GAIN_STEPS + group)
    tl.store(GAIN_STEPS + group, tl.where(measured, tl.minimum(steps + 1, gain_warmup), steps))
    slots = tl.load(EXPLORE_YIELD + group * 4)
    novel = tl.load(EXPLORE_YIELD + group * 4 + 1)
    margin = tl.load(EXPLORE_YIELD + group * 4 + 2)
    margin_count = tl.load(EXPLORE_YIELD + group * 4 + 3)
    rp = novel.to(tl.float64) / tl.maximum(slots, 1).to(tl.float64)
    rm = margin.to(tl.float64) / tl.maximum(margin_count, 1).to(tl.float64)
    share = tl.load(EXPLORE_SHARE + group)
    both = tl.where(rp + rm > 0, rp + rm, 1.0)  # (0: no move; a 1 keeps the division finite)
    target = tl.minimum(tl.maximum(share + (step * (rp - rm)) / both, floor), ceiling)
    moved_share = tl.where(target >= share, target, share + fall * (target - share))
    use = decode & (slots > 0) & (margin_count > 0) & (rp + rm > 0)
    tl.store(EXPLORE_SHARE + group, tl.where(use, moved_share, share))


def close(spec, tables, state, S, rows):
    """close_kernel over the batch's slots S and every layer (spec.keeps_topk or spec.adapt)."""
    row_args, constexprs = _rows_args(spec, state, rows)
    _per_slot_and_layer(
        close_kernel, spec, S, S, *row_args, state.selected.view(torch.uint8),
        state.prefill_open.view(torch.uint8), state.pending_hits, state.prev_hits, state.churn_ema,
        state.explore_share, tables.churn_constants, state.additions_gain, state.gain_steps,
        state.gain, state.explore_yield, tables.adapt_constants, spec.num_layers, spec.max_next_n,
        spec.max_blocks, spec.hits_row, GAIN_WARMUP,
        KEEPS_TOPK=spec.keeps_topk, EXPLORE_CHURN=spec.explore_churn, ADAPT=spec.adapt,
        **constexprs)


@triton.jit
def finish_kernel(SLOT, SELECTED, PREFILL_OPEN, STEP, num_layers, L_PAD: tl.constexpr):
    """The step closed, one program per batch slot: counted where any layer had opened it, its
    flags cleared (_commit._close's bookkeeping). Launched after the kernels that read the flags.
    Slots are distinct in a batch but for the pad slot, which never opens a step."""
    s = tl.load(SLOT + tl.program_id(0))
    layers = tl.arange(0, L_PAD)
    inside = layers < num_layers
    flags = tl.load(SELECTED + s * num_layers + layers, mask=inside, other=0)
    opened = tl.max((flags != 0).to(tl.int64), axis=0)
    tl.store(STEP + s, tl.load(STEP + s) + opened)
    tl.store(SELECTED + s * num_layers + layers, tl.zeros_like(flags), mask=inside)
    tl.store(PREFILL_OPEN + s, 0)


def finish(spec, state, S):
    """finish_kernel over the batch's slots S."""
    if S.shape[0] == 0:
        return
    finish_kernel[(S.shape[0],)](S, state.selected.view(torch.uint8),
                                 state.prefill_open.view(torch.uint8), state.step, spec.num_layers,
                                 L_PAD=triton.next_power_of_2(spec.num_layers), num_warps=1)


@triton.jit(do_not_specialize=["layer", "pad_slot"])
def prefill_open_kernel(SLOT, SEQ_LENS, SELECTED, PREFILL_OPEN, OPEN_NEXT_N, OPENED, VISIBLE,
                        PENDING_X, PENDING_HITS, ROW0_SUM, ROW0_COUNT, GAIN, EXPLORE_YIELD, layer,
                        pad_slot, num_layers, n_blocks, max_next_n, n_buckets, hits_row,
                        compress_ratio, max_entries, BLOCK: tl.constexpr, HITS: tl.constexpr,
                        ADAPT: tl.constexpr):
    """A prefill opens its step for (slot, layer), one program per batch row: a select's opening
    (the select kernel's _open_step, a step of one row) — a prefill step, measuring no churn at
    its commit — and the row's visible entries (len // compress_ratio, capped)."""
    i = tl.program_id(0)
    s = tl.load(SLOT + i)
    group = s * num_layers + layer
    seq_len = tl.load(SEQ_LENS + i).to(tl.int64)
    _open_step(s, group, seq_len, i >= 0, SELECTED, OPEN_NEXT_N, OPENED, PENDING_X, PENDING_HITS,
               ROW0_SUM, ROW0_COUNT, GAIN, EXPLORE_YIELD, pad_slot, n_blocks, n_buckets,
               max_next_n, hits_row, 1, BLOCK, HITS, ADAPT)
    tl.store(PREFILL_OPEN + s, 1)
    tl.store(VISIBLE + group * max_next_n, tl.minimum(tl.maximum(seq_len, 0) // compress_ratio,
                                                     max_entries))


@triton.jit(do_not_specialize=["layer", "pad_slot"])
def prefill_offsets_kernel(SLOT, ROW0_SUM, ROW0_COUNT, OFFSET_EMA, OFFSET_COUNT, layer, pad_slot,
                           num_layers, n_buckets, beta, one_minus_beta, K_PAD: tl.constexpr):
    """A prefill's offset-EMA update at once (the library's observe_prefill applies its row;
    a second prefill of the layer before the commit builds on it), from the per-bucket sums its
    observe kept, which it then empties (the commit adds nothing). Not on the pad slot."""
    s = tl.load(SLOT + tl.program_id(0))
    offsets = (s * num_layers + layer) * n_buckets
    kb = tl.arange(0, K_PAD)
    use = (kb < n_buckets) & (s != pad_slot)
    _offset_update(OFFSET_EMA, OFFSET_COUNT, offsets + kb,
                   tl.load(ROW0_SUM + offsets + kb, mask=use, other=0),
                   tl.load(ROW0_COUNT + offsets + kb, mask=use, other=0), beta, one_minus_beta, use)
    tl.store(ROW0_SUM + offsets + kb, tl.zeros([K_PAD], tl.int64), mask=use)
    tl.store(ROW0_COUNT + offsets + kb, tl.zeros([K_PAD], tl.int32), mask=use)


def prefill_open(spec, state, S, layer, seq_lens):
    """prefill_open_kernel over the batch rows of S at `layer`."""
    if S.shape[0] == 0:
        return
    prefill_open_kernel[(S.shape[0],)](
        S, seq_lens, state.selected.view(torch.uint8), state.prefill_open.view(torch.uint8),
        state.open_next_n, state.opened, state.visible, state.pending_x, state.pending_hits,
        state.row0_sum, state.row0_count, state.gain, state.explore_yield, layer, spec.pad_slot,
        spec.num_layers, spec.max_blocks, spec.max_next_n, spec.n_buckets, spec.hits_row,
        spec.compress_ratio, spec.max_entries,
        BLOCK=triton.next_power_of_2(max(spec.max_blocks, 16)), HITS=spec.needs_hits,
        ADAPT=spec.adapt, num_warps=4)


def prefill_offsets(spec, state, S, layer):
    """prefill_offsets_kernel over the batch rows of S at `layer` (no fp contraction)."""
    if S.shape[0] == 0:
        return
    prefill_offsets_kernel[(S.shape[0],)](
        S, state.row0_sum, state.row0_count, state.offset_ema, state.offset_count, layer,
        spec.pad_slot, spec.num_layers, spec.n_buckets, spec.beta, spec.one_minus_beta,
        K_PAD=triton.next_power_of_2(spec.n_buckets), num_warps=1, enable_fp_fusion=False)
