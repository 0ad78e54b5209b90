"""Counts spin's own launches per decode layer through vLLM's sparse_attn_indexer, on CPU tensors,
as a GPU would launch them: spin on minus spin off, per layer of a 3-layer step (first, middle,
last), at next_n 1 and 2. Run by test_device_path.py in a child interpreter (Triton must be its
interpreter before anything imports it); prints one JSON object.

What counts as a launch: an ATen op that runs a kernel (views, allocations and metadata ops do
not), one per Triton kernel launch (the interpreter's own tensor work inside it is not counted),
one per call of the DeepGEMM logits stand-in. spin's kernels take their GPU path: the device
Serving with impl="triton", compact and remap by their Triton kernels. On a GPU each spin layer
also launches DeepGEMM's metadata kernel for its compacted lengths (vLLM's schedule helper: here,
on CPU, the plugin passes vLLM's through); `cuda_equivalent` adds it.
"""
import collections
import functools
import json
import os
import pathlib
import sys
import tempfile

os.environ["TRITON_INTERPRET"] = "1"
HERE = pathlib.Path(__file__).resolve().parent
sys.path[:0] = [str(HERE), str(HERE.parent)]

import triton.runtime.interpreter as interpreter  # noqa: E402
from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

import test_device_path as harness  # noqa: E402
from cases import write_tiny_v32_config  # noqa: E402

LAYERS = 3
NO_KERNEL = {"empty.memory_format", "empty_strided.default", "_unsafe_view.default", "detach.default",
             "alias.default", "lift_fresh.default", "set_.source_Storage_storage_offset"}


class Launches(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.n, self.quiet, self.ops = 0, 0, collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if self.quiet == 0 and not func.is_view and func.__name__ not in NO_KERNEL:
            self.n += 1
            self.ops[func.__name__] += 1
        return out

    def one_launch(self, fn, name):
        """fn counted as a single launch, whatever torch work it does inside."""
        @functools.wraps(fn)
        def wrapper(*args, **kwargs):
            self.quiet += 1
            try:
                return fn(*args, **kwargs)
            finally:
                self.quiet -= 1
                if self.quiet == 0:
                    self.n += 1
                    self.ops[name] += 1
        return wrapper


def gpu_paths():
    """spin's kernels take their GPU path on CPU tensors (under the interpreter)."""
    import spin_dsa.device._paging as paging
    import spin_dsa.vllm.device_path as device_path
    paging._use_triton = lambda use, t: True if use is None else use
    device_path.sd.Serving = functools.partial(device_path.sd.Serving, impl="triton")


def per_layer(world, fn, counter, steps=3):
    """Launches of each layer in the last step (the earlier steps warm up)."""
    counts = []
    for s in range(steps):
        order = (0, 1) if s % 2 == 0 else (1, 0)
        rt = harness.state.runtime()
        if rt is not None:
            rt.begin_step([("a", "b")[i] for i in order], [world.next_n] * 2, [])
        counts, ops = [], []
        for l in range(LAYERS):
            before, ops_before = counter.n, collections.Counter(counter.ops)
            world.call(fn, order, s, l)
            counts.append(counter.n - before)
            ops.append(counter.ops - ops_before)
    return counts, ops


def measure(model_dir, next_n):
    import vllm.model_executor.layers.sparse_attn_indexer as sai

    import spin_dsa.vllm
    harness.state.DEVICE_PATH_ON = "cpu"
    counter = Launches()
    world = harness.World(model_dir, next_n)
    world.build(layers=LAYERS)
    world.logits_stand_in = counter.one_launch(world.logits_stand_in, "deepgemm_logits")
    sai.fp8_fp4_paged_mqa_logits = world.logits_stand_in
    original = interpreter.InterpretedFunction.run
    interpreter.InterpretedFunction.run = counter.one_launch(original, "triton")
    try:
        with counter:
            off, ops_off = per_layer(world, sai.sparse_attn_indexer, counter)
            on, ops_on = per_layer(world, spin_dsa.vllm.wrap_indexer_function(sai.sparse_attn_indexer),
                                   counter)
    finally:
        interpreter.InterpretedFunction.run = original
    spin = [a - b for a, b in zip(on, off)]
    names = ("first", "middle", "last")
    return {"next_n": next_n, "spin_off": dict(zip(names, off)), "spin_on": dict(zip(names, on)),
            "spin": dict(zip(names, spin)), "cuda_equivalent": dict(zip(names, [n + 1 for n in spin])),
            "spin_ops": {n: dict(a - b) for n, a, b in zip(names, ops_on, ops_off)}}


def main():
    gpu_paths()
    harness.LAYERS = LAYERS
    out = {}
    with tempfile.TemporaryDirectory() as d:
        model_dir = write_tiny_v32_config(pathlib.Path(d), layers=LAYERS, topk=harness.TOPK,
                                          max_len=harness.MAX_LEN, draft_layers=1)
        for next_n in (1, 2):
            out[f"next_n{next_n}"] = measure(model_dir, next_n)
            harness.state.reset()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
