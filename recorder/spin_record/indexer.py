"""A distilled DSA lightning indexer for every layer of SmolLM2-135M.

The indexer (DeepSeek-V3.2, reference/dsa_indexer_spec.md §1, PAPER32 eq. 1), one per layer l:

    x_t   = the layer's attention input after its RMSNorm (576 features), float32
    q_t,h = RoPE_t(x_t Wq[:, h])          H heads of 128 dims
    k_s   = RoPE_s(x_s Wk)                ONE key of 128 dims per token, shared by every head
    w_t,h = (x_t Ww)[h] · H^-1/2          head weights (the weights_proj of V3.2, fp32)
    I(t,s) = Σ_h w_t,h · ReLU(q_t,h · k_s · 128^-1/2)

RoPE as V3.2's indexer does it: on the FIRST 64 of the 128 dims, non-interleaved (half-split,
NeoX: pair (i, i+32)), the other 64 not rotated. Frequencies ω_i = θ^(-i/32) with the host
model's own θ = 1e5 (V3.2 shares one RoPE table between MLA and its indexer; SmolLM2's 8K
context needs no YaRN). What differs from V3.2: q is projected from x itself (SmolLM2 has no
low-rank query latent `qr`), and k has no LayerNorm (k = RoPE(x Wk)): one normalisation fewer in
the hand-written gradient; the per-entry fp8 scale absorbs the key's magnitude anyway.

Training = V3.2's dense warm-up: for query rows t of a training text, minimise
    KL( p_t || softmax_s I(t, s) )  over the causal prefix s <= t,
p_t = the layer's attention distribution summed over its 9 heads and normalised (the head mean
of the per-head softmaxes: the trace's score). numpy with explicit gradients and Adam
(`forward_backward`; tests/test_indexer.py checks the gradient against finite differences).

Then the trace form (include/spin/indexer.h, include/spin/trace.h): q and k are rotated by the 128-point Hadamard matrix
(orthogonal: q·k unchanged; it spreads outliers before quantisation, as V3.2 does) and quantised
to e4m3 with one UE8M0 scale per key entry and per (row, head) query; the query scale and the
128^-1/2 are folded into the weights, so `spin` computes k_scale[s] · Σ_h w'[h] ReLU(q8·k8).
"""

import numpy as np

from . import fp8
from .model import F32, rms_norm

D = 128          # indexer head dim (V3.2)
ROPE_DIMS = 64   # the rotated part: dims [0, 64), half-split


# -- RoPE (half-split on the first ROPE_DIMS dims) ---------------------------------------------

def rope_tables(positions, theta, rope_dims=ROPE_DIMS):
    half = rope_dims // 2
    inv = float(theta) ** (-np.arange(half, dtype=np.float64) / half)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(F32), np.sin(ang).astype(F32)


def rope(x, cos, sin):
    """x [..., D]; cos/sin broadcastable to x[..., :half]. Returns a rotated copy. The inverse
    rotation (the backward pass) is rope(x, cos, -sin)."""
    half = cos.shape[-1]
    a, b = x[..., :half], x[..., half:2 * half]
    out = x.copy()
    out[..., :half] = a * cos - b * sin
    out[..., half:2 * half] = a * sin + b * cos
    return out


# -- parameters, forward, backward -------------------------------------------------------------

def init_params(d_model, heads, rng, dtype=F32):
    """Inputs are divided by their RMS before the projections (see `Layer`), so N(0, 1/d) makes
    q, k entries ~N(0, 1), z ~N(0, 1) and the initial scores O(1)."""
    s = 1.0 / np.sqrt(d_model)
    return dict(Wq=(rng.standard_normal((d_model, heads * D)) * s).astype(dtype),
                Wk=(rng.standard_normal((d_model, D)) * s).astype(dtype),
                Ww=(rng.standard_normal((d_model, heads)) * s).astype(dtype))


def scores(p, xq, rq, xk, rk):
    """I [R, S] (no mask) and the intermediates: xq [R, d] query-row inputs, xk [S, d] key
    inputs, rq / rk = (cos, sin) RoPE tables of their positions."""
    R, H = xq.shape[0], p["Ww"].shape[1]
    c = np.float32(D ** -0.5) if xq.dtype == F32 else D ** -0.5
    q = rope((xq @ p["Wq"]).reshape(R, H, D), rq[0][:, None, :], rq[1][:, None, :])
    k = rope(xk @ p["Wk"], rk[0], rk[1])
    w = (xq @ p["Ww"]) * (H ** -0.5)
    z = (q.reshape(R * H, D) @ k.T).reshape(R, H, -1)
    z *= c
    a = np.maximum(z, 0)
    I = np.matmul(w[:, None, :], a)[:, 0, :]
    return I, (q, k, w, z, a, c)


