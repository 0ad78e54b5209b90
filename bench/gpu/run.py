#!/usr/bin/env python3
"""spin's device path on a GPU, per indexer layer: the paged fp8 logits kernel dense against the
compacted block table, top-k over the full against the compact width, and spin's own work
(select + compact + observe + remap), every piece captured in a CUDA graph and timed by replays
between CUDA events. One prepared script (bench/gpu/README.md): torch + Triton are enough;
spin_dsa (its compiled _core, for spin_dsa.device.Serving) and DeepGEMM are used where importable.

    python bench/gpu/run.py --out gpu.json            # on a GPU: the full grid, < 5 min on an H200
    python bench/gpu/run.py --cpu-smoke --out s.json  # a tiny case on CPU under TRITON_INTERPRET=1

Geometry: DeepSeek-V3.2's indexer (64 heads × 128, top-k 2048, page 64, next_n 1 or --next-n); contexts 64K /
128K / 512K × batch 1 / 8 / 64 × sparsity 0 / 0.3 / 0.5 / 0.7 (combinations that do not fit in
free memory are skipped and listed). A graph runs `layers` indexer layers, each over its own
slice of one cache (pages of all layers scattered by one random permutation), so that one replay
reads ≥ 4× the L2 cache and the figures are HBM figures; times are per layer.
"""
from __future__ import annotations

import argparse
import importlib
import json
import math
import os
import pathlib
import sys
import time
import types

REPO = pathlib.Path(__file__).resolve().parents[2]
HEADS, DIM, TOPK, PAGE = 64, 128, 2048, 64
PAGE_BYTES = PAGE * (DIM + 4)
PEAK_TBS = {"H200": 4.8, "H100 SXM": 3.35, "H100 80GB HBM3": 3.35, "H800": 3.35, "B200": 8.0}


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON here")
    p.add_argument("--cpu-smoke", "--small", dest="smoke", action="store_true",
                   help="a tiny case on CPU under the Triton interpreter (keeps the script from rotting)")
    p.add_argument("--contexts", default="65536,131072,524288")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--sparsities", default="0,0.3,0.5,0.7")
    p.add_argument("--replays", type=int, default=20, help="graph replays per timing")
    p.add_argument("--max-layers", type=int, default=61, help="layers per graph at most (V3.2: 61)")
    p.add_argument("--serving-layers", type=int, default=61,
                   help="indexer layers of the spin_dsa.device.Serving timed (V3.2: 61): select_layers "
                        "and commit cover them all, whatever number of cache slices a graph reads")
    p.add_argument("--next-n", type=int, default=1, help="rows per request (MTP: 1 + draft tokens)")
    p.add_argument("--no-deepgemm", action="store_true")
    p.add_argument("--no-serving", action="store_true", help="time spin's parts without spin_dsa.device.Serving")
    p.add_argument("--no-sweep", action="store_true",
                   help="skip the launch-shape sweep of the logits kernel (dense, batch 64, 128K)")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------
# Loading spin's device modules: the installed package, else the files of this checkout
# ------------------------------------------------------------------------------------------------

def load_device():
    """(paging, logits, Serving or None, note). spin_dsa.device needs the compiled _core; the
    paging and logits modules need only torch and Triton, so without _core they are loaded from
    python/spin_dsa/device/ as a stand-alone package (its __init__, which imports Serving, skipped)."""
    try:
        from spin_dsa.device import _logits, _paging
        try:
            from spin_dsa.device import Serving
            return _paging, _logits, Serving, "spin_dsa.device"
        except ImportError as e:
            return _paging, _logits, None, f"spin_dsa.device.Serving not importable: {e}"
    except ImportError as e:
        why = str(e)
    pkg = types.ModuleType("spin_device_standalone")
    pkg.__path__ = [str(REPO / "python" / "spin_dsa" / "device")]
    sys.modules[pkg.__name__] = pkg
    paging = importlib.import_module(pkg.__name__ + "._paging")
    logits = importlib.import_module(pkg.__name__ + "._logits")
    return paging, logits, None, f"stand-alone modules from the checkout (spin_dsa: {why})"


# ------------------------------------------------------------------------------------------------
# Timing
# ------------------------------------------------------------------------------------------------

