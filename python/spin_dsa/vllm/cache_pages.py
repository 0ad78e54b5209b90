"""vLLM's per-layer indexer cache as spin's page array: the one view both the host path
(indexer_op.py) and the device path (device_path.py) read it through. No vLLM import.
"""

from __future__ import annotations

import warnings

import torch

import spin_dsa


def kv_pages(kv_cache: torch.Tensor, page_size: int):
    """vLLM's per-layer indexer cache as spin's page array, without a copy where possible.

    vLLM's cache is [num_blocks, block_size, ...] bytes, one page per block laid out as spin's
    (page_size·128 e4m3 values, then page_size fp32 scales), but a layer's view may stride over a
    cache shared by several layers. Returns (pages uint8 [n, page_bytes], mult, base): physical
    block p of vLLM is spin page p·mult + base."""
    page_bytes = page_size * spin_dsa.INDEXER_ENTRY_BYTES
    kv = kv_cache.view(torch.uint8) if kv_cache.dtype != torch.uint8 else kv_cache
    n = kv.shape[0]
    inner = kv[0] if n else kv
    if kv.numel() == 0 or inner.numel() != page_bytes:
        raise ValueError(f"spin: indexer cache {tuple(kv_cache.shape)} is not {page_size}-entry "
                         f"pages of {page_bytes} bytes")
    if kv.is_contiguous():
        return kv.reshape(n, page_bytes), 1, 0
    s0, off = kv.stride(0), kv.storage_offset()
    if inner.is_contiguous() and s0 % page_bytes == 0 and off % page_bytes == 0:
        mult, base = s0 // page_bytes, off // page_bytes
        pages = kv.as_strided((base + (n - 1) * mult + 1, page_bytes), (page_bytes, 1), 0)
        return pages, mult, base
    warnings.warn("spin: indexer cache layout needs a copy per call (stride "
                  f"{kv.stride()}); expect it to be slow")
    return kv.contiguous().reshape(n, page_bytes), 1, 0
