"""The CUDA-path harness (cuda_path.py) with spin off: vLLM's own ``sparse_attn_indexer`` run on
CPU tensors, kernels stood in, must give the dense top-k of every row in every decode layout.

Per layout: the output equals ``dense_reference_topk`` as sets per row (exact ties aside), the
paged-logits stand-in is asked for exactly the pages the decode rows see, the logits each
stand-in returns equal the reference scores over the visible entries, rows past the step are
untouched, and every stand-in's shape contract holds (a broken one raises). Also: the custom-op
wrapper gives the same buffer, the K-insert path writes the cache bytes, the metadata equals what
vLLM's builder code makes, and the candidate-block mask stand-in keeps only the listed blocks.
"""
import dataclasses
import types

import numpy as np
import pytest

pytest.importorskip("vllm", reason="the CUDA-path harness runs vLLM's own indexer code")
import torch  # noqa: E402
from vllm.model_executor.layers.sparse_attn_indexer import sparse_attn_indexer  # noqa: E402
from vllm.v1.attention.backends.mla import indexer as vidx  # noqa: E402

import cuda_path as cp  # noqa: E402

# name → make_case arguments. mixed forces vLLM's chunker into two request chunks, the second
# split on its queries (skip_kv_gather: the gathered K is reused from the workspace).
LAYOUTS = {
    "native-n1": ("native", dict(seed=11, batch=3, next_n=1, topk=64)),
    "native-n2": ("native", dict(seed=12, batch=2, next_n=2, topk=128)),
    "native-n3": ("native", dict(seed=13, batch=2, next_n=3, topk=64)),
    "flattened-n3": ("flattened", dict(seed=14, batch=2, next_n=3, topk=64)),
    "padded-n2": ("padded", dict(seed=15, batch=3, next_n=2, topk=64)),
    "mixed-2d2p": ("mixed", dict(seed=16, batch=2, next_n=2, topk=64, num_prefills=2,
                                 prefill_len=[40, 72], prefill_context=[300, 500],
                                 prefill_workspace=600, max_logits_bytes=4 * 32 * 600)),
}


