"""The distilled lightning indexer (indexer.py, distill.py): gradient, quantisation, training on
the real model, and the kind=keys traces through the C++ reader."""

import os
import subprocess

import numpy as np
import pytest

from spin_record import assets, distill, fp8, indexer as ix


def _tiny(rng, d=12, H=3, S=9, rows=(3, 5, 7, 8)):
    p = {k: v.astype(np.float64) for k, v in ix.init_params(d, H, rng).items()}
    X = rng.standard_normal((S, d))
    rows = np.array(rows)
    T = rng.random((len(rows), S)) ** 4
    T = np.where(np.arange(S)[None, :] <= rows[:, None], T, 0)
    T /= T.sum(axis=1, keepdims=True)
    rk = tuple(a.astype(np.float64) for a in ix.rope_tables(np.arange(S), 1e5))
    return p, X, rows, T, rk


def test_gradient_matches_finite_differences():
    rng = np.random.default_rng(7)
    p, X, rows, T, rk = _tiny(rng)
    rq = (rk[0][rows], rk[1][rows])
    loss, g, _ = ix.forward_backward(p, X[rows], rq, X, rk, T, rows + 1)
    assert loss > 0
    h = 1e-6
    for k in p:
        for _ in range(6):
            idx = tuple(int(rng.integers(0, s)) for s in p[k].shape)
            old = p[k][idx]
            p[k][idx] = old + h
            lp = ix.forward_backward(p, X[rows], rq, X, rk, T, rows + 1, grad=False)[0]
            p[k][idx] = old - h
            lm = ix.forward_backward(p, X[rows], rq, X, rk, T, rows + 1, grad=False)[0]
            p[k][idx] = old
            fd = (lp - lm) / (2 * h)
            assert abs(fd - g[k][idx]) <= 1e-6 + 1e-5 * abs(fd), (k, idx, fd, g[k][idx])


def test_kl_is_zero_iff_match_and_masks_the_future():
    """Loss = KL(target || softmax(I) over the prefix): a target equal to the indexer's own
    softmax gives 0, and keys past the row do not change the loss."""
    rng = np.random.default_rng(3)
    p, X, rows, _, rk = _tiny(rng)
    rq = (rk[0][rows], rk[1][rows])
    I, _ = ix.scores(p, X[rows], rq, X, rk)
    vis = np.arange(X.shape[0])[None, :] <= rows[:, None]
    e = np.where(vis, np.exp(I - I.max(axis=1, keepdims=True)), 0)
    own = e / e.sum(axis=1, keepdims=True)
    assert abs(ix.forward_backward(p, X[rows], rq, X, rk, own, rows + 1, grad=False)[0]) < 1e-12
    X2 = X.copy()
    X2[-1] += 5.0  # the last key: only row 8 sees it
    T = own
    a = ix.forward_backward(p, X[rows[:3]], (rq[0][:3], rq[1][:3]), X, rk, T[:3], rows[:3] + 1,
                            grad=False)[0]
    b = ix.forward_backward(p, X2[rows[:3]], (rq[0][:3], rq[1][:3]), X2, rk, T[:3], rows[:3] + 1,
                            grad=False)[0]
    assert a == b


def test_rope_is_relative_and_inverse():
    rng = np.random.default_rng(1)
    q, k = rng.standard_normal(128), rng.standard_normal(128)
    c, s = ix.rope_tables(np.array([10, 3, 110, 103]), 1e5)
    rq = ix.rope(np.stack([q, q]), c[[0, 2]], s[[0, 2]])
    rk = ix.rope(np.stack([k, k]), c[[1, 3]], s[[1, 3]])
    assert abs(rq[0] @ rk[0] - rq[1] @ rk[1]) < 1e-4       # depends on 10-3 = 110-103 only
    back = ix.rope(rq, c[[0, 2]], -s[[0, 2]])
    assert np.allclose(back, np.stack([q, q]), atol=1e-5)
    assert np.array_equal(rq[:, 64:], np.stack([q, q])[:, 64:])  # dims 64.. not rotated


def test_quantised_scores_follow_the_float_indexer():
    rng = np.random.default_rng(5)
    Hm = fp8.hadamard(128)
    assert np.allclose(Hm @ Hm.T, np.eye(128), atol=1e-6)
    q = rng.standard_normal((3, 4, 128)).astype(np.float32)
    k = (rng.standard_normal((500, 128)) * rng.uniform(0.01, 30, (500, 1))).astype(np.float32)
    w = rng.standard_normal((3, 4)).astype(np.float32)
    kc, ks, qc, wf = ix.quantise_for_trace(q, k, w)
    assert kc.dtype == np.uint8 and ks.dtype == np.float32 and ks.shape == (500,)
    assert not np.isin(kc, [0x7F, 0xFF]).any() and (ks > 0).all()
    assert np.all(np.log2(ks) == np.round(np.log2(ks)))      # UE8M0: powers of two
    exact = np.einsum("rh,rht->rt", w, np.maximum(np.einsum("rhd,td->rht", q, k), 0)) / np.sqrt(128)
    deq = ix.dequantised_scores(kc, ks, qc, wf)
    assert np.corrcoef(exact.ravel(), deq.ravel())[0, 1] > 0.995
    for r in range(3):
        assert ix.recall(deq[r], exact[r], 50) >= 0.8


