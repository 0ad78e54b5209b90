"""observe: the scored rows pooled into the open step (row 0 into the state at once, draft rows
pending until commit), and a prompt's full row observed as its prefill — the torch reference
beside the Triton launch (_observe_kernel.py), both over the containers of _state.py. The
library's src/predict/pooling.cpp and block_state.cpp are the reference of both.
"""

import torch

from . import _adapt, _select
from ._paging import remap
from ._paging import topk as _exact_topk
from ._state import SlotUpdate, blocks_for_entries


def observe(spec, tables, state, S, layer, next_n, scored, topk, blocks, positions,
            observe_kernel, chunk_blocks, radix=False):
    """Serving.observe_scored's work, its arguments checked: one launch with the kernel (where
    the top-k is given and a block's entries are a power of two), else torch ops."""
    rows = scored.shape[0]
    E, k = spec.block_entries, int(spec.config["topk"])
    E_pow2 = E & (E - 1) == 0
    if observe_kernel is not None and topk is not None and E_pow2 and rows > 0:
        observe_kernel.launch(spec, tables, state, S, layer, next_n, scored, topk, blocks,
                              positions, chunk_blocks=chunk_blocks, measure=True, radix=radix)
        return
    visible = state.visible[S, layer, :next_n].reshape(-1)
    if topk is not None:
        topk = topk[:, :k].long()
    if positions is not None:
        remap(topk, blocks[:, :spec.width], E, out=positions)
    blocks = blocks[:, :spec.width].long()
    values = scored[:, :spec.width * E].reshape(rows, spec.width, E)
    x, hits = _pool(values, blocks, visible, topk, k, E, spec.config["pooling"],
                    _row_rank(spec, tables, visible))
    if spec.adapt:  # before row 0 moves the state (_adapt.py)
        _adapt.measure(spec, tables, state, S, layer, next_n, blocks, hits)
    _store_pending(spec, tables, state, S, layer, next_n, blocks, x, hits, visible)


def prefill(spec, tables, state, S, layer, seq_lens, logits, observe_kernel, commit_kernel,
            chunk_blocks):
    """Serving.prefill's work, its arguments checked. The kernels come together (a Serving's
    impl): the observe kernel's path opens and closes the step with the commit module's."""
    E, batch = spec.block_entries, S.shape[0]
    n_cols = min(logits.shape[1], spec.max_entries)
    n_blocks = blocks_for_entries(n_cols, E)
    k = int(spec.config["topk"])
    if observe_kernel is not None and E & (E - 1) == 0 and n_blocks > 0:
        # Four launches and the top-k's: the step opened for (slot, layer), the row's top-k by
        # the library's rule (ties to the lower position), one observe over every block
        # (compact column c is block c), the offsets updated at once.
        values = logits if logits.shape[1] == n_blocks * E else _padded_row(spec, logits, n_cols)
        commit_kernel.prefill_open(spec, state, S, layer, seq_lens.contiguous())
        cols = _exact_topk(values, state.visible[S, layer, 0], k)
        blocks = tables.block_ids32[:n_blocks].expand(batch, -1)
        observe_kernel.launch(spec, tables, state, S, layer, 1, values, cols, blocks,
                              width=n_blocks, chunk_blocks=chunk_blocks)
        commit_kernel.prefill_offsets(spec, state, S, layer)
        return
    visible = _select.row_visible(spec, seq_lens, 1).reshape(-1).clamp(max=spec.max_entries)
    values = _padded_row(spec, logits, n_cols)
    layers = torch.full_like(S, layer)
    _select.open_step(spec, tables, state, S, S, layers, seq_lens, 1,
                      visible.view(-1, 1))  # a step of one row
    state.prefill_open.index_fill_(0, S, True)  # its commit measures no churn (the library's)
    blocks = tables.block_ids[:n_blocks].expand(batch, -1)
    x, hits = _pool(values.reshape(batch, n_blocks, E), blocks, visible, None, k, E,
                    spec.config["pooling"], _row_rank(spec, tables, visible))
    _store_pending(spec, tables, state, S, layer, 1, blocks, x, hits, visible)
    _prefill_offsets(spec, tables, state, S, layers)


