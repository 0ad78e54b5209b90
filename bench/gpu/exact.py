"""Exact on the device: what the GPU run checks before it times anything.

- `check_logits`: spin's Triton logits kernel over a compacted table against the float64
  reference, within the documented bound (error ≤ tol · B, B = k_scale · Σ_h |w_h| · Σ_d |q_d k_d|;
  tol 1e-3 on a GPU, whose fp8 MMA accumulates in fewer bits than fp32), the same -inf pattern;
  spin's exact top-k against the sort definition. `check_deepgemm_logits`: DeepGEMM's logits on
  the same table (2-D context_lens) against the same reference — the production kernel reading
  spin's compacted table (run after the Triton figures: whatever it does, they are kept).
- `check_selections`: a decode step (select_layers → per layer: compact → scores gathered over
  the compact columns → exact top-k → observe → remap; then commit) captured as one CUDA graph
  and replayed step after step over a generated trace, the C++ library (spin_dsa.Serving, on
  this machine's CPU) fed the same scores and acceptances: every layer's blocks and counts must
  be equal, bit for bit, and the device's top-k positions equal the host's sort definition.
"""
from __future__ import annotations

import numpy as np

from chain import PAGE, DIM, DeepGemm, make_inputs, random_blocks


def compacted_case(env, nn):
    """A small compacted case: (table, lengths, q, w, cache, float64 reference, bound B, tolerance)."""
    torch, device, P, L = env["torch"], env["device"], env["P"], env["L"]
    batch, ctx = 2, 2048 if device.type == "cuda" else 256
    cache, tables, q, w, seq_lens = make_inputs(torch, device, batch, ctx, 1, seed=1, nn=nn)
    blocks, counts = random_blocks(torch, device, batch, ctx, 1, 0.5, seed=2, nn=nn)
    t, lengths = P.compact(blocks[0], counts[0], tables[0], seq_lens, nn, page_size=PAGE)
    ref = L.paged_logits_reference(q, w, cache, t, lengths, next_n=nn, page_size=PAGE)
    positive = cache.clone()
    positive[:, :PAGE * DIM] &= 0x7F
    bound = L.paged_logits_reference(q & 0x7F, w.abs(), positive, t, lengths, next_n=nn, page_size=PAGE)
    tol = 1e-3 if device.type == "cuda" else 2e-5
    return t, lengths, q, w, cache, ref, bound, tol


def max_error_over_bound(torch, x, ref, bound):
    fin = torch.isfinite(ref)
    x = x[:, :ref.shape[1]].float()
    return float(((x[fin] - ref[fin]).abs() / (bound[fin] + 1e-30)).max()) if bool(fin.any()) else 0.0


def check_logits(env, nn):
    torch, P, L = env["torch"], env["P"], env["L"]
    t, lengths, q, w, cache, ref, bound, tol = compacted_case(env, nn)
    out = L.paged_logits(q, w, cache, t, lengths, next_n=nn, page_size=PAGE)
    err = max_error_over_bound(torch, out, ref, bound)
    same_inf = bool(torch.equal(torch.isinf(out), torch.isinf(ref)))
    exact = bool(torch.equal(P.topk(ref, lengths, 64), P.topk_reference(ref, lengths, 64)))
    return {"next_n": nn, "logits_max_error_over_bound": err, "tolerance": tol,
            "logits_inf_pattern_equal": same_inf, "topk_equals_sort_definition": exact,
            "ok": same_inf and exact and err <= tol}


def check_deepgemm_logits(env, nn):
    """DeepGEMM's logits on a compacted table (2-D context_lens) against the float64 reference,
    within the bound; columns past each row's length are DeepGEMM's to leave unclean, unchecked."""
    if env["deep_gemm"] is None:
        return {"skipped": env["deep_gemm_note"]}
    torch, device, P = env["torch"], env["device"], env["P"]
    t, lengths, q, w, cache, ref, bound, tol = compacted_case(env, nn)
    dg = DeepGemm(torch, env["deep_gemm"], device, q, w, cache, nn)
    lens = P.deepgemm_context_lens(lengths, nn)
    err = max_error_over_bound(torch, dg.logits(t, lens, dg.schedule(lens), t.shape[1] * PAGE), ref, bound)
    return {"next_n": nn, "entry": dg.entry, "max_error_over_bound": err, "tolerance": tol, "ok": err <= tol}


# ------------------------------------------------------------------------------------------------
# Device selections against the library
# ------------------------------------------------------------------------------------------------

