"""SpinSparseAttnIndexer: vLLM's DSA indexer op with spin choosing which KV blocks are scored.

vLLM's op (model_executor/layers/sparse_attn_indexer.py) scores every cached entry of every
decode row (paged MQA logits), then takes the top-k. With spin on, at decode:

  CPU  select (spin) → spin's block-masked indexer kernel over vLLM's own paged fp8 cache (only
       the chosen blocks are read) → spin's masked top-k into vLLM's topk_indices_buffer →
       observe. Prefill rows stay on vLLM's kernels (their full scores are computed anyway).
  GPU  select → vLLM's dense logits, masked to spin's blocks through vLLM's own V4.1 candidate
       hook (candidate_blocks / apply_candidate_mask) → vLLM's top-k → observe (logits copied
       to the host). Quality numbers, no speedup, until a CUDA block-sparse logits kernel exists.
       Never run on a GPU yet: tests/integration checks its host side on CPU with a stand-in for
       vLLM's CUDA op.

With spin off (no "spin" in --additional-config, or "enabled": false) every call goes to vLLM's
own code unchanged. Acceptance is not an input: SpinRuntime commits lazily from seq_len deltas.
"""

from __future__ import annotations

import dataclasses
import re
import warnings

import numpy as np
import torch

import spin_dsa

from . import state

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_OPS: dict[str, "object"] = {}  # k_cache prefix → op, for the torch custom op below


def layer_number(prefix: str) -> int:
    """The decoder layer of an indexer's k_cache prefix ('model.layers.7.self_attn.indexer...')."""
    m = _LAYER_RE.search(prefix)
    if m is None:
        raise ValueError(f"spin: cannot tell the layer of indexer cache '{prefix}' "
                         "(expected '...layers.<n>....')")
    return int(m.group(1))


def kv_pages(kv_cache: torch.Tensor, page_size: int):
    """vLLM's per-layer indexer cache as spin's page array, without a copy where possible.

    vLLM's cache is [num_blocks, block_size, ...] bytes, one page per block laid out as spin's
    (page_size·128 e4m3 values, then page_size fp32 scales), but a layer's view may stride over a
    cache shared by several layers. Returns (pages uint8 [n, page_bytes], mult, base): physical
    block p of vLLM is spin page p·mult + base."""
    page_bytes = page_size * 132
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


def _decode_shape(md):
    """(batch, next_n, per-request seq_lens int64 numpy) of the metadata's decode part."""
    dm = md.decode
    batch = int(dm.decode_lens.shape[0])
    tokens = int(md.num_decode_tokens)
    if dm.requires_padding or batch == 0 or tokens % batch:
        raise NotImplementedError("spin: decode rows of unequal length (a short prefill chunk "
                                  "scheduled as a decode under MTP) are not supported yet")
    sl = dm.seq_lens[:batch]
    last = sl[:, -1] if sl.ndim == 2 else sl  # [b, j] = L_b - next_n + j + 1, so L_b is the last
    return batch, tokens // batch, last.to(torch.int64).cpu().numpy()


def spin_decode_cpu(op, md, q_quant: torch.Tensor, weights: torch.Tensor,
                    topk_indices_buffer: torch.Tensor) -> np.ndarray:
    """spin's decode on CPU: select, masked indexer, masked top-k, observe. Writes the top-k of
    the first num_decode_tokens rows of topk_indices_buffer; returns the logits (for tests)."""
    rt = state.runtime()
    batch, next_n, seq_lens = _decode_shape(md)
    kv = op.k_cache.kv_cache
    page_size = int(kv.shape[1])
    rt.ensure_serving(page_size, int(op.topk_tokens))
    pages, mult, base = kv_pages(kv, page_size)  # before select: a bad cache leaves no open step
    layer = op.spin_layer
    block_ids, offsets = rt.select(layer, seq_lens, next_n)
    bt = md.decode.block_table[:batch].to(torch.int32)
    if mult != 1 or base:
        bt = bt * mult + base
    rows = batch * next_n
    heads, dim = q_quant.shape[-2], q_quant.shape[-1]
    q = q_quant[:rows].view(torch.uint8).reshape(batch, next_n, heads, dim).contiguous()
    w = weights[:rows].to(torch.float32).reshape(batch, next_n, heads).contiguous()
    cfg = rt.serving.config
    logits = spin_dsa.indexer_scores(pages, bt.contiguous(), seq_lens, q, w, page_size=page_size,
                                     block_ids=block_ids, block_offsets=offsets,
                                     block_pages=int(cfg["block_pages"]),
                                     logits_cols=int(seq_lens.max()))
    visible = (seq_lens[:, None] - next_n + 1 + np.arange(next_n)).clip(min=0).reshape(-1)
    top = spin_dsa.topk(logits, int(op.topk_tokens), visible_entries=visible, block_ids=block_ids,
                        block_offsets=offsets, rows_per_mask=next_n,
                        block_entries=rt.serving.block_entries)
    topk_indices_buffer[:rows, :op.topk_tokens] = torch.from_numpy(top)
    rt.observe(layer, logits, top)
    return logits


