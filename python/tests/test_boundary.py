"""Nothing a Python caller passes crashes the interpreter, hangs it, or is silently
misread. One test per category of the issue; every case is a typed error naming the argument (a
SpinError subclass) or a correct result. The random search over the same surface is
python/tests/fuzz_boundary.py (scripts/test-python.sh runs it for a fixed time)."""
import os
import threading

import numpy as np
import pytest

import spin_dsa

CFG = {"page_size": 16, "topk": 32, "target_sparsity": 0.5, "explore_ratio": 0.2}


def serving(**kw):
    args = dict(predictor="spin", config=CFG, max_requests=4, num_layers=2, max_entries=2048, max_next_n=2)
    args.update(kw)
    s = spin_dsa.Serving(**args)
    for slot in range(4):
        s.add(slot, 100 + slot)
    return s


def kernel_inputs(ctx=200, next_n=1, heads=4, page=64):
    """A small valid indexer call: cache of enough pages, identity table, random queries."""
    rng = np.random.default_rng(5)
    pages = -(-ctx // page)
    cache = np.zeros((pages, page * 132), np.uint8)
    cache[:, :page * 128] = rng.integers(0, 0x70, (pages, page * 128), dtype=np.uint8)
    cache[:, page * 128:] = np.ones(pages * page, np.float32).view(np.uint8).reshape(pages, page * 4)
    table = np.arange(pages, dtype=np.int32)[None, :]
    q = rng.integers(0, 0x70, (1, next_n, heads, 128), dtype=np.uint8)
    w = np.ones((1, next_n, heads), np.float32)
    return cache, table, np.array([ctx], np.int64), q, w


def raises(cls, match, fn, *args, **kw):
    with pytest.raises(cls, match=match) as info:
        fn(*args, **kw)
    assert isinstance(info.value, spin_dsa.SpinError), type(info.value)
    assert "\n" not in str(info.value)  # one line
    return info.value


# --- Segmentation faults (17 in the issue) -------------------------------------------------------

def test_former_segfaults_raise_or_read_right():
    cache, table, ctx, q, w = kernel_inputs()
    raises(spin_dsa.InvalidArgument, "impl: unknown", spin_dsa.indexer_scores, cache, table, ctx, q, w, impl="bogus")
    for call in (lambda t: spin_dsa.indexer_scores(cache, table, ctx, q, w, threads=t),
                 lambda t: spin_dsa.topk(np.zeros((2, 8), np.float32), 3, threads=t)):
        raises(spin_dsa.InvalidArgument, "threads", call, 100000)
        raises(spin_dsa.InvalidArgument, "threads", call, -1)
    # Negative strides: index arrays are copied in C order, so they are read as the caller sees them.
    s = serving()
    slots = np.array([3, 2, 1, 0], np.int32)[::-1]
    seq = np.array([900, 800, 700, 600], np.int64)[::-1]
    a = s.select(slots, 0, seq).copy()
    s2 = serving()
    b = s2.select(np.array([0, 1, 2, 3], np.int32), 0, np.array([600, 700, 800, 900], np.int64)).copy()
    np.testing.assert_array_equal(a, b)
    # Fewer rows than batch · next_n of the open step.
    logits = np.zeros((3, 2048), np.float32)
    raises(spin_dsa.InvalidArgument, "logits: expected batch · next_n = 4 · 1 = 4 rows", s.observe, slots, 0, logits)
    raises(spin_dsa.InvalidArgument, "scored: expected batch · next_n", s.observe_scored, slots, 0,
           np.zeros((1, 2048), np.float32))
    # accepted with a negative stride: copied, range-checked.
    s.observe(slots, 0, np.zeros((4, 2048), np.float32))
    s.select(slots, 1, seq)
    s.observe(slots, 1, np.zeros((4, 2048), np.float32))
    s.commit(slots, np.zeros(8, np.int32)[::-2])
    # out= aliasing slots.
    s = serving(max_requests=64)
    buf = np.zeros((64, s.max_blocks), np.int32)
    raises(spin_dsa.InvalidArgument, "out: shares memory with slots", s.select, buf[0, :1], 0, [500], out=buf)
    # Block offsets past the ids array (indexer and topk).
    raises(spin_dsa.OutOfRange, "block_offsets", spin_dsa.indexer_scores, cache, table, ctx, q, w,
           block_ids=np.array([0], np.int32), block_offsets=np.array([0, 5], np.int32))
    raises(spin_dsa.OutOfRange, "block_offsets", spin_dsa.topk, np.zeros((1, 256), np.float32), 4,
           block_ids=[0], block_offsets=[0, 9], block_entries=64)
    # Negative-stride block ids and visible counts are read in order.
    scores = np.arange(256, dtype=np.float32)[None, :].copy()
    top = spin_dsa.topk(scores, 4, visible_entries=np.array([0, 100], np.int64)[::-1][:1],
                        block_ids=np.array([1, 0], np.int32)[::-1], block_offsets=[0, 2], block_entries=64)
    assert top.tolist() == [[96, 97, 98, 99]]


def test_score_trace_threads_refused(small_trace_path):
    raises(spin_dsa.InvalidArgument, "threads", spin_dsa.score_trace, small_trace_path, threads=100000)


# --- Floating-point exceptions (3) ---------------------------------------------------------------

def test_former_floating_point_exceptions_raise(small_trace_path):
    cache, table, ctx, q, w = kernel_inputs()
    raises(spin_dsa.InvalidArgument, "compress_ratio", spin_dsa.indexer_scores, cache, table, ctx, q, w,
           compress_ratio=0)
    scored = spin_dsa.score_trace(small_trace_path)
    raises(spin_dsa.InvalidArgument, "block_entries", scored.facts, 0)
    mtp = spin_dsa.score_trace(spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=600, steps=3, layers=1,
                                                          next_n=2, seed=1))
    raises(spin_dsa.InvalidArgument, "block_entries", mtp.facts, 0)
    assert scored.facts(64)["samples"] > 0


