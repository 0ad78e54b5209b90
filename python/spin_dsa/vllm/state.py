"""The plugin's per-process state: the parsed --additional-config and the one runtime.

vLLM builds every indexer op under set_current_vllm_config(...). The first op that finds spin on
creates the runtime from that config (layers, context, batch, speculative tokens):
- on CUDA, the device path (device_path.DeviceRuntime: state and selection on the GPU), after
  the startup checks below — a combination it cannot serve stops the engine at load, with one
  line naming the setting and what to use instead, never inside a forward;
- on CPU, the host path (runtime.SpinRuntime: the C++ predictor and spin's CPU kernels).
Tests call reset() between configurations, and may set DEVICE_PATH_ON to run the device path on
CPU tensors (vLLM's CUDA-path Python with its kernels stood in).
"""

from __future__ import annotations

import atexit
import logging

from .config import SpinConfig, parse_spin_config
from .runtime import SpinRuntime

logger = logging.getLogger("spin_dsa.vllm")

# The models whose DSA indexer spin drives (vLLM architecture names): DeepSeek-V3.2 and GLM-5
# (vLLM's deepseek_v32 module), DeepSeek-V4.
SERVED_ARCHITECTURES = ("DeepseekV32ForCausalLM", "GlmMoeDsaForCausalLM", "DeepseekV4ForCausalLM",
                        "DeepseekV4ForConditionalGeneration")

# The vLLM versions whose DSA code the plugin was written and tested against (major, minor).
SUPPORTED_VLLM = ((0, 32), (0, 33), (0, 34))

#: Tests: a torch device to run the device path on where vLLM's platform is not CUDA.
DEVICE_PATH_ON: str | None = None
#: Whether MRV2's model-state resolution is hooked (runner_hooks.hook_model_state sets it; checked
#: at load when MRV2 is in use).
V2_HOOKED = False

_runtime = None
_config_id: int | None = None


def _vllm_config():
    from vllm.config import get_current_vllm_config
    return get_current_vllm_config()


def spin_config(vllm_config=None) -> SpinConfig:
    vc = vllm_config if vllm_config is not None else _vllm_config()
    return parse_spin_config(vc.additional_config if isinstance(vc.additional_config, dict) else {})


def _model_layers(vc) -> tuple[int, int]:
    """(decoder layers, MTP draft layers) of the model."""
    text = vc.model_config.hf_text_config
    return (int(text.num_hidden_layers),
            int(getattr(text, "num_nextn_predict_layers", 0) or 0))


def _next_n(vc) -> int:
    spec = vc.speculative_config
    return 1 + (int(spec.num_speculative_tokens) if spec is not None else 0)


def enabled() -> bool:
    """Whether the current vLLM config turns spin on."""
    return spin_config().enabled


def attach(op) -> bool:
    """Called by every indexer op at construction: whether spin drives this op's layer. Creates
    the runtime at the first op with spin on (and refuses what it cannot serve)."""
    vc = _vllm_config()
    cfg = spin_config(vc)
    if not cfg.enabled:
        return False
    check_layer(vc, op)
    layers, draft_layers = _model_layers(vc)
    if on_device():
        if op.spin_layer >= layers:
            return False  # the MTP drafter's indexer stays vLLM's (dense)
        rt = _ensure_device_runtime(vc, cfg, op)
        rt.first_layer = op.spin_layer if rt.first_layer is None else min(rt.first_layer,
                                                                           op.spin_layer)
        rt.last_layer = op.spin_layer if rt.last_layer is None else max(rt.last_layer,
                                                                        op.spin_layer)
        return True
    global _runtime, _config_id
    if _runtime is None or _config_id != id(vc):
        _runtime = SpinRuntime(cfg, num_layers=layers + draft_layers,
                               max_entries=int(vc.model_config.max_model_len),
                               max_requests=int(vc.scheduler_config.max_num_seqs),
                               max_next_n=_next_n(vc), model=str(vc.model_config.model))
        _config_id = id(vc)
    return True


def check_layer(vc, op):
    """Refuses, at load and on either path, an indexer layer spin cannot drive."""
    if getattr(op, "candidate_blocks", None) is not None:
        raise RuntimeError(
            f"spin: {_architecture(vc)}'s two-level candidate selection (indexer "
            f"'{op.k_cache.prefix}' reads or writes candidate_blocks, as DeepSeek-V4.1's do) is "
            "not supported: its candidate blocks index request positions, which spin's "
            "compacted logits do not keep; turn spin off for this model")


