"""
spin's C++ library (include/spin/*.h) for Python; import spin_dsa, not this module.
"""

from collections.abc import Mapping, Sequence
from typing import Annotated

import numpy
import numpy.typing
from numpy.typing import NDArray


def predictor_names() -> list[str]:
    """The predictor names make_predictor accepts."""

def predictor_info() -> list[dict[str, str | bool]]:
    """
    The predictor registry, one dict per predictor in predictor_names() order: name, reads ('own-state', 'keys' or 'true-topk'), can_serve (Serving runs it), explores, keeps_all, reuses_previous_topk.
    """

def preset_names() -> list[str]:
    """
    The config presets: 'default', 'paper' (SPIN as published). Give one as config key 'preset'.
    """

def default_config() -> dict:
    """
    The PredictorConfig defaults as a dict (include/spin/predict.h documents each field).
    """

def check_config(config: Mapping[str, object] | str | None) -> dict:
    """
    Validates a config (dict or 'key=value ...') and returns it complete, as a dict.
    """

def budget_blocks(config: Mapping[str, object] | str | None, n_blocks: int) -> int:
    """
    Blocks scored for a row that sees n_blocks blocks: ceil((1 - s)·n), at least what top-k needs.
    """

def selection_tables(config: Mapping[str, object] | str | None, max_blocks: int) -> dict[str, NDArray[numpy.int64]]:
    """
    The selection rules that depend on a row's block count alone, as int64 arrays (include/spin/selection_tables.h): by block count n in 0..max_blocks budget, forced, explore (at the fixed explore_ratio), history and pool_rank; by distance d in 0..max(1, max_blocks) - 1 offset_bucket; by offset bucket its distances [bucket_lo, bucket_hi).
    """

def selection_constants() -> dict[str, int | float]:
    """
    The ranking's constants (include/spin/selection_tables.h): offset_mean_scale, offset_exact_distances, offset_buckets_per_octave, topk_first_base, topk_hits_cap, recent_base, unknown_base, churn_ema_keep, churn_ema_weight, explore_share_step, explore_share_fall, explore_share_floor, explore_share_ceiling, additions_gain_weight, additions_gain_warmup.
    """

def hit_tie_level(p: float) -> float:
    """
    spin's topk_first tie level of a float32 ranking value p: p in quarters of [-1, 1], as 0, 1/8, ..., 7/8 (NaN: 0).
    """

class Predictor:
    """
    One request's block predictor over all of its indexer layers (include/spin/predict.h). Per step: select every layer, observe every row, then commit(accepted).
    """

    @property
    def name(self) -> str: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def request_id(self) -> int: ...

    @property
    def config(self) -> dict: ...

    @property
    def memory_bytes(self) -> int: ...

    def select(self, layer: int, step: int, num_entries: int, next_n: int = 1, visible_entries: numpy.typing.ArrayLike | None = None, true_topk: numpy.typing.ArrayLike | None = None, k: Annotated[NDArray, dict(writable=False)] | None = None, k_scale: Annotated[NDArray, dict(writable=False)] | None = None, q: Annotated[NDArray, dict(writable=False)] | None = None, w: Annotated[NDArray, dict(writable=False)] | None = None) -> NDArray[numpy.int32]:
        """
        Blocks to score for `layer` at decode `step` (int32, ascending: the union of the next_n rows' sets). num_entries: entries in the cache including the step's rows. visible_entries: optional int64 [next_n] override (V4); true_topk: int32 [next_n, topk] (oracle only). k, k_scale, q, w (all four or none; hisa, spin-hybrid): the layer's indexer keys as a key trace holds them (uint8 [>= num_entries, 128] e4m3, float32 [same] scales) and the step's query (uint8 [next_n, heads, 128], float32 [next_n, heads] weights with every scale folded in).
        """

    def row_blocks(self, layer: int, row: int) -> NDArray[numpy.int32]:
        """
        Row `row`'s own set from the last select of `layer` (int32, ascending).
        """

    def observe(self, layer: int, row: int, scores: Annotated[NDArray, dict(writable=False)], topk: numpy.typing.ArrayLike | None = None, scored_blocks: numpy.typing.ArrayLike | None = None) -> None:
        """
        Buffers row `row`'s indexer scores (float32 [>= visible entries], request-local; only the scored blocks' entries are read; -inf = scored, lowest; NaN/+inf raise) for the open step. topk: optional int32 [topk] positions from the top-k kernel, -1 padded. scored_blocks: what was scored, default the last select's blocks.
        """

    def commit(self, accepted: int = 0) -> None:
        """
        Closes the step: `accepted` draft tokens (0..next_n-1) were accepted; rows replay per config mtp_update.
        """

    def reset(self) -> None:
        """Forgets every observation (config and request id stay)."""

    def fork(self, request_id: int, shared_entries: int = -1) -> Predictor:
        """
        A copy for a request sharing this one's first shared_entries entries (-1: all).
        """

