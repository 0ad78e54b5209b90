"""spin's GPU path inside vLLM (spin_dsa.vllm.device_path), run on CPU tensors: vLLM's own CUDA
indexer function (the one DeepSeek-V3.2's CUDA attention calls) with only DeepGEMM's paged
logits kernel stood in (spin's torch reference over exactly the page table it is given), vLLM's
own torch top-k backend, and the plugin loaded as vLLM loads it (register(), ops built by vLLM's
SparseAttnIndexer constructor under a VllmConfig).

- spin on: every decode row's top-k equals spin_dsa.Serving (the C++ library, host) + the
  library's block-masked indexer + its masked top-k on the same inputs, over steps whose batch
  order changes, with next_n 1 and 3 (native MTP rows, acceptance read from seq_len deltas);
  the logits kernel is asked for the chosen pages only;
- a decode layer touches nothing on the host; two plugin instances (two tensor-parallel ranks)
  select identically; the MTP drafter's indexer stays vLLM's; what the GPU path cannot serve
  stops the engine at load with one line.
Layouts (flattened rows, vLLM's padded path, mixed prefill + decode batches, warm start from
the prompt's last row) are in test_device_layouts.py, on the shared harness cuda_path.py.
"""
import pathlib
import types

import numpy as np
import pytest
import torch
from vllm.config import ModelConfig, VllmConfig, set_current_vllm_config
from vllm.forward_context import set_forward_context
from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer
from vllm.v1.attention.backends.mla.indexer import (DeepSeekV32IndexerDecodeMetadata,
                                                   DeepseekV32IndexerMetadata)

import spin_dsa
import spin_dsa.vllm
from spin_dsa.device import paged_logits_reference
from spin_dsa.vllm import state
from spin_dsa.vllm.lifecycle import request_key
from cases import PAGE, scatter, vllm_config, write_tiny_v32_config
from host_sync import no_host_sync

TOPK = 256
LAYERS = 2
STEPS = 6
MAX_LEN = 8192
SPIN = {"config": {"target_sparsity": 0.5}, "warm_start": False, "min_context": 0}


def _prefix(layer):
    return f"model.layers.{layer}.self_attn.indexer.k_cache"


@pytest.fixture(autouse=True)
def device_path_on(monkeypatch):
    """The plugin takes the GPU path on CPU tensors for these tests only (and forgets its
    runtime after each)."""
    monkeypatch.setattr(state, "DEVICE_PATH_ON", "cpu")
    yield
    state.reset()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return write_tiny_v32_config(tmp_path_factory.mktemp("tiny-v32-device"), layers=LAYERS, topk=TOPK,
                                 max_len=MAX_LEN, draft_layers=1)


class World:
    """Two requests' key traces on random physical pages, the plugin's ops, and the calls."""

    def __init__(self, model_dir, next_n, spin=SPIN, compress_ratio=1):
        self.next_n, self.compress_ratio = next_n, compress_ratio
        self.traces = [spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=p, steps=STEPS,
                                                  layers=LAYERS, topk=TOPK, next_n=next_n,
                                                  seed=s)
                       for p, s in ((3000, 21), (4500, 22))]
        rng = np.random.default_rng(3)
        self.paged = []
        for l in range(LAYERS):
            cache, table = scatter([(t.k(l), t.k_scale(l)) for t in self.traces], rng)
            self.paged.append((torch.from_numpy(cache).view(cache.shape[0], PAGE, 132), table))
        self.vc = vllm_config(model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                                      max_model_len=MAX_LEN),
                             additional_config={"spin": spin})
        # vLLM's own block size: V4's 256-token blocks hold 64 compressed entries a page, which
        # the plugin must read off the cache, not off block_size.
        self.vc.cache_config.block_size = PAGE * compress_ratio
        if next_n > 1:
            self.vc.speculative_config = types.SimpleNamespace(num_speculative_tokens=next_n - 1)
        self.buf = torch.full((16, TOPK), -1, dtype=torch.int32)
        self.asked = []  # (context lens, page table, max_model_len) of each logits call

    def build(self, layers=LAYERS, **op_kwargs):
        assert state.DEVICE_PATH_ON == "cpu"  # the device_path_on fixture
        spin_dsa.vllm.register()
        state.reset()
        with set_current_vllm_config(self.vc):
            self.ops = [SparseAttnIndexer(
                types.SimpleNamespace(prefix=_prefix(l), kv_cache=self.paged[l % LAYERS][0]),
                128, "ue8m0", TOPK, 128, MAX_LEN, MAX_LEN, self.buf, skip_k_cache_insert=True,
                compress_ratio=self.compress_ratio, **op_kwargs)
                for l in range(layers)]
        return state.runtime()

    def metadata(self, order, s, l):
        n = self.next_n
        sl = torch.tensor([int(self.traces[i].ctx_len[s]) for i in order], dtype=torch.int32)
        # V4's decode rows see compressed entries; the request's seq_lens stay in tokens
        rows = (sl[:, None] - n + 1 + torch.arange(n, dtype=torch.int32)) // self.compress_ratio
        table = torch.from_numpy(self.paged[l][1][list(order)].copy())
        decode = DeepSeekV32IndexerDecodeMetadata(
            block_table=table, seq_lens=rows, decode_lens=torch.full((len(order),), n,
                                                                    dtype=torch.int32),
            requires_padding=False, schedule_metadata=torch.empty(0, dtype=torch.int32))
        return DeepseekV32IndexerMetadata(
            seq_lens=sl, max_seq_len=int(sl.max()),
            slot_mapping=torch.zeros(len(order) * n, dtype=torch.int64),
            num_decodes=len(order), num_decode_tokens=len(order) * n, num_prefills=0,
            num_prefill_tokens=0, decode=decode)

    def inputs(self, order, s, l):
        q = np.concatenate([self.traces[i].q(l)[s] for i in order])
        w = np.concatenate([self.traces[i].w(l)[s] for i in order])
        return torch.from_numpy(q).view(torch.float8_e4m3fn), torch.from_numpy(w)

    def logits_stand_in(self, q, kv, w, ctx, table, schedule, max_model_len, clean_logits=False,
                        logits_dtype=torch.float32, indices=None):
        """DeepGEMM's fp8_fp4_paged_mqa_logits, shape-asserted: q [B, next_n, H, 128] e4m3,
        context lens [B, next_n] int32, one table row per request; [B·next_n, max_model_len]
        fp32 (vLLM 0.32 passes clean_logits, 0.34 logits_dtype)."""
        qv, q_scale = q
        b, n, h, d = qv.shape
        assert q_scale is None and d == 128 and kv.shape[1:] == (PAGE, 1, 132)
        assert ctx.shape == (b, n) and ctx.dtype == torch.int32 and table.shape[0] == b
        assert w.shape == (b * n, h) and indices is None and not clean_logits
        assert logits_dtype == torch.float32
        self.asked.append((ctx.clone(), table.clone(), max_model_len))
        return paged_logits_reference(qv.reshape(b * n, h, d), w, kv.reshape(kv.shape[0], -1),
                                      table, ctx.reshape(-1), next_n=n, page_size=PAGE,
                                      width=max_model_len)

    def call(self, fn, order, s, l):
        """One indexer layer of step s through `fn` (vLLM's function, or the plugin's wrapper
        over it): the decode rows' top-k."""
        md = self.metadata(order, s, l)
        q, w = self.inputs(order, s, l)
        rows = len(order) * self.next_n
        with set_current_vllm_config(self.vc), set_forward_context({_prefix(l): md}, self.vc):
            fn(torch.zeros(rows, 8), _prefix(l), self.paged[l][0], q, None, None, w, 128,
               "ue8m0", TOPK, 128, MAX_LEN, MAX_LEN, self.buf, True, False, False, "",
               topk_backend="torch")
        return self.buf[:rows, :TOPK].clone()


