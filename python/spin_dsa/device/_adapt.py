"""adapt (config adapt=1): each layer's exploration share moved by what exploration found, and
spin's additions kept only while they rank the top-k better — the torch reference of what the
observe kernel measures and the close kernel applies (_observe_kernel._measure_adapt,
_commit_kernel.close_kernel). The library is the reference of both: PredictorBase's
record_exploration and score_rankings (predictor_base.cpp), ProbeShareState::update
(probe_share.cpp).

Where: the library measures at select (row 0's exploration against history's lowest picks) and
at commit (the rankings with and without the additions, from the state select read). On the
device the open step's row 0 moves the slot EMA at observe, so both are measured there, before
it moves, from the state select read and the rows' own top-k: the same sets, the same sums
(every block row 0 explored or history picked is in the request's selected blocks, and so is
every candidate ranked above them). Commit reads the newest replayed row's gain and row 0's
yield. The one difference: a selected block whose entries are all -inf (not scored) counts as
observed here; the library leaves it out (its pooled row holds no such block), and vLLM scores
every entry of a selected block.
"""

import torch

from ._select import (_explore_counts, _explore_keys, _rank, _rank_keys, _smallest,
                      candidates, keeps_additions)
from ._state import GAIN_WARMUP, blocks_for_entries


def measure(spec, tables, state, S, layer, next_n, blocks, hits):
    """At observe, before row 0 moves the state: every row's gain of the additions and row 0's
    exploration yield into the open step's state.gain / state.explore_yield. blocks [rows,
    width] the rows' selected blocks (-1 padded), hits [rows, width] the top-k's entries in
    each (per selected block)."""
    batch, N = S.shape[0], spec.max_blocks
    ids = tables.block_ids
    visible = state.visible[S, layer, :next_n]                       # [batch, next_n]
    n = blocks_for_entries(visible, spec.block_entries)
    at = torch.where(blocks >= 0, blocks.long(), N).clamp(max=N)
    selected = torch.zeros(batch * next_n, N + 1, dtype=torch.bool, device=S.device)
    selected = selected.scatter_(1, at, True)[:, :N].view(batch, next_n, N)
    row_hits = torch.zeros(batch * next_n, N + 1, dtype=torch.int64, device=S.device)
    row_hits = row_hits.scatter_add_(1, at, hits.long())[:, :N].view(batch, next_n, N)
    _, candidate = candidates(spec, ids, n)
    with_p = _rank(spec, tables, state, S, layer, n, True)
    without_p = _rank(spec, tables, state, S, layer, n, False)
    gain = _gain(spec, selected & candidate, row_hits, _rank_keys(with_p, ids),
                 _rank_keys(without_p, ids), n)
    keeps = keeps_additions(spec, state, S, layer)  # adapt: a [batch] device mask
    chosen_p = torch.where(keeps.view(-1, 1, 1), with_p, without_p)
    explore_yield = _explore_yield(spec, tables, state, S, layer, n[:, :1],
                                   (selected & candidate)[:, 0], row_hits[:, 0],
                                   _rank_keys(chosen_p[:, 0], ids))
    # (The pad slot's rows write it in any order: it never opens a step, so commit never reads it.)
    state.gain[S, layer, :next_n] = gain
    state.explore_yield[S, layer] = explore_yield


def _gain(spec, observed, hits, with_key, without_key, n):
    """[batch, next_n] float64 (PredictorBase::score_rankings): the top-k entries in the m
    highest-ranked observed candidates by each ranking, m = the blocks holding the top-k, their
    difference over the top-k's entries; NaN where nothing is measured (no block or no hit)."""
    m = (hits > 0).sum(dim=-1)
    total = hits.sum(dim=-1)
    take = torch.minimum(m, observed.sum(dim=-1))
    with_hits = torch.where(_smallest(with_key, observed, take), hits, 0).sum(dim=-1)
    without_hits = torch.where(_smallest(without_key, observed, take), hits, 0).sum(dim=-1)
    gain = (with_hits - without_hits).double() / total.clamp(min=1).double()
    return torch.where((n > 0) & (m > 0) & (total > 0), gain, float("nan"))


def _explore_yield(spec, tables, state, S, layer, n0, observed, hits, key):
    """[batch, 4] int64 (PredictorBase::record_exploration, ProbeShareState::record): row 0's
    explored blocks E, the top-k entries of those history would not have picked (key above its
    lowest pick's), those of history's min(H, E) lowest picks, and min(H, E); zeros where the
    row recorded nothing (E or H is 0)."""
    E, H = (c[:, 0] for c in _explore_counts(spec, tables, state, S, layer, n0))
    explored = _smallest(_explore_keys(spec, tables, state, S, layer), observed, E)
    history = _smallest(key, observed & ~explored, H)
    cutoff = torch.where(history, key, torch.iinfo(torch.int64).min).amax(dim=-1, keepdim=True)
    novel = explored & (key > cutoff)
    inverted = (-1 - (key >> 32)) * (1 << 32) + (key & 0xFFFFFFFF)  # lowest-ranked first
    margin_count = torch.minimum(H, E)
    margin = _smallest(inverted, history, margin_count)
    recorded = (E > 0) & (H > 0)  # (a row keeping every block explores none: E = 0)
    out = torch.stack([E, torch.where(novel, hits, 0).sum(dim=-1),
                       torch.where(margin, hits, 0).sum(dim=-1), margin_count], dim=-1)
    return torch.where(recorded.unsqueeze(-1), out, 0)


def apply(spec, tables, state, S, last):
    """At commit, after the replay (ProbeShareState::update, score_rankings' EMA): where a layer
    was selected in a decode step, its additions' gain EMA from the newest replayed row's gain,
    and its exploration share from row 0's yield — float64 in the library's order."""
    selected = state.selected[S] & ~state.prefill_open[S].unsqueeze(1)
    step, floor, ceiling, fall, weight = tables.adapt_constants.unbind()
    gain = torch.gather(state.gain[S], 2,
                        last.view(-1, 1, 1).expand(-1, spec.num_layers, 1)).squeeze(2)
    old = state.additions_gain[S]
    moved = (1.0 - weight) * old + weight * gain
    measured = selected & (gain == gain)
    state.additions_gain[S] = torch.where(measured, moved, old)
    steps = state.gain_steps[S]
    state.gain_steps[S] = torch.where(measured, (steps + 1).clamp(max=GAIN_WARMUP), steps)
    slots, novel, margin, margin_count = state.explore_yield[S].unbind(-1)
    rp = novel.double() / slots.clamp(min=1).double()
    rm = margin.double() / margin_count.clamp(min=1).double()
    share = state.explore_share[S]
    both = torch.where(rp + rm > 0, rp + rm, 1.0)  # (0: no move; a 1 keeps the division finite)
    target = torch.clamp(share + (step * (rp - rm)) / both, floor, ceiling)
    moved = torch.where(target >= share, target, share + fall * (target - share))
    use = selected & (slots > 0) & (margin_count > 0) & (rp + rm > 0)
    state.explore_share[S] = torch.where(use, moved, share)
