"""The request lifecycle both runtimes share: the host path's (runtime.SpinRuntime) and the device
path's (device_path.DeviceRuntime) differ in where spin's state lives and how blocks are scored,
not in which requests hold state, when, or where a step's prompts end.

- Requests are known from their add (or their first batch, under MRV2) to their drop.
- A request holds a slot (spin's state) once it needs one — the runtime says when (the device
  path: once its context reaches half min_context; the host path: always) — and while one is
  free; slots are taken lowest-free in the batch's row order and freed in the order drops arrive
  (sorted by the runner hook), so tensor-parallel ranks assign the same slots without talking.
  A row that needs a slot and finds none is counted and scored dense (under FULL CUDA graphs
  the device path gives it the shared pad slot instead); nothing raises.
- The warm start: each prompt whose last token is in the step (the runner hook's prompt ends),
  and whose request holds a slot, is observed from that token's indexer row (observe_prompts).

No torch and no vLLM here: the package suite tests it without either.
"""

from __future__ import annotations

import dataclasses
import hashlib
import heapq

import numpy as np


def request_key(request_id: str) -> int:
    """The exploration key of a vLLM request id: 63 bits of its BLAKE2b digest (stable across
    processes and ranks, unlike Python's salted hash())."""
    digest = hashlib.blake2b(request_id.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") & ((1 << 63) - 1)


class SlotTable:
    """Request ids → spin slots (lowest free first, so every tensor-parallel rank that sees the
    same adds and drops in the same order assigns the same slots)."""

    def __init__(self, capacity: int):
        self.capacity = int(capacity)
        self._slot: dict[str, int] = {}
        self._free = list(range(self.capacity))

    def __contains__(self, request_id) -> bool:
        return request_id in self._slot

    def __getitem__(self, request_id) -> int:
        return self._slot[request_id]

    def __len__(self) -> int:
        return len(self._slot)

    def ids(self):
        return list(self._slot)

    def take(self, request_id: str) -> int:
        """The lowest free slot, now the request's (the caller checked one is free)."""
        slot = heapq.heappop(self._free)
        self._slot[request_id] = slot
        return slot

    def release(self, request_id: str) -> int | None:
        """The freed slot, or None for an id that held none (ignored)."""
        slot = self._slot.pop(request_id, None)
        if slot is not None:
            heapq.heappush(self._free, slot)
        return slot


@dataclasses.dataclass
class Step:
    """One step's batch as both runtimes read it."""
    ids: list[str]                       # request ids in the runner's row order
    slots: list[int | None]              # each row's slot (None: the row holds no state)
    scheduled: np.ndarray                # int64 [rows]: the tokens each row schedules
    taken: list[tuple[int, int]]         # (slot, exploration key) taken by this step: new state
    no_slot: list[int]                   # rows that need state and found no free slot
    prompt_rows: list[tuple[int, int]]   # (row, token row) of the prompts to warm-start from


class Requests:
    """Known requests, their slots, and each step's batch (see the module docstring)."""

    def __init__(self, warm_start: bool):
        self.warm_start = bool(warm_start)
        self.slots: SlotTable | None = None  # bind(capacity) makes it
        self._known: set[str] = set()
        self._keys: dict[str, int] = {}  # exploration keys given at add (tests: replay's 0)

    def bind(self, capacity: int):
        self.slots = SlotTable(capacity)

    def __contains__(self, request_id) -> bool:
        return request_id in self._known

    def known(self) -> list[str]:
        return sorted(self._known)

    def add(self, request_id: str, key: int | None = None):
        """A new or resumed request (the caller dropped what it held before)."""
        self._known.add(request_id)
        if key is not None:
            self._keys[request_id] = int(key)

    def drop(self, request_id: str) -> int | None:
        """Forgets a request; the slot it freed, or None (it held none, or was unknown)."""
        self._known.discard(request_id)
        self._keys.pop(request_id, None)
        return self.slots.release(request_id) if self.slots is not None else None

    def unknown(self, request_ids) -> list[str]:
        """The batch's ids not added yet (MRV2's hook announces requests only by their batches):
        the runtime adds them before begin()."""
        return [r for r in request_ids if r is not None and r not in self._known]

    def begin(self, request_ids, scheduled, prompt_ends, needs_slot) -> Step:
        """The step's batch in row order (None entries skipped; every id known); scheduled[i]:
        the tokens row i schedules (None: one each); prompt_ends: the rows whose prompt's last
        token is in this step; needs_slot(i, request_id): whether row i needs state."""
        ids = [r for r in request_ids if r is not None]
        if any(r not in self._known for r in ids):
            raise RuntimeError(f"spin: begin_step with requests never added: {self.unknown(ids)}")
        n = len(ids)
        taken = []
        needs = [bool(needs_slot(i, r)) for i, r in enumerate(ids)]
        for r, need in zip(ids, needs):
            if need and r not in self.slots and len(self.slots) < self.slots.capacity:
                taken.append((self.slots.take(r), self._keys.get(r, request_key(r))))
        slots = [self.slots[r] if r in self.slots else None for r in ids]
        counts = np.ones(n, np.int64) if scheduled is None else np.asarray(scheduled[:n], np.int64)
        ends = np.cumsum(counts) - 1  # each row's last token among the step's token rows
        warm = prompt_ends if self.warm_start else ()
        prompt_rows = [(int(i), int(ends[i])) for i in (warm or ())
                       if 0 <= i < n and slots[i] is not None]
        no_slot = [i for i, need in enumerate(needs) if need and slots[i] is None]
        return Step(ids, slots, counts, taken, no_slot, prompt_rows)
