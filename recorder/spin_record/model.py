"""SmolLM2-135M-Instruct (Llama architecture) forward pass in numpy, weights from its GGUF file.

The GGUF (Q4_1 matrices, Q8_0 embedding) is dequantised once to float32 with the `gguf` package's
own `gguf.quants.dequantize`; everything after that is float32 numpy (OpenBLAS matmuls).

Architecture, read from the GGUF metadata: 30 blocks, hidden 576, 9 query heads and 3 KV heads of
64 dims (grouped-query attention: query head h reads KV head h // 3), SwiGLU MLP of 1536, RMSNorm
(eps 1e-5), RoPE theta 1e5 over all 64 dims, tied input/output embedding, 8192-token context.

RoPE layout: llama.cpp's converter permutes the rows of attn_q / attn_k so that rotary pairs are
adjacent (x[2i], x[2i+1]) — GGML's "normal" rope — instead of Hugging Face's rotate_half halves.
`rope_adjacent` applies that form to the GGUF weights as stored; the test suite checks it against
an independent per-token implementation that un-permutes the weights back to the Hugging Face
layout and uses rotate_half (tests/test_model.py).

Three entry points:
  * `prefill(tokens, ...)`    causal forward over a whole sequence, attention in query chunks
                              (memory O(chunk x context)); optionally returns the head-mean
                              attention probabilities of chosen rows per layer and the KV cache;
  * decode (dsa.py)           one new token per sequence for a batch of sequences that share a
                              prefix KV cache, with dense or DSA-emulated sparse attention;
  * `logits(h)` / `nll(...)`  tied LM head, chunked log-softmax.
"""

import numpy as np

F32 = np.float32


class Weights:
    """Dequantised float32 weights, laid out for `x @ W` (input dim first)."""

    def __init__(self, gguf_path):
        import gguf  # the PyPI package that reads GGUF files (llama.cpp's own gguf-py)

        r = gguf.GGUFReader(str(gguf_path))

        def field(name):
            return r.fields[name].contents()

        self.meta = {k: f.contents() for k, f in r.fields.items()
                     if not k.startswith("tokenizer.ggml.") or k in (
                         "tokenizer.ggml.model", "tokenizer.ggml.pre")}
        arch = field("general.architecture")
        if arch != "llama":
            raise ValueError(f"{gguf_path}: architecture {arch!r}, expected 'llama'")
        self.n_layers = int(field("llama.block_count"))
        self.d_model = int(field("llama.embedding_length"))
        self.n_heads = int(field("llama.attention.head_count"))
        self.n_kv = int(field("llama.attention.head_count_kv"))
        self.d_ff = int(field("llama.feed_forward_length"))
        self.eps = float(field("llama.attention.layer_norm_rms_epsilon"))
        self.theta = float(field("llama.rope.freq_base"))
        self.ctx = int(field("llama.context_length"))
        self.head_dim = self.d_model // self.n_heads
        self.vocab = int(field("llama.vocab_size"))
        tensors = {t.name: t for t in r.tensors}

        def get(name):
            t = tensors[name]
            w = gguf.quants.dequantize(t.data, t.tensor_type)
            return np.ascontiguousarray(w, dtype=F32)

        self.embed = get("token_embd.weight")                      # [vocab, d]
        self.out = (get("output.weight") if "output.weight" in tensors else self.embed)
        self.out_t = np.ascontiguousarray(self.out.T)               # [d, vocab]
        self.final_norm = get("output_norm.weight")
        self.layers = []
        for l in range(self.n_layers):
            p = f"blk.{l}."
            wq, wk, wv = get(p + "attn_q.weight"), get(p + "attn_k.weight"), get(p + "attn_v.weight")
            gate, up = get(p + "ffn_gate.weight"), get(p + "ffn_up.weight")
            self.layers.append(dict(
                attn_norm=get(p + "attn_norm.weight"),
                ffn_norm=get(p + "ffn_norm.weight"),
                wq=wq, wk=wk,                                       # [out, in], GGUF (permuted) rows
                wqkv=np.ascontiguousarray(np.concatenate([wq, wk, wv], 0).T),  # [d, d + 2 kv]
                wo=np.ascontiguousarray(get(p + "attn_output.weight").T),     # [d, d]
                wgu=np.ascontiguousarray(np.concatenate([gate, up], 0).T),   # [d, 2 ff]
                wdown=np.ascontiguousarray(get(p + "ffn_down.weight").T),    # [ff, d]
            ))