def check_model(vc, model):
    """Once the model is built, what no single layer shows. A model spin is on for must be one it
    serves (SERVED_ARCHITECTURES) with its indexer layers on vLLM's SparseAttnIndexer, one state
    per indexer cache: another DSA model (Kimi-K3 calls vLLM's indexer function itself; Mistral
    Large 4 and HY-V4 build the op, unchecked), or two indexer layers on one cache (DeepSeek-V4.1's
    KV sharing), is refused by name; a model without DSA is served unchanged, with a warning."""
    if not spin_config(vc).enabled:
        return
    spin_caches: dict[str, int] = {}
    dsa = False
    for module in model.modules():
        dsa = dsa or any(c.__name__.endswith("IndexerCache") for c in type(module).__mro__)
        if getattr(module, "spin_on", False):
            prefix = module.k_cache.prefix
            spin_caches[prefix] = spin_caches.get(prefix, 0) + 1
    arch = _architecture(vc)
    if not (dsa or spin_caches):
        logger.warning("spin: %s has no DSA indexer; spin is on but changes nothing", arch)
        return
    if arch not in SERVED_ARCHITECTURES or not spin_caches:
        raise RuntimeError(
            f"spin: {arch}'s DSA indexer is not one spin drives (spin serves "
            f"{', '.join(SERVED_ARCHITECTURES)} through vLLM's SparseAttnIndexer); turn spin "
            "off for this model")
    shared = sorted(p for p, n in spin_caches.items() if n > 1)
    if shared:
        raise RuntimeError(
            f"spin: indexer layers of {arch} share the indexer cache '{shared[0]}' (KV sharing, "
            "as DeepSeek-V4.1's); spin keeps one state per cache and cannot serve them; turn spin "
            "off for this model")


def _architecture(vc) -> str:
    archs = getattr(vc.model_config, "architectures", None) or ["this model"]
    return str(archs[0])


def on_device() -> bool:
    if DEVICE_PATH_ON is not None:
        return True
    from vllm.platforms import current_platform
    return current_platform.is_cuda_alike()


def _ensure_device_runtime(vc, cfg: SpinConfig, op):
    global _runtime, _config_id
    if _runtime is not None and _config_id == id(vc):
        return _runtime
    check_device_path(vc, cfg, op)
    import torch

    from .device_path import DeviceRuntime
    layers, _ = _model_layers(vc)
    device = DEVICE_PATH_ON or f"cuda:{torch.cuda.current_device()}"
    try:
        _runtime = DeviceRuntime(
            cfg, num_layers=layers, max_tokens=int(vc.model_config.max_model_len),
            max_requests=int(vc.scheduler_config.max_num_seqs), max_next_n=_next_n(vc),
            max_batch=int(vc.scheduler_config.max_num_seqs),
            page_size=page_entries(vc, op), topk=int(op.topk_tokens),
            compress_ratio=int(getattr(op, "compress_ratio", 1) or 1), device=device,
            model=str(vc.model_config.model), cache=op.k_cache)
    except ValueError as e:  # spin_dsa's InvalidArgument/OutOfRange name the setting
        raise RuntimeError(f"spin: --additional-config spin cannot run on the device path: {e}") \
            from e
    _config_id = id(vc)
    _add_splitting_op(vc)
    return _runtime


def page_entries(vc, op) -> int:
    """Entries per page of the layer's indexer cache: the bound cache's own shape where one is
    bound ([pages, entries, 132]), else the layer's KV-cache spec (its ``num_states``, or block
    size ÷ tokens per state), else the block size ÷ the compress ratio. Not
    ``cache_config.block_size`` alone: DeepSeek-V4's 256-token blocks hold 64 compressed entries."""
    cache = getattr(op.k_cache, "kv_cache", None)
    if cache is not None and cache.dim() == 3 and cache.shape[1] > 0:
        return int(cache.shape[1])
    block = int(vc.cache_config.block_size)
    spec_of = getattr(op.k_cache, "get_kv_cache_spec", None)
    if spec_of is not None:
        spec = spec_of(vc)
        if getattr(spec, "num_states", None):
            return int(spec.num_states)
        if getattr(spec, "tokens_per_state", None):
            return int(spec.block_size) // int(spec.tokens_per_state)
    return block // int(getattr(op, "compress_ratio", 1) or 1)