class Timer:
    """CUDA: warm up on a side stream (Triton compiles there, outside capture), capture fn in a
    CUDAGraph, replay `replays` times between two events: µs per replay. CPU: one eager run."""

    def __init__(self, torch, device, replays):
        self.torch, self.device, self.replays = torch, device, replays
        self.graphs = []   # keep captured graphs (and their memory pools) alive

    def __call__(self, fn):
        torch = self.torch
        if self.device.type != "cuda":
            t0 = time.perf_counter()
            fn()
            return (time.perf_counter() - t0) * 1e6
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn()
            fn()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        g.replay()
        torch.cuda.synchronize()
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(self.replays):
            g.replay()
        b.record()
        b.synchronize()
        self.graphs.append(g)
        return a.elapsed_time(b) * 1e3 / self.replays

    def release(self):
        self.graphs.clear()


def hbm_peak(torch, device):
    """(bytes/s, how it was obtained): the datasheet for known parts, else a measured copy."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    for key, tbs in PEAK_TBS.items():
        if key in name:
            return tbs * 1e12, f"datasheet ({key})"
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    e1.synchronize()
    return 2 * n * 10 / (e0.elapsed_time(e1) * 1e-3), "measured device-to-device copy"


# ------------------------------------------------------------------------------------------------
# Inputs
# ------------------------------------------------------------------------------------------------

def make_inputs(torch, device, batch, ctx, layers, seed, nn=1):
    """Cache of `layers` × batch × pages pages (random e4m3 without NaN, scales 2^-k), per-layer
    block tables from one random permutation, q and w for batch · nn rows."""
    g = torch.Generator(device=device).manual_seed(seed)
    pages = ctx // PAGE
    total = layers * batch * pages
    cache = torch.randint(0, 256, (total, PAGE_BYTES), dtype=torch.uint8, device=device, generator=g)
    cache[:, :PAGE * DIM] &= 0xBF            # exponent ≤ 0b0111: |x| < 2, never NaN
    scale = torch.exp2(-torch.randint(0, 8, (total, PAGE), device=device, generator=g).float())
    cache[:, PAGE * DIM:] = scale.view(torch.uint8).view(total, PAGE * 4)
    perm = torch.randperm(total, device=device, generator=g).to(torch.int32)
    tables = perm.view(layers, batch, pages).contiguous()
    q = torch.randint(0, 256, (batch * nn, HEADS, DIM), dtype=torch.uint8, device=device, generator=g) & 0xBF
    w = torch.randn(batch * nn, HEADS, device=device, generator=g) * (HEADS ** -0.5)
    seq_lens = torch.full((batch,), ctx, dtype=torch.int64, device=device)
    return cache, tables, q, w, seq_lens


def random_blocks(torch, device, batch, ctx, layers, sparsity, seed, nn=1):
    """A stand-in for Serving.select: per (layer, request) ceil((1-s)·blocks) blocks, ascending,
    the newest two always in, the same set on each of a request's nn rows.
    int32 [layers, batch·nn, keep], counts [layers, batch·nn]."""
    n = ctx // PAGE
    keep = max(2, min(n, math.ceil((1 - sparsity) * n)))
    g = torch.Generator(device=device).manual_seed(seed + 1)
    r = torch.rand(layers, batch, n, device=device, generator=g)
    r[..., n - 2:] = 2.0                              # newest blocks first
    blocks = r.topk(keep, dim=2).indices.sort(dim=2).values.to(torch.int32)
    blocks = blocks.repeat_interleave(nn, dim=1).contiguous()
    counts = torch.full((layers, batch * nn), keep, dtype=torch.int32, device=device)
    return blocks, counts


# ------------------------------------------------------------------------------------------------
# DeepGEMM (optional): fp8_paged_mqa_logits on the same tables
# ------------------------------------------------------------------------------------------------

def deepgemm_runner(torch, device, q, w, cache, note, nn=1):
    """A function (table, context_lens [batch] (1-D: DeepGEMM applies each row's causal offset),
    width) → logits [batch·nn, width], or None with the reason in note."""
    if device.type != "cuda":
        note["deepgemm"] = "not on CPU"
        return None
    try:
        import deep_gemm
    except Exception as e:  # noqa: BLE001 - any failure to import means "not available"
        note["deepgemm"] = f"not importable: {e}"
        return None
    sms = torch.cuda.get_device_properties(device).multi_processor_count
    q4 = q.view(torch.float8_e4m3fn).view(q.shape[0] // nn, nn, HEADS, DIM)
    kv = cache.view(-1, PAGE, 1, DIM + 4)

    def meta(ctx_lens):
        try:
            return deep_gemm.get_paged_mqa_logits_metadata(ctx_lens, PAGE, sms)
        except TypeError:
            return deep_gemm.get_paged_mqa_logits_metadata(ctx_lens, sms)

    def run(table, ctx_lens, width):
        m = meta(ctx_lens)
        try:
            return deep_gemm.fp8_paged_mqa_logits(q4, kv, w, ctx_lens, table, m, width, clean_logits=False)
        except TypeError:
            return deep_gemm.fp8_paged_mqa_logits(q4, kv, w, ctx_lens, table, m, width)

    note["deepgemm"] = f"deep_gemm {getattr(deep_gemm, '__version__', '?')}"
    return run


# ------------------------------------------------------------------------------------------------
# One (context, batch): dense once, then each sparsity
# ------------------------------------------------------------------------------------------------

def bench_case(env, ctx, batch, sparsities, args):
    torch, device, P, L, Serving, timer, peak = (env[k] for k in
                                                  ("torch", "device", "P", "L", "Serving", "timer", "peak"))
    nn = args.next_n
    k = min(TOPK, ctx // 4)
    cache_bytes = batch * ctx * (DIM + 4)
    l2 = torch.cuda.get_device_properties(device).L2_cache_size if device.type == "cuda" else 1 << 20
    layers = max(1, min(args.max_layers, math.ceil(4 * l2 / cache_bytes)))
    if args.smoke:
        layers = 1
    need = layers * cache_bytes + 12 * batch * nn * ctx * 4 + (1 << 28)
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        if need > 0.85 * free:
            return [{"context": ctx, "batch": batch, "skipped": f"needs ~{need / 2**30:.1f} GiB, "
                                                                 f"{free / 2**30:.1f} GiB free"}]
    cache, tables, q, w, seq_lens = make_inputs(torch, device, batch, ctx, layers, seed=ctx + batch, nn=nn)
    dense_len = P.visible_entries(seq_lens, nn).to(torch.int32)       # [batch·nn]
    dense = torch.empty((batch * nn, ctx), dtype=torch.float32, device=device)
    note = {}
    dg = None if args.no_deepgemm else deepgemm_runner(torch, device, q, w, cache, note, nn)

    def per_layer(fn):
        return timer(lambda: [fn(l) for l in range(layers)]) / layers

    t_logits = per_layer(lambda l: L.paged_logits(q, w, cache, tables[l], dense_len, next_n=nn,
                                                  page_size=PAGE, out=dense))
    t_topk_torch = per_layer(lambda l: torch.topk(dense, k, dim=1))
    t_topk_exact = per_layer(lambda l: P.topk(dense, dense_len, k, clean=True))
    t_topk_masked = per_layer(lambda l: P.topk(dense, dense_len, k))
    bytes_dense = batch * (ctx // PAGE) * PAGE_BYTES + q.numel() + w.numel() * 4 + dense.numel() * 4
    dense_row = {"context": ctx, "batch": batch, "next_n": nn, "sparsity": 0.0, "mode": "dense", "layers": layers,
                 "launch": vars(L.launch_config(batch, nn, HEADS, ctx, device)),
                 "logits_us": t_logits, "topk_torch_us": t_topk_torch, "topk_exact_us": t_topk_exact,
                 "topk_masked_us": t_topk_masked,
                 "logits_bytes": bytes_dense, "logits_tbs": bytes_dense / t_logits * 1e-6,
                 "hbm_fraction": (bytes_dense / (t_logits * 1e-6) / peak) if peak else None}
    if dg is not None:
        try:
            ctx32 = seq_lens.to(torch.int32)
            dense_row["deepgemm_logits_us"] = per_layer(lambda l: dg(tables[l], ctx32, ctx))
        except Exception as e:  # noqa: BLE001 - record, keep benchmarking
            note["deepgemm"] += f"; dense failed: {type(e).__name__}: {e}"
    dense_total = t_logits + t_topk_exact
    rows = [dense_row]
    for s in sparsities:
        rows.append(bench_sparse(env, ctx, batch, nn, s, k, layers, cache, tables, q, w, seq_lens,
                                 dense_total, dense_row, dg, note))
    for r in rows:
        r.update({kk: v for kk, v in note.items()})
    timer.release()
    del cache, tables, dense
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return rows


def bench_sparse(env, ctx, batch, nn, s, k, layers, cache, tables, q, w, seq_lens, dense_total,
                 dense_row, dg, note):
    torch, device, P, L, Serving, timer, peak = (env[x] for x in
                                                  ("torch", "device", "P", "L", "Serving", "timer", "peak"))
    row = {"context": ctx, "batch": batch, "next_n": nn, "sparsity": s, "mode": "compact", "layers": layers}
    # Every draft accepted: commit replays all next_n rows (its most expensive case).
    accepted = torch.full((batch,), nn - 1, dtype=torch.int64, device=device)
    model_layers = max(layers, env["serving_layers"])
    serving = None
    slots = torch.arange(batch, device=device)
    if Serving is not None:
        try:
            serving = Serving(batch, model_layers, ctx, predictor="spin", config={"target_sparsity": s,
                              "topk": k}, max_next_n=nn, device=device)
            for i in range(batch):
                serving.add(i, 1000 + i)
        except Exception as e:  # noqa: BLE001
            row["serving"] = f"construction failed: {type(e).__name__}: {e}"
            serving = None
    if serving is not None:
        blocks, counts = serving.select_layers(slots, seq_lens, nn)
        blocks, counts = blocks[:layers], counts[:layers]
        serving.commit(slots, accepted)
        row["selector"] = "spin_dsa.device.Serving (spin)"
    else:
        blocks, counts = random_blocks(torch, device, batch, ctx, layers, s, seed=ctx + batch, nn=nn)
        row["selector"] = "random blocks (HOOK: spin_dsa.device.Serving unavailable, see meta.modules / row.serving)"
    width = blocks.shape[2]
    E = PAGE
    comp = [P.compact(blocks[l], counts[l], tables[l], seq_lens, nn, page_size=PAGE) for l in range(layers)]
    logits = torch.empty((batch * nn, width * E), dtype=torch.float32, device=device)
    L.paged_logits(q, w, cache, comp[0][0], comp[0][1], next_n=nn, page_size=PAGE, out=logits)
    cols = P.topk(logits, comp[0][1], k)      # real columns for remap / observe to chew on

    def per_layer(fn):
        return timer(lambda: [fn(l) for l in range(layers)]) / layers

    row["compact_us"] = per_layer(lambda l: P.compact(blocks[l], counts[l], tables[l], seq_lens, nn,
                                                      page_size=PAGE))
    row["logits_us"] = per_layer(lambda l: L.paged_logits(q, w, cache, comp[l][0], comp[l][1], next_n=nn,
                                                          page_size=PAGE, out=logits))
    row["topk_torch_us"] = per_layer(lambda l: torch.topk(logits, k, dim=1))
    row["topk_exact_us"] = per_layer(lambda l: P.topk(logits, comp[l][1], k, clean=True))
    row["topk_masked_us"] = per_layer(lambda l: P.topk(logits, comp[l][1], k))
    row["remap_us"] = per_layer(lambda l: P.remap(cols, blocks[l], E))
    if serving is not None:
        try:
            row["select_us"] = per_layer(lambda l: serving.select(slots, l, seq_lens, nn))
            # Every layer of the step in one call, and the step's commit, per layer of the model.
            row["select_layers_us_per_layer"] = timer(
                lambda: serving.select_layers(slots, seq_lens, nn)) / model_layers
            row["observe_us"] = per_layer(lambda l: serving.observe_scored(slots, l, logits, cols))
            # A replayed commit would find its step closed: every layer is marked selected first
            # (one small fill, timed with it), so each replay does a whole step's work.
            row["commit_us_per_layer"] = timer(lambda: (serving._selected.fill_(True),
                                                        serving.commit(slots, accepted))) / model_layers
            row["serving_layers"] = model_layers
        except Exception as e:  # noqa: BLE001 - record, keep benchmarking
            row["serving"] = f"timing failed: {type(e).__name__}: {e}"

    def step(l):
        # One layer of a decode step as an engine runs it, in one graph: launch gaps included.
        if serving is not None:
            b, c = serving.select(slots, l, seq_lens, nn)
        else:
            b, c = blocks[l], counts[l]
        t, n = P.compact(b, c, tables[l], seq_lens, nn, page_size=PAGE)
        L.paged_logits(q, w, cache, t, n, next_n=nn, page_size=PAGE, out=logits)
        top = P.topk(logits, n, k, clean=True)
        if serving is not None:
            serving.observe_scored(slots, l, logits, top)
        return P.remap(top, b, E)

    try:
        row["pipeline_us"] = per_layer(step)
        if serving is not None:
            serving.commit(slots, accepted)
    except Exception as e:  # noqa: BLE001
        row["pipeline"] = f"failed: {type(e).__name__}: {e}"
    # Pages the kernel reads: those below each row's compacted length (host-side, after timing).
    pages_read = sum(int(((c[1].view(batch, nn)[:, -1].long() + PAGE - 1) // PAGE).sum()) for c in comp) // layers
    by = pages_read * PAGE_BYTES + q.numel() + w.numel() * 4 + logits.numel() * 4
    row["launch"] = vars(L.launch_config(batch, nn, HEADS, width * E, device))
    row.update({"pages_read": pages_read, "logits_bytes": by, "logits_tbs": by / row["logits_us"] * 1e-6,
                "hbm_fraction": (by / (row["logits_us"] * 1e-6) / peak) if peak else None})
    spin_us = sum(row.get(x, 0.0) for x in ("select_us", "compact_us", "observe_us", "remap_us",
                                             "commit_us_per_layer"))
    row["spin_overhead_us"] = spin_us
    if "select_layers_us_per_layer" in row:
        row["spin_overhead_batched_us"] = spin_us - row["select_us"] + row["select_layers_us_per_layer"]
    total = row["logits_us"] + row["topk_exact_us"] + spin_us
    row["indexer_us"] = total
    row["speedup"] = dense_total / total
    row["logits_speedup"] = dense_row["logits_us"] / row["logits_us"]
    row["ideal_speedup"] = 1.0 / (1.0 - s) if s < 1 else None
    if dg is not None:
        try:
            dl = [P.deepgemm_context_lens(c[1], nn, two_d=False) for c in comp]
            row["deepgemm_logits_us"] = per_layer(lambda l: dg(comp[l][0], dl[l], width * E))
        except Exception as e:  # noqa: BLE001
            note["deepgemm"] += f"; compact failed: {type(e).__name__}: {e}"
    return row


# ------------------------------------------------------------------------------------------------
# Correctness on the device (small): kernel vs reference, exact top-k vs the sort definition
# ------------------------------------------------------------------------------------------------

def check_device(env, args):
    """Small, on the bench's device: the Triton kernel against the float64 reference (error over
    the bound B, the -inf pattern), the exact top-k against the sort definition, and — where
    DeepGEMM runs — DeepGEMM's logits on the same compacted table against the reference (its
    1-D context_lens: it applies the rows' causal offsets itself, columns past a row unchecked)."""
    torch, device, P, L = env["torch"], env["device"], env["P"], env["L"]
    nn = args.next_n
    batch, ctx = 2, 2048 if device.type == "cuda" else 256
    cache, tables, q, w, seq_lens = make_inputs(torch, device, batch, ctx, 1, seed=1, nn=nn)
    blocks, counts = random_blocks(torch, device, batch, ctx, 1, 0.5, seed=2, nn=nn)
    t, lengths = P.compact(blocks[0], counts[0], tables[0], seq_lens, nn, page_size=PAGE)
    out = L.paged_logits(q, w, cache, t, lengths, next_n=nn, page_size=PAGE)
    ref = L.paged_logits_reference(q, w, cache, t, lengths, next_n=nn, page_size=PAGE)
    ca = cache.clone()
    ca[:, :PAGE * DIM] &= 0x7F
    bound = L.paged_logits_reference(q & 0x7F, w.abs(), ca, t, lengths, next_n=nn, page_size=PAGE)
    fin = torch.isfinite(ref)

    def err_of(x):
        return float(((x[fin] - ref[fin]).abs() / (bound[fin] + 1e-30)).max()) if bool(fin.any()) else 0.0

    tol = 1e-3 if device.type == "cuda" else 2e-5   # Hopper's fp8 MMA accumulates in < fp32
    err = err_of(out)
    same_inf = bool(torch.equal(torch.isinf(out), torch.isinf(ref)))
    k = 64
    exact = bool(torch.equal(P.topk(ref, lengths, k), P.topk_reference(ref, lengths, k)))
    res = {"next_n": nn, "logits_max_error_over_bound": err, "tolerance": tol,
           "logits_inf_pattern_equal": same_inf, "topk_equals_sort_definition": exact,
           "ok": same_inf and exact and err <= tol}
    note = {}
    dg = None if args.no_deepgemm else deepgemm_runner(torch, device, q, w, cache, note, nn)
    if dg is not None:
        try:
            d = dg(t, P.deepgemm_context_lens(lengths, nn, two_d=False), t.shape[1] * PAGE)
            res["deepgemm_max_error_over_bound"] = err_of(d[:, :ref.shape[1]].float())
        except Exception as e:  # noqa: BLE001 - informative only
            res["deepgemm"] = f"failed: {type(e).__name__}: {e}"
    else:
        res["deepgemm"] = note.get("deepgemm")
    return res


