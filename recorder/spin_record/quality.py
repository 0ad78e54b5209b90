"""Task quality on the real model with the DSA pipeline emulated.

Three measurements, all from the recording's cached forward (KV cache of the first `context`
tokens of the book) so that no 8K prefill is repeated:
  A. teacher-forced loss of the last `decode` tokens of the 8K window, decoded step by step
     through dsa.decode for every (selector, sparsity), next to full attention and dense top-k;
  B. loss vs context (full attention): the same 256 target tokens with 16 ... 7936 tokens before;
  C. multi-key retrieval from real text: five needles ("The secret code of the <colour> door is
     <5 digits>.") inserted into the book at token offsets 4096-7680 of an ~8K context; each is
     asked for after the text; the question and the answer are decoded through the pipeline
     (teacher-forced), exact match = every answer token is the model's greedy choice.
"""

import time

import numpy as np

from . import dsa, selectors
from .record import scaled_topk

SPARSITIES = (0.3, 0.5, 0.7)
PREDICTORS = ("oracle", "prev-iter", "random")
NEEDLE_AT = (4096, 5120, 6144, 7040, 7680)
COLOURS = ("red", "blue", "green", "yellow", "white", "black", "orange", "brown", "pink", "grey")


def make_configs(topk, quick, extra=(), request_id=0, base=PREDICTORS):
    """full, dense-topk, then every predictor of `base` + `extra` at every sparsity (one
    sequence each); names are Python baselines or C++ specs (selectors.make_selector)."""
    cfg = [dsa.Config("full"), dsa.Config("dense-topk", selectors.Dense(0.0, topk), 0.0)]
    for s in ((0.5,) if quick else SPARSITIES):
        for p in tuple(base) + tuple(extra):
            sel = selectors.make_selector(p, s, topk, seed=1, request_id=request_id)
            cfg.append(dsa.Config(f"{p}@{s:.1f}", sel, s))
    return cfg


def available_extra(names, log):
    """The spin_dsa predictors asked for, if the bindings import (else none, said once)."""
    if not names:
        return ()
    try:
        import spin_dsa  # noqa: F401
        for n in names:  # a misspelt name or field fails here, before a long decode
            if getattr(selectors.make_selector(n, 0.5, 256), "needs_keys", False):
                raise ValueError(f"predictor {n!r} reads the indexer's keys: use --signal indexer")
    except ImportError as e:
        log(f"  spin_dsa not installed ({e}): {', '.join(names)} skipped (recorder/README.md)")
        return ()
    return tuple(names)


def _warm(probs, row):
    with np.errstate(divide="ignore"):
        return np.log(probs[:, row, :row + 1]).astype(np.float32)


def loss_vs_context(model, tokens, base_nll, context, log, span=256, contexts=(16, 64, 256, 1024, 2048)):
    T0 = context - span
    out = {}
    for c in contexts:
        w0 = T0 - c
        hf = model.prefill(tokens[w0:context], final_rows=np.arange(c - 1, c + span - 1))["hf"]
        out[c] = float(model.nll(hf, tokens[T0:context]).mean())
        log(f"  loss vs context: {c} tokens before -> {out[c]:.3f}")
    out[T0] = float(base_nll[T0 - 1:context - 1].mean())
    return out