def rms_norm(x, w, eps):
    x = x.astype(F32, copy=False)
    return x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)).astype(F32) * w


def rope_tables(positions, head_dim, theta):
    inv = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    ang = np.asarray(positions, np.float64)[:, None] * inv[None, :]
    return np.cos(ang).astype(F32), np.sin(ang).astype(F32)          # [T, head_dim/2]


def rope_adjacent(x, cos, sin):
    """x [T, H, D] with rotary pairs (x[2i], x[2i+1]) — the GGUF (GGML normal-rope) layout."""
    a, b = x[..., 0::2], x[..., 1::2]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(x)
    out[..., 0::2] = a * c - b * s
    out[..., 1::2] = a * s + b * c
    return out


def silu(x):
    return x / (1.0 + np.exp(-x))


class Model:
    def __init__(self, weights):
        self.w = weights
        W = weights
        self.H, self.KV, self.D = W.n_heads, W.n_kv, W.head_dim
        self.group = self.H // self.KV
        self.scale = F32(1.0 / np.sqrt(self.D))

    # -- pieces ----------------------------------------------------------------------------------

    def qkv(self, layer, h, positions):
        """h [T, d] (already normed) -> q [T, H, D], k [T, KV, D], v [T, KV, D], RoPE applied."""
        L = self.w.layers[layer]
        y = h @ L["wqkv"]
        d, kvd = self.w.d_model, self.KV * self.D
        T = h.shape[0]
        q = y[:, :d].reshape(T, self.H, self.D)
        k = y[:, d:d + kvd].reshape(T, self.KV, self.D)
        v = np.ascontiguousarray(y[:, d + kvd:].reshape(T, self.KV, self.D))
        cos, sin = rope_tables(positions, self.D, self.w.theta)
        return rope_adjacent(q, cos, sin), rope_adjacent(k, cos, sin), v

    def mlp(self, layer, x):
        L = self.w.layers[layer]
        h = rms_norm(x, L["ffn_norm"], self.w.eps)
        gu = h @ L["wgu"]
        ff = self.w.d_ff
        return x + (silu(gu[:, :ff]) * gu[:, ff:]) @ L["wdown"]

    def final(self, x):
        return rms_norm(x, self.w.final_norm, self.w.eps)

    def logits(self, hf):
        """hf [T, d] final-normed -> [T, vocab] float32."""
        return hf @ self.w.out_t

    def nll(self, hf, targets, chunk=512):
        """Per-position negative log-likelihood of `targets` given final-normed states hf."""
        out = np.empty(len(targets), np.float64)
        for c0 in range(0, len(targets), chunk):
            lg = self.logits(hf[c0:c0 + chunk])                      # float32 [C, vocab]
            m = lg.max(axis=1, keepdims=True)
            tgt = lg[np.arange(len(lg)), targets[c0:c0 + chunk]] - m[:, 0]
            lg -= m
            np.exp(lg, out=lg)
            out[c0:c0 + chunk] = np.log(lg.sum(axis=1, dtype=np.float64)) - tgt
        return out

    # -- full causal forward -------------------------------------------------------------------

    def prefill(self, tokens, record_rows=None, keep_cache=False, chunk=512, final_rows=None,
                progress=None, past=None):
        """Causal forward over `tokens` (positions P..P+T-1 after a `past` cache of P tokens).

        past: (k, v) arrays [layers, P, KV, D] of the tokens before (a shared prefix), or None.
        record_rows: sorted row indices (into `tokens`) whose head-mean attention probabilities
            over positions [0, P + row] are returned per layer, float32 [layers, rows, P + T]
            (zero beyond the row).
        final_rows: row indices whose final-normed hidden states are returned (default all).
        Returns dict(hf [n, d], probs, k, v) with k/v [layers, P + T, KV, D] if keep_cache, and
        q [layers, rows, H, D] (the record_rows' queries, RoPE applied, unscaled) if record_rows.
        """
        W, H, D = self.w, self.H, self.D
        tokens = np.asarray(tokens, np.int64)
        T = len(tokens)
        P = 0 if past is None else past[0].shape[1]
        pos = np.arange(P, P + T)
        x = W.embed[tokens]
        rec = None if record_rows is None else np.asarray(record_rows, np.int64)
        probs = None if rec is None else np.zeros((W.n_layers, len(rec), P + T), F32)
        qrec = None if rec is None else np.zeros((W.n_layers, len(rec), H, D), F32)
        ks, vs = [], []
        for l in range(W.n_layers):
            L = W.layers[l]
            q, k, v = self.qkv(l, rms_norm(x, L["attn_norm"], W.eps), pos)
            if rec is not None:
                qrec[l] = q[rec]
            if past is not None:
                k = np.concatenate([past[0][l], k])
                v = np.concatenate([past[1][l], v])
            if keep_cache:
                ks.append(k)
                vs.append(v)
            o = self._causal_attention(q, k, v, chunk, rec, probs, l)
            x = x + o @ L["wo"]
            x = self.mlp(l, x)
            if progress:
                progress(l)
        hf = self.final(x if final_rows is None else x[np.asarray(final_rows)])
        out = dict(hf=hf, probs=probs, q=qrec)
        if keep_cache:
            out["k"], out["v"] = np.stack(ks), np.stack(vs)
        return out

    def _causal_attention(self, q, k, v, chunk, rec, probs, l):
        """Causal softmax attention, one 2-D BLAS call per (KV head, query chunk) and piece.

        Rows of a KV head's query group are stacked ([group * C, D]) so that each matmul is 2-D
        (numpy's broadcast matmul falls back to a slow loop). Only the diagonal key block is
        masked (an additive 0/-inf bias); probabilities are left unnormalised and the output row
        is divided by the row sum instead (one pass fewer over the [rows, keys] tile).
        """
        H, KV, D, g = self.H, self.KV, self.D, self.group
        T = q.shape[0]
        P = k.shape[0] - T  # keys of a cached prefix come first
        out = np.empty((T, H, D), F32)
        qs = q * self.scale
        bias_full = np.triu(np.full((chunk, chunk), -np.inf, F32), 1)
        for kv in range(KV):
            Kt = np.ascontiguousarray(k[:, kv, :].T)                   # [D, T]
            Vk = np.ascontiguousarray(v[:, kv, :])                     # [T, D]
            for c0 in range(0, T, chunk):
                c1 = min(T, c0 + chunk)
                C = c1 - c0
                qg = np.ascontiguousarray(qs[c0:c1, kv * g:(kv + 1) * g, :].transpose(1, 0, 2))
                s = qg.reshape(g * C, D) @ Kt[:, :P + c1]               # [g*C, P + c1]
                s3 = s.reshape(g, C, P + c1)
                s3[:, :, P + c0:P + c1] += bias_full[:C, :C]
                m = s.max(axis=1, keepdims=True)
                s -= m
                np.exp(s, out=s)
                z = s.sum(axis=1, keepdims=True)
                o = (s @ Vk[:P + c1]) / z                               # [g*C, D]
                out[c0:c1, kv * g:(kv + 1) * g, :] = o.reshape(g, C, D).transpose(1, 0, 2)
                if rec is not None:
                    sel = np.nonzero((rec >= c0) & (rec < c1))[0]
                    if len(sel):
                        pr = s3[:, rec[sel] - c0, :] / z.reshape(g, C, 1)[:, rec[sel] - c0, :]
                        probs[l, sel, :P + c1] += pr.sum(axis=0) / H
        return out.reshape(T, H * D)


def load(gguf_path):
    return Model(Weights(gguf_path))
