"""Record kind=scores traces (include/spin/trace.h) of the real model over a real text.

One causal forward over the first `context` tokens of the book gives everything: teacher-forced
decoding on the real continuation is exactly the causal prefill of the full sequence, so the
score rows of the decode steps are rows of that forward. For `steps` decode steps of `next_n`
rows each, step s (0..steps) has ctx_len = context - (steps - s) * next_n; its row j is the query
at position ctx_len - next_n + j and sees positions [0, ctx_len - next_n + j + 1) (§3's rule).
Step 0 is the prefill's last row(s) (the reader's warm start); later steps are decode rows.

Score = log of the head-mean (9 query heads) attention probability of the row over the visible
positions; F32 `layer.{l}.scores [steps+1, next_n, context]`, columns beyond the row's visible
count hold -inf (the reader ignores them). `ctx_len` I64, and `accepted` I32 for next_n > 1:
the number of leading draft rows (1..next_n-1, the real next tokens) that the model's own greedy
choice at the row before agrees with — a real acceptance process.

Block probe (`layer.{l}.probe` F32 [steps+1, next_n, ceil(context / 64)], metadata
probe_block_entries=64): what a query-guided predictor (hisa, spin-hybrid) reads besides scores.
A serving engine keeps one mean-pooled key per 64-entry block and KV head, folding in each step's
committed entries (row 0's visible prefix; a step's draft rows are not pooled): kbar[b, kv]. The
row's query heads score it on the same scale as the trace's score:
    probe[b] = log mean_h softmax_b( q_h . kbar[b, kv(h)] / sqrt(D) + log n_b )
i.e. the head-mean share of attention the block would get if its n_b keys were all equal to their
mean (by Jensen a lower bound on exp-sum, exact for a uniform block): an estimate of the log of the
block's attention mass, Σ_{s in b} mean_h p_h(s) — the quantity whose max-entry term is the
trace's max-pooled block score. The softmax per head, before the head mean, is what makes it
comparable: the trace's score normalises each head too, so one head's large logits cannot outvote
the rest. Blocks the row sees that hold no committed entry (only this step's drafts) get 0 (= log 1,
"keep it": nothing is known); blocks past the row's visible ones -inf (ignored by the reader).

top-k: DSA keeps 2048 of up to 128K entries; a 2048 of 8K would be a quarter of the context, so
top-k is scaled to the context as 2048 * context / 65536 (3 % of the entries), rounded to a power
of two and clamped to [64, 2048]: 256 at 8K (written in the metadata).
"""

import json
import os
import time

import numpy as np

from . import assets
from .model import F32


def scaled_topk(context):
    t = 2048 * context / 65536
    return int(min(2048, max(64, 2 ** round(np.log2(max(t, 1))))))


def step_rows(context, steps, next_n):
    """[steps+1, next_n] query positions and ctx_len [steps+1]."""
    ctx = np.array([context - (steps - s) * next_n for s in range(steps + 1)], np.int64)
    rows = ctx[:, None] - next_n + np.arange(next_n)[None, :]
    return rows, ctx


def save_trace(path, tensors, metadata):
    from safetensors.numpy import save_file

    tmp = f"{path}.tmp-{os.getpid()}"
    save_file(tensors, tmp, metadata={k: str(v) for k, v in metadata.items()})
    os.replace(tmp, path)


PROBE_BLOCK = 64