def make_predictor(name: str = 'spin', config: Mapping[str, object] | str | None = None, num_layers: int = 1, request_id: int = 0) -> Predictor:
    """
    Creates a predictor by name (predictor_names()) for one request with num_layers indexer layers. config: None, a dict or a 'key=value ...' string of PredictorConfig fields.
    """

class Serving:
    """
    The serving API (include/spin/serving.h): one object for the whole batch, state indexed by request slot, every buffer preallocated. Per step: select/observe every layer, then commit; add/drop slots as requests come and go. Exploration is keyed on the request id, not the slot.
    """

    def __init__(self, max_requests: int, num_layers: int, max_entries: int, predictor: str = 'spin', config: Mapping[str, object] | str | None = None, max_next_n: int = 1, compress_ratio: int = 1) -> None:
        """
        Allocates every slot's state for max_requests requests × num_layers indexer layers × the blocks of max_entries entries (contexts up to max_entries, up to max_next_n rows per step). predictor: any predictor_info() row with can_serve.
        """

    @property
    def max_blocks(self) -> int: ...

    @property
    def block_entries(self) -> int: ...

    @property
    def memory_bytes(self) -> int: ...

    @property
    def config(self) -> dict: ...

    def add(self, slot: int, request_id: int) -> None:
        """Starts request `request_id` in free `slot` (empty state)."""

    def drop(self, slot: int) -> None:
        """Frees `slot` (finished or preempted request)."""

    def active(self, slot: int) -> bool: ...

    def request_id(self, slot: int) -> int: ...

    def step(self, slot: int) -> int: ...

    def select(self, slots: numpy.typing.ArrayLike, layer: int, seq_lens: numpy.typing.ArrayLike, next_n: int = 1, out: NDArray | None = None) -> NDArray:
        """
        Blocks to score: int32 [batch · next_n, max_blocks], row i·next_n + j for row j of slots[i], ascending, -1 padded (every row of a request gets its rows' union). seq_lens: tokens cached per slot including the step's rows. Without `out` the result is a view of the object's buffer, valid until the next select.
        """

    def counts(self, rows: int) -> NDArray[numpy.int32]:
        """
        Valid blocks per row of the last select (int32 [rows], a view; rows at most the batch · next_n it wrote).
        """

    def observe(self, slots: numpy.typing.ArrayLike, layer: int, logits: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)] | None = None) -> None:
        """
        The rows' indexer logits, float32 [batch · next_n, cols >= visible], request-local positions (only the selected blocks are read), and optionally their top-k int32 [rows, >= topk].
        """

    def observe_scored(self, slots: numpy.typing.ArrayLike, layer: int, scored: Annotated[NDArray, dict(writable=False)], topk: Annotated[NDArray, dict(writable=False)] | None = None) -> None:
        """
        Like observe, with only the scored blocks' logits: float32 [rows, >= count · block_entries], block c of the row's select output at columns [c·E, (c+1)·E).
        """

    def commit(self, slots: numpy.typing.ArrayLike, accepted: numpy.typing.ArrayLike | None = None) -> None:
        """
        Closes the step of every slot: accepted int32 [batch] draft tokens (None: all 0).
        """

    def prefill(self, slots: numpy.typing.ArrayLike, layer: int, seq_lens: numpy.typing.ArrayLike, logits: Annotated[NDArray, dict(writable=False)]) -> None:
        """
        A prompt's full indexer row per slot (float32 [batch, >= seq_len entries]) for `layer`; commit(slots) after the last layer. Not a decode step.
        """