def _vllm_function(monkeypatch, world):
    import vllm.model_executor.layers.sparse_attn_indexer as sai
    monkeypatch.setattr(sai, "fp8_fp4_paged_mqa_logits", world.logits_stand_in)
    return sai.sparse_attn_indexer


class Library:
    """What the device path must equal: the C++ serving object on the host, the library's
    block-masked indexer and masked top-k (the CPU path's pipeline)."""

    def __init__(self, world):
        self.w = world
        self.s = spin_dsa.Serving(4, LAYERS, MAX_LEN // world.compress_ratio, predictor="spin",
                                  config=dict(target_sparsity=0.5, page_size=PAGE, topk=TOPK),
                                  max_next_n=world.next_n, compress_ratio=world.compress_ratio)
        for slot, rid in enumerate(("a", "b")):
            self.s.add(slot, request_key(rid))

    def layer(self, order, s, l):
        w, n = self.w, self.w.next_n
        slots = np.array(order, np.int32)
        seq = np.array([int(w.traces[i].ctx_len[s]) for i in order], np.int64)
        blocks = self.s.select(slots, l, seq, n)
        counts = self.s.counts(len(order) * n)
        ids = [blocks[b * n, :counts[b * n]] for b in range(len(order))]
        offsets = np.cumsum([0] + [x.size for x in ids]).astype(np.int32)
        ids = np.concatenate(ids).astype(np.int32)
        q, wt = w.inputs(order, s, l)
        cache = w.paged[l][0].numpy().reshape(w.paged[l][0].shape[0], -1)
        logits = spin_dsa.indexer_scores(cache, w.paged[l][1][list(order)], seq,
                                         q.view(torch.uint8).numpy().reshape(len(order), n, -1,
                                                                             128),
                                         wt.numpy().reshape(len(order), n, -1), page_size=PAGE,
                                         compress_ratio=w.compress_ratio, block_ids=ids,
                                         block_offsets=offsets)
        visible = (seq[:, None] - n + 1 + np.arange(n)).reshape(-1) // w.compress_ratio
        top = spin_dsa.topk(logits, TOPK, visible_entries=visible, block_ids=ids,
                            block_offsets=offsets, rows_per_mask=n, block_entries=PAGE)
        self.s.observe(slots, l, logits, top)
        return top, ids, offsets

    def commit(self, order, s):
        acc = [int(self.w.traces[i].accepted[s]) if self.w.next_n > 1 else 0 for i in order]
        self.s.commit(np.array(order, np.int32), np.array(acc, np.int32))


def _sets(rows):
    return [set(r.tolist()) - {-1} for r in np.asarray(rows)]


