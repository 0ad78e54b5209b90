"""spin_dsa.device — spin on a torch device (CUDA, or CPU for tests).

One indexer layer of a decode step (rows = batch · next_n), every call batched, with static
shapes and no host synchronisation, so an engine's CUDA graph can capture the whole step::

    blocks, counts = serving.select(slots, layer, seq_lens, next_n)   # or select_layers(...)
    table, lengths = compact(blocks, counts, block_table, seq_lens, next_n)
    logits = paged_logits(q, weights, kv_cache, table, lengths, next_n=next_n)  # or DeepGEMM's
    cols = topk(logits, lengths, k)                    # over the compact width only
    serving.observe_scored(slots, layer, logits, cols, blocks=blocks)
    positions = remap(cols, blocks, serving.block_entries)  # the engine's top-k buffer
    ...
    serving.commit(slots, accepted)                    # once per step, after the last layer

- :class:`Serving`: the serving contract of :class:`spin_dsa.Serving` with its state on the
  device; it selects exactly the blocks the C++ library selects for the same calls.
- :func:`compact`, :func:`remap`, :func:`topk` (and its reference): the compacted page table the
  engine's paged logits kernel reads, top-k over the compact width, the map back to positions.
- :func:`paged_logits` (Triton) and :func:`paged_logits_reference` (torch): the block-sparse paged
  fp8 logits kernel, for engines without DeepGEMM; needs triton (the rest needs torch only).

Needs torch (imported here, not by ``spin_dsa``).
"""

from ._paging import compact, deepgemm_context_lens, remap, topk, topk_reference, visible_entries
from ._serving import PREDICTORS, Serving

try:  # Triton is optional: the selection and paging above are plain torch
    from ._logits import paged_logits, paged_logits_reference
except ImportError as _missing:  # pragma: no cover - depends on the environment
    _reason = f"spin_dsa.device.paged_logits needs triton ({_missing})"

    def paged_logits(*args, **kwargs):
        raise ImportError(_reason)

    paged_logits_reference = paged_logits

__all__ = ["Serving", "PREDICTORS", "compact", "remap", "topk", "topk_reference",
           "deepgemm_context_lens", "visible_entries", "paged_logits", "paged_logits_reference"]