def test_distillation_reduces_kl_on_held_out_text(model, tok, text):
    """Two layers trained briefly on 768 tokens of the book: on a disjoint held-out slice the KL
    falls well below the untrained indexer's and below the uniform distribution's."""
    ids = np.array(tok.encode(text).ids)
    tr, ho = ids[16384:16384 + 768], ids[24576:24576 + 384]
    rows = distill.spread_rows(64, 768, 96)
    hrows = distill.spread_rows(96, 384, 16)
    X, P, _ = ix.capture(model, tr, rows)
    Xh, Ph, _ = ix.capture(model, ho, hrows)
    hp = dict(heads=4, steps=60, batch_rows=16, lr=5e-3, theta=1e5)
    for l in (3, 20):
        L, hist = ix.train_layer(X[l], rows, P[l], hp, seed=l)
        init = ix.Layer(ix.init_params(X.shape[2], 4, np.random.default_rng(l)), L.x_rms, 1e5)
        before, after = ix.layer_kl(init, Xh[l], hrows, Ph[l]), ix.layer_kl(L, Xh[l], hrows, Ph[l])
        uniform = np.mean([np.sum(np.where(Ph[l, i, :r + 1] > 0, Ph[l, i, :r + 1] * np.log(
            np.maximum(Ph[l, i, :r + 1], 1e-30) * (r + 1)), 0)) for i, r in enumerate(hrows)])
        assert np.mean(hist[-10:]) < 0.5 * hist[0], (l, hist[0], hist[-10:])
        assert after < 0.6 * before and after < 0.8 * uniform, (l, before, after, uniform)


def _spin():
    p = assets.repo_root() / "build" / "release" / "tools" / "spin"
    if not p.exists():
        pytest.skip(f"{p} not built (cmake --build --preset release)")
    return str(p)


def test_key_traces_round_trip_through_the_cpp_reader(model, tok, text, tmp_path, monkeypatch):
    """A tiny distil run writes kind=keys traces (plain, MTP, multi-turn) that `spin trace info`
    validates, and whose all-keep scores as `spin trace convert` computes them equal the
    indexer's dequantised scores in Python; a second run is served from the cache."""
    spin = _spin()
    cache = tmp_path / "cache"
    cache.mkdir()
    for f in (assets.model_path(), assets.text_path()):
        os.symlink(f, cache / f.name)
    monkeypatch.setenv("SPIN_RECORD_CACHE", str(cache))
    hp = dict(distill.HP, steps=3, train=(16384, 256), train_rows=16, heldout=(24576, 128),
              heldout_rows=4)
    out = tmp_path / "out"
    args = dict(context=384, steps=4, turns=((200, 3), (300, 2), (384, 2)))
    r = distill.run(model, tok, text, str(out), hp=hp, log=lambda m: None, **args)
    assert len(r["per_layer"]) == 30 and r["traces"]["n2"]["next_n"] == 2
    from safetensors.numpy import load_file
    assert r["traces"]["mtp2"]["draft_keys"] and r["traces"]["mtp2"]["steps"] >= 20
    for name in ("n1", "n2", "turns", "mtp2"):
        path = out / f"smollm2-keys-ctx384-{name}.safetensors"
        info = subprocess.run([spin, "trace", "info", str(path)], capture_output=True, text=True)
        assert info.returncode == 0, info.stderr
        assert "kind            keys" in info.stdout and "heads           4 x 128" in info.stdout
        conv = tmp_path / f"conv-{name}.safetensors"
        c = subprocess.run([spin, "trace", "convert", str(path), "--out", str(conv)],
                           capture_output=True, text=True)
        assert c.returncode == 0, c.stderr
        k, s = load_file(str(path)), load_file(str(conv))
        ctx = k["ctx_len"]
        n = k["layer.0.q"].shape[1]
        if name == "turns":
            assert (np.diff(ctx) > 1).sum() == 2                 # two ctx_len jumps
        if name == "mtp2":
            assert "draft keys recorded" in info.stdout
            acc = k["accepted"]
            assert 0 < acc.sum() < len(acc)                      # the greedy drafts: real acceptance
            assert np.array_equal(np.diff(ctx), 1 + acc[:-1])    # ctx_len grows by 1 + accepted
            for l in (0, 29):
                kd, kf = k[f"layer.{l}.k_draft"][:, 0], k[f"layer.{l}.k"][ctx - 1]
                assert np.array_equal(kd[acc == 1], kf[acc == 1])  # accepted: the book's token
                assert (kd[acc == 0] != kf[acc == 0]).any(axis=1).all()  # rejected: its own key
        # (spin replays a draft row over the final sequence's entries, k_draft unused: replay.h)
        for l in (0, 17, 29):
            q, w = k[f"layer.{l}.q"], k[f"layer.{l}.w"]
            deq = ix.dequantised_scores(k[f"layer.{l}.k"], k[f"layer.{l}.k_scale"],
                                        q.reshape(-1, 4, 128), w.reshape(-1, 4)).reshape(len(ctx), n, -1)
            for st in range(len(ctx)):
                for j in range(n):
                    v = int(ctx[st] - n + j + 1)
                    a, b = s[f"layer.{l}.scores"][st, j, :v].astype(np.float64), deq[st, j, :v]
                    assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max() + 1e-30, (name, l, st, j)
    # the second run is a cache hit: same files, no training
    mtime = (out / "distill.json").stat().st_mtime_ns
    r2 = distill.run(model, tok, text, str(out), hp=hp, log=lambda m: None, **args)
    assert r2 == r and (out / "distill.json").stat().st_mtime_ns == mtime


def test_decode_step_equals_the_prefill(model, tok, text):
    """distill.decode_inputs (the draft tokens' path) gives the same layer inputs as the causal
    forward for the token that is really there."""
    ids = np.array(tok.encode(text).ids)[:200]
    X, _, _, K, V = ix.capture(model, ids, np.array([199]), keep_kv=True)
    got = distill.decode_inputs(model, int(ids[150]), 150, K, V)
    assert np.abs(got - X[:, 150]).max() <= 2e-3 * np.abs(X[:, 150]).max()