# --- Bus error: a trace changed under an open reader ---------------------------------------------

def test_truncated_trace_under_reader(tmp_path, small_trace_path):
    path = tmp_path / "t.safetensors"
    path.write_bytes(open(small_trace_path, "rb").read())
    copied = spin_dsa.open_trace(str(path))  # small: read into memory at open
    mapped = spin_dsa.open_trace(str(path), copy_below_bytes=0)
    assert not copied.mapped and mapped.mapped
    k_before = copied.k(1).copy()
    with open(path, "r+b") as f:
        f.truncate(100)
    np.testing.assert_array_equal(copied.k(1), k_before)  # the old contents, never SIGBUS
    for access in (lambda: mapped.k(1), lambda: mapped.q(0), lambda: mapped.ctx_len, lambda: mapped.to_trace(),
                   lambda: spin_dsa.score_trace(mapped)):
        raises(spin_dsa.DataLoss, "shrank", access)
    # Replaced by rename: the reader keeps what it opened.
    other = tmp_path / "other.safetensors"
    spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=300, steps=2, layers=1, seed=9).write(str(other))
    path.write_bytes(open(small_trace_path, "rb").read())
    again = spin_dsa.open_trace(str(path), copy_below_bytes=0)
    os.replace(other, path)
    np.testing.assert_array_equal(again.k(1), k_before)


# --- Memory refused up front, in GiB ---------------------------------------------------------------

def test_memory_refused_before_allocating():
    raises(spin_dsa.ResourceExhausted, "GiB", spin_dsa.Serving, 1 << 20, 1024, 1 << 31)
    raises(spin_dsa.ResourceExhausted, "GiB", spin_dsa.Serving, 65536, 61, 131072 * 64)
    raises(spin_dsa.ResourceExhausted, "GiB trace", spin_dsa.generate_workload, "doc-qa-10k", layers=100000)
    cache, table, ctx, q, w = kernel_inputs(next_n=4)
    batch = 256  # 1024 rows × 2^31 columns: 8 TiB of logits
    raises(spin_dsa.ResourceExhausted, "GiB", spin_dsa.indexer_scores, cache, np.repeat(table, batch, 0),
           np.repeat(ctx, batch), np.repeat(q, batch, 0), np.repeat(w, batch, 0), logits_cols=(1 << 31) - 1)
    raises(spin_dsa.ResourceExhausted, "GiB", spin_dsa.topk, np.zeros((1 << 20, 1), np.float32), (1 << 31) - 1)


