"""SpinRuntime: the host path's runtime (vLLM on a CPU), one object per vLLM worker process.

It owns the batched ``spin_dsa.Serving`` object and maps vLLM's world onto it, under the request
lifecycle it shares with the device path (lifecycle.Requests: which requests hold a slot, when,
and which prompts end in a step):
- request ids (strings) → spin slots (0..max_requests-1, lowest free first) and the 63-bit key
  exploration is drawn with (a hash of the id, so every tensor-parallel rank agrees);
- the batch rows of the current step → slots (``begin_step``, from the model runner's batch order);
- the warm start: the last row of each prompt ending in the step, observed as its prefill;
- commits: vLLM tells the indexer nothing about acceptance, so the step a slot opened is closed
  lazily at its next step, from the seq_len delta: with L the tokens cached before a step's rows,
  L' = L + 1 + accepted (the bonus token plus the accepted drafts). That holds under async
  scheduling too, where the host-side counts run ahead.
- record mode (ScoreRecorder): the full logits of chosen requests and layers as score traces.

No torch and no vLLM here: numpy in, numpy out, so the package suite tests it without either.
"""

from __future__ import annotations

import os
import re

import numpy as np

import spin_dsa

from .config import RecordConfig, SpinConfig
from .lifecycle import Requests


class ScoreRecorder:
    """Collects the logits rows of chosen requests and layers; writes one score trace per request
    (spin_dsa.write_score_trace: validated, atomic) when it finishes or reaches max_steps."""

    def __init__(self, record: RecordConfig, model: str, num_layers: int):
        self.record = record
        self.model = model
        self.layers = record.layers if record.layers is not None else tuple(range(num_layers))
        self._taken = 0  # requests chosen so far when record.requests is a count
        self._live: dict[str, dict] = {}
        self.written: list[str] = []

    def on_add(self, request_id: str):
        r = self.record.requests
        chosen = request_id in r if isinstance(r, tuple) else self._taken < r
        if chosen:
            self._taken += 1
            self._live[request_id] = {"ctx_len": [], "accepted": [], "next_n": None,
                                      "rows": {l: [] for l in self.layers}, "done": False}

    def recording(self, request_id: str) -> bool:
        t = self._live.get(request_id)
        return t is not None and not t["done"]

    def open_step(self, request_id: str, seq_len: int, next_n: int, page_size: int, topk: int):
        t = self._live[request_id]
        if t["next_n"] is None:
            t["next_n"] = next_n
        if next_n != t["next_n"]:  # a trace has one next_n: write what was recorded, then stop
            self._write(request_id, page_size, topk)
            return
        t["ctx_len"].append(int(seq_len))
        t["accepted"].append(0)

    def open_prompt(self, request_id: str, prompt_tokens: int, next_n: int, page_size: int,
                    topk: int):
        """Opens the step of a prompt's last row, the trace's step 0 (what replay's warm start
        observes): ctx_len = prompt + next_n - 1, so its row 0 sees the prompt."""
        self.open_step(request_id, prompt_tokens + next_n - 1, next_n, page_size, topk)

    def add_prompt_row(self, request_id: str, layer: int, row: np.ndarray, prompt_tokens: int):
        """The prompt's last row (float32 [>= prompt_tokens]) as the open step's rows: row 0 its
        scores, the draft rows -inf (an engine's prompt step has none; 0 accepted)."""
        n = self._live[request_id]["next_n"]
        rows = np.full((n, prompt_tokens + n - 1), -np.inf, np.float32)
        rows[0, :prompt_tokens] = row[:prompt_tokens]
        self.add_rows(request_id, layer, rows)

    def set_accepted(self, request_id: str, accepted: int):
        t = self._live.get(request_id)
        if t is not None and not t["done"] and t["accepted"]:
            t["accepted"][-1] = int(accepted)

    def add_rows(self, request_id: str, layer: int, rows: np.ndarray):
        """rows: float32 [next_n, >= the last row's visible entries] of the open step."""
        t = self._live[request_id]
        if layer in t["rows"] and not t["done"]:
            t["rows"][layer].append(np.array(rows, np.float32))

    def end_step(self, request_id: str, page_size: int, topk: int):
        t = self._live.get(request_id)
        if t is not None and not t["done"] and len(t["ctx_len"]) >= self.record.max_steps:
            self._write(request_id, page_size, topk)

    def stop(self, request_id: str, page_size: int, topk: int):
        """Writes what the request has recorded so far and records no more of it."""
        if self.recording(request_id):
            self._write(request_id, page_size, topk)

    def on_drop(self, request_id: str, page_size: int, topk: int):
        if self.recording(request_id):
            self._write(request_id, page_size, topk)
        self._live.pop(request_id, None)

    def _finish(self, request_id: str):
        self._live[request_id]["done"] = True

    def _write(self, request_id: str, page_size: int, topk: int):
        t = self._live[request_id]
        self._finish(request_id)
        steps = min(len(t["ctx_len"]), *(len(v) for v in t["rows"].values()))
        if steps == 0:
            return
        next_n = t["next_n"]
        entries = max(r.shape[1] for v in t["rows"].values() for r in v[:steps])
        scores = []
        for l in self.layers:
            out = np.full((steps, next_n, entries), -np.inf, np.float32)
            for s, r in enumerate(t["rows"][l][:steps]):
                out[s, :, :r.shape[1]] = r
            scores.append(out)
        meta = {"model": self.model, "next_n": next_n, "page_size": page_size, "topk": topk,
                "compress_ratio": 1,
                "extra": {"source": "spin_dsa.vllm record", "request_id": request_id,
                          "layers": ",".join(map(str, self.layers))}}
        os.makedirs(self.record.dir, exist_ok=True)
        name = re.sub(r"[^A-Za-z0-9._-]", "_", request_id) + ".safetensors"
        path = os.path.join(self.record.dir, name)
        accepted = np.array(t["accepted"][:steps], np.int32) if next_n > 1 else None
        spin_dsa.write_score_trace(meta, np.array(t["ctx_len"][:steps], np.int64), scores, path,
                                   accepted)
        self.written.append(path)


