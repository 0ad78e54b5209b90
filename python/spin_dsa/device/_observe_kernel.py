"""observe_scored fused into one Triton kernel: programs per row (a chunk of its blocks each) pool
its compact logits — the k-th and largest score from the row's top-k columns, each scored
block's max, the normalised value x in float64, the top-k hits per block — in one launch per
layer, where the torch reference (_observe._pool + _store_pending) takes ~40. Row 0 of a request
(replayed by commit in every mtp_update mode) goes into the state at once: each observed block's
slot EMA and last-seen, its value added to its distance bucket's fixed-point sum for commit's
offset update; draft rows 1.. go to the pending rows that commit replays once acceptance is
known. With ``positions`` it also writes the row's top-k as request positions (``remap``'s rule,
by the first program of each row, which has the columns in registers already): the engine's
top-k buffer is filled by the same launch. With adapt (spin's default) row 0 of a request is one
program, which first measures what adapt needs from the state select read (_measure_adapt; the
torch reference: _adapt.measure), then moves it.

The arithmetic is the reference's (and the library's, src/predict/pooling.cpp and
block_state.cpp): min and max are exact in any order (so is a block's rank-th best, found by
dropping its best entry rank - 1 times), r = (block max - kth) / spread and r / (1 - r) are
single float64 operations, the EMA separate float32 multiplies and adds, hits and bucket sums
integer atomics. So the state and the pending rows are bit for bit the reference's.
"""

import torch
import triton
import triton.language as tl

from ._commit_kernel import _fixed_point
from ._select_kernel import (_explore_counts, _explore_value, _keeps_additions, _rank, _rank_value,
                             _smallest)
from ._state import GAIN_WARMUP


