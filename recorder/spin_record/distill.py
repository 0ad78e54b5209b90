"""Distil a DSA lightning indexer per layer of SmolLM2-135M, evaluate it, and record kind=keys
traces from it. The indexer itself: indexer.py.

Texts (all from the one book, alice29.txt, 39,357 tokens; token offsets into its tokenisation):
  * training   [16384, 24576)  8192 tokens, a fresh context (positions 0..8191): 1024 query rows
                               spread evenly over positions 128..8191;
  * held-out   [24576, 28672)  4096 tokens: 64 rows over 256..4095 (KL before / after training);
  * evaluation [0, 8192)       the text every score and key trace uses: rows of the decode steps.
The training and held-out slices share no token with the evaluation text (nor with the needle
haystacks of quality.py, which use the first ~8.2K tokens).

Two cache levels under build/real-data (or $SPIN_RECORD_CACHE), both keyed by content:
  indexer-<k1>/  weights.npz + train.json     k1 = hash(model, text, hyper-parameters, the sources
                                              of the forward pass and the indexer)
  keys-<k2>/     the key traces + distill.json/.md   k2 = hash(k1, this file, trace arguments)
"""

import hashlib
import json
import os
import shutil
import time

import numpy as np

from . import assets, indexer as ix
from .model import F32
from .record import save_trace, scaled_topk, step_rows

HP = dict(heads=4, steps=200, batch_rows=32, lr=5e-3, theta=1e5, seed=0,
          train=(16384, 8192), train_rows=1024, heldout=(24576, 4096), heldout_rows=64)
CONTEXT = 8192
STEPS = 32
TURNS = ((6144, 16), (7184, 15), (8192, 15))  # (ctx_len at the turn's last step, decode steps)
MTP_SPAN = 40  # greedy-draft MTP: row 0 of step 0 at context - 40 (~33 steps at ~20 % acceptance)

SRC = os.path.dirname(os.path.abspath(__file__))
TRAIN_SOURCES = ("assets.py", "model.py", "tokenizer.py", "indexer.py", "fp8.py")


def _hash(parts):
    h = hashlib.sha256()
    for p in parts:
        h.update(p if isinstance(p, bytes) else str(p).encode())
    return h.hexdigest()[:16]


def weights_key(hp):
    srcs = [open(os.path.join(SRC, f), "rb").read() for f in TRAIN_SOURCES]
    return _hash([assets.MODEL_WHEEL_SHA256, assets.ALICE_SHA256, json.dumps(hp, sort_keys=True)]
                 + srcs)


def keys_key(k1, args):
    srcs = [open(os.path.join(SRC, f), "rb").read() for f in ("distill.py", "record.py")]
    return _hash([k1, json.dumps(args, sort_keys=True)] + srcs)


def spread_rows(lo, hi, n):
    return np.unique(np.linspace(lo, hi - 1, n).round().astype(np.int64))


def _tokens(tok, text, start, length, what):
    ids = np.array(tok.encode(text).ids, np.int64)
    if len(ids) < start + length:
        raise ValueError(f"{what}: the text has {len(ids)} tokens, fewer than {start + length}")
    return ids[start:start + length]


# -- training -------------------------------------------------------------------------------------

