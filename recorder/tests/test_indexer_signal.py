"""The distilled indexer as the DSA emulation's signal (indexer_signal.py, dsa.decode(signal=)):
its scores are the fp8 indexer's on the decode's own hidden states, sparsity 0 is dense indexer
top-k, and the C++ key readers (hisa) get the keys through the binding."""

import numpy as np
import pytest

from spin_record import dsa, indexer as ix, selectors
from spin_record.indexer_signal import IndexerPrefix, IndexerSignal


def _layers(n, d, rng, X=None):
    """n randomly initialised 4-head indexers (training is not what these tests check)."""
    return [ix.Layer(ix.init_params(d, 4, rng), 1.0 if X is None else float(np.sqrt(np.mean(X[l] ** 2))),
                     1e5) for l in range(n)]


def _want(L, Xl, pos):
    """The trace path's score of row pos over keys [0, pos] of inputs Xl: Layer.qkw, then
    quantise_for_trace and dequantised_scores (float64), independent of indexer_signal.py."""
    q, k, w = L.qkw(Xl[:pos + 1], np.array([pos]))
    return ix.dequantised_scores(*ix.quantise_for_trace(q, k, w))[0]


def test_signal_is_the_fp8_indexer_and_follows_the_float_one():
    rng = np.random.default_rng(5)
    X = rng.standard_normal((2, 48, 24)).astype(np.float32)
    layers = _layers(2, 24, rng)
    P = 40
    pre = IndexerPrefix.from_inputs(layers, X, P)
    warm = pre.warm()
    sig = IndexerSignal(layers, pre)
    sig.start(B=1, T=8)
    for l, L in enumerate(layers):
        np.testing.assert_allclose(warm[l], _want(L, X[l, :P], P - 1), rtol=1e-5, atol=1e-6)
    for pos in range(P, P + 8):
        for l, L in enumerate(layers):
            got = sig.step(l, X[l, pos][None], pos)[0]
            want = _want(L, X[l], pos)
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6 * np.abs(want).max())
            # the float indexer ranks the same entries (fp8 is a rounding of it, not another model)
            flt = L.scores(X[l, :pos + 1], np.array([pos]))[0]
            assert np.corrcoef(got, flt)[0, 1] > 0.98
            k, ks, qc, wf = sig.view(0, l)
            kc, kss, _, _ = ix.quantise_for_trace(*L.qkw(X[l, :pos + 1], np.array([pos])))
            assert k.shape == (pos + 1, 128) and qc.shape == (1, 4, 128) and wf.shape == (1, 4)
            assert np.array_equal(k, kc) and np.array_equal(ks, kss)
    with pytest.raises(ValueError, match="does not cover"):
        IndexerPrefix.from_inputs(layers, X, 49)


class _Spy(IndexerSignal):
    """Records the hidden states the decode hands to the indexer."""

    def start(self, B, T):
        super().start(B, T)
        self.h = {}

    def step(self, l, h, pos):
        self.h[(l, pos)] = h.copy()
        return super().step(l, h, pos)


class _Recorder(selectors.Dense):
    def __init__(self, *a, **kw):
        super().__init__(*a, **kw)
        self.seen = []

    def observe(self, layer, scores, topk):
        self.seen.append((self.step, layer, scores.copy(), np.asarray(topk).copy()))


@pytest.fixture(scope="module")
def small(model, tok, text):
    ids = np.array(tok.encode(text[:3000]).ids[:150])
    P = 136
    X, _, _, K, V = ix.capture(model, ids, np.array([len(ids) - 1]), keep_kv=True)
    layers = _layers(model.w.n_layers, model.w.d_model, np.random.default_rng(3), X)
    pre = IndexerPrefix.from_inputs(layers, X, P)
    return dict(ids=ids, P=P, X=X, K=K, V=V, layers=layers, pre=pre)


