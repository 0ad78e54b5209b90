"""The distilled lightning indexer as the DSA emulation's signal (dsa.decode, step 1).

With `signal=IndexerSignal(...)` the score every selector, the top-k and the recall see is the
distilled indexer's (indexer.py), not the model's own attention:

    I(t, s) = k_scale[s] · Σ_h w'[t, h] · ReLU(q8[t, h] · k8[s])

in the fp8 form a key trace holds and a serving engine computes (`indexer.quantise_for_trace`:
Hadamard-rotated q and k as e4m3 codes with UE8M0 scales, the query scale and 128^-1/2 folded
into w'; `indexer.dequantised_scores` is the same number in float64). Why fp8 and not the float
indexer: it is what a deployed DSA ranks by, and the keys hisa and spin-hybrid pool (through the
spin_dsa binding) are these e4m3 keys — both sides of the comparison then see one indexer. Its
top-256 keeps 0.977 of the float indexer's (recorder/README.md), so the choice moves little.

Keys: the prefix's from the cached forward's per-layer normed inputs (IndexerPrefix, once per
prefix); each decoded token's from the decode's own hidden state at each layer (closed loop: a
sparse attention upstream changes them). The query and weights come from the decoding token's
hidden state at the layer, like the attention's own q.
"""

import numpy as np

from . import fp8, indexer as ix
from .model import F32


def project_keys(L, x, pos):
    """One layer's float keys k [n, 128] (RoPE applied) of inputs x [n, d] at positions pos:
    Layer.qkw's key path without the queries (an 8K prefix needs no 8K queries)."""
    c, s = ix.rope_tables(pos, L.theta)
    return ix.rope((x / L.x_rms) @ L.p["Wk"], c, s)


def project_query(L, x, pos):
    """q [n, H, 128] and w [n, H] (H^-1/2 included) of inputs x [n, d] at positions pos."""
    xs = x / L.x_rms
    c, s = ix.rope_tables(pos, L.theta)
    H = L.p["Ww"].shape[1]
    q = ix.rope((xs @ L.p["Wq"]).reshape(len(x), H, ix.D), c[:, None, :], s[:, None, :])
    return q, (xs @ L.p["Ww"]) * F32(H ** -0.5)


def quantise_keys(k):
    """k [n, 128] -> (e4m3 codes [n, 128], UE8M0 scales [n]): quantise_for_trace's key half."""
    kc, ks = fp8.quantize_rows(k @ fp8.hadamard(ix.D))
    return kc, ks.astype(F32)


def quantise_query(q, w):
    """q [n, H, 128], w [n, H] -> (e4m3 codes [n, H, 128], w' [n, H]): the query half."""
    qc, qs = fp8.quantize_rows(q @ fp8.hadamard(ix.D))
    return qc, (w * qs * F32(ix.D ** -0.5)).astype(F32)


def fp8_scores(qv, wf, kv, ks):
    """[R, S] = ks · Σ_h w' ReLU(q8 · k8) from decoded codes qv [R, H, 128], kv [S, 128] (float32;
    every product of e4m3 values is exact in float32, the sum rounds at ~1e-7)."""
    R, H, D = qv.shape
    z = np.maximum(qv.reshape(R * H, D) @ kv.T, 0).reshape(R, H, -1)
    return np.einsum("rh,rhs->rs", wf, z) * ks[None, :]