def _padded_row(spec, logits, n_cols):
    """The first n_cols columns of logits in whole blocks, -inf after them."""
    batch, E = logits.shape[0], spec.block_entries
    values = torch.full((batch, blocks_for_entries(n_cols, E) * E), float("-inf"),
                        dtype=torch.float32, device=logits.device)
    values[:, :n_cols] = logits[:, :n_cols]
    return values


def _prefill_offsets(spec, tables, state, S, layers):
    """A prefill's offset update at once, as the library's observe_prefill applies its row
    (a second prefill of the layer before the commit then sees the first's), its sums
    emptied so that the commit adds nothing."""
    use = (S != spec.pad_slot).unsqueeze(-1)
    update = SlotUpdate(spec, tables, state, S, layers)
    update.apply_offsets(torch.where(use, state.row0_sum[S, layers], 0),
                         torch.where(use, state.row0_count[S, layers], 0))
    state.offset_ema[S, layers] = update.offset
    state.offset_count[S, layers] = update.count
    state.row0_sum.index_put_((S, layers), tables.zero_sum)
    state.row0_count.index_put_((S, layers), tables.zero_count)


def _row_rank(spec, tables, visible):
    """Max pooling's rank for rows seeing `visible` entries; None where every rank is 1."""
    if not spec.deep_pool:
        return None
    return tables.pool_rank[blocks_for_entries(visible, spec.block_entries)].long()


def _store_pending(spec, tables, state, S, layer, next_n, blocks, x, hits, visible):
    """Pooled rows → the open step's pending rows of (slot, layer): x at the observed blocks,
    NaN elsewhere."""
    N, batch = spec.max_blocks, S.shape[0]
    target = torch.where(torch.isnan(x), N, blocks.clamp(min=0, max=N)).clamp(max=N)
    row_x = torch.full((batch * next_n, N + 1), float("nan"), dtype=torch.float32,
                       device=state.step.device)
    row_x.scatter_(1, target, x)
    row_x[:, N] = float("nan")
    row_x = row_x.reshape(batch, next_n, N + 1)
    newest = (blocks_for_entries(visible, spec.block_entries) - 1).reshape(batch, next_n)
    _observe_row0(spec, tables, state, S, layer, row_x[:, 0, :N], newest[:, 0])
    state.pending_x[S, layer, :next_n - 1] = row_x[:, 1:].half()  # at binary16, as the state takes it
    if spec.needs_hits:
        row_hits = torch.zeros(batch * next_n, N + 1, dtype=torch.int32, device=state.step.device)
        row_hits.scatter_(1, target, hits.to(torch.int32))
        row_hits[:, N] = 0
        state.pending_hits[S, layer, :next_n, :N + 1] = (
            row_hits.reshape(batch, next_n, N + 1).to(state.pending_hits.dtype))
    state.pending_newest[S, layer, :next_n] = newest


def _observe_row0(spec, tables, state, S, layer, x, newest):
    """Row 0 of the open step at `layer` (x [batch, N], NaN = not observed): its slot EMA
    and last-seen now, its offsets as fixed-point sums per bucket for commit — the observe
    kernel's split of BlockState::apply. The pad slot is left alone."""
    update = SlotUpdate(spec, tables, state, S, layer)
    use = (S != spec.pad_slot).unsqueeze(-1)
    observed = update.apply_slot(x, use)
    sums, counts = update.bucket_sums(x, newest, observed)
    state.row0_sum[S, layer] += sums
    state.row0_count[S, layer] += counts.int()
    state.slot_ema[S, layer] = update.slot.half()
    if spec.ages:
        state.last_seen[S, layer] = update.seen