class SpinRuntime:
    """Slots, lazy commits and the Serving object for one worker.

    Per step: begin_step(batch request ids, scheduled, prompt_ends) once (the runner hook), then
    for every indexer layer select(layer, seq_lens, next_n) → score the blocks → observe(layer,
    logits, topk) for the decode rows, and observe_prompts(layer, seq_lens, logits) with the full
    last row of each prompt in prompt_rows(layer): the warm start, the device path's rule and
    replay's (trace step 0 is the prompt's last row).
    seq_lens are vLLM's (entries cached per request, including the step's next_n rows).
    """

    def __init__(self, cfg: SpinConfig, *, num_layers: int, max_entries: int, max_requests: int,
                 max_next_n: int = 1, model: str = "vllm"):
        if num_layers < 1 or max_entries < 1 or max_requests < 1 or max_next_n < 1:
            raise ValueError("SpinRuntime: num_layers, max_entries, max_requests and max_next_n "
                             "must be >= 1")
        self.cfg = cfg
        self.num_layers = num_layers
        self.max_entries = max_entries
        self.max_requests = cfg.max_requests or max_requests
        self.max_next_n = max_next_n
        self.model = model
        self.serving: spin_dsa.Serving | None = None  # made at the first decode (geometry known)
        self.page_size = self.topk = 0
        self.requests = Requests(cfg.warm_start)
        self.requests.bind(self.max_requests)  # host memory: every request holds state
        self._key: dict[int, int] = {}  # slot → exploration key
        self._open = np.zeros(self.max_requests, bool)        # slot has an uncommitted step
        self._base = np.zeros(self.max_requests, np.int64)    # its L (cached before its rows)
        self._open_next_n = np.ones(self.max_requests, np.int64)
        self._batch: list[str] = []
        self.batch_slots = np.zeros(0, np.int32)  # each row's slot, -1 where it holds none
        self._prompt_rows: list[tuple[int, int]] = []  # (batch row, token row) of ending prompts
        self._prompt_layers: set[int] = set()  # layers whose prompt rows this step observed
        self._step = 0             # begin_step count
        self._committed_step = -1  # the step whose lazy commits have run
        self._last = None          # (layer, rows with a slot, seq_lens, next_n) of the last select
        self._recorded_rows = []
        self.recorder = ScoreRecorder(cfg.record, model, num_layers) if cfg.record else None
        self.no_slot_steps = 0
        self._counters = {"rows": 0, "blocks_scored": 0, "blocks_visible": 0}

    # -- lifecycle -------------------------------------------------------------------------------
    @property
    def slots(self):
        """Request id → slot, for the requests that hold state (lifecycle.SlotTable)."""
        return self.requests.slots

    def add(self, request_id: str, key: int | None = None):
        """A new or resumed request: it starts over, and takes a slot at its first step. key: the
        exploration key (default lifecycle.request_key(request_id); tests pass replay's 0)."""
        self.drop(request_id)  # resumed after a preemption we did not see
        self.requests.add(request_id, key)
        if self.recorder is not None:
            self.recorder.on_add(request_id)

    def drop(self, request_id: str):
        """A finished or preempted request; unknown ids are ignored (never scheduled here)."""
        if request_id not in self.requests:
            return
        slot = self.requests.drop(request_id)
        if slot is not None:
            if self.serving is not None and self.serving.active(slot):
                self.serving.drop(slot)
            self._key.pop(slot, None)
            self._open[slot] = False
        if self.recorder is not None:
            self.recorder.on_drop(request_id, self.page_size, self.topk)

    def slot(self, request_id: str) -> int:
        return self.slots[request_id]

    def begin_step(self, request_ids, scheduled=None, prompt_ends=None, context=None):
        """The batch's request ids in the runner's row order; scheduled[i]: the tokens row i
        schedules this step; prompt_ends: the rows whose prompt's last token is in this step
        (warm-started from that token's row: observe_prompts). Every request needs state here
        (host memory), so context is not read; a row that finds no free slot (more requests
        than max_requests) scores every block and is not observed, counted in no_slot_steps."""
        for r in self.requests.unknown(request_ids):
            self.add(r)  # MRV2's hook announces requests only by their batches
        step = self.requests.begin(request_ids, scheduled, prompt_ends, lambda i, r: True)
        for slot, key in step.taken:
            self._key[slot] = key
            self._open[slot] = False
            if self.serving is not None:
                self.serving.add(slot, key)
        self._batch = step.ids
        self.batch_slots = np.array([-1 if s is None else s for s in step.slots], np.int32)
        self._prompt_rows = step.prompt_rows
        self._prompt_layers = set()
        self.no_slot_steps += bool(step.no_slot)
        self._step += 1

    def prompt_rows(self, layer: int) -> list[tuple[int, int]]:
        """(batch row, token row) of each prompt ending in this step that spin warm-starts from
        and `layer` has not observed yet (a forward the runner does not announce, a dummy run,
        gets none): the caller scores each token row over every entry and hands them to
        observe_prompts."""
        return [] if layer in self._prompt_layers else self._prompt_rows

    # -- the decode step -------------------------------------------------------------------------
    def ensure_serving(self, page_size: int, topk: int):
        if self.serving is not None:
            if (page_size, topk) != (self.page_size, self.topk):
                raise RuntimeError(f"spin: indexer layers disagree on geometry (page_size "
                                   f"{page_size} vs {self.page_size}, topk {topk} vs {self.topk})")
            return
        config = dict(self.cfg.config, page_size=page_size, topk=topk)
        self.serving = spin_dsa.Serving(self.max_requests, self.num_layers, self.max_entries,
                                        predictor=self.cfg.predictor, config=config,
                                        max_next_n=self.max_next_n)
        self.page_size, self.topk = page_size, topk
        for slot in sorted(self._key):
            self.serving.add(slot, self._key[slot])

    def _commit_open(self, rows: np.ndarray, seq_lens: np.ndarray, next_n: int):
        """Closes the previous step of every batch row (`rows`: those holding a slot) that has
        one (accepted drafts from the seq_len delta), and opens this step's bookkeeping."""
        slots, base = self.batch_slots[rows], seq_lens[rows] - next_n
        was_open = self._open[slots]
        if was_open.any():
            s = slots[was_open]
            acc = base[was_open] - self._base[s] - 1
            acc = np.clip(acc, 0, self._open_next_n[s] - 1).astype(np.int32)
            self.serving.commit(s, acc)
            self._open[s] = False
            if self.recorder is not None:
                for i, a in zip(rows[was_open], acc):
                    rid = self._batch[i]
                    self.recorder.set_accepted(rid, int(a))
                    self.recorder.end_step(rid, self.page_size, self.topk)
        self._open[slots] = True
        self._base[slots] = base
        self._open_next_n[slots] = next_n
        if self.recorder is not None:
            for i in rows:
                if self.recorder.recording(self._batch[i]):
                    self.recorder.open_step(self._batch[i], int(seq_lens[i]), next_n,
                                            self.page_size, self.topk)

    def select(self, layer: int, seq_lens, next_n: int) -> tuple[np.ndarray, np.ndarray]:
        """Blocks to score for the batch's first len(seq_lens) requests (its decode rows): (block
        ids int32 sorted per request, offsets int32 [batch + 1]) — the kernels' mask form, one set
        per request (the union of its rows). Every block is scored for a request being recorded,
        so its trace is the true indexer output (spin observes only its own blocks' top-k of
        it), and for one without a slot (more requests than max_requests: dense, unobserved)."""
        seq_lens = np.ascontiguousarray(seq_lens, np.int64).reshape(-1)
        batch = seq_lens.shape[0]
        if batch > self.batch_slots.shape[0]:
            raise RuntimeError(f"spin: {batch} decode requests but the runner reported "
                               f"{self.batch_slots.shape[0]} (no begin_step for this batch: the "
                               f"runner hook did not see it)")
        self._check_layer(layer)
        rows = np.flatnonzero(self.batch_slots[:batch] >= 0)  # the rows spin selects for
        if self._committed_step != self._step:
            self._commit_open(rows, seq_lens, next_n)
            self._committed_step = self._step
        own = {}
        if rows.size:
            blocks = self.serving.select(self.batch_slots[rows], layer, seq_lens[rows], next_n)
            counts = self.serving.counts(rows.size * next_n)
            own = {int(i): blocks[d * next_n, :counts[d * next_n]] for d, i in enumerate(rows)}
        E = self.serving.block_entries
        newest = spin_dsa.visible_entries(seq_lens, next_n)[next_n - 1::next_n]  # each last row's
        ids, offsets = [], [0]
        self._recorded_rows = []  # (request index, spin's own blocks) of recorded requests
        for i in range(batch):
            visible = -(-int(newest[i]) // E)
            every = np.arange(visible, dtype=np.int32)
            b = own[i].copy() if i in own else every
            if self.recorder is not None and self.recorder.recording(self._batch[i]) and i in own:
                self._recorded_rows.append((i, b))
                b = every
            ids.append(b)
            offsets.append(offsets[-1] + b.shape[0])
            self._counters["blocks_scored"] += b.shape[0]
            self._counters["blocks_visible"] += visible
        self._counters["rows"] += batch * next_n
        self._last = (layer, rows, seq_lens, next_n)
        block_ids = np.concatenate(ids).astype(np.int32) if ids else np.zeros(0, np.int32)
        return block_ids, np.array(offsets, np.int32)

    def observe(self, layer: int, logits: np.ndarray, topk: np.ndarray | None):
        """The rows' logits (float32 [rows, cols], -inf where not scored) and top-k (int32
        [rows, >= topk] or None) of the last select, which must be of `layer`."""
        if self._last is None or self._last[0] != layer:
            raise RuntimeError(f"spin: observe(layer {layer}) without its select")
        _, rows, seq_lens, next_n = self._last
        self._last = None
        if self.recorder is not None:
            for i in rows:
                if self.recorder.recording(self._batch[i]):
                    self.recorder.add_rows(self._batch[i], layer,
                                           logits[i * next_n:(i + 1) * next_n, :int(seq_lens[i])])
        if topk is not None and self._recorded_rows:
            topk = self._own_topk(logits, topk, seq_lens, next_n)
        if rows.size == 0:
            return
        if rows.size < seq_lens.shape[0]:  # rows without a slot are not observed
            token_rows = (rows[:, None] * next_n + np.arange(next_n)).reshape(-1)
            logits = np.ascontiguousarray(logits[token_rows])
            topk = None if topk is None else np.ascontiguousarray(topk[token_rows])
        self.serving.observe(self.batch_slots[rows], layer, logits, topk)

    def observe_prompts(self, layer: int, seq_lens, logits: np.ndarray):
        """The warm start: the last row of each prompt in prompt_rows() (float32 [prompts,
        >= seq_lens[i]], every entry scored), seq_lens[i] its tokens, is observed as the
        request's prefill (Serving.prefill), committed with 0 accepted at its next step. A
        recorded request's trace starts with it: step 0, its other next_n - 1 rows -inf, as
        replay's warm start reads step 0."""
        self._check_layer(layer)
        seq_lens = np.ascontiguousarray(seq_lens, np.int64).reshape(-1)
        rows = [i for i, _ in self.prompt_rows(layer)]
        if seq_lens.shape[0] != len(rows) or logits.shape[0] != len(rows):
            raise ValueError(f"spin: observe_prompts: {len(rows)} prompts end in this step, got "
                             f"{seq_lens.shape[0]} seq_lens and {logits.shape[0]} rows")
        if not rows:
            return
        slots = self.batch_slots[rows]
        if not self._prompt_layers:  # the step's first layer opens the prompts' steps
            self._open_prompts(slots, seq_lens)
        self._prompt_layers.add(layer)
        self.serving.prefill(slots, layer, seq_lens, np.ascontiguousarray(logits, np.float32))
        if self.recorder is not None:
            for (i, _), L, row in zip(self._prompt_rows, seq_lens, logits):
                if self.recorder.recording(self._batch[i]):
                    self.recorder.add_prompt_row(self._batch[i], layer, row, int(L))

    def _open_prompts(self, slots: np.ndarray, seq_lens: np.ndarray):
        """Opens the prompts' prefill steps: one row each, L = the prompt's tokens before its
        last, so the next step's seq_len delta commits 0 accepted."""
        stale = slots[self._open[slots]]  # a step left open (a request re-prefilled): closed as is
        if stale.size:
            self.serving.commit(stale, np.zeros(stale.size, np.int32))
        self._open[slots] = True
        self._base[slots] = seq_lens - 1
        self._open_next_n[slots] = 1
        if self.recorder is not None:
            for (i, _), L in zip(self._prompt_rows, seq_lens):
                rid = self._batch[i]
                if self.recorder.recording(rid):
                    self.recorder.open_prompt(rid, int(L), self.max_next_n, self.page_size,
                                              self.topk)

    def _check_layer(self, layer: int):
        if not 0 <= layer < self.num_layers:
            raise ValueError(f"spin: layer {layer} outside [0, {self.num_layers})")

    def _own_topk(self, logits, topk, seq_lens, next_n):
        """A recorded request scored every block (for its trace); spin observes the top-k it
        would have got from its own blocks, so recording never changes what spin learns."""
        topk = np.array(topk, np.int32)
        k, E = self.topk, self.serving.block_entries
        for i, own in self._recorded_rows:
            rows = slice(i * next_n, (i + 1) * next_n)
            vis = spin_dsa.visible_entries(seq_lens[i:i + 1], next_n)
            topk[rows, :k] = spin_dsa.topk(np.ascontiguousarray(logits[rows]), k,
                                           visible_entries=vis, block_ids=own,
                                           block_offsets=np.array([0, own.size], np.int32),
                                           rows_per_mask=next_n, block_entries=E)
            topk[rows, k:] = -1
        return topk

    def stats(self) -> dict:
        """Counters since start, the device path's keys where they apply."""
        c = self._counters
        return {"steps": self._step, "no_slot_steps": self.no_slot_steps,
                "max_requests": self.slots.capacity, "requests_with_state": len(self.slots),
                "state_bytes": self.serving.memory_bytes if self.serving is not None else 0,
                "decode_rows": c["rows"], "blocks_scored": c["blocks_scored"],
                "blocks_visible": c["blocks_visible"],
                "scored_fraction": c["blocks_scored"] / c["blocks_visible"]
                if c["blocks_visible"] else 1.0}

    def close(self):
        """Writes the traces of requests still recording (process exit)."""
        for request_id in self.requests.known():
            self.drop(request_id)
