"""One decode indexer layer as vLLM runs it, timed on the device: spin's chain against dense.

    dense: logits over the engine's full block table → top-k over the full width
    spin:  the step plan (select_layers + commit, once per step, amortised over the model's
           layers) + compact → logits over the compacted table → top-k over the compact width →
           observe → remap into the engine's top-k buffer

Each arm is captured as one CUDA graph over `layers` layers (each its own slice of one cache, so a
replay reads ≥ 4× the L2 and the figures are HBM figures) and timed by replays between CUDA
events; figures are per layer. Logits by spin's Triton kernel always and by DeepGEMM's paged MQA
logits kernel where it loads (its own metadata kernel per layer on the compacted lengths, once per
graph for dense, as vLLM does). Top-k: spin's exact top-k (DESIGN §3's tie rule; vLLM's own top-k
kernels are not installable without vLLM) in the chains, `torch.topk` timed beside it.
"""
from __future__ import annotations

import math
import time

HEADS, DIM, TOPK, PAGE = 64, 128, 2048, 64
PAGE_BYTES = PAGE * (DIM + 4)
MODEL_LAYERS = 61            # DeepSeek-V3.2's indexer layers: the step plan is amortised over them


class Timer:
    """CUDA: warm up on a side stream (Triton compiles there, outside capture), capture fn in a
    CUDAGraph, replay `replays` times between two events: µs per replay. CPU: one eager run (the
    smoke run: its times mean nothing)."""

    def __init__(self, torch, device, replays):
        self.torch, self.device, self.replays = torch, device, replays
        self.graphs = []   # captured graphs (and their memory pools) stay alive until release()

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
    """A stand-in for Serving.select_layers when spin_dsa's _core is missing: per (layer,
    request) ceil((1-s)·blocks) blocks, ascending, the newest two always in, the same set on each
    of a request's nn rows. int32 [layers, batch·nn, keep], counts [layers, batch·nn]."""
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
# DeepGEMM: its paged MQA logits kernel and metadata, whichever name the installed build exports
# ------------------------------------------------------------------------------------------------

