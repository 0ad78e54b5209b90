"""commit: the open step closed — row 0's offsets, then the accepted draft rows replayed into
the state in order (mtp_update), the last top-k and its churn, the step counted — the torch
reference beside the Triton launches (_commit_kernel.py), both over the containers of
_state.py, as the library's PredictorBase::commit.
"""

import torch

from . import _adapt
from ._state import CHURN_KEEP, CHURN_WEIGHT, SlotUpdate


def commit(spec, tables, state, S, rows, commit_kernel=None):
    """Serving.commit's work, its arguments checked: rows = (accepted, seq_lens, query_lens),
    the unused ones None."""
    if commit_kernel is not None:  # three launches (_commit_kernel.py)
        commit_kernel.launch(spec, tables, state, S, rows)
        if spec.keeps_topk or spec.adapt:
            commit_kernel.close(spec, tables, state, S, rows)
        commit_kernel.finish(spec, state, S)
        return
    last = _last_rows(spec, state, S, rows)
    update = SlotUpdate(spec, tables, state, S)
    selected = state.selected[S]  # row 0 is replayed wherever a layer was selected
    update.apply_offsets(torch.where(selected.unsqueeze(-1), state.row0_sum[S], 0),
                         torch.where(selected.unsqueeze(-1), state.row0_count[S], 0))
    for j in range(1, spec.max_next_n):
        use = selected & (j <= last).unsqueeze(1)  # [batch, L]
        update.apply(state.pending_x[S, :, j - 1, :spec.max_blocks].float(),
                     state.pending_newest[S, :, j], use)
    update.store()
    _close(spec, tables, state, S, last)


def _last_rows(spec, state, S, rows):
    """Each slot's last replayed row (_commit_kernel._last_row's reference)."""
    accepted, seq_lens, query_lens = rows
    opened_rows = state.open_next_n[S]
    if accepted is None:
        accepted = lengths_accepted(state, S, seq_lens, query_lens)
    mode = spec.config["mtp_update"]  # the last row replayed: prefix, row 0 or every row
    last = (accepted.long() if mode == "prefix" else opened_rows - 1 if mode == "all-rows"
            else opened_rows * 0)
    return last.clamp(min=0).minimum(opened_rows - 1)


def lengths_accepted(state, S, seq_lens, query_lens):
    """Tokens cached before this step's rows, less those before the open step's rows, less
    its sampled token (negative where nothing was accepted; _commit_kernel._last_row)."""
    return seq_lens.long() - query_lens.long() - state.opened[S] - 1


def _close(spec, tables, state, S, last):
    """After the replay (the torch path): the churn of the top-k and its blocks from the
    newest replayed row, adapt's share and gain, the step closed and counted."""
    if spec.adapt:
        _adapt.apply(spec, tables, state, S, last)
    if spec.keeps_topk:  # the newest replayed row's top-k blocks, per selected layer
        batch, N = S.shape[0], spec.max_blocks
        newest = torch.gather(state.pending_hits[S, :, :, :N], 2,
                              last.view(batch, 1, 1, 1).expand(-1, spec.num_layers, 1, N))
        newest = newest.squeeze(2).int()
        selected = state.selected[S]
        if spec.explore_churn:
            measurable = selected & ~state.prefill_open[S].unsqueeze(1)  # a prefill measures none
            _measure_churn(spec, tables, state, S, newest, measurable)
        state.prev_hits[S] = torch.where(selected.unsqueeze(-1), newest,
                                         state.prev_hits[S].int()).to(state.prev_hits.dtype)
    opened = state.selected[S].any(dim=1)
    state.selected.index_fill_(0, S, False)
    state.prefill_open.index_fill_(0, S, False)
    state.step.index_add_(0, S, opened.long())


def _measure_churn(spec, tables, state, S, newest, use):
    """BudgetMoveState::update's churn EMA for the (slot, layer)s in `use` [batch, L], from
    the newest row's hits [batch, L, N] and the top-k before it (prev_hits): the share of the
    top-k's entries in blocks that did not hold it before; then the exploration share it
    gives — float64 operations in the library's order."""
    now = newest.sum(dim=2)
    kept = torch.where(state.prev_hits[S] > 0, newest, 0).sum(dim=2)
    use = use & (now > 0) & (state.prev_hits[S] > 0).any(dim=2)
    measured = 1.0 - kept.double() / now.clamp(min=1).double()
    old = state.churn_ema[S]
    ema = torch.where(old < 0, measured, CHURN_KEEP * old + CHURN_WEIGHT * measured)
    ema = torch.where(use, ema, old)
    state.churn_ema[S] = ema
    ratio = float(spec.config["explore_ratio"])
    # A device divisor (explore_churn): a Python one lets CUDA multiply by its reciprocal (not the library's
    # rounding); the close kernel and the library divide.
    scale = torch.minimum(ema / tables.churn_constants[3], torch.ones_like(ema))
    state.explore_share[S] = torch.where(ema < 0, torch.zeros_like(ema), ratio * scale)