def _without_decode(md):
    return dataclasses.replace(md, num_decodes=0, num_decode_tokens=0, decode=None)


def cpu_forward(op, hidden_states, q_quant, k, weights):
    """The op's CPU forward with spin on: vLLM's kernels for prefill rows, spin's for decode."""
    from vllm.forward_context import get_forward_context

    attn_metadata = get_forward_context().attn_metadata
    if not isinstance(attn_metadata, dict):  # profiling / dummy run
        return op.spin_base_forward_cpu(hidden_states, q_quant, k, weights)
    prefix = op.k_cache.prefix
    md = attn_metadata[prefix]
    if md.num_decodes == 0:
        return op.spin_base_forward_cpu(hidden_states, q_quant, k, weights)
    buf = op.topk_indices_buffer
    if md.num_prefills > 0:  # vLLM's own prefill path on a copy of the metadata without decodes
        attn_metadata[prefix] = _without_decode(md)
        try:
            op.spin_base_forward_cpu(hidden_states, q_quant, k, weights)
        finally:
            attn_metadata[prefix] = md
    else:
        buf[:hidden_states.shape[0]] = -1
    spin_decode_cpu(op, md, q_quant, weights, buf)
    return buf


# The CPU forward as one opaque torch op, so torch.compile (fullgraph) traces over it rather than
# into numpy and the spin_dsa extension.
@torch.library.custom_op("spin_dsa::sparse_attn_indexer_cpu", mutates_args=("topk_indices_buffer",))
def _cpu_op(prefix: str, hidden_states: torch.Tensor, q_quant: torch.Tensor,
            k: torch.Tensor | None, weights: torch.Tensor,
            topk_indices_buffer: torch.Tensor) -> None:
    # Write the buffer passed in: under torch.compile it is a functionalised copy that is copied
    # back after the op, over anything written to the layer's own attribute.
    op = _OPS[prefix]
    saved = op.topk_indices_buffer
    op.topk_indices_buffer = topk_indices_buffer
    try:
        cpu_forward(op, hidden_states, q_quant, k, weights)
    finally:
        op.topk_indices_buffer = saved


@_cpu_op.register_fake
def _(prefix, hidden_states, q_quant, k, weights, topk_indices_buffer) -> None:
    return None


# -- GPU: dense logits + spin's candidate mask (vLLM's V4.1 hook) ----------------------------------

def gpu_candidates(op, md, device) -> tuple[torch.Tensor, int]:
    """spin's blocks for the decode rows as vLLM candidate_blocks (-1 padded, one row per logits
    row when seq_lens is [B, next_n], else one per request), and the block size in entries."""
    rt = state.runtime()
    batch, next_n, seq_lens = _decode_shape(md)
    rt.ensure_serving(int(op.k_cache.kv_cache.shape[1]), int(op.topk_tokens))
    block_ids, offsets = rt.select(op.spin_layer, seq_lens, next_n)
    width = 1 << max(0, int(np.diff(offsets).max()) - 1).bit_length()  # a power of two
    per_row = md.decode.seq_lens[:batch].numel() == batch * next_n
    reps = next_n if per_row else 1
    cand = np.full((batch * reps, width), -1, np.int32)
    for b in range(batch):
        ids = block_ids[offsets[b]:offsets[b + 1]]
        cand[b * reps:(b + 1) * reps, :ids.shape[0]] = ids
    return torch.from_numpy(cand).to(device), rt.serving.block_entries


