"""The kind=scores trace a short recording writes (include/spin/trace.h), and the selectors."""

import json

import numpy as np
import pytest

from spin_record import dsa, record, selectors


@pytest.fixture(scope="module")
def small_traces(model, tok, text, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    s = record.record(model, tok, text, str(out), context=640, steps=5, next_ns=(1, 3),
                      log=lambda m: None)
    return out, s


def test_trace_schema(small_traces):
    from safetensors import safe_open

    out, s = small_traces
    for n in (1, 3):
        path = out / f"smollm2-ctx640-n{n}.safetensors"
        with safe_open(str(path), "numpy") as f:
            meta = f.metadata()
            assert meta["format"] == "spin-trace" and meta["version"] == "1"
            assert meta["kind"] == "scores" and meta["next_n"] == str(n)
            assert meta["num_layers"] == "30" and meta["page_size"] == "64"
            assert meta["compress_ratio"] == "1" and int(meta["topk"]) == 64
            ctx = f.get_tensor("ctx_len")
            assert ctx.dtype == np.int64 and ctx.tolist() == [640 - (5 - i) * n for i in range(6)]
            if n > 1:
                acc = f.get_tensor("accepted")
                assert acc.dtype == np.int32 and acc.shape == (6,)
                assert ((acc >= 0) & (acc <= n - 1)).all()
            else:
                assert "accepted" not in f.keys()
            for l in (0, 29):
                sc = f.get_tensor(f"layer.{l}.scores")
                assert sc.dtype == np.float32 and sc.shape == (6, n, 640)
                for st in range(6):
                    for j in range(n):
                        vis = ctx[st] - n + j + 1
                        row = sc[st, j]
                        assert not np.isnan(row).any() and not np.isposinf(row).any()
                        assert np.isneginf(row[vis:]).all()
                        # head-mean of distributions is a distribution
                        assert abs(np.exp(row[:vis].astype(np.float64)).sum() - 1) < 1e-4


def test_probe_schema_and_values(small_traces):
    """layer.{l}.probe [steps, next_n, ceil(640 / 64)]: a log-distribution over the committed
    blocks (softmax per head, head mean), 0 for a visible block with only drafts, -inf beyond."""
    from safetensors import safe_open

    out, _ = small_traces
    for n in (1, 3):
        with safe_open(str(out / f"smollm2-ctx640-n{n}.safetensors"), "numpy") as f:
            assert f.metadata()["probe_block_entries"] == "64"
            ctx = f.get_tensor("ctx_len")
            for l in (0, 29):
                pr = f.get_tensor(f"layer.{l}.probe")
                assert pr.dtype == np.float32 and pr.shape == (6, n, 10)
                for st in range(6):
                    committed_blocks = -(-(ctx[st] - n + 1) // 64)
                    for j in range(n):
                        seen = -(-(ctx[st] - n + j + 1) // 64)
                        row = pr[st, j]
                        assert np.isneginf(row[seen:]).all()
                        assert np.isfinite(row[:seen]).all() and (row[:seen] <= 0).all()
                        assert (row[committed_blocks:seen] == 0).all()
                        mass = np.exp(row[:committed_blocks].astype(np.float64)).sum()
                        assert abs(mass - 1) < 1e-4


def test_block_key_pool_is_incremental_and_exact_on_uniform_blocks():
    rng = np.random.default_rng(1)
    k = rng.standard_normal((200, 2, 8)).astype(np.float32)
    a = record.BlockKeyPool(4, 2, 8, block=64)
    for c in (1, 63, 64, 65, 130, 200):   # folded step by step ...
        a.fold(k, c)
    b = record.BlockKeyPool(4, 2, 8, block=64)
    b.fold(k, 200)                        # ... or at once: the same sums
    np.testing.assert_allclose(a.sums, b.sums, rtol=1e-12)
    assert a.counts.tolist() == [64, 64, 64, 8]
    # With every key of a block equal to its mean, the probe is the block's true attention mass.
    ku = np.repeat(rng.standard_normal((4, 1, 2, 8)), 64, axis=1).reshape(256, 2, 8)[:200]
    pool = record.BlockKeyPool(4, 2, 8, block=64)
    pool.fold(ku, 200)
    q = rng.standard_normal((4, 8))      # 4 heads, group 2
    got = pool.probe(q, 200, group=2, dim=8)
    logits = np.einsum("hd,shd->hs", q, ku[:, np.arange(4) // 2, :]) / np.sqrt(8)
    p = np.exp(logits - logits.max(axis=1, keepdims=True))
    p = (p / p.sum(axis=1, keepdims=True)).mean(axis=0)
    want = np.log([p[b * 64:(b + 1) * 64].sum() for b in range(4)])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-12)


def test_mtp_rows_are_the_plain_rows(small_traces):
    """The next_n=3 rows of the last step are the last three next_n=1 rows (same forward)."""
    from safetensors import safe_open

    out, _ = small_traces
    with safe_open(str(out / "smollm2-ctx640-n1.safetensors"), "numpy") as a, \
            safe_open(str(out / "smollm2-ctx640-n3.safetensors"), "numpy") as b:
        s1, s3 = a.get_tensor("layer.7.scores"), b.get_tensor("layer.7.scores")
        np.testing.assert_array_equal(s3[-1], s1[-3:, 0])


def test_summary_stats(small_traces):
    _, s = small_traces
    m = s["traces"]["n1"]["mean"]
    assert 0 <= m["prev_iter_topk_recall"] <= 1 and 0 < m["topk_block_share"] <= 1
    assert -1 <= m["pearson_block_max"] <= 1
    assert -1 <= m["probe_pearson_block_max"] <= 1
    assert 0 <= m["probe_topk_block_recall"] <= 1 and 0 <= m["prev_iter_topk_block_recall"] <= 1
    json.dumps(s)


def test_scaled_topk():
    assert record.scaled_topk(65536) == 2048 and record.scaled_topk(8192) == 256
    assert record.scaled_topk(131072) == 2048 and record.scaled_topk(640) == 64


def test_selectors_budget_forced_and_determinism():
    rng = np.random.default_rng(0)
    N, topk = 8192, 256
    score = rng.standard_normal(N).astype(np.float32)
    for name in ("oracle", "prev-iter", "random"):
        a = selectors.make_selector(name, 0.5, topk, seed=3)
        b = selectors.make_selector(name, 0.5, topk, seed=3)
        for sel in (a, b):
            if sel.needs_truth:
                sel.peek(0, score)
            sel.observe(0, score, dsa.topk_positions(score, topk))
            sel.commit()
        ba, bb = a.select(0, N), b.select(0, N)
        np.testing.assert_array_equal(ba, bb)
        assert len(ba) == 64 and ba[0] == 0 and ba[-1] == 127
        assert (np.diff(ba) > 0).all()
    # oracle at a budget holding every top-k block has block recall 1
    o = selectors.Oracle(0.0, topk)
    o.peek(0, score)
    assert len(o.select(0, N)) == 128


def test_topk_tie_rule():
    s = np.array([1.0, 3.0, 3.0, 2.0, 3.0], np.float32)
    assert dsa.topk_positions(s, 2).tolist() == [1, 2]