class Traffic:
    """Per-(request, layer) block preferences that drift, jump now and then (so history pays and
    fails), plus noise and recency: float32 scores of every position, one step at a time."""

    def __init__(self, seed, requests, layers, max_entries, E):
        self.rng = np.random.default_rng(seed)
        self.E = E
        self.pref = self.rng.standard_normal((requests, layers, -(-max_entries // E))).astype(np.float32) * 3

    def step(self, seq, max_entries):
        """float32 [layers, requests, max_entries]: every position's score this step."""
        R, Ln, N = self.pref.shape
        jump = self.rng.random((R, Ln)) < 0.1
        self.pref[jump] = self.rng.standard_normal((int(jump.sum()), N)).astype(np.float32) * 3
        self.pref += self.rng.standard_normal(self.pref.shape).astype(np.float32) * 0.3
        pos = np.arange(max_entries)
        s = self.pref[:, :, pos // self.E] + self.rng.standard_normal((R, Ln, max_entries)).astype(np.float32)
        s += (2.0 * np.exp(-np.clip(seq[:, None, None] - 1 - pos, 0, None) / 64.0)).astype(np.float32)
        return np.ascontiguousarray(s.transpose(1, 0, 2))


def topk_positions(row, k):
    """The top-k set of one row (score descending, position ascending), ascending, -1 padded."""
    pos = np.flatnonzero(np.isfinite(row))
    chosen = np.sort(pos[np.lexsort((pos, -row[pos]))[:k]])
    out = np.full(k, -1, dtype=np.int32)
    out[:chosen.size] = chosen
    return out


def compact_scores(full, blocks, counts, visible, E):
    """Host mirror of the graph's gather: row r's c-th block at columns [c·E, (c+1)·E), -inf
    past the row's visible entries and past its blocks."""
    rows, width = blocks.shape
    col = np.arange(width * E)
    b = blocks[:, col // E].astype(np.int64)
    pos = b * E + col % E
    ok = (col[None, :] < counts[:, None] * E) & (b >= 0) & (pos < visible[:, None])
    out = np.full((rows, width * E), -np.inf, dtype=np.float32)
    out[ok] = np.take_along_axis(full, np.where(ok, pos, 0), axis=1)[ok]
    return out


class Step:
    """The captured decode step and its persistent inputs (scores, sequence lengths, accepted
    drafts) and outputs (every layer's blocks, counts and top-k positions)."""

    def __init__(self, env, dev, requests, layers, max_entries, nn):
        torch, device = env["torch"], env["device"]
        self.env, self.dev, self.nn, self.layers = env, dev, nn, layers
        self.k, self.E = int(dev.config["topk"]), dev.block_entries
        rows = requests * nn
        self.slots = torch.arange(requests, device=device)
        self.seq = torch.zeros(requests, dtype=torch.int64, device=device)
        self.accepted = torch.zeros(requests, dtype=torch.int64, device=device)
        self.scores = torch.zeros((layers, rows, max_entries), dtype=torch.float32, device=device)
        self.table = torch.arange(requests * dev.max_blocks, dtype=torch.int32,
                                  device=device).view(requests, dev.max_blocks)
        self.blocks = torch.zeros((layers, rows, dev.width), dtype=torch.int32, device=device)
        self.counts = torch.zeros((layers, rows), dtype=torch.int32, device=device)
        self.topk = torch.zeros((layers, rows, self.k), dtype=torch.int32, device=device)
        self.stats = torch.zeros(3, dtype=torch.int64, device=device)   # compact's counters, as the plugin's
        self.graph = None

    def body(self):
        torch, P = self.env["torch"], self.env["P"]
        E, nn, dev = self.E, self.nn, self.dev
        blocks, counts = dev.select_layers(self.slots, self.seq, nn)
        col = torch.arange(dev.width * E, device=self.seq.device)
        for layer in range(self.layers):
            b, c = blocks[layer], counts[layer]
            _, lengths = P.compact(b, c, self.table, self.seq, nn, page_size=E, counters=self.stats)
            pos = b.long().clamp_min(0)[:, col // E] * E + col % E
            pos = pos.clamp_max(self.scores.shape[2] - 1)
            scored = self.scores[layer].gather(1, pos)
            scored = torch.where(col[None, :] < lengths[:, None], scored, float("-inf"))
            top = P.topk(scored, lengths, self.k)
            # What the vLLM plugin runs: observe writes the positions (remap fused).
            dev.observe_scored(self.slots, layer, scored, top, positions=self.topk[layer], blocks=b)
            self.blocks[layer].copy_(b)
            self.counts[layer].copy_(c)
        dev.commit(self.slots, self.accepted)

    def run(self):
        """The first call runs eagerly (Triton compiles), later ones replay the captured graph."""
        torch = self.env["torch"]
        if self.env["device"].type != "cuda":
            return self.body()
        if self.graph is None:
            self.body()
            torch.cuda.synchronize()
            self.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self.graph):
                self.body()
            return None
        self.graph.replay()
        return None


def check_selections(env, nn, steps, requests=8, layers=3, max_entries=16384, topk=512,
                     kth_search="bitwise"):
    """Device (CUDA graph replays) vs library, `steps` decode steps after a prefill: the number of
    layer selections compared, replays, and the first mismatch if any. kth_search: the select
    kernel's k-th search (Serving.kth_search)."""
    torch, device = env["torch"], env["device"]
    import spin_dsa
    config = {"target_sparsity": 0.5, "topk": topk}
    lib = spin_dsa.Serving(requests, layers, max_entries, "spin", config, nn)
    dev = env["Serving"](requests, layers, max_entries, "spin", config, max_next_n=nn, device=device,
                         impl=env["impl"])
    if hasattr(dev, "kth_search"):
        dev.kth_search = kth_search
    E, k = dev.block_entries, topk
    rng = np.random.default_rng(20261204 + nn)
    traffic = Traffic(7 + nn, requests, layers, max_entries, E)
    seq = rng.integers(max_entries // 8, max_entries // 2, size=requests).astype(np.int64)
    slots = np.arange(requests, dtype=np.int32)
    for s in range(requests):
        lib.add(s, 100 + 7 * s)
        dev.add(s, 100 + 7 * s)
    prefill(lib, dev, torch, device, traffic, slots, seq, layers, max_entries)
    step = Step(env, dev, requests, layers, max_entries, nn)
    res = {"next_n": nn, "requests": requests, "layers": layers, "max_entries": max_entries, "topk": k,
           "width": dev.width, "impl": dev.impl, "kth_search": kth_search, "steps": 0, "graph_replays": 0, "selections_compared": 0,
           "topk_rows_compared": 0, "first_mismatch": None, "ok": False}
    for t in range(steps):
        seq += nn                                    # this step's rows enter the cache
        if int(seq.max()) > max_entries:
            break
        full = traffic.step(seq, max_entries)        # [layers, requests, max_entries]
        full_rows = np.repeat(full, nn, axis=1)      # every row of a request reads its scores
        accepted = rng.integers(0, nn, size=requests)
        step.scores.copy_(torch.from_numpy(full_rows))
        step.seq.copy_(torch.from_numpy(seq))
        step.accepted.copy_(torch.from_numpy(accepted))
        replayed = step.graph is not None
        step.run()
        got_blocks, got_counts, got_topk = (x.cpu().numpy() for x in (step.blocks, step.counts, step.topk))
        visible = np.maximum(0, seq[:, None] - nn + 1 + np.arange(nn)[None, :]).reshape(-1)
        for layer in range(layers):
            want = lib.select(slots, layer, seq, nn).copy()
            counts = lib.counts(requests * nn).copy()
            where = f"step {t} layer {layer}"
            if not (np.array_equal(want[:, :dev.width], got_blocks[layer]) and np.array_equal(counts, got_counts[layer])
                    and (want[:, dev.width:] == -1).all()):
                res["first_mismatch"] = f"{where}: device blocks differ from the library's"
                return res
            scored = compact_scores(full_rows[layer], want[:, :dev.width], counts, visible, E)
            top = np.full((requests * nn, k), -1, dtype=np.int32)
            for r in range(requests * nn):
                row = np.full(max_entries, -np.inf, dtype=np.float32)
                cols = np.flatnonzero(np.isfinite(scored[r]))
                row[want[r, cols // E].astype(np.int64) * E + cols % E] = scored[r, cols]
                top[r] = topk_positions(row, k)
            if not np.array_equal(top, got_topk[layer]):
                res["first_mismatch"] = f"{where}: device top-k positions differ from the sort definition"
                return res
            lib.observe_scored(slots, layer, scored, top)
            res["selections_compared"] += 1
            res["topk_rows_compared"] += requests * nn
        lib.commit(slots, accepted.astype(np.int32))
        seq -= nn - 1 - accepted                      # rejected drafts leave the cache
        res["steps"] += 1
        res["graph_replays"] += int(replayed)
    res["ok"] = res["first_mismatch"] is None and res["steps"] == steps
    return res


def prefill(lib, dev, torch, device, traffic, slots, seq, layers, max_entries):
    """Each prompt's full row per layer, then commit (the warm start of both sides)."""
    full = traffic.step(seq, max_entries)
    pos = np.arange(max_entries)
    for layer in range(layers):
        logits = np.where(pos[None, :] < seq[:, None], full[layer], -np.inf).astype(np.float32)
        lib.prefill(slots, layer, seq, logits)
        dev.prefill(torch.from_numpy(slots).to(device), layer, torch.from_numpy(seq).to(device),
                    torch.from_numpy(logits).to(device))
    lib.commit(slots)
    dev.commit(torch.from_numpy(slots).to(device))
