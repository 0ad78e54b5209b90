""":func:`spin_dsa.device._paging.compact` and :func:`~spin_dsa.device._paging.remap` in Triton:
one launch each where the torch reference dispatches ~30 and ~15 small ops (measured on an H200:
56 µs and 33 µs per decode layer at batch 64, 128K — launch gaps, not bytes; bench/gpu/README.md).
The torch functions in ``_paging.py`` are the reference: the tests compare the two bit for bit on
hostile shapes (tests/device/test_paging.py).

compact: one program per request. It walks the request's chosen blocks in tiles and, per tile,
  - adds each of its next_n rows' visible entries block by block (``min(E, max(0, visible_j −
    block·E))`` over the row's own valid blocks) to the row's compacted length;
  - writes the pages of the request's set (its first row carries it) to the compacted table: the
    engine's physical page where the page starts below the newest row's visible entries, else
    ``PAD_PAGE``.
remap: one program per (row, tile of top-k columns): ``blocks[row, c // E] · E + c % E``, -1 kept.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

TILE = 512          # blocks per step of a compact program
REMAP_TILE = 1024   # top-k columns per remap program


@triton.jit
def _compact_kernel(BLOCKS, stride_b, COUNTS, TABLE_IN, stride_ti, max_pages, SEQ, TABLE, stride_t,
                    LENGTHS, COUNTERS, width, compress_ratio, page_size,
                    NEXT_N: tl.constexpr, BP: tl.constexpr, PAD: tl.constexpr, TILE: tl.constexpr,
                    COUNT: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    E = page_size * BP
    seq = tl.load(SEQ + b).to(tl.int64)
    newest = tl.maximum(seq, 0) // compress_ratio                 # row next_n − 1 sees the most
    first = b * NEXT_N
    n0 = tl.load(COUNTS + first).to(tl.int64)
    if COUNT:  # an engine's statistics: rows, blocks scored, blocks visible (integer atomics)
        tl.atomic_add(COUNTERS, NEXT_N, sem="relaxed")
        tl.atomic_add(COUNTERS + 1, n0, sem="relaxed")
        tl.atomic_add(COUNTERS + 2, (newest + E - 1) // E, sem="relaxed")
    offs = tl.arange(0, TILE)
    for j in tl.static_range(NEXT_N):
        r = first + j
        vis = tl.maximum(seq - NEXT_N + 1 + j, 0) // compress_ratio
        n = tl.load(COUNTS + r).to(tl.int64)
        total = tl.zeros((TILE,), tl.int64)
        for start in range(0, width, TILE):
            c = start + offs
            blk = tl.load(BLOCKS + r * stride_b + c, mask=c < width, other=-1).to(tl.int64)
            valid = (c < n) & (blk >= 0)
            total += tl.where(valid, tl.minimum(tl.maximum(vis - blk * E, 0), E), 0)
        tl.store(LENGTHS + r, tl.sum(total, axis=0).to(tl.int32))
    for start in range(0, width, TILE):
        c = start + offs
        blk = tl.load(BLOCKS + first * stride_b + c, mask=c < width, other=-1).to(tl.int64)
        valid = (c < n0) & (blk >= 0)
        for p in tl.static_range(BP):
            logical = blk * BP + p
            read = valid & (logical * page_size < newest)
            safe = tl.minimum(tl.where(read, logical, 0), max_pages - 1)
            page = tl.load(TABLE_IN + b * stride_ti + safe, mask=read & (c < width), other=PAD)
            tl.store(TABLE + b * stride_t + c * BP + p, tl.where(read, page, PAD).to(tl.int32), mask=c < width)


@triton.jit
def _remap_kernel(TOPK, stride_k, k, BLOCKS, stride_b, width, OUT, stride_o, E, TILE: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    idx = tl.program_id(1) * TILE + tl.arange(0, TILE)
    inside = idx < k
    c = tl.load(TOPK + row * stride_k + idx, mask=inside, other=-1).to(tl.int64)
    slot = tl.minimum(tl.maximum(c, 0) // E, width - 1)
    blk = tl.load(BLOCKS + row * stride_b + slot, mask=inside, other=-1).to(tl.int64)
    pos = blk * E + tl.maximum(c, 0) % E
    tl.store(OUT + row * stride_o + idx, tl.where((c >= 0) & (blk >= 0), pos, -1).to(tl.int32), mask=inside)


def compact(blocks, counts, block_table, seq_lens, next_n, block_pages, page_size, compress_ratio, pad_page,
            counters=None):
    """Arguments checked by the caller (``_paging.compact``). Returns (table, lengths) as there."""
    rows, width = blocks.shape
    batch = seq_lens.shape[0]
    assert batch > 0 and width > 0, "empty shapes take the torch path (_paging.compact)"
    table = torch.empty((batch, width * block_pages), dtype=torch.int32, device=blocks.device)
    lengths = torch.empty(rows, dtype=torch.int32, device=blocks.device)
    blocks, block_table = _rows_contiguous(blocks), _rows_contiguous(block_table)
    _compact_kernel[(batch,)](blocks, blocks.stride(0), counts.contiguous(), block_table, block_table.stride(0),
                              block_table.shape[1], seq_lens.contiguous(), table, table.stride(0), lengths,
                              lengths if counters is None else counters, width, compress_ratio, page_size,
                              NEXT_N=next_n, BP=block_pages, PAD=pad_page, TILE=TILE,
                              COUNT=counters is not None, num_warps=4)
    return table, lengths


def remap(topk_compact, blocks, block_entries, out):
    """Arguments checked by the caller (``_paging.remap``); writes ``out`` int32 [rows, k]."""
    rows, k = topk_compact.shape
    if rows == 0 or k == 0:
        return out
    topk_compact, blocks = _rows_contiguous(topk_compact), _rows_contiguous(blocks)
    _remap_kernel[(rows, triton.cdiv(k, REMAP_TILE))](topk_compact, topk_compact.stride(0), k, blocks,
                                                      blocks.stride(0), blocks.shape[1], out, out.stride(0),
                                                      block_entries, TILE=REMAP_TILE, num_warps=4)
    return out


def _rows_contiguous(t):
    return t if t.stride(-1) == 1 else t.contiguous()