def check_device_path(vc, cfg: SpinConfig, op):
    """Refuses, at load, every combination the device path cannot serve."""
    import vllm

    import spin_dsa.device as sd

    def refuse(setting, instead):
        raise RuntimeError(f"spin: {setting} is not supported on the GPU path; {instead}")

    version = tuple(int(p) for p in vllm.__version__.split(".")[:2] if p.isdigit())
    if version not in SUPPORTED_VLLM:
        names = [f"{a}.{b}" for a, b in SUPPORTED_VLLM]
        refuse(f"vLLM {vllm.__version__}",
               f"use vLLM {', '.join(names[:-1])} or {names[-1]}, or turn spin off")
    from vllm.platforms import current_platform
    if DEVICE_PATH_ON is None and current_platform.is_rocm():
        refuse("ROCm", "run spin on NVIDIA GPUs, or turn spin off")
    family = getattr(current_platform, "is_device_capability_family", None)
    if DEVICE_PATH_ON is None and family is not None and family(100):
        # Blackwell's decode metadata is DeepGEMM's varlen form (per-token rows with `indices`,
        # and from vLLM 0.34 decode chunked by a logits budget), which spin's compaction has not
        # been checked against.
        refuse("Blackwell's varlen decode indexer (SM100)", "run spin on Hopper (SM90), or turn "
               "spin off")
    if getattr(op, "use_fp4_cache", False):
        refuse("the MXFP4 indexer cache", "use the FP8 indexer cache (indexer_kv_dtype fp8)")
    spec = getattr(vc, "speculative_config", None)
    if getattr(spec, "enable_adaptive_verification", False):
        # vLLM 0.34 marks every decode batch non-uniform under it (its FULL graphs are captured
        # for up to next_n rows a request), so every step would fall back to the dense decode.
        refuse("adaptive verification (speculative_config.enable_adaptive_verification)",
               "run without it, or turn spin off")
    pc = vc.parallel_config
    if int(getattr(pc, "decode_context_parallel_size", 1) or 1) > 1:
        refuse("decode context parallelism (-dcp > 1)", "run with -dcp 1")
    if int(getattr(pc, "prefill_context_parallel_size", 1) or 1) > 1:
        refuse("prefill context parallelism (-pcp > 1)", "run with -pcp 1")
    if getattr(pc, "enable_dbo", False) or getattr(pc, "use_ubatching", False):
        refuse("micro-batching (--enable-dbo)", "run without it")
    if getattr(vc, "use_v2_model_runner", False) and not V2_HOOKED:
        refuse("vLLM's model runner V2 in this build", "set VLLM_USE_V2_MODEL_RUNNER=0")
    if cfg.predictor not in sd.PREDICTORS:
        refuse(f"predictor '{cfg.predictor}'", f"choose one of {list(sd.PREDICTORS)}")
    mode = getattr(getattr(vc, "compilation_config", None), "cudagraph_mode", None)
    if cfg.record is not None and mode is not None and mode.has_full_cudagraphs():
        refuse("record mode with FULL CUDA graphs", "add --enforce-eager, or "
               "-O.cudagraph_mode=PIECEWISE (record copies the recorded rows to the host)")
    if cfg.verify_ranks and mode is not None and mode.has_full_cudagraphs():
        refuse("verify_ranks with FULL CUDA graphs", "add --enforce-eager, or "
               "-O.cudagraph_mode=PIECEWISE (the check reads the all-reduced checksums)")


def _add_splitting_op(vc):
    """Piecewise compilation (breakable graphs off) must split the graph at spin's op, so that it
    runs eagerly every step: a captured copy would replay its capture-time decisions (the decode
    layout, a fallback, the prompts to observe) on every later batch."""
    cc = getattr(vc, "compilation_config", None)
    ops = getattr(cc, "splitting_ops", None)
    if isinstance(ops, list) and "spin_dsa::sparse_attn_indexer_cuda" not in ops:
        ops.append("spin_dsa::sparse_attn_indexer_cuda")


def runtime():
    if _runtime is None:
        raise RuntimeError("spin: no runtime (spin is off, or no indexer op was built)")
    return _runtime


def runtime_or_none():
    return _runtime


def stats() -> dict | None:
    """The runtime's counters (steps, steps run dense, slots, blocks scored / visible), or None
    without a runtime."""
    return _runtime.stats() if _runtime is not None else None


def reset():
    """Forgets the runtime (writing any traces still recording)."""
    global _runtime, _config_id
    if _runtime is not None and hasattr(_runtime, "close"):
        _runtime.close()
    _runtime, _config_id = None, None


atexit.register(reset)
