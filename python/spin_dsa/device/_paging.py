"""Compacted paging for the device path: turn the blocks that
``Serving.select`` chose into what a paged logits kernel reads, run top-k over the compact width
only, and map compact columns back to request positions.

The pipeline for one indexer layer of a decode step (rows = batch · next_n)::

    blocks, counts = serving.select(slots, layer, seq_lens, next_n)   # logical blocks, ascending
    table, lengths = compact(blocks, counts, block_table, seq_lens, next_n, block_pages, page_size)
    logits = paged_logits(q, weights, kv_cache, table, lengths, next_n=next_n, page_size=page_size)
    # or DeepGEMM (SM90/SM100), the same table with its own schedule for the compacted lengths:
    #   cl = deepgemm_context_lens(lengths, next_n)            # [batch, next_n] (or two_d=False)
    #   meta = deep_gemm.get_paged_mqa_logits_metadata(cl, page_size, num_sms)
    #   logits = deep_gemm.fp8_paged_mqa_logits(q4, kv_cache_4d, weights, cl, table, meta,
    #                                           table.shape[1] * page_size, clean_logits=False)
    cols = topk(logits, lengths, k)                 # compact columns, ascending, -1 padded
    positions = remap(cols, blocks, page_size * block_pages)   # request positions, ascending

Compact column ``c`` is entry ``c % E`` of the ``c // E``-th chosen block (E = page_size ·
block_pages), i.e. request position ``blocks[c // E] · E + c % E``. Blocks ascend, so compact
column order is position order: top-k emits ascending columns and the remap keeps that order,
which is the library's top-k output order (include/spin/topk.h: position ascending, -1 at the end)
with no extra sort.

Every function here is torch ops (plus one optional Triton kernel on CUDA) with static output
shapes and no host synchronisation — no ``.item()``, ``.cpu()``, ``.tolist()``, ``nonzero()``,
boolean-mask indexing or data-dependent shape — so an engine's CUDA graph can capture them.
Arguments are checked on shapes, dtypes and devices only: checking values would need a sync.
"""
from __future__ import annotations

import torch

__all__ = ["compact", "remap", "topk", "topk_reference", "deepgemm_context_lens", "visible_entries"]

#: What a page of ``table`` holds where no page is to be read (padding after the chosen blocks,
#: the pages of a block past the context). 0, as vLLM and DeepGEMM pad their block tables: a real
#: page index, so a kernel that loads a page speculatively still reads inside the cache, and never
#: a negative offset. Kernels read only pages below a row's length, so its content never matters.
PAD_PAGE = 0


def _check_tensor(name: str, t, dtypes, ndim: int) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise TypeError(f"{name}: expected {want}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")


def _check_device(device: torch.device, **tensors) -> None:
    for name, t in tensors.items():
        if t.device != device:
            raise ValueError(f"{name}: on {t.device}, expected {device} like the blocks")


_INDEX = (torch.int32, torch.int64)


