"""Inputs shared by the integration tests: spin traces scattered into vLLM's paged indexer cache.

vLLM's indexer cache page (DeepGEMM's layout, and spin's: DESIGN.md §3) is block_size·128 e4m3
bytes then block_size fp32 scales; a request's logical pages land on physical pages drawn from a
random permutation, with spare pages in between, so a kernel that ignores the block table fails.
"""
import numpy as np

PAGE = 64
PAGE_BYTES = PAGE * 132


def scatter(requests, rng, spare=5):
    """requests: [(k uint8 [entries, 128], k_scale float32 [entries])]. Returns the page cache
    uint8 [pages, PAGE_BYTES] and the block table int32 [batch, max_pages + 2] (padded with
    page 0, which a kernel must never read for positions past a context)."""
    n_pages = [-(-k.shape[0] // PAGE) for k, _ in requests]
    total = sum(n_pages) + spare
    perm = rng.permutation(total).astype(np.int32)
    cache = np.zeros((total, PAGE_BYTES), np.uint8)
    table = np.zeros((len(requests), max(n_pages) + 2), np.int32)
    used = 0
    for b, ((k, ks), n) in enumerate(zip(requests, n_pages)):
        for lp in range(n):
            phys = perm[used]
            used += 1
            table[b, lp] = phys
            e, s = k[lp * PAGE:(lp + 1) * PAGE], ks[lp * PAGE:(lp + 1) * PAGE]
            cache[phys, :e.size] = e.reshape(-1)
            cache[phys, PAGE * 128:PAGE * 128 + 4 * s.size] = s.view(np.uint8)
    return cache, table


def visible(seq_len, next_n):
    """Entries row j of a step sees: seq_len - next_n + j + 1 (DESIGN.md §3)."""
    return np.maximum(np.asarray(seq_len)[..., None] - next_n + 1 + np.arange(next_n), 0)
