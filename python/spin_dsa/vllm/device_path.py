"""spin inside vLLM's CUDA decode: the device path (spin_dsa.device) fed to vLLM's own kernels.

For every indexer layer with decode rows, around vLLM's own ``sparse_attn_indexer``:

1. commit (first spin layer of a step): every batch request's open step is closed on the device,
   its accepted drafts read inside the commit kernels from vLLM's lengths (``Serving.commit``'s
   ``seq_lens``/``query_lens``: tokens cached before this step's rows, minus those before the
   open step's rows, minus the bonus token);
2. at the step's first spin layer, ``Serving.select_layers`` chooses every layer's blocks for
   each decode request in one call (the step's plan; later layers slice it); per layer,
   ``compact`` turns vLLM's block table into the chosen pages and the per-row compacted lengths;
3. vLLM's function runs with the decode metadata swapped for the compacted one (block table,
   lengths, a DeepGEMM schedule computed for them in spin's buffer, ``max_model_len`` = the
   compact width): vLLM's own paged-logits kernel scores the chosen pages only, and vLLM's top-k
   backend runs over the compact width. Prefill rows and their metadata are never touched.
4. the top-k tap (over ``get_indexer_topk``) has vLLM's top-k write the compact columns into
   spin's scratch buffer, then ``Serving.observe_scored`` observes them and writes the request
   positions into vLLM's ``topk_indices_buffer`` in the same launch.

Steps 1–4 are device ops with static shapes and no host synchronisation; the per-row request
slots live in a static device buffer that the runner hook fills before the step (pad rows get
``pad_slot``), so vLLM's FULL CUDA graphs capture them and replay them with the current batch.

A request's first decode step is warm: in the step that completes its prompt, the prompt's last
row is scored over every block (spin's own Triton paged logits, one row per request and layer) and
observed as its prefill (``Serving.prefill``). That runs eagerly: such steps carry prefill tokens
and are never captured as FULL graphs.

The state is sized once, when the runner has allocated its real KV cache (``bind``, from the
runner hook): a slot for every request the cache can hold at half ``min_context`` or more, since
only such requests take one; shorter rows ride the pad slot and keep every block. Only a prompt
ending past half ``min_context`` is warm-started; a request that gets there by decoding starts
cold and warms on its full rows until ``min_context``.

A step whose decode layout the device path cannot take (vLLM's padded path, unequal draft
counts, more drafts than configured) runs vLLM's dense decode unchanged; it is counted
(``stats()["fallback_steps"]``) and logged once per 1000.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import torch

import spin_dsa
import spin_dsa.device as sd

from .cache_pages import kv_pages
from .lifecycle import Requests
from .runtime import ScoreRecorder

logger = logging.getLogger("spin_dsa.vllm")

#: Steps between the counters' log lines (the worker's log is where a served engine shows them).
STATS_EVERY = 1000

#: Slots when the bound KV cache cannot be read (not bound yet, or a layout spin does not know):
#: vLLM's max_num_seqs (1,024 on an H200) sized the state at 3.4–4.9 GiB per GPU at 160K
#: (device_path_review.md G5), while a GPU holds far fewer long-context requests.
DEFAULT_MAX_REQUESTS = 256


def long_context_slots(cache_entries: int, slot_entries: int, max_num_seqs: int) -> int:
    """How many requests of at least slot_entries indexer entries the KV cache holds at once (each
    may need a slot at the same time), at most max_num_seqs and at least 1. Without prefix
    sharing no more can need one; with it, the rest run dense and are counted."""
    if slot_entries <= 0:
        return int(max_num_seqs)
    return max(1, min(int(max_num_seqs), int(cache_entries) // int(slot_entries)))


def cache_entries(cache) -> int | None:
    """Indexer entries a bound cache holds (pages × entries a page), or None while unbound: a
    [pages, entries, 132] tensor, a list of them (vLLM's per-engine lists), or an object whose
    ``kv_cache`` is one."""
    cache = getattr(cache, "kv_cache", cache)
    if isinstance(cache, (list, tuple)):
        cache = cache[0] if cache else None
    if not isinstance(cache, torch.Tensor) or cache.dim() != 3 or cache.numel() == 0:
        return None
    return int(cache.shape[0]) * int(cache.shape[1])


_UNBOUND_CAPTURE = ("spin: vLLM is capturing a CUDA graph before spin's device state exists "
                    "(allocated when the runner's initialize_kv_cache returns: a runner that "
                    "does not call vLLM's own initialize_kv_cache is not supported)")


class DeviceRuntime:
    """The device path's state for one worker: slots, the device Serving, static row buffers."""

    def __init__(self, cfg, *, num_layers: int, max_tokens: int, max_requests: int,
                 max_next_n: int, max_batch: int, page_size: int, topk: int,
                 compress_ratio: int = 1, device="cuda", model: str = "vllm", cache=None):
        """max_requests: vLLM's max_num_seqs, the most slots the state may get; cache: where the
        indexer's KV cache will be bound (the first spin layer's ``k_cache``), read by bind()."""
        self.cfg = cfg
        self.num_layers, self.max_next_n = int(num_layers), int(max_next_n)
        self.page_size, self.topk = int(page_size), int(topk)
        self.compress_ratio = int(compress_ratio)
        self.max_batch, self.max_num_seqs = int(max_batch), int(max_requests)
        self._cache = cache
        config = dict(cfg.config, page_size=self.page_size, topk=self.topk)
        block_entries = self.page_size * int(spin_dsa.check_config(config)["block_pages"])
        self._serving_args = (self.num_layers, -(-int(max_tokens) // self.compress_ratio),
                              cfg.predictor, config, self.max_next_n, self.compress_ratio, device)
        self._dense_blocks = int(cfg.min_context) // block_entries
        # A one-slot Serving checks the settings at load, gives the geometry and serves vLLM's
        # profiling passes (a throwaway KV cache, graphs it discards); the state is sized by
        # bind(), once vLLM has allocated its real KV cache and before it captures any graph.
        self.serving = sd.Serving(1, *self._serving_args, dense_blocks=self._dense_blocks)
        self.requests = Requests(cfg.warm_start)  # the lifecycle the host path shares
        self._profiling = False  # the runner hook saw vLLM's profiling KV cache (profiling())
        # A request takes a slot once its context reaches half of min_context: its rows are
        # still scored in full (dense_blocks) until min_context and observed wherever spin's
        # chain runs (FULL-graph replays, steps with a long row; an eager step of short rows
        # skips it), so its state warms before selection starts; a prompt ending past half
        # min_context is warm-started at once. Shorter requests need no state.
        self.slot_tokens = int(cfg.min_context) // 2 * self.compress_ratio
        self.device = self.serving.device
        self.block_entries = self.serving.block_entries
        self.width_entries = self.serving.width * self.block_entries
        i64 = dict(dtype=torch.int64, device=self.device)
        # Each batch row's slot and the tokens it schedules: one device buffer, written by one
        # non-blocking copy a step from pinned host memory (_Staging).
        self._step_rows = torch.zeros((2, self.max_batch), **i64)
        self._step_rows[0].fill_(self.serving.pad_slot)
        self._rows, self._qlen = self._step_rows[0], self._step_rows[1]
        self._staging = _Staging((2, self.max_batch), torch.int64, self.device)
        self._prompt_index = torch.zeros((2, self.max_batch), **i64)  # warm start's rows, a step's
        self._prompt_staging = _Staging((2, self.max_batch), torch.int64, self.device)
        # [decode rows, blocks scored, blocks visible]: device counters, added to by compact's own
        # launch, read only by stats().
        self._counters = torch.zeros(3, **i64)
        self._topk_cols = torch.empty((self.max_batch * self.max_next_n, self.topk), dtype=torch.int32,
                                      device=self.device)
        self._prompt_rows: list[tuple[int, int]] = []  # (batch row, token row) of ending prompts
        self.first_layer = self.last_layer = None
        self._step_blocks = None  # (blocks, counts) of every layer: the step's plan
        self._rank_group = None   # verify_ranks' process group (rank_group())
        # Record mode: the true indexer rows of the recorded requests (scored apart from spin's
        # blocks, so recording never changes what spin selects), copied to the host.
        self.recorder = ScoreRecorder(cfg.record, model, self.num_layers) if cfg.record else None
        self._recorded: list[tuple[int, str]] = []  # (batch row, request id) of this step
        self._record_open: set[str] = set()  # recorded requests with an open trace step
        self.steps = 0
        self.fallback_steps = 0
        self.no_slot_steps = 0  # steps run dense because a request had no slot
        self.short_steps, self._short_step = 0, -1  # eager steps run dense: all rows short
        self._no_slot: list[int] = []  # this step's batch rows without a slot
        self._fallback_step = -1

    # -- lifecycle (the runner hook; host, outside any captured region) ------------------------

    def bind(self):
        """Allocates the state, once: cfg.max_requests slots, or as many as the bound KV cache
        holds requests of slot_tokens (long_context_slots), or DEFAULT_MAX_REQUESTS where no
        cache can be read. Called by the runner hook right after vLLM's real (not profiling)
        initialize_kv_cache — before its warm-up runs and graph capture — or else at the first
        step. Never from a layer: vLLM's profiling passes run layers on a throwaway cache."""
        if self.slots is not None:
            return
        if _capturing(self.device):
            raise RuntimeError(_UNBOUND_CAPTURE)
        entries = cache_entries(self._cache)
        if self.cfg.max_requests:
            capacity, why = self.cfg.max_requests, "max_requests"
        elif entries is None:
            capacity, why = min(self.max_num_seqs, DEFAULT_MAX_REQUESTS), "no KV cache read"
        else:
            slot_entries = self.slot_tokens // self.compress_ratio
            capacity = long_context_slots(entries, slot_entries, self.max_num_seqs)
            why = f"a KV cache of {entries} indexer entries, {slot_entries} a request"
        self.requests.bind(capacity)
        self.serving = sd.Serving(capacity, *self._serving_args, dense_blocks=self._dense_blocks)
        self._step_rows[0].fill_(self.serving.pad_slot)
        logger.info("spin: state for %d requests (%s): %.1f MiB", capacity, why,
                    self.serving.memory_bytes / 2**20)

    def profiling(self):
        """vLLM allocated its throwaway CUDA-graph profiling KV cache: the captures that follow
        run on the one-slot state and are discarded (the runner hook calls this)."""
        self._profiling = True

    @property
    def slots(self):
        """Request id → slot for the requests that hold state (lifecycle.SlotTable); None until
        bind()."""
        return self.requests.slots

    def add(self, request_id: str):
        """A new or resumed request: it starts over (a slot is taken by begin_step, once its
        context needs one)."""
        self.bind()
        self.drop(request_id)  # resumed after a preemption we did not see
        self.requests.add(request_id)
        if self.recorder is not None:
            self.recorder.on_add(request_id)

    def drop(self, request_id: str):
        """A finished or preempted request; unknown ids are ignored (a known one was added,
        which bound the state)."""
        if request_id not in self.requests:
            return
        slot = self.requests.drop(request_id)
        if slot is not None:
            self.serving.drop(slot)
        if self.recorder is not None:
            self.recorder.on_drop(request_id, self.page_size, self.topk)
            self._record_open.discard(request_id)

    def close(self):
        """Writes the traces of requests still recording (process exit)."""
        for request_id in self.requests.known():
            self.drop(request_id)

    def begin_step(self, request_ids, scheduled=None, prompt_ends=None, context=None):
        """The batch in row order; scheduled[i]: tokens row i schedules this step; prompt_ends:
        the rows whose prompt's last token is in this step (their first decode is next);
        context[i]: the tokens row i has once this step is done (None: every row needs a slot).
        The lists are indexed like request_ids without its None entries."""
        self.bind()
        batch = sum(r is not None for r in request_ids)
        if batch > self.max_batch:
            raise RuntimeError(f"spin: a batch of {batch} requests exceeds max_num_seqs "
                               f"{self.max_batch}")
        for r in self.requests.unknown(request_ids):
            self.add(r)  # MRV2's hook announces requests only by their batches
        step = self.requests.begin(
            request_ids, scheduled, prompt_ends,
            lambda i, r: self._needs_slot(r, None if context is None else context[i]))
        for slot, key in step.taken:
            self.serving.add(slot, key)
        # A row that needs a slot and has none (more long requests than slots): this step runs
        # vLLM's dense decode (counted), never raises; it gets one when one frees. Under FULL
        # CUDA graphs a replay cannot switch: such rows then use the pad slot's shared state (a
        # budgeted selection, not dense) — raise max_requests if stats()["no_slot_steps"] grows.
        # Short rows without a slot use the pad slot too, and keep every block (dense_blocks).
        self._no_slot = step.no_slot
        if self._no_slot:
            self.no_slot_steps += 1
        n = len(step.ids)
        rows = np.zeros((2, self.max_batch), np.int64)
        rows[0] = self.serving.pad_slot
        rows[0, :n] = [self.serving.pad_slot if s is None else s for s in step.slots]
        if scheduled is not None:
            rows[1, :n] = step.scheduled
        self._staging.copy(self._step_rows, rows)
        self._prompt_rows = step.prompt_rows
        if self._prompt_rows:  # their batch and token rows, on the device once a step (not per layer)
            index = np.zeros((2, self.max_batch), np.int64)
            index[:, :len(self._prompt_rows)] = np.array(self._prompt_rows, np.int64).T
            self._prompt_staging.copy(self._prompt_index, index)
        if self.recorder is not None:
            self._recorded = [(i, r) for i, r in enumerate(step.ids) if self.recorder.recording(r)]
        self.steps += 1
        if self.steps % STATS_EVERY == 0:  # one device sync per STATS_EVERY steps
            logger.info("spin: %s", self.stats())

    def _needs_slot(self, request_id, context) -> bool:
        """Whether a request needs state: its context reached slot_tokens (or is unknown), or
        it is being recorded (a trace reads its acceptance off its slot)."""
        return (context is None or context >= self.slot_tokens
                or (self.recorder is not None and self.recorder.recording(request_id)))

    # -- one indexer layer (inside the forward) ------------------------------------------------

    def indexer(self, layer: int, md, call, q_quant, weights, kv_cache):
        """Runs vLLM's indexer `call(metadata, max_model_len)` for this layer with spin choosing
        the decode rows' blocks; returns what vLLM's function returns."""
        if self.slots is None and not self._profiling and _capturing(self.device):
            raise RuntimeError(_UNBOUND_CAPTURE)  # its graphs would point at the one-slot state
        if kv_cache.shape[1] != self.page_size:  # a host check on shapes: no sync
            raise RuntimeError(f"spin: the indexer cache has {kv_cache.shape[1]}-entry pages, "
                               f"vLLM's cache_config.block_size says {self.page_size}")
        if layer == self.first_layer:
            accepted = self._commit(md)
            if self._recorded:
                self._record_step(md, accepted)
        plan = None if self._no_slot else _decode_plan(md, self.max_next_n)
        if plan is not None and self._short(md):
            plan = None
        if plan is None:
            if md.num_decodes > 0:
                self._count_fallback()
            out = call(md, None)
        else:
            out = self._sparse_decode(layer, md, plan, call)
        if self._prompt_rows and not _capturing(self.device):
            self._observe_prompts(layer, md, q_quant, weights, kv_cache)
        if self._recorded:
            if plan is None:  # a trace is a run of steps: it ends before a dense fallback step
                for _, rid in self._recorded:
                    self.recorder.stop(rid, self.page_size, self.topk)
            else:
                self._record_rows(layer, md, plan, q_quant, weights, kv_cache)
        if layer == self.last_layer:  # a forward the runner does not announce (a dummy run)
            self._step_blocks = None
            self._rows.fill_(self.serving.pad_slot)  # then selects for the pad slot only
            self._prompt_rows = []
            self._recorded = []
        return out

    def rank_group(self):
        """The tensor-parallel group whose ranks must select alike (vLLM's; tests set their own)."""
        if self._rank_group is None:
            from vllm.distributed import get_tp_group
            self._rank_group = get_tp_group().device_group
        return self._rank_group

    def topk_scratch(self, like):
        """Where vLLM's top-k writes a spin layer's compact columns: a static buffer (an
        allocation once per shape beyond it), never vLLM's own top-k buffer."""
        rows, k = like.shape
        if rows > self._topk_cols.shape[0] or k > self._topk_cols.shape[1]:
            return torch.empty_like(like)
        return self._topk_cols[:rows, :k]

    def _short(self, md) -> bool:
        """An eager step whose longest decode row sees at most min_context entries (in blocks:
        the select's dense_blocks rule, where every row keeps every block anyway) runs vLLM's
        dense decode, counted once a step: spin's launches would buy nothing. A captured step
        keeps the sparse path (a replay cannot branch), and observes: a request's state then
        depends on which of its short steps were captured (they select every block either way)."""
        longest = -(-(md.max_seq_len // self.compress_ratio) // self.block_entries)  # in blocks
        if _capturing(self.device) or longest > self.serving.dense_blocks:
            return False
        if self._short_step != self.steps:
            self._short_step = self.steps
            self.short_steps += 1
        return True

    def _commit(self, md):
        """Closes the batch's open steps; acceptance is read off vLLM's lengths inside the
        commit kernels. Returns the accepted counts only in record mode (host reads)."""
        n = md.num_decodes + md.num_prefills
        if n == 0:
            return None
        S, L, Q = self._rows[:n], md.seq_lens[:n], self._qlen[:n]
        accepted = self.serving.accepted_tokens(S, L, Q) if self._recorded else None
        self.serving.commit(S, seq_lens=L, query_lens=Q)
        return accepted

    def _sparse_decode(self, layer, md, plan, call):
        batch, next_n, seq_lens, table, per_token = plan
        S = self._rows[:batch]
        if layer == self.first_layer or self._step_blocks is None:
            self._plan_step(S, seq_lens, next_n)
        blocks, counts = self._step_blocks[0][layer], self._step_blocks[1][layer]
        pages, lengths = sd.compact(blocks, counts, table, seq_lens, next_n,
                                    int(self.serving.config["block_pages"]), self.page_size,
                                    self.compress_ratio, counters=self._counters)
        if per_token:  # vLLM's flattened rows: one table row and one length per token
            pages = pages.repeat_interleave(next_n, dim=0)
            ctx = lengths.view(-1, 1)
        else:
            ctx = lengths.view(batch, next_n)
        decode = dataclasses.replace(md.decode, block_table=pages, seq_lens=ctx,
                                     schedule_metadata=_schedule(ctx, md.decode, self.page_size))
        compact_md = dataclasses.replace(md, decode=decode, max_seq_len=self.width_entries)
        with TopkTap.spin_call(self, S, layer, blocks):
            return call(compact_md, self.width_entries)

    def _plan_step(self, S, seq_lens, next_n):
        """Once per step, at its first spin layer: every layer's blocks in one select (the
        layers then only slice them) and the step's opening lengths."""
        self._step_blocks = self.serving.select_layers(S, seq_lens, next_n)
        if self.cfg.verify_ranks and not _capturing(self.device):
            verify_ranks(*self._step_blocks, self.rank_group(), self.steps)

    def _observe_prompts(self, layer, md, q_quant, weights, kv_cache):
        rows, tokens = self._prompt_index[:, :len(self._prompt_rows)]
        L = md.seq_lens[rows].long()
        entries = sd.visible_entries(L, 1, self.compress_ratio).to(torch.int32)  # one row each
        cache, table = _page_view(kv_cache, md.block_table[rows].to(torch.int32), self.page_size)
        q = q_quant.index_select(0, tokens)
        w = weights.index_select(0, tokens).float()
        logits = _full_rows(q, w, cache, table, entries, self.page_size)
        S = self._rows[rows]
        self.serving.prefill(S, layer, L, logits)
        if self._recorded:
            self._record_prompts(layer, L, logits)

    # -- record mode (eager only: refused with FULL CUDA graphs) -----------------------------

    def _record_step(self, md, accepted):
        """Closes the recorded requests' open trace steps (their acceptance, read back from the
        device: record mode only) and opens this step's for those decoding in it."""
        rows = [i for i, _ in self._recorded]
        acc = accepted[rows].tolist()
        seq = md.seq_lens[rows].tolist()
        decodes = md.num_decodes
        next_n = md.num_decode_tokens // decodes if decodes else 1
        for (i, rid), a, L in zip(self._recorded, acc, seq):
            if rid in self._record_open:
                self.recorder.set_accepted(rid, int(a))
                self.recorder.end_step(rid, self.page_size, self.topk)
                self._record_open.discard(rid)
            if i < decodes and self.recorder.recording(rid):
                self.recorder.open_step(rid, int(L), next_n, self.page_size, self.topk)
                if self.recorder.recording(rid):  # a next_n change ends (and writes) the trace
                    self._record_open.add(rid)

    def _record_prompts(self, layer, seq_lens, logits):
        """A recorded request whose prompt ends in this step: its trace starts with the prompt's
        last row (step 0, the other next_n - 1 rows -inf, committed with 0 accepted), as the
        host path records it and replay's warm start reads it."""
        recorded = dict(self._recorded)
        mine = [(p, recorded[i]) for p, (i, _) in enumerate(self._prompt_rows)
                if i in recorded and self.recorder.recording(recorded[i])]
        if not mine:
            return
        lens, rows = seq_lens.tolist(), logits.cpu().numpy()  # record mode: eager, host reads
        for p, rid in mine:
            if rid not in self._record_open:  # the step's first layer opens the trace's step 0
                self.recorder.open_prompt(rid, lens[p], self.max_next_n, self.page_size,
                                          self.topk)
                if not self.recorder.recording(rid):  # a next_n change ended (wrote) the trace
                    continue
                self._record_open.add(rid)
            self.recorder.add_prompt_row(rid, layer, rows[p], lens[p])

    def _record_rows(self, layer, md, plan, q_quant, weights, kv_cache):
        """Every visible entry of each recorded decode row (spin's Triton kernel on a GPU),
        copied to the host for the trace: the true indexer output, whatever spin selected."""
        batch, next_n, seq_lens, table, _ = plan
        mine = [(i, rid) for i, rid in self._recorded if i < batch]
        if not mine or layer not in self.recorder.layers:
            return
        rows = torch.tensor([i for i, _ in mine], dtype=torch.int64, device=self.device)
        tokens = (rows[:, None] * next_n + torch.arange(next_n, device=self.device)).reshape(-1)
        L = seq_lens.index_select(0, rows)
        entries = sd.visible_entries(L, next_n, self.compress_ratio).to(torch.int32)
        cache, pages = _page_view(kv_cache, table.index_select(0, rows).to(torch.int32),
                                  self.page_size)
        q = q_quant.index_select(0, tokens)
        w = weights.index_select(0, tokens).float()
        logits = _full_rows(q, w, cache, pages, entries, self.page_size, next_n).cpu().numpy()
        for b, ((_, rid), n) in enumerate(zip(mine, entries.view(-1, next_n)[:, -1].tolist())):
            self.recorder.add_rows(rid, layer, logits[b * next_n:(b + 1) * next_n, :n])

    def _count_fallback(self):
        if self._fallback_step == self.steps:  # once per step, not per layer
            return
        self._fallback_step = self.steps
        self.fallback_steps += 1
        if self.fallback_steps % 1000 == 1:
            logger.warning("spin: %d decode steps ran vLLM's dense indexer (a layout the device "
                           "path does not take: padded or unequal draft rows)",
                           self.fallback_steps)

    def stats(self) -> dict:
        """Counters since start (reading them synchronises with the device)."""
        rows, scored, visible = (int(v) for v in self._counters.tolist())
        return {"steps": self.steps, "fallback_steps": self.fallback_steps,
                "no_slot_steps": self.no_slot_steps, "short_steps": self.short_steps,
                "max_requests": self.slots.capacity if self.slots is not None else None,
                "requests_with_state": len(self.slots) if self.slots is not None else 0,
                "state_bytes": self.serving.memory_bytes,  # GPU memory of spin's state
                "decode_rows": rows,
                "blocks_scored": scored, "blocks_visible": visible,
                "scored_fraction": scored / visible if visible else 1.0}


def block_checksum(blocks, counts):
    """An int64 digest of a step's selection (every layer's blocks and counts), position-weighted
    so that a block moved to another row or slot changes it. Integer sums are the same in any
    order (wrapping at 2^64 included), so equal selections give equal digests on every rank."""
    flat = torch.cat([blocks.reshape(-1).long() + 2, counts.reshape(-1).long() + 1])
    weights = torch.arange(flat.numel(), device=flat.device) % 65521 + 1
    return (flat * weights).sum()


def verify_ranks(blocks, counts, group, step):
    """All-reduces the step's checksum (max of it and of its negation: one collective) over the
    tensor-parallel group; raises on every rank when they differ."""
    import torch.distributed as dist
    if group is None or dist.get_world_size(group) < 2:
        return
    digest = block_checksum(blocks, counts)
    both = torch.stack([digest, -digest])
    dist.all_reduce(both, op=dist.ReduceOp.MAX, group=group)
    high, low = both.tolist()[0], -both.tolist()[1]
    if high != low:
        raise RuntimeError(f"spin: tensor-parallel ranks selected different blocks at step {step} "
                           f"(block checksums range {low}..{high}); their predictor states have "
                           "diverged, and their heads would attend to different tokens")


class _Staging:
    """A step's small index tensors to the device without stopping the host (G3 of the device
    path review): on CUDA from pinned host buffers, two in turn, each copy non-blocking and
    followed by an event, so a buffer is rewritten only once its copy has left it (two steps
    later: in practice never a wait) — as vLLM's own async host-to-device copies. On a CPU
    device, a plain copy."""

    def __init__(self, shape, dtype, device):
        self.pinned = device.type == "cuda"
        self.host = [torch.empty(shape, dtype=dtype, pin_memory=self.pinned) for _ in range(2)]
        self.sent = [None, None]
        self.turn = 0

    def copy(self, dst, values):
        i, self.turn = self.turn, self.turn ^ 1
        if self.sent[i] is not None:
            self.sent[i].synchronize()
        self.host[i].numpy()[...] = values
        dst.copy_(self.host[i], non_blocking=self.pinned)
        if self.pinned:
            self.sent[i] = torch.cuda.Event()
            self.sent[i].record()


def _decode_plan(md, max_next_n):
    """(batch, next_n, per-request seq_lens, per-request block table, per-token rows) when the
    step's decode rows are a layout the device path takes, else None (vLLM's dense decode)."""
    d = md.decode
    if md.num_decodes == 0 or d is None or d.requires_padding:
        return None
    batch, tokens = md.num_decodes, md.num_decode_tokens
    if tokens % batch or not getattr(d, "decode_is_uniform", True):
        return None
    next_n = tokens // batch
    if next_n > max_next_n:
        return None
    seq_lens = md.seq_lens[:batch]
    if d.seq_lens.shape[0] == batch:  # native rows [B, next_n]
        return batch, next_n, seq_lens, d.block_table[:batch], False
    if d.seq_lens.shape[0] == tokens:  # flattened: token i·next_n + j is row j of request i
        return batch, next_n, seq_lens, d.block_table[:tokens:next_n], True
    return None


def _schedule(ctx, decode, page_size):
    """DeepGEMM's schedule for the compacted lengths (CUDA with DeepGEMM), else vLLM's."""
    if ctx.device.type != "cuda":
        return decode.schedule_metadata
    from vllm.utils.deep_gemm import get_paged_mqa_logits_metadata, has_deep_gemm
    if not has_deep_gemm():
        return decode.schedule_metadata
    sms = torch.cuda.get_device_properties(ctx.device).multi_processor_count
    return get_paged_mqa_logits_metadata(ctx, page_size, sms, indices=decode.indices)


def _page_view(kv_cache, table, page_size):
    """vLLM's per-layer indexer cache as contiguous pages, and the table into them."""
    pages, mult, base = kv_pages(kv_cache, page_size)
    return pages, (table * mult + base if mult != 1 or base else table)


def _full_rows(q, w, cache, table, entries, page_size, next_n=1):
    """Every visible entry of next_n rows per request (row b·next_n + j sees entries[b·next_n +
    j]): spin's Triton kernel on CUDA, its torch reference elsewhere."""
    width = table.shape[1] * page_size
    if q.device.type == "cuda":
        return sd.paged_logits(q, w, cache, table, entries, next_n=next_n, page_size=page_size,
                               width=width)
    from spin_dsa.device._logits import paged_logits_reference
    return paged_logits_reference(q, w, cache, table, entries, next_n=next_n,
                                  page_size=page_size, width=width)


def _capturing(device) -> bool:
    return device.type == "cuda" and torch.cuda.is_current_stream_capturing()


class TopkTap:
    """Wraps vLLM's decode top-k dispatcher: during a spin call it observes the compact logits
    and columns and writes request positions in their place. Installed over
    ``get_indexer_topk`` in vLLM's sparse_attn_indexer module by register()."""

    _active = None  # (runtime, slots, layer, blocks) while a spin call runs

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        """Everything else is the dispatcher's own (vLLM 0.34 asks it ``takes_bf16_logits``:
        bf16 logits reach spin's observe widened to fp32). Read through __dict__: a copy or an
        unpickled tap has no ``inner`` yet, and must not recurse here looking for it."""
        inner = self.__dict__.get("inner")
        if inner is None:
            raise AttributeError(name)
        return getattr(inner, name)

    def __call__(self, logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len):
        active, TopkTap._active = TopkTap._active, None
        if active is None:
            return self.inner(logits, seq_lens, next_n, topk_indices, topk_tokens, max_seq_len)
        rt, S, layer, blocks = active
        # vLLM's top-k writes the compact columns into spin's scratch; observe reads them and
        # writes the request positions into vLLM's buffer in the same launch (remap fused).
        cols = rt.topk_scratch(topk_indices)
        self.inner(logits, seq_lens, next_n, cols, topk_tokens, max_seq_len)
        scored = logits if logits.dtype == torch.float32 else logits.float()
        rt.serving.observe_scored(S, layer, scored, cols, positions=topk_indices, blocks=blocks)

    class spin_call:
        def __init__(self, rt, S, layer, blocks):
            self.state = (rt, S, layer, blocks)

        def __enter__(self):
            TopkTap._active = self.state

        def __exit__(self, *exc):
            TopkTap._active = None
