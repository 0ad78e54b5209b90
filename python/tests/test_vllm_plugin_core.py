"""The vLLM plugin's pure-Python parts (spin_dsa.vllm.config / runtime) and the score-trace
writer they use; no vLLM or torch needed. The plugin against vLLM itself: tests/integration/."""
import numpy as np
import pytest

import spin_dsa
from spin_dsa.vllm.config import parse_spin_config
from spin_dsa.vllm.lifecycle import request_key
from spin_dsa.vllm.runtime import SpinRuntime


def test_write_score_trace_round_trip(tmp_path):
    rng = np.random.default_rng(1)
    scores = [rng.normal(size=(4, 2, 300)).astype(np.float32) for _ in range(2)]
    path = str(tmp_path / "s.safetensors")
    spin_dsa.write_score_trace({"model": "m", "next_n": 2, "page_size": 64, "topk": 32},
                               [200, 202, 205, 207], scores, path, accepted=[0, 1, 0, 1])
    r = spin_dsa.open_trace(path)
    assert (r.kind, r.steps, r.num_layers) == ("scores", 4, 2)
    np.testing.assert_array_equal(r.scores(1), scores[1])
    np.testing.assert_array_equal(r.accepted, [0, 1, 0, 1])


def test_write_score_trace_refuses_bad_input(tmp_path):
    path = tmp_path / "bad.safetensors"
    short = np.zeros((2, 1, 100), np.float32)
    with pytest.raises(spin_dsa.SpinError, match="columns"):  # ctx_len beyond the columns
        spin_dsa.write_score_trace({"model": "m", "next_n": 1}, [50, 150], [short], str(path))
    with pytest.raises(ValueError, match="steps"):
        spin_dsa.write_score_trace({"model": "m", "next_n": 1}, [50], [short], str(path))
    assert not path.exists()  # nothing half-written
    key_trace = spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=300, steps=2, layers=1)
    kp = str(tmp_path / "k.safetensors")
    key_trace.write(kp)
    with pytest.raises(spin_dsa.FailedPrecondition, match="key trace"):
        spin_dsa.open_trace(kp).scores(0)


def test_config_off_unless_asked_and_strict():
    assert not parse_spin_config({}).enabled
    assert not parse_spin_config({"other": 1}).enabled
    on = parse_spin_config({"spin": {"config": {"target_sparsity": 0.5}}})
    assert on.enabled and on.predictor == "spin" and on.config == {"target_sparsity": 0.5}
    assert not parse_spin_config({"spin": {"enabled": False}}).enabled
    assert on.warm_start and not parse_spin_config({"spin": {"warm_start": False}}).warm_start
    assert not on.verify_ranks and parse_spin_config({"spin": {"verify_ranks": True}}).verify_ranks
    for bad, msg in [({"enable": True}, "unknown keys"), ({"predictor": "oracle"}, "cannot serve"),
                     ({"verify_ranks": "yes"}, "verify_ranks"),
                     ({"config": {"topk": 8}}, "come from the model"),
                     ({"record": {"dir": ""}}, "record.dir"),
                     ({"max_requests": 0}, "max_requests"), ({"warm_start": 1}, "warm_start")]:
        with pytest.raises(ValueError, match=msg):
            parse_spin_config({"spin": bad})
    with pytest.raises(spin_dsa.InvalidArgument):
        parse_spin_config({"spin": {"config": {"target_sparsity": 2}}})


def test_request_key_is_stable():
    assert request_key("cmpl-1") == request_key("cmpl-1") != request_key("cmpl-2")
    assert 0 <= request_key("x") < 1 << 63


def _runtime(**spin):
    cfg = parse_spin_config({"spin": dict({"config": {"target_sparsity": 0.5}}, **spin)})
    rt = SpinRuntime(cfg, num_layers=2, max_entries=4096, max_requests=4, max_next_n=2)
    rt.ensure_serving(page_size=64, topk=64)
    return rt


def _scores(rows, cols, seed):
    return np.random.default_rng(seed).normal(size=(rows, cols)).astype(np.float32)