def forward_backward(p, xq, rq, xk, rk, target, nvis, plogp=None, grad=True):
    """Mean over rows of KL(target_r || softmax(I_r[:nvis_r])) and its gradient.

    target [R, S]: each row a distribution over [0, nvis_r) (zero beyond); plogp [R] = Σ p log p
    (computed if None). Returns loss, grads (dict like p) or None, I (masked with -inf)."""
    R = xq.shape[0]
    I, (q, k, w, z, a, c) = scores(p, xq, rq, xk, rk)
    S = I.shape[1]
    vis = np.arange(S)[None, :] < np.asarray(nvis)[:, None]
    I = np.where(vis, I, -np.inf)
    m = I.max(axis=1, keepdims=True)
    e = np.exp(I - m)
    Z = e.sum(axis=1, keepdims=True)
    logq = I - m - np.log(Z)
    if plogp is None:
        with np.errstate(divide="ignore", invalid="ignore"):
            plogp = np.where(target > 0, target * np.log(target), 0).sum(axis=1)
    cross = np.where(vis, target * np.where(vis, logq, 0), 0).sum(axis=1)
    loss = float(np.mean(plogp - cross))
    if not grad:
        return loss, None, I
    H = w.shape[1]
    G = (e / Z - target) / R                                  # dL/dI, zero outside the prefix
    dw = np.matmul(a, G[:, :, None])[:, :, 0]                 # [R, H]
    dz = w[:, :, None] * G[:, None, :]
    dz *= (z > 0)
    dz *= c
    dq = (dz.reshape(R * H, S) @ k).reshape(R, H, D)
    dk = dz.reshape(R * H, S).T @ q.reshape(R * H, D)         # [S, D]
    dq = rope(dq, rq[0][:, None, :], -rq[1][:, None, :])
    dk = rope(dk, rk[0], -rk[1])
    g = dict(Wq=xq.T @ dq.reshape(R, H * D), Wk=xk.T @ dk, Ww=(xq.T @ dw) * (H ** -0.5))
    return loss, g, I


class Adam:
    def __init__(self, params, lr, b1=0.9, b2=0.999, eps=1e-8):
        self.lr, self.b1, self.b2, self.eps, self.t = lr, b1, b2, eps, 0
        self.m = {k: np.zeros_like(v) for k, v in params.items()}
        self.v = {k: np.zeros_like(v) for k, v in params.items()}

    def step(self, params, grads, lr):
        self.t += 1
        for k in params:
            g = grads[k]
            self.m[k] = self.b1 * self.m[k] + (1 - self.b1) * g
            self.v[k] = self.b2 * self.v[k] + (1 - self.b2) * g * g
            mh = self.m[k] / (1 - self.b1 ** self.t)
            vh = self.v[k] / (1 - self.b2 ** self.t)
            params[k] -= (lr * mh / (np.sqrt(vh) + self.eps)).astype(params[k].dtype)


# -- capturing a layer's inputs and attention -------------------------------------------------

def capture(model, tokens, rows, chunk=512, progress=None, keep_kv=False):
    """One causal forward over `tokens` (positions 0..T-1). Returns X [layers, T, d] (each layer's
    attention input after its RMSNorm, float32), probs [layers, R, T] (the head-mean attention
    distribution of each of `rows`, zero beyond the row) and hf [R, d] (final-normed states of
    `rows`, for the LM head); with keep_kv also each layer's K and V [layers, T, KV, D] (what a
    decode of draft tokens after the text attends to)."""
    W = model.w
    tokens = np.asarray(tokens, np.int64)
    T = len(tokens)
    pos = np.arange(T)
    rec = np.asarray(rows, np.int64)
    X = np.empty((W.n_layers, T, W.d_model), F32)
    probs = np.zeros((W.n_layers, len(rec), T), F32)
    K = np.empty((W.n_layers, T, model.KV, model.D), F32) if keep_kv else None
    V = np.empty_like(K) if keep_kv else None
    x = W.embed[tokens]
    for l in range(W.n_layers):
        L = W.layers[l]
        h = rms_norm(x, L["attn_norm"], W.eps)
        X[l] = h
        q, k, v = model.qkv(l, h, pos)
        if keep_kv:
            K[l], V[l] = k, v
        o = model._causal_attention(q, k, v, chunk, rec, probs, l)
        x = x + o @ L["wo"]
        x = model.mlp(l, x)
        if progress:
            progress(l)
    hf = model.final(x[rec])
    return (X, probs, hf, K, V) if keep_kv else (X, probs, hf)


# -- one layer's training ---------------------------------------------------------------------

