"""The forward pass against an independent computation, and against real text.

Independent reference (`naive_logits`): written separately from model.py — the GGUF's q/k rows
un-permuted back to Hugging Face's layout and Hugging Face's rotate_half RoPE, explicit per-head
loops, and no KV cache: every position's logits come from a fresh forward over the prefix that
ends there (O(T^2) forwards, so a short input). It shares only the dequantised weights.
"""

import numpy as np

from spin_record import dsa, selectors


def unpermute(w, n_head):
    """Inverse of llama.cpp's convert permute (HF rows -> GGUF adjacent-pair rows)."""
    out, inp = w.shape
    return w.reshape(n_head, out // n_head // 2, 2, inp).swapaxes(1, 2).reshape(out, inp)


_HF = {}


def hf_weights(W):
    """The q/k/v matrices in Hugging Face's layout, float64 (computed once per weights object)."""
    if id(W) not in _HF:
        H, KV, D = W.n_heads, W.n_kv, W.head_dim
        _HF[id(W)] = [(unpermute(L["wq"].astype(np.float64), H),
                       unpermute(L["wk"].astype(np.float64), KV),
                       L["wqkv"][:, H * D + KV * D:].T.astype(np.float64)) for L in W.layers]
    return _HF[id(W)]


def naive_last_logits(W, tokens):
    H, KV, D = W.n_heads, W.n_kv, W.head_dim
    T = len(tokens)
    x = W.embed[tokens].astype(np.float64)
    inv = W.theta ** (-np.arange(0, D, 2) / D)
    ang = np.arange(T)[:, None] * inv[None, :]
    cos = np.concatenate([np.cos(ang)] * 2, 1)
    sin = np.concatenate([np.sin(ang)] * 2, 1)

    def rot(u):  # [T, D] HF rotate_half
        return u * cos + np.concatenate([-u[:, D // 2:], u[:, :D // 2]], 1) * sin

    def norm(u, w):
        return u / np.sqrt((u * u).mean(-1, keepdims=True) + W.eps) * w

    for L, (wq, wk, wv) in zip(W.layers, hf_weights(W)):
        h = norm(x, L["attn_norm"])
        q, k, v = h @ wq.T, h @ wk.T, h @ wv.T
        o = np.zeros((T, H * D))
        for hh in range(H):
            kv = hh // (H // KV)
            qh = rot(q[:, hh * D:(hh + 1) * D])
            kh = rot(k[:, kv * D:(kv + 1) * D])
            vh = v[:, kv * D:(kv + 1) * D]
            s = qh @ kh.T / np.sqrt(D)
            s[np.triu_indices(T, 1)] = -np.inf
            p = np.exp(s - s.max(1, keepdims=True))
            p /= p.sum(1, keepdims=True)
            o[:, hh * D:(hh + 1) * D] = p @ vh
        x = x + o @ L["wo"]
        h = norm(x, L["ffn_norm"])
        gu = h @ L["wgu"]
        g, u = gu[:, :W.d_ff], gu[:, W.d_ff:]
        x = x + (g / (1 + np.exp(-g)) * u) @ L["wdown"]
    return norm(x[-1], W.final_norm) @ W.out.T.astype(np.float64)


def test_tokenizer_roundtrip(tok, text):
    s = text[:3000]
    assert tok.decode(tok.encode(s).ids) == s
    assert tok.encode("abc 2024").tokens[-4:] == ["2", "0", "2", "4"]  # digits split


def test_forward_matches_naive_recomputation(model, tok):
    ids = np.array(tok.encode("The quick brown fox jumps over the lazy dog. Alice").ids)
    out = model.prefill(ids, chunk=4)  # several chunks, so the chunked path is exercised
    fast = model.logits(out["hf"])
    for t in range(len(ids)):
        ref = naive_last_logits(model.w, ids[:t + 1])
        np.testing.assert_allclose(fast[t], ref, rtol=0, atol=2e-3 * np.abs(ref).max())
        assert fast[t].argmax() == ref.argmax()


def test_decode_matches_prefill(model, tok, text):
    ids = np.array(tok.encode(text[:2000]).ids[:142])
    P = 130
    full = model.prefill(ids, keep_cache=True)
    pre = model.prefill(ids[:P], keep_cache=True)
    prefix = dsa.Prefix(pre["k"], pre["v"])
    cfgs = [dsa.Config("full"), dsa.Config("dense-all", selectors.Dense(0.0, 4096))]
    hfs, _ = dsa.decode(model, prefix, ids[P:], cfgs, topk=4096)
    for b in range(2):  # dense top-k with k >= context is full attention
        np.testing.assert_allclose(hfs[:, b], full["hf"][P:], atol=2e-3)
    # a cached-prefix prefill gives the same states as the whole prefill
    rest = model.prefill(ids[P:], past=(pre["k"], pre["v"]))
    np.testing.assert_allclose(rest["hf"], full["hf"][P:], atol=2e-3)


def test_perplexity_and_context(model, tok, text):
    ids = np.array(tok.encode(text).ids[:1024])
    out = model.prefill(ids)
    nll = model.nll(out["hf"][:-1], ids[1:])
    ppl = float(np.exp(nll.mean()))
    assert 8 < ppl < 40, ppl  # 22.8 measured (Q4_1 weights, Alice ch. 1)
    # the same 256 targets with more context before them: loss falls
    tgt = ids[768:1024]
    short = model.prefill(ids[768 - 16:1024], final_rows=np.arange(15, 15 + 256))["hf"]
    l16 = model.nll(short, tgt).mean()
    l768 = nll[767:1023].mean()
    assert l768 < l16 - 0.2, (l16, l768)