def _pool(values, blocks, visible, topk, k, E, pooling, rank=None):
    """Pools rows of compact logits as src/predict/pooling.cpp does with max (or topk-hits)
    pooling: values [rows, C, E], blocks [rows, C] (-1 padded), visible [rows], topk [rows, k]
    compact columns or None, rank [rows] max pooling's rank or None (1: the block's best).
    Returns x float32 [rows, C] (NaN: block not observed) and the block's top-k hits [rows, C]."""
    rows, C = blocks.shape
    col = torch.arange(E, device=values.device)
    position = blocks.unsqueeze(-1) * E + col
    seen = (blocks.unsqueeze(-1) >= 0) & (position < visible.view(-1, 1, 1))
    # NaN is refused by the library and cannot be checked here without a sync: it counts as not
    # scored, the same on every device (a GPU's max ignores NaN, a CPU's propagates it).
    v = torch.where(seen & (values == values), values, float("-inf"))
    flat = v.reshape(rows, C * E)
    if topk is not None:
        valid = topk >= 0
        score = torch.gather(flat, 1, topk.clamp(min=0, max=C * E - 1))
        k_eff = valid.sum(dim=1)
        kth = torch.where(valid, score, float("inf")).amin(dim=1)
        row_max = torch.where(valid, score, float("-inf")).amax(dim=1)
        block = torch.where(valid, topk // E, C)
        hits = torch.zeros(rows, C + 1, dtype=torch.int64, device=v.device)
        hits = hits.scatter_add_(1, block.clamp(max=C), valid.long())[:, :C]
        kth = torch.where(k_eff > 0, kth.double(), 0.0)
    else:
        finite = v > float("-inf")
        count = finite.reshape(rows, -1).sum(dim=1)
        k_eff = count.clamp(max=k)
        top = torch.topk(flat, min(k, C * E), dim=1).values
        kth32 = torch.gather(top, 1, (k_eff - 1).clamp(min=0).unsqueeze(1)).squeeze(1)
        row_max = top[:, 0]
        greater = (v > kth32.view(-1, 1, 1)).sum(dim=-1)
        equal = ((v == kth32.view(-1, 1, 1)) & finite).sum(dim=-1)
        ties_left = k_eff - greater.sum(dim=1)
        before = torch.cumsum(equal, dim=1) - equal  # ties go to the lower positions first
        take = (ties_left.unsqueeze(1) - before).clamp(min=0).minimum(equal)
        hits = greater + take
        kth = torch.where(k_eff > 0, kth32.double(), 0.0)
    row_max64 = row_max.double()
    spread = row_max64 - kth
    fallback = torch.where((k_eff > 0) & (row_max != 0), row_max64.abs(), 1.0)
    spread = torch.where(spread > 0, spread, fallback)
    block_max = v.amax(dim=-1)
    observed = block_max > float("-inf")
    if pooling == "topk-hits":  # a tensor divisor: CUDA multiplies by a scalar's reciprocal
        x = (hits.double() / torch.full((), float(E), dtype=torch.float64,
                                        device=hits.device)).float()
    else:
        pooled = block_max if rank is None else _ranked_max(v, rank)
        r = (pooled.double() - kth.unsqueeze(1)) / spread.unsqueeze(1)
        x = torch.where(r >= 0, r, r / (1.0 - r)).float()
    return torch.where(observed, x, float("nan")), torch.where(observed, hits, 0)


def _ranked_max(v, rank):
    """Each block's rank-th largest scored value (the smallest when it has fewer; -inf when it has
    none): v [rows, C, E] with -inf for unscored entries, rank [rows] (pooling.cpp ranked_max)."""
    ordered = v.sort(dim=-1, descending=True).values
    scored = (v > float("-inf")).sum(dim=-1)
    at = (torch.minimum(rank.view(-1, 1), scored) - 1).clamp(min=0)
    return ordered.gather(-1, at.unsqueeze(-1)).squeeze(-1)