class IndexerPrefix:
    """The indexer's keys of a shared prefix, per layer, plus the query of its last row (the
    warm-start row every selector observes before the first decode step)."""

    def __init__(self, kc, ks, warm_qc, warm_w):
        self.kc = np.ascontiguousarray(kc, np.uint8)          # [L, P, 128] e4m3 codes
        self.ks = np.ascontiguousarray(ks, F32)               # [L, P]
        self.warm_qc = np.ascontiguousarray(warm_qc, np.uint8)  # [L, H, 128]
        self.warm_w = np.ascontiguousarray(warm_w, F32)         # [L, H]
        self.P = self.kc.shape[1]
        self.kv = fp8.e4m3_decode(self.kc)                    # decoded once: the scoring reads these

    @classmethod
    def from_inputs(cls, layers, X, P, head=None):
        """From each layer's normed inputs X [L, >= P - S, d] of positions S..P-1, after the
        keys head = (codes [L, S, 128], scales [L, S]) of positions [0, S) (S = 0 without): a
        haystack that shares its first S tokens with a text whose keys are known."""
        S = 0 if head is None else head[0].shape[1]
        if X.shape[0] != len(layers) or X.shape[1] < P - S or P <= S:
            raise ValueError(f"IndexerPrefix: X {X.shape} does not cover {len(layers)} layers x "
                             f"positions {S}..{P - 1}")
        L_, H = len(layers), layers[0].p["Ww"].shape[1]
        kc = np.empty((L_, P, ix.D), np.uint8)
        ks = np.empty((L_, P), F32)
        wq = np.empty((L_, H, ix.D), np.uint8)
        ww = np.empty((L_, H), F32)
        if S:
            kc[:, :S], ks[:, :S] = head
        pos = np.arange(S, P)
        for l, L in enumerate(layers):
            kc[l, S:], ks[l, S:] = quantise_keys(project_keys(L, X[l, :P - S], pos))
            q, w = project_query(L, X[l, P - S - 1:P - S], pos[-1:])
            qc, wf = quantise_query(q, w)
            wq[l], ww[l] = qc[0], wf[0]
        return cls(kc, ks, wq, ww)

    def arrays(self):
        return dict(kc=self.kc, ks=self.ks, warm_qc=self.warm_qc, warm_w=self.warm_w)

    def warm(self):
        """[L, P] the last row's all-keep indexer scores over the prefix (its own key included)."""
        return np.stack([fp8_scores(fp8.e4m3_decode(self.warm_qc[l][None]), self.warm_w[l][None],
                                    self.kv[l], self.ks[l])[0] for l in range(len(self.kc))])

    def warm_view(self, l):
        """hisa's input for the warm row: keys [0, P) and the last row's query."""
        return self.kc[l], self.ks[l], self.warm_qc[l][None], self.warm_w[l][None]


class IndexerSignal:
    """The indexer's scores for B sequences decoding after one IndexerPrefix."""

    def __init__(self, layers, prefix):
        if len(layers) != len(prefix.kc):
            raise ValueError(f"IndexerSignal: {len(layers)} indexer layers, prefix has {len(prefix.kc)}")
        self.layers, self.pre = layers, prefix

    def start(self, B, T):
        """Room for T appended tokens per sequence (codes for hisa, decoded values for scoring)."""
        L_ = len(self.layers)
        self.m = 0  # appended entries the current layer's view holds (this step's token included)
        self.kc = np.zeros((B, L_, T, ix.D), np.uint8)
        self.ks = np.zeros((B, L_, T), F32)
        self.kv = np.zeros((B, L_, T, ix.D), F32)
        self.q = [None] * L_  # per layer: this step's (codes [B, H, 128], w' [B, H])

    def step(self, l, h, pos):
        """Layer l of the current step: h [B, d] the layer's normed inputs of the B decoding
        tokens at position pos. Appends their keys and returns the all-keep rows [B, P + n]."""
        L = self.layers[l]
        B = h.shape[0]
        p = np.full(B, pos)
        n = pos - self.pre.P  # tokens appended before this one
        kc, ks = quantise_keys(project_keys(L, h, p))
        self.kc[:, l, n], self.ks[:, l, n] = kc, ks
        self.kv[:, l, n] = fp8.e4m3_decode(kc)
        self.m = n + 1
        qc, wf = quantise_query(*project_query(L, h, p))
        self.q[l] = (qc, wf)
        qv = fp8.e4m3_decode(qc)
        out = np.empty((B, self.pre.P + n + 1), F32)
        out[:, :self.pre.P] = fp8_scores(qv, wf, self.pre.kv[l], self.pre.ks[l])  # one GEMM for all B
        for b in range(B):
            out[b, self.pre.P:] = fp8_scores(qv[b:b + 1], wf[b:b + 1], self.kv[b, l, :n + 1],
                                             self.ks[b, l, :n + 1])[0]
        return out

    def view(self, b, l):
        """hisa's input for sequence b at layer l this step: keys [P + n] in the key trace's
        layout (codes, scales) and the step's query (codes [1, H, 128], w' [1, H])."""
        m = self.m
        k = np.concatenate([self.pre.kc[l], self.kc[b, l, :m]])
        s = np.concatenate([self.pre.ks[l], self.ks[b, l, :m]])
        qc, wf = self.q[l]
        return k, s, np.ascontiguousarray(qc[b:b + 1]), np.ascontiguousarray(wf[b:b + 1])
