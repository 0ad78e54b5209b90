"""Decoding with the DSA pipeline emulated on the real model, closed loop.

At every decode step and layer, for every sequence of the batch:
  1. the indexer signal of each cached entry is the model's own head-summed attention score,
     score[s] = log(mean_h softmax_h(q_h . k_s / sqrt(D)))  (the same number a kind=scores trace
     holds; each entry's value depends only on its key and the query, as a DSA indexer's does —
     the per-head normaliser is a per-row constant the emulation can afford to compute);
  2. the selector picks blocks (64 entries) — `select(layer, ctx_len)`;
  3. top-k runs over the entries of the selected blocks only (the rest are never scored);
  4. attention runs over that top-k plus the sink block and the newest block, with the model's
     real logits renormalised over that set; its output feeds the next layer (closed loop:
     every later layer and step sees the sparse result);
  5. the selector observes the masked scores and the top-k — `observe(layer, scores, topk)` —
     and `commit()` ends the step.
Mode `full` is plain dense attention (the model as trained). Sparsity 0 with any selector is
dense top-k (every block scored, attention over top-k + sink + newest only).

With `signal` (indexer_signal.IndexerSignal) step 1's score is the distilled DSA lightning
indexer's instead of the attention's; steps 2-5 are unchanged, and selectors that read keys
(hisa, spin-hybrid: `needs_keys`) get the layer's indexer keys and query before each select.

What this is not: a DSA indexer. SmolLM2 was never trained for sparse attention; these numbers
say how a 135M model's own attention tolerates top-k truncation and block skipping.
"""

import numpy as np

from .model import F32, rms_norm


