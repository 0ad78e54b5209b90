"""Block-sparse paged fp8 logits of DSA's lightning indexer, in Triton, with a plain-torch
reference beside it.

    I[r, c] = k_scale[c] · Σ_h w[r, h] · ReLU(q[r, h, :] · k[c, :])

over vLLM's paged indexer cache (include/spin/geometry.h: per page ``page_size × 128`` e4m3 bytes then
``page_size`` fp32 scales, 132 bytes an entry; the cache is uint8 ``[num_pages, page_size·132]``)
and a block table whose row lists the pages to read in column order: the compacted table of
:func:`spin_dsa.device._paging.compact` (only the chosen blocks), or an engine's own block table
(dense: every block listed). Column ``c`` of request ``b`` is entry ``c % page_size`` of page
``table[b, c // page_size]``. Row ``r`` (request ``r // next_n``) scores its columns
``< lengths[r]``; columns at and past it are -inf, so the buffer never holds garbage.

The kernel (one program = one request × a run of column tiles, all the request's next_n rows and
heads at once, so each key is read once per request):

* q is loaded once per program, ``[next_n·heads, 128]`` (padded to a power of two, at least 16,
  as tl.dot wants), and stays in shared memory as the MMA's B operand; key tiles stream through
  the table (tiles may cross pages, so any page size works), global → shared by asynchronous
  copies several tiles deep — the page ids of tile t+1 are loaded during tile t, so no key load
  waits on a table load of its own iteration;
* ``S = k · qᵀ``, ``[BLOCK_N, next_n·heads]``: keys on the MMA's M side, so the head sum stays
  inside each warp's rows (shuffles). ``tl.dot`` on fp8 e4m3 operands — the keys loaded through
  an e4m3 pointer, read by the MMA straight from shared memory — with fp32 accumulation where
  the GPU has fp8 tensor cores (sm_89+; Hopper's QGMMA) and under the interpreter; elsewhere the
  e4m3 bytes are decoded bit by bit to fp16 (exact: e4m3 spans 2^-9..448, inside fp16's range,
  with 3 of its 10 mantissa bits) for an fp16 ``tl.dot`` (fp16, not bf16: the interpreter's
  bf16 dot is wrong in triton 3.7);
* the epilogue is fused: ReLU, × w, the sum over heads per row, × k_scale, the -inf mask, one
  store per row — logits are written once and never re-read.

It is memory-bound (132 bytes in, 4·next_n out and 2·64·128·next_n FLOP per entry): launch sizes
are picked from the shapes only (no autotuning, nothing that runs at capture time), with enough
programs to fill the GPU and loads pipelined over ``num_stages``.

Numerics: e4m3 × e4m3 products are exact in fp32; the kernel sums 128 of them, and then the heads,
in fp32 (in the order the MMA and the reduction choose). :func:`paged_logits_reference` computes
in float64, where the 128-term dot is exact (products span < 2^44), so the kernel's error is fp32
rounding alone, bounded by (γ_128 + γ_64) · B ≈ 1.2e-5 · B with ``B = k_scale · Σ_h |w_h| ·
Σ_d |q_d k_d|`` (every sign made positive; the UE8M0 scale is a power of two, exact): the tests
require ``|kernel - reference| <= 2e-5 · B`` and the same -inf pattern. Not bitwise: summation
order differs. On a GPU, Hopper's fp8 MMA accumulates with fewer than fp32's bits inside one
instruction (DeepSeek-V3 report: ~14 bits), so the GPU bench checks against 1e-3 · B.
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

__all__ = ["paged_logits", "paged_logits_reference", "entry_bytes", "LaunchConfig", "launch_config",
           "tile_shape"]

HEAD_DIM = 128
SCALE_BYTES = 4


def entry_bytes() -> int:
    """Bytes of one cache entry: 128 e4m3 values + one fp32 scale."""
    return HEAD_DIM + SCALE_BYTES


def _pow2(n: int) -> int:
    return 1 << max(0, int(n) - 1).bit_length()


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@dataclass(frozen=True)
class LaunchConfig:
    """Launch parameters picked from shapes alone (so a CUDA graph captures one fixed launch)."""
    nn: int          # next_n padded to a power of two
    hp: int          # heads padded to a power of two (nn·hp >= 16 for tl.dot)
    block_n: int     # columns per tile
    tiles: int       # tiles per program
    num_warps: int
    num_stages: int
    fp8_dot: bool


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    if device.type == "cuda":
        return torch.cuda.get_device_properties(device).multi_processor_count
    return 1


@functools.lru_cache(maxsize=None)
def _has_fp8_dot(device: torch.device) -> bool:
    if device.type != "cuda":
        return True        # the interpreter computes fp8 dots (in fp32)
    return torch.cuda.get_device_capability(device) >= (8, 9)


def tile_shape(next_n: int, heads: int) -> tuple[int, int, int, int, int]:
    """(nn, hp, block_n, num_warps, num_stages) for a GPU launch: next_n and heads padded to powers
    of two (nn·hp ≥ 16 for tl.dot), keys per tile, warps, pipeline depth.

    Per head-side width nn·hp, checked by compiling for sm_90a with Triton 3.7's ptxas (no
    spills; keys go global → shared by cp.async, num_stages tiles deep, and the MMA reads them from
    shared memory; tests/device/test_logits.py compiles every shape):
      ≤ 128 (plain decode, next_n 2): 64-key tiles, 4 warps, 3 stages. Measured on an H200
            (bench/gpu's launch-shape sweep, `--sweep-only N`, dense batch 64 at 128K,
            2026-12-04, bench/results/gpu-h200-sweep*-c3a77b2.json): next_n 1 302 µs, 79 % of
            HBM, against 312 µs with 4 stages, 342–361 µs (66–69 %) for the 128-key tiles
            chosen before and ≥ 314 µs for every other shape (8 warps, 5/6 stages, 32/256
            keys); next_n 2 444 µs, 55 %, against 453 µs with the 5 stages chosen before, and no
            shape above 55 % (its 128 query rows per key: not a launch-shape matter);
      ≥ 256 (next_n 3-4):   64-key tiles, 4 warps, 5 stages: 255 regs, 75 KB, 2 an SM (at
            4·64 heads the MMA work per byte nears Hopper's fp8 ridge: no longer HBM-bound).
    """
    nn = _pow2(next_n)
    hp = max(_pow2(heads), 16 // nn if nn < 16 else 1)
    rows = nn * hp
    if rows <= 128:
        return nn, hp, 64, 4, 3
    return nn, hp, 64, 4, 5


def launch_config(batch: int, next_n: int, heads: int, width: int, device: torch.device,
                  fp8_dot: bool | None = None) -> LaunchConfig:
    """The launch for these shapes on ``device`` (shapes only: a CUDA graph captures it as is)."""
    nn, hp, block_n, num_warps, num_stages = tile_shape(next_n, heads)
    tiles_per_req = _cdiv(max(width, 1), block_n)
    if device.type == "cuda":
        # ~24 programs an SM (≈ 8 waves of 3): the last wave's tail stays small, and a program
        # keeps q in registers over up to 32 tiles.
        want = max(1, _cdiv(batch * tiles_per_req, 24 * _sm_count(device)))
        tiles = min(tiles_per_req, want, 32)
    else:
        tiles = tiles_per_req   # interpreter: one program per request, fewer Python launches
        num_stages = 1
    use_fp8 = _has_fp8_dot(device) if fp8_dot is None else fp8_dot
    return LaunchConfig(nn, hp, block_n, tiles, num_warps, num_stages, use_fp8)


def _as_bytes(name: str, t: torch.Tensor) -> torch.Tensor:
    if t.dtype == torch.uint8:
        return t
    if t.dtype == torch.float8_e4m3fn:
        return t.view(torch.uint8)
    raise TypeError(f"{name}: expected uint8 or float8_e4m3fn e4m3 bytes, got {str(t.dtype).replace('torch.', '')}")


def _check(q, weights, kv_cache, table, lengths, next_n, page_size, width):
    for name, t in (("q", q), ("weights", weights), ("kv_cache", kv_cache), ("table", table), ("lengths", lengths)):
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.device != q.device:
            raise ValueError(f"{name}: on {t.device}, expected {q.device} like q")
    if q.dim() != 3 or q.shape[2] != HEAD_DIM:
        raise ValueError(f"q: expected [rows, heads, 128], got {tuple(q.shape)}")
    if weights.dtype != torch.float32 or tuple(weights.shape) != tuple(q.shape[:2]):
        raise ValueError(f"weights: expected float32 {tuple(q.shape[:2])}, got {weights.dtype} {tuple(weights.shape)}")
    if table.dtype != torch.int32 or table.dim() != 2:
        raise TypeError(f"table: expected int32 [batch, pages], got {table.dtype} {tuple(table.shape)}")
    if lengths.dtype != torch.int32 or lengths.dim() != 1:
        raise TypeError(f"lengths: expected int32 [rows], got {lengths.dtype} {tuple(lengths.shape)}")
    if next_n < 1 or page_size < 1:
        raise ValueError("next_n, page_size: must be >= 1")
    rows = table.shape[0] * next_n
    if q.shape[0] != rows or lengths.shape[0] != rows:
        raise ValueError(f"q/lengths: expected {rows} rows (table batch {table.shape[0]} · next_n {next_n}), "
                         f"got q {tuple(q.shape)}, lengths {tuple(lengths.shape)}")
    page_bytes = page_size * entry_bytes()
    if kv_cache.numel() % page_bytes or not kv_cache.is_contiguous():
        raise ValueError(f"kv_cache: expected contiguous whole pages of {page_bytes} bytes "
                         f"(page_size {page_size}), got {tuple(kv_cache.shape)}")
    if width is not None and width < 0:
        raise ValueError("width: must be >= 0")


def paged_logits(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, table: torch.Tensor,
                 lengths: torch.Tensor, *, next_n: int = 1, page_size: int = 64, width: int | None = None,
                 out: torch.Tensor | None = None, fp8_dot: bool | None = None,
                 config: LaunchConfig | None = None) -> torch.Tensor:
    """Indexer logits over a (compacted) paged cache: float32 ``[rows, width]``.

    q: e4m3 (uint8 or float8_e4m3fn) ``[rows, heads, 128]``, rows = batch · next_n, row
    ``b·next_n + j`` = row j of request b; weights: float32 ``[rows, heads]`` with every scale
    folded in; kv_cache: uint8 pages (any shape of ``num_pages · page_size · 132`` contiguous
    bytes, e.g. ``[num_pages, page_size·132]`` or DeepGEMM's ``[num_pages, page_size, 1, 132]``);
    table: int32 ``[batch, pages]`` physical pages in column order; lengths: int32 ``[rows]``
    columns each row scores (a prefix; -inf from there). width: output columns (default
    ``pages · page_size``). fp8_dot: force the fp8 tensor-core path or the fp16-decode one.
    On CPU tensors the kernel runs only under ``TRITON_INTERPRET=1``.
    """
    q = _as_bytes("q", q)
    kv_cache = _as_bytes("kv_cache", kv_cache)
    _check(q, weights, kv_cache, table, lengths, next_n, page_size, width)
    if q.device.type != "cuda" and not _interpreting():
        raise ValueError("q: CPU tensors need TRITON_INTERPRET=1 set before triton is imported "
                         "(or use paged_logits_reference)")
    batch, rows, heads = table.shape[0], q.shape[0], q.shape[1]
    width = table.shape[1] * page_size if width is None else width
    if out is None:
        out = torch.empty((rows, width), dtype=torch.float32, device=q.device)
    elif out.dtype != torch.float32 or out.dim() != 2 or out.shape[0] != rows or out.shape[1] < width \
            or out.stride(1) != 1 or out.device != q.device:
        raise ValueError(f"out: expected float32 [{rows}, >= {width}] with unit column stride on {q.device}")
    if rows == 0 or width == 0:
        return out
    try:  # triton: imported on first use only (the reference and the launch shapes need torch alone)
        from ._logits_kernel import _paged_logits_kernel
    except ImportError as e:
        raise ImportError(f"paged_logits needs triton ({e}); paged_logits_reference needs torch only") from e
    cfg = config or launch_config(batch, next_n, heads, width, q.device, fp8_dot)
    q, weights, table, lengths = q.contiguous(), weights.contiguous(), table.contiguous(), lengths.contiguous()
    cache = kv_cache.reshape(-1)
    grid = (batch, _cdiv(width, cfg.tiles * cfg.block_n))
    _paged_logits_kernel[grid](
        q, weights, cache, cache.view(torch.float32), table, table.stride(0), table.shape[1], lengths,
        out, out.stride(0), width, next_n, heads, cfg.tiles,
        PAGE_SIZE=page_size, NN=cfg.nn, HP=cfg.hp, BLOCK_N=cfg.block_n, FP8_DOT=cfg.fp8_dot,
        num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    return out


def paged_logits_reference(q: torch.Tensor, weights: torch.Tensor, kv_cache: torch.Tensor, table: torch.Tensor,
                           lengths: torch.Tensor, *, next_n: int = 1, page_size: int = 64,
                           width: int | None = None, dtype: torch.dtype = torch.float64) -> torch.Tensor:
    """The same logits in plain torch (any device), computed in ``dtype`` (float64 by default:
    the 128-term e4m3 dots are then exact) and returned as float32 ``[rows, width]``.
    Gathers every listed page: memory ``batch · pages · page_size · 128`` elements of ``dtype``."""
    q = _as_bytes("q", q)
    kv_cache = _as_bytes("kv_cache", kv_cache)
    _check(q, weights, kv_cache, table, lengths, next_n, page_size, width)
    batch, pages = table.shape
    heads = q.shape[1]
    width = pages * page_size if width is None else width
    cache = kv_cache.reshape(-1, page_size * entry_bytes())
    g = cache[table.to(torch.int64).clamp(0, cache.shape[0] - 1)]                 # [batch, pages, bytes]
    keys = g[..., :page_size * HEAD_DIM].contiguous().view(torch.float8_e4m3fn).to(dtype)
    keys = keys.reshape(batch, pages * page_size, HEAD_DIM)
    scales = g[..., page_size * HEAD_DIM:].contiguous().view(torch.float32).to(dtype).reshape(batch, -1)
    qd = q.view(torch.float8_e4m3fn).to(dtype).reshape(batch, next_n, heads, HEAD_DIM)
    dots = torch.einsum("bnhd,bsd->bnhs", qd, keys).clamp_min(0)
    w = weights.to(dtype).reshape(batch, next_n, heads)
    s = torch.einsum("bnhs,bnh->bns", dots, w) * scales[:, None, :]
    s = s.reshape(batch * next_n, pages * page_size).to(torch.float32)
    out = torch.full((batch * next_n, width), float("-inf"), dtype=torch.float32, device=q.device)
    cols = min(width, pages * page_size)
    col = torch.arange(cols, device=q.device)
    keep = col[None, :] < lengths.to(torch.int64)[:, None]
    out[:, :cols] = torch.where(keep, s[:, :cols], float("-inf"))
    return out
