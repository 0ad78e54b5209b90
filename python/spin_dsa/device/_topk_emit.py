"""The emit step of :func:`spin_dsa.device._paging.topk` as one Triton pass per row.

Given each row's k-th value ``t`` and ``need`` (how many columns scoring exactly ``t`` belong to
the set), one program streams its row once, keeps {score > t} and the first ``need`` columns
scoring ``t``, and writes their column ids in ascending order through a running prefix sum — a
stream compaction that reads the logits once (4 bytes an entry, against the 132 the logits kernel
read for it) and writes only k ids. The torch ops of ``_emit_torch`` are its reference.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _emit_kernel(X, stride_x, width, T, NEED, OUT, stride_o, k, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    t = tl.load(T + row)
    need = tl.load(NEED + row)
    offs = tl.arange(0, BLOCK)
    ties = tl.zeros((), tl.int32)      # columns scoring t seen so far
    taken = tl.zeros((), tl.int32)     # ids written so far
    for start in range(0, width, BLOCK):
        cols = start + offs
        x = tl.load(X + row * stride_x + cols, mask=cols < width, other=float("-inf"))
        tie = (x == t) & (x > float("-inf"))
        tie_rank = ties + tl.cumsum(tie.to(tl.int32), axis=0)          # 1-based among ties
        take = (x > t) | (tie & (tie_rank <= need))
        dest = taken + tl.cumsum(take.to(tl.int32), axis=0) - 1
        tl.store(OUT + row * stride_o + dest, cols, mask=take)
        ties += tl.sum(tie.to(tl.int32), axis=0)
        taken += tl.sum(take.to(tl.int32), axis=0)
    for start in range(0, k, BLOCK):
        idx = start + offs
        tl.store(OUT + row * stride_o + idx, tl.full((BLOCK,), -1, tl.int32), mask=(idx >= taken) & (idx < k))


def emit(x: torch.Tensor, t: torch.Tensor, need: torch.Tensor, k: int) -> torch.Tensor:
    """x: float32 [rows, width] (already masked: -inf = not selectable); t: float32 [rows];
    need: int [rows]. Returns int32 [rows, k], ascending columns, -1 padded."""
    rows, width = x.shape
    out = torch.empty((rows, k), dtype=torch.int32, device=x.device)
    if rows == 0:
        return out
    x = x.contiguous()
    block = 1024 if width >= 1024 else max(16, triton.next_power_of_2(width))
    _emit_kernel[(rows,)](x, x.stride(0), width, t.contiguous(), need.to(torch.int32).contiguous(),
                          out, out.stride(0), k, BLOCK=block, num_warps=4)
    return out