@triton.jit(do_not_specialize=["layer", "next_n", "pad_slot"])  # one compile for every layer and row count
def observe_kernel(SCORED, stride_scored, TOPK, stride_topk, SEL_VISIBLE, SLOT, RANK,
                   PENDING_X, PENDING_HITS, HIT_WORDS, PENDING_NEWEST, POSITIONS, stride_pos,
                   ROW_BLOCKS, stride_row_blocks, SLOT_EMA, LAST_SEEN, STEP, BUCKET, ROW0_SUM,
                   ROW0_COUNT, OFFSET_EMA, OFFSET_COUNT, PREV_HITS, REQ_KEY, COUNTER, SHARE,
                   BUDGET, LEFT, ADDITIONS_GAIN, GAIN_STEPS, GAIN, EXPLORE_YIELD,
                   layer, num_layers, pad_slot, n_buckets, alpha, one_minus_alpha,
                   max_next_n, n_blocks, hits_row, width, k, next_n, chunk, sink, local, recent,
                   w, one_minus_w, gain_warmup,
                   E: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_K: tl.constexpr,
                   HITS: tl.constexpr, TOPK_HITS: tl.constexpr, DEEP: tl.constexpr,
                   REMAP: tl.constexpr, LANES: tl.constexpr, AGES: tl.constexpr,
                   ADAPT: tl.constexpr, WIDTH_PAD: tl.constexpr, STALEST: tl.constexpr,
                   USE_SLOT: tl.constexpr, USE_OFFSET: tl.constexpr, COMBINE_MAX: tl.constexpr,
                   TOPK_FIRST: tl.constexpr, RADIX: tl.constexpr):
    # Program (r, p): row r's blocks [p·chunk, (p + 1)·chunk) of its selection; every program of
    # a row derives the row's k-th score and spread from the top-k itself (2048 loads, no
    # cross-program dependency), program 0 counts the hits. The pending rows were reset to NaN /
    # 0 when the step's blocks were selected (_select.select).
    # The row's blocks are the caller's (the step's plan: rows sharing a slot — an engine's pad
    # rows — each keep theirs); its visible entries are read from the open step's state
    # (State.visible [slots, layers, max_next_n]) here, not gathered by torch ops.
    r = tl.program_id(0)
    part = tl.program_id(1)
    i = r // next_n
    s = tl.load(SLOT + i)
    group = s * num_layers + layer
    j = r % next_n
    visible = tl.load(SEL_VISIBLE + group * max_next_n + j)
    newest = (visible + E - 1) // E - 1
    # Rows 1.. wait in the pending rows for the acceptance; row 0 updates the state now.
    row = (group * (max_next_n - 1) + j - 1) * (n_blocks + 1)
    hits_at = (group * max_next_n + r % next_n) * hits_row  # a whole number of 32-bit words
    scored = SCORED + r.to(tl.int64) * stride_scored
    blocks = ROW_BLOCKS + r.to(tl.int64) * stride_row_blocks
    # The row's blocks [start, end) of the selection: a chunk. With adapt, row 0 is one program
    # (the first) that measures the request's rows before it moves the state (_measure_adapt).
    start = part * chunk
    end = tl.minimum(start + chunk, width)
    if ADAPT:
        if j == 0:
            start = tl.where(part == 0, 0, width)
            end = width
            if (part == 0) & (s != pad_slot):
                _measure_adapt(i, s, group, layer, next_n, ROW_BLOCKS, stride_row_blocks, TOPK,
                               stride_topk, SEL_VISIBLE, SLOT_EMA, LAST_SEEN, STEP, BUCKET,
                               OFFSET_EMA, OFFSET_COUNT, PREV_HITS, REQ_KEY, COUNTER, SHARE,
                               BUDGET, LEFT, ADDITIONS_GAIN, GAIN_STEPS, GAIN, EXPLORE_YIELD,
                               num_layers, max_next_n, n_blocks, n_buckets, width, k, sink, local,
                               recent, w, one_minus_w, gain_warmup, E, BLOCK_K, WIDTH_PAD, STALEST, USE_SLOT,
                               USE_OFFSET, COMBINE_MAX, TOPK_FIRST, RADIX)
            tl.debug_barrier()  # measured from the state select read: before row 0 moves it

    # 1. The row's top-k: its k-th and largest score, and the hits per block.
    t = tl.arange(0, BLOCK_K)
    col = tl.load(TOPK + r.to(tl.int64) * stride_topk + t, mask=t < k, other=-1)
    valid = col >= 0
    score = tl.load(scored + col, mask=valid, other=0.0)
    k_eff = tl.sum(valid.to(tl.int32), axis=0)
    kth32 = tl.min(tl.where(valid, score, float("inf")), axis=0)
    row_max = tl.max(tl.where(valid, score, float("-inf")), axis=0)
    if HITS and part == 0:  # integer atomics: the same counts in any order
        # A block's count is lane hit_block % LANES of its 32-bit word (little-endian, as CUDA
        # and every CPU torch runs on): one added there never carries out of the lane.
        lane = (hits_at + tl.load(blocks + col // E, mask=valid, other=0)).to(tl.int64)
        one = tl.full([BLOCK_K], 1, tl.int32) << ((lane % LANES) * (32 // LANES)).to(tl.int32)
        tl.atomic_add(HIT_WORDS + lane // LANES, one, mask=valid, sem="relaxed")
    if REMAP and part == 0:  # the engine's top-k buffer: compact column → request position
        # The column's block clamped into the width, as remap() does.
        slot_of = tl.minimum(col // E, width - 1)
        block_of = tl.load(blocks + slot_of, mask=valid, other=-1).to(tl.int64)
        position = tl.where(valid & (block_of >= 0), block_of * E + col % E, -1)
        tl.store(POSITIONS + r.to(tl.int64) * stride_pos + t, position.to(tl.int32), mask=t < k)
    kth = tl.where(k_eff > 0, kth32.to(tl.float64), 0.0)
    spread = row_max.to(tl.float64) - kth
    fallback = tl.where((k_eff > 0) & (row_max != 0.0), tl.abs(row_max.to(tl.float64)), 1.0)
    spread = tl.where(spread > 0.0, spread, fallback)
    tl.debug_barrier()

    # 2. Every scored block the row sees: its max (its rank-th best with DEEP: RANK[blocks the row
    # sees], PredictorConfig::pool_depth) → x.
    e = tl.arange(0, E)
    rank = 1
    if DEEP:
        rank = tl.load(RANK + (visible + E - 1) // E)
    for c0 in range(start, end, BLOCK_C):
        c = c0 + tl.arange(0, BLOCK_C)
        block = tl.load(blocks + c, mask=c < end, other=-1).to(tl.int64)
        position = block[:, None] * E + e[None, :]
        seen = (block[:, None] >= 0) & (position < visible)
        v = tl.load(scored + c[:, None] * E + e[None, :], mask=seen, other=float("-inf"))
        v = tl.where(v == v, v, float("-inf"))  # NaN: not scored, as the torch reference says
        block_max = tl.max(v, axis=1)
        observed = block_max > float("-inf")
        pooled = block_max
        for _ in range(1, rank):  # drop one best entry, keep the next while one is left
            v = tl.where(e[None, :] == tl.argmax(v, axis=1)[:, None], float("-inf"), v)
            after = tl.max(v, axis=1)
            pooled = tl.where(after > float("-inf"), after, pooled)
        if TOPK_HITS:
            hits = tl.load(PENDING_HITS + hits_at + block, mask=observed, other=0).to(tl.int32)
            x = (hits.to(tl.float64) / E).to(tl.float32)
        else:
            safe = tl.where(observed, pooled, 0.0)  # unobserved lanes are not stored
            ratio = (safe.to(tl.float64) - kth) / spread
            squash = tl.where(ratio >= 0.0, 1.0, 1.0 - ratio)  # r ≥ 0: r; else r / (1 - r)
            x = (ratio / squash).to(tl.float32)
        x = x.to(tl.float16).to(tl.float32)  # the state takes observations at binary16
        # A NaN value (a +inf score: the library refuses it, a device cannot check) observes
        # nothing, as in the torch reference; else it would reset the slot to "never observed".
        observed = observed & (x == x)
        if j == 0:
            _observe_row0(x, block, observed & (s != pad_slot), s, group, newest, SLOT_EMA,
                          LAST_SEEN, STEP, BUCKET, ROW0_SUM, ROW0_COUNT, n_blocks, n_buckets,
                          alpha, one_minus_alpha, AGES)
        else:
            tl.store(PENDING_X + row + block, x.to(tl.float16), mask=observed)
    if part == 0:
        tl.store(PENDING_NEWEST + group * max_next_n + j, newest)


@triton.jit
def _row_keys(r, group, ROW_BLOCKS, stride_row_blocks, TOPK, stride_topk,
              SEL_VISIBLE, SLOT_EMA, BUCKET, OFFSET_EMA, OFFSET_COUNT, PREV_HITS, j, max_next_n,
              n_blocks, n_buckets, width, k, sink, local, recent, w, one_minus_w,
              E: tl.constexpr, BLOCK_K: tl.constexpr, WIDTH_PAD: tl.constexpr,
              USE_SLOT: tl.constexpr, USE_OFFSET: tl.constexpr, COMBINE_MAX: tl.constexpr,
              TOPK_FIRST: tl.constexpr):
    """Row r (the request's row j) over its selected blocks (lanes: positions in the row's
    block list, ascending ids): the ids, which of them the row observed beyond the forced
    blocks, the top-k's entries in each, both rankings' values (_rank_value: with and without
    spin's additions, from the state select read) and the row's block count."""
    c = tl.arange(0, WIDTH_PAD)
    # int32 lanes (block ids and distances < 2^31): this program holds a row of them in registers.
    bid = tl.load(ROW_BLOCKS + r.to(tl.int64) * stride_row_blocks + c, mask=c < width,
                  other=-1).to(tl.int32)
    real = bid >= 0
    at = tl.where(real, bid, 0)
    n = ((tl.load(SEL_VISIBLE + group * max_next_n + j) + E - 1) // E).to(tl.int32)
    observed = real & (bid < n) & (bid >= sink) & (bid < n - local)
    t = tl.arange(0, BLOCK_K)
    col = tl.load(TOPK + r.to(tl.int64) * stride_topk + t, mask=t < k, other=-1)
    hits = tl.histogram((col // E).to(tl.int32), WIDTH_PAD, mask=col >= 0)
    state = group.to(tl.int64) * n_blocks
    slot = tl.load(SLOT_EMA + state + at, mask=real, other=float("nan")).to(tl.float32)
    d = tl.maximum(n - 1 - bid, 0)
    bucket = tl.load(BUCKET + tl.minimum(d, n_blocks - 1), mask=real, other=0)
    offsets = group.to(tl.int64) * n_buckets
    offset = tl.load(OFFSET_EMA + offsets + bucket, mask=real, other=0.0)
    known_offset = tl.load(OFFSET_COUNT + offsets + bucket, mask=real, other=0) > 0
    prev = tl.zeros([WIDTH_PAD], tl.int32)
    if TOPK_FIRST:
        prev = tl.load(PREV_HITS + state + at, mask=real, other=0).to(tl.int32)
    on = group >= 0  # true: the additions apply (a tensor, as the interpreter's & needs)
    with_p = _rank(slot, slot == slot, offset, known_offset, prev, d, recent, w, one_minus_w, on,
                   USE_SLOT, USE_OFFSET, False, COMBINE_MAX, TOPK_FIRST)
    without_p = _rank(slot, slot == slot, offset, known_offset, prev, d, recent, w, one_minus_w,
                      group < 0, USE_SLOT, USE_OFFSET, False, COMBINE_MAX, TOPK_FIRST)
    return bid, observed, hits, _rank_value(with_p), _rank_value(without_p), n


@triton.jit
def _gain(observed, hits, with_value, without_value, n, RADIX: tl.constexpr):
    """PredictorBase::score_rankings' measure of one row: the top-k's entries in the m
    highest-ranked observed blocks by each ranking (m: the blocks holding the top-k), their
    difference over the top-k's entries; NaN where nothing is measured."""
    m = tl.sum((hits > 0).to(tl.int32), axis=0)
    total = tl.sum(hits, axis=0)
    take = tl.minimum(m, tl.sum(observed.to(tl.int32), axis=0))
    with_hits = tl.sum(tl.where(_smallest(with_value, observed, take, RADIX), hits, 0), axis=0)
    without_hits = tl.sum(tl.where(_smallest(without_value, observed, take, RADIX), hits, 0),
                          axis=0)
    gain = (with_hits - without_hits).to(tl.float64) / tl.maximum(total, 1).to(tl.float64)
    return tl.where((n > 0) & (m > 0) & (total > 0), gain, float("nan"))


@triton.jit
def _measure_adapt(i, s, group, layer, next_n, ROW_BLOCKS, stride_row_blocks, TOPK, stride_topk,
                   SEL_VISIBLE, SLOT_EMA, LAST_SEEN, STEP, BUCKET, OFFSET_EMA, OFFSET_COUNT,
                   PREV_HITS, REQ_KEY, COUNTER, SHARE, BUDGET, LEFT, ADDITIONS_GAIN, GAIN_STEPS,
                   GAIN, EXPLORE_YIELD, num_layers, max_next_n, n_blocks, n_buckets, width, k,
                   sink, local, recent, w, one_minus_w, gain_warmup, E: tl.constexpr, BLOCK_K: tl.constexpr,
                   WIDTH_PAD: tl.constexpr, STALEST: tl.constexpr, USE_SLOT: tl.constexpr,
                   USE_OFFSET: tl.constexpr, COMBINE_MAX: tl.constexpr, TOPK_FIRST: tl.constexpr,
                   RADIX: tl.constexpr):
    """adapt's measurements of request i's open step at this layer (_adapt.measure), from the
    state select read: every row's gain of the additions (GAIN) and row 0's exploration yield
    (EXPLORE_YIELD: blocks explored, the top-k entries of the novel ones, of as many of
    history's lowest picks, and how many those are). Row 0's explored blocks and history's
    picks are all among the request's selected blocks, and so is every candidate ranked above
    them: the k smallest among the selected blocks are the library's k smallest."""
    r0 = i * next_n
    bid, observed, hits, with_value, without_value, n = _row_keys(
        r0, group, ROW_BLOCKS, stride_row_blocks, TOPK, stride_topk, SEL_VISIBLE,
        SLOT_EMA, BUCKET, OFFSET_EMA, OFFSET_COUNT, PREV_HITS, 0, max_next_n, n_blocks,
        n_buckets, width, k, sink, local, recent, w, one_minus_w, E, BLOCK_K, WIDTH_PAD,
        USE_SLOT, USE_OFFSET, COMBINE_MAX, TOPK_FIRST)
    tl.store(GAIN + group * max_next_n, _gain(observed, hits, with_value, without_value, n, RADIX))
    # Row 0's exploration (PredictorBase::record_exploration, ProbeShareState::record).
    explore_n, history_n = _explore_counts(tl.load(SHARE + group), n, BUDGET, LEFT)
    explored = _smallest(_explore_value(tl.where(bid >= 0, bid, 0), bid >= 0, s, layer,
                                        group.to(tl.int64) * n_blocks, LAST_SEEN, REQ_KEY, STEP,
                                        COUNTER, STALEST), observed, explore_n, RADIX)
    keeps = _keeps_additions(group, ADDITIONS_GAIN, GAIN_STEPS, gain_warmup)
    value = tl.where(keeps, with_value, without_value)  # the ranking select used
    history = _smallest(value, observed & ~explored, history_n, RADIX)
    cut_value = tl.max(tl.where(history, value, tl.zeros_like(value)), axis=0)
    cut_block = tl.max(tl.where(history & (value == cut_value), bid, -1), axis=0)
    novel = explored & ((value > cut_value) | ((value == cut_value) & (bid > cut_block)))
    margin_n = tl.minimum(history_n, explore_n)
    ones = tl.full((), 0xFFFFFFFF, tl.uint32)  # value ^ ones: lowest-ranked first
    margin = _smallest(value ^ ones, history, margin_n, RADIX)
    recorded = (explore_n > 0) & (history_n > 0)
    q = tl.arange(0, 4)
    found = tl.where(q == 0, explore_n,
                     tl.where(q == 1, tl.sum(tl.where(novel, hits, 0), axis=0).to(tl.int64),
                              tl.where(q == 2, tl.sum(tl.where(margin, hits, 0),
                                                      axis=0).to(tl.int64), margin_n)))
    tl.store(EXPLORE_YIELD + group * 4 + q, tl.where(recorded, found, 0))
    for j in range(1, next_n):  # the draft rows: their gains (commit reads the newest replayed)
        bid, observed, hits, with_value, without_value, n = _row_keys(
            r0 + j, group, ROW_BLOCKS, stride_row_blocks, TOPK, stride_topk,
            SEL_VISIBLE, SLOT_EMA, BUCKET, OFFSET_EMA, OFFSET_COUNT, PREV_HITS, j, max_next_n,
            n_blocks, n_buckets, width, k, sink, local, recent, w, one_minus_w, E, BLOCK_K,
            WIDTH_PAD, USE_SLOT, USE_OFFSET, COMBINE_MAX, TOPK_FIRST)
        tl.store(GAIN + group * max_next_n + j,
                 _gain(observed, hits, with_value, without_value, n, RADIX))


@triton.jit
def _observe_row0(x, block, apply, s, group, newest, SLOT_EMA, LAST_SEEN, STEP, BUCKET, ROW0_SUM,
                  ROW0_COUNT, n_blocks, n_buckets, alpha, one_minus_alpha, AGES: tl.constexpr):
    """Row 0's share of BlockState::apply at observe (commit replays row 0 in every mtp_update
    mode, and nothing reads this (slot, layer)'s state in between): each observed block's slot
    EMA and last-seen — separate float32 multiplies and adds, as commit_kernel — and its value
    in fixed point added to its distance bucket's sum and count (integer atomics: the same in
    any order), which commit turns into the offset EMA's update."""
    at = group.to(tl.int64) * n_blocks + block
    old = tl.load(SLOT_EMA + at, mask=apply, other=0.0).to(tl.float32)  # NaN: never observed
    ema = tl.where(old == old, one_minus_alpha * old + alpha * x, x)
    tl.store(SLOT_EMA + at, ema.to(tl.float16), mask=apply)
    if AGES:  # stalest exploration's ages (State.last_seen)
        mark = tl.load(STEP + s).to(tl.int32)
        tl.store(LAST_SEEN + at, tl.zeros_like(block).to(tl.int32) + mark, mask=apply)
    bucket = tl.load(BUCKET + tl.maximum(newest - block, 0), mask=apply, other=0)
    sums = group.to(tl.int64) * n_buckets + bucket
    tl.atomic_add(ROW0_SUM + sums, _fixed_point(tl.where(apply, x, 0.0)), mask=apply,
                  sem="relaxed")
    tl.atomic_add(ROW0_COUNT + sums, apply.to(tl.int32), mask=apply, sem="relaxed")


def launch(spec, tables, state, S, layer, next_n, scored, topk, blocks, positions=None,
           width=None, *, chunk_blocks, measure=False, radix=False):
    """observe_kernel for the rows of S's open step at `layer`: scored [rows, ≥ width·E] float32,
    topk [rows, ≥ k] int compact columns, blocks int32 [rows, ≥ width] the rows' selected blocks
    (unit column stride); positions: int32 [rows, k] to receive the remapped top-k (request
    positions), or None. width: the compact columns in blocks (default spec.width; a prefill
    observes every block). measure: adapt's measurements of a decode step (_adapt.py)."""
    width = spec.width if width is None else width
    rows = scored.shape[0]
    k = int(spec.config["topk"])
    c = spec.config
    scored = scored if scored.stride(1) == 1 else scored.contiguous()
    topk = topk if topk.stride(1) == 1 else topk.contiguous()
    topk_hits = c["pooling"] == "topk-hits"
    block_c = max(1, 4096 // spec.block_entries)
    # topk-hits pools from the hits program 0 counts: one program a row. Else a chunk of blocks
    # a program (Serving.observe_chunk_blocks), so that a batch of one still spreads a long row
    # over the GPU.
    chunk = width if topk_hits else max(1, chunk_blocks)
    remap = positions is not None
    out = positions if remap else topk          # a pointer the kernel never touches without REMAP
    adapt = bool(measure and spec.adapt)
    # (Without adapt a constant: a prefill's width varies with the prompt, one compile serves all.)
    width_pad = triton.next_power_of_2(max(width, 16)) if adapt else 16
    # adapt's row-0 program holds the row's selected blocks in registers (as select does):
    # ptxas for sm_90a spills nothing at 2,048 lanes on 8 warps (56 B on 4), 348 B at 4,096 and
    # 6.9 KB at 8,192 (512K entries; 12 KB on 16 warps) — for a GPU to time.
    warps = 8 if adapt else 4
    observe_kernel[(rows, triton.cdiv(width, chunk))](
        scored, scored.stride(0), topk, topk.stride(0), state.visible, S, tables.pool_rank,
        state.pending_x, state.pending_hits, state.pending_hits.view(torch.int32),
        state.pending_newest, out, out.stride(0), blocks, blocks.stride(0), state.slot_ema,
        state.last_seen, state.step, tables.bucket, state.row0_sum, state.row0_count,
        state.offset_ema, state.offset_count, state.prev_hits, state.req_key, tables.counter,
        state.explore_share, tables.budget, tables.left, state.additions_gain, state.gain_steps,
        state.gain, state.explore_yield, layer,
        spec.num_layers, spec.pad_slot, spec.n_buckets, spec.alpha, spec.one_minus_alpha,
        spec.max_next_n, spec.max_blocks, spec.hits_row, width, k, next_n, chunk,
        int(c["sink_blocks"]), int(c["local_blocks"]), spec.recent, spec.w, spec.one_minus_w,
        GAIN_WARMUP, E=spec.block_entries, BLOCK_C=block_c, BLOCK_K=triton.next_power_of_2(k),
        HITS=spec.needs_hits, TOPK_HITS=topk_hits, DEEP=spec.deep_pool, REMAP=remap,
        LANES=spec.hits_lanes, AGES=spec.ages, ADAPT=adapt, WIDTH_PAD=width_pad,
        STALEST=c["explore_policy"] == "stalest", USE_SLOT=spec.use_slot,
        USE_OFFSET=spec.use_offset, COMBINE_MAX=c["combine"] == "max",
        TOPK_FIRST=spec.topk_first, RADIX=radix, num_warps=warps, enable_fp_fusion=False)