def _run(case, **kwargs):
    with cp.cuda_path_on_cpu() as stats:
        got = cp.run_indexer(sparse_attn_indexer, case, **kwargs)
    return got, stats


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_layout_matches_dense_reference(name, figures):
    layout, kw = LAYOUTS[name]
    case = cp.make_case(layout, **kw)
    got, stats = _run(case)
    ref = cp.dense_reference_topk(case)
    bad = ref.mismatches(got)
    assert not bad, f"{name}: {len(bad)} rows differ: {bad[:4]}"

    # the decode rows' pages, each asked for once, and nothing else
    assert stats.calls["fp8_fp4_paged_mqa_logits"] == 1
    assert stats.page_reads() == case.expected_page_reads()
    assert stats.pages_read == sum(-(-int(case.row_visible[t]) // case.page_size)
                                   for t in case.decode_rows())

    # the logits the stand-ins returned are the reference scores over the visible entries
    paged = stats.paged[0]["logits_raw"]
    for t, kr in zip(case.decode_rows(), case.decode_kernel_rows()):
        v = int(case.row_visible[t])
        np.testing.assert_allclose(paged[kr, :v].numpy(), ref.scores[t], rtol=1e-6,
                                   atol=1e-6 * np.abs(ref.scores[t]).max())
        assert bool((paged[kr, v:] == cp.STALE_LOGIT).all())
    chunks = case.metadata.prefill.chunks if case.metadata.prefill else []
    assert len(stats.ragged) == len(chunks)
    for chunk, call in zip(chunks, stats.ragged):
        for m, t in enumerate(range(chunk.token_start, chunk.token_end)):
            ks, ke = int(call["ks"][m]), int(call["ke"][m])
            assert ke - ks == case.row_visible[t]
            np.testing.assert_allclose(call["logits_raw"][m, ks:ke].numpy(), ref.scores[t],
                                       rtol=1e-6, atol=1e-6 * np.abs(ref.scores[t]).max())

    # which primitives ran, and that nothing wrote past this step's (padded) rows
    if layout == "padded":
        assert case.metadata.decode.requires_padding
        assert stats.calls["pack_seq_triton"] == stats.calls["unpack_seq_triton"] == 1
    else:
        assert stats.calls["pack_seq_triton"] == 0
    if layout == "mixed":
        assert len(chunks) >= 3 and any(c.skip_kv_gather for c in chunks)
        assert stats.calls["cp_gather_indexer_k_quant_cache"] == sum(
            not c.skip_kv_gather for c in chunks)
        assert stats.calls["top_k_per_row_prefill"] == len(chunks)
    rows = case.hidden_states.shape[0]
    assert bool((case.topk_indices_buffer[rows:] == cp.SENTINEL).all())
    figures.append(f"cuda path {name}: {case.num_tokens} rows = dense top-{case.topk} sets; "
                   f"{stats.pages_read} (row, page) reads; primitives {dict(stats.calls)}")


def test_custom_op_and_k_insert():
    """torch.ops.vllm.sparse_attn_indexer (what SparseAttnIndexer.forward_cuda calls) gives the
    function's buffer; with skip_k_cache_insert=False the insert stand-in rebuilds the cache
    bytes of this step's keys from case.k through the slot mapping."""
    case = cp.make_case("mixed", seed=21, batch=2, next_n=2, num_prefills=1, prefill_len=48,
                        prefill_context=200, decode_layout="flattened")
    ref = cp.dense_reference_topk(case)
    plain, _ = _run(case)
    op, stats = _run_op(case)
    assert torch.equal(plain, op) and not ref.mismatches(op)
    cache = case.cache_without_step_keys()
    assert not torch.equal(cache, case.kv_cache)
    got, stats = _run(case, kv_cache=cache, skip_k_cache_insert=False, k=case.k)
    assert stats.inserts == [dict(tokens=case.k.shape[0], written=case.num_tokens)]
    assert torch.equal(cache, case.kv_cache)
    assert torch.equal(got, plain)


def _run_op(case):
    with cp.cuda_path_on_cpu() as stats:
        got = cp.run_indexer(torch.ops.vllm.sparse_attn_indexer, case)
    return got, stats


@pytest.mark.parametrize("layout,kw", [
    ("native", dict(next_n=1, batch=3)), ("native", dict(next_n=3)),
    ("flattened", dict(next_n=3, batch=3)), ("padded", dict(next_n=2, batch=3)),
    ("padded", dict(next_n=3, batch=3, decode_lens=[3, 1, 3])),
])
def test_decode_metadata_is_vllm_builders(layout, kw):
    """Decode tensors equal DeepseekV32IndexerMetadataBuilder._prepare_decode_tensors (vLLM's
    code, on a stand-in builder). Flattened goes through its variable-length branch (plain torch),
    which makes the same layout as the uniform Triton kernel it uses otherwise."""
    case = cp.make_case(layout, seed=31, **kw)
    md = case.metadata.decode
    nd = case.num_decodes
    d = torch.tensor(case.query_lens[:nd], dtype=torch.int32)
    n_tok = case.num_decode_tokens
    width = case.block_table.shape[1]
    fake = types.SimpleNamespace(
        vllm_config=types.SimpleNamespace(speculative_config=None),
        supports_varlen=layout == "flattened",
        decode_seq_lens_buffer=torch.zeros(256, dtype=torch.int32),
        expanded_block_table_buffer=torch.zeros((256, width), dtype=torch.int32),
        decode_lens_buffer=torch.zeros(256, dtype=torch.int32),
        arange_buffer=torch.arange(256, dtype=torch.int32),
        offsets_buffer=torch.arange(case.next_n, dtype=torch.int32))
    qsl = torch.cumsum(d, 0, dtype=torch.int32) - d
    seq_lens, table, dl, batch, padding = vidx.DeepseekV32IndexerMetadataBuilder.\
        _prepare_decode_tensors(fake, seq_lens=case.metadata.seq_lens[:nd],
                                block_table=case.block_table[:nd], decode_lens=d,
                                decode_lens_cpu=d, query_start_loc=qsl, num_decodes=nd,
                                num_decode_tokens=n_tok, use_native=layout != "flattened",
                                next_n=case.next_n, max_decode_len=int(d.max()))
    if seq_lens.dim() == 1:
        seq_lens = seq_lens.unsqueeze(-1)
    assert torch.equal(seq_lens, md.seq_lens)
    assert torch.equal(table, md.block_table)
    assert torch.equal(dl, md.decode_lens)
    assert padding == md.requires_padding
    assert batch == (n_tok if layout == "flattened" else nd)


def _build_chunk_kernel(query_start_loc, uncompressed_seq_lens, cu_seq_lens, row_start_cu,
                        token_to_seq, ks, ke, qs_start, qs_stop, dcp_rank, dcp_world,
                        interleave, *, num_reqs, COMPRESS_RATIO, positions=None):
    """BuildPrefillChunkMetadataKernel (Triton), transcribed for DCP off and, from vLLM 0.34,
    without ShardQ's token positions."""
    assert dcp_world == 1 and COMPRESS_RATIO == 1 and positions is None
    for b in range(num_reqs):
        q0, q1 = int(query_start_loc[b]), int(query_start_loc[b + 1])
        start_pos = int(uncompressed_seq_lens[b]) - (q1 - q0)
        for off in range(q1 - q0):
            if qs_start <= q0 + off < qs_stop:
                ks[q0 + off - qs_start] = row_start_cu[b]
                ke[q0 + off - qs_start] = row_start_cu[b] + start_pos + 1 + off
        token_to_seq[int(cu_seq_lens[b]):int(cu_seq_lens[b + 1])] = b


def test_prefill_chunks_are_vllm_builders(monkeypatch):
    """Every chunk equals vLLM's build_prefill_chunk_metadata on the same split (its Triton
    kernel transcribed above; the slicing, cumsums and token bounds around it are vLLM's)."""
    _, kw = LAYOUTS["mixed-2d2p"]
    case = cp.make_case("mixed", **kw)
    monkeypatch.setattr(vidx, "_BUILD_PREFILL_CHUNK_METADATA_KERNEL", _build_chunk_kernel)
    seq = torch.tensor(case.seq_lens, dtype=torch.int32)
    qsl = torch.tensor(np.concatenate([[0], np.cumsum(case.query_lens)]), dtype=torch.int32)
    nd = case.num_decodes
    specs = vidx.DeepseekV32IndexerMetadataBuilder._split_indexer_prefill_chunks(
        seq[nd:], torch.diff(qsl[nd:]), kw["prefill_workspace"], kw["max_logits_bytes"],
        request_offset=nd)
    chunks = case.metadata.prefill.chunks
    assert len(chunks) == len(specs)
    for ours, (rs, qs) in zip(chunks, specs):
        theirs = vidx.build_prefill_chunk_metadata(
            rs.start, rs.stop, qsl, qsl, seq, seq, seq, case.block_table, 1, query_slice=qs,
            skip_kv_gather=qs.start > 0)
        for f in dataclasses.fields(theirs):
            a, b = getattr(ours, f.name), getattr(theirs, f.name)
            same = torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b
            assert same, f"chunk {rs}/{qs}: {f.name} {a} != {b}"


def test_candidate_mask_keeps_only_listed_blocks():
    """With candidate_blocks (spin's GPU path), vLLM masks the logits to the listed
    request-local blocks before its top-k, decode rows and prefill rows alike: the result is the
    dense top-k over the listed blocks' entries."""
    case = cp.make_case("mixed", seed=41, batch=2, next_n=2, num_prefills=1, prefill_len=24,
                        prefill_context=400, topk=64)
    rng = np.random.default_rng(41)
    rows = case.hidden_states.shape[0]
    cand = torch.full((rows, 16), -1, dtype=torch.int32)
    allowed = []
    for t in range(case.num_tokens):
        v = int(case.row_visible[t])
        n_blocks = -(-v // 64)
        keep = {n_blocks - 1} | set(rng.choice(n_blocks - 1, size=min(n_blocks - 1, 3),
                                               replace=False).tolist())
        cand[t, :len(keep)] = torch.tensor(sorted(keep), dtype=torch.int32)
        mask = np.isin(np.arange(v) // 64, sorted(keep))
        assert mask.sum() >= case.topk
        allowed.append(mask)
    ref = cp.dense_reference_topk(case).restrict(allowed)
    got, stats = _run(case, candidate_blocks=cand, candidate_block_size=64)
    bad = ref.mismatches(got)
    assert not bad, bad[:4]
    assert stats.calls["apply_candidate_mask"] == 2  # one prefill chunk, one decode call


@pytest.mark.xfail(strict=True, reason="vLLM 0.32 glue: the padded decode path packs q but "
                   "passes weights[:B·max_len] unpacked, so a request after a shorter one is "
                   "scored with another row's weights (only trailing padding, which vLLM's "
                   "builder makes, is safe)")
def test_padded_short_request_before_full_one():
    case = cp.make_case("padded", seed=51, batch=3, next_n=3, decode_lens=[3, 0, 3])
    got, _ = _run(case)
    assert not cp.dense_reference_topk(case).mismatches(got)


def test_candidate_select_pins_newest_block_and_keeps_topk():
    """candidate_write=True (V4.1's candidate-source layer): the select stand-in lists, per decode
    row, the newest visible block and the blocks with the largest logit; the top-k is unmasked."""
    case = cp.make_case("native", seed=61, batch=2, next_n=2, topk=64)
    ref = cp.dense_reference_topk(case)
    out = torch.full((case.num_tokens, 4), -9, dtype=torch.int32)
    got, stats = _run(case, candidate_blocks=out, candidate_block_size=64, candidate_write=True)
    assert not ref.mismatches(got)
    assert stats.calls["select_candidate_blocks"] == 1
    for t in case.decode_rows():
        v = int(case.row_visible[t])
        newest = (v - 1) // 64
        best = [float(ref.scores[t][b * 64:(b + 1) * 64].max()) for b in range(newest)]
        want = {newest} | set(np.argsort(best)[::-1][:3].tolist())
        assert set(out[t].tolist()) == want, f"row {t}"
