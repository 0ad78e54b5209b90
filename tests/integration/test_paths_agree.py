"""The CPU path and the GPU path are one lifecycle with two scorers: the same two requests — both
prompts ending in one step (the warm start), then decode steps with the batch rows reordered —
get the same top-k, row for row, through vLLM's CPU op (spin's CPU runtime and kernel) and through
vLLM's CUDA-path function on CPU tensors (spin's device runtime; kernels stood in, cuda_path.py).

Each path is held to the library elsewhere (test_indexer_op: replay bit for bit; test_device_path:
the serving object); this holds them to each other, request lifecycle and warm start included.
"""
import numpy as np
import pytest
import torch
from vllm.config import set_current_vllm_config
from vllm.forward_context import set_forward_context

import spin_dsa.vllm
from spin_dsa.vllm import state
from cuda_path import cuda_path_on_cpu
from test_indexer_op import (LAYERS, MAX_LEN, PROMPT_TAIL, SPIN, STEPS, TOPK, _build, _metadata,
                             _paged, _prefix, _prompt_inputs, _prompt_metadata, _step_inputs,
                             _traces, _vllm_config, model_dir, requires_cpu_kernels)  # noqa: F401


def _requests(order=(0, 1)):
    return [f"req-{i}" for i in order]


def _cpu_run(vc, traces, paged):
    """Every decode step's top-k rows through vLLM's CPU op with spin on."""
    buf = torch.full((2 * PROMPT_TAIL, TOPK), -7, dtype=torch.int32)
    ops = _build(vc, [c for c, _ in paged], buf)
    rt = state.runtime()
    rt.begin_step(_requests(), [PROMPT_TAIL] * 2, prompt_ends=[0, 1])
    for l in range(LAYERS):
        md = _prompt_metadata([int(t.ctx_len[0]) for t in traces], PROMPT_TAIL, paged[l][1].copy())
        q, w = _prompt_inputs(traces, (0, 1), l, PROMPT_TAIL)
        with set_current_vllm_config(vc), set_forward_context({_prefix(l): md}, vc):
            ops[l](torch.zeros(q.shape[0], 8), q, None, w)
    out = []
    for s in range(1, STEPS):
        order = (0, 1) if s % 2 == 0 else (1, 0)
        rt.begin_step(_requests(order))
        for l in range(LAYERS):
            md = _metadata([int(traces[i].ctx_len[s]) for i in order],
                           paged[l][1][list(order)].copy())
            q, w = _step_inputs(traces, order, s, l)
            with set_current_vllm_config(vc), set_forward_context({_prefix(l): md}, vc):
                ops[l](torch.zeros(len(order), 8), q, None, w)
            out.append({i: set(buf[b, :TOPK].tolist()) - {-1} for b, i in enumerate(order)})
    return out, rt.stats()


def _device_call(vc, fn, paged, l, md, q, w, buf):
    with set_current_vllm_config(vc), set_forward_context({_prefix(l): md}, vc):
        fn(torch.zeros(q.shape[0], 8), _prefix(l), paged[l][0], q, None, None, w, 128, "ue8m0",
           TOPK, 128, MAX_LEN, MAX_LEN, buf, True, False, False, "", topk_backend="torch")


def _device_run(vc, traces, paged):
    """The same through vLLM's CUDA-path function with spin's device path on CPU tensors."""
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    buf = torch.full((2 * PROMPT_TAIL, TOPK), -7, dtype=torch.int32)
    _build(vc, [c for c, _ in paged], buf)
    rt = state.runtime()
    fn = spin_dsa.vllm.wrap_indexer_function(sai.sparse_attn_indexer)
    out = []
    with cuda_path_on_cpu():
        rt.begin_step(_requests(), [PROMPT_TAIL] * 2, prompt_ends=[0, 1])
        for l in range(LAYERS):
            md = _prompt_metadata([int(t.ctx_len[0]) for t in traces], PROMPT_TAIL,
                                  paged[l][1].copy())
            q, w = _prompt_inputs(traces, (0, 1), l, PROMPT_TAIL)
            _device_call(vc, fn, paged, l, md, q, w, buf)
        for s in range(1, STEPS):
            order = (0, 1) if s % 2 == 0 else (1, 0)
            rt.begin_step(_requests(order), [1, 1], [])
            for l in range(LAYERS):
                md = _metadata([int(traces[i].ctx_len[s]) for i in order],
                               paged[l][1][list(order)].copy())
                q, w = _step_inputs(traces, order, s, l)
                _device_call(vc, fn, paged, l, md, q, w, buf)
                out.append({i: set(buf[b, :TOPK].tolist()) - {-1} for b, i in enumerate(order)})
    return out, rt.stats()


@requires_cpu_kernels
def test_the_cpu_and_gpu_paths_select_alike(model_dir, monkeypatch, figures):
    traces = _traces(1)
    paged = _paged(traces)
    spin = dict(SPIN, min_context=0)  # the GPU path's short-request rule off: every row selects
    vc = _vllm_config(model_dir, {"spin": spin})
    cpu, cpu_stats = _cpu_run(vc, traces, paged)
    state.reset()
    monkeypatch.setattr(state, "DEVICE_PATH_ON", "cpu")
    try:
        gpu, gpu_stats = _device_run(vc, traces, paged)
    finally:
        state.reset()
    rows = sum(len(x) for x in cpu)
    same = sum(cpu[k][i] == gpu[k][i] for k in range(len(cpu)) for i in cpu[k])
    assert len(gpu) == len(cpu) and same == rows
    for key in ("blocks_scored", "blocks_visible", "decode_rows", "no_slot_steps"):
        assert cpu_stats[key] == gpu_stats[key], key
    figures.append(f"CPU path = GPU path (vLLM's CPU op vs vLLM's CUDA-path function, both "
                   f"warm-started at the step that ends both prompts): top-{TOPK} sets equal in "
                   f"{same}/{rows} decode rows (2 requests x {LAYERS} layers x {STEPS - 1} "
                   f"steps, rows reordered); blocks scored {cpu_stats['blocks_scored']} = "
                   f"{gpu_stats['blocks_scored']}")