# --- Wrong results and leaked memory ---------------------------------------------------------------

def test_no_silent_misread(tmp_path, small_trace_path):
    s = serving()
    strided = s.select(np.arange(4, dtype=np.int32)[::2], 0, [900, 500]).copy()
    s2 = serving()
    plain = s2.select(np.array([0, 2], np.int32), 0, [900, 500]).copy()
    np.testing.assert_array_equal(strided, plain)  # slots [0, 2], not [0, 1]
    # keep_topk with open_loop: every row written (the all-keep top-k), nothing uninitialised.
    scored = spin_dsa.score_trace(small_trace_path)
    a = spin_dsa.replay(scored, "spin", open_loop=True, keep_topk=True)["topk"]
    b = spin_dsa.replay(scored, "prev-iter", open_loop=True, keep_topk=True)["topk"]
    r = spin_dsa.open_trace(small_trace_path)
    for layer in range(2):
        np.testing.assert_array_equal(a[layer], b[layer])
        visible = np.array([r.visible_entries(st, 0) for st in range(r.steps)])
        assert ((a[layer] >= -1) & (a[layer] < visible[:, None])).all()
    # A score trace has no keys: k / w refuse instead of returning garbage.
    p = tmp_path / "scores.safetensors"
    spin_dsa.write_score_trace({"next_n": 1, "page_size": 16, "topk": 8, "compress_ratio": 1},
                               np.array([40, 41], np.int64), [np.zeros((2, 1, 41), np.float32)], str(p))
    st = spin_dsa.open_trace(str(p))
    for name in ("k", "k_scale", "q", "w"):
        raises(spin_dsa.FailedPrecondition, "score trace", getattr(st, name), 0)
    # ... and replays as recorded (its scores the truth), by path or reader, while a predictor
    # that needs keys is refused in one line.
    for source in (str(p), st):
        assert spin_dsa.replay(spin_dsa.score_trace(source), "spin")["prefill_steps"] == 1
    raises(spin_dsa.FailedPrecondition, "hisa", spin_dsa.replay, spin_dsa.score_trace(st), "hisa")
    # Integer wrap and float truncation.
    s3 = serving()
    raises(spin_dsa.OutOfRange, r"slots\[0\] = 4294967296", s3.select, [2 ** 32], 0, [500])
    raises(spin_dsa.InvalidType, "integers", s3.select, [1000.9], 0, [500])
    raises(spin_dsa.OutOfRange, "slot", s3.add, 2 ** 32, 1)
    # A length past int32: a stride-0 view of 2^32 + 1 rows is refused, not run as 1 row.
    huge = np.broadcast_to(np.float32(0), (2 ** 32 + 1, 4))
    raises(spin_dsa.InvalidType, "C-contiguous", spin_dsa.topk, huge, 2)
    raises(spin_dsa.InvalidArgument, "2\\^31", s3.select, np.broadcast_to(np.int32(0), (2 ** 32 + 1,)), 0, [1])
    # A NUL inside a path is refused, nothing is written.
    t = spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=300, steps=2, layers=1, seed=2)
    raises(spin_dsa.InvalidArgument, "NUL", t.write, str(tmp_path / "a.st\x00.bak"))
    assert not (tmp_path / "a.st").exists()
    raises(spin_dsa.InvalidArgument, "NUL", spin_dsa.open_trace, small_trace_path + "\x00x")


# --- Foreign exception types -------------------------------------------------------------------------

