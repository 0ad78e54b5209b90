"""The emit step of :func:`spin_dsa.device._paging.topk` in Triton: given each row's k-th value
``t`` and ``need`` (how many columns scoring exactly ``t`` belong to the set), write the set
{score > t} ∪ {the first ``need`` columns scoring t} as ascending column ids, -1 after.

A stream compaction in two launches, each splitting every row into segments so that the whole GPU
works on a batch of a few rows:

1. count: per (row, segment), how many columns score above t and how many tie at t;
2. emit: each (row, segment) sums the counts of the segments before it — its first output slot
   and how many ties precede it — and writes its selected columns there through an in-block
   prefix sum; the last segment pads the row's tail with -1.

The logits are read twice (4 bytes an entry each, against the 132 the logits kernel read for it)
and only k ids are written. The torch ops of ``_paging._emit_torch`` are the reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024        # columns per inner step
SEGMENT = 8 * BLOCK  # columns per program


@triton.jit
def _count_kernel(X, stride_x, width, T, COUNTS, n_seg, SEG: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    t = tl.load(T + row)
    offs = tl.arange(0, BLOCK)
    gt = tl.zeros((BLOCK,), tl.int32)
    tie = tl.zeros((BLOCK,), tl.int32)
    end = tl.minimum(seg * SEG + SEG, width)
    for start in range(seg * SEG, end, BLOCK):
        cols = start + offs
        x = tl.load(X + row * stride_x + cols, mask=cols < width, other=float("-inf"))
        gt += (x > t).to(tl.int32)
        tie += ((x == t) & (x > float("-inf"))).to(tl.int32)
    base = COUNTS + (row * n_seg + seg) * 2
    tl.store(base, tl.sum(gt, axis=0))
    tl.store(base + 1, tl.sum(tie, axis=0))


@triton.jit
def _emit_kernel(X, stride_x, width, T, NEED, COUNTS, n_seg, OUT, stride_o, k,
                 SEG: tl.constexpr, BLOCK: tl.constexpr, S_PAD: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    seg = tl.program_id(1)
    t = tl.load(T + row)
    need = tl.load(NEED + row)
    s = tl.arange(0, S_PAD)
    c_gt = tl.load(COUNTS + (row * n_seg + s) * 2, mask=s < n_seg, other=0)
    c_tie = tl.load(COUNTS + (row * n_seg + s) * 2 + 1, mask=s < n_seg, other=0)
    before = s < seg
    ties = tl.sum(tl.where(before, c_tie, 0), axis=0)                       # ties in earlier segments
    taken = tl.sum(tl.where(before, c_gt, 0), axis=0) + tl.minimum(ties, need)
    offs = tl.arange(0, BLOCK)
    end = tl.minimum(seg * SEG + SEG, width)
    for start in range(seg * SEG, end, BLOCK):
        cols = start + offs
        x = tl.load(X + row * stride_x + cols, mask=cols < width, other=float("-inf"))
        tie = (x == t) & (x > float("-inf"))
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), axis=0)              # 1-based among ties
        take = (x > t) | (tie & (tie_rank <= need))
        dest = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(OUT + row * stride_o + dest, cols, mask=take)
        ties += tl.sum(tie.to(tl.int32), axis=0)
        taken += tl.sum(take.to(tl.int32), axis=0)
    if seg == n_seg - 1:
        for start in range(0, k, BLOCK):
            idx = start + offs
            tl.store(OUT + row * stride_o + idx, tl.full((BLOCK,), -1, tl.int32), mask=(idx >= taken) & (idx < k))


def emit(x: torch.Tensor, t: torch.Tensor, need: torch.Tensor, k: int) -> torch.Tensor:
    """x: float32 [rows, width] (-inf = not selectable; no NaN); t: float32 [rows]; need: int [rows].
    Returns int32 [rows, k], ascending columns, -1 padded."""
    rows, width = x.shape
    out = torch.empty((rows, k), dtype=torch.int32, device=x.device)
    if rows == 0:
        return out
    if x.stride(1) != 1:
        x = x.contiguous()
    n_seg = triton.cdiv(width, SEGMENT)
    counts = torch.empty((rows, n_seg, 2), dtype=torch.int32, device=x.device)
    t = t.contiguous()
    _count_kernel[(rows, n_seg)](x, x.stride(0), width, t, counts, n_seg, SEG=SEGMENT, BLOCK=BLOCK, num_warps=4)
    _emit_kernel[(rows, n_seg)](x, x.stride(0), width, t, need.to(torch.int32).contiguous(), counts, n_seg,
                                out, out.stride(0), k, SEG=SEGMENT, BLOCK=BLOCK,
                                S_PAD=max(2, triton.next_power_of_2(n_seg)), num_warps=4)
    return out
