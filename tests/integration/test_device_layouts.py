"""spin's GPU path in every decode layout vLLM builds, through vLLM's own CUDA indexer function
on CPU tensors (the harness cuda_path.py: kernels stood in, vLLM's glue real, stale columns past
a row's length left holding 1e30 as DeepGEMM leaves them).

- native and flattened rows: the decode top-k equals the library's (spin_dsa.Serving + its
  block-masked indexer + its masked top-k), the logits kernel is asked for the chosen pages only,
  and vLLM's metadata is left as it was;
- a mixed batch: the prompts' top-k is vLLM's own, bit for bit; the decodes' is the library's;
- vLLM's padded path: the step runs vLLM's dense decode, bit for bit, and is counted;
- warm start: a prompt that ends in the step is observed as the library's prefill.
"""
import numpy as np
import pytest
import torch

from host_sync import no_host_sync  # noqa: E402

import spin_dsa
import spin_dsa.vllm
from spin_dsa.vllm import state
from spin_dsa.vllm.lifecycle import request_key
from cuda_path import DEFAULT_PREFIX, KernelStats, cuda_path_on_cpu, make_case, run_indexer
from test_device_path import MAX_LEN, World, device_path_on, model_dir  # noqa: F401  (fixtures)

SPIN = {"config": {"target_sparsity": 0.5}, "min_context": 0}


def _plugin(model_dir, case, spin=SPIN):
    """The plugin with one spin layer (layer 0) over the case's cache, the runtime, the wrapper."""
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    from vllm.config import set_current_vllm_config
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
    import types

    world = World(model_dir, case.next_n, spin)
    spin_dsa.vllm.register()
    state.reset()
    with set_current_vllm_config(world.vc):
        SparseAttnIndexer(types.SimpleNamespace(prefix=DEFAULT_PREFIX, kv_cache=case.kv_cache),
                          128, "ue8m0", case.topk, 128, MAX_LEN, MAX_LEN,
                          case.topk_indices_buffer, skip_k_cache_insert=True)
    return world.vc, state.runtime(), spin_dsa.vllm.wrap_indexer_function(sai.sparse_attn_indexer)


def _ids(case):
    return [f"req-{i}" for i in range(len(case.seq_lens))]


def _library(case, rt):
    """The host library with the plugin's slots and keys, one layer."""
    lib = spin_dsa.Serving(rt.slots.capacity, 1, MAX_LEN, predictor="spin",
                           config=dict(target_sparsity=0.5, page_size=case.page_size,
                                       topk=case.topk), max_next_n=max(case.next_n, 1))
    for rid in _ids(case):
        lib.add(rt.slots[rid], request_key(rid))
    return lib


def _library_decode(case, rt, lib):
    """The library's decode step on the case's decode requests: (logits, top-k) per token row."""
    nd, n = case.num_decodes, case.next_n
    slots = np.array([rt.slots[r] for r in _ids(case)[:nd]], np.int32)
    seq = np.array(case.seq_lens[:nd], np.int64)
    blocks = lib.select(slots, 0, seq, n)
    counts = lib.counts(nd * n)
    ids = [blocks[b * n, :counts[b * n]] for b in range(nd)]
    offsets = np.cumsum([0] + [x.size for x in ids]).astype(np.int32)
    ids = np.concatenate(ids).astype(np.int32)
    rows = nd * n
    q = case.q_quant[:rows].view(torch.uint8).numpy().reshape(nd, n, case.heads, 128)
    w = case.weights[:rows].numpy().reshape(nd, n, case.heads)
    cache = case.kv_cache.numpy().reshape(case.kv_cache.shape[0], -1)
    logits = spin_dsa.indexer_scores(cache, case.block_table[:nd].numpy(), seq, q, w,
                                     page_size=case.page_size, block_ids=ids,
                                     block_offsets=offsets)
    visible = (seq[:, None] - n + 1 + np.arange(n)).reshape(-1)
    top = spin_dsa.topk(logits, case.topk, visible_entries=visible, block_ids=ids,
                        block_offsets=offsets, rows_per_mask=n, block_entries=case.page_size)
    lib.observe(slots, 0, logits, top)
    return logits, top, ids, offsets


