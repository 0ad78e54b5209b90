"""Task quality with the distilled DSA lightning indexer in the loop (`quality --signal indexer`).

The model decodes with DSA emulated (dsa.decode with an indexer_signal.IndexerSignal): at every
step and layer the distilled indexer (fp8 form) scores the entries of the blocks a predictor
picked, its top-k (256) plus the sink and newest 64-token block are attended, and the result
feeds every later layer and step. Per predictor and block sparsity: the teacher-forced loss of
the held-out continuation next to full attention and dense indexer top-k (every block scored),
the top-k recall against the dense indexer top-k of the same row, and the block sparsity
actually reached.

Texts (token offsets into the book's tokenisation): the indexer trained on [16384, 24576)
(distill.py; held-out KL on [24576, 28672)); this measurement reads the evaluation text
[0, 8192) only: prefix [0, P), P = context - decode - 1, then `decode` tokens fed one at a time,
and the loss is over the book's tokens at positions P + 1 .. context - 1 (the last `decode`
tokens of the 8K window), disjoint from every text the indexer saw in training.
"""

import hashlib
import os
import platform
import subprocess
import time

import numpy as np

from . import assets, dsa, indexer as ix
from .indexer_signal import IndexerPrefix, IndexerSignal
from .model import F32, rms_norm
from .quality import (NEEDLE_AT, PASSKEY_AT, exact_answers, make_configs, needles,
                      passkey_haystack)
from .record import scaled_topk

PREDICTORS = ("spin", "spin-noexplore", "spin-hybrid", "hisa", "prev-iter", "step-reuse",
              "oracle", "random")


def prefix_cache(model, layers, weights_key, tokens, P, n_dec, log):
    """What every decode here starts from, cached by content: one causal forward over
    tokens[:P + n_dec] (ix.capture, minutes on this machine) gives the indexer's keys of [0, P)
    and its last row's query (IndexerPrefix), the model's K/V of [0, P), and the full-attention
    loss of the scored tokens from the prefill (the decode path's check). Self-contained: the
    score recording's cache is not needed."""
    h = hashlib.sha256()
    h.update(f"{weights_key} {P} {n_dec}".encode() + np.asarray(tokens[:P + n_dec + 1], np.int64).tobytes())
    for f in ("indexer_signal.py", "model.py", "indexer.py", "fp8.py"):
        h.update(open(os.path.join(os.path.dirname(__file__), f), "rb").read())
    path = assets.cache_dir() / f"indexer-prefix-{h.hexdigest()[:16]}.npz"
    if path.exists():
        log(f"  prefix (indexer keys, K/V) cached: {path.name}")
        z = np.load(path)
        return IndexerPrefix(z["kc"], z["ks"], z["warm_qc"], z["warm_w"]), z["k"], z["v"], float(z["nll"])
    t0 = time.time()
    rows = np.arange(P, P + n_dec)
    X, _, hf, K, V = ix.capture(model, tokens[:P + n_dec], rows, keep_kv=True)
    pre = IndexerPrefix.from_inputs(layers, X, P)
    del X
    k, v = K[:, :P], V[:, :P]
    nll = float(model.nll(hf, tokens[P + 1:P + n_dec + 1]).mean())
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez(tmp, k=k, v=v, nll=np.array(nll), **pre.arrays())
    os.replace(tmp, path)
    log(f"  prefix of {P} tokens (indexer keys, K/V) computed in {time.time() - t0:.0f} s ({path.name})")
    return pre, k, v, nll


def prefill_inputs(model, tokens, past):
    """model.prefill's causal forward after a cached past (k, v [L, S, KV, D]), keeping what the
    indexer needs: each layer's normed inputs X [L, T, d] of the new tokens, and K/V [L, S + T,
    KV, D] for the decode (model.py is the indexer weights' cache key: not changed for this)."""
    W = model.w
    tokens = np.asarray(tokens, np.int64)
    S, T = past[0].shape[1], len(tokens)
    pos = np.arange(S, S + T)
    X = np.empty((W.n_layers, T, W.d_model), F32)
    K, V = [], []
    x = W.embed[tokens]
    for l in range(W.n_layers):
        L = W.layers[l]
        X[l] = rms_norm(x, L["attn_norm"], W.eps)
        q, k, v = model.qkv(l, X[l], pos)
        K.append(np.concatenate([past[0][l], k]))
        V.append(np.concatenate([past[1][l], v]))
        x = x + model._causal_attention(q, K[-1], V[-1], 512, None, None, l) @ L["wo"]
        x = model.mlp(l, x)
    return X, np.stack(K), np.stack(V)


