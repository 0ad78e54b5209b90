"""spin_dsa — SPIN for DeepSeek Sparse Attention: predict which KV blocks the lightning indexer
must score, from the indexer's own past scores (the C++ library of this repository, bound with
nanobind).

Arrays go in and out without copies: numpy arrays (buffer protocol) and torch CPU tensors
(DLPack) of the exact dtype the library reads; a wrong dtype, layout or device is
:class:`InvalidType` (a TypeError and a SpinError), never a silent conversion. Small index arrays
(slots, seq_lens, accepted, block ids, offsets) may be lists or other integer dtypes: those are
copied once and range-checked. Library errors are raised as the classes of ``spin_dsa._errors`` (all
derive from :class:`SpinError`) with the library's messages.

Research API (one object per request)::

    p = spin_dsa.make_predictor("spin", {"target_sparsity": 0.5}, num_layers=4, request_id=7)
    blocks = p.select(layer, step, num_entries, next_n)   # int32 block ids, ascending
    p.observe(layer, row, scores)                          # float32 [entries], -inf = unscored
    p.commit(accepted)

Serving API (one object per batch, include/spin/serving.h): :class:`Serving`.
Traces, replay, workloads: :func:`open_trace`, :func:`score_trace`, :func:`replay`,
:func:`generate_workload`, :func:`write_score_trace`. Kernels: :func:`indexer_scores`, :func:`topk`.
Cache geometry: :func:`visible_entries` (the entries each row of a step sees) and
``INDEXER_ENTRY_BYTES`` (one indexer key in a cache page: 128 e4m3 values and a 4-byte scale).
The vLLM plugin: ``spin_dsa.vllm`` (README "Use spin in vLLM"; imports vLLM only when loaded).
"""

from ._errors import (DataLoss, FailedPrecondition, InvalidArgument, InvalidType, IoError,
                      OutOfRange, ResourceExhausted, SpinError)
from ._core import (INDEXER_ENTRY_BYTES, Predictor, ScoredTrace, Serving, Trace, TraceReader,
                    budget_blocks, check_config, cpu_summary, default_config, diagnose, generate_workload,
                    indexer_impls, indexer_scores, make_predictor, make_trace, open_trace, predictor_info,
                    predictor_names, preset_names, replay, scenario_names, score_trace, topk, visible_entries,
                    workload_params, write_score_trace, write_trace)

__version__ = "0.1.0"

__all__ = [
    "SpinError", "InvalidArgument", "InvalidType", "OutOfRange", "ResourceExhausted", "FailedPrecondition",
    "DataLoss", "IoError",
    "Predictor", "make_predictor", "predictor_info", "predictor_names", "default_config", "check_config",
    "preset_names",
    "budget_blocks",
    "Serving",
    "TraceReader", "Trace", "ScoredTrace", "open_trace", "make_trace", "write_trace",
    "write_score_trace",
    "score_trace", "replay", "generate_workload", "scenario_names", "workload_params",
    "indexer_scores", "topk", "indexer_impls", "cpu_summary", "diagnose",
    "visible_entries", "INDEXER_ENTRY_BYTES",
]