def _same_scores(got, want, logits):
    """Top-k rows equal up to exact ties: the same number of entries and the same multiset of
    scores (vLLM's torch top-k and spin's break exact ties differently; the harness's keys are
    integers, so ties happen)."""
    bad = []
    for r in range(want.shape[0]):
        g, w = got[r][got[r] >= 0].numpy(), want[r][want[r] >= 0]
        if g.size != w.size or not np.array_equal(np.sort(logits[r][g]), np.sort(logits[r][w])):
            bad.append(r)
    return bad


def _chosen_page_reads(case, ids, offsets):
    """(compacted length, physical pages) each decode row's logits must read."""
    out = []
    for t in range(case.num_decode_tokens):
        b, visible = int(case.row_req[t]), int(case.row_visible[t])
        mine = ids[offsets[b]:offsets[b + 1]].astype(np.int64)
        length = int(np.clip(visible - mine * 64, 0, 64).sum())
        if length:
            pages = case.block_table[b].numpy()[mine][:-(-length // 64)]
            out.append((length, tuple(int(p) for p in pages)))
    return sorted(out)


def _step(rt, case, prompt_ends=()):
    rt.begin_step(_ids(case), list(case.query_lens), list(prompt_ends))


@pytest.mark.parametrize("layout,next_n", [("native", 1), ("native", 3), ("flattened", 3)])
def test_decode_rows_equal_the_library(model_dir, layout, next_n, figures):
    case = make_case(layout, seed=next_n, batch=3, next_n=next_n, context=(700, 2000))
    vc, rt, fn = _plugin(model_dir, case)
    _step(rt, case)
    lib = _library(case, rt)
    md_before = case.metadata
    decode_before = (md_before.decode.block_table.clone(), md_before.decode.seq_lens.clone())
    with cuda_path_on_cpu(KernelStats()) as stats:
        got = run_indexer(fn, case, vllm_config=vc)
    logits, want, ids, offsets = _library_decode(case, rt, lib)
    rows = case.num_decode_tokens
    assert _same_scores(got[:rows], want, logits) == []
    # the kernel was asked, row by row, for the chosen pages of the row's request and no others
    assert sorted(stats.page_reads()) == _chosen_page_reads(case, ids, offsets)
    assert case.metadata is md_before  # vLLM's metadata object, untouched
    assert torch.equal(md_before.decode.block_table, decode_before[0])
    assert torch.equal(md_before.decode.seq_lens, decode_before[1])
    visible = sum(-(-L // 64) for L in case.seq_lens)
    figures.append(f"device path, {layout} rows next_n={next_n}: top-k equal to the library "
                   f"(up to exact ties) in {rows}/{rows} rows; the logits kernel read "
                   f"{stats.pages_read} pages, {int(offsets[-1])} of {visible} blocks chosen")


def test_a_mixed_batch_keeps_vllms_prompts_and_spins_decodes(model_dir):
    case = make_case("mixed", seed=5, batch=2, next_n=3, context=(900, 1500), num_prefills=2,
                     prefill_len=(120, 300), prefill_context=(0, 700))
    vc, rt, fn = _plugin(model_dir, case)
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    with cuda_path_on_cpu():
        plain = run_indexer(sai.sparse_attn_indexer.__wrapped__
                            if hasattr(sai.sparse_attn_indexer, "__wrapped__")
                            else sai.sparse_attn_indexer, case, vllm_config=vc)
    _step(rt, case)
    lib = _library(case, rt)
    with cuda_path_on_cpu():
        got = run_indexer(fn, case, vllm_config=vc)
    rows = case.num_decode_tokens
    assert torch.equal(got[rows:], plain[rows:])  # the prompts: vLLM's result, bit for bit
    logits, want, _, _ = _library_decode(case, rt, lib)
    assert _same_scores(got[:rows], want, logits) == []


def test_vllms_padded_path_runs_dense_and_is_counted(model_dir):
    case = make_case("padded", seed=7, batch=3, next_n=3, context=(600, 1200))
    vc, rt, fn = _plugin(model_dir, case)
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    with cuda_path_on_cpu():
        plain = run_indexer(sai.sparse_attn_indexer, case, vllm_config=vc)
    _step(rt, case)
    with cuda_path_on_cpu():
        got = run_indexer(fn, case, vllm_config=vc)
    assert torch.equal(got, plain)
    assert rt.stats()["fallback_steps"] == 1 and rt.stats()["decode_rows"] == 0


def test_a_prompt_ending_in_the_step_is_observed_as_the_librarys_prefill(model_dir):
    """Warm start: the step that completes a prompt scores its last row over every block and
    observes it as its prefill; a later select equals the library's after Serving.prefill."""
    case = make_case("mixed", seed=11, batch=1, next_n=1, context=(700, 900), num_prefills=2,
                     prefill_len=(400, 700), prefill_context=0)
    vc, rt, fn = _plugin(model_dir, case, dict(SPIN, warm_start=True))
    ends = [1, 2]  # both prompts complete in this step
    _step(rt, case, ends)
    lib = _library(case, rt)
    observe = rt._observe_prompts

    def observe_without_host_data(*args):  # the prompts' rows were staged once, in begin_step
        with no_host_sync(from_host=True):
            return observe(*args)

    rt._observe_prompts = observe_without_host_data
    with cuda_path_on_cpu():
        run_indexer(fn, case, vllm_config=vc)
    _library_decode(case, rt, lib)
    ids = _ids(case)
    slots = np.array([rt.slots[ids[i]] for i in ends], np.int32)
    seq = np.array([case.seq_lens[i] for i in ends], np.int64)
    last = np.cumsum(case.query_lens)[ends] - 1
    q = case.q_quant[last].view(torch.uint8).numpy()[:, None]
    w = case.weights[last].numpy()[:, None]
    cache = case.kv_cache.numpy().reshape(case.kv_cache.shape[0], -1)
    full = spin_dsa.indexer_scores(cache, case.block_table[ends].numpy(), seq, q, w,
                                   page_size=case.page_size)
    lib.prefill(slots, 0, seq, full)
    every = np.array([rt.slots[r] for r in ids], np.int32)
    lib.commit(every[[0] + ends], np.zeros(3, np.int32))
    rt.serving.commit(torch.from_numpy(every).long(), torch.zeros(3, dtype=torch.int64))
    later = seq + 200
    want = lib.select(slots, 0, later, 1)
    want_counts = lib.counts(len(ends))
    got, counts = rt.serving.select(torch.from_numpy(slots).long(), 0,
                                    torch.from_numpy(later), 1)
    for b in range(len(ends)):
        assert got[b, :int(counts[b])].tolist() == want[b, :want_counts[b]].tolist()


def test_a_recorded_trace_starts_with_the_prompts_last_row(model_dir, tmp_path):
    """Record mode: a recorded request whose prompt ends in the step gets trace step 0 = that
    prompt's last row over every entry (ctx_len = prompt + next_n - 1, the draft rows -inf,
    accepted 0), as the host path records it and replay's warm start reads it."""
    case = make_case("mixed", seed=11, batch=1, next_n=3, context=(700, 900), num_prefills=2,
                     prefill_len=(400, 700), prefill_context=0)
    record = {"dir": str(tmp_path), "requests": ["req-2"], "layers": [0]}  # the one spin layer
    vc, rt, fn = _plugin(model_dir, case, dict(SPIN, warm_start=True, record=record))
    _step(rt, case, [1, 2])
    with cuda_path_on_cpu():
        run_indexer(fn, case, vllm_config=vc)
    rt.drop("req-2")  # writes its trace: the one step recorded
    trace = spin_dsa.open_trace(rt.recorder.written[0])
    P, n = int(case.seq_lens[2]), case.next_n
    np.testing.assert_array_equal(trace.ctx_len, [P + n - 1])
    np.testing.assert_array_equal(trace.accepted, [0])
    last = int(np.cumsum(case.query_lens)[2]) - 1
    cache = case.kv_cache.numpy().reshape(case.kv_cache.shape[0], -1)
    full = spin_dsa.indexer_scores(cache, case.block_table[2:3].numpy(), np.array([P], np.int64),
                                   case.q_quant[last:last + 1].view(torch.uint8).numpy()[:, None],
                                   case.weights[last:last + 1].numpy()[:, None],
                                   page_size=case.page_size)
    row = trace.scores(0)[0]
    np.testing.assert_allclose(row[0, :P], full[0, :P], rtol=1e-5,
                               atol=1e-5 * float(np.abs(full[0, :P]).max()))
    assert np.all(np.isneginf(row[1:]))
