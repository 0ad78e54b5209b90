"""select: each row's blocks (forced, exploration, then the highest rank) and the step opened —
the torch reference beside the Triton launch (_select_kernel.py), both over the containers of
_state.py. The library (src/predict/predictor_base.cpp, predictor_ema.cpp) is the reference of
both: the same keys in the same strict total order — (value, block index) packed into one int64
— so the chosen set does not depend on how it is found (a sort here, a k-th search there).
"""

import torch

from . import _hash
from ._paging import visible_entries
from ._state import (FLT_MAX, GAIN_WARMUP, INT64_MAX, RECENT_BASE, TOPK_FIRST_BASE, TOPK_HITS_CAP,
                     UNKNOWN_BASE, blocks_for_entries)


def row_visible(spec, seq_lens, next_n):
    """[batch, next_n] entries each row sees."""
    return visible_entries(seq_lens, next_n, spec.compress_ratio).view(-1, next_n)


def hit_tie_level(p):
    """PredictorBase::hit_tie_level (spin_dsa._core.hit_tie_level) on a float32 tensor: p in
    quarters of [-1, 1], as 0, 1/8, ..., 7/8 (NaN: 0). tests/device/test_tables.py holds the two
    equal."""
    quarter = torch.floor((p + 1.0) * 4.0)
    return torch.where(quarter > 0, quarter.clamp(max=7.0), 0.0) * 0.125


def select(spec, tables, state, S, layer_ids, seq_lens, next_n, kernel=None, radix=False):
    """Every (layer of layer_ids, slot of S) group's blocks, layer-major, and the step opened:
    (blocks int32 [layers, batch·next_n, width], counts int32 [layers, batch·next_n]). With
    `kernel` (_select_kernel) one fused launch, the step's bookkeeping in it; else plain torch
    ops, its reference."""
    n_layers, batch = layer_ids.shape[0], S.shape[0]
    shape = (n_layers, batch * next_n, spec.width)
    if kernel is not None:
        blocks = torch.empty(shape, dtype=torch.int32, device=S.device)
        counts = torch.empty(shape[:2], dtype=torch.int32, device=S.device)
        kernel.launch(spec, tables, state, S, layer_ids, seq_lens, next_n, blocks, counts,
                      radix=radix)
        return blocks, counts
    visible = row_visible(spec, seq_lens, next_n).clamp(max=spec.max_entries)
    n = blocks_for_entries(visible, spec.block_entries)  # [batch, next_n] blocks each row sees
    # Groups g = (layer, slot), layer-major: every layer's rows in one batch.
    S_g = S.repeat(n_layers)
    L_g = layer_ids.repeat_interleave(batch)
    chosen = _choose(spec, tables, state, S_g, L_g, n.repeat(n_layers, 1))
    union = chosen.any(dim=1)  # [groups, N]: a request's blocks, scored once for all rows
    blocks, counts = _compact_ids(spec, tables, union)
    open_step(spec, tables, state, S, S_g, L_g, seq_lens, next_n, visible.repeat(n_layers, 1))
    if next_n == 1:  # one row a request: the groups are the rows (no copy)
        return blocks.reshape(shape), counts.reshape(shape[:2])
    return (blocks.repeat_interleave(next_n, dim=0).view(shape),
            counts.repeat_interleave(next_n, dim=0).view(shape[:2]))


def open_step(spec, tables, state, S, S_g, L_g, seq_lens, next_n, visible):
    """The torch path's bookkeeping of a select (the select kernel's _open_step): the
    groups' pending rows emptied and flagged selected, their rows' visibility, each slot's
    rows and the tokens cached before them."""
    _mark_selected(spec, tables, state, S_g, L_g)
    # The open step's pending rows start empty, reset here once for every layer selected (the
    # observe kernel writes only the blocks it observes). The values are device scalars: a
    # Python number here would be a host-to-device copy, which a CUDA graph cannot capture.
    state.pending_x.index_put_((S_g, L_g), tables.nan)
    state.row0_sum.index_put_((S_g, L_g), tables.zero_sum)
    state.row0_count.index_put_((S_g, L_g), tables.zero_count)
    if spec.needs_hits:
        state.pending_hits.index_put_((S_g, L_g), tables.zero_hits)
    if spec.adapt:  # nothing measured yet (observe measures, _adapt.py)
        state.gain.index_put_((S_g, L_g), tables.nan64)
        state.explore_yield.index_put_((S_g, L_g), tables.zero_sum)
    state.open_next_n.index_fill_(0, S, next_n)
    state.opened[S] = seq_lens.long() - next_n
    state.opened[spec.pad_slot:].fill_(0)
    state.visible[S_g, L_g, :next_n] = visible