def train(model, tok, text, hp, log):
    """All layers' indexers. Returns (layers, info) — info has per-layer train and held-out KL."""
    s0, n0 = hp["train"]
    rows = spread_rows(min(128, n0 // 4), n0, hp["train_rows"])
    t0 = time.time()
    X, P, _ = ix.capture(model, _tokens(tok, text, s0, n0, "training slice"), rows)
    t_cap = time.time() - t0
    log(f"training slice captured ({t_cap:.0f} s): tokens [{s0}, {s0 + n0}), {len(rows)} rows")
    layers, info = [], dict(capture_train_s=round(t_cap, 1), per_layer=[])
    t1 = time.time()
    for l in range(model.w.n_layers):
        tl = time.time()
        L, hist = ix.train_layer(X[l], rows, P[l], hp, seed=hp["seed"] * 1000 + l)
        layers.append(L)
        info["per_layer"].append(dict(train_kl_first=hist[0],
                                      train_kl_final=float(np.mean(hist[-len(hist) // 10:])),
                                      train_s=round(time.time() - tl, 2)))
        log(f"  layer {l}: KL {hist[0]:.3f} -> {info['per_layer'][-1]['train_kl_final']:.3f} "
            f"({time.time() - tl:.1f} s)")
    info["train_s"] = round(time.time() - t1, 1)
    del X, P
    # held-out slice: KL of the untrained (same seed) and trained indexer
    s1, n1 = hp["heldout"]
    hrows = spread_rows(min(256, n1 // 4), n1, hp["heldout_rows"])
    t2 = time.time()
    X, P, _ = ix.capture(model, _tokens(tok, text, s1, n1, "held-out slice"), hrows)
    for l, L in enumerate(layers):
        init = ix.Layer(ix.init_params(X.shape[2], hp["heads"],
                                       np.random.default_rng(hp["seed"] * 1000 + l)),
                        L.x_rms, hp["theta"])
        d = info["per_layer"][l]
        d["heldout_kl_init"] = ix.layer_kl(init, X[l], hrows, P[l])
        d["heldout_kl"] = ix.layer_kl(L, X[l], hrows, P[l])
        d["heldout_kl_uniform"] = float(np.mean([
            np.sum(np.where(P[l, i, :r + 1] > 0, P[l, i, :r + 1] * np.log(
                np.maximum(P[l, i, :r + 1], 1e-30) * (r + 1)), 0)) for i, r in enumerate(hrows)]))
    info["heldout_s"] = round(time.time() - t2, 1)
    return layers, info


def save_weights(path, layers, hp):
    arrs = {}
    for l, L in enumerate(layers):
        for k, v in L.p.items():
            arrs[f"layer.{l}.{k}"] = v
        arrs[f"layer.{l}.x_rms"] = np.array(L.x_rms, F32)
    tmp = f"{path}.tmp-{os.getpid()}.npz"
    np.savez(tmp, **arrs)
    os.replace(tmp, path)


def load_weights(path, hp):
    z = np.load(path)
    n = len([k for k in z.files if k.endswith(".x_rms")])
    return [ix.Layer({k: z[f"layer.{l}.{k}"] for k in ("Wq", "Wk", "Ww")},
                     float(z[f"layer.{l}.x_rms"]), hp["theta"]) for l in range(n)]


def trained(model, tok, text, hp, log):
    """The cached indexers (trained on a miss). Returns (layers, train info, cache dir)."""
    k1 = weights_key(hp)
    cdir = assets.cache_dir() / f"indexer-{k1}"
    done = cdir / "train.json"
    if not done.exists():
        tmp = assets.cache_dir() / f"indexer-{k1}.tmp-{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        layers, info = train(model, tok, text, hp, log)
        save_weights(str(tmp / "weights.npz"), layers, hp)
        info["hp"] = hp
        (tmp / "train.json").write_text(json.dumps(info, indent=1))
        if cdir.exists():
            shutil.rmtree(cdir)
        os.replace(tmp, cdir)
        log(f"indexers trained ({info['train_s']} s for {len(layers)} layers; cache {cdir})")
    else:
        log(f"indexers cached: {cdir}")
    return load_weights(str(cdir / "weights.npz"), hp), json.loads(done.read_text()), cdir


# -- evaluation -----------------------------------------------------------------------------------

def evaluate(layers, X, P, rows, ks=(256, 2048), seed=0):
    """Per layer on the evaluation rows: KL and top-k recall of attention's top-k for the layer's
    own indexer, layer 0's indexer applied to this layer's inputs, and random scores."""
    out = []
    S = int(rows.max()) + 1
    for l, L in enumerate(layers):
        # layer 0's projections on this layer's input, normalised by this layer's own RMS (the
        # inputs' scale grows with depth; I is cubic in it, which moves KL, not the ranking)
        L0 = ix.Layer(layers[0].p, L.x_rms, L.theta)
        own = L.scores(X[l], rows, S)
        first = L0.scores(X[l], rows, S)
        rng = np.random.default_rng([seed, l])
        rnd = rng.standard_normal(own.shape).astype(F32)
        d = dict(kl=ix.layer_kl(L, X[l], rows, P[l]),
                 kl_first=ix.layer_kl(L0, X[l], rows, P[l]))
        for k in ks:
            for name, sc in (("", own), ("_first", first), ("_random", rnd)):
                d[f"recall{k}{name}"] = float(np.mean([ix.recall(sc[i, :r + 1], P[l, i, :r + 1], k)
                                                       for i, r in enumerate(rows)]))
        out.append(d)
    return out


# -- key traces -----------------------------------------------------------------------------------

def decode_inputs(model, token, pos, K, V):
    """The layer inputs (after RMSNorm) [layers, d] of `token` placed at position `pos` after
    the cached positions [0, pos): one decode step through every layer."""
    from .model import rms_norm
    W = model.w
    x = W.embed[np.array([token])]
    out = np.empty((W.n_layers, W.d_model), F32)
    for l in range(W.n_layers):
        L = W.layers[l]
        h = rms_norm(x, L["attn_norm"], W.eps)
        out[l] = h[0]
        q, k, v = model.qkv(l, h, np.array([pos]))
        o = model._causal_attention(q, np.concatenate([K[l, :pos], k]),
                                    np.concatenate([V[l, :pos], v]), 1, None, None, l)
        x = model.mlp(l, x + o @ L["wo"])
    return out


def project(L, x, pos):
    """One layer's indexer on arbitrary inputs x [n, d] at positions pos [n]: q [n, H, D],
    k [n, D], w [n, H] (the same math as Layer.qkw)."""
    xs = x / L.x_rms
    c, s = ix.rope_tables(pos, L.theta)
    H = L.p["Ww"].shape[1]
    q = ix.rope((xs @ L.p["Wq"]).reshape(len(x), H, ix.D), c[:, None, :], s[:, None, :])
    return q, ix.rope(xs @ L.p["Wk"], c, s), (xs @ L.p["Ww"]) * F32(H ** -0.5)


def greedy_mtp_steps(argmax, tokens, first, context):
    """MTP with one draft, the draft being the model's own greedy guess: step s decodes the real
    token at p (row 0) and drafts d = argmax(p) at p + 1 (row 1); accepted = (d == the book's
    token at p + 1); the next step's row 0 sits at p + 1 + accepted (the verifier's bonus token
    is the book's). Returns [(p, d, accepted)] while row 1 fits in the context."""
    out, p = [], first
    while p + 1 < context:
        d = int(argmax[p])
        a = int(d == tokens[p + 1])
        out.append((p, d, a))
        p += 1 + a
    return out


def greedy_mtp_trace(model, layers, X, K, V, tokens, argmax, first, meta_extra):
    """kind=keys, next_n 2, rows of real draft tokens with real acceptance; the rejected drafts'
    own keys in layer.{l}.k_draft (an accepted draft's key is the final sequence's)."""
    st = greedy_mtp_steps(argmax, tokens, first, X.shape[1])
    ctx = np.array([p + 2 for p, _, _ in st], np.int64)
    Xd = np.empty((len(st), X.shape[0], X.shape[2]), F32)          # [steps, layers, d]
    for i, (p, d, a) in enumerate(st):
        Xd[i] = X[:, p + 1] if a else decode_inputs(model, d, p + 1, K, V)
    H = layers[0].p["Ww"].shape[1]
    t = {"ctx_len": ctx, "accepted": np.array([a for _, _, a in st], np.int32)}
    p0 = np.array([p for p, _, _ in st])
    for l, L in enumerate(layers):
        q0, k, w0 = L.qkw(X[l], p0)
        q1, k1, w1 = project(L, Xd[:, l], p0 + 1)
        q = np.stack([q0, q1], axis=1).reshape(-1, H, ix.D)
        w = np.stack([w0, w1], axis=1).reshape(-1, H)
        kc, ks, qc, wf = ix.quantise_for_trace(q, k, w)
        dc, ds, _, _ = ix.quantise_for_trace(q[:1], k1, w[:1])
        t[f"layer.{l}.k"], t[f"layer.{l}.k_scale"] = kc, ks
        t[f"layer.{l}.q"] = qc.reshape(len(ctx), 2, H, ix.D)
        t[f"layer.{l}.w"] = wf.reshape(len(ctx), 2, H)
        t[f"layer.{l}.k_draft"] = dc.reshape(len(ctx), 1, ix.D)
        t[f"layer.{l}.k_draft_scale"] = ds.reshape(len(ctx), 1)
    meta = dict(format="spin-trace", version=1, kind="keys", num_layers=len(layers), next_n=2,
                num_heads=H, page_size=64, topk=scaled_topk(X.shape[1]), compress_ratio=1,
                model=assets.MODEL_NAME,
                drafts="the model's greedy next token at row 0 (real acceptance against the "
                       "book; a rejected draft's own key in k_draft; ctx_len grows by 1 + accepted)")
    meta.update(meta_extra)
    return t, meta


def turn_steps(turns=TURNS):
    """ctx_len of a multi-turn trace: each turn decodes `n` steps ending at ctx_len `end`; the
    text between turns (~1K tokens of the book, standing in for a tool output) arrives at once,
    a ctx_len jump that the reader sees as a prefill."""
    return np.concatenate([np.arange(end - n, end + 1) for end, n in turns]).astype(np.int64)


def key_trace(layers, X, tokens, argmax, ctx, next_n, meta_extra):
    """tensors, metadata of one kind=keys trace: rows j of step s at ctx[s] - next_n + j."""
    rows = ctx[:, None] - next_n + np.arange(next_n)[None, :]
    t = {"ctx_len": ctx}
    flat = rows.ravel()
    H = layers[0].p["Ww"].shape[1]
    for l, L in enumerate(layers):
        q, k, w = L.qkw(X[l], flat)
        kc, ks, qc, wf = ix.quantise_for_trace(q, k, w)
        t[f"layer.{l}.k"], t[f"layer.{l}.k_scale"] = kc, ks
        t[f"layer.{l}.q"] = qc.reshape(len(ctx), next_n, H, ix.D)
        t[f"layer.{l}.w"] = wf.reshape(len(ctx), next_n, H)
    if next_n > 1:
        acc = np.zeros(len(ctx), np.int32)
        for s in range(len(ctx)):
            a = 0
            for j in range(next_n - 1):
                if argmax[int(rows[s, j])] != tokens[rows[s, j] + 1]:
                    break
                a += 1
            acc[s] = a
        t["accepted"] = acc
    meta = dict(format="spin-trace", version=1, kind="keys", num_layers=len(layers),
                next_n=next_n, num_heads=H, page_size=64, topk=scaled_topk(X.shape[1]),
                compress_ratio=1, model=assets.MODEL_NAME)
    meta.update(meta_extra)
    return t, meta


def run(model, tok, text, out_dir, hp=HP, log=print, force=False, context=CONTEXT, steps=STEPS,
        turns=TURNS):
    """Trains (or loads) the indexers, evaluates them, writes the key traces and the report into
    out_dir. Returns the report dict."""
    layers, tinfo, wdir = trained(model, tok, text, hp, log)
    args = dict(context=context, steps=steps, turns=turns)
    k2 = keys_key(wdir.name, args)
    kdir = assets.cache_dir() / f"keys-{k2}"
    done = kdir / "distill.json"
    if not done.exists() or force:
        tmp = assets.cache_dir() / f"keys-{k2}.tmp-{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        tokens = _tokens(tok, text, 0, context, "evaluation text")
        specs = {"n1": (step_rows(context, steps, 1)[1], 1),
                 "n2": (step_rows(context, steps, 2)[1], 2),
                 "turns": (turn_steps(turns), 1)}
        want = set(range(context - MTP_SPAN, context - 1))  # greedy-draft MTP: argmax at row 0
        for ctx, n in specs.values():
            want |= set((ctx[:, None] - n + np.arange(n)[None, :]).ravel().tolist())
        rows = np.array(sorted(want), np.int64)
        t0 = time.time()
        X, P, hf, K, V = ix.capture(model, tokens, rows, keep_kv=True)
        t_cap = time.time() - t0
        argmax = dict(zip(rows.tolist(), np.argmax(model.logits(hf), axis=1).tolist()))
        log(f"evaluation text captured ({t_cap:.0f} s)")
        ev_rows = specs["n1"][0] - 1
        sel = np.searchsorted(rows, ev_rows)
        t1 = time.time()
        per_layer = evaluate(layers, X, P[:, sel], ev_rows)
        t_eval = time.time() - t1
        extra = dict(text=assets.TEXT_NAME, text_package=assets.TEXT_PKG,
                     text_file=assets.TEXT_MEMBER, tokens=context,
                     source="distilled DSA lightning indexer of SmolLM2-135M: "
                            f"KL to head-summed attention, trained on tokens [{hp['train'][0]}, "
                            f"{hp['train'][0] + hp['train'][1]}) of the book",
                     indexer=f"I=sum_h w_h ReLU(q_h.k), {hp['heads']} heads x 128, RoPE half-split "
                             f"dims 0..63 theta {hp['theta']:g}, Hadamard, e4m3 UE8M0 per entry",
                     indexer_weights=wdir.name)
        traces = {}
        t2 = time.time()
        for name, (ctx, n) in specs.items():
            t, meta = key_trace(layers, X, tokens, argmax, ctx, n, extra)
            path = tmp / f"smollm2-keys-ctx{context}-{name}.safetensors"
            save_trace(str(path), t, meta)
            d = dict(file=path.name, next_n=n, steps=len(ctx), ctx_len=[int(ctx[0]), int(ctx[-1])])
            if n > 1:
                d["accepted_mean"] = float(t["accepted"].mean())
                d["accepted_hist"] = np.bincount(t["accepted"], minlength=n).tolist()
            traces[name] = d
        t, meta = greedy_mtp_trace(model, layers, X, K, V, tokens, argmax, context - MTP_SPAN,
                                   extra)
        path = tmp / f"smollm2-keys-ctx{context}-mtp2.safetensors"
        save_trace(str(path), t, meta)
        traces["mtp2"] = dict(file=path.name, next_n=2, steps=len(t["ctx_len"]),
                              ctx_len=[int(t["ctx_len"][0]), int(t["ctx_len"][-1])],
                              accepted_mean=float(t["accepted"].mean()),
                              accepted_hist=np.bincount(t["accepted"], minlength=2).tolist(),
                              draft_keys=True)
        del K, V
        # the quantised form against the float indexer: top-256 recall, n1 rows, every layer
        t = key_trace(layers, X, tokens, argmax, specs["n1"][0][-4:], 1, {})[0]
        qrec = []
        for l, L in enumerate(layers):
            deq = ix.dequantised_scores(t[f"layer.{l}.k"], t[f"layer.{l}.k_scale"],
                                        t[f"layer.{l}.q"][:, 0], t[f"layer.{l}.w"][:, 0])
            flo = L.scores(X[l], ev_rows[-4:], context)
            qrec.append(np.mean([ix.recall(deq[i, :r + 1], flo[i, :r + 1], scaled_topk(context))
                                 for i, r in enumerate(ev_rows[-4:])]))
        report = dict(hp=hp, train=tinfo, eval_rows=[int(ev_rows[0]), int(ev_rows[-1])],
                      per_layer=per_layer, traces=traces, fp8_top256_recall_of_float=float(np.mean(qrec)),
                      fp8_top256_recall_min_layer=float(np.min(qrec)),
                      capture_eval_s=round(t_cap, 1), eval_s=round(t_eval, 1),
                      traces_s=round(time.time() - t2, 1))
        (tmp / "distill.json").write_text(json.dumps(report, indent=1))
        (tmp / "distill.md").write_text(format_report(report))
        if kdir.exists():
            shutil.rmtree(kdir)
        os.replace(tmp, kdir)
    else:
        log(f"key traces cached: {kdir}")
    os.makedirs(out_dir, exist_ok=True)
    for f in list(kdir.glob("*.safetensors")) + [kdir / "distill.json", kdir / "distill.md"]:
        dst = os.path.join(out_dir, f.name)
        if os.path.exists(dst):
            os.unlink(dst)
        try:
            os.link(f, dst)
        except OSError:
            shutil.copyfile(f, dst)
    return json.loads(done.read_text())


def format_report(r):
    hp, tr = r["hp"], r["train"]
    lines = [
        "# Distilled DSA lightning indexer, SmolLM2-135M-Instruct (Q4_1), per layer",
        "",
        f"Indexer `I(t,s) = Σ_h w_t,h ReLU(q_t,h · k_s)`: {hp['heads']} heads × 128 dims, one 128-d "
        f"key per token, RoPE on dims 0..63 (half-split, θ {hp['theta']:g}), q/k/w projected from "
        "the layer's RMSNorm-ed input. Trained by KL(head-summed attention ‖ softmax I) over the "
        f"causal prefix: {hp['steps']} Adam steps × {hp['batch_rows']} rows (lr {hp['lr']:g}, "
        f"cosine to 10 %), {hp['train_rows']} rows of Alice tokens [{hp['train'][0]}, "
        f"{hp['train'][0] + hp['train'][1]}); held-out: tokens [{hp['heldout'][0]}, "
        f"{hp['heldout'][0] + hp['heldout'][1]}), {hp['heldout_rows']} rows. Evaluation: the "
        f"{r['eval_rows'][1] - r['eval_rows'][0] + 1} decode rows (positions {r['eval_rows'][0]}.."
        f"{r['eval_rows'][1]}) of the first 8192 tokens — the traces' text, disjoint from both.",
        "",
        f"Times: training capture {tr['capture_train_s']} s, training {tr['train_s']} s "
        f"(30 layers), held-out {tr['heldout_s']} s, evaluation capture {r['capture_eval_s']} s, "
        f"evaluation {r['eval_s']} s, traces {r['traces_s']} s.",
        f"fp8 (Hadamard + e4m3, per-entry UE8M0) vs the float indexer: top-256 recall "
        f"{r['fp8_top256_recall_of_float']:.3f} (worst layer {r['fp8_top256_recall_min_layer']:.3f}).",
        "",
        "KL in nats. recall@k = |TopK(indexer) ∩ TopK(attention)| / k at the 8K context; "
        "`L0` = layer 0's indexer applied to this layer's input, `rnd` = random scores.",
        "",
        "| layer | KL train | KL held-out (init → trained; uniform) | KL eval | KL eval L0 | "
        "recall@256 | L0 | rnd | recall@2048 | L0 | rnd |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for l, (t, e) in enumerate(zip(tr["per_layer"], r["per_layer"])):
        lines.append(
            f"| {l} | {t['train_kl_final']:.3f} | {t['heldout_kl_init']:.2f} → {t['heldout_kl']:.3f}; "
            f"{t['heldout_kl_uniform']:.2f} | {e['kl']:.3f} | {e['kl_first']:.3f} | "
            f"{e['recall256']:.3f} | {e['recall256_first']:.3f} | {e['recall256_random']:.3f} | "
            f"{e['recall2048']:.3f} | {e['recall2048_first']:.3f} | {e['recall2048_random']:.3f} |")

    def mean(key, src):
        return np.mean([d[key] for d in src])
    P, E = tr["per_layer"], r["per_layer"]
    lines.append(
        f"| mean | {mean('train_kl_final', P):.3f} | {mean('heldout_kl_init', P):.2f} → "
        f"{mean('heldout_kl', P):.3f}; {mean('heldout_kl_uniform', P):.2f} | {mean('kl', E):.3f} | "
        f"{mean('kl_first', E):.3f} | {mean('recall256', E):.3f} | {mean('recall256_first', E):.3f} | "
        f"{mean('recall256_random', E):.3f} | {mean('recall2048', E):.3f} | "
        f"{mean('recall2048_first', E):.3f} | {mean('recall2048_random', E):.3f} |")
    lines += ["", "Key traces (kind=keys, include/spin/trace.h):", ""]
    for name, t in r["traces"].items():
        lines.append(f"- `{t['file']}`: next_n {t['next_n']}, {t['steps']} steps, ctx_len "
                     f"{t['ctx_len'][0]}..{t['ctx_len'][1]}" +
                     (f", accepted mean {t['accepted_mean']:.2f} hist {t['accepted_hist']}"
                      if "accepted_mean" in t else ""))
    return "\n".join(lines) + "\n"
