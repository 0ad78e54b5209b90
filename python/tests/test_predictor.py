"""The research API: trace → spin select/observe/commit → recall, bit-identical to replay and to
`spin replay`; configs; errors as exceptions."""
import json
import subprocess

import numpy as np
import pytest

import spin_dsa
from conftest import spin_binary

NEG_INF = np.float32(-np.inf)


def paged_cache(k, k_scale, page_size):
    """The indexer cache of one layer in its byte layout: [pages, page_size·128 e4m3 | page_size fp32]."""
    entries = k.shape[0]
    pages = max(1, -(-entries // page_size))
    cache = np.zeros((pages, page_size * 132), dtype=np.uint8)
    values = np.zeros((pages * page_size, 128), dtype=np.uint8)
    values[:entries] = k
    scales = np.ones(pages * page_size, dtype=np.float32)
    scales[:entries] = k_scale
    cache[:, : page_size * 128] = values.reshape(pages, page_size * 128)
    cache[:, page_size * 128:] = scales.reshape(pages, page_size).view(np.uint8)
    return cache, np.arange(pages, dtype=np.int32)[None, :]


def recall(a, b):
    b = set(int(x) for x in b if x >= 0)
    if not b:
        return 1.0
    return len(b & set(int(x) for x in a if x >= 0)) / len(b)


def run_spin(path, config, name="spin"):
    """The README's loop: every (step, layer, row) in decode order, the indexer's full scores as the
    truth, the scores of the selected blocks only (what the block-masked kernel writes) for spin.
    Step 0 stands for prefill, observed in full and not counted (replay's warm start). A predictor
    that reads keys (hisa) gets the layer's keys and the step's query with every select, as
    replay gives them from a key trace."""
    r = spin_dsa.open_trace(path)
    m = r.meta
    ps, k, next_n = m["page_size"], m["topk"], m["next_n"]
    p = spin_dsa.make_predictor(name, config, num_layers=r.num_layers, request_id=0)
    reads_keys = {i["name"]: i["reads"] for i in spin_dsa.predictor_info()}[name] == "keys"
    caches = [paged_cache(r.k(l), r.k_scale(l), ps) for l in range(r.num_layers)]
    recalls = []
    for s in range(r.steps):
        ctx = int(r.ctx_len[s])
        for l in range(r.num_layers):
            cache, table = caches[l]
            full = spin_dsa.indexer_scores(cache, table, np.array([ctx], np.int64),
                                           r.q(l)[s][None], r.w(l)[s][None], page_size=ps)
            vis = np.array([r.visible_entries(s, j) for j in range(next_n)], np.int64)
            truth = spin_dsa.topk(full, k, visible_entries=vis)
            keys = dict(k=r.k(l), k_scale=r.k_scale(l), q=r.q(l)[s], w=r.w(l)[s]) if reads_keys else {}
            blocks = p.select(l, s, ctx, next_n, **keys)
            for j in range(next_n):
                row = full[j, : vis[j]]
                if s == 0:
                    all_blocks = np.arange(-(-vis[j] // ps), dtype=np.int32)
                    p.observe(l, j, np.ascontiguousarray(row), topk=truth[j], scored_blocks=all_blocks)
                    continue
                keep = np.zeros(-(-vis[j] // ps), bool)
                keep[blocks[blocks < keep.size]] = True
                masked = np.where(np.repeat(keep, ps)[: vis[j]], row, NEG_INF).astype(np.float32)
                mine = spin_dsa.topk(masked[None], k, block_ids=blocks,
                                     block_offsets=np.array([0, blocks.size], np.int32),
                                     block_entries=ps)[0]
                if vis[j] > k:  # rows that see <= topk entries are exact by construction
                    recalls.append(recall(mine, truth[j]))
                p.observe(l, j, masked, topk=mine)
        p.commit(int(r.accepted[s]) if next_n > 1 else 0)
    total = 0.0
    for x in recalls:  # the order and accumulation of SampleStats::mean
        total += x
    return total / len(recalls)


def test_loop_matches_replay_and_cli_bitwise(small_trace_path, tmp_path):
    config = {"target_sparsity": 0.5}
    mine = run_spin(small_trace_path, config)
    scored = spin_dsa.score_trace(small_trace_path)
    metrics = spin_dsa.replay(scored, "spin", config)
    print(f"spin recall at 50% sparsity: {mine:.6f} (replay: {metrics['recall_mean']:.6f})")
    assert mine == metrics["recall_mean"]
    assert 0.3 < mine < 1.0
    cli = spin_binary()
    if cli is None:
        pytest.skip("no built `spin` command (build/release/tools/spin or $SPIN_BINARY)")
    out_json = tmp_path / "replay.json"
    out = subprocess.run([cli, "replay", small_trace_path, "--predictor", "spin", "--sparsity", "0.5",
                          "--json", str(out_json)], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert json.loads(out_json.read_text())["recall_mean"] == mine


@pytest.mark.parametrize("name", ["hisa", "spin-hybrid"])
def test_key_readers_through_select_match_replay(small_trace_path, name):
    """select(k=, k_scale=, q=, w=) feeds hisa and spin-hybrid the key trace's keys and query
    as `spin replay` does: the same selections, so the same mean recall to the bit."""
    config = {"target_sparsity": 0.5}
    mine = run_spin(small_trace_path, config, name)
    metrics = spin_dsa.replay(spin_dsa.score_trace(small_trace_path), name, config)
    assert mine == metrics["recall_mean"]
    assert 0.3 < mine < 1.0


def test_select_keys_argument_errors(small_trace_path):
    r = spin_dsa.open_trace(small_trace_path)
    ctx = int(r.ctx_len[0])
    k, ks, q, w = r.k(0), r.k_scale(0), r.q(0)[0], r.w(0)[0]
    p = spin_dsa.make_predictor("hisa", {"page_size": r.meta["page_size"], "topk": r.meta["topk"]},
                                num_layers=r.num_layers)
    with pytest.raises(spin_dsa.InvalidArgument, match="neither hisa"):
        p.select(0, 0, ctx)  # hisa without keys or a probe
    with pytest.raises(ValueError, match="go together"):
        p.select(0, 0, ctx, k=k, k_scale=ks)
    with pytest.raises(ValueError, match="fewer than num_entries"):
        p.select(0, 0, ctx, k=k[:ctx - 1], k_scale=ks[:ctx - 1], q=q, w=w)
    with pytest.raises(ValueError, match="k_scale"):
        p.select(0, 0, ctx, k=k, k_scale=ks[:-1], q=q, w=w)
    with pytest.raises(ValueError, match="like q"):
        p.select(0, 0, ctx, k=k, k_scale=ks, q=q, w=w[:, :1])
    with pytest.raises(TypeError, match="uint8"):
        p.select(0, 0, ctx, k=k.astype(np.int32), k_scale=ks, q=q, w=w)
    b = p.select(0, 0, ctx, k=k, k_scale=ks, q=q, w=w)
    assert b.size == spin_dsa.budget_blocks(p.config, -(-ctx // r.meta["page_size"]))


def test_replay_dict_and_topk(small_trace_path):
    scored = spin_dsa.score_trace(small_trace_path)
    res = spin_dsa.replay(scored, "all-keep", keep_topk=True)
    assert res["recall_mean"] == 1.0
    assert res["predictor"] == "all-keep"
    assert len(res["topk"]) == 2 and res["topk"][0].dtype == np.int32
    facts = scored.facts(64)
    assert facts["samples"] == 2 * 10


def test_config_forms():
    d = spin_dsa.default_config()
    assert d["target_sparsity"] == 0.3 and d["pooling"] == "max"
    p = spin_dsa.make_predictor("spin", "target_sparsity=0.6 explore_ratio=0.2", 2, 5)
    assert p.config["target_sparsity"] == 0.6 and p.request_id == 5 and p.num_layers == 2
    assert spin_dsa.check_config({"alpha": 0.25})["alpha"] == 0.25
    assert "spin" in spin_dsa.predictor_names()
    with pytest.raises(spin_dsa.InvalidArgument, match="target_sparsity"):
        spin_dsa.make_predictor("spin", {"target_sparsity": 1.5})
    with pytest.raises(ValueError):
        spin_dsa.make_predictor("nope")


def test_the_paper_preset_by_name():
    """'preset' in a dict applies first wherever it stands; in a string, in order."""
    assert spin_dsa.preset_names() == ["default", "paper"]
    paper = spin_dsa.check_config({"explore_ratio": 0.2, "preset": "paper"})
    assert paper["explore_ratio"] == 0.2 and paper["explore_churn"] == 0.0
    assert paper["topk_first"] == 0 and paper["recent_blocks"] == 0 and paper["pool_depth"] == 0.0
    assert paper["alpha"] == 0.5 and paper["pooling"] == "max"
    assert spin_dsa.check_config("preset=paper")["explore_ratio"] == 0.05
    assert spin_dsa.check_config("preset=paper preset=default") == spin_dsa.default_config()
    p = spin_dsa.make_predictor("spin", {"preset": "paper"}, 1)
    assert p.config == spin_dsa.check_config("preset=paper")
    with pytest.raises(spin_dsa.InvalidArgument, match="unknown preset 'papr'; supported: default, paper"):
        spin_dsa.check_config({"preset": "papr"})


def test_select_observe_commit_and_errors():
    cfg = {"page_size": 16, "topk": 32, "target_sparsity": 0.5}
    p = spin_dsa.make_predictor("spin", cfg, num_layers=1, request_id=1)
    b = p.select(0, 0, 1000)
    assert b.dtype == np.int32 and np.all(np.diff(b) > 0) and b[0] == 0
    assert b.size == spin_dsa.budget_blocks(cfg, -(-1000 // 16))
    scores = np.random.default_rng(0).standard_normal(1000).astype(np.float32)
    with pytest.raises(TypeError, match="float32"):
        p.observe(0, 0, scores.astype(np.float64))
    with pytest.raises(spin_dsa.InvalidArgument, match="sees 1000"):
        p.observe(0, 0, scores[:10])
    bad = scores.copy()
    bad[int(b[0]) * 16] = np.nan
    with pytest.raises(spin_dsa.InvalidArgument, match="NaN"):
        p.observe(0, 0, bad)
    with pytest.raises(spin_dsa.FailedPrecondition, match="not observed"):
        p.commit(0)
    p.observe(0, 0, scores)
    with pytest.raises(spin_dsa.InvalidArgument, match="accepted"):
        p.commit(1)
    p.commit(0)
    with pytest.raises(spin_dsa.FailedPrecondition):
        p.select(0, 0, 1001)  # step 0 again
    with pytest.raises(spin_dsa.OutOfRange):
        p.select(3, 1, 1001)
    child = p.fork(9)
    assert child.request_id == 9
    p.reset()
    assert p.select(0, 0, 1000).size == b.size