class BlockKeyPool:
    """One layer's mean-pooled keys, kept incrementally: sums and counts per block and KV head,
    each fold() adding only the entries committed since the last one (float64 sums, so the order
    of the additions cannot matter at the precision the probe is written in)."""

    def __init__(self, n_blocks, n_kv, dim, block=PROBE_BLOCK):
        self.block = block
        self.sums = np.zeros((n_blocks, n_kv, dim), np.float64)
        self.counts = np.zeros(n_blocks, np.int64)
        self.pooled = 0

    def fold(self, k, committed):                       # k [positions, KV, D]
        p = self.pooled
        while p < committed:
            b = p // self.block
            end = min(committed, (b + 1) * self.block)
            self.sums[b] += k[p:end].sum(axis=0, dtype=np.float64)
            self.counts[b] += end - p
            p = end
        self.pooled = max(self.pooled, committed)

    def probe(self, q, visible, group, dim):
        """q [H, D] (RoPE applied, unscaled) -> probe of blocks [0, ceil(visible / block))."""
        nb = -(-visible // self.block)
        have = np.nonzero(self.counts[:nb] > 0)[0]
        out = np.zeros(nb, np.float64)                  # no committed entry yet: log 1, keep it
        kbar = self.sums[have] / self.counts[have, None, None]           # [B, KV, D]
        kv_of_head = np.arange(q.shape[0]) // group
        z = np.einsum("hd,bhd->hb", q.astype(np.float64), kbar[:, kv_of_head, :]) / np.sqrt(dim)
        z += np.log(self.counts[have])[None, :]
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        out[have] = np.log(p.mean(axis=0))
        return out


def block_probe(k, qrows, idx, rows, ctx, next_n, context, group, block=PROBE_BLOCK):
    """One layer's probe [S, n, ceil(context / block)] (see the module docstring): k [context,
    KV, D] the layer's keys, qrows [R, H, D] the recorded rows' queries, idx [S, n] row indices."""
    S = len(ctx)
    nb = -(-context // block)
    out = np.full((S, next_n, nb), -np.inf, F32)
    pool = BlockKeyPool(nb, k.shape[1], k.shape[2], block)
    for s in range(S):
        pool.fold(k, int(ctx[s] - next_n + 1))          # row 0's visible prefix is committed
        for j in range(next_n):
            p = pool.probe(qrows[idx[s, j]], int(rows[s, j] + 1), group, k.shape[2])
            out[s, j, :len(p)] = p
    return out


def build_trace(probs_rows, row_index, tokens, argmax, context, steps, next_n, model_name,
                extra_meta, keys=None, qrows=None, group=1):
    """probs_rows [layers, R, context] head-mean probabilities of the recorded rows;
    row_index: position -> index into R; argmax: position -> greedy next token; keys [layers,
    context, KV, D] and qrows [layers, R, H, D] (both or neither): the block probe."""
    rows, ctx = step_rows(context, steps, next_n)
    L = probs_rows.shape[0]
    idx = np.vectorize(row_index.__getitem__)(rows)            # [S, n]
    t = {"ctx_len": ctx}
    for l in range(L):
        with np.errstate(divide="ignore"):
            sc = np.log(probs_rows[l][idx])                     # [S, n, context]
        vis = np.arange(context)[None, None, :] <= rows[:, :, None]
        t[f"layer.{l}.scores"] = np.where(vis, sc, -np.inf).astype(F32)
        if keys is not None:
            t[f"layer.{l}.probe"] = block_probe(keys[l], qrows[l], idx, rows, ctx, next_n, context, group)
    if next_n > 1:
        acc = np.zeros(len(ctx), np.int32)
        for s in range(len(ctx)):
            a = 0
            for j in range(next_n - 1):
                if argmax[rows[s, j]] != tokens[rows[s, j] + 1]:
                    break
                a += 1
            acc[s] = a
        t["accepted"] = acc
    meta = dict(format="spin-trace", version=1, kind="scores", num_layers=L, next_n=next_n,
                page_size=64, topk=scaled_topk(context), compress_ratio=1, model=model_name)
    if keys is not None:
        meta.update(probe_block_entries=PROBE_BLOCK,
                    probe="log mean_h softmax_b(q_h.kbar_b/sqrt(D) + log n_b), kbar = mean committed key")
    meta.update(extra_meta)
    return t, meta


def trace_stats(scores_by_layer, ctx_len, topk, block=64):
    """All-keep statistics of a trace, row 0 of each step, per layer (include/spin/lab/metrics.h):
    prev-iter top-k recall |TopK(I_{t-1}) ∩ TopK(I_t)| / k, Pearson of consecutive steps'
    max-pooled block scores (the prev-iter block predictor) and of the entry scores themselves,
    and the share of visible 64-entry blocks holding >= 1 top-k entry."""
    from .dsa import topk_positions

    out = []
    for sc in scores_by_layer:                              # [S, n, E]
        rec, pb, pe, share = [], [], [], []
        prev = None
        for s in range(sc.shape[0]):
            vis = int(ctx_len[s] - sc.shape[1] + 1)
            row = sc[s, 0, :vis].astype(np.float64)
            fin = np.where(np.isfinite(row), row, np.nan)
            lo = np.nanmin(fin)
            row = np.where(np.isfinite(row), row, lo)
            top = topk_positions(row, topk)
            nb = -(-vis // block)
            pad = np.full(nb * block, -np.inf)
            pad[:vis] = row
            pooled = pad.reshape(nb, block).max(axis=1)
            share.append(len(np.unique(top // block)) / nb)
            if prev is not None:
                ptop, ppooled, prow = prev
                rec.append(len(np.intersect1d(ptop, top)) / len(top))
                pb.append(np.corrcoef(ppooled, pooled[:len(ppooled)])[0, 1])
                pe.append(np.corrcoef(prow, row[:len(prow)])[0, 1])
            prev = (top, pooled, row)
        out.append(dict(prev_iter_topk_recall=float(np.mean(rec)),
                        pearson_block_max=float(np.mean(pb)),
                        pearson_entries=float(np.mean(pe)),
                        topk_block_share=float(np.mean(share))))
    return out


def probe_stats(scores, probe, ctx_len, topk, block=PROBE_BLOCK):
    """How well one layer's probe ranks blocks, row 0 of each step: Pearson of the probe with the
    true max-pooled block scores over the blocks holding committed entries, and top-block recall
    |top-m probe blocks ∩ blocks holding >= 1 top-k entry| / m with m = the latter's count; beside
    it the same recall of the previous step's max-pooled scores (prev-iter's ranking)."""
    from .dsa import topk_positions

    pear, rec, prev_rec = [], [], []
    prev_pooled = None
    n = scores.shape[1]
    for s in range(scores.shape[0]):
        vis = int(ctx_len[s] - n + 1)
        row = scores[s, 0, :vis].astype(np.float64)
        lo = np.min(row[np.isfinite(row)])
        row = np.where(np.isfinite(row), row, lo)
        nb = -(-vis // block)
        pad = np.full(nb * block, -np.inf)
        pad[:vis] = row
        pooled = pad.reshape(nb, block).max(axis=1)
        hit = np.unique(topk_positions(row, topk) // block)
        m = len(hit)
        pr = probe[s, 0, :nb].astype(np.float64)
        pear.append(np.corrcoef(pr, pooled)[0, 1])
        order = np.argsort(-pr, kind="stable")[:m]
        rec.append(len(np.intersect1d(order, hit)) / m)
        if prev_pooled is not None:
            pp = np.concatenate([prev_pooled, np.full(nb - len(prev_pooled), np.inf)])  # new: keep
            prev_rec.append(len(np.intersect1d(np.argsort(-pp, kind="stable")[:m], hit)) / m)
        prev_pooled = pooled
    return dict(probe_pearson_block_max=float(np.mean(pear)), probe_topk_block_recall=float(np.mean(rec)),
                prev_iter_topk_block_recall=float(np.mean(prev_rec)))


def record(model, tok, text, out_dir, context=8192, steps=32, next_ns=(1, 2), extra_rows=(),
           keep_cache_to=None, log=print):
    """Runs the one forward, writes one trace per next_n and a JSON summary; returns it."""
    ids = np.array(tok.encode(text).ids, np.int64)
    if len(ids) < context:
        raise ValueError(f"text has {len(ids)} tokens, fewer than --context {context}")
    tokens = ids[:context]
    want = set(int(r) for r in extra_rows)
    for n in next_ns:
        want |= set(step_rows(context, steps, n)[0].ravel().tolist())
    rows = np.array(sorted(want), np.int64)
    row_index = {int(r): i for i, r in enumerate(rows)}
    t0 = time.time()
    out = model.prefill(tokens, record_rows=rows, keep_cache=True,  # the keys feed the probe
                        progress=lambda l: log(f"  layer {l + 1}/{model.w.n_layers} "
                                               f"({time.time() - t0:.0f} s)") if l % 10 == 9 else None)
    t_prefill = time.time() - t0
    hf = out["hf"]
    nll = model.nll(hf[:-1], tokens[1:])
    argmax = {int(r): int(np.argmax(model.logits(hf[r:r + 1])[0])) for r in rows}
    t_all = time.time() - t0
    os.makedirs(out_dir, exist_ok=True)
    topk = scaled_topk(context)
    extra = dict(text=assets.TEXT_NAME, text_package=assets.TEXT_PKG, text_file=assets.TEXT_MEMBER,
                 tokens=context, steps_decode=steps,
                 source="attention scores of a 135M Llama-style LM, NOT a DSA indexer",
                 score="log head-mean attention probability", topk_rule="2048*context/65536")
    summary = dict(model=assets.MODEL_NAME, context=context, steps=steps + 1, topk=topk,
                   prefill_s=round(t_prefill, 1), forward_and_lm_head_s=round(t_all, 1),
                   ppl=float(np.exp(nll.mean())), traces={})
    buckets = [(0, 64), (64, 256), (256, 1024), (1024, 2048), (2048, 4096), (4096, context - 1)]
    summary["loss_by_position"] = {f"{a}-{min(b, context - 1)}": float(nll[a:b].mean())
                                   for a, b in buckets if a < context - 1}
    for n in next_ns:
        t0p = time.time()
        t, meta = build_trace(out["probs"], row_index, tokens, argmax, context, steps, n,
                              assets.MODEL_NAME, extra, keys=out["k"], qrows=out["q"],
                              group=model.group)
        summary.setdefault("build_trace_s", {})[f"n{n}"] = round(time.time() - t0p, 1)
        path = os.path.join(out_dir, f"smollm2-ctx{context}-n{n}.safetensors")
        save_trace(path, t, meta)
        st = trace_stats([t[f"layer.{l}.scores"] for l in range(model.w.n_layers)],
                         t["ctx_len"], topk)
        for l, d in enumerate(st):
            d.update(probe_stats(t[f"layer.{l}.scores"], t[f"layer.{l}.probe"], t["ctx_len"], topk))
        info = dict(file=os.path.basename(path), next_n=n, steps=len(t["ctx_len"]),
                    ctx_len=[int(t["ctx_len"][0]), int(t["ctx_len"][-1])], per_layer=st,
                    mean={k: float(np.mean([s[k] for s in st])) for k in st[0]})
        if n > 1:
            info["accepted_mean"] = float(t["accepted"].mean())
            info["accepted_hist"] = np.bincount(t["accepted"], minlength=n).tolist()
        summary["traces"][f"n{n}"] = info
        log(f"wrote {path}")
    if keep_cache_to is not None:
        np.save(os.path.join(keep_cache_to, "k.npy"), out["k"])
        np.save(os.path.join(keep_cache_to, "v.npy"), out["v"])
        np.save(os.path.join(keep_cache_to, "nll.npy"), nll)
        np.save(os.path.join(keep_cache_to, "rows.npy"), rows)
        np.save(os.path.join(keep_cache_to, "probs.npy"), out["probs"])
    with open(os.path.join(out_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=1)
    return summary