def test_errors_are_the_library_classes(tmp_path):
    bad = tmp_path / "utf8.safetensors"
    header = b'{"__metadata__": {"format": "spin-trace", "model": "\xff\xfe"}}'
    bad.write_bytes(len(header).to_bytes(8, "little") + header)
    with pytest.raises(spin_dsa.SpinError) as info:
        spin_dsa.open_trace(str(bad))
    assert not isinstance(info.value, UnicodeError)
    cache, table, ctx, q, w = kernel_inputs()
    raises(spin_dsa.InvalidArgument, "context_lens", spin_dsa.indexer_scores, cache, table, [1 << 50], q, w)
    raises(spin_dsa.InvalidArgument, "logits_cols", spin_dsa.indexer_scores, cache, table, ctx, q, w,
           logits_cols=1 << 40)
    raises(spin_dsa.InvalidType, "scores: expected a numpy array", spin_dsa.topk, [[1.0, 2.0]], 1)
    raises(spin_dsa.InvalidType, "q: expected a numpy array", spin_dsa.indexer_scores, cache, table, ctx, q.tolist(), w)
    raises(spin_dsa.InvalidType, "layers\\[0\\]", spin_dsa.make_trace, {"next_n": 1}, [5], [[1, 2]])
    raises(spin_dsa.InvalidType, "sparsities", spin_dsa.diagnose, sparsities=["x"])
    # The two valid calls the issue found refused.
    assert spin_dsa.check_config(None) == spin_dsa.default_config()
    assert spin_dsa.budget_blocks(config=None, n_blocks=10) >= 1
    # InvalidType is both a TypeError (as before) and a SpinError.
    assert issubclass(spin_dsa.InvalidType, TypeError) and issubclass(spin_dsa.InvalidType, spin_dsa.InvalidArgument)


# --- Silently accepted before -----------------------------------------------------------------------

def test_formerly_accepted_inputs_refused():
    s = serving()
    for bad in (np.array([0.0, 1.0]), np.array([True, False]), np.array(["0", "1"]), ["0", "1"], [None, 1]):
        raises(spin_dsa.InvalidType, "slots", s.select, bad, 0, [500, 500])
        raises(spin_dsa.InvalidType, "seq_lens", s.select, [0, 1], 0, bad)
    raises(spin_dsa.InvalidArgument, "n_blocks", spin_dsa.budget_blocks, None, -1)
    raises(spin_dsa.InvalidArgument, "max_blocks", spin_dsa._core.selection_tables, None, -1)
    raises(spin_dsa.InvalidArgument, "max_blocks", spin_dsa._core.selection_tables, None, (1 << 31) + 1)
    raises(spin_dsa.InvalidArgument, "target_sparsity", spin_dsa._core.selection_tables,
           {"target_sparsity": 1.0}, 4)
    raises(spin_dsa.InvalidType, "C-contiguous", spin_dsa.topk, np.broadcast_to(np.float32(0), (3, 1 << 40)), 2)
    # Block ids out of range or past the scored columns.
    cache, table, ctx, q, w = kernel_inputs()
    raises(spin_dsa.OutOfRange, "block", spin_dsa.indexer_scores, cache, table, ctx, q, w,
           block_ids=[9], block_offsets=[0, 1])
    raises(spin_dsa.OutOfRange, "block_ids", spin_dsa.topk, np.zeros((1, 128), np.float32), 2,
           block_ids=[5], block_offsets=[0, 1], block_entries=64)
    raises(spin_dsa.OutOfRange, "block_ids", spin_dsa.topk, np.zeros((1, 128), np.float32), 2,
           block_ids=[-1], block_offsets=[0, 1], block_entries=64)
    p = spin_dsa.make_predictor("spin", CFG, num_layers=1)
    p.select(0, 0, 100)
    raises(spin_dsa.OutOfRange, "scored_blocks", p.observe, 0, 0, np.zeros(100, np.float32), scored_blocks=[0, 7])
    raises(spin_dsa.OutOfRange, "topk", p.observe, 0, 0, np.zeros(100, np.float32), topk=np.full(32, 100, np.int32))


# --- The serving object refuses misuse in one line --------------------------------------------------