@pytest.mark.parametrize("next_n,compress_ratio", [(1, 1), (3, 1), (3, 4)])
def test_spin_on_equals_the_library_through_vllms_cuda_indexer(model_dir, monkeypatch, next_n,
                                                              compress_ratio, figures):
    """compress_ratio 4 is DeepSeek-V4: decode rows see compressed entries, the request's
    seq_lens (and so the acceptance read from their delta) stay in tokens."""
    world = World(model_dir, next_n, compress_ratio=compress_ratio)
    rt = world.build()
    fn = spin_dsa.vllm.wrap_indexer_function(_vllm_function(monkeypatch, world))
    lib = Library(world)
    equal = rows = pages = chosen = 0
    for s in range(STEPS):
        order = (0, 1) if s % 2 == 0 else (1, 0)  # vLLM reorders its batch between steps
        rt.begin_step([("a", "b")[i] for i in order], [next_n] * 2, [])
        for l in range(LAYERS):
            got = world.call(fn, order, s, l)
            want, ids, offsets = lib.layer(order, s, l)
            equal += sum(g == w for g, w in zip(_sets(got), _sets(want)))
            rows += got.shape[0]
            ctx, table, width = world.asked[-1]
            assert width == rt.width_entries
            for b in range(len(order)):  # the kernel was given this request's chosen pages only
                mine = ids[offsets[b]:offsets[b + 1]]
                phys = world.paged[l][1][order[b]][mine]
                n_pages = -(-int(ctx[b].max()) // PAGE)
                assert table[b, :n_pages].tolist() == phys[:n_pages].tolist()
                pages += n_pages
            chosen += int(offsets[-1])
        lib.commit(order, s)  # the plugin commits lazily, from the next step's seq_lens
    assert equal == rows
    visible = rt.stats()["blocks_visible"]
    figures.append(f"device path in vLLM's CUDA indexer (CPU tensors, next_n={next_n}, "
                   f"compress_ratio={compress_ratio}): top-k "
                   f"equal to the library in {equal}/{rows} rows over {STEPS} steps x {LAYERS} "
                   f"layers; the logits kernel read {pages} pages of {visible} visible")


def test_spins_own_launches_per_decode_layer(figures):
    """spin on minus spin off through vLLM's sparse_attn_indexer, per layer of a 3-layer decode
    step, kernels on their GPU paths (launch_count.py, in a child interpreter: the Triton
    interpreter must be set before vLLM imports Triton). A middle layer: compact (the counters
    inside), observe+remap and, on a GPU, DeepGEMM's metadata kernel. The first layer adds the
    step's commit (replay, close, finish: acceptance read off vLLM's lengths in-kernel) and plan
    (every layer's select with its bookkeeping in one launch): 7 (was 159 per first layer and 100
    per middle one before the plan/run split, commit 6940323; 42 with the plan's torch glue,
    f158eec)."""
    import json
    import subprocess
    import sys
    script = pathlib.Path(__file__).with_name("launch_count.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    counts = json.loads(out.stdout.strip().splitlines()[-1])
    for next_n in (1, 2):
        c = counts[f"next_n{next_n}"]["cuda_equivalent"]
        assert c["middle"] <= 3 and c["first"] <= 8 and c["last"] <= 8, c
        figures.append(f"spin's own launches per decode layer through vLLM's indexer (next_n "
                       f"{next_n}, GPU paths, + DeepGEMM's metadata): first {c['first']}, middle "
                       f"{c['middle']}, last {c['last']}")


def test_a_captured_decode_step_replays_what_eager_computes(figures):
    """vLLM's FULL CUDA graphs capture a decode batch once and replay it: spin's layers (commit,
    the step's plan, compact, vLLM's logits and top-k, observe+remap) captured at one step and
    replayed for four more, with each step's values written into the captured inputs, give the
    eager run's top-k bit for bit, at next_n 1 and 3 — no host read, no tensor from host data, no
    decision in Python from a step's values (graph_child.py, in a child interpreter for Triton's).
    The same replay with one input left stale must differ (the comparison has teeth)."""
    import json
    import subprocess
    import sys
    script = pathlib.Path(__file__).with_name("graph_child.py")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    for r in json.loads(out.stdout.strip().splitlines()[-1]):
        assert r["replay_equals_eager"], r
        assert r["stale_query_differs"], r
        figures.append(f"graph replay (next_n {r['next_n']}): {r['replayed_steps']} steps replayed "
                       f"from {r['graph_nodes']} captured nodes equal eager bit for bit")


@pytest.mark.parametrize("read", [lambda x: torch.unique(x), lambda x: x[x > 2],
                                  lambda x: torch.equal(x, x), lambda x: x.sum().item(),
                                  lambda x: torch.tensor([1, 2]) + x[:2]])
def test_a_graph_capture_refuses_what_a_cuda_graph_cannot_capture(read):
    """graph_capture.Graph's rules, each broken once: a data-dependent shape (torch.unique, a
    boolean mask), a value read on the host (from C++: torch.equal; from Python: .item()), a
    tensor made from host data."""
    from graph_capture import Graph
    x = torch.arange(6)
    with pytest.raises(AssertionError, match=r"graph capture|host synchronisation"):
        with Graph().capture():
            read(x)


def test_a_steps_rows_reach_the_device_through_two_host_buffers_in_turn():
    """begin_step's copy (G3): the host writes one of two staging buffers a step, so the copy of
    the step before may still be in flight (non-blocking from pinned memory on CUDA)."""
    from spin_dsa.vllm.device_path import _Staging
    dst = torch.zeros(2, 4, dtype=torch.int64)
    staging = _Staging((2, 4), torch.int64, dst.device)
    used = []
    for step in range(4):
        values = np.arange(8).reshape(2, 4) + 10 * step
        staging.copy(dst, values)
        assert dst.tolist() == values.tolist()
        used.append(staging.host[step % 2].data_ptr())
    assert used[0] == used[2] != used[1] == used[3]


def test_v4_pages_are_read_off_the_cache_not_block_size(model_dir):
    """DeepSeek-V4: vLLM's block size is 256 tokens, its indexer pages hold 64 compressed entries
    (the layer's spec: tokens_per_state 4). Before the cache is bound the plugin reads the spec;
    once bound, the cache's own shape."""
    from vllm.v1.kv_cache_interface import MLAAttentionSpec
    vc = vllm_config(model_config=ModelConfig(model=model_dir, skip_tokenizer_init=True,
                                             max_model_len=MAX_LEN))
    vc.cache_config.block_size = 256
    spec = MLAAttentionSpec(block_size=256, num_kv_heads=1, head_size=132, dtype=torch.uint8,
                            tokens_per_state=4)
    unbound = types.SimpleNamespace(kv_cache=torch.tensor([]), get_kv_cache_spec=lambda _: spec)
    assert state.page_entries(vc, types.SimpleNamespace(k_cache=unbound, compress_ratio=4)) == 64
    bound = types.SimpleNamespace(kv_cache=torch.zeros(3, 64, 132, dtype=torch.uint8))
    assert state.page_entries(vc, types.SimpleNamespace(k_cache=bound, compress_ratio=4)) == 64
    bare = types.SimpleNamespace(kv_cache=torch.tensor([]))
    assert state.page_entries(vc, types.SimpleNamespace(k_cache=bare, compress_ratio=4)) == 64
    assert state.page_entries(vc, types.SimpleNamespace(k_cache=bare, compress_ratio=1)) == 256


def _full_graphs():
    from vllm.config import CUDAGraphMode
    return CUDAGraphMode.FULL_AND_PIECEWISE


def test_a_decode_layer_never_touches_the_host(model_dir, monkeypatch):
    """What a FULL CUDA graph captures: commit, select, compact, vLLM's logits and top-k,
    observe, remap — no value read back, nothing made from host data. (The stand-in logits
    kernel and vLLM's torch top-k are allowed nothing either.)"""
    world = World(model_dir, 3)
    rt = world.build()
    fn = spin_dsa.vllm.wrap_indexer_function(_vllm_function(monkeypatch, world))
    inputs = {}
    for s in range(3):
        rt.begin_step(["a", "b"], [3, 3], [])  # the runner hook: outside the captured region
        for l in range(LAYERS):
            inputs[l] = (world.metadata((0, 1), s, l), *world.inputs((0, 1), s, l))
        with no_host_sync(from_host=True):
            for l in range(LAYERS):
                md, q, w = inputs[l]
                with set_current_vllm_config(world.vc), set_forward_context({_prefix(l): md},
                                                                            world.vc):
                    fn(torch.zeros(6, 8), _prefix(l), world.paged[l][0], q, None, None, w, 128,
                       "ue8m0", TOPK, 128, MAX_LEN, MAX_LEN, world.buf, True, False, False, "",
                       topk_backend="torch")
    assert rt.stats()["decode_rows"] == 3 * LAYERS * 6


def test_two_ranks_select_identically(model_dir, monkeypatch):
    """Tensor-parallel ranks run the plugin each on its own, with the same inputs: slots and
    exploration keys come from request ids alone, so their top-k agree bit for bit."""
    outs = []
    for rank in range(2):
        world = World(model_dir, 3)
        rt = world.build()
        fn = spin_dsa.vllm.wrap_indexer_function(_vllm_function(monkeypatch, world))
        run = []
        for s in range(STEPS):
            order = (0, 1) if s % 3 else (1, 0)
            rt.begin_step([("a", "b")[i] for i in order], [3, 3], [])
            run += [world.call(fn, order, s, l) for l in range(LAYERS)]
        outs.append(torch.stack(run))
    assert torch.equal(outs[0], outs[1])


@pytest.mark.parametrize("mode", ["same", "diverge"])
def test_verify_ranks_proves_agreement_and_stops_on_divergence(model_dir, tmp_path, mode):
    """verify_ranks, two ranks in two processes over gloo (ranks_child.py): ranks that agree run
    on; a rank whose predictor state diverged makes both stop with one line at the step it shows."""
    import os
    import subprocess
    import sys
    here = pathlib.Path(__file__).parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(here), str(here.parent),
                                                       os.environ.get("PYTHONPATH", "")]))
    procs = [subprocess.Popen([sys.executable, str(here / "ranks_child.py"), str(rank),
                               str(tmp_path / "init"), str(model_dir), mode],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
             for rank in range(2)]
    outs = [p.communicate(timeout=600) for p in procs]
    results = [o.strip().splitlines()[-1] if o.strip() else e[-2000:] for o, e in outs]
    if mode == "same":
        assert results == ["ok", "ok"], results
    else:
        for r in results:
            assert r.startswith("raised: spin: tensor-parallel ranks selected different blocks at step"), r


def _contexts(world, s):
    return [int(t.ctx_len[s]) for t in world.traces]


def _first_step_runs_dense(model_dir, monkeypatch, contexts=False, **spin):
    """A plugin with these settings; its first step (two requests; the runner's contexts with
    them if asked) must be vLLM's own dense decode, layer by layer. (world, runtime, the
    plugin's function)."""
    world = World(model_dir, 1, spin=dict(SPIN, **spin))
    rt = world.build()
    dense = _vllm_function(monkeypatch, world)
    fn = spin_dsa.vllm.wrap_indexer_function(dense)
    rt.begin_step(["a", "b"], [1, 1], [], _contexts(world, 0) if contexts else None)
    for l in range(LAYERS):
        assert torch.equal(world.call(fn, (0, 1), 0, l), world.call(dense, (0, 1), 0, l))
        assert world.asked[-1][2] == MAX_LEN  # vLLM's dense call: the full width
    return world, rt, fn


def test_more_requests_than_slots_run_dense_and_are_counted(model_dir, monkeypatch):
    """max_requests 1 and two requests: no error; the step runs vLLM's dense decode (the same
    top-k as spin off), counted; once one request leaves, the other decodes with spin again."""
    world, rt, fn = _first_step_runs_dense(model_dir, monkeypatch, max_requests=1)
    assert rt.stats()["no_slot_steps"] == 1 and rt.stats()["max_requests"] == 1
    rt.add("c")  # the runner hook's add of one more new request: no slot free, no error
    rt.drop("c")
    rt.drop("a")
    rt.begin_step(["b"], [1], [])
    world.asked.clear()
    world.call(fn, (1,), 1, 0)
    assert world.asked[-1][2] == rt.width_entries  # the compacted call: spin selected again
    assert rt.stats()["no_slot_steps"] == 1


def test_the_state_is_sized_by_the_real_kv_cache(model_dir, monkeypatch):
    """max_requests unset: as many slots as the bound indexer cache holds requests of half
    min_context (each may need one at once), at most max_num_seqs. Allocated when the runner's
    real initialize_kv_cache returns (before vLLM's warm-up and graph capture), not at load and
    not by vLLM's CUDA-graph memory profiling (is_profiling: a throwaway cache), whose layers run
    on the one-slot state."""
    from spin_dsa.vllm.device_path import cache_entries, long_context_slots
    from spin_dsa.vllm.runner_hooks import hook_initialize_kv_cache
    world = World(model_dir, 1, spin=dict(SPIN, min_context=1024))
    rt = world.build()
    assert rt.slots is None  # at load: only the one-slot geometry

    class Runner:
        def initialize_kv_cache(self, kv_cache_config, is_profiling=False):
            self.config = kv_cache_config

    import spin_dsa.vllm.device_path as dp
    hook_initialize_kv_cache(Runner)
    fn = spin_dsa.vllm.wrap_indexer_function(_vllm_function(monkeypatch, world))
    Runner().initialize_kv_cache("minimal", is_profiling=True)
    world.call(fn, (0, 1), 0, 0)  # a profiling pass: the layer runs, nothing is allocated
    assert rt.slots is None
    with monkeypatch.context() as m:  # inside a capture the state cannot be made: said so
        m.setattr(dp, "_capturing", lambda device: True)
        with pytest.raises(RuntimeError, match="before spin's device state exists"):
            rt.bind()
    Runner().initialize_kv_cache("real")
    entries = world.paged[0][0].shape[0] * PAGE
    assert cache_entries(world.paged[0][0]) == entries == cache_entries([world.paged[0][0]])
    seqs = world.vc.scheduler_config.max_num_seqs
    assert 1 < entries // 512 < seqs  # the cache, not max_num_seqs, decides here
    assert rt.stats()["max_requests"] == entries // 512 == rt.serving.spec.max_requests
    assert rt.stats()["state_bytes"] == rt.serving.memory_bytes > 0
    assert long_context_slots(10**9, 512, seqs) == seqs  # never above max_num_seqs
    assert long_context_slots(100, 512, seqs) == 1
    assert long_context_slots(entries, 0, seqs) == seqs  # min_context 0: every request
    assert cache_entries(torch.tensor([])) is None  # unbound: DEFAULT_MAX_REQUESTS


def test_a_capture_before_the_state_exists_is_refused(model_dir, monkeypatch):
    """A CUDA graph captured while spin's state is not allocated would point at the one-slot
    state: refused at capture, unless it is vLLM's profiling capture (the runner hook saw
    initialize_kv_cache(is_profiling=True)), whose graphs vLLM discards."""
    import spin_dsa.vllm.device_path as dp
    world = World(model_dir, 1)
    rt = world.build()
    fn = spin_dsa.vllm.wrap_indexer_function(_vllm_function(monkeypatch, world))
    monkeypatch.setattr(dp, "_capturing", lambda device: True)
    with pytest.raises(RuntimeError, match="before spin's device state exists"):
        world.call(fn, (0, 1), 0, 0)
    rt.profiling()
    world.call(fn, (0, 1), 0, 0)
    assert rt.slots is None


def test_short_requests_hold_no_state_and_keep_every_block(model_dir, monkeypatch):
    """min_context 4000 (a slot from 2000 tokens): a request said to be at 1000 tokens takes no
    slot and is not counted as lacking one; its row rides the pad slot and keeps every block
    (vLLM's dense top-k), while spin selects for the long request beside it."""
    world = World(model_dir, 1, spin=dict(SPIN, min_context=4000))
    rt = world.build()
    dense = _vllm_function(monkeypatch, world)
    fn = spin_dsa.vllm.wrap_indexer_function(dense)
    rt.begin_step(["a", "b"], [1, 1], [], [1000, 4501])
    assert "a" not in rt.slots and "b" in rt.slots
    for l in range(LAYERS):
        got = world.call(fn, (0, 1), 0, l)
        assert world.asked[-1][2] == rt.width_entries  # spin's compacted call, not a fallback
        want = world.call(dense, (0, 1), 0, l)
        assert _sets(got)[0] == _sets(want)[0]
    assert rt.stats()["no_slot_steps"] == 0 and rt.stats()["requests_with_state"] == 1
    rt.begin_step(["a", "b"], [1, 1], [], [2000, 4502])  # a reached half of min_context
    assert "a" in rt.slots


def test_a_step_of_short_rows_runs_vllms_dense_decode_unless_captured(model_dir, monkeypatch):
    """min_context above every row: an eager step skips spin's chain (vLLM's own result, counted
    once a step); a step being captured keeps the sparse path (a replay cannot branch). The
    row under half of min_context (3000 tokens of 8192) takes no slot and is never counted as
    lacking one; the one above it (4500) has one, its state warming while it is short."""
    import spin_dsa.vllm.device_path as dp
    world, rt, fn = _first_step_runs_dense(model_dir, monkeypatch, contexts=True,
                                           min_context=MAX_LEN)
    assert rt.stats()["short_steps"] == 1 and rt.slots.ids() == ["b"]
    monkeypatch.setattr(dp, "_capturing", lambda device: True)
    rt.begin_step(["a", "b"], [1, 1], [], _contexts(world, 1))
    world.call(fn, (0, 1), 1, 0)
    assert world.asked[-1][2] == rt.width_entries and rt.stats()["short_steps"] == 1
    assert rt.stats()["no_slot_steps"] == 0


def test_the_mtp_drafters_indexer_stays_vllms(model_dir):
    """The draft model's indexer layer (model.layers.{num_hidden_layers}) runs vLLM's dense path:
    spin drives the target model's layers only."""
    world = World(model_dir, 3)
    world.build(layers=LAYERS + 1)
    assert [op.spin_on for op in world.ops] == [True] * LAYERS + [False]
    rt = state.runtime()
    assert (rt.first_layer, rt.last_layer, rt.num_layers) == (0, LAYERS - 1, LAYERS)


@pytest.mark.parametrize("change,message", [
    (lambda vc: setattr(vc, "additional_config", {"spin": dict(SPIN, predictor="hisa")}),
     "hisa"),
    (lambda vc: (setattr(vc, "additional_config",
                         {"spin": dict(SPIN, record={"dir": "/tmp/x"})}),
                 setattr(vc.compilation_config, "cudagraph_mode",
                         _full_graphs())), "record mode with FULL CUDA graphs.*enforce-eager"),
    (lambda vc: setattr(vc, "additional_config",
                        {"spin": dict(SPIN, config={"pooling": "mean"})}), "pooling"),
])
def test_what_the_gpu_path_cannot_serve_stops_the_engine_at_load(model_dir, change, message):
    world = World(model_dir, 1)
    change(world.vc)
    with pytest.raises(Exception, match=message) as e:
        world.build()
    assert "\n" not in str(e.value)


def test_an_unsupported_vllm_version_is_refused_at_load(model_dir, monkeypatch):
    import vllm
    monkeypatch.setattr(vllm, "__version__", "0.40.1")
    with pytest.raises(RuntimeError,
                       match=r"vLLM 0\.40\.1 is not supported.*use vLLM 0\.32, 0\.33 or 0\.34, or"):
        World(model_dir, 1).build()


def test_v41_candidate_selection_is_refused_at_load(model_dir):
    """DeepSeek-V4.1's candidate-source and candidate-reindex indexers (candidate_blocks): their
    blocks index request positions, spin's compacted logits do not keep them."""
    world = World(model_dir, 1)
    with pytest.raises(RuntimeError, match=r"two-level candidate selection.*turn spin off") as e:
        world.build(candidate_blocks=torch.zeros((16, 4), dtype=torch.int32),
                    candidate_block_size=64)
    assert "\n" not in str(e.value)


class DeepseekV32IndexerCache(torch.nn.Module):
    """Named as vLLM's: a DSA model's indexer cache, which check_model looks for."""


class QSARawKeyCache(DeepseekV32IndexerCache):
    """A cache named otherwise over an indexer-cache base (Qwen4-exp's, in vLLM 0.34)."""


def _model(*modules):
    model = torch.nn.Module()
    model.layers = torch.nn.ModuleList(modules)
    return model


def test_models_spin_cannot_drive_are_refused_once_built(model_dir, caplog):
    """state.check_model, which the runners call after load_model (MRV1) or when they resolve the
    model's state (MRV2): a DSA model whose indexer bypasses the op spin drives (Kimi-K3 calls
    vLLM's function itself), a DSA architecture spin does not serve (Mistral Large 4 builds the
    op), and two indexer layers on one cache (V4.1's KV sharing) are refused by name; a model
    without DSA is served unchanged with a warning; spin's own layers pass."""
    from spin_dsa.vllm import runner_hooks
    world = World(model_dir, 1)
    world.build()
    for runner in runner_hooks.v1_runners():  # none in vLLM 0.34 (MRV2 only)
        assert getattr(runner.load_model, "_spin_hooked", False), runner
    state.check_model(world.vc, _model(*world.ops))
    for bypass in (DeepseekV32IndexerCache(), QSARawKeyCache()):
        with pytest.raises(RuntimeError, match=r"DeepseekV32ForCausalLM's DSA indexer is not one "
                                               r"spin drives \(spin serves DeepseekV32ForCausalLM"):
            state.check_model(world.vc, _model(bypass))
    other = types.SimpleNamespace(model_config=types.SimpleNamespace(
        architectures=["MistralLarge4ForCausalLM"]), additional_config=world.vc.additional_config)
    with pytest.raises(RuntimeError, match=r"MistralLarge4ForCausalLM's DSA indexer is not one"):
        state.check_model(other, _model(*world.ops))
    shared = _model(*world.ops[:2])
    shared.layers[1].k_cache = world.ops[0].k_cache
    with pytest.raises(RuntimeError, match=r"share the indexer cache '.*layers\.0\..*KV sharing"):
        state.check_model(world.vc, shared)
    with caplog.at_level("WARNING", logger="spin_dsa.vllm"):
        state.check_model(world.vc, _model(torch.nn.Linear(2, 2)))
    assert "has no DSA indexer; spin is on but changes nothing" in caplog.text
    world.vc.additional_config = {}
    state.check_model(world.vc, _model(DeepseekV32IndexerCache()))  # spin off: nothing checked


@pytest.mark.parametrize("setting,message", [
    ({"decode_context_parallel_size": 2}, r"decode context parallelism \(-dcp > 1\).*-dcp 1"),
    ({"prefill_context_parallel_size": 2}, r"prefill context parallelism"),
    ({"enable_dbo": True}, r"micro-batching"),
    ({"use_v2_model_runner": True}, r"model runner V2 in this build.*VLLM_USE_V2_MODEL_RUNNER=0"),
    ({"use_fp4_cache": True}, r"MXFP4 indexer cache.*FP8"),
    ({"sm100": True}, r"Blackwell's varlen decode indexer \(SM100\).*Hopper"),
    ({"adaptive": True}, r"adaptive verification \(speculative_config\.enable_adaptive_verif"),
])
def test_parallel_and_runner_settings_are_refused_by_name(setting, message, monkeypatch):
    """Settings a CPU test cannot build an engine with (their process groups, the V2 runner, a
    Blackwell GPU), checked on the objects the check reads."""
    from vllm.platforms import current_platform

    from spin_dsa.vllm.config import parse_spin_config
    monkeypatch.setattr(state, "DEVICE_PATH_ON", None)  # the checks of a real GPU engine
    monkeypatch.setattr(state, "V2_HOOKED", False)  # a vLLM build without MRV2's states
    monkeypatch.setattr(current_platform, "is_device_capability_family",
                        lambda family: setting.get("sm100", False) and family == 100,
                        raising=False)
    pc = types.SimpleNamespace(**{k: v for k, v in setting.items() if "parallel" in k or "dbo" in k})
    spec = types.SimpleNamespace(enable_adaptive_verification=setting.get("adaptive", False))
    vc = types.SimpleNamespace(parallel_config=pc, speculative_config=spec,
                               use_v2_model_runner=setting.get("use_v2_model_runner", False))
    op = types.SimpleNamespace(use_fp4_cache=setting.get("use_fp4_cache", False))
    with pytest.raises(RuntimeError, match=message) as e:
        state.check_device_path(vc, parse_spin_config({"spin": SPIN}), op)
    assert "\n" not in str(e.value)


def test_the_v2_runners_model_state_reports_each_batch(model_dir, monkeypatch):
    """MRV2 (vLLM's default runner on GPUs): register() wraps resolve_model_state_cls so the
    model's state class gains spin's lifecycle. Driven with an InputBatch as MRV2 makes it
    (InputBatch.make_dummy, then the fields a real step sets): rows, scheduled tokens and the rows
    whose prefill ends reach the runtime; removed requests are dropped; spin off resolves vLLM's
    own class."""
    import vllm.v1.worker.gpu.model_states as model_states
    from vllm.v1.worker.gpu.input_batch import InputBatch, InputBuffers

    from spin_dsa.vllm import runner_hooks

    world = World(model_dir, 1)
    rt = world.build()
    assert getattr(model_states.resolve_model_state_cls, "_spin_hooked", False)
    for runner in [runner_hooks.v2_runner(), *runner_hooks.v1_runners()]:  # the state's sizing
        assert getattr(runner.initialize_kv_cache, "_spin_hooked", False), runner

    class Base:  # vLLM's state for the model, reduced to the hooks spin overrides
        def __init__(self):
            self.calls = []

        def remove_request(self, req_id):
            self.calls.append(("remove", req_id))

        def preprocess_state(self, input_batch, *args, **kwargs):
            self.calls.append(("preprocess", input_batch.num_reqs))

    from spin_dsa.vllm.runner_hooks import spin_model_state
    ms = spin_model_state(Base)()
    batch = InputBatch.make_dummy(3, 9, InputBuffers(4, 16, torch.device("cpu")))
    batch.req_ids = ["r0", "r1", "r2"]
    batch.num_scheduled_tokens = np.array([1, 5, 3], np.int32)
    batch.num_computed_prefill_tokens_np = np.array([40, 10, 0], np.int32)
    batch.prefill_len_np = np.array([40, 15, 100], np.int32)  # r1's prompt ends now, r2's not
    batch.num_computed_tokens_np = np.array([40, 10, 0], np.int32)
    seen = []
    monkeypatch.setattr(rt, "begin_step", lambda *a: seen.append(a))
    ms.preprocess_state(batch, None, None, None)
    assert ms.calls == [("preprocess", 3)]
    assert seen == [(["r0", "r1", "r2"], [1, 5, 3], [1], [41, 15, 3])]
    rt.add("r0")
    ms.remove_request("r0")
    assert "r0" not in rt.slots and ms.calls[-1] == ("remove", "r0")

    class Model(torch.nn.Module):
        pass
    with set_current_vllm_config(world.vc):
        assert model_states.resolve_model_state_cls(world.vc, Model()).__name__.startswith("Spin")
    world.vc.additional_config = {}
    assert not model_states.resolve_model_state_cls(world.vc, Model()).__name__.startswith("Spin")


def test_the_op_keeps_vllms_name(model_dir):
    """custom_ops=["-sparse_attn_indexer"] must still match the op spin swaps in."""
    from vllm.model_executor.layers.sparse_attn_indexer import SparseAttnIndexer as Base
    world = World(model_dir, 1)
    world.build()
    assert type(world.ops[0]).__name__ == "SpinSparseAttnIndexer"
    assert world.ops[0].name == Base.name == "sparse_attn_indexer"


def test_a_request_routed_through_the_prefill_branch_closes_its_step_once(model_dir,
                                                                         monkeypatch):
    """vLLM routes a decode request with fewer draft tokens (or a short extend) through its
    prefill branch for a step (vllm_plugin_review D5). Its open step must be closed at that
    step from its own seq_len delta — not left open, so that the next delta spans two steps and
    over-counts its acceptance. Request b sits out step 2 this way; every decode row of every
    step must still equal the library, which never sees b at step 2."""
    import dataclasses
    import functools

    from vllm.forward_context import get_forward_context

    world = World(model_dir, 3)
    rt = world.build()
    vllm_fn = _vllm_function(monkeypatch, world)

    @functools.wraps(vllm_fn)
    def without_prefills(*args, **kwargs):  # the prefill rows' own path is tested elsewhere
        ctx = get_forward_context().attn_metadata
        prefix = args[1]
        md = ctx[prefix]
        ctx[prefix] = dataclasses.replace(md, num_prefills=0, num_prefill_tokens=0)
        try:
            return vllm_fn(*args, **kwargs)
        finally:
            ctx[prefix] = md
    fn = spin_dsa.vllm.wrap_indexer_function(without_prefills)
    lib = Library(world)
    for s in range(STEPS):
        routed = s == 2  # b is in the batch, in vLLM's prefill branch
        rt.begin_step(["a", "b"], [3, 3], [])
        for l in range(LAYERS):
            if routed:
                md = world.metadata((0, 1), s, l)
                decode = world.metadata((0,), s, l).decode
                md = dataclasses.replace(md, num_decodes=1, num_decode_tokens=3, num_prefills=1,
                                         num_prefill_tokens=3, decode=decode)
                q, w = world.inputs((0, 1), s, l)
                with set_current_vllm_config(world.vc), set_forward_context({_prefix(l): md},
                                                                            world.vc):
                    fn(torch.zeros(6, 8), _prefix(l), world.paged[l][0], q, None, None, w, 128,
                       "ue8m0", TOPK, 128, MAX_LEN, MAX_LEN, world.buf, True, False, False, "",
                       topk_backend="torch")
                got = world.buf[:3, :TOPK].clone()
                want, _, _ = lib.layer((0,), s, l)
            else:
                got = world.call(fn, (0, 1), s, l)
                want, _, _ = lib.layer((0, 1), s, l)
            assert _sets(got) == _sets(want), (s, l)
        lib.commit((0,) if routed else (0, 1), s)


def test_record_mode_writes_the_true_indexer_rows_and_leaves_spin_alone(model_dir, monkeypatch,
                                                                         tmp_path):
    """Record mode on the GPU path: a recorded request's trace holds its full indexer rows
    (every visible entry, scored apart from spin's blocks and copied to the host), its seq_lens
    and the acceptance read from their deltas; what spin selects stays the library's."""
    record = {"dir": str(tmp_path), "requests": ["a"], "layers": [1], "max_steps": 4}
    world = World(model_dir, 3, dict(SPIN, record=record))
    rt = world.build()
    fn = spin_dsa.vllm.wrap_indexer_function(_vllm_function(monkeypatch, world))
    lib = Library(world)
    for s in range(STEPS):
        order = (0, 1) if s % 2 == 0 else (1, 0)
        rt.begin_step([("a", "b")[i] for i in order], [3, 3], [])
        for l in range(LAYERS):
            got = world.call(fn, order, s, l)
            want, _, _ = lib.layer(order, s, l)
            assert _sets(got) == _sets(want), (s, l)
        lib.commit(order, s)
    assert len(rt.recorder.written) == 1  # max_steps reached: written then, not at the drop
    trace = spin_dsa.open_trace(rt.recorder.written[0])
    a = world.traces[0]
    np.testing.assert_array_equal(trace.ctx_len, a.ctx_len[:4])
    np.testing.assert_array_equal(trace.accepted[:3], a.accepted[:3])
    scores = trace.scores(0)  # the one recorded layer, model layer 1
    for s in range(4):
        seq = np.array([int(a.ctx_len[s])], np.int64)
        q, w = a.q(1)[s], a.w(1)[s]
        full = spin_dsa.indexer_scores(world.paged[1][0].numpy().reshape(-1, PAGE * 132),
                                       world.paged[1][1][:1], seq,
                                       q.reshape(1, 3, -1, 128), w.reshape(1, 3, -1),
                                       page_size=PAGE)
        visible = int(seq[0])
        np.testing.assert_allclose(scores[s][:, :visible], full[:, :visible], rtol=1e-5,
                                   atol=1e-5 * float(np.abs(full[np.isfinite(full)]).max()))
