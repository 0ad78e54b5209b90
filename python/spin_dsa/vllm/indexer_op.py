"""SpinSparseAttnIndexer: vLLM's DSA indexer op with spin choosing which KV blocks are scored.

vLLM's op (model_executor/layers/sparse_attn_indexer.py) scores every cached entry of every
decode row (paged MQA logits), then takes the top-k. With spin on, at decode:

  CPU  select (spin, host) → spin's block-masked indexer kernel over vLLM's own paged fp8 cache
       (only the chosen blocks are read) → spin's masked top-k into vLLM's topk_indices_buffer →
       observe. Prefill rows stay on vLLM's kernels; the last row of a prompt ending in the step
       is scored again by spin's kernel over every entry and observed (the warm start).
  GPU  the device path (device_path.py): select on the device → the compacted page table into
       vLLM's own paged-logits kernel and top-k backend → observe and remap on the device. No
       logits leave the device, nothing synchronises with the host.

With spin off (no "spin" in --additional-config, or "enabled": false) every call goes to vLLM's
own code unchanged.
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import torch

import spin_dsa

from . import state
from .cache_pages import kv_pages

_LAYER_RE = re.compile(r"(?:^|\.)layers\.(\d+)\.")
_OPS: dict[str, "object"] = {}  # k_cache prefix → op, for the torch custom op below


def layer_number(prefix: str) -> int:
    """The decoder layer of an indexer's k_cache prefix ('model.layers.7.self_attn.indexer...')."""
    m = _LAYER_RE.search(prefix)
    if m is None:
        raise ValueError(f"spin: cannot tell the layer of indexer cache '{prefix}' "
                         "(expected '...layers.<n>....')")
    return int(m.group(1))


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
    visible = spin_dsa.visible_entries(seq_lens, next_n)  # compress_ratio 1, as indexer_scores
    top = spin_dsa.topk(logits, int(op.topk_tokens), visible_entries=visible, block_ids=block_ids,
                        block_offsets=offsets, rows_per_mask=next_n,
                        block_entries=rt.serving.block_entries)
    topk_indices_buffer[:rows, :op.topk_tokens] = torch.from_numpy(top)
    rt.observe(layer, logits, top)
    return logits


def observe_prompts_cpu(op, md, q_quant: torch.Tensor, weights: torch.Tensor):
    """The warm start on the CPU: the last row of each prompt ending in this step (the runner
    hook's prompt ends), scored by spin's indexer kernel over every entry of vLLM's paged cache,
    observed as the request's prefill — the device path's rule (device_path._observe_prompts)."""
    rt = state.runtime()
    prompts = rt.prompt_rows(op.spin_layer)
    if not prompts:
        return
    kv = op.k_cache.kv_cache
    page_size = int(kv.shape[1])
    rt.ensure_serving(page_size, int(op.topk_tokens))
    pages, mult, base = kv_pages(kv, page_size)
    rows = torch.tensor([b for b, _ in prompts], dtype=torch.int64)
    tokens = torch.tensor([t for _, t in prompts], dtype=torch.int64)
    seq_lens = md.seq_lens.index_select(0, rows).to(torch.int64).numpy()
    bt = md.block_table.index_select(0, rows).to(torch.int32)
    if mult != 1 or base:
        bt = bt * mult + base
    heads, dim = q_quant.shape[-2], q_quant.shape[-1]
    q = q_quant.index_select(0, tokens).view(torch.uint8).reshape(-1, 1, heads, dim).contiguous()
    w = weights.index_select(0, tokens).to(torch.float32).reshape(-1, 1, heads).contiguous()
    logits = spin_dsa.indexer_scores(pages, bt.contiguous(), seq_lens, q, w, page_size=page_size,
                                     logits_cols=int(seq_lens.max()))
    rt.observe_prompts(op.spin_layer, seq_lens, logits)


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
        out = op.spin_base_forward_cpu(hidden_states, q_quant, k, weights)
        observe_prompts_cpu(op, md, q_quant, weights)
        return out
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
    observe_prompts_cpu(op, md, q_quant, weights)
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


# -- GPU: the device path (device_path.py) around vLLM's own CUDA indexer ---------------------

def device_call(prefix: str, md_dict, run, q_quant, weights):
    """One indexer layer on the device path. `run(max_model_len)` runs vLLM's CUDA indexer,
    which reads the layer's metadata from md_dict (the forward context's attn_metadata): spin
    puts the compacted decode metadata there for the call, and passes the compact width as
    max_model_len (None: vLLM's own)."""
    op = _OPS.get(prefix)
    md = md_dict.get(prefix) if isinstance(md_dict, dict) else None
    if op is None or not op.spin_on or md is None:  # spin off, or a profiling / dummy run
        return run(None)

    def call(metadata, max_model_len):
        md_dict[prefix] = metadata
        try:
            return run(max_model_len)
        finally:
            md_dict[prefix] = md
    return state.runtime().indexer(op.spin_layer, md, call, q_quant, weights, op.k_cache.kv_cache)


def cuda_forward(op, hidden_states, q_quant, k, weights):
    """The op's CUDA forward with spin on: vLLM's own forward_cuda inside the device path."""
    from vllm.forward_context import get_forward_context

    def run(max_model_len):
        saved = op.max_model_len
        if max_model_len is not None:
            op.max_model_len = max_model_len
        try:
            return op.spin_base_forward_cuda(hidden_states, q_quant, k, weights)
        finally:
            op.max_model_len = saved
    q = q_quant[0] if isinstance(q_quant, tuple) else q_quant
    return device_call(op.k_cache.prefix, get_forward_context().attn_metadata, run, q, weights)


_breakable = None


def eager_break(fn):
    """`fn` as a break point of vLLM's breakable CUDA graphs: run eagerly at capture and again at
    every replay (FULL graphs capture it whole), as vLLM marks its own indexer; `fn` itself where
    that mechanism does not exist."""
    try:
        from vllm.compilation.breakable_cudagraph import eager_break_during_capture
    except ImportError:
        return fn
    return eager_break_during_capture(fn)


# The CUDA forward as one opaque torch op (Dynamo traces over it, not into the host code).
@torch.library.custom_op("spin_dsa::sparse_attn_indexer_cuda", mutates_args=("topk_indices_buffer",))
def _cuda_op(prefix: str, hidden_states: torch.Tensor, q_quant: torch.Tensor,
             k: torch.Tensor | None, weights: torch.Tensor,
             topk_indices_buffer: torch.Tensor) -> None:
    global _breakable
    if _breakable is None:  # decorated at the first call: vLLM's env is read by then
        _breakable = eager_break(cuda_forward)
    op = _OPS[prefix]
    saved = op.topk_indices_buffer
    op.topk_indices_buffer = topk_indices_buffer
    try:
        _breakable(op, hidden_states, q_quant, k, weights)
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
            self.spin_layer = layer_number(self.k_cache.prefix) if state.enabled() else -1
            self.spin_on = self.spin_layer >= 0 and state.attach(self)
            if self.spin_on:
                if self.use_fp4_cache:
                    raise NotImplementedError("spin: the MXFP4 indexer cache is not supported; "
                                              "use the FP8 indexer cache")
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
