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
- a tap over the decode top-k dispatcher (the device path observes and remaps there);
- the request lifecycle: MRV1's _update_states hook (vLLM 0.32 and 0.33; 0.34 has MRV2 only) and
  MRV2's model state (new, finished and preempted requests, each batch's row order);
- the model check once the runner has built the model (state.check_model).
"""

from __future__ import annotations

import functools
import inspect
import logging

logger = logging.getLogger("spin_dsa.vllm")

_registered = False


def _patch_v32_direct_call():
    """CUDA V3.2 (models/deepseek_v32/attention.py) calls sparse_attn_indexer() itself, from
    a method vLLM already marks as a breakable-graph break point."""
    try:
        import vllm.models.deepseek_v32.attention as v32
    except Exception:  # this vLLM build has no CUDA V3.2 attention
        return
    original = v32.sparse_attn_indexer
    if getattr(original, "_spin", False):
        return
    v32.sparse_attn_indexer = wrap_indexer_function(original)


def wrap_indexer_function(original):
    """vLLM's sparse_attn_indexer function with spin's device path around it (spin off, or a
    layer spin does not drive: `original` itself)."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def sparse_attn_indexer(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        from vllm.forward_context import get_forward_context

        from . import indexer_op

        def run(max_model_len):
            if max_model_len is not None:
                bound.arguments["max_model_len"] = max_model_len
            return original(*bound.args, **bound.kwargs)
        a = bound.arguments
        return indexer_op.device_call(_layer_name(a["k_cache_prefix"]),
                                      get_forward_context().attn_metadata, run, a["q_quant"],
                                      a["weights"])

    sparse_attn_indexer._spin = True
    return sparse_attn_indexer


def _layer_name(prefix):
    """vLLM 0.33 may pass the layer name encoded (_encode_layer_name); decode it as vLLM does."""
    if isinstance(prefix, str):
        return prefix
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    return sai._resolve_layer_name(prefix)


def _patch_topk_tap():
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    from .device_path import TopkTap
    original = sai.get_indexer_topk
    if getattr(original, "_spin", False):
        return

    @functools.wraps(original)
    def get_indexer_topk(backend):
        return TopkTap(original(backend))

    get_indexer_topk._spin = True
    sai.get_indexer_topk = get_indexer_topk


def register():
    """The vllm.general_plugins entry point: installs the op and the hooks (idempotent)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.custom_op import CustomOp
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer

    from . import indexer_op, runner_hooks

    from vllm.model_executor.custom_op import op_registry_oot
    if "SparseAttnIndexer" in op_registry_oot:  # another plugin swapped the op first
        logger.warning("spin: SparseAttnIndexer is already replaced by %s; spin drives the "
                       "V3.2 CUDA path only", op_registry_oot["SparseAttnIndexer"].__name__)
    else:
        cls = indexer_op.make_op_class(SparseAttnIndexer)
        # The registry key must be the class name (CustomOp.__new__ swaps by it); the op's own
        # name stays vLLM's, so custom_ops=["-sparse_attn_indexer"] still matches it.
        CustomOp.register_oot(cls, name="SparseAttnIndexer")
        cls.name = SparseAttnIndexer.name
    _patch_v32_direct_call()
    _patch_topk_tap()
    for runner in runner_hooks.v1_runners():
        runner_hooks.hook_model_runner(runner)
    try:  # MRV2's model states (absent from builds without the V2 runner)
        import vllm.v1.worker.gpu.model_states as model_states
    except ImportError:
        model_states = None
    if model_states is not None:
        runner_hooks.hook_model_state(model_states)
    v2 = runner_hooks.v2_runner()
    if v2 is not None:
        runner_hooks.hook_initialize_kv_cache(v2)
    _registered = True


__all__ = ["register"]
