"""Record kind=scores traces (DESIGN.md §6) of the real model over a real text.

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

top-k: DSA keeps 2048 of up to 128K entries; a 2048 of 8K would be a quarter of the context, so
top-k is scaled to the context as 2048 * context / 65536 (3 % of the entries), rounded to a power
of two and clamped to [64, 2048]: 256 at 8K (decision of issue 12; written in the metadata).
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


def build_trace(probs_rows, row_index, tokens, argmax, context, steps, next_n, model_name,
                extra_meta):
    """probs_rows [layers, R, context] head-mean probabilities of the recorded rows;
    row_index: position -> index into R; argmax: position -> greedy next token."""
    rows, ctx = step_rows(context, steps, next_n)
    L = probs_rows.shape[0]
    idx = np.vectorize(row_index.__getitem__)(rows)            # [S, n]
    t = {"ctx_len": ctx}
    for l in range(L):
        with np.errstate(divide="ignore"):
            sc = np.log(probs_rows[l][idx])                     # [S, n, context]
        vis = np.arange(context)[None, None, :] <= rows[:, :, None]
        t[f"layer.{l}.scores"] = np.where(vis, sc, -np.inf).astype(F32)
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
    meta.update(extra_meta)
    return t, meta


def trace_stats(scores_by_layer, ctx_len, topk, block=64):
    """All-keep statistics of a trace, row 0 of each step, per layer (DESIGN.md §5):
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
    out = model.prefill(tokens, record_rows=rows, keep_cache=keep_cache_to is not None,
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
        t, meta = build_trace(out["probs"], row_index, tokens, argmax, context, steps, n,
                              assets.MODEL_NAME, extra)
        path = os.path.join(out_dir, f"smollm2-ctx{context}-n{n}.safetensors")
        save_trace(path, t, meta)
        st = trace_stats([t[f"layer.{l}.scores"] for l in range(model.w.n_layers)],
                         t["ctx_len"], topk)
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