def test_runtime_lazy_commit_from_seq_len_delta(tmp_path):
    rt = _runtime(record={"dir": str(tmp_path), "requests": ["a"]})
    rt.add("a")
    rt.add("b")
    # Step 0 ends both prompts (a's whole prompt, b's last chunk of 300 tokens): their last rows,
    # scored in full, are observed as prefills (the warm start) and committed with 0 accepted.
    prompt = np.array([999, 1999])
    rt.begin_step(["a", "b"], [999, 300], prompt_ends=[0, 1])
    slots = [rt.slot("a"), rt.slot("b")]  # taken at the request's first step
    assert rt.prompt_rows(0) == [(0, 998), (1, 1298)]
    rows = {layer: _scores(2, 1999, 20 + layer) for layer in range(2)}
    for layer in range(2):
        rt.observe_prompts(layer, prompt, rows[layer])
        assert rt.prompt_rows(layer) == []  # a forward the runner does not announce gets none
    assert [rt.serving.step(s) for s in slots] == [0, 0]  # open until the next step
    # Then decode steps, the sampled token and one draft a step: a grows by 1 + the drafts the
    # previous step accepted — +2 closes the prompt's step with 0 (one row), +1 closes step 1
    # with 0, +2 closes step 2 with 1.
    seq = prompt + 2
    for step, grow in enumerate([None, [1, 2], [2, 2]], start=1):
        if grow is not None:
            seq = seq + grow
        rt.begin_step(["a", "b"])
        for layer in range(2):
            ids, offs = rt.select(layer, seq, 2)
            assert offs.shape == (3,) and ids.shape[0] == offs[-1]
            assert offs[1] - offs[0] == -(-seq[0] // 64)  # a is recorded: every block
            assert offs[2] - offs[1] < -(-seq[1] // 64)  # b, warm: spin's budget from its first decode
            rt.observe(layer, _scores(4, int(seq.max()), layer), None)
        assert [rt.serving.step(s) for s in slots] == [step, step]  # committed lazily
    rt.drop("a")  # writes a's trace: the prompt's row, then the accepted counts the deltas gave
    r = spin_dsa.open_trace(rt.recorder.written[0])
    np.testing.assert_array_equal(r.accepted, [0, 0, 1, 0])  # the open last step: 0
    np.testing.assert_array_equal(r.ctx_len, [1000, 1001, 1002, 1004])  # row 0 of step 0 sees 999
    for layer in range(2):
        np.testing.assert_array_equal(r.scores(layer)[0, 0, :999], rows[layer][0, :999])
        assert np.all(np.isneginf(r.scores(layer)[0, 1]))
    assert not rt.serving.active(slots[0])
    rt.begin_step(["c", "b"])
    assert rt.slot("c") == slots[0]  # the lowest free slot is reused


def test_runtime_warm_start_is_replays(tmp_path):
    """The engine's warm start is replay's: a request whose prompt's last row is observed at the
    step that ends it (observe_prompts), then decodes with one draft a step, selects exactly
    what spin_dsa.replay selects on the score trace of the same rows, whose step 0 is that
    prompt row (as record mode writes it: ctx_len = prompt + next_n - 1, the draft row -inf)."""
    rt = _runtime()
    rt.add("a", key=0)  # replay's request key, so exploration draws agree
    rng = np.random.default_rng(9)
    prompt, next_n, steps, k = 1500, 2, 12, 64
    accepted = rng.integers(0, 2, steps).astype(np.int32)
    accepted[0] = 0  # the prompt's step: one row
    ctx_len = prompt + next_n - 1 + np.concatenate([[0], np.cumsum(1 + accepted[:-1])])
    cols = int(ctx_len[-1])
    scores = [rng.normal(size=(steps, next_n, cols)).astype(np.float32) for _ in range(2)]
    for layer_scores in scores:
        layer_scores[0, 1:] = -np.inf
    rt.begin_step(["a"], [prompt], prompt_ends=[0])
    for layer in range(2):
        rt.observe_prompts(layer, [prompt], scores[layer][0, :1, :prompt])
    got = {layer: [] for layer in range(2)}
    for s in range(1, steps):
        seq = ctx_len[s:s + 1]
        rt.begin_step(["a"])
        for layer in range(2):
            ids, offs = rt.select(layer, seq, next_n)
            logits = np.ascontiguousarray(scores[layer][s])
            top = spin_dsa.topk(logits, k, visible_entries=spin_dsa.visible_entries(seq, next_n),
                                block_ids=ids, block_offsets=offs, rows_per_mask=next_n,
                                block_entries=rt.serving.block_entries)
            rt.observe(layer, logits, top)
            got[layer].append(top)
    meta = {"model": "test", "next_n": next_n, "page_size": 64, "topk": k, "compress_ratio": 1}
    path = str(tmp_path / "a.safetensors")
    spin_dsa.write_score_trace(meta, ctx_len, scores, path, accepted)
    rep = spin_dsa.replay(spin_dsa.score_trace(path), "spin", {"target_sparsity": 0.5},
                          keep_topk=True)
    for layer in range(2):
        np.testing.assert_array_equal(np.concatenate(got[layer]), rep["topk"][layer][next_n:])
    assert rep["prefill_steps"] == 1  # step 0, the prompt's row


def test_more_requests_than_slots_run_dense_and_are_counted():
    """max_requests 1, two requests: the second finds no slot — it scores every block, is not
    observed, and the step is counted; it takes the slot once the first is dropped. Never an
    error (the device path's rule, lifecycle.Requests)."""
    rt = _runtime(max_requests=1)
    rt.add("a")
    rt.add("b")
    seq = np.array([1000, 2000])
    rt.begin_step(["a", "b"])
    for layer in range(2):
        ids, offs = rt.select(layer, seq, 1)
        assert offs[1] - offs[0] < -(-seq[0] // 64)  # a: spin's budget
        assert offs[2] - offs[1] == -(-seq[1] // 64)  # b: no slot, every block
        rt.observe(layer, _scores(2, int(seq.max()), layer), None)
    assert "b" not in rt.slots and rt.stats()["no_slot_steps"] == 1
    assert rt.stats()["requests_with_state"] == 1 and rt.stats()["decode_rows"] == 4
    rt.drop("a")
    rt.begin_step(["b"])
    assert rt.slot("b") == 0 and rt.stats()["no_slot_steps"] == 1


def test_runtime_errors_are_clear():
    rt = _runtime(max_requests=1)
    rt.add("a")
    rt.begin_step(["a"])
    with pytest.raises(RuntimeError, match="runner reported"):
        rt.select(0, np.array([100, 100]), 1)
    with pytest.raises(RuntimeError, match="without its select"):
        rt.observe(1, _scores(1, 100, 0), None)


def test_record_mode_writes_exact_score_traces(tmp_path):
    rt = _runtime(record={"dir": str(tmp_path), "requests": ["r/1"], "layers": [1], "max_steps": 3})
    rt.begin_step(["r/1", "other"])
    seq = np.array([700, 900])
    written = {}
    for step in range(4):
        if step:
            rt.begin_step(["r/1", "other"])
        for layer in range(2):
            ids, offs = rt.select(layer, seq, 1)
            # while recorded, a request scores every block (its trace is the true indexer output);
            # after max_steps it is back on spin's budget
            every = np.array_equal(ids[offs[0]:offs[1]], np.arange(-(-seq[0] // 64)))
            assert every == (step < 3)
            logits = _scores(2, int(seq.max()), 10 * step + layer)
            if layer == 1 and step < 3:
                written[step] = logits[0, :seq[0]].copy()
            rt.observe(layer, logits, None)
        seq = seq + 1
    assert rt.recorder.written == [str(tmp_path / "r_1.safetensors")]
    r = spin_dsa.open_trace(rt.recorder.written[0])
    assert (r.kind, r.steps, r.num_layers, r.meta["extra"]["layers"]) == ("scores", 3, 1, "1")
    np.testing.assert_array_equal(r.ctx_len, [700, 701, 702])
    for s in range(3):
        np.testing.assert_array_equal(r.scores(0)[s, 0, :700 + s], written[s])


def test_record_mode_writes_the_trace_when_next_n_changes(tmp_path):
    # A trace has one next_n: when the engine turns MTP on mid-request, the steps recorded so far
    # are written (and the request is recorded no more), not dropped.
    rt = _runtime(record={"dir": str(tmp_path), "requests": ["a"], "layers": [0], "max_steps": 10})
    seq = np.array([300])
    written = []
    for step, next_n in enumerate([1, 1, 2, 2]):
        rt.begin_step(["a"])
        for layer in range(2):
            rt.select(layer, seq, next_n)
            logits = _scores(next_n, int(seq.max()), 10 * step + layer)
            if layer == 0 and next_n == 1:
                written.append(logits[0, :seq[0]].copy())
            rt.observe(layer, logits, None)
        assert rt.recorder.recording("a") == (next_n == 1)
        seq = seq + next_n
    assert rt.recorder.written == [str(tmp_path / "a.safetensors")]
    r = spin_dsa.open_trace(rt.recorder.written[0])
    assert (r.steps, r.meta["next_n"]) == (2, 1)
    np.testing.assert_array_equal(r.ctx_len, [300, 301])
    for s in range(2):
        np.testing.assert_array_equal(r.scores(0)[s, 0, :300 + s], written[s])