def haystack(model, layers, hay, start, book, k, v):
    """(dsa.Prefix, IndexerPrefix) of a haystack equal to the book on [0, start): the book's K/V
    and indexer keys there, one forward for the rest."""
    X, K, V = prefill_inputs(model, hay[start:], (k[:, :start], v[:, :start]))
    ipre = IndexerPrefix.from_inputs(layers, X, len(hay), head=(book.kc[:, :start], book.ks[:, :start]))
    return dsa.Prefix(K, V), ipre


def retrieval(model, tok, tokens, k, v, layers, book, context, topk, predictors, quick, log):
    """quality.py's C (five needles, each asked once) and D (one pass key at each of three
    depths) with the indexer in the loop; question and answer decoded teacher-forced, exact =
    every answer token is the greedy choice."""
    enc = lambda s: tok.encode(s).ids  # noqa: E731
    out = {}
    nd = needles(enc, tokens, context, NEEDLE_AT[:3] if quick else NEEDLE_AT)
    t0 = time.time()
    hp, ip = haystack(model, layers, nd["hay"], nd["at"][0], book, k, v)
    inputs, answers, names, cfgs = [], [], [], []
    for qi, (seq, a) in enumerate(zip(nd["queries"], nd["answers"])):
        for cf in make_configs(topk, quick, base=predictors, request_id=qi):
            inputs.append(seq[:-1])
            answers.append(a)
            names.append(cf.name)
            cfgs.append(cf)
    hfs, st = dsa.decode(model, hp, np.array(inputs, np.int64), cfgs, topk, log=log,
                         signal=IndexerSignal(layers, ip))
    out["retrieval"], pq = exact_answers(model, hfs, names, answers, nd["q_len"], st)
    out["retrieval_per_query"] = pq
    out["needles"] = dict(at=nd["at"], colours=nd["colours"], codes=nd["codes"],
                          context=len(nd["hay"]) + nd["q_len"] + nd["a_len"])
    out["retrieval_s"] = round(time.time() - t0, 1)
    log(f"  multi-key: {len(cfgs)} sequences in {out['retrieval_s']} s")
    if quick:
        return out
    rng = np.random.default_rng(7)  # quality.passkey's draws: the same codes
    t0 = time.time()
    pk = {}
    for i, at in enumerate(PASSKEY_AT):
        hay, q, a = passkey_haystack(enc, tokens, context, at, rng)
        hp, ip = haystack(model, layers, hay, at, book, k, v)
        cfgs = make_configs(topk, False, base=predictors, request_id=100 + i)
        hfs, _ = dsa.decode(model, hp, q + a[:-1], cfgs, topk, signal=IndexerSignal(layers, ip))
        r, _ = exact_answers(model, hfs, [c.name for c in cfgs], [a] * len(cfgs), len(q))
        for name, x in r.items():
            d = pk.setdefault(name, dict(exact=0, tokens_ok=0, tokens=0, queries=0, per_depth=[]))
            for f in ("exact", "tokens_ok", "tokens"):
                d[f] += x[f]
            d["queries"] += 1
            d["per_depth"].append(bool(x["exact"]))
        log(f"  passkey at {at}: full {'ok' if pk['full']['per_depth'][-1] else 'wrong'} "
            f"({time.time() - t0:.0f} s)")
    out["passkey"] = pk
    out["passkey_s"] = round(time.time() - t0, 1)
    return out


def paired_se(a, b):
    """Standard error of mean(a - b) over the scored tokens (paired: the same tokens), the
    yardstick for a loss difference between two configs."""
    d = np.asarray(a, np.float64) - np.asarray(b, np.float64)
    return float(d.std(ddof=1) / np.sqrt(len(d))) if len(d) > 1 else None