def test_decode_scores_are_the_indexer_on_the_decode_hidden_states(model, small):
    s = small
    P, ids, layers = s["P"], s["ids"], s["layers"]
    spy = _Spy(layers, s["pre"])
    rec = _Recorder(0.0, 4096)  # top-k >= context: attention is full, the states are the prefill's
    dsa.decode(model, dsa.Prefix(s["K"][:, :P], s["V"][:, :P]), ids[P:P + 6],
               [dsa.Config("dense-all", rec, 0.0)], topk=4096, signal=spy)
    steps = [x for x in rec.seen if x[0] > 0]  # step 0: the warm row, the prefix's own
    assert len(steps) == 6 * model.w.n_layers
    for step, l, scores, _ in steps[::7]:
        pos = P + step - 1
        h = np.concatenate([s["X"][l, :P]] + [spy.h[(l, p)] for p in range(P, pos + 1)])
        want = _want(layers[l], h, pos)
        # float32 vs float64 sums, and a key or query computed in another BLAS shape can round
        # to the neighbouring e4m3 code (1 entry of 140 here, 2e-4 off): exact up to those
        err = np.abs(scores - want) / np.abs(want).max()
        assert np.mean(err < 1e-6) >= 0.97 and err.max() < 2e-3, (step, l, err.max())
        # and the hidden state it scored is the layer's normed input of that token
        np.testing.assert_allclose(spy.h[(l, pos)][0], s["X"][l, pos], atol=2e-3 * np.abs(s["X"][l, pos]).max())
    warm = [x for x in rec.seen if x[0] == 0]
    np.testing.assert_allclose(warm[3][2], s["pre"].warm()[3])


def test_sparsity_zero_is_dense_indexer_topk(model, small):
    s = small
    P, ids = s["P"], s["ids"]
    topk = 64  # < the 137..141 entries: the top-k really truncates
    cfgs = [dsa.Config("full"), dsa.Config("dense-topk", selectors.Dense(0.0, topk), 0.0)]
    for name in ("prev-iter", "random", "oracle"):
        cfgs.append(dsa.Config(name, selectors.make_selector(name, 0.0, topk, seed=1), 0.0))
    hfs, stats = dsa.decode(model, dsa.Prefix(s["K"][:, :P], s["V"][:, :P]), ids[P:P + 5], cfgs,
                            topk, signal=IndexerSignal(s["layers"], s["pre"]))
    for b in range(2, len(cfgs)):
        # the same attended sets; the batched prefix products round per row (~1e-6 relative)
        np.testing.assert_allclose(hfs[:, b], hfs[:, 1], rtol=1e-5, atol=1e-4)
    for st in stats[1:]:
        assert st["recall"] == 1.0 and st["block_sparsity"] == 0.0
    assert np.abs(hfs[:, 1] - hfs[:, 0]).max() > 1e-3  # top-64 of the indexer is not full attention
    # at 50 % the budget is met and a random pick loses some of the dense top-k
    r = selectors.make_selector("random", 0.5, topk, seed=1)
    _, st = dsa.decode(model, dsa.Prefix(s["K"][:, :P], s["V"][:, :P]), ids[P:P + 3],
                       [dsa.Config("random", r, 0.5)], topk, signal=IndexerSignal(s["layers"], s["pre"]))
    assert st[0]["block_sparsity"] > 0.2 and st[0]["recall"] < 1.0


def test_key_readers_get_the_indexer_keys(model, small):
    spin_dsa = pytest.importorskip("spin_dsa", reason="the spin_dsa bindings (pip install .)")
    s = small
    P, ids, topk = s["P"], s["ids"], 64
    pre = dsa.Prefix(s["K"][:, :P], s["V"][:, :P])
    hisa0 = selectors.make_selector("hisa", 0.0, topk, seed=1)
    assert hisa0.needs_keys
    cfgs = [dsa.Config("dense-topk", selectors.Dense(0.0, topk), 0.0), dsa.Config("hisa@0", hisa0, 0.0),
            dsa.Config("hisa@0.5", selectors.make_selector("hisa", 0.5, topk, seed=1), 0.5),
            dsa.Config("hybrid@0.5", selectors.make_selector("spin-hybrid", 0.5, topk, seed=1), 0.5)]
    hfs, st = dsa.decode(model, pre, ids[P:P + 4], cfgs, topk, signal=IndexerSignal(s["layers"], s["pre"]))
    np.testing.assert_allclose(hfs[:, 1], hfs[:, 0], rtol=1e-5, atol=1e-4)
    assert st[1]["recall"] == 1.0
    assert st[2]["block_sparsity"] > 0.2 and st[3]["block_sparsity"] > 0.2
    # without the indexer there are no keys: a clear error, not a silent fallback
    with pytest.raises(ValueError, match="indexer"):
        dsa.decode(model, pre, ids[P:P + 1], [dsa.Config("h", selectors.make_selector("hisa", 0.5, topk), 0.5)],
                   topk)
    assert spin_dsa is not None