def test_serving_refuses_misuse():
    s = serving()
    s.select([0, 1], 0, [500, 600])
    logits = np.zeros((2, 2048), np.float32)
    raises(spin_dsa.InvalidArgument, "same order", s.observe, [1, 0], 0, logits)  # other order
    raises(spin_dsa.InvalidArgument, "same order", s.observe, [0], 0, logits[:1])  # fewer slots
    raises(spin_dsa.FailedPrecondition, "must follow select", s.observe, [2, 3], 0, logits)  # other slots
    s.observe([0, 1], 0, logits)
    assert s.counts(2).shape == (2,)
    raises(spin_dsa.InvalidArgument, "rows the last select wrote", s.counts, 3)  # stale rows
    s.drop(3)
    raises(spin_dsa.FailedPrecondition, "free", s.select, [3], 0, [500])  # a slot not active
    # MTP: rows must be batch · next_n.
    s2 = serving()
    s2.select([0, 1], 0, [500, 600], next_n=2)
    raises(spin_dsa.InvalidArgument, "2 · 2 = 4 rows", s2.observe, [0, 1], 0, np.zeros((2, 2048), np.float32))
    # Two calls at once: a second (here re-entrant, from argument conversion) call raises.
    s3 = serving()
    seen = []

    class Sneaky:  # an array (DLPack) whose export calls back into the object
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kw):
            try:
                s3.select([1], 0, [500])
            except spin_dsa.FailedPrecondition as e:
                seen.append(str(e))
            return self.a.__dlpack__(*args, **kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    s3.select([0], 0, [500])
    s3.observe([0], 0, Sneaky(np.zeros((1, 2048), np.float32)))
    assert seen and "another call" in seen[0]
    s3.commit([0])  # the object is usable after it


def test_predictor_refuses_a_second_call_at_once():
    p = spin_dsa.make_predictor("spin", CFG, num_layers=1)
    seen = []

    class Sneaky:  # scores (DLPack) whose export calls back into the predictor
        def __init__(self, a):
            self.a = a

        def __dlpack__(self, *args, **kw):
            try:
                p.select(0, 1, 100)
            except spin_dsa.FailedPrecondition as e:
                seen.append(str(e))
            return self.a.__dlpack__(*args, **kw)

        def __dlpack_device__(self):
            return self.a.__dlpack_device__()

    p.select(0, 0, 100)
    p.observe(0, 0, Sneaky(np.zeros(100, np.float32)))
    assert seen and "Predictor.select: another call" in seen[0]
    p.commit(0)


def test_concurrent_threads_never_crash():
    """Threads hammering one object: each call either works or raises FailedPrecondition."""
    s = serving()
    errors = []

    def worker(slot):
        for _ in range(200):
            try:
                s.select([slot], 0, [500])
                s.observe([slot], 0, np.zeros((1, 2048), np.float32))
                s.select([slot], 1, [500])
                s.observe([slot], 1, np.zeros((1, 2048), np.float32))
                s.commit([slot])
            except spin_dsa.FailedPrecondition:
                pass
            except Exception as e:  # noqa: BLE001 — anything else is the bug this test looks for
                errors.append(e)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[:3]


# --- Index arrays: what is copied, and that the copy reads right ------------------------------------

def test_index_arrays_any_integer_kind_same_result():
    ref = serving().select(np.array([0, 3], np.int32), 0, np.array([700, 900], np.int64)).copy()
    for slots, seq in (([0, 3], [700, 900]), ((0, 3), (700, 900)),
                       (np.array([0, 3], np.int16), np.array([700, 900], np.uint32)),
                       (np.array([[0, 9], [3, 9]], np.int64)[:, 0], np.array([700, 0, 900], np.int64)[::2])):
        np.testing.assert_array_equal(serving().select(slots, 0, seq), ref)
    raises(spin_dsa.InvalidArgument, "seq_lens", serving().select, [0], 0, np.array([2 ** 63 + 1], np.uint64))


def test_predictor_index_arrays_read_in_order():
    """Predictor.observe's scored_blocks and select's visible_entries: any strides, same result."""
    def run(scored, visible):
        p = spin_dsa.make_predictor("spin", CFG, num_layers=1, request_id=3)
        blocks = p.select(0, 0, 200, visible_entries=visible)
        scores = np.linspace(0, 1, 200).astype(np.float32)
        p.observe(0, 0, scores, scored_blocks=scored)
        p.commit(0)
        return blocks, p.select(0, 1, 201)

    ref = run(np.arange(13, dtype=np.int32), np.array([200], np.int64))
    got = run(np.arange(12, -1, -1, dtype=np.int32)[::-1], np.array([0, 200], np.int64)[::-1][:1])
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
    got = run(list(range(13)), [200])
    for a, b in zip(ref, got):
        np.testing.assert_array_equal(a, b)