class TopkTap:
    """Wraps vLLM's top-k dispatcher: when a spin GPU call is in flight, hands the (masked)
    logits and the top-k to spin's observe. Installed over get_indexer_topk in vLLM's module."""

    active_layer: int | None = None

    def __init__(self, inner):
        self.inner = inner

    def __call__(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len):
        self.inner(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)
        layer = TopkTap.active_layer
        if layer is not None:
            TopkTap.active_layer = None
            lg = logits.float().cpu().numpy()
            lg = np.where(np.isfinite(lg), lg, -np.inf).astype(np.float32)  # vLLM pads with NaN/inf
            state.runtime().observe(layer, lg, topk_indices.cpu().numpy().astype(np.int32))


def gpu_call(op_or_layer, md, call):
    """Runs vLLM's CUDA indexer `call(candidate_blocks, candidate_block_size)` with spin's mask."""
    cand, block_entries = gpu_candidates(op_or_layer, md, op_or_layer.topk_indices_buffer.device)
    TopkTap.active_layer = op_or_layer.spin_layer
    try:
        return call(cand, block_entries)
    finally:
        TopkTap.active_layer = None


def cuda_forward(op, hidden_states, q_quant, k, weights):
    """The op's CUDA forward with spin on: vLLM's own op, its decode logits masked to spin's
    blocks through the V4.1 candidate arguments (set on the layer for the call)."""
    from vllm.forward_context import get_forward_context

    md = get_forward_context().attn_metadata
    md = md.get(op.k_cache.prefix) if isinstance(md, dict) else None
    if md is None or md.num_decodes == 0 or op.candidate_blocks is not None:
        # no decode rows, or a V4.1 model whose own candidates already mask the logits
        return op.spin_base_forward_cuda(hidden_states, q_quant, k, weights)

    def call(cand, block_entries):
        saved = (op.candidate_blocks, op.candidate_block_size, op.candidate_write)
        op.candidate_blocks, op.candidate_block_size, op.candidate_write = cand, block_entries, False
        try:
            return op.spin_base_forward_cuda(hidden_states, q_quant, k, weights)
        finally:
            op.candidate_blocks, op.candidate_block_size, op.candidate_write = saved
    return gpu_call(op, md, call)


# The CUDA forward as one opaque torch op too (the host-side select would break a fullgraph trace).
@torch.library.custom_op("spin_dsa::sparse_attn_indexer_cuda", mutates_args=("topk_indices_buffer",))
def _cuda_op(prefix: str, hidden_states: torch.Tensor, q_quant: torch.Tensor,
             k: torch.Tensor | None, weights: torch.Tensor,
             topk_indices_buffer: torch.Tensor) -> None:
    op = _OPS[prefix]
    saved = op.topk_indices_buffer
    op.topk_indices_buffer = topk_indices_buffer
    try:
        cuda_forward(op, hidden_states, q_quant, k, weights)
    finally:
        op.topk_indices_buffer = saved


@_cuda_op.register_fake
def _(prefix, hidden_states, q_quant, k, weights, topk_indices_buffer) -> None:
    return None


def make_op_class(base):
    """SpinSparseAttnIndexer as a subclass of vLLM's SparseAttnIndexer (imported by register())."""

    class SpinSparseAttnIndexer(base):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.spin_on = state.enabled()
            self.spin_layer = layer_number(self.k_cache.prefix) if self.spin_on else -1
            if self.spin_on:
                if self.use_fp4_cache:
                    raise NotImplementedError("spin: the MXFP4 indexer cache is not supported yet")
                _OPS[self.k_cache.prefix] = self

        def spin_base_forward_cpu(self, hidden_states, q_quant, k, weights):
            return base.forward_cpu(self, hidden_states, q_quant, k, weights)

        def forward_cpu(self, hidden_states, q_quant, k, weights):
            if not self.spin_on:
                return super().forward_cpu(hidden_states, q_quant, k, weights)
            _cpu_op(self.k_cache.prefix, hidden_states, q_quant, k, weights,
                    self.topk_indices_buffer)
            return self.topk_indices_buffer

        def forward_cuda(self, hidden_states, q_quant, k, weights):
            if not self.spin_on:
                return super().forward_cuda(hidden_states, q_quant, k, weights)
            _cuda_op(self.k_cache.prefix, hidden_states, q_quant, k, weights,
                     self.topk_indices_buffer)
            return self.topk_indices_buffer

        def spin_base_forward_cuda(self, hidden_states, q_quant, k, weights):
            return base.forward_cuda(self, hidden_states, q_quant, k, weights)

    SpinSparseAttnIndexer.__qualname__ = "SpinSparseAttnIndexer"
    return SpinSparseAttnIndexer