class Prefix:
    """A prefill's KV cache shared read-only by every sequence that continues it."""

    def __init__(self, k, v):                       # [layers, P, KV, D]
        self.P = k.shape[1]
        self.kt = np.ascontiguousarray(k.transpose(0, 2, 3, 1))   # [L, KV, D, P]
        self.v = np.ascontiguousarray(v.transpose(0, 2, 1, 3))    # [L, KV, P, D]

    def logits(self, l, q, group):
        """q [B, H, D] pre-scaled -> [B, H, P]: every sequence's logits over the shared prefix,
        one matrix product per KV head for all B (B one-row products would each stream the
        whole prefix's keys from memory)."""
        B, H, D = q.shape
        out = np.empty((B, H, self.P), F32)
        for kv in range(H // group):
            hs = slice(kv * group, (kv + 1) * group)
            qg = np.ascontiguousarray(q[:, hs]).reshape(B * group, D)
            out[:, hs] = (qg @ self.kt[l, kv]).reshape(B, group, self.P)
        return out


class Seq:
    """One decoded sequence: the shared prefix plus its own appended keys and values."""

    def __init__(self, prefix, capacity):
        L, KV, D, _ = prefix.kt.shape
        self.pre = prefix
        self.k = np.zeros((L, KV, capacity, D), F32)
        self.v = np.zeros((L, KV, capacity, D), F32)
        self.n = [0] * L

    def append(self, l, k, v):                      # k, v [KV, D]
        n = self.n[l]
        self.k[l, :, n], self.v[l, :, n] = k, v
        self.n[l] = n + 1

    def logits(self, l, q, group, pre=None):
        """q [H, D] pre-scaled -> [H, P + n]; pre: this sequence's [H, P] from Prefix.logits."""
        P, n = self.pre.P, self.n[l]
        H = q.shape[0]
        out = np.empty((H, P + n), F32)
        for kv in range(H // group):
            qg = q[kv * group:(kv + 1) * group]
            if pre is None:
                out[kv * group:(kv + 1) * group, :P] = qg @ self.pre.kt[l, kv]
            out[kv * group:(kv + 1) * group, P:] = qg @ self.k[l, kv, :n].T
        if pre is not None:
            out[:, :P] = pre
        return out

    def mix(self, l, p, group, idx=None):
        """p [H, N] attention weights over all entries, or over the entries `idx` (sorted)."""
        P, n = self.pre.P, self.n[l]
        H = p.shape[0]
        D = self.k.shape[-1]
        out = np.empty((H, D), F32)
        if idx is not None:
            cut = np.searchsorted(idx, P)
            ip, isuf = idx[:cut], idx[cut:] - P
        for kv in range(H // group):
            hs = slice(kv * group, (kv + 1) * group)
            if idx is None:
                out[hs] = p[hs, :P] @ self.pre.v[l, kv] + p[hs, P:] @ self.v[l, kv, :n]
            else:
                out[hs] = p[hs, :cut] @ self.pre.v[l, kv, ip] + p[hs, cut:] @ self.v[l, kv, isuf]
        return out


def softmax_rows(s):
    e = np.exp(s - s.max(axis=1, keepdims=True))
    return e / e.sum(axis=1, keepdims=True)


def topk_positions(scores, k):
    """The first k by (score desc, position asc), returned position-ascending."""
    k = min(k, len(scores))
    if k <= 0:
        return np.zeros(0, np.int64)
    part = np.argpartition(-scores, k - 1)[:k]
    kth = scores[part].min()
    above = np.nonzero(scores > kth)[0]
    ties = np.nonzero(scores == kth)[0][:k - len(above)]
    return np.sort(np.concatenate([above, ties]))


class Config:
    """One column of the comparison: `full` attention, or a selector at a sparsity."""

    def __init__(self, name, selector=None, sparsity=0.0):
        self.name, self.selector, self.sparsity = name, selector, sparsity


def _key_source(signal):
    """The indexer signal, which alone holds keys for the selectors that read them."""
    if signal is None:
        raise ValueError("a selector that reads the indexer's keys (hisa, spin-hybrid) needs the "
                         "indexer signal (quality --signal indexer)")
    return signal


def decode(model, prefix, inputs, configs, topk, block=64, warm=None, log=None, signal=None):
    """Teacher-forced closed-loop decode of len(configs) sequences over the same `inputs`.

    inputs: token ids fed at positions prefix.P, prefix.P+1, ... ([T], or [B, T] one row per
    sequence); configs: list of Config (one
    sequence each); warm: per-layer all-keep score rows of the prefill's last row (observed by
    every selector before the first step, uncounted), float32 [layers, P]; with `signal` the
    indexer's own warm row (signal.pre.warm()) when None. signal: the indexer as step 1's score
    (module docstring), or None for the attention's.
    Returns hf [steps, B, d] (final-normed states) and stats per config: mean top-k recall,
    block sparsity, mean attended entries.
    """
    W = model.w
    H, D, g = model.H, model.D, model.group
    inputs = np.asarray(inputs, np.int64)
    B = len(configs)
    if inputs.ndim == 1:
        inputs = np.repeat(inputs[None, :], B, axis=0)
    T = inputs.shape[1]
    seqs = [Seq(prefix, T) for _ in range(B)]
    if signal is not None:
        if signal.pre.P != prefix.P:
            raise ValueError(f"decode: the indexer prefix has {signal.pre.P} entries, the KV prefix {prefix.P}")
        signal.start(B, T)
        warm = signal.pre.warm() if warm is None else warm
    if warm is not None:
        for c in configs:
            if c.selector is not None:
                for l in range(W.n_layers):
                    top = topk_positions(warm[l], topk)
                    if getattr(c.selector, "needs_keys", False):
                        c.selector.keys(l, *_key_source(signal).pre.warm_view(l))
                    c.selector.observe(l, warm[l], top)
                c.selector.commit()
    stats = [dict(recall=[], block_sparsity=[], attended=[]) for _ in configs]
    hfs = np.empty((T, B, W.d_model), F32)
    for t in range(T):
        pos = prefix.P + t
        x = W.embed[inputs[:, t]]
        for l in range(W.n_layers):
            L = W.layers[l]
            h = rms_norm(x, L["attn_norm"], W.eps)
            q, k, v = model.qkv(l, h, np.full(B, pos))
            q = q * model.scale
            ind = None if signal is None else signal.step(l, h, pos)  # [B, N] indexer rows
            spre = prefix.logits(l, q, g)                            # [B, H, P]
            o = np.empty((B, H, D), F32)
            for b, c in enumerate(configs):
                sq = seqs[b]
                sq.append(l, k[b], v[b])
                S = sq.logits(l, q[b], g, spre[b])          # [H, N]
                N = S.shape[1]
                if c.selector is None:
                    o[b] = sq.mix(l, softmax_rows(S), g)
                    continue
                if ind is None:
                    with np.errstate(divide="ignore"):
                        score = np.log(softmax_rows(S).mean(axis=0))  # all-keep indexer row
                else:
                    score = ind[b]
                sel = c.selector
                if sel.needs_truth:
                    sel.peek(l, score)
                if getattr(sel, "needs_keys", False):
                    sel.keys(l, *_key_source(signal).view(b, l))
                blocks = sel.select(l, N)
                nb = -(-N // block)
                ent = (blocks[:, None] * block + np.arange(block)[None, :]).ravel()
                ent = ent[ent < N]
                top = ent[topk_positions(score[ent], topk)]
                attend = np.union1d(top, np.concatenate([
                    np.arange(min(block, N)), np.arange((nb - 1) * block, N)]))
                o[b] = sq.mix(l, softmax_rows(S[:, attend]), g, attend)
                masked = np.full(N, -np.inf, F32)
                masked[ent] = score[ent]
                sel.observe(l, masked, top)
                true_top = topk_positions(score, topk)
                st = stats[b]
                st["recall"].append(len(np.intersect1d(top, true_top)) / max(1, len(true_top)))
                st["block_sparsity"].append(1.0 - len(blocks) / nb)
                st["attended"].append(len(attend))
            x = x + o.reshape(B, H * D) @ L["wo"]
            x = model.mlp(l, x)
        for c in configs:
            if c.selector is not None:
                c.selector.commit()
        hfs[t] = model.final(x)
        if log is not None and (t + 1) % 16 == 0:
            log(f"    decode step {t + 1}/{T} ({B} sequences)")
    summary = [{k: (float(np.mean(v)) if v else None) for k, v in st.items()} for st in stats]
    return hfs, summary