class Layer:
    """A trained (or initialised) indexer of one layer; inputs are divided by `x_rms`."""

    def __init__(self, params, x_rms, theta):
        self.p, self.x_rms, self.theta = params, F32(x_rms), theta

    def scores(self, X, rows, S=None):
        """I [R, S] of query rows `rows` over keys [0, S) of one text's X [T, d] (no mask)."""
        S = S or X.shape[0]
        xs = X[:S] / self.x_rms
        rk = rope_tables(np.arange(S), self.theta)
        rq = rope_tables(rows, self.theta)
        return scores(self.p, xs[rows], rq, xs, rk)[0]

    def qkw(self, X, rows):
        """The indexer's float32 query heads [R, H, D], keys [T, D] and weights [R, H] (RoPE
        applied, w with H^-1/2), before the Hadamard rotation and quantisation."""
        xs = X / self.x_rms
        rk = rope_tables(np.arange(X.shape[0]), self.theta)
        rq = rope_tables(rows, self.theta)
        R, H = len(rows), self.p["Ww"].shape[1]
        q = rope((xs[rows] @ self.p["Wq"]).reshape(R, H, D), rq[0][:, None, :], rq[1][:, None, :])
        k = rope(xs @ self.p["Wk"], rk[0], rk[1])
        return q, k, (xs[rows] @ self.p["Ww"]) * F32(H ** -0.5)


def layer_kl(layer, X, rows, probs):
    """Mean KL(attention || softmax(indexer)) over `rows` of one text."""
    xs = X / layer.x_rms
    S = int(max(rows)) + 1
    rk = rope_tables(np.arange(S), layer.theta)
    rq = rope_tables(rows, layer.theta)
    loss, _, _ = forward_backward(layer.p, xs[rows], rq, xs[:S], rk, probs[:, :S],
                                  np.asarray(rows) + 1, grad=False)
    return loss


def train_layer(X, rows, probs, hp, seed, log=None):
    """Trains one layer's indexer on one text: X [T, d], rows [R] (sorted query positions),
    probs [R, T] their attention distributions. Returns (Layer, history of batch losses)."""
    rng = np.random.default_rng(seed)
    x_rms = float(np.sqrt(np.mean(X.astype(np.float64) ** 2)))
    xs = X / F32(x_rms)
    p = init_params(X.shape[1], hp["heads"], rng)
    opt = Adam(p, hp["lr"])
    rows = np.asarray(rows)
    with np.errstate(divide="ignore", invalid="ignore"):
        plogp = np.where(probs > 0, probs * np.log(probs), 0).sum(axis=1)
    B = hp["batch_rows"]
    nb = -(-len(rows) // B)
    cos_all, sin_all = rope_tables(np.arange(X.shape[0]), hp["theta"])
    hist = []
    order = []
    for step in range(hp["steps"]):
        if not order:  # an epoch: batches of position-adjacent rows (so S, the longest prefix
            order = list(rng.permutation(nb))  # in the batch, stays near the rows' own), shuffled
        b = order.pop()
        sel = np.arange(b * B, min(len(rows), (b + 1) * B))
        r = rows[sel]
        S = int(r.max()) + 1
        lr = hp["lr"] * (0.1 + 0.9 * 0.5 * (1 + np.cos(np.pi * step / hp["steps"])))
        loss, g, _ = forward_backward(p, xs[r], (cos_all[r], sin_all[r]), xs[:S],
                                      (cos_all[:S], sin_all[:S]), probs[sel, :S], r + 1,
                                      plogp[sel])
        opt.step(p, g, F32(lr))
        hist.append(loss)
        if log and (step % 50 == 0 or step == hp["steps"] - 1):
            log(f"    step {step}: KL {loss:.4f}")
    return Layer(p, x_rms, hp["theta"]), hist


# -- evaluation: recall of attention's top-k ----------------------------------------------------

def topk_set(row, k):
    """The top-k positions of one row: score descending, position ascending (include/spin/topk.h)."""
    k = min(k, len(row))
    order = np.lexsort((np.arange(len(row)), -row.astype(np.float64)))
    return order[:k]


def recall(pred, truth, k):
    """|TopK(pred) ∩ TopK(truth)| / k for one row (both over the same visible prefix)."""
    k = min(k, len(truth))
    return len(np.intersect1d(topk_set(pred, k), topk_set(truth, k))) / k


# -- the trace form -----------------------------------------------------------------------------

def quantise_for_trace(q, k, w):
    """Hadamard-rotate q [R, H, D] and k [T, D], quantise to e4m3 with per-row UE8M0 scales and
    fold the query scale and 128^-1/2 into the weights: returns (k codes [T, D] u8, k_scale [T]
    f32, q codes [R, H, D] u8, w' [R, H] f32) with I = k_scale · Σ_h w' ReLU(q8 · k8)."""
    Hm = fp8.hadamard(D)
    kc, ks = fp8.quantize_rows(k @ Hm)
    qc, qs = fp8.quantize_rows(q @ Hm)
    wf = (w * qs * F32(D ** -0.5)).astype(F32)
    return kc, ks.astype(F32), qc, wf


def dequantised_scores(kc, ks, qc, wf):
    """What spin computes from the trace tensors: [R, T] = ks · Σ_h w' ReLU(q8 · k8) (float64)."""
    kv = fp8.e4m3_decode(kc).astype(np.float64)
    qv = fp8.e4m3_decode(qc).astype(np.float64)
    z = np.maximum(np.einsum("rhd,td->rht", qv, kv), 0)
    return np.einsum("rh,rht->rt", wf.astype(np.float64), z) * ks[None, :]
