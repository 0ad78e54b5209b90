"""Inputs shared by the paging and logits tests: a paged indexer cache in vLLM's layout
(include/spin/geometry.h: page_size·128 e4m3 bytes, then page_size fp32 UE8M0 scales), pages scattered by a random
permutation with spare pages between requests, queries, and block sets as Serving.select returns
them (ascending, -1 padded, the union of a request's MTP rows, the newest blocks always in)."""
import numpy as np
import torch

import spin_dsa


def quantize(x):
    """fp32 [n, 128] → e4m3 bytes uint8 [n, 128] and UE8M0 scales float32 [n]:
    scale = 2^ceil(log2(max(amax, 1e-4) / 448)), values e4m3_rne(clamp(x / scale, ±448))."""
    x = torch.as_tensor(x, dtype=torch.float32)
    amax = x.abs().amax(dim=1).clamp_min(1e-4)
    scale = torch.exp2(torch.ceil(torch.log2(amax / 448.0)))
    vals = (x / scale[:, None]).clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    return vals, scale


def scatter_cache(lengths, page_size, rng, spare=3, extra_cols=2):
    """One request per entry of ``lengths`` (entries), random keys. Returns cache uint8
    [pages, page_size·132] (torch), block_table int32 [batch, max_pages + extra_cols] (padded with
    page 0) and the keys per request as (bytes, scales)."""
    n_pages = [-(-int(n) // page_size) for n in lengths]
    total = sum(n_pages) + spare
    perm = rng.permutation(total)
    cache = torch.zeros((total, page_size * 132), dtype=torch.uint8)
    table = torch.zeros((len(lengths), max(n_pages + [0]) + extra_cols), dtype=torch.int32)
    used, keys = 0, []
    for b, (n, np_) in enumerate(zip(lengths, n_pages)):
        x = torch.from_numpy(rng.standard_normal((np_ * page_size, 128)).astype(np.float32))
        x *= torch.from_numpy(rng.uniform(0.01, 30.0, (np_ * page_size, 1)).astype(np.float32))
        vals, scales = quantize(x)
        keys.append((vals[:n], scales[:n]))
        for lp in range(np_):
            phys = int(perm[used])
            used += 1
            table[b, lp] = phys
            sl = slice(lp * page_size, (lp + 1) * page_size)
            cache[phys, :page_size * 128] = vals[sl].reshape(-1)
            cache[phys, page_size * 128:] = scales[sl].contiguous().view(torch.uint8)
    return cache, table, keys


def queries(rows, heads, rng, signed=True):
    """q e4m3 bytes uint8 [rows, heads, 128] and weights float32 [rows, heads] (signed or not)."""
    q = torch.from_numpy(rng.standard_normal((rows, heads, 128)).astype(np.float32) * 4)
    q = q.clamp(-448, 448).to(torch.float8_e4m3fn).view(torch.uint8)
    w = rng.standard_normal((rows, heads)) if signed else rng.uniform(0.1, 1.0, (rows, heads))
    return q, torch.from_numpy(w.astype(np.float32))


def visible(seq_len, next_n, j, compress_ratio=1):
    """Entries row j sees: the library's rule."""
    return int(spin_dsa.visible_entries([seq_len], next_n, compress_ratio)[j])


def choose_blocks(seq_lens, next_n, block_entries, rng, keep=0.5, width=None, compress_ratio=1,
                  local=1, garbage_padding=False):
    """Serving.select's output shape: blocks int32 [batch·next_n, width] ascending, -1 padded (or
    garbage past counts when ``garbage_padding``), counts int32 [batch·next_n]; per request a random
    subset of its visible blocks, always with the newest ``local`` blocks of every row; every row
    of a request carries the same set. Returns (blocks, counts, sets)."""
    sets = []
    for s in seq_lens:
        n_vis = -(-visible(s, next_n, next_n - 1, compress_ratio) // block_entries)
        chosen = {b for b in range(n_vis) if rng.random() < keep}
        for j in range(next_n):
            v = visible(s, next_n, j, compress_ratio)
            newest = (v - 1) // block_entries
            chosen |= {b for b in range(newest - local + 1, newest + 1) if b >= 0 and v > 0}
        sets.append(sorted(chosen))
    width = width or max([len(x) for x in sets] + [1])
    rows = len(seq_lens) * next_n
    blocks = torch.full((rows, width), -1, dtype=torch.int32)
    if garbage_padding:
        blocks = torch.from_numpy(rng.integers(0, 1 << 20, (rows, width)).astype(np.int32))
    counts = torch.zeros(rows, dtype=torch.int32)
    for b, chosen in enumerate(sets):
        for j in range(next_n):
            r = b * next_n + j
            blocks[r, :len(chosen)] = torch.tensor(chosen, dtype=torch.int32)
            counts[r] = len(chosen)
    return blocks, counts, sets


def abs_bound_inputs(q, w, cache, page_size):
    """Inputs whose logits are the error bound B = k_scale · Σ_h |w_h| · Σ_d |q_d k_d|: every sign
    bit cleared (e4m3's sign is bit 7) and |w|; the ReLU then never clips."""
    c = cache.clone()
    c[:, :page_size * 128] &= 0x7F
    return q & 0x7F, w.abs(), c