class TraceReader:
    """
    A validated trace file (include/spin/trace.h): read into memory up to 256 MiB, memory-mapped above; tensors are zero-copy read-only views. A mapped file truncated while open raises DataLoss at the next access.
    """

    @staticmethod
    def open(path: str, copy_below_bytes: int = 268435456) -> TraceReader:
        """
        Opens and validates a trace file (read into memory up to copy_below_bytes, mapped above).
        """

    @property
    def meta(self) -> dict: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def steps(self) -> int: ...

    @property
    def path(self) -> str: ...

    @property
    def file_size(self) -> int: ...

    @property
    def mapped(self) -> bool:
        """
        Whether the file is memory-mapped (above 256 MiB) rather than read into memory.
        """

    def entries(self, layer: int) -> int: ...

    def visible_entries(self, step: int, row: int) -> int: ...

    @property
    def ctx_len(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def accepted(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]: ...

    def k(self, layer: int) -> Annotated[NDArray[numpy.uint8], dict(writable=False)]:
        """e4m3 key codes, uint8 [entries, 128] (a view)."""

    def k_scale(self, layer: int) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """key scales, float32 [entries] (a view)."""

    def q(self, layer: int) -> Annotated[NDArray[numpy.uint8], dict(writable=False)]:
        """e4m3 query codes, uint8 [steps, next_n, heads, 128] (a view)."""

    def w(self, layer: int) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """head weights, float32 [steps, next_n, heads] (a view)."""

    @property
    def kind(self) -> str: ...

    def scores(self, layer: int) -> Annotated[NDArray[numpy.float32], dict(writable=False)]:
        """A score trace's logits, float32 [steps, next_n, entries] (a view)."""

    def to_trace(self) -> Trace:
        """Copies the whole trace into memory."""

    def describe(self) -> str: ...

class Trace:
    """An in-memory trace (generated, or built with make_trace)."""

    @property
    def meta(self) -> dict: ...

    @property
    def num_layers(self) -> int: ...

    @property
    def steps(self) -> int: ...

    def entries(self, layer: int) -> int: ...

    @property
    def ctx_len(self) -> Annotated[NDArray[numpy.int64], dict(writable=False)]: ...

    @property
    def accepted(self) -> Annotated[NDArray[numpy.int32], dict(writable=False)]: ...

    def k(self, layer: int) -> Annotated[NDArray[numpy.uint8], dict(writable=False)]: ...

    def k_scale(self, layer: int) -> Annotated[NDArray[numpy.float32], dict(writable=False)]: ...

    def q(self, layer: int) -> Annotated[NDArray[numpy.uint8], dict(writable=False)]: ...

    def w(self, layer: int) -> Annotated[NDArray[numpy.float32], dict(writable=False)]: ...

    def write(self, path: str) -> None:
        """Validates, then writes atomically (spin/trace.h schema)."""

def open_trace(path: str, copy_below_bytes: int = 268435456) -> TraceReader:
    """
    Opens and validates a trace file: a TraceReader, read into memory up to copy_below_bytes (256 MiB), memory-mapped above (a mapped file truncated while open raises DataLoss).
    """

def make_trace(meta: dict, ctx_len: numpy.typing.ArrayLike, layers: list[dict[str, Annotated[NDArray, dict(writable=False)]]], accepted: numpy.typing.ArrayLike | None = None) -> Trace:
    """
    Builds a validated in-memory Trace: meta {model, num_layers, next_n, num_heads, page_size, topk, compress_ratio, extra}, ctx_len int64 [steps], layers [{k, k_scale, q, w[, k_draft, k_draft_scale]}], accepted int32 [steps] (MTP).
    """

def write_score_trace(meta: dict, ctx_len: numpy.typing.ArrayLike, scores: list[Annotated[NDArray[numpy.float32], dict(writable=False)]], path: str, accepted: numpy.typing.ArrayLike | None = None) -> None:
    """
    Validates and writes a score trace (kind=scores) atomically: meta {model, next_n, page_size, topk, compress_ratio, extra}, ctx_len int64 [steps], scores [float32 [steps, next_n, entries] per layer], accepted int32 [steps] (next_n > 1).
    """

def write_trace(trace: Trace, path: str) -> None: ...

def scenario_names() -> list[str]:
    """The built-in workload scenarios."""

def workload_params(scenario: str) -> str:
    """A scenario's generator parameters as 'key=value ...'."""

def generate_workload(scenario: str | None = None, **params) -> Trace:
    """
    Generates a synthetic trace (include/spin/lab/workload.h): a scenario name and/or generator fields as keywords (prompt_tokens=..., steps=..., layers=..., next_n=..., seed=...).
    """

class ScoredTrace:
    """
    A trace with its all-keep ground truth (the real indexer and top-k over every block), shared by every replay of it.
    """

    @property
    def path(self) -> str: ...

    def facts(self, block_entries: int = 64) -> dict: ...

def score_trace(trace: str | Trace | TraceReader, threads: int = 0) -> ScoredTrace:
    """
    The all-keep truth of a trace (a path, Trace or TraceReader): a key trace scored by the indexer over every block, a score trace's recorded scores; top-k by the real kernel.
    """

def replay(scored: ScoredTrace, predictor: str = 'spin', config: Mapping[str, object] | str | None = None, open_loop: bool = False, warm_start: bool = True, keep_topk: bool = False) -> dict:
    """
    Replays a ScoredTrace through a predictor; returns the metrics dict of `spin replay --json` (recall_mean, miss_p50/p99/max, block_recall_mean, sparsity_mean, ...), plus 'topk' (per layer int32 [steps · next_n, topk]) with keep_topk.
    """

def diagnose(model: str = 'deepseek-v3.2', gpu: str = 'h200', context: int = 131072, batch: int = 1, next_n: int = 1, sparsities: Sequence[float] | None = None, other_ms: float = 0.0) -> dict:
    """
    The paper model of one GPU decode step (include/spin/lab/diagnose.h, `spin diagnose --json`): indexer / top-k / attention ms, the indexer's share and spin's gain per sparsity, with sources. gpu: h100, h200, b200.
    """

def indexer_impls() -> list[str]:
    """Indexer implementations this CPU runs, fastest first."""

def cpu_summary() -> str:
    """
    The CPU model and the kernel ISAs this process may use, with any SPIN_CPU cap (include/spin/cpu.h).
    """

def indexer_scores(key_cache: Annotated[NDArray, dict(writable=False)], block_table: numpy.typing.ArrayLike, context_lens: numpy.typing.ArrayLike, q: Annotated[NDArray, dict(writable=False)], weights: Annotated[NDArray, dict(writable=False)], page_size: int = 64, compress_ratio: int = 1, block_ids: numpy.typing.ArrayLike | None = None, block_offsets: numpy.typing.ArrayLike | None = None, block_pages: int = 1, logits_cols: int = -1, out: NDArray | None = None, impl: str = 'auto', threads: int = 0) -> NDArray:
    """
    Lightning-indexer logits over the paged fp8 cache (include/spin/indexer.h): key_cache uint8 pages [num_pages, page_size·132] (e4m3 values then fp32 scales), block_table int32 [batch, max_pages], context_lens int64 [batch], q uint8 [batch, next_n, heads, 128], weights float32 [batch, next_n, heads]. Optional block mask: block_ids int32 (sorted per request) with block_offsets int32 [batch + 1]. Returns float32 [batch·next_n, cols], -inf where not scored.
    """

INDEXER_ENTRY_BYTES: int = 132

def visible_entries(context_lens: numpy.typing.ArrayLike, next_n: int = 1, compress_ratio: int = 1) -> NDArray[numpy.int64]:
    """
    Entries each row of a step sees (include/spin/geometry.h): int64 [batch·next_n], row j of request i at i·next_n + j, max(0, context_len - next_n + j + 1) // compress_ratio. context_lens: tokens cached per request including the step's next_n rows.
    """

def topk(scores: Annotated[NDArray, dict(writable=False)], k: int, visible_entries: numpy.typing.ArrayLike | None = None, block_ids: numpy.typing.ArrayLike | None = None, block_offsets: numpy.typing.ArrayLike | None = None, rows_per_mask: int = 1, block_entries: int = 0, out: NDArray | None = None, threads: int = 0) -> NDArray:
    """
    Per-row top-k (include/spin/topk.h): int32 [rows, k] positions, ascending, -1 padded; ties to the lower position. With a block mask only the scored blocks' entries are read.
    """