def visible_entries(seq_lens: torch.Tensor, next_n: int, compress_ratio: int = 1) -> torch.Tensor:
    """Entries row ``j`` of each request sees: ``max(0, seq_len - next_n + j + 1) // compress_ratio``,
    as int64 ``[batch · next_n]`` (row ``i · next_n + j``).

    :func:`spin_dsa.visible_entries` (the library's rule, on the host) restated as tensor ops, so
    that it stays on the device; the device path computes visibility here and nowhere else, and
    tests/device/test_paging.py checks the two agree."""
    j = torch.arange(next_n, device=seq_lens.device, dtype=torch.int64)
    tokens = (seq_lens.to(torch.int64)[:, None] - next_n + 1 + j[None, :]).clamp_min(0)
    return (tokens // compress_ratio).reshape(-1)


def compact(blocks: torch.Tensor, counts: torch.Tensor, block_table: torch.Tensor,
            seq_lens: torch.Tensor, next_n: int, block_pages: int = 1, page_size: int = 64,
            compress_ratio: int = 1, *, use_triton: bool | None = None,
            counters: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The compacted block table and the compacted per-row lengths.

    blocks: int32 ``[batch · next_n, width]`` logical block ids, ascending, -1 padded (every row
    of a request carries the same set: the union of its MTP rows; row ``i·next_n`` is read).
    counts: int32/int64 ``[batch · next_n]`` valid ids per row (columns at or past it are padding
    whatever they hold). block_table: int32 ``[batch, max_pages]`` logical → physical page.
    seq_lens: int32/int64 ``[batch]`` entries of each request including this step's rows.

    Returns ``table`` int32 ``[batch, width · block_pages]``: the physical pages of the chosen
    blocks in order, :data:`PAD_PAGE` (0) where nothing is to be read (padding blocks, and pages
    of the newest block that lie past the request's context); and ``lengths`` int32
    ``[batch · next_n]``: the entries row ``j`` sees in compact order, ``Σ_c min(E, max(0,
    visible_j - blocks[c]·E))``. Because blocks ascend, what a row sees is a prefix of the compact
    columns of that length (a partly visible block can only be the last one that is visible).

    use_triton: one Triton launch (``_paging_kernel.py``; default: on CUDA tensors when triton
    imports) instead of the torch ops below, which are its reference.
    counters: int64 ``[3]`` an engine keeps statistics in, or None: this call adds its rows, the
    blocks its requests score (the first row's count each) and the blocks they see (their newest
    row's, in E-entry blocks) — inside the same launch.
    """
    _check_tensor("blocks", blocks, _INDEX, 2)
    _check_tensor("counts", counts, _INDEX, 1)
    _check_tensor("block_table", block_table, _INDEX, 2)
    _check_tensor("seq_lens", seq_lens, _INDEX, 1)
    _check_device(blocks.device, counts=counts, block_table=block_table, seq_lens=seq_lens)
    if next_n < 1 or block_pages < 1 or page_size < 1 or compress_ratio < 1:
        raise ValueError("next_n, block_pages, page_size, compress_ratio: each must be >= 1")
    batch = seq_lens.shape[0]
    rows, width = blocks.shape
    if rows != batch * next_n or counts.shape[0] != rows:
        raise ValueError(f"blocks/counts: expected {batch * next_n} rows (batch {batch} · next_n "
                         f"{next_n}), got blocks {tuple(blocks.shape)}, counts {tuple(counts.shape)}")
    if block_table.shape[0] != batch or block_table.shape[1] < 1:
        raise ValueError(f"block_table: expected [batch={batch}, max_pages >= 1], got {tuple(block_table.shape)}")
    if counters is not None:
        _check_tensor("counters", counters, (torch.int64,), 1)
        _check_device(blocks.device, counters=counters)
        if counters.shape[0] != 3:
            raise ValueError(f"counters: expected 3 entries, got {counters.shape[0]}")
    if _use_triton(use_triton, blocks) and blocks.shape[0] > 0 and blocks.shape[1] > 0:
        from . import _paging_kernel
        return _paging_kernel.compact(blocks, counts, block_table, seq_lens, next_n, block_pages, page_size,
                                      compress_ratio, PAD_PAGE, counters)
    entries = page_size * block_pages
    dev = blocks.device
    col = torch.arange(width, device=dev)
    valid = (col[None, :] < counts.to(torch.int64)[:, None]) & (blocks >= 0)     # [rows, width]
    start = blocks.to(torch.int64) * entries                                      # first entry of each block

    # Lengths: each row's visible entries block by block (a block past the row counts 0).
    vis = visible_entries(seq_lens, next_n, compress_ratio)                       # [rows]
    per_block = (vis[:, None] - start).clamp(0, entries) * valid
    lengths = per_block.sum(dim=1).to(torch.int32)

    # Table: the request's first row carries the set. A page is read only if it starts below the
    # newest row's visible entries; the others (and padding) become PAD_PAGE.
    r_blocks = blocks.reshape(batch, next_n, width)[:, 0].to(torch.int64)        # [batch, width]
    r_valid = valid.reshape(batch, next_n, width)[:, 0]
    p = torch.arange(block_pages, device=dev)
    logical = (r_blocks[:, :, None] * block_pages + p).reshape(batch, width * block_pages)
    newest = vis.reshape(batch, next_n)[:, -1]
    # Each block's flag over its block_pages pages (expand + reshape: plain views and one copy).
    pages_valid = r_valid[:, :, None].expand(batch, width, block_pages).reshape(batch, width * block_pages)
    read = pages_valid & (logical * page_size < newest[:, None])
    safe = torch.where(read, logical, 0).clamp_max(block_table.shape[1] - 1)
    table = torch.where(read, block_table.gather(1, safe).to(torch.int32), PAD_PAGE)
    if counters is not None:
        counters[0] += rows
        counters[1] += counts.reshape(batch, next_n)[:, 0].long().sum()
        counters[2] += ((newest + entries - 1) // entries).sum()
    return table.to(torch.int32), lengths


def deepgemm_context_lens(lengths: torch.Tensor, next_n: int, two_d: bool = True) -> torch.Tensor:
    """DeepGEMM's ``context_lens`` for ``fp8_paged_mqa_logits`` over the compacted table.

    ``two_d`` (default): int32 ``[batch, next_n]``, row ``j``'s own length — DeepGEMM's 2-D form,
    where row ``j`` reads positions ``< context_lens[b, j]`` (it then leaves columns past a row's
    length uncleaned: :func:`topk` masks them by ``lengths`` anyway).
    ``two_d=False``: int32 ``[batch]``, the newest row's length — the 1-D form, where DeepGEMM
    applies the causal rule itself (row ``j`` reads ``< len - next_n + j + 1``). That equals the
    per-row compacted lengths exactly when every request's newest ``next_n`` entries lie in chosen
    blocks — guaranteed by ``local_blocks >= 1`` (the select forces each row's newest block) —
    each request has at least ``next_n`` entries, and ``compress_ratio`` is 1 (V4's compressed
    rows do not grow by one entry per row: use the 2-D form there).
    """
    _check_tensor("lengths", lengths, _INDEX, 1)
    if next_n < 1 or lengths.shape[0] % next_n:
        raise ValueError(f"lengths: {lengths.shape[0]} rows is not a multiple of next_n={next_n}")
    per_row = lengths.to(torch.int32).view(-1, next_n)
    return per_row.contiguous() if two_d else per_row[:, -1].contiguous()


def remap(topk_compact: torch.Tensor, blocks: torch.Tensor, block_entries: int, *,
          out: torch.Tensor | None = None, use_triton: bool | None = None) -> torch.Tensor:
    """Compact columns → request positions: ``blocks[row, c // E] · E + c % E`` with E =
    ``block_entries``; -1 (and any column whose block slot holds -1) stays -1. int32 ``[rows, k]``,
    in the order given (ascending columns give ascending positions: blocks ascend).

    out: int32 ``[rows, k]`` to write into (an engine's top-k buffer), else a new tensor.
    use_triton: one Triton launch (default: on CUDA tensors when triton imports); the torch ops
    below are its reference."""
    _check_tensor("topk_compact", topk_compact, _INDEX, 2)
    _check_tensor("blocks", blocks, _INDEX, 2)
    _check_device(topk_compact.device, blocks=blocks)
    if topk_compact.shape[0] != blocks.shape[0]:
        raise ValueError(f"topk_compact: {topk_compact.shape[0]} rows, blocks has {blocks.shape[0]}")
    if block_entries < 1:
        raise ValueError("block_entries: must be >= 1")
    if blocks.shape[1] < 1:
        raise ValueError("blocks: width must be >= 1")
    if out is not None:
        _check_tensor("out", out, (torch.int32,), 2)
        _check_device(topk_compact.device, out=out)
        if tuple(out.shape) != tuple(topk_compact.shape):
            raise ValueError(f"out: shape {tuple(out.shape)}, expected {tuple(topk_compact.shape)}")
    if _use_triton(use_triton, topk_compact):
        from . import _paging_kernel
        if out is None:
            out = torch.empty(topk_compact.shape, dtype=torch.int32, device=topk_compact.device)
        return _paging_kernel.remap(topk_compact, blocks, block_entries, out)
    c = topk_compact.to(torch.int64)
    slot = (c.clamp_min(0) // block_entries).clamp_max(blocks.shape[1] - 1)
    blk = blocks.gather(1, slot).to(torch.int64)
    pos = torch.where((c >= 0) & (blk >= 0), blk * block_entries + c % block_entries, -1).to(torch.int32)
    return pos if out is None else out.copy_(pos)


# ---------------------------------------------------------------------------------------------
# Top-k over the compact width
# ---------------------------------------------------------------------------------------------

def _masked_scores(logits: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Scores a row may select: columns below its length holding a finite value; everything else
    -inf (DESIGN §6: NaN and ±inf count as not scored). ``+ 0.0`` turns -0.0 into +0.0 so that
    the two zeros tie, as the CPU kernel treats them."""
    col = torch.arange(logits.shape[1], device=logits.device)
    ok = (col[None, :] < lengths.to(torch.int64)[:, None]) & torch.isfinite(logits)
    return torch.where(ok, logits + 0.0, float("-inf"))


def _threshold(x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k-th largest score ``t`` of each row (-inf when fewer than k are finite) and ``need``:
    how many columns scoring exactly ``t`` belong to the set (k minus those scoring above t).
    torch.topk's value multiset is exact whatever its tie order, so both are exact."""
    kk = min(k, x.shape[1])
    vals = torch.topk(x, kk, dim=1, largest=True, sorted=False).values
    t = vals.min(dim=1).values
    need = kk - (vals > t[:, None]).sum(dim=1)
    return t, need


def _emit_torch(x: torch.Tensor, t: torch.Tensor, need: torch.Tensor, k: int) -> torch.Tensor:
    """The set {score > t} ∪ {the first ``need`` columns scoring t}, written in ascending column
    order by a prefix sum (a stream compaction with a static shape), -1 after."""
    rows, width = x.shape
    finite = x > float("-inf")
    tie = (x == t[:, None]) & finite
    take = (x > t[:, None]) | (tie & (tie.cumsum(dim=1) <= need[:, None]))
    dest = torch.where(take, take.cumsum(dim=1) - 1, k)          # column k is a discard slot
    cols = torch.arange(width, device=x.device, dtype=torch.int32).expand(rows, width)
    out = torch.full((rows, k + 1), -1, dtype=torch.int32, device=x.device)
    out.scatter_(1, dest, cols)
    out[:, k] = -1
    return out[:, :k]


def _use_triton(use_triton: bool | None, t: torch.Tensor) -> bool:
    return (t.is_cuda and _have_triton()) if use_triton is None else use_triton


def _have_triton() -> bool:
    try:
        import triton  # noqa: F401
        return True
    except ImportError:
        return False


def topk(logits: torch.Tensor, lengths: torch.Tensor, k: int, *, use_triton: bool | None = None,
         clean: bool = False) -> torch.Tensor:
    """Top-k of each row over the compact width: int32 ``[rows, k]`` compact columns in ASCENDING
    order, -1 padded at the end when a row has fewer than k selectable columns.

    logits: float32 ``[rows, width]`` (e.g. :func:`paged_logits`' output, or DeepGEMM's);
    lengths: int ``[rows]``. Row ``r`` selects among its columns ``< lengths[r]`` that hold a
    finite score (NaN and ±inf are "not scored", as in ``spin_dsa.topk``). The set is exactly the
    first k in the order (score descending, column ascending) — column order is position order,
    so this is the library's tie rule (include/spin/topk.h) — whatever order torch.topk returns ties in: torch.topk only
    finds the k-th value, and the emit step takes the ties at that value by lowest column.

    use_triton: the Triton emit kernels (default: on CUDA tensors when triton imports); else the
    torch ops (plain torch: no triton needed).
    clean: the caller vouches that every column at or past a row's length holds -inf and that
    no column holds NaN or +inf — what :func:`paged_logits` writes over a NaN-free cache — so the
    masked copy of the logits (one read and one write of the whole buffer) is skipped. Unclean
    input (DeepGEMM's 2-D form leaves columns past a length as they were) needs the default.
    """
    _check_tensor("logits", logits, (torch.float32,), 2)
    _check_tensor("lengths", lengths, _INDEX, 1)
    _check_device(logits.device, lengths=lengths)
    if lengths.shape[0] != logits.shape[0]:
        raise ValueError(f"lengths: {lengths.shape[0]} rows, logits has {logits.shape[0]}")
    if k < 1:
        raise ValueError("k: must be >= 1")
    if logits.shape[1] < 1:
        raise ValueError("logits: width must be >= 1")
    x = logits if clean else _masked_scores(logits, lengths)
    t, need = _threshold(x, k)
    if _use_triton(use_triton, x):
        from ._topk_emit import emit
        return emit(x, t, need, k)
    return _emit_torch(x, t, need, k)


def topk_reference(logits: torch.Tensor, lengths: torch.Tensor, k: int) -> torch.Tensor:
    """The plain definition, for tests: a stable sort by score descending (ties keep ascending
    columns), the first k finite, sorted back to ascending columns. O(width log width)."""
    x = _masked_scores(logits, lengths)
    order = torch.sort(x, dim=1, descending=True, stable=True).indices[:, :k]
    keep = torch.gather(x, 1, order) > float("-inf")
    cols = torch.where(keep, order, logits.shape[1]).sort(dim=1).values
    out = torch.where(cols < logits.shape[1], cols, -1).to(torch.int32)
    if out.shape[1] < k:
        pad = torch.full((out.shape[0], k - out.shape[1]), -1, dtype=torch.int32, device=out.device)
        out = torch.cat([out, pad], dim=1)
    return out
