"""A CUDA graph's rules on CPU tensors: capture a step once, replay it with new inputs.

No tests here: test_device_path.py drives it. A CUDA graph records the kernels a step launches,
with their arguments — pointers and Python numbers — frozen at capture; each replay runs the same
kernels on whatever the same memory holds then. Code that a graph breaks therefore shows on a
CPU when the step is *replayed from a recording* instead of run again:

- a value read back on the host, or a tensor made from host data, during capture
  (tests/host_sync.py's rules, enforced while recording);
- a decision taken in Python from this step's values (a size, a branch, a slice bound): the
  replay repeats the capture's, and its output differs from an eager run of the same step;
- an input reaching the step other than through memory that outlives it (a tensor built per
  step): the replay reads the capture's copy, and its output differs.

``Graph`` records every ATen op that runs inside ``capture()`` (the dispatcher's view of what
would launch), and records the functions given to ``kernel()`` — Triton launches, the DeepGEMM
stand-in, vLLM's top-k — as single nodes, as a GPU launches them (their insides are kernel code,
not graph structure). ``replay()`` runs the nodes again in order on the recorded tensors: each
node's result is copied into the tensor it produced at capture, which later nodes hold, as a
graph's private memory pool keeps its allocations.
"""
from __future__ import annotations

import contextlib
import functools

import torch
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from host_sync import no_host_sync

# Allocations: their replay result is garbage or a constant the recorded tensor already holds
# (zeros / full are replayed: a graph re-runs their memsets).
_NO_REPLAY = {"empty.memory_format", "empty_strided.default", "empty_like.default",
              "new_empty.default", "new_empty_strided.default"}
# Ops a graph cannot capture: a value read on the host, or an output whose shape is a device
# value (also caught when they come from C++, where host_sync's Python-level guards do not reach).
_HOST_READS = {"_local_scalar_dense.default", "equal.default", "is_nonzero.default"}
_DATA_DEPENDENT = (torch.Tag.dynamic_output_shape, torch.Tag.data_dependent_output)


class Graph(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.nodes: list[tuple] = []
        self._inside = 0      # > 0 while a kernel() function runs: its ops are its own
        self.capturing = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self._inside == 0 and self.capturing and _reads_host(func, args, kwargs):
            raise AssertionError(f"graph capture: {func.__name__} reads a device value on the host")
        out = func(*args, **kwargs)
        if self._inside == 0 and not func.is_view and func.__name__ not in _NO_REPLAY:
            self.nodes.append((func, args, kwargs, out))
        return out

    def kernel(self, fn):
        """fn as one node: recorded whole while capturing, its own ops not."""
        @functools.wraps(fn)
        def node(*args, **kwargs):
            if not self.capturing or self._inside:
                return fn(*args, **kwargs)
            self._inside += 1
            try:
                out = fn(*args, **kwargs)
            finally:
                self._inside -= 1
            self.nodes.append((fn, args, kwargs, out))
            return out
        return node

    @contextlib.contextmanager
    def capture(self):
        """Records the step run inside; host reads and host-made tensors raise."""
        assert not self.nodes, "one capture per graph"
        self.capturing = True
        try:
            with no_host_sync(from_host=True), self:
                yield self
        finally:
            self.capturing = False

    def replay(self):
        """The recorded nodes again, in order, each result written where capture put it."""
        with _disable_current_modes():
            for fn, args, kwargs, out in self.nodes:
                _write(out, fn(*args, **kwargs), fn)


def _reads_host(func, args, kwargs) -> bool:
    """Whether the op needs a device value on the host: a scalar read, or an output shape that
    depends on the data (ops tagged so, except where the call fixes the shape: indexing with
    integer indices, repeat_interleave given its output size)."""
    if func.__name__ in _HOST_READS:
        return True
    if not any(t in func.tags for t in _DATA_DEPENDENT):
        return False
    if func.__name__ == "index.Tensor":
        return any(i is not None and i.dtype == torch.bool for i in args[1])
    if func.__name__.startswith("repeat_interleave"):
        return kwargs.get("output_size") is None
    return True


def _write(recorded, result, fn):
    if isinstance(recorded, torch.Tensor):
        if result is recorded:
            return
        if not isinstance(result, torch.Tensor) or result.shape != recorded.shape:
            raise AssertionError(f"graph replay: {getattr(fn, '__name__', fn)} made "
                                 f"{getattr(result, 'shape', result)} where capture made "
                                 f"{tuple(recorded.shape)}: a shape read from the host")
        recorded.copy_(result)
    elif isinstance(recorded, (tuple, list)):
        for r, x in zip(recorded, result):
            _write(r, x, fn)