def run(model, tok, text, cdir, context, n_dec, quick, log, predictors=()):
    t_start = time.time()
    k, v = np.load(cdir / "k.npy"), np.load(cdir / "v.npy")
    nll, rows, probs = np.load(cdir / "nll.npy"), np.load(cdir / "rows.npy"), np.load(cdir / "probs.npy")
    row_index = {int(r): i for i, r in enumerate(rows)}
    ids = np.array(tok.encode(text).ids, np.int64)
    tokens = ids[:context]
    topk = scaled_topk(context)
    extra = available_extra(predictors, log)
    res = dict(context=context, topk=topk, block=64, decode_steps=n_dec, quick=quick,
               spin_dsa_predictors=list(extra))

    # A. teacher-forced loss through the pipeline
    P = context - n_dec - 1
    prefix = dsa.Prefix(k[:, :P], v[:, :P])
    cfgs = make_configs(topk, quick, extra)
    t0 = time.time()
    hfs, stats = dsa.decode(model, prefix, tokens[P:P + n_dec], cfgs, topk,
                            warm=_warm(probs, row_index[P - 1]), log=log)
    targets = tokens[P + 1:P + n_dec + 1]
    loss = {}
    for b, c in enumerate(cfgs):
        loss[c.name] = dict(loss=float(model.nll(hfs[:, b], targets).mean()), **stats[b])
    res["loss_decode_s"] = round(time.time() - t0, 1)
    res["loss_full_from_prefill"] = float(nll[P:P + n_dec].mean())
    res["loss"] = loss
    log(f"  A: {len(cfgs)} configs x {n_dec} steps in {res['loss_decode_s']} s; full "
        f"{loss['full']['loss']:.4f} (prefill says {res['loss_full_from_prefill']:.4f})")

    # B. loss vs context (full attention)
    if not quick:
        res["loss_vs_context"] = loss_vs_context(model, tokens, nll, context, log)

    # C. multi-key retrieval in real text
    enc = lambda s: tok.encode(s).ids  # noqa: E731
    nd = needles(enc, tokens, context, NEEDLE_AT[:3] if quick else NEEDLE_AT)
    hay, d1 = nd["hay"], nd["at"][0]
    t0 = time.time()
    out = model.prefill(hay[d1:], past=(k[:, :d1], v[:, :d1]), keep_cache=True,
                        record_rows=[len(hay) - d1 - 1], final_rows=[len(hay) - d1 - 1])
    res["haystack_prefill_s"] = round(time.time() - t0, 1)
    hk, hv = out["k"], out["v"]
    warm = np.log(np.maximum(out["probs"][:, 0, :len(hay)], 0)).astype(np.float32)
    hprefix = dsa.Prefix(hk, hv)
    log(f"  C: haystack of {len(hay)} tokens, needles at {nd['at']}, prefill {res['haystack_prefill_s']} s")
    inputs, answers, names, qcfg = [], [], [], []
    for qi, (seq, a_) in enumerate(zip(nd["queries"], nd["answers"])):
        for cf in make_configs(topk, quick, extra, request_id=qi):
            inputs.append(seq[:-1])
            answers.append(a_)
            names.append(cf.name)
            qcfg.append(cf)
    inputs = np.array(inputs, np.int64)
    t0 = time.time()
    hfs, qstats = dsa.decode(model, hprefix, inputs, qcfg, topk, warm=warm, log=log)
    res["retrieval_decode_s"] = round(time.time() - t0, 1)
    retr, per_query = exact_answers(model, hfs, names, answers, nd["q_len"], qstats)
    res["retrieval"] = retr
    res["retrieval_per_query"] = {n: [bool(x) for x in v] for n, v in per_query.items()}
    res["needles"] = dict(at=list(nd["at"]), colours=nd["colours"], codes=nd["codes"],
                          context=len(hay) + nd["q_len"] + nd["a_len"])
    if not quick:
        res["passkey"] = passkey(model, enc, tokens, k, v, context, topk, extra, log)
    res["total_s"] = round(time.time() - t_start, 1)
    log(f"  C: {len(names)} sequences decoded in {res['retrieval_decode_s']} s")
    return res


def needles(enc, tokens, context, at):
    """C's haystack: five needles "The secret code of the <colour> door is <5 digits>." inserted
    into the book at token offsets `at`, trimmed so that haystack + question + answer = context.
    Returns dict(hay, at, colours, codes, queries (question + answer tokens per needle), answers,
    q_len, a_len)."""
    rng = np.random.default_rng(12)
    cols = [c for c in COLOURS if len(enc(f" the {c} door is")) == len(enc(" the red door is"))]
    cols = cols[:len(at)]
    codes = ["".join(str(d) for d in rng.integers(0, 10, 5)) for _ in at]
    q_tail = lambda c: enc(f"\n\nQuestion: What is the secret code of the {c} door?\n"  # noqa: E731
                           f"Answer: The secret code of the {c} door is")
    ans = [enc(" " + code) for code in codes]
    q_len, a_len = len(q_tail(cols[0])), len(ans[0])
    nds = [enc(f" The secret code of the {c} door is {code}.") for c, code in zip(cols, codes)]
    budget = context - q_len - a_len - sum(len(n) for n in nds)
    hay, last = [], 0
    for off, nd in zip(at, nds):
        hay += tokens[last:off].tolist() + nd
        last = off
    hay += tokens[last:budget].tolist()
    return dict(hay=np.array(hay, np.int64), at=list(at), colours=cols, codes=codes,
                queries=[q_tail(c) + a for c, a in zip(cols, ans)], answers=ans, q_len=q_len,
                a_len=a_len)


def exact_answers(model, hfs, names, answers, q_len, qstats=None):
    """Per config name: exact (every answer token is the greedy choice), answer tokens right,
    queries, mean top-k recall; and the per-query exact list."""
    retr, per_query = {}, {}
    for b, name in enumerate(names):
        pred = model.logits(hfs[q_len - 1:, b]).argmax(axis=1)
        ok = pred == np.array(answers[b])
        r = retr.setdefault(name, dict(exact=0, tokens_ok=0, tokens=0, queries=0, recall=[]))
        per_query.setdefault(name, []).append(bool(ok.all()))
        r["exact"] += int(ok.all())
        r["tokens_ok"] += int(ok.sum())
        r["tokens"] += len(ok)
        r["queries"] += 1
        if qstats is not None and qstats[b]["recall"] is not None:
            r["recall"].append(qstats[b]["recall"])
    for r in retr.values():
        r["recall"] = float(np.mean(r["recall"])) if r["recall"] else None
    return retr, per_query


PASSKEY_AT = (4096, 5632, 7168)


