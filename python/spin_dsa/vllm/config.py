"""The plugin's settings: the ``"spin"`` object of vLLM's ``--additional-config``.

    vllm serve ... --additional-config '{"spin": {"enabled": true, "predictor": "spin",
        "config": {"target_sparsity": 0.5}, "record": {"dir": "traces", "requests": 4,
        "layers": [0, 1], "max_steps": 256}}}'

Keys (anything else is an error, so a typo never silently turns spin off):
- ``enabled`` (bool, default true when the object is present): spin off means vLLM's own indexer,
  bit for bit.
- ``predictor`` (str, default "spin"): any ``spin_dsa.predictor_names()`` entry but those in
  ``_CANNOT_SERVE`` (oracle reads the true top-k; hisa and spin-hybrid read pooled keys, which the
  serving API does not keep yet).
- ``config`` (dict or "key=value ..."): PredictorConfig fields (``spin_dsa.default_config()``);
  ``page_size`` and ``topk`` are set from the model and cannot be given.
- ``max_requests`` (int): slots spin keeps state for; default vLLM's max_num_seqs on the CPU
  path. On the GPU path a request takes a slot once its context reaches half ``min_context``
  (shorter rows keep every block and need no state), and the default is as many slots as the
  bound KV cache holds such requests, at most max_num_seqs (device_path.long_context_slots;
  min(max_num_seqs, 256) where no cache can be read), allocated when vLLM's runner has
  allocated its KV cache (before its warm-up and CUDA graph capture). A step with a request
  that needs a slot and finds none scores it dense (on the GPU, vLLM's dense decode when the
  step runs eagerly), and is counted (``no_slot_steps``); it never raises. Under FULL CUDA graphs a replay cannot switch: the
  rows without a slot select from the pad slot's state, which nothing observes (exploration and
  the newest blocks); short rows there keep every block whatever it holds.
- ``warm_start`` (bool, default true): the step that ends a prompt scores the prompt's last row
  over every block (spin's own pass: vLLM's prefill kernels keep no logits) and observes it as
  the request's prefill — on the GPU and CPU paths alike, and as ``spin replay`` reads a trace's
  step 0 (record mode writes that row there). On a GPU only prompts of at least half
  ``min_context`` (a shorter request takes its slot later, cold, and warms on the full rows it
  gets until ``min_context``). False starts spin cold, from an empty state.
- ``min_context`` (int ≥ 0, default 32768): on a GPU, requests that see at most this many indexer
  entries keep every block (the indexer is cheap there and skipping pays less than spin costs).
- ``record`` (dict): score traces (include/spin/trace.h) of chosen requests and layers, see RecordConfig.
- ``verify_ranks`` (bool, default false): every step, the tensor-parallel ranks all-reduce a
  checksum of the blocks each selected and stop the engine on a mismatch (ranks must agree
  without talking; this proves it). It reads the result on the host: eager steps only, refused
  with FULL CUDA graphs.

Pure Python (no vLLM import), so it is tested in the main package suite.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import spin_dsa

_KEYS = {"enabled", "predictor", "config", "max_requests", "record", "warm_start", "min_context",
         "verify_ranks"}

# Requests that see at most this many indexer entries keep every block on the GPU path. From the
# cost model (`spin diagnose --model deepseek-v3.2 --gpu h200 --batch 64`): at 50 % of blocks a
# 16K context saves ~1.4 ms of indexer and top-k per step, about what select, observe and remap
# cost over 61 layers (~0.023 ms a layer, vllm_plugin_review §5); 32K saves ~2.8 ms. To be
# replaced by bench/gpu's measured break-even once a GPU has run it.
DEFAULT_MIN_CONTEXT = 32768
_RECORD_KEYS = {"dir", "requests", "layers", "max_steps"}
_MODEL_SET = {"page_size", "topk"}  # geometry comes from the model, never from the user


@dataclass(frozen=True)
class RecordConfig:
    """Which requests and layers record mode writes, and where.

    dir: output folder (one ``<request id>.safetensors`` score trace per recorded request).
    requests: an int N (the first N requests added) or a list of vLLM request ids.
    layers: indexer layer numbers to record (default: all).
    max_steps: decode steps per request at most; the trace is written then, or when the request
    finishes, whichever comes first.
    """

    dir: str
    requests: int | tuple[str, ...] = 1
    layers: tuple[int, ...] | None = None
    max_steps: int = 4096


@dataclass(frozen=True)
class SpinConfig:
    enabled: bool = False
    predictor: str = "spin"
    config: dict = field(default_factory=dict)
    max_requests: int | None = None
    record: RecordConfig | None = None
    warm_start: bool = True
    min_context: int = DEFAULT_MIN_CONTEXT
    verify_ranks: bool = False


# Predictors the serving API cannot run, from the library's one predictor table (the oracle
# reads the step's true top-k, the probers pooled block keys that serving does not keep).
_CANNOT_SERVE = tuple(r["name"] for r in spin_dsa.predictor_info() if not r["can_serve"])

def _fail(message: str):
    raise ValueError(f"--additional-config spin: {message}")


def _record(obj: Any) -> RecordConfig:
    if not isinstance(obj, Mapping):
        _fail(f"record must be an object, got {type(obj).__name__}")
    unknown = set(obj) - _RECORD_KEYS
    if unknown:
        _fail(f"record: unknown keys {sorted(unknown)} (known: {sorted(_RECORD_KEYS)})")
    if not isinstance(obj.get("dir"), str) or not obj["dir"]:
        _fail("record.dir must be a non-empty path")
    requests = obj.get("requests", 1)
    if isinstance(requests, bool) or not isinstance(requests, (int, list)):
        _fail("record.requests must be a count or a list of request ids")
    if isinstance(requests, int) and requests < 0:
        _fail("record.requests must be >= 0")
    if isinstance(requests, list):
        requests = tuple(str(r) for r in requests)
    layers = obj.get("layers")
    if layers is not None:
        if not isinstance(layers, list) or not all(isinstance(l, int) and l >= 0 for l in layers):
            _fail("record.layers must be a list of layer numbers >= 0")
        layers = tuple(sorted(set(layers)))
    max_steps = obj.get("max_steps", 4096)
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1:
        _fail("record.max_steps must be an int >= 1")
    return RecordConfig(obj["dir"], requests, layers, max_steps)


def parse_spin_config(additional_config: Mapping[str, Any] | None) -> SpinConfig:
    """SpinConfig from vLLM's additional_config; no "spin" key means off."""
    if not additional_config or "spin" not in additional_config:
        return SpinConfig()
    obj = additional_config["spin"]
    if not isinstance(obj, Mapping):
        _fail(f"expected an object, got {type(obj).__name__}")
    unknown = set(obj) - _KEYS
    if unknown:
        _fail(f"unknown keys {sorted(unknown)} (known: {sorted(_KEYS)})")
    enabled = obj.get("enabled", True)
    if not isinstance(enabled, bool):
        _fail("enabled must be true or false")
    predictor = obj.get("predictor", "spin")
    if predictor not in spin_dsa.predictor_names() or predictor in _CANNOT_SERVE:
        _fail(f"predictor '{predictor}' cannot serve (choose from "
              f"{[p for p in spin_dsa.predictor_names() if p not in _CANNOT_SERVE]})")
    config = obj.get("config", {})
    if isinstance(config, str):
        config = {k: v for k, v in (kv.split("=", 1) for kv in config.replace(",", " ").split())}
    if not isinstance(config, Mapping):
        _fail("config must be an object or a 'key=value ...' string")
    given = _MODEL_SET & set(config)
    if given:
        _fail(f"config: {sorted(given)} come from the model and cannot be set")
    spin_dsa.check_config(dict(config))  # raises InvalidArgument naming the field
    max_requests = obj.get("max_requests")
    if max_requests is not None and (isinstance(max_requests, bool) or not isinstance(max_requests, int)
                                     or max_requests < 1):
        _fail("max_requests must be an int >= 1")
    record = _record(obj["record"]) if "record" in obj else None
    warm_start = obj.get("warm_start", True)
    if not isinstance(warm_start, bool):
        _fail("warm_start must be true or false")
    min_context = obj.get("min_context", DEFAULT_MIN_CONTEXT)
    if isinstance(min_context, bool) or not isinstance(min_context, int) or min_context < 0:
        _fail("min_context must be an int >= 0 (indexer entries)")
    verify_ranks = obj.get("verify_ranks", False)
    if not isinstance(verify_ranks, bool):
        _fail("verify_ranks must be true or false")
    return SpinConfig(enabled, predictor, dict(config), max_requests, record, warm_start,
                      min_context, verify_ranks)