def _mark_selected(spec, tables, state, S, L):
    state.selected.index_put_((S, L), tables.true)
    # The pad slot never opens a step: its rows (several a batch) would update one state in
    # a racy order; kept empty, what they select is the same on every run and every rank.
    state.selected[spec.pad_slot].fill_(False)


def _choose(spec, tables, state, S, layer, n):
    """[batch, next_n, N] each row's set: forced, then exploration, then the highest rank."""
    b = tables.block_ids
    valid, candidate = candidates(spec, b, n)
    chosen = valid & ~candidate  # forced
    n_explore, n_history = _explore_counts(spec, tables, state, S, layer, n)
    if spec.fill == "random" or spec.explores:
        key = _explore_keys(spec, tables, state, S, layer)
        picked = _smallest(key.unsqueeze(1), candidate, n_explore)
        chosen, candidate = chosen | picked, candidate & ~picked
    if spec.fill == "ranked":
        p = _rank(spec, tables, state, S, layer, n, keeps_additions(spec, state, S, layer))
        chosen = chosen | _smallest(_rank_keys(p, b), candidate, n_history)
    return torch.where(tables.keep_all[n].unsqueeze(-1), valid, chosen)


def candidates(spec, block_ids, n):
    """([..., N] the blocks rows of n blocks see, [..., N] those of them not forced)."""
    n3 = n.unsqueeze(-1)
    valid = block_ids < n3
    forced = valid & ((block_ids < int(spec.config["sink_blocks"]))
                      | (block_ids >= n3 - int(spec.config["local_blocks"])))
    return valid, valid & ~forced


def keeps_additions(spec, state, S, layer):
    """Whether spin's additions apply to each group's ranking: always, or with adapt where the
    layer's measured gain is ≥ 0 or not yet measured on GAIN_WARMUP steps ([batch] bool;
    PredictorBase::keeps_additions)."""
    if not spec.adapt:
        return True
    return (state.additions_gain[S, layer] >= 0.0) | (state.gain_steps[S, layer] < GAIN_WARMUP)


def _explore_counts(spec, tables, state, S, layer, n):
    """[batch, next_n] exploration and history counts: the tables', or with explore_churn or
    adapt min(llround(share · budget), left) from each (slot, layer)'s share, as select_row."""
    if not (spec.explore_churn or spec.adapt):
        return tables.n_explore[n], tables.n_history[n]
    x = state.explore_share[S, layer].unsqueeze(1) * tables.budget[n].double()
    whole = torch.floor(x)
    left = tables.left[n]
    explore = torch.minimum((whole + (x - whole >= 0.5).double()).long(), left)
    return explore, left - explore


def _explore_keys(spec, tables, state, S, layer):
    """[batch, N] the exploration order: the library's hash (top 32 bits) or last_seen age,
    then the block index (mark_explored in predictor_base.cpp)."""
    if spec.fill == "random" or spec.config["explore_policy"] == "uniform":
        key = _hash.step_key(state.req_key[S], layer, state.step[S])
        # The top 32 bits, moved down by 2^31 so that int64 order is their uint32 order.
        high = _hash.high32(_hash.draws(key, tables.counter)) - (1 << 31)
    else:
        high = state.last_seen[S, layer].long() + 1 - (1 << 31)  # age, unsigned order
    return high * (1 << 32) + tables.block_ids


