"""spin_dsa.Serving (include/spin/serving.h): output format, determinism across slots (keyed on the
request id), the add/drop/preempt lifecycle, and errors as exceptions."""
import numpy as np
import pytest

import spin_dsa

CFG = {"page_size": 16, "topk": 32, "target_sparsity": 0.5, "explore_ratio": 0.2}
NEG_INF = np.float32(-np.inf)


def scores_for(rid, layer, step, n):
    rng = np.random.default_rng(rid * 1000 + layer * 100 + step)
    pos = np.arange(n)
    return (2 * np.cos(pos / (40 + 7 * layer) + 0.01 * (step + rid)) + rng.random(n)).astype(np.float32)


def drive(s, slots, rids, seq_lens, step, next_n=1, accepted=None):
    """One decode step over every layer; returns each layer's select output (copied)."""
    out = []
    E = s.block_entries
    width = max(seq_lens)
    for layer in range(3):
        blocks = s.select(slots, layer, seq_lens, next_n)
        out.append(blocks.copy())
        logits = np.full((blocks.shape[0], width), NEG_INF, np.float32)
        for r in range(blocks.shape[0]):
            i = r // next_n
            full = scores_for(rids[i], layer, step, width)
            for b in blocks[r][blocks[r] >= 0]:
                logits[r, b * E:(b + 1) * E] = full[b * E:(b + 1) * E]
        s.observe(slots, layer, logits)
    s.commit(slots, accepted)
    return out


def make(**kw):
    args = dict(predictor="spin", config=CFG, max_requests=4, num_layers=3, max_entries=2048)
    args.update(kw)
    return spin_dsa.Serving(**args)


def test_select_shape_padding_ascending():
    s = make()
    assert s.max_blocks == 128 and s.block_entries == 16
    s.add(2, 41)
    s.add(0, 42)
    seq = np.array([1000, 700], np.int64)
    blocks = s.select(np.array([2, 0], np.int32), 0, seq)
    assert blocks.dtype == np.int32 and blocks.shape == (2, 128)
    counts = s.counts(2)
    for r in range(2):
        valid = blocks[r, : counts[r]]
        assert np.all(np.diff(valid) > 0) and np.all(valid >= 0)
        assert np.all(blocks[r, counts[r]:] == -1)
        assert counts[r] == spin_dsa.budget_blocks(CFG, -(-int(seq[r]) // 16))
    # A view of the object's buffer (no copy), or written into `out`.
    again = s.counts(2)
    assert np.shares_memory(counts, again)
    s.drop(2)
    s.drop(0)
    s.add(1, 5)
    out = np.zeros((3, 130), np.int32)
    res = s.select([1], 0, [900], out=out)
    assert res is out and out[0, 0] == 0 and out[1].sum() == 0


def test_same_request_ids_in_other_slots_select_the_same():
    a, b = make(), make()
    a.add(0, 5); a.add(1, 6)
    b.add(3, 6); b.add(2, 5)
    for t in range(6):
        seq = [900 + t, 1500 + t]
        ga = drive(a, [0, 1], [5, 6], seq, t)
        gb = drive(b, [2, 3], [5, 6], seq, t)
        for x, y in zip(ga, gb):
            np.testing.assert_array_equal(x, y)


def test_lifecycle_add_drop_preempt():
    s = make()
    with pytest.raises(spin_dsa.FailedPrecondition, match="free"):
        s.select([1], 0, [800])
    s.add(1, 10)
    assert s.active(1) and s.request_id(1) == 10
    with pytest.raises(spin_dsa.FailedPrecondition, match="holds request 10"):
        s.add(1, 11)
    first = [drive(s, [1], [10], [800 + t], t) for t in range(4)]
    assert s.step(1) == 4
    s.select([1], 0, [900])  # preempted mid-step
    s.drop(1)
    assert not s.active(1) and s.request_id(1) == -1
    s.add(3, 10)  # resumed elsewhere: starts empty, repeats the first run
    for t in range(4):
        for x, y in zip(drive(s, [3], [10], [800 + t], t), first[t]):
            np.testing.assert_array_equal(x, y)


def test_mtp_and_prefill():
    s = make(max_next_n=3)
    s.add(0, 3)
    row = np.zeros((1, 1600), np.float32)
    row[0, 800:832] = 10.0
    for layer in range(3):
        s.prefill([0], layer, [1600], row)
    s.commit([0])
    blocks = s.select([0], 0, [1603], next_n=3)
    assert blocks.shape == (3, 128)
    assert 50 in blocks[0] and 51 in blocks[0]
    np.testing.assert_array_equal(blocks[0], blocks[2])  # rows share the union


def test_errors_are_exceptions():
    s = make()
    s.add(0, 1)
    s.add(1, 2)
    with pytest.raises(spin_dsa.OutOfRange):
        s.select([9], 0, [500])  # wrong slot
    with pytest.raises(spin_dsa.InvalidArgument, match="twice"):
        s.select([0, 0], 0, [500, 500])
    with pytest.raises(spin_dsa.InvalidArgument, match="seq_lens"):
        s.select([0, 1], 0, [500])  # shapes disagree
    with pytest.raises(spin_dsa.ResourceExhausted, match="max_entries"):
        s.select([0], 0, [5000])  # longer than the object was sized for
    with pytest.raises(spin_dsa.InvalidArgument, match="max_next_n"):
        s.select([0], 0, [500], next_n=2)
    with pytest.raises(spin_dsa.FailedPrecondition, match="must follow select"):
        s.observe([0], 0, np.zeros((1, 500), np.float32))
    s.select([0], 0, [500])
    with pytest.raises(TypeError, match="float32"):
        s.observe([0], 0, np.zeros((1, 500), np.float64))
    with pytest.raises(spin_dsa.InvalidArgument, match="below"):
        s.observe([0], 0, np.zeros((1, 100), np.float32))
    bad = np.zeros((1, 500), np.float32)
    bad[0, 3] = np.nan
    with pytest.raises(spin_dsa.InvalidArgument, match="NaN"):
        s.observe([0], 0, bad)
    with pytest.raises(spin_dsa.FailedPrecondition, match="not observed"):
        s.commit([0])
    with pytest.raises(spin_dsa.InvalidArgument):
        spin_dsa.Serving(predictor="oracle", max_requests=1, num_layers=1, max_entries=100)
    with pytest.raises(spin_dsa.InvalidArgument, match="target_sparsity"):
        spin_dsa.Serving(config={"target_sparsity": 2}, max_requests=1, num_layers=1, max_entries=100)


def test_the_registry_says_which_predictors_serve():
    """Serving accepts exactly the predictor_info() rows with can_serve."""
    rows = spin_dsa.predictor_info()
    assert [r["name"] for r in rows] == spin_dsa.predictor_names()
    assert {r["name"] for r in rows if not r["can_serve"]} == {"oracle", "hisa", "spin-hybrid", "spin-hybrid-ic2"}
    for r in rows:
        if r["can_serve"]:
            spin_dsa.Serving(predictor=r["name"], max_requests=1, num_layers=1, max_entries=100)
        else:
            with pytest.raises(spin_dsa.InvalidArgument, match=r["reads"]):
                spin_dsa.Serving(predictor=r["name"], max_requests=1, num_layers=1, max_entries=100)