def sweep(env, args):
    """Tuning data for the first GPU run: the dense logits kernel at one shape (batch 64 at 128K
    on a GPU; tiny on CPU) under alternative launch shapes around launch_config's choice."""
    torch, device, L, timer, peak = (env[k] for k in ("torch", "device", "L", "timer", "peak"))
    nn = args.next_n
    batch, ctx = (64, 131072) if device.type == "cuda" else (2, 512)
    cache, tables, q, w, seq_lens = make_inputs(torch, device, batch, ctx, 1, seed=3, nn=nn)
    lengths = env["P"].visible_entries(seq_lens, nn).to(torch.int32)
    out = torch.empty((batch * nn, ctx), dtype=torch.float32, device=device)
    base = L.launch_config(batch, nn, HEADS, ctx, device)
    shapes = [(base.block_n, base.num_warps, base.num_stages, base.tiles)]
    if device.type == "cuda":
        for bn, warps, stages in ((128, 4, 3), (128, 4, 5), (128, 8, 4), (64, 4, 4), (64, 4, 6), (256, 8, 3)):
            for tiles in (max(1, base.tiles * 128 // bn), max(1, base.tiles * 64 // bn)):
                if (bn, warps, stages, tiles) not in shapes:
                    shapes.append((bn, warps, stages, tiles))
    else:
        shapes.append((64, 4, 1, 2))
    by = batch * (ctx // PAGE) * PAGE_BYTES + q.numel() + w.numel() * 4 + out.numel() * 4
    res = []
    for bn, warps, stages, tiles in shapes:
        cfg = L.LaunchConfig(base.nn, base.hp, bn, tiles, warps, stages, base.fp8_dot)
        try:
            us = timer(lambda: L.paged_logits(q, w, cache, tables[0], lengths, next_n=nn, page_size=PAGE,
                                              out=out, config=cfg))
            res.append({"block_n": bn, "num_warps": warps, "num_stages": stages, "tiles": tiles, "us": us,
                        "tbs": by / us * 1e-6, "hbm_fraction": by / (us * 1e-6) / peak if peak else None,
                        "chosen": (bn, warps, stages, tiles) == shapes[0]})
        except Exception as e:  # noqa: BLE001 - a shape that does not compile or fit is data too
            res.append({"block_n": bn, "num_warps": warps, "num_stages": stages, "tiles": tiles,
                        "error": f"{type(e).__name__}: {str(e)[:200]}"})
    timer.release()
    return {"batch": batch, "context": ctx, "next_n": nn, "results": res}


# ------------------------------------------------------------------------------------------------

def table(rows):
    head = (f"{'ctx':>7} {'B':>3} {'s':>4} {'mode':>7} {'L':>3} {'logits µs':>10} {'TB/s':>6} {'HBM%':>5} "
            f"{'topk µs':>8} {'torch.topk':>10} {'spin µs':>8} {'total µs':>9} {'speedup':>8} {'ideal':>6} "
            f"{'DeepGEMM µs':>11}")
    lines = [head, "-" * len(head)]
    for r in rows:
        if "skipped" in r:
            lines.append(f"{r['context']:>7} {r['batch']:>3}  skipped: {r['skipped']}")
            continue
        hbm = f"{100 * r['hbm_fraction']:.0f}" if r.get("hbm_fraction") else "-"
        dense = r["mode"] == "dense"
        total = r["logits_us"] + r["topk_exact_us"] if dense else r["indexer_us"]
        lines.append(
            f"{r['context']:>7} {r['batch']:>3} {r['sparsity']:>4.1f} {r['mode']:>7} {r['layers']:>3} "
            f"{r['logits_us']:>10.1f} {r['logits_tbs']:>6.2f} {hbm:>5} {r['topk_exact_us']:>8.1f} "
            f"{r['topk_torch_us']:>10.1f} {('-' if dense else format(r['spin_overhead_us'], '.1f')):>8} "
            f"{total:>9.1f} {('-' if dense else format(r['speedup'], '.2f')):>8} "
            f"{('-' if dense or not r['ideal_speedup'] else format(r['ideal_speedup'], '.2f')):>6} "
            f"{(format(r['deepgemm_logits_us'], '.1f') if 'deepgemm_logits_us' in r else '-'):>11}")
    return "\n".join(lines)


def main(argv=None):
    args = parse_args(argv)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        sys.exit("bench/gpu/run.py: no CUDA device; run --cpu-smoke (it sets TRITON_INTERPRET=1)")
    P, L, Serving, how = load_device()
    if args.no_serving:
        Serving, how = None, how + " (--no-serving)"
    peak, peak_how = hbm_peak(torch, device)
    env = {"torch": torch, "device": device, "P": P, "L": L, "Serving": Serving,
           "timer": Timer(torch, device, args.replays), "peak": peak,
           "serving_layers": args.serving_layers if not args.smoke else 2}
    if args.smoke:
        contexts, batches, sparsities = [1024], [2], [0.5]
    else:
        contexts = [int(x) for x in args.contexts.split(",")]
        batches = [int(x) for x in args.batches.split(",")]
        sparsities = [float(x) for x in args.sparsities.split(",")]
    import triton
    meta = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu (interpreter)",
            "torch": torch.__version__, "triton": triton.__version__, "modules": how,
            "hbm_peak_tbs": peak * 1e-12 if peak else None, "hbm_peak_source": peak_how,
            "heads": HEADS, "dim": DIM, "topk": TOPK, "page_size": PAGE, "next_n": args.next_n,
            "timing": "CUDA graph replays between CUDA events" if device.type == "cuda" else "one eager run",
            "replays": args.replays}
    print(f"spin device bench on {meta['device']} (torch {meta['torch']}, triton {meta['triton']}); "
          f"modules: {how}; HBM peak {meta['hbm_peak_tbs']} TB/s ({peak_how})", flush=True)
    t0 = time.time()
    meta["checks"] = check_device(env, args)
    print(f"checks: {meta['checks']}", flush=True)
    rows = []
    for ctx in contexts:
        for b in batches:
            try:
                rows.extend(bench_case(env, ctx, b, sparsities, args))
            except Exception as e:  # noqa: BLE001 - one case failing must not lose the others
                if args.smoke:
                    raise
                rows.append({"context": ctx, "batch": b, "skipped": f"failed: {type(e).__name__}: {e}"})
                env["timer"].release()
                if device.type == "cuda":
                    torch.cuda.synchronize()
                    torch.cuda.empty_cache()
            print(f"  ctx {ctx} batch {b} done ({time.time() - t0:.0f} s)", flush=True)
    if not args.no_sweep:
        meta["sweep"] = sweep(env, args)
        print("launch-shape sweep (dense logits, batch {batch}, context {context}):".format(**meta["sweep"]))
        for r in meta["sweep"]["results"]:
            print("  " + ", ".join(f"{k} {v:.3g}" if isinstance(v, float) else f"{k} {v}" for k, v in r.items()))
    meta["seconds"] = time.time() - t0
    print(table(rows))
    if args.out:
        pathlib.Path(args.out).write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0 if meta["checks"]["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