def passkey_haystack(enc, tokens, context, at, rng):
    """D's haystack: one pass-key needle at token offset `at`; returns (hay, question, answer)."""
    code = "".join(str(d) for d in rng.integers(0, 10, 5))
    needle = enc(f" The pass key is {code}. Remember it. {code} is the pass key.")
    q = enc("\n\nWhat is the pass key? The pass key is")
    a = enc(" " + code)
    n_text = context - len(needle) - len(q) - len(a)
    return np.array(tokens[:at].tolist() + needle + tokens[at:n_text].tolist(), np.int64), q, a


def passkey(model, enc, tokens, k, v, context, topk, extra, log):
    """D. Single-needle passkey in real text: one needle per haystack at each offset."""
    rng = np.random.default_rng(7)
    out = {}
    t0 = time.time()
    for i, at in enumerate(PASSKEY_AT):
        hay, q, a = passkey_haystack(enc, tokens, context, at, rng)
        o = model.prefill(hay[at:], past=(k[:, :at], v[:, :at]), keep_cache=True,
                          record_rows=[len(hay) - at - 1], final_rows=[len(hay) - at - 1])
        warm = np.log(np.maximum(o["probs"][:, 0, :len(hay)], 0)).astype(np.float32)
        cfgs = make_configs(topk, False, extra, request_id=100 + i)
        seq = q + a
        hfs, _ = dsa.decode(model, dsa.Prefix(o["k"], o["v"]), seq[:-1], cfgs, topk, warm=warm)
        for b, c in enumerate(cfgs):
            pred = model.logits(hfs[len(q) - 1:, b]).argmax(axis=1)
            ok = pred == np.array(a)
            r = out.setdefault(c.name, dict(exact=0, tokens_ok=0, tokens=0, queries=0, per_depth=[]))
            r["exact"] += int(ok.all())
            r["tokens_ok"] += int(ok.sum())
            r["tokens"] += len(ok)
            r["queries"] += 1
            r["per_depth"].append(bool(ok.all()))
        log(f"  D: passkey at {at}: full {'ok' if out['full']['per_depth'][-1] else 'wrong'} "
            f"({time.time() - t0:.0f} s)")
    return out


def format_report(res):
    L = ["# Task quality with the DSA pipeline emulated on SmolLM2-135M (closed loop)", "",
         "Attention scores of a 135M Llama-style model, **not** a DSA indexer (recorder/README.md).",
         f"Context {res['context']}, top-k {res['topk']} (+ sink and newest 64-token block), "
         f"teacher-forced loss over the last {res['decode_steps']} tokens of the 8K window; "
         f"retrieval: {len(res['needles']['at'])} needles at token offsets {res['needles']['at']} "
         f"of a {res['needles']['context']}-token context, each asked once.", "",
         "| config | loss (nats) | Δ vs full | top-k recall | block sparsity | multi-key exact | multi-key answer tokens | passkey exact |",
         "|---|---:|---:|---:|---:|---:|---:|---:|"]
    full = res["loss"]["full"]["loss"]
    for name, r in res["loss"].items():
        q = res["retrieval"].get(name, {})
        rec = "—" if r["recall"] is None else f"{r['recall']:.3f}"
        bs = "—" if r["block_sparsity"] is None else f"{r['block_sparsity']:.2f}"
        L.append(f"| {name} | {r['loss']:.4f} | {r['loss'] - full:+.4f} | {rec} | {bs} | "
                 f"{q.get('exact', 0)}/{q.get('queries', 0)} | {q.get('tokens_ok', 0)}/{q.get('tokens', 0)} | "
                 + (f"{res['passkey'][name]['exact']}/{res['passkey'][name]['queries']}" if "passkey" in res else "—")
                 + " |")
    L.append("")
    pq = res.get("retrieval_per_query", {}).get("full")
    if pq:
        L.append("Multi-key, full attention, per needle offset: " + ", ".join(
            f"{a}: {'ok' if ok else 'wrong'}" for a, ok in zip(res["needles"]["at"], pq)) + ".")
    if "passkey" in res:
        L.append(f"Passkey (one needle per haystack at {list(PASSKEY_AT)}), full attention: " + ", ".join(
            "ok" if ok else "wrong" for ok in res["passkey"]["full"]["per_depth"]) + ".")
    L.append("")
    sp = res.get("spin_dsa_predictors") or []
    L.append("C++ predictors through spin_dsa: " + (", ".join(sp) if sp else
             "none (bindings not installed; the adapter is selectors.SpinDsaSelector)") + ".")
    L.append("")
    L.append(f"Full attention decoded step by step: {full:.4f}; the same tokens from the causal "
             f"prefill: {res['loss_full_from_prefill']:.4f} (a check of the decode path).")
    if "loss_vs_context" in res:
        L.append("")
        L.append("Loss vs context (full attention, the same 256 target tokens): " + ", ".join(
            f"{c} → {v:.3f}" for c, v in res["loss_vs_context"].items()))
    L.append("")
    L.append(f"Times: loss decode {res['loss_decode_s']} s, haystack prefill "
             f"{res['haystack_prefill_s']} s, retrieval decode {res['retrieval_decode_s']} s, "
             f"total {res['total_s']} s.")
    return "\n".join(L) + "\n"
