#!/usr/bin/env python3
"""spin's device path end to end, as an engine runs it: generated requests (spin's workloads, real
fp8 keys and queries) in a paged indexer cache with scattered pages, then per decode step

    select_layers → per layer: compact → paged logits (compacted table) → top-k over the compact
    width → observe_scored → remap to positions  …  commit

against the dense indexer's top-k on the same cache. Prints each step's recall and the share of
blocks skipped. On CUDA the logits are spin_dsa.device.paged_logits (Triton); on a CPU the C++
kernel spin_dsa.indexer_scores reads the same compacted table (no Triton needed).

    python examples/device_decode.py                      # CPU, 4 requests of doc-qa-10k
    python examples/device_decode.py --device cuda --requests 64 --scenario doc-qa-94k
"""
import argparse
import time

import numpy as np
import torch

import spin_dsa
import spin_dsa.device as sd


def paged_cache(traces, layer, page_size, rng):
    """One layer's cache, uint8 [pages, page_size·132], every request's pages scattered by one
    random permutation, and the block table int32 [batch, max_pages]."""
    pages = [-(-t.entries(layer) // page_size) for t in traces]
    perm = rng.permutation(sum(pages))
    cache = np.zeros((sum(pages), page_size * 132), np.uint8)
    table = np.zeros((len(traces), max(pages)), np.int32)
    used = 0
    for b, t in enumerate(traces):
        n = t.entries(layer)
        keys = np.zeros((pages[b] * page_size, 128), np.uint8)
        scales = np.ones(pages[b] * page_size, np.float32)
        keys[:n], scales[:n] = t.k(layer), t.k_scale(layer)
        for p in range(pages[b]):
            phys = int(perm[used])
            used += 1
            table[b, p] = phys
            cache[phys, :page_size * 128] = keys[p * page_size:(p + 1) * page_size].reshape(-1)
            cache[phys, page_size * 128:] = scales[p * page_size:(p + 1) * page_size].view(np.uint8)
    return cache, table


def logits(cache, table, lengths, q, w, page_size, device):
    """Indexer logits float32 [rows, table.shape[1] · page_size] over `table`'s pages."""
    if device.type == "cuda":
        return sd.paged_logits(q, w, cache, table, lengths.to(torch.int32), page_size=page_size)
    out = spin_dsa.indexer_scores(cache.numpy(), table.numpy(), lengths.numpy().astype(np.int64),
                                  q.numpy()[:, None], w.numpy()[:, None], page_size=page_size,
                                  logits_cols=table.shape[1] * page_size)
    return torch.from_numpy(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--scenario", default="doc-qa-10k", choices=spin_dsa.scenario_names())
    ap.add_argument("--requests", type=int, default=4)
    ap.add_argument("--steps", type=int, default=12, help="decode steps after the prefill")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sparsity", type=float, default=0.5)
    ap.add_argument("--predictor", default="spin", choices=sd.PREDICTORS)
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    a = ap.parse_args()
    device = torch.device(a.device)
    rng = np.random.default_rng(0)
    traces = [spin_dsa.generate_workload(a.scenario, steps=a.steps + 1, layers=a.layers,
                                         seed=i + 1) for i in range(a.requests)]
    ps, k = traces[0].meta["page_size"], traces[0].meta["topk"]
    caches = [paged_cache(traces, l, ps, rng) for l in range(a.layers)]
    caches = [(torch.from_numpy(c).to(device), torch.from_numpy(t).to(device)) for c, t in caches]
    max_entries = max(t.entries(0) for t in traces)
    serving = sd.Serving(a.requests, a.layers, max_entries, a.predictor,
                         {"target_sparsity": a.sparsity, "page_size": ps, "topk": k},
                         device=device)
    slots = torch.arange(a.requests, dtype=torch.int32, device=device)
    for i in range(a.requests):
        serving.add(i, 1000 + i)
    q = lambda l, s: torch.from_numpy(np.stack([t.q(l)[s, 0] for t in traces])).to(device)
    w = lambda l, s: torch.from_numpy(np.stack([t.w(l)[s, 0] for t in traces])).to(device)
    print(f"{a.requests} × {a.scenario}, {a.layers} layers, {a.predictor} at {a.sparsity:.0%} "
          f"block sparsity, on {device} (select: {serving.impl})")
    for s in range(a.steps + 1):
        seq = torch.tensor([t.ctx_len[s] for t in traces], dtype=torch.int64, device=device)
        if s == 0:  # the prompt's row, scored in full anyway by prefill: observed, not counted
            for l, (cache, table) in enumerate(caches):
                serving.prefill(slots, l, seq, logits(cache, table, seq, q(l, s), w(l, s), ps,
                                                      device))
            serving.commit(slots)
            continue
        t0 = time.perf_counter()
        blocks, counts = serving.select_layers(slots, seq, 1)
        recall, scored = [], 0
        for l, (cache, table) in enumerate(caches):
            ctable, lengths = sd.compact(blocks[l], counts[l], table, seq, 1, page_size=ps)
            compact = logits(cache, ctable, lengths, q(l, s), w(l, s), ps, device)
            cols = sd.topk(compact, lengths, k)
            serving.observe_scored(slots, l, compact, cols, blocks=blocks[l])
            mine = sd.remap(cols, blocks[l], serving.block_entries)
            dense = sd.topk(logits(cache, table, seq, q(l, s), w(l, s), ps, device), seq, k)
            for r in range(a.requests):
                truth = set(dense[r][dense[r] >= 0].tolist())
                recall.append(len(truth & set(mine[r][mine[r] >= 0].tolist())) / len(truth))
            scored += int(counts[l].sum())
        serving.commit(slots)
        visible = int((-(-seq // ps)).sum()) * a.layers
        print(f"step {s:3d}: recall {np.mean(recall):.3f}, blocks skipped "
              f"{1 - scored / visible:.1%}, {1e3 * (time.perf_counter() - t0):.0f} ms")


if __name__ == "__main__":
    main()
