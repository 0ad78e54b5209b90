"""spin_dsa.device.Serving: the serving contract of spin_dsa.Serving with its state on a torch
device, every call batched, no host synchronisation and static shapes.

The C++ library is the reference: for the same calls this object selects exactly the blocks
spin_dsa.Serving selects (tests/device/test_serving.py). What that takes, beside the same
algorithm (src/predict/predictor_base.cpp):

- every float the selection reads is computed with the same IEEE operations in the same order:
  the EMAs as separate float32 multiplies and adds (never fused), the pooled value r in float64;
- the offset EMA's per-bucket mean is a fixed-point integer sum (src/predict/block_state.h,
  kOffsetMeanScale), so one scatter-add gives the library's bits in any summation order;
- exploration draws the library's counter hash (spin/rng.h) on int64 tensors (_hash.py);
- "the k smallest keys" is the same strict total order the library uses — (value, block index)
  packed into one int64 — so the chosen set does not depend on how it is found (a sort here,
  quickselect there);
- the budget and forced counts depend only on a row's block count: tables built at construction
  by the library itself (spin_dsa._core.selection_tables, include/spin/selection_tables.h, with
  the ranking's constants from selection_constants); so does the exploration count, but for spin's
  explore_churn, which scales it by a per-(slot, layer) share kept in float64 as the library
  keeps it (updated at commit from the top-k's entry churn; 0 until measured).

No call reads a device value on the host: shapes come from the arguments' shapes and from Python
ints (layer, next_n), and a decode step's select / observe_scored / commit can be captured in one
CUDA graph. The price is that argument *values* are not checked (a slot that was never added, a
seq_len below next_n, a top-k column outside the scored blocks): shapes, dtypes and devices are,
and the host-side lifecycle (add / drop) is. Use spin_dsa.Serving to validate an integration.
"""

import importlib

import numpy as np
import torch

import spin_dsa

from . import _commit, _hash, _observe, _select
from ._state import PARTS, State, build

PREDICTORS = tuple(PARTS)


def _check_tensor(t, name, device, ndim, kinds, rows=None):
    """Serving's one tensor check (kind, device, rank, dtype kind, rows), before any work: the
    package's errors (InvalidType is a TypeError, InvalidArgument a ValueError), one line each."""
    if not isinstance(t, torch.Tensor):
        raise spin_dsa.InvalidType(f"{name}: expected a torch.Tensor on {device}, got {type(t).__name__}")
    if t.device != device:
        raise spin_dsa.InvalidArgument(f"{name}: on {t.device}, expected {device} (the object's device)")
    if t.dim() != ndim:
        raise spin_dsa.InvalidArgument(f"{name}: expected {ndim} dimension(s), got shape {tuple(t.shape)}")
    if kinds == "int" and (t.dtype.is_floating_point or t.dtype.is_complex or t.dtype == torch.bool):
        raise spin_dsa.InvalidType(f"{name}: expected an integer tensor, got {t.dtype}")
    if kinds == "float32" and t.dtype != torch.float32:
        raise spin_dsa.InvalidType(f"{name}: expected float32, got {t.dtype}")
    if rows is not None and t.shape[0] != rows:
        raise spin_dsa.InvalidArgument(f"{name}: expected {rows} rows, got shape {tuple(t.shape)}")


def _refuse_host_only_options(c):
    if c["pooling"] not in ("max", "topk-hits"):
        raise spin_dsa.InvalidArgument(
            f"spin_dsa.device: pooling={c['pooling']} is host-only; the device path pools "
            "max (default) and topk-hits")
    if c["budget_moves"] != "none":
        raise spin_dsa.InvalidArgument(
            f"spin_dsa.device: budget_moves={c['budget_moves']} is host-only; use none")