def machine():
    """One line: CPU model, cores, load average (the numbers below are wall-clock times)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name")), platform.processor())
    except OSError:
        name = platform.processor()
    return f"{name}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"


def run(model, tok, text, layers, weights_key, context, n_dec, log, predictors=PREDICTORS,
        quick=False, with_retrieval=True):
    """quality.py's A (loss), and C and D (retrieval) unless with_retrieval is False, with the
    indexer as the signal. Returns the result dict."""
    t_start = time.time()
    res = dict(signal="indexer (distilled, fp8 keys and queries)", context=context, block=64,
               decode_steps=n_dec, quick=quick, predictors=list(predictors),
               indexer_weights=weights_key, machine_start=machine())
    tokens = np.array(tok.encode(text).ids, np.int64)[:context]
    if len(tokens) < context or n_dec < 1 or n_dec >= context // 2:
        raise ValueError(f"quality: context {context} and decode {n_dec} do not fit the book")
    topk = scaled_topk(context)
    P = context - n_dec - 1
    res.update(topk=topk, prefix=P, scored_positions=[P + 1, P + n_dec])
    pre, k, v, nll_prefill = prefix_cache(model, layers, weights_key, tokens, P, n_dec, log)
    cfgs = make_configs(topk, quick, base=predictors)
    t0 = time.time()
    hfs, stats = dsa.decode(model, dsa.Prefix(k[:, :P], v[:, :P]), tokens[P:P + n_dec], cfgs, topk,
                            log=log, signal=IndexerSignal(layers, pre))
    res["loss_decode_s"] = round(time.time() - t0, 1)
    targets = tokens[P + 1:P + n_dec + 1]
    nll = {c.name: model.nll(hfs[:, b], targets) for b, c in enumerate(cfgs)}
    res["loss"] = {c.name: dict(loss=float(nll[c.name].mean()), nll=nll[c.name].tolist(),
                                se_vs_dense=paired_se(nll[c.name], nll["dense-topk"]), **stats[b])
                   for b, c in enumerate(cfgs)}
    res["loss_full_from_prefill"] = nll_prefill
    log(f"  loss: {len(cfgs)} configs x {n_dec} steps in {res['loss_decode_s']} s")
    if with_retrieval:
        res.update(retrieval(model, tok, tokens, k, v, layers, pre, context, topk, predictors,
                             quick, log))
    res["total_s"] = round(time.time() - t_start, 1)
    res["machine_end"] = machine()
    return res


def _f(x, fmt):
    return "—" if x is None else format(x, fmt)


def format_report(res):
    loss = res["loss"]
    full, dense = loss["full"]["loss"], loss["dense-topk"]["loss"]
    P, (a, b) = res["prefix"], res["scored_positions"]
    L = ["# Task quality with the distilled DSA indexer in the loop (SmolLM2-135M, closed loop)", "",
         f"Signal: {res['signal']} (recorder/spin_record/indexer_signal.py). Context "
         f"{res['context']}, top-k {res['topk']} over the scored blocks' entries (+ the sink and "
         f"newest 64-token block). Loss: teacher-forced, the book's tokens at positions {a}..{b} "
         f"({res['decode_steps']} decode steps after a {P}-token prefix; evaluation text [0, 8192), "
         f"disjoint from the indexer's training [16384, 24576) and held-out [24576, 28672) "
         f"tokens). Recall: |top-k ∩ dense indexer top-k| / k of the same row; block sparsity: "
         f"the share of blocks not scored, as reached.", "",
         "| config | loss (nats) | Δ vs full | Δ vs dense indexer top-k (± paired SE) | top-k recall vs dense | block sparsity | multi-key exact (answer tokens) | passkey exact (answer tokens) |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    retr, pk = res.get("retrieval", {}), res.get("passkey", {})

    def exact(d, name):
        if name not in d:
            return "—"
        x = d[name]
        return f"{x['exact']}/{x['queries']} ({x['tokens_ok']}/{x['tokens']})"

    for name, r in loss.items():
        se = "" if name == "dense-topk" or r.get("se_vs_dense") is None else f" ± {r['se_vs_dense']:.4f}"
        L.append(f"| {name} | {r['loss']:.4f} | {r['loss'] - full:+.4f} | {r['loss'] - dense:+.4f}{se} | "
                 f"{_f(r['recall'], '.3f')} | {_f(r['block_sparsity'], '.3f')} | {exact(retr, name)} | "
                 f"{exact(pk, name)} |")
    L += ["", f"Full attention decoded step by step: {full:.4f}; the same tokens from the causal "
          f"prefill: {res['loss_full_from_prefill']:.4f} (a check of the decode path)."]
    if "needles" in res:
        nd = res["needles"]
        L += ["", f"Multi-key: {len(nd['at'])} needles at token offsets {nd['at']} of a "
              f"{nd['context']}-token haystack (the book with needles; its first {nd['at'][0]} "
              f"tokens are the evaluation text's), each asked once; full attention per needle: "
              + ", ".join("ok" if x else "wrong" for x in res["retrieval_per_query"]["full"]) + "."]
    if pk:
        L.append(f"Passkey: one needle per haystack at {list(PASSKEY_AT)}; full attention: "
                 + ", ".join("ok" if x else "wrong" for x in pk["full"]["per_depth"]) + ".")
    times = f"loss decode {res['loss_decode_s']} s"
    if "retrieval_s" in res:
        times += f", multi-key {res['retrieval_s']} s"
    if "passkey_s" in res:
        times += f", passkey {res['passkey_s']} s"
    L += ["", f"Indexer weights: indexer-{res['indexer_weights']}. Times: {times}, total "
          f"{res['total_s']} s. Machine: {res['machine_start']} at the start, load average "
          f"{res['machine_end'].rsplit('load average ', 1)[-1]} at the end."]
    return "\n".join(L) + "\n"
