"""spin_dsa.device — spin on a torch device (CUDA, or CPU for tests): DESIGN.md §7 "On a GPU".

- :class:`Serving`: the serving contract of :class:`spin_dsa.Serving` with the state on the
  device, every call batched, no host synchronisation and static shapes, so an engine's CUDA graph
  can capture a whole decode step. It selects exactly the blocks the C++ library selects.

Needs torch (imported here, not by ``spin_dsa``).
"""

from ._serving import PREDICTORS, Serving

__all__ = ["Serving", "PREDICTORS"]