def _rank(spec, tables, state, S, layer, n, additions=True):
    """[batch, next_n, N] float32 p[b] as the library's ema_rank / step-reuse rank them;
    additions (True, False or [batch] bool): where spin's additions — the recency window, the
    last top-k first — apply (predictor_ema.cpp add_additions)."""
    d = (n.unsqueeze(-1) - 1 - tables.block_ids).clamp(min=0)
    unknown = UNKNOWN_BASE - d.to(torch.float32)
    if spec.keeps_topk:
        hits = state.prev_hits[S, layer].unsqueeze(1).int()
    if spec.step_reuse:
        return torch.where(hits > 0, hits.to(torch.float32), unknown)
    p = unknown
    bucket = tables.bucket[d.clamp(max=tables.bucket.shape[0] - 1)]
    offset = torch.gather(state.offset_ema[S, layer].unsqueeze(1).expand(-1, n.shape[1], -1),
                          2, bucket)
    known_offset = torch.gather(
        state.offset_count[S, layer].unsqueeze(1).expand(-1, n.shape[1], -1), 2, bucket) > 0
    slot = state.slot_ema[S, layer].float().unsqueeze(1)
    known_slot = slot == slot  # NaN: never observed
    if spec.use_offset:
        p = torch.where(known_offset, offset, p)
    if spec.use_slot:
        p = torch.where(known_slot, slot, p)
    if spec.use_slot and spec.use_offset:
        if spec.config["combine"] == "max":
            both = torch.maximum(slot, offset)
        else:  # w·s + (1-w)·o, each operation rounded to float32 as the library does
            both = tables.w * slot + tables.one_minus_w * offset
        p = torch.where(known_slot & known_offset, both, p)
    if additions is False:
        return p
    # Where the additions apply: everywhere, or a group's mask (a device tensor; a Python bool
    # made a tensor here would be a host-to-device copy, which a CUDA graph cannot capture).
    on = True if additions is True else additions.view(-1, *([1] * (p.dim() - 1)))
    if spec.recent > 0:  # kRecentBase - distance, newest first (predictor_ema.cpp)
        p = torch.where((d < spec.recent) & on, RECENT_BASE - d.to(torch.float32), p)
    if spec.topk_first:  # above every p, most hits first, ties by p (kTopkFirstBase, predictor_ema.cpp)
        raised = (TOPK_FIRST_BASE + hits.clamp(max=TOPK_HITS_CAP).to(torch.float32)) + hit_tie_level(p)
        p = torch.where((hits > 0) & on, raised, p)
    return p


def _compact_ids(spec, tables, union):
    """[batch, N] mask → (ascending ids [batch, width] -1 padded, counts [batch]) int32."""
    batch = union.shape[0]
    position = torch.cumsum(union, dim=1) - 1
    target = torch.where(union, position, spec.width).clamp(max=spec.width)
    out = torch.full((batch, spec.width + 1), -1, dtype=torch.int64, device=union.device)
    out.scatter_(1, target, tables.block_ids.expand(batch, -1))
    out[:, spec.width] = -1
    return out[:, :spec.width].to(torch.int32), union.sum(dim=1).to(torch.int32)


def _smallest(key, mask, k):
    """Per row, the k[row] smallest keys among `mask` (keys distinct: the block index is in the
    low 32 bits), as a mask. key [..., N] broadcastable to mask; k [...]."""
    key = torch.where(mask, key, INT64_MAX)
    ordered = torch.sort(key, dim=-1).values
    kth = torch.gather(ordered, -1, (k - 1).clamp(min=0).unsqueeze(-1))
    return mask & (key <= kth) & (k > 0).unsqueeze(-1)


def _rank_keys(p, block_ids):
    """Highest p first, ties to the lower block: (~float_order(sanitize(p)) << 32 | b) as int64 in
    the same order as the library's uint64 keys (mark_ranked in predictor_base.cpp)."""
    p = torch.where(p >= -FLT_MAX, p, -FLT_MAX) + 0.0  # NaN, -inf → -FLT_MAX; -0 → +0
    bits = p.view(torch.int32).long() & 0xFFFFFFFF
    order = torch.where(bits >= 1 << 31, 0xFFFFFFFF - bits, bits + (1 << 31))
    return (0xFFFFFFFF - order - (1 << 31)) * (1 << 32) + block_ids