class DeepGemm:
    """DeepGEMM's SM90 paged fp8 MQA logits on spin's cache layout ([pages, 64, 1, 132] bytes),
    2-D context_lens [batch, next_n] as current DeepGEMM requires. `load` returns None and the
    reason when it does not import or has neither entry point; a JIT failure surfaces at the
    first call, where the caller records it."""

    def __init__(self, torch, dg, device, q, w, cache, nn):
        self.torch, self.dg, self.nn = torch, dg, nn
        self.sms = torch.cuda.get_device_properties(device).multi_processor_count
        self.q = q.view(torch.float8_e4m3fn).view(q.shape[0] // nn, nn, HEADS, DIM)
        self.kv = cache.view(-1, PAGE, 1, DIM + 4)
        self.w = w
        self.entry = "fp8_fp4_paged_mqa_logits" if hasattr(dg, "fp8_fp4_paged_mqa_logits") \
            else "fp8_paged_mqa_logits"

    @staticmethod
    def load(torch, device):
        if device.type != "cuda":
            return None, "not on CPU"
        try:
            import deep_gemm
        except Exception as e:  # noqa: BLE001 - any failure to import means "not available"
            causes = [e]
            while causes[-1].__cause__ is not None and len(causes) < 4:   # torch's OSError wraps dlopen's
                causes.append(causes[-1].__cause__)
            return None, "not importable: " + " <- ".join(f"{type(c).__name__}: {str(c)[:300]}" for c in causes)
        if not any(hasattr(deep_gemm, n) for n in ("fp8_fp4_paged_mqa_logits", "fp8_paged_mqa_logits")):
            return None, "deep_gemm has no paged MQA logits entry point"
        return deep_gemm, f"deep_gemm {getattr(deep_gemm, '__version__', '?')} from {deep_gemm.__file__}"

    def schedule(self, ctx_lens_2d):
        return self.dg.get_paged_mqa_logits_metadata(ctx_lens_2d, PAGE, self.sms)

    def logits(self, table, ctx_lens_2d, schedule, width):
        if self.entry == "fp8_fp4_paged_mqa_logits":
            return self.dg.fp8_fp4_paged_mqa_logits((self.q, None), self.kv, self.w, ctx_lens_2d, table,
                                                    schedule, width)
        return self.dg.fp8_paged_mqa_logits(self.q, self.kv, self.w, ctx_lens_2d, table, schedule, width,
                                            False)


# ------------------------------------------------------------------------------------------------
# One case: (context, batch, sparsity, next_n)
# ------------------------------------------------------------------------------------------------

def graph_layers(torch, device, batch, ctx, max_layers):
    """Layers per graph so that one replay reads ≥ 4× the L2 cache."""
    if device.type != "cuda":
        return 1
    l2 = torch.cuda.get_device_properties(device).L2_cache_size
    return max(1, min(max_layers, math.ceil(4 * l2 / (batch * ctx * (DIM + 4)))))


def fits(torch, device, batch, ctx, nn, layers):
    """(fits, why not): the cache slices, the logits buffers, Serving's state, some headroom."""
    if device.type != "cuda":
        return True, ""
    need = layers * batch * ctx * (DIM + 4) + 12 * batch * nn * ctx * 4 + batch * 12 * 2**20 * max(1, ctx // 2**17) \
        + (1 << 29)
    free, _ = torch.cuda.mem_get_info(device)
    if need > 0.85 * free:
        return False, f"needs ~{need / 2**30:.1f} GiB, {free / 2**30:.1f} GiB free"
    return True, ""


def make_serving(env, batch, ctx, s, k, nn):
    """spin_dsa.device.Serving with every request added, or (None, why)."""
    Serving, device = env["Serving"], env["device"]
    if Serving is None:
        return None, "spin_dsa.device.Serving unavailable (see probe.modules)"
    try:
        serving = Serving(batch, env["model_layers"], ctx, predictor="spin",
                          config={"target_sparsity": s, "topk": k}, max_next_n=nn, device=device,
                          impl=env["impl"])
        for i in range(batch):
            serving.add(i, 1000 + i)
        return serving, ""
    except Exception as e:  # noqa: BLE001 - recorded in the row, the case runs on random blocks
        return None, f"construction failed: {type(e).__name__}: {e}"


def measure_case(env, ctx, batch, s, nn, max_layers=61):
    """The row of one case: component times, both chains per logits kernel, spin's own work,
    bandwidth. Every failure of a part is recorded in the row (`errors`), never raised."""
    torch, device, P, L, timer, peak = (env[x] for x in ("torch", "device", "P", "L", "timer", "peak"))
    k = min(TOPK, ctx // 4)
    layers = graph_layers(torch, device, batch, ctx, max_layers)
    row = {"context": ctx, "batch": batch, "sparsity": s, "next_n": nn, "topk": k, "layers": layers,
           "errors": {}}
    ok, why = fits(torch, device, batch, ctx, nn, layers)
    if not ok:
        row["skipped"] = why
        return row
    cache, tables, q, w, seq_lens = make_inputs(torch, device, batch, ctx, layers, seed=ctx + batch, nn=nn)
    slots = torch.arange(batch, device=device)
    accepted = torch.full((batch,), nn - 1, dtype=torch.int64, device=device)   # every draft kept
    serving, why = make_serving(env, batch, ctx, s, k, nn)
    if serving is not None:
        blocks, counts = serving.select_layers(slots, seq_lens, nn)
        blocks, counts = blocks[:layers].contiguous(), counts[:layers].contiguous()
        serving.commit(slots, accepted)
        row["selector"] = "spin_dsa.device.Serving (spin), impl " + serving.impl
        row["serving_memory_bytes_per_request"] = serving.memory_bytes / batch
    else:
        blocks, counts = random_blocks(torch, device, batch, ctx, layers, s, seed=ctx + batch, nn=nn)
        row["selector"] = f"random blocks ({why})"
    E, width = PAGE, blocks.shape[2]
    dense_len = P.visible_entries(seq_lens, nn).to(torch.int32)
    dense = torch.empty((batch * nn, ctx), dtype=torch.float32, device=device)
    compact_out = torch.empty((batch * nn, width * E), dtype=torch.float32, device=device)
    positions = torch.empty((batch * nn, k), dtype=torch.int32, device=device)   # the engine's top-k buffer
    comp = [P.compact(blocks[l], counts[l], tables[l], seq_lens, nn, page_size=PAGE) for l in range(layers)]
    count_bytes(row, comp, batch, nn, ctx, width, q, w)

    def per_layer(name, fn):
        """fn(l) for every layer in one graph, µs per layer; a failure is recorded, None returned."""
        try:
            us = timer(lambda: [fn(l) for l in range(layers)]) / layers
            row[name] = us
            return us
        except Exception as e:  # noqa: BLE001
            row["errors"][name] = f"{type(e).__name__}: {str(e)[:300]}"
            return None

    def triton_logits(table, lengths, out):
        return L.paged_logits(q, w, cache, table, lengths, next_n=nn, page_size=PAGE, out=out)

    # Components.
    per_layer("dense_logits_triton_us", lambda l: triton_logits(tables[l], dense_len, dense))
    per_layer("dense_topk_exact_us", lambda l: P.topk(dense, dense_len, k, clean=True))
    per_layer("dense_topk_torch_us", lambda l: torch.topk(dense, k, dim=1))
    stats = torch.zeros(3, dtype=torch.int64, device=device)   # the plugin's counters, kept by compact
    per_layer("compact_us", lambda l: P.compact(blocks[l], counts[l], tables[l], seq_lens, nn, page_size=PAGE,
                                                counters=stats))
    per_layer("logits_triton_us", lambda l: triton_logits(comp[l][0], comp[l][1], compact_out))
    per_layer("topk_exact_us", lambda l: P.topk(compact_out, comp[l][1], k, clean=True))
    per_layer("topk_torch_us", lambda l: torch.topk(compact_out, k, dim=1))
    cols = P.topk(compact_out, comp[0][1], k, clean=True)
    per_layer("remap_us", lambda l: P.remap(cols, blocks[l], E, out=positions))
    # The torch references of compact and remap (before their Triton kernels): ratios in one run.
    per_layer("compact_torch_us", lambda l: P.compact(blocks[l], counts[l], tables[l], seq_lens, nn,
                                                      page_size=PAGE, use_triton=False))
    per_layer("remap_torch_us", lambda l: P.remap(cols, blocks[l], E, out=positions, use_triton=False))
    if serving is not None:
        per_layer("observe_us", lambda l: serving.observe_scored(slots, l, compact_out, cols,
                                                                 blocks=blocks[l]))
        per_layer("observe_remap_us", lambda l: serving.observe_scored(slots, l, compact_out, cols,
                                                                       positions=positions, blocks=blocks[l]))
        step_plan(env, row, serving, slots, seq_lens, accepted, nn)

    # The chains, Triton logits.
    def spin_layer(l, logits_fn, topk_fn):
        t, n = P.compact(blocks[l], counts[l], tables[l], seq_lens, nn, page_size=PAGE, counters=stats)
        out = logits_fn(t, n)
        observe_and_remap(l, out, topk_fn(out, n))

    def observe_and_remap(l, scored, top):
        # One launch with Serving (observe writes the engine's top-k buffer), else remap alone.
        if serving is not None:   # with the rows' blocks, as the plugin passes its plan's
            serving.observe_scored(slots, l, scored, top, positions=positions, blocks=blocks[l])
        else:
            P.remap(top, blocks[l], E, out=positions)

    def spin_own(l):
        t, n = P.compact(blocks[l], counts[l], tables[l], seq_lens, nn, page_size=PAGE, counters=stats)
        observe_and_remap(l, compact_out, cols)
        return t, n

    per_layer("dense_chain_triton_us",
              lambda l: P.topk(triton_logits(tables[l], dense_len, dense), dense_len, k, clean=True))
    per_layer("spin_layer_chain_triton_us",
              lambda l: spin_layer(l, lambda t, n: triton_logits(t, n, compact_out),
                                   lambda out, n: P.topk(out, n, k, clean=True)))
    per_layer("spin_own_layer_us", spin_own)
    summarise(row, s, peak)
    # DeepGEMM last: whatever it does to the device, the Triton figures above are kept.
    try:
        deepgemm_chains(env, row, per_layer, blocks, counts, tables, seq_lens, dense_len, q, w, cache, nn, k,
                        spin_layer, spin_own, width)
        summarise(row, s, peak)
        timer.release()   # the graphs' pools; the case's tensors go with this frame
        if device.type == "cuda":
            torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001
        row["errors"]["deepgemm_or_cleanup"] = f"{type(e).__name__}: {str(e)[:300]}"
    return row


def step_plan(env, row, serving, slots, seq_lens, accepted, nn):
    """Once per step: every layer's selection in one call and the step's commit (every layer
    selected, every draft accepted: commit's most expensive case), µs per model layer."""
    layers, timer = serving.num_layers, env["timer"]
    try:
        row["plan_us_per_layer"] = timer(
            lambda: (serving.select_layers(slots, seq_lens, nn), serving.commit(slots, accepted))) / layers
        row["plan_layers"] = layers
        # Its two halves. A replayed commit would find its step closed: every layer is marked
        # selected first (one small fill, timed with it), so each replay does a whole step's work.
        row["select_layers_us_per_layer"] = timer(lambda: serving.select_layers(slots, seq_lens, nn)) / layers
        if hasattr(serving, "kth_search"):  # the other k-th search, the same blocks (one run: a ratio)
            serving.kth_search = "radix"
            row["select_layers_radix_us_per_layer"] = timer(
                lambda: serving.select_layers(slots, seq_lens, nn)) / layers
            serving.kth_search = "bitwise"
        row["commit_us_per_layer"] = timer(lambda: (serving.state.selected.fill_(True),
                                                    serving.commit(slots, accepted))) / layers
    except Exception as e:  # noqa: BLE001
        row["errors"]["plan"] = f"{type(e).__name__}: {str(e)[:300]}"


def deepgemm_chains(env, row, per_layer, blocks, counts, tables, seq_lens, dense_len, q, w, cache, nn, k,
                    spin_layer, spin_own, width):
    """The same chains with DeepGEMM's logits (unclean past each row's length: masked top-k)."""
    torch, device, P = env["torch"], env["device"], env["P"]
    if env["deep_gemm"] is None:
        row["deepgemm"] = env["deep_gemm_note"]
        return
    dg = DeepGemm(torch, env["deep_gemm"], device, q, w, cache, nn)
    row["deepgemm"] = f"{env['deep_gemm_note']} ({dg.entry})"
    ctx = dense_len.view(-1, nn).contiguous()                           # [batch, next_n]
    try:
        dense_schedule = dg.schedule(ctx)
    except Exception as e:  # noqa: BLE001 - DeepGEMM's JIT or its checks: recorded, Triton goes on
        row["errors"]["deepgemm_schedule"] = f"{type(e).__name__}: {str(e)[:300]}"
        return
    full = tables.shape[2] * PAGE
    per_layer("dense_logits_deepgemm_us", lambda l: dg.logits(tables[l], ctx, dense_schedule, full))
    per_layer("dense_chain_deepgemm_us",
              lambda l: P.topk(dg.logits(tables[l], ctx, dense_schedule, full), dense_len, k))

    def compact_logits(t, n):
        lens = P.deepgemm_context_lens(n, nn)
        return dg.logits(t, lens, dg.schedule(lens), width * PAGE)

    comp0 = P.compact(blocks[0], counts[0], tables[0], seq_lens, nn, page_size=PAGE)
    lens0 = P.deepgemm_context_lens(comp0[1], nn)
    sched0 = dg.schedule(lens0)
    per_layer("logits_deepgemm_us", lambda l: dg.logits(comp0[0], lens0, sched0, width * PAGE))
    per_layer("spin_layer_chain_deepgemm_us",
              lambda l: spin_layer(l, compact_logits, lambda out, n: P.topk(out, n, k)))
    per_layer("spin_own_layer_deepgemm_us",
              lambda l: dg.schedule(P.deepgemm_context_lens(spin_own(l)[1], nn)))


def count_bytes(row, comp, batch, nn, ctx, width, q, w):
    """Bytes the logits kernel moves, dense and over the compacted tables (the pages below each
    request's newest row's compacted length: what it reads)."""
    pages_read = sum(int(((c[1].view(batch, nn)[:, -1].long() + PAGE - 1) // PAGE).sum()) for c in comp) // len(comp)
    extra = q.numel() + w.numel() * 4
    row["pages_read"] = pages_read
    row["dense_logits_bytes"] = batch * (ctx // PAGE) * PAGE_BYTES + extra + batch * nn * ctx * 4
    row["compact_logits_bytes"] = pages_read * PAGE_BYTES + extra + batch * nn * width * PAGE * 4


def summarise(row, s, peak):
    """Bandwidth, the chain speed-ups and spin's own share, per logits kernel."""
    row["ideal_speedup"] = 1.0 / (1.0 - s) if s < 1 else None
    plan = row.get("plan_us_per_layer", 0.0)
    for kern in ("triton", "deepgemm"):
        for mode, by in (("dense_logits", row["dense_logits_bytes"]), ("logits", row["compact_logits_bytes"])):
            us = row.get(f"{mode}_{kern}_us")
            if us:
                row[f"{mode}_{kern}_tbs"] = by / us * 1e-6
                row[f"{mode}_{kern}_hbm_fraction"] = by / (us * 1e-6) / peak if peak else None
        dense, spin = row.get(f"dense_chain_{kern}_us"), row.get(f"spin_layer_chain_{kern}_us")
        if dense and spin:
            row[f"spin_chain_{kern}_us"] = spin + plan
            row[f"chain_speedup_{kern}"] = dense / (spin + plan)
        own = row.get("spin_own_layer_us" if kern == "triton" else "spin_own_layer_deepgemm_us")
        if dense and own is not None:
            row[f"spin_own_us_{kern}"] = own + plan
            row[f"spin_own_share_{kern}"] = (own + plan) / dense


def sweep_logits(env, make_inputs, nn=1):
    """Tuning data: the dense logits kernel at batch 64, 128K (tiny on CPU), next_n `nn`, under
    launch shapes around the one launch_config picks (tile width, warps, pipeline depth, tiles
    per program)."""
    torch, device, L, P, timer, peak = (env[k] for k in ("torch", "device", "L", "P", "timer", "peak"))
    batch, ctx = (64, 131072) if device.type == "cuda" else (2, 512)
    cache, tables, q, w, seq_lens = make_inputs(torch, device, batch, ctx, 1, seed=3, nn=nn)
    lengths = P.visible_entries(seq_lens, nn).to(torch.int32)
    out = torch.empty((batch * nn, ctx), dtype=torch.float32, device=device)
    base = L.launch_config(batch, nn, HEADS, ctx, device)
    shapes = [(base.block_n, base.num_warps, base.num_stages, base.tiles)]
    if device.type == "cuda":
        for bn, warps, stages in ((128, 4, 4), (128, 4, 3), (128, 8, 4), (128, 8, 3), (64, 4, 4), (64, 4, 3),
                                  (64, 4, 5), (64, 8, 4), (64, 8, 3), (32, 4, 4), (32, 4, 3), (256, 8, 3)):
            for tiles in (max(1, base.tiles * 128 // bn), max(1, base.tiles * 64 // bn)):
                if (bn, warps, stages, tiles) not in shapes:
                    shapes.append((bn, warps, stages, tiles))
    else:
        shapes.append((64, 4, 1, 2))
    by = batch * (ctx // PAGE) * PAGE_BYTES + q.numel() + w.numel() * 4 + out.numel() * 4
    res = []
    for bn, warps, stages, tiles in shapes:
        cfg = L.LaunchConfig(base.nn, base.hp, bn, tiles, warps, stages, base.fp8_dot)
        shape = {"block_n": bn, "num_warps": warps, "num_stages": stages, "tiles": tiles,
                 "chosen": (bn, warps, stages, tiles) == shapes[0]}
        try:
            us = timer(lambda: L.paged_logits(q, w, cache, tables[0], lengths, next_n=nn, page_size=PAGE,
                                              out=out, config=cfg))
            res.append(dict(shape, us=us, tbs=by / us * 1e-6, hbm_fraction=by / (us * 1e-6) / peak if peak else None))
        except Exception as e:  # noqa: BLE001 - a shape that does not compile or fit is data too
            res.append(dict(shape, error=f"{type(e).__name__}: {str(e)[:200]}"))
    timer.release()
    return {"batch": batch, "context": ctx, "next_n": nn, "results": res}