def test_predictor_specs():
    assert selectors.parse_spec("spin-noexplore") == ("spin", {"explore_ratio": 0})
    assert selectors.parse_spec("spin:explore_ratio=0.2,alpha=0.3") == ("spin", {"explore_ratio": "0.2", "alpha": "0.3"})
    assert selectors.parse_spec("hisa") == ("hisa", {})
    with pytest.raises(ValueError, match="field=value"):
        selectors.parse_spec("spin:explore_ratio")
    spin_dsa = pytest.importorskip("spin_dsa", reason="the spin_dsa bindings (pip install .)")
    sel = selectors.make_selector("spin-noexplore", 0.5, 256)
    assert sel.p.name == "spin" and sel.p.config["explore_ratio"] == 0
    assert selectors.make_selector("spin", 0.5, 256).p.config["explore_ratio"] == spin_dsa.default_config()["explore_ratio"]
    with pytest.raises(spin_dsa.InvalidArgument):
        selectors.make_selector("spin:no_such_field=1", 0.5, 256)


def test_haystack_reuses_the_book_keys_and_equals_one_forward(model, small):
    """quality_indexer.haystack: the book's keys on [0, start), one forward after them; the
    result equals the keys and K/V of a single forward over the whole text."""
    from spin_record.quality_indexer import haystack

    s = small
    P, start = s["P"], 100
    kvp, ipre = haystack(model, s["layers"], s["ids"][:P], start, s["pre"], s["K"], s["V"])
    assert ipre.P == P and kvp.P == P
    np.testing.assert_array_equal(ipre.kc[:, :start], s["pre"].kc[:, :start])
    assert np.mean(ipre.kc == s["pre"].kc) > 0.999  # up to e4m3 codes at a rounding boundary
    np.testing.assert_allclose(ipre.ks, s["pre"].ks, rtol=0.51)  # UE8M0: equal or one binade
    assert np.mean(ipre.ks == s["pre"].ks) > 0.999
    np.testing.assert_allclose(kvp.kt, dsa.Prefix(s["K"][:, :P], s["V"][:, :P]).kt, atol=2e-3)


def test_quality_run_end_to_end_small(model, tok, text, tmp_path, monkeypatch):
    """quality_indexer.run on a 256-token context (random indexers, no retrieval): every config
    is reported, the decoded full attention equals the prefill, dense top-k is its own truth, the
    result is JSON and the prefix is cached (a second run reads it)."""
    import json

    from spin_record import quality_indexer as qi

    monkeypatch.setenv("SPIN_RECORD_CACHE", str(tmp_path))
    layers = _layers(model.w.n_layers, model.w.d_model, np.random.default_rng(9))
    msgs = []
    kw = dict(predictors=("prev-iter", "random"), quick=True, with_retrieval=False)
    res = qi.run(model, tok, text, layers, "test-weights", 256, 6, msgs.append, **kw)
    assert set(res["loss"]) == {"full", "dense-topk", "prev-iter@0.5", "random@0.5"}
    assert res["scored_positions"] == [250, 255] and res["topk"] == 64
    assert abs(res["loss"]["full"]["loss"] - res["loss_full_from_prefill"]) < 1e-3
    assert res["loss"]["dense-topk"]["recall"] == 1.0
    assert 0.0 < res["loss"]["random@0.5"]["block_sparsity"] < 1.0
    report = qi.format_report(json.loads(json.dumps(res)))
    assert report.count("\n| ") == 1 + 4 and "positions 250..255" in report
    assert len(list(tmp_path.glob("indexer-prefix-*.npz"))) == 1
    again = qi.run(model, tok, text, layers, "test-weights", 256, 6, msgs.append, **kw)
    assert any("cached" in m for m in msgs) and again["loss"] == res["loss"]
    with pytest.raises(ValueError, match="do not fit"):
        qi.run(model, tok, text, layers, "test-weights", 256, 200, msgs.append, **kw)