class Serving:
    """One object for a whole batch (the serving contract of include/spin/serving.h), state on `device`.

    Per decode step, for slots (int tensor [batch]) and seq_lens (int tensor [batch], tokens
    cached including the step's next_n rows):

        for each indexer layer l:
            blocks, counts = s.select(slots, l, seq_lens, next_n)   # [batch·next_n, width] int32
            ... score the blocks (compact(), the logits kernel), top-k over the compact width ...
            s.observe_scored(slots, l, scored, topk, blocks=blocks)  # compact logits and top-k
        s.commit(slots, accepted)                      # int tensor [batch], draft tokens kept
        # or s.commit(slots, seq_lens=..., query_lens=...): the next step's lengths

    Padding: rows an engine adds to reach a captured graph's batch size use `pad_slot` (any
    number of them, in any call); never a negative or out-of-range slot — values are not checked
    inside a step, and such a slot would read and write another request's state.

    impl: "triton" selects with one fused Triton kernel per call (_select_kernel.py), "torch"
    with plain torch ops (its reference); "auto" takes triton on CUDA when it is importable.

    Every row of a request carries the union of its rows' sets, ascending, -1 padded; `width` is
    fixed at construction (the widest union any step can need at max_entries).
    """

    def __init__(self, max_requests, num_layers, max_entries, predictor="spin", config=None,
                 max_next_n=1, compress_ratio=1, device="cpu", impl="auto", dense_blocks=0):
        if predictor not in PARTS:
            raise spin_dsa.InvalidArgument(
                f"spin_dsa.device: predictor '{predictor}' is not on the device path; it runs "
                f"{', '.join(PREDICTORS)} (the predictors that read only their own state)")
        config = spin_dsa.check_config(config if config is not None else {})
        _refuse_host_only_options(config)
        # The library validates every size and option the same way for both paths (and allocates
        # a one-slot host object to do it: cheap, and the same messages).
        spin_dsa.Serving(1, num_layers, max_entries, predictor, config, max_next_n, compress_ratio)
        if not 1 <= max_requests <= 1 << 20:
            raise spin_dsa.InvalidArgument(
                f"serving: max_requests {max_requests} is outside 1..2^20")
        if isinstance(dense_blocks, bool) or not isinstance(dense_blocks, (int, np.integer)) \
                or dense_blocks < 0:
            raise spin_dsa.InvalidArgument(
                f"serving: dense_blocks {dense_blocks!r} must be an int >= 0")
        self.device = torch.empty(0, device=device).device  # "cuda" → "cuda:N", as tensors say
        self._kernel = _kernel_module(impl, self.device, "_select_kernel")
        self.impl = "torch" if self._kernel is None else "triton"
        self._observe_kernel = _kernel_module(self.impl, self.device, "_observe_kernel")
        self._commit_kernel = _kernel_module(self.impl, self.device, "_commit_kernel")
        # Blocks per program of the observe kernel (a tuning knob: each program re-reads the
        # row's top-k, so a chunk should be large against it; small rows get one program).
        self.observe_chunk_blocks = 256
        # The select kernel's k-th search (a tuning knob; both give the same blocks): "bitwise",
        # 32 rounds of a count over the row, or "radix", 4 rounds of an 8-bit histogram. The
        # default stays bitwise until a GPU has timed the two (bench/gpu/chain.py times both):
        # ptxas for sm_90 gives the radix kernel more registers (next_n 1, 2,048 blocks: 200
        # against 145; next_n 2 spills 16 bytes at 255).
        self.kth_search = "bitwise"
        # Rows that see at most dense_blocks blocks keep every block (an engine's short-context
        # threshold: there the indexer is cheap and skipping saves nothing). 0: the budget rule
        # alone, as in the library.
        self.spec, self.tables = build(predictor, config, max_requests, num_layers,
                                       max_entries, max_next_n, compress_ratio, int(dense_blocks),
                                       self.device)
        self.state = State.allocate(self.spec, self.device)
        self._active = [False] * self.spec.max_requests

    @property
    def memory_bytes(self):
        """Device bytes of every slot's state (spin's own memory beside the engine's)."""
        return self.state.memory_bytes

    # -- lifecycle (host calls between steps: they write the device, they never read it) -------

    def _check_slot(self, slot, call):
        if isinstance(slot, bool) or not isinstance(slot, (int, np.integer)):
            raise spin_dsa.InvalidType(f"serving: {call}: slot must be an int, got {type(slot).__name__}")
        if not 0 <= slot < self.spec.max_requests:
            raise spin_dsa.OutOfRange(
                f"serving: {call}: slot {slot} is outside 0..{self.spec.max_requests - 1}")
        return int(slot)

    def add(self, slot, request_id):
        """Starts request `request_id` (≥ 0; exploration is keyed on it) in free `slot`."""
        slot = self._check_slot(slot, "add")
        if isinstance(request_id, bool) or not isinstance(request_id, (int, np.integer)) \
                or not 0 <= request_id < 1 << 63:
            raise spin_dsa.InvalidArgument(f"serving: add: request_id {request_id!r} must be an "
                                           "int in [0, 2^63)")
        if self._active[slot]:
            raise spin_dsa.FailedPrecondition(
                f"serving: add: slot {slot} holds a request; drop(slot) first")
        self.state.reset(slot, self.spec.share0)
        self.state.req_key[slot] = _hash.request_key(int(self.spec.config["seed"]), int(request_id))
        self._active[slot] = True

    def drop(self, slot):
        """Frees `slot` (finished or preempted request); its open step is discarded."""
        slot = self._check_slot(slot, "drop")
        if not self._active[slot]:
            raise spin_dsa.FailedPrecondition(f"serving: drop: slot {slot} is already free")
        self.state.selected[slot].fill_(False)
        self._active[slot] = False

    def active(self, slot):
        return 0 <= slot < self.spec.max_requests and self._active[slot]

    # -- a decode step ------------------------------------------------------------------------

    def _check_step_args(self, slots, layer, call):
        _check_tensor(slots, "slots", self.device, 1, "int")
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)):
            raise spin_dsa.InvalidType(f"serving: {call}: layer must be an int")
        if not 0 <= layer < self.spec.num_layers:
            raise spin_dsa.OutOfRange(
                f"serving: {call}: layer {layer} is outside 0..{self.spec.num_layers - 1}")
        return slots.long().contiguous(), int(layer)  # the kernels index 1-D arguments densely

    def select(self, slots, layer, seq_lens, next_n=1):
        """(blocks int32 [batch·next_n, width], counts int32 [batch·next_n]) on the device."""
        S, layer = self._check_step_args(slots, layer, "select")
        blocks, counts = self._select(S, [layer], seq_lens, next_n, "select")
        return blocks[0], counts[0]

    def select_layers(self, slots, seq_lens, next_n=1, layers=None):
        """Every listed layer's select of the step in one batched call (default: all layers, in
        order): (blocks int32 [layers, batch·next_n, width], counts int32 [layers, batch·next_n]).
        The same blocks as select() layer by layer — the device predictors' choice at step t
        reads only steps < t — with one set of kernel launches per step instead of one per
        layer. observe_scored then follows per layer, as after select()."""
        layers = list(range(self.spec.num_layers)) if layers is None else list(layers)
        if not layers:
            raise spin_dsa.InvalidArgument("serving: select_layers: layers is empty")
        S = None
        for layer in layers:
            S, _ = self._check_step_args(slots, layer, "select_layers")
        if len(set(layers)) != len(layers):
            raise spin_dsa.InvalidArgument(f"serving: select_layers: layers {layers} repeat")
        return self._select(S, layers, seq_lens, next_n, "select_layers")

    def _select(self, S, layers, seq_lens, next_n, call):
        _check_tensor(seq_lens, "seq_lens", self.device, 1, "int", rows=S.shape[0])
        seq_lens = seq_lens.contiguous()
        if isinstance(next_n, bool) or not isinstance(next_n, (int, np.integer)) \
                or not 1 <= next_n <= self.spec.max_next_n:
            raise spin_dsa.InvalidArgument(
                f"serving: {call}: next_n {next_n!r} is outside 1..max_next_n = {self.spec.max_next_n}")
        return _select.select(self.spec, self.tables, self.state, S, self._layer_tensor(layers),
                              seq_lens, int(next_n), self._kernel, self.kth_search == "radix")

    # Under CUDA-graph capture nothing may copy from the host: layer ids come from a device
    # arange (a view where they are a range).
    def _layer_tensor(self, layers):
        """int64 [len(layers)] on the device: a view of the layer ids where they are a range."""
        first = layers[0]
        if layers == list(range(first, first + len(layers))):
            return self.tables.layer_ids[first:first + len(layers)]
        return torch.cat([self.tables.layer_ids[l:l + 1] for l in layers])

    def observe_scored(self, slots, layer, scored, topk=None, *, blocks, positions=None):
        """The scored blocks' logits of the open step: float32 [batch·next_n, ≥ width·E], row r's
        c-th block of blocks[r] at columns [c·E, (c+1)·E) (what the compacted logits kernel
        writes); blocks: int32 [rows, ≥ width], unit column stride — the blocks select returned
        for these rows (the step's plan: the object keeps no copy); optionally the rows' top-k as
        compact column ids (int [rows, ≥ topk], -1 padded; the first `topk` are read). Without
        topk the k-th score is found here (torch.topk).

        positions: int32 [rows, topk], written with the top-k as request positions (what
        ``remap`` gives): an engine's top-k buffer, filled by the same launch. It must not share
        memory with ``topk`` (other programs still read the columns)."""
        S, layer = self._check_step_args(slots, layer, "observe_scored")
        _check_tensor(scored, "scored", self.device, 2, "float32")
        batch, rows = S.shape[0], scored.shape[0]
        if batch == 0 if rows == 0 else rows % max(batch, 1) != 0:
            raise spin_dsa.InvalidArgument(
                f"serving: observe_scored: scored has {rows} rows, not batch · next_n for batch "
                f"{batch}")
        next_n = rows // batch if batch else 1
        E = self.spec.block_entries
        if scored.shape[1] < self.spec.width * E:
            raise spin_dsa.InvalidArgument(
                f"serving: observe_scored: scored has {scored.shape[1]} columns, below width · E "
                f"= {self.spec.width * E}")
        _check_tensor(blocks, "blocks", self.device, 2, "int", rows=rows)
        if blocks.dtype != torch.int32 or blocks.shape[1] < self.spec.width or blocks.stride(1) != 1:
            raise spin_dsa.InvalidArgument(
                f"serving: observe_scored: blocks must be int32 [rows, >= width = {self.spec.width}] "
                f"with unit column stride, got {blocks.dtype} {tuple(blocks.shape)}")
        k = int(self.spec.config["topk"])
        if topk is not None:
            _check_tensor(topk, "topk", self.device, 2, "int", rows=rows)
            if topk.shape[1] < k:
                raise spin_dsa.InvalidArgument(
                    f"serving: observe_scored: topk has {topk.shape[1]} columns, below topk = {k}")
        if positions is not None:
            self._check_positions(positions, topk, rows, k)
        _observe.observe(self.spec, self.tables, self.state, S, layer, next_n, scored, topk, blocks,
                         positions, self._observe_kernel, self.observe_chunk_blocks,
                         self.kth_search == "radix")

    def _check_positions(self, positions, topk, rows, k):
        if topk is None:
            raise spin_dsa.InvalidArgument("serving: observe_scored: positions needs topk")
        _check_tensor(positions, "positions", self.device, 2, "int", rows=rows)
        if positions.dtype != torch.int32:
            raise spin_dsa.InvalidType(f"positions: expected int32 (an engine's top-k buffer), got {positions.dtype}")
        if positions.shape[1] != k or positions.stride(1) != 1:
            raise spin_dsa.InvalidArgument(
                f"serving: observe_scored: positions must be [rows, topk = {k}] with unit column "
                f"stride, got shape {tuple(positions.shape)}")
        if positions.untyped_storage().data_ptr() == topk.untyped_storage().data_ptr():
            raise spin_dsa.InvalidArgument(
                "serving: observe_scored: positions shares memory with topk (remap into another "
                "buffer: the kernel still reads the columns while it writes positions)")

    def prefill(self, slots, layer, seq_lens, logits):
        """A prompt's (or appended tool output's) full indexer row per slot, float32 [batch,
        ≥ visible entries] for `layer`; commit(slots) after the last layer, as for a decode step
        (the library's ServingPredictor::prefill: one row, every visible block scored)."""
        S, layer = self._check_step_args(slots, layer, "prefill")
        _check_tensor(seq_lens, "seq_lens", self.device, 1, "int", rows=S.shape[0])
        _check_tensor(logits, "logits", self.device, 2, "float32", rows=S.shape[0])
        _observe.prefill(self.spec, self.tables, self.state, S, layer, seq_lens, logits,
                         self._observe_kernel, self._commit_kernel, self.observe_chunk_blocks)

    def commit(self, slots, accepted=None, *, seq_lens=None, query_lens=None):
        """Closes the open step of every slot: accepted (int tensor [batch], None = zeros) draft
        tokens kept; replays each selected layer's rows per mtp_update (prefix: rows 0..accepted
        in order) into the state, as the library's commit does.

        Or, in place of accepted, the next step's seq_lens and query_lens (int tensors [batch]):
        an engine's lengths say what was accepted — the tokens cached before the next step's
        rows (seq_lens - query_lens) are those before the open step's rows, its sampled token
        and the accepted drafts — read inside the kernels (nothing computed between launches).

        A slot with no open step (nothing selected or prefilled since its last commit) is left
        as it is, where the library refuses: inside a captured step nothing can refuse, and an
        engine commits its whole batch at the start of a step without knowing which rows
        opened one."""
        _check_tensor(slots, "slots", self.device, 1, "int")
        S = slots.long().contiguous()
        batch = S.shape[0]
        if (seq_lens is None) != (query_lens is None) or (accepted is not None and seq_lens is not None):
            raise spin_dsa.InvalidArgument(
                "serving: commit: pass accepted, or seq_lens and query_lens, not both")
        for name, t in (("accepted", accepted), ("seq_lens", seq_lens), ("query_lens", query_lens)):
            if t is not None:
                _check_tensor(t, name, self.device, 1, "int", rows=batch)
        if accepted is None and seq_lens is None:
            accepted = torch.zeros(batch, dtype=torch.int64, device=self.device)
        rows = tuple(None if t is None else t.contiguous() for t in (accepted, seq_lens, query_lens))
        _commit.commit(self.spec, self.tables, self.state, S, rows, self._commit_kernel)

    def accepted_tokens(self, slots, seq_lens, query_lens):
        """The accepted draft tokens commit(slots, seq_lens=, query_lens=) reads off the
        lengths, before it runs (int64 [batch]; 0 where nothing was accepted) — for an engine
        that reports them (a recorder)."""
        return _commit.lengths_accepted(self.state, slots.long(), seq_lens,
                                        query_lens).clamp(min=0)


# Serving's sizes and rule read through to its spec, the one place that holds them.
for _name in ("predictor", "config", "max_requests", "num_layers", "max_entries", "max_next_n",
              "compress_ratio", "block_entries", "max_blocks", "width", "pad_slot",
              "dense_blocks"):
    setattr(Serving, _name, property(lambda self, _n=_name: getattr(self.spec, _n)))


def _kernel_module(impl, device, name):
    """A fused kernel's module (_select_kernel, _observe_kernel) for impl "triton" (or "auto" on
    CUDA, when Triton is importable); None for "torch": plain torch ops, the kernels' reference,
    and what runs elsewhere."""
    if impl not in ("auto", "triton", "torch"):
        raise spin_dsa.InvalidArgument(f"spin_dsa.device: impl '{impl}' is not auto, triton or torch")
    if impl == "torch" or (impl == "auto" and device.type != "cuda"):
        return None
    try:
        return importlib.import_module(f"{__package__}.{name}")
    except ImportError as e:
        if impl == "triton":
            raise spin_dsa.InvalidArgument(f"spin_dsa.device: impl triton needs triton ({e})")
        return None
