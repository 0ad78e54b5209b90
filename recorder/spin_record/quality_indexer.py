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
from .quality import SPARSITIES, make_configs
from .record import scaled_topk

PREDICTORS = ("spin", "spin-noexplore", "spin-hybrid", "hisa", "prev-iter", "step-reuse",
              "oracle", "random")


def prefix_keys(model, layers, weights_key, tokens, P, log):
    """The indexer's keys of the prefix tokens[:P] (and its last row's query), cached by content:
    one causal forward gives every layer's normed inputs (ix.capture), minutes on this machine."""
    h = hashlib.sha256()
    h.update(weights_key.encode() + np.asarray(tokens[:P], np.int64).tobytes())
    for f in ("indexer_signal.py", "model.py", "indexer.py", "fp8.py"):
        h.update(open(os.path.join(os.path.dirname(__file__), f), "rb").read())
    path = assets.cache_dir() / f"indexer-prefix-{h.hexdigest()[:16]}.npz"
    if path.exists():
        z = np.load(path)
        log(f"  indexer prefix keys cached: {path.name}")
        return IndexerPrefix(z["kc"], z["ks"], z["warm_qc"], z["warm_w"])
    t0 = time.time()
    X, _, _ = ix.capture(model, tokens[:P], [P - 1])
    pre = IndexerPrefix.from_inputs(layers, X, P)
    del X
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **pre.arrays())
    os.replace(tmp, path)
    log(f"  indexer prefix keys of {P} tokens computed in {time.time() - t0:.0f} s ({path.name})")
    return pre


def machine():
    """One line: CPU model, cores, load average (the numbers below are wall-clock times)."""
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True).stdout
        name = next((ln.split(":", 1)[1].strip() for ln in out.splitlines()
                     if ln.startswith("Model name")), platform.processor())
    except OSError:
        name = platform.processor()
    return f"{name}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}"


def run(model, tok, text, cdir, layers, weights_key, context, n_dec, log, predictors=PREDICTORS,
        quick=False):
    """Measurement A of quality.py with the indexer as the signal. Returns the result dict."""
    t_start = time.time()
    res = dict(signal="indexer (distilled, fp8 keys and queries)", context=context, block=64,
               decode_steps=n_dec, quick=quick, predictors=list(predictors),
               indexer_weights=weights_key, machine_start=machine())
    k, v, nll = np.load(cdir / "k.npy"), np.load(cdir / "v.npy"), np.load(cdir / "nll.npy")
    tokens = np.array(tok.encode(text).ids, np.int64)[:context]
    topk = scaled_topk(context)
    P = context - n_dec - 1
    res.update(topk=topk, prefix=P, scored_positions=[P + 1, P + n_dec])
    pre = prefix_keys(model, layers, weights_key, tokens, P, log)
    cfgs = make_configs(topk, quick, base=predictors)
    t0 = time.time()
    hfs, stats = dsa.decode(model, dsa.Prefix(k[:, :P], v[:, :P]), tokens[P:P + n_dec], cfgs, topk,
                            log=log, signal=IndexerSignal(layers, pre))
    res["loss_decode_s"] = round(time.time() - t0, 1)
    targets = tokens[P + 1:P + n_dec + 1]
    res["loss"] = {c.name: dict(loss=float(model.nll(hfs[:, b], targets).mean()), **stats[b])
                   for b, c in enumerate(cfgs)}
    res["loss_full_from_prefill"] = float(nll[P:P + n_dec].mean())
    res["total_s"] = round(time.time() - t_start, 1)
    res["machine_end"] = machine()
    log(f"  {len(cfgs)} configs x {n_dec} steps in {res['loss_decode_s']} s")
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
         "| config | loss (nats) | Δ vs full | Δ vs dense indexer top-k | top-k recall vs dense | block sparsity |",
         "|---|---:|---:|---:|---:|---:|"]
    for name, r in loss.items():
        L.append(f"| {name} | {r['loss']:.4f} | {r['loss'] - full:+.4f} | {r['loss'] - dense:+.4f} | "
                 f"{_f(r['recall'], '.3f')} | {_f(r['block_sparsity'], '.3f')} |")
    L += ["", f"Full attention decoded step by step: {full:.4f}; the same tokens from the causal "
          f"prefill: {res['loss_full_from_prefill']:.4f} (a check of the decode path).", "",
          f"Indexer weights: indexer-{res['indexer_weights']}. Times: decode {res['loss_decode_s']} s, "
          f"total {res['total_s']} s. Machine: {res['machine_start']} at the start, load average "
          f"{res['machine_end'].rsplit('load average ', 1)[-1]} at the end."]
    return "\n".join(L) + "\n"
