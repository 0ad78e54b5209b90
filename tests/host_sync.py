"""A guard for the tests that a decode step never reads a device value on the host (a CUDA graph
cannot capture a step that does, and a GPU waits at every such read): while inside, every torch
entry point that would synchronise raises. Shared by tests/device and tests/integration, whose
conftest.py puts this folder on sys.path."""
import contextlib

import torch

# Tensor methods that hand a device value to the host.
_READS = ("item", "cpu", "tolist", "numpy", "nonzero", "__bool__", "__int__", "__float__",
          "__index__", "masked_select")


@contextlib.contextmanager
def no_host_sync(*, from_host=False):
    """Inside, reading a device value on the host raises AssertionError("host synchronisation:
    ..."): the Tensor methods in _READS, torch.nonzero / torch.masked_select, indexing with a
    boolean mask (its result's shape is a device value), and a Python number written through
    tensor indices (a host-to-device copy). from_host=True also refuses tensors made
    from host data (torch.tensor, torch.from_numpy): a captured graph replays none."""
    def refuse(name):
        def raiser(*args, **kwargs):
            raise AssertionError(f"host synchronisation: {name}")
        return raiser

    saved = {(torch.Tensor, n): getattr(torch.Tensor, n) for n in _READS}
    for n in ("nonzero", "masked_select") + (("tensor", "from_numpy") if from_host else ()):
        saved[(torch, n)] = getattr(torch, n)
    getitem, setitem = torch.Tensor.__getitem__, torch.Tensor.__setitem__

    def guarded_getitem(self, idx):
        for i in idx if isinstance(idx, tuple) else (idx,):
            if isinstance(i, torch.Tensor) and i.dtype == torch.bool:
                raise AssertionError("host synchronisation: boolean-mask indexing")
        return getitem(self, idx)

    def guarded_setitem(self, idx, value):
        # x[tensor_index] = 1.0 is index_put_ with a host scalar: a host-to-device copy, which a
        # CUDA graph refuses to capture (found on an H200); x[:, 0] = 1.0 is a fill, and fine.
        advanced = any(isinstance(i, torch.Tensor) for i in (idx if isinstance(idx, tuple) else (idx,)))
        if advanced and not isinstance(value, torch.Tensor):
            raise AssertionError("host synchronisation: a host value written through tensor indices")
        return setitem(self, idx, value)

    try:
        for (owner, name) in saved:
            setattr(owner, name, refuse(f"{owner.__name__}.{name}"))
        torch.Tensor.__getitem__, torch.Tensor.__setitem__ = guarded_getitem, guarded_setitem
        yield
    finally:
        for (owner, name), f in saved.items():
            setattr(owner, name, f)
        torch.Tensor.__getitem__, torch.Tensor.__setitem__ = getitem, setitem
