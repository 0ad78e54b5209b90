"""The plugin's per-process state: the parsed --additional-config and the one SpinRuntime.

vLLM builds every indexer op under set_current_vllm_config(...), so the first op that finds spin
on creates the runtime from that config (layers, context, batch, speculative tokens). Tests call
reset() between configurations.
"""

from __future__ import annotations

import atexit

from .config import SpinConfig, parse_spin_config
from .runtime import SpinRuntime

_runtime: SpinRuntime | None = None
_config_id: int | None = None


def _vllm_config():
    from vllm.config import get_current_vllm_config
    return get_current_vllm_config()


def spin_config(vllm_config=None) -> SpinConfig:
    vc = vllm_config if vllm_config is not None else _vllm_config()
    return parse_spin_config(vc.additional_config if isinstance(vc.additional_config, dict) else {})


def enabled() -> bool:
    """Whether the current vLLM config turns spin on; creates the runtime when it does."""
    vc = _vllm_config()
    cfg = spin_config(vc)
    if cfg.enabled:
        _ensure_runtime(vc, cfg)
    return cfg.enabled


def _ensure_runtime(vc, cfg: SpinConfig):
    global _runtime, _config_id
    if _runtime is not None and _config_id == id(vc):
        return
    text = vc.model_config.hf_text_config
    layers = int(text.num_hidden_layers) + int(getattr(text, "num_nextn_predict_layers", 0) or 0)
    spec = vc.speculative_config
    next_n = 1 + (int(spec.num_speculative_tokens) if spec is not None else 0)
    _runtime = SpinRuntime(cfg, num_layers=layers, max_entries=int(vc.model_config.max_model_len),
                           max_requests=int(vc.scheduler_config.max_num_seqs),
                           max_next_n=next_n, model=str(vc.model_config.model))
    _config_id = id(vc)


def runtime() -> SpinRuntime:
    if _runtime is None:
        raise RuntimeError("spin: no runtime (spin is off, or no indexer op was built)")
    return _runtime


def runtime_or_none() -> SpinRuntime | None:
    return _runtime


def reset():
    """Forgets the runtime (writing any traces still recording)."""
    global _runtime, _config_id
    if _runtime is not None:
        _runtime.close()
    _runtime, _config_id = None, None


atexit.register(reset)
