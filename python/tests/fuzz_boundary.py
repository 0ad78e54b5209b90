"""A seeded random search over spin_dsa's Python boundary.

Every case starts from a valid call of one of the package's functions (or a short sequence of calls
on a Serving / Predictor / TraceReader) and mutates one to three arguments: dtype, strides, shape,
value range, Python kind (list, None, str, object), aliasing, or the order of calls. Each case runs
in its own child process (fork, 8 GiB address-space limit, a clock) and must end in a result or a
spin_dsa.SpinError; a signal, a hang, any other exception, or an output that breaks its contract
(positions out of range, unsorted blocks) is a finding, printed with the command that replays it.

    python python/tests/fuzz_boundary.py --seconds 75 --seed 1     # what scripts/test-python.sh runs
    python python/tests/fuzz_boundary.py --seed 1 --case 417 -v     # replay one case in-process

Exit status 1 when there is a finding. Python's own argument errors for scalars of the wrong type
(nanobind's "incompatible function arguments" TypeError) count as refusals, not findings.
"""
import argparse
import os
import random
import resource
import signal
import sys
import tempfile
import time
import traceback

os.environ.setdefault("OMP_NUM_THREADS", "2")

import warnings  # noqa: E402

import numpy as np  # noqa: E402

import spin_dsa  # noqa: E402

np.seterr(all="ignore")
warnings.filterwarnings("ignore")  # numpy's cast warnings while building hostile values

CFG = {"page_size": 16, "topk": 32, "target_sparsity": 0.5, "explore_ratio": 0.2}
CASE_SECONDS = 60  # the clock; a valid 2^31-entry select alone takes ~20 s under load
# open_trace(copy_below_bytes=) is newer than some builds; without it (an older build, for a before/after
# count) every trace is opened the old way.
MAP_CHOICE = "copy_below_bytes" in (spin_dsa.open_trace.__doc__ or "")
ADDRESS_SPACE = 8 << 30


class Finding(Exception):
    """An output that breaks its documented contract."""


class Notes(list):
    """What a case did, step by step; printed as it happens when replaying (-v), so a case that
    kills the process still shows how far it got."""
    verbose = False

    def __init__(self, items=()):
        super().__init__()
        for item in items:
            self.append(item)

    def append(self, text):
        if Notes.verbose:
            print(f"  {text}", flush=True)
        super().append(text)


# --- argument mutations ----------------------------------------------------------------------------

INT_DTYPES = [np.int8, np.int16, np.int32, np.int64, np.uint8, np.uint16, np.uint32, np.uint64]
OTHER_DTYPES = [np.float16, np.float32, np.float64, np.bool_, np.complex64, object, "U3"]
HUGE = [-1, -2 ** 31, 2 ** 31 - 1, 2 ** 31, 2 ** 32, 2 ** 32 + 1, 2 ** 63 - 1, -2 ** 63]


def mutate_array(rng, a, label):
    """A variant of array `a` (any dtype) and a description of it."""
    try:
        a = np.asarray(a)
    except ValueError:  # already mutated into a ragged list
        return a, label
    if a.size > 1 << 20:  # already a stride-0 view of huge apparent size: leave it
        return a, label
    kind = rng.choice(["dtype", "other_dtype", "reverse", "step", "stride0", "fortran", "list", "scalar",
                       "none", "extra_dim", "shorter", "longer", "empty", "value", "readonly", "str", "nested"])
    if kind == "dtype" and a.dtype.kind in "iu":
        d = rng.choice(INT_DTYPES)
        return a.astype(d), f"{label}.astype({np.dtype(d).name})"
    if kind in ("dtype", "other_dtype"):
        d = rng.choice(OTHER_DTYPES + INT_DTYPES)
        try:
            return a.astype(d), f"{label}.astype({d!r})"
        except (TypeError, ValueError):
            return a, label
    if kind == "reverse" and a.ndim >= 1:
        # Same values, negative stride: a correct reader sees what the caller sees.
        return np.flip(np.flip(a, 0).copy(), 0), f"{label} with a negative stride"
    if kind == "step" and a.ndim >= 1:
        wide = np.repeat(a, 2, axis=0)
        return wide[::2], f"{label} as a [::2] view"
    if kind == "stride0":
        shape = (rng.choice([2, 2 ** 31, 2 ** 32 + 1, 2 ** 40]),) + a.shape[1:]
        flat = a.reshape(-1)[:1] if a.size else np.zeros(1, a.dtype)
        return np.broadcast_to(flat.reshape((1,) * max(a.ndim, 1)), shape if a.ndim else shape[:1]), \
            f"np.broadcast_to({label}[:1], {shape})"
    if kind == "fortran" and a.ndim >= 2:
        return np.asfortranarray(a), f"np.asfortranarray({label})"
    if kind == "list":
        return a.tolist(), f"{label}.tolist()"
    if kind == "scalar":
        return rng.choice([0, 1, -1, 1.5, 2 ** 40]), f"a scalar for {label}"
    if kind == "none":
        return None, f"None for {label}"
    if kind == "extra_dim":
        return a[None], f"{label}[None]"
    if kind == "shorter" and a.ndim >= 1 and a.shape[0] > 0:
        return a[:-1].copy(), f"{label}[:-1]"
    if kind == "longer" and a.ndim >= 1:
        return np.concatenate([a, a[:1]]) if a.shape[0] else np.zeros((1,) + a.shape[1:], a.dtype), f"{label} + 1 row"
    if kind == "empty":
        return a[:0].copy() if a.ndim else np.zeros(0, a.dtype), f"{label}[:0]"
    if kind == "value" and a.size and a.dtype.kind in "iuf":
        b = a.astype(np.int64 if a.dtype.kind in "iu" else a.dtype).copy()
        v = rng.choice(HUGE + [np.nan, np.inf] if a.dtype.kind == "f" else HUGE)
        try:
            b.reshape(-1)[rng.randrange(b.size)] = v
        except (OverflowError, ValueError):
            return a, label
        return b, f"{label} with one element = {v}"
    if kind == "readonly":
        b = a.copy()
        b.flags.writeable = False
        return b, f"{label} read-only"
    if kind == "str":
        return "0,1", f"a str for {label}"
    if kind == "nested":
        return [a.tolist(), [1]], f"a ragged list for {label}"
    return a, label


def mutate_scalar(rng, value, label):
    v = rng.choice([0, 1, -1, 2, 7, 64, 100000, 2 ** 31, 2 ** 32, 2 ** 63 - 1, -2 ** 63, 2 ** 64, 1.5, True,
                    None, "1", float("nan")] + ([value * 2, value + 1] if isinstance(value, int) else []))
    return v, f"{label}={v!r}"


# --- targets: a valid call, and which of its arguments may change --------------------------------

def kernel_call(rng):
    ctx = rng.choice([1, 63, 64, 65, 200, 640])
    next_n, heads, page = rng.choice([1, 2]), rng.choice([1, 4]), 64
    batch = rng.choice([1, 2, 3])
    pages = -(-(ctx + 1) // page) + 1
    gen = np.random.default_rng(rng.randrange(1 << 30))
    cache = np.zeros((pages * batch, page * 132), np.uint8)
    cache[:, :page * 128] = gen.integers(0, 0x70, (pages * batch, page * 128), dtype=np.uint8)
    cache[:, page * 128:] = np.ones(pages * batch * page, np.float32).view(np.uint8).reshape(pages * batch, -1)
    table = np.arange(pages * batch, dtype=np.int32).reshape(batch, pages)
    args = dict(key_cache=cache, block_table=table, context_lens=np.full(batch, ctx, np.int64),
                q=gen.integers(0, 0x70, (batch, next_n, heads, 128), dtype=np.uint8),
                weights=np.ones((batch, next_n, heads), np.float32))
    if rng.random() < 0.5:
        n_blocks = -(-ctx // page)
        ids = np.concatenate([np.arange(0, n_blocks, 2, dtype=np.int32)] * batch)
        per = len(range(0, n_blocks, 2))
        args.update(block_ids=ids, block_offsets=np.arange(0, per * (batch + 1), per, dtype=np.int32))
    if rng.random() < 0.3:
        args["out"] = np.zeros((batch * next_n, ctx + 5), np.float32)
    arrays = [k for k in args]
    scalars = dict(page_size=64, compress_ratio=1, block_pages=1, logits_cols=-1, impl="auto", threads=0)
    return spin_dsa.indexer_scores, args, arrays, scalars, check_scores


def check_scores(result, args):
    if not isinstance(result, np.ndarray) or result.dtype != np.float32:
        raise Finding(f"indexer_scores returned {type(result)}")
    if np.isnan(result).any():
        raise Finding("indexer_scores wrote NaN")


def topk_call(rng):
    rows, cols = rng.choice([1, 2, 4]), rng.choice([0, 1, 5, 64, 200])
    gen = np.random.default_rng(rng.randrange(1 << 30))
    args = dict(scores=gen.standard_normal((rows, cols)).astype(np.float32))
    if rng.random() < 0.4:
        args["visible_entries"] = gen.integers(0, cols + 1, rows).astype(np.int64)
    if rng.random() < 0.4 and cols:
        n_blocks = -(-cols // 16)
        ids = np.arange(0, n_blocks, 2, dtype=np.int32)
        args.update(block_ids=np.tile(ids, rows), block_offsets=np.arange(rows + 1, dtype=np.int32) * len(ids),
                    block_entries=16)
    if rng.random() < 0.3:
        args["out"] = np.full((rows, 9), 7, np.int32)
    scalars = dict(k=rng.choice([1, 3, 8]), rows_per_mask=1, threads=0)
    arrays = [k for k in args if k != "block_entries"]
    return spin_dsa.topk, args, arrays, scalars, check_topk


def check_topk(result, args):
    scores, k = args.get("scores"), args.get("k")
    cols = scores.shape[1] if isinstance(scores, np.ndarray) and scores.ndim == 2 else None
    result = result[:, :k]  # `out` may be wider: the kernel writes its first k columns
    if cols is not None and ((result < -1) | (result >= max(cols, 1))).any():
        raise Finding(f"topk positions outside [-1, {cols}): {result.min()}..{result.max()}")


def run_call(rng, make, verbose):
    fn, args, arrays, scalars, check = make(rng)
    described = Notes()
    for _ in range(rng.choice([1, 1, 2, 3])):
        if rng.random() < 0.6 and arrays:
            name = rng.choice(arrays)
            if name == "out" and rng.random() < 0.3:  # alias an input
                src = rng.choice([k for k in args if k != "out"])
                args["out"] = args[src] if isinstance(args[src], np.ndarray) else args.get("out")
                described.append(f"out aliasing {src}")
                continue
            args[name], text = mutate_array(rng, args[name], name)
        else:
            name = rng.choice(list(scalars))
            scalars[name], text = mutate_scalar(rng, scalars[name], name)
            if name == "impl" and rng.random() < 0.5:
                scalars[name], text = rng.choice(["bogus", "reference", "portable", ""]), f"impl={scalars[name]!r}"
        described.append(text)
    if verbose:
        print(f"{fn.__name__}: " + "; ".join(described))
    result = fn(**args, **scalars)
    check(result, {**args, **scalars})
    return described


def serving_case(rng, verbose):
    opts = dict(max_requests=rng.choice([1, 3, 4]), num_layers=2, max_entries=rng.choice([100, 2048]),
                predictor=rng.choice(["spin", "spin", "prev-iter", "random"]), config=dict(CFG),
                max_next_n=rng.choice([1, 2, 3]), compress_ratio=rng.choice([1, 1, 4]))
    described = Notes()
    if rng.random() < 0.2:
        key = rng.choice(list(opts))
        opts[key], text = mutate_scalar(rng, opts[key], key) if key != "config" else (
            rng.choice([None, "alpha=2", {"topk": -1}, "nonsense", 5]), "config mutated")
        described.append(text)
    s = spin_dsa.Serving(**opts)
    n = opts["max_requests"]
    for slot in range(n):
        s.add(slot, 7 + slot)
    ops = ["select", "observe", "observe_scored", "commit", "prefill", "drop", "add", "counts"]
    state = {"slots": np.arange(min(n, 2), dtype=np.int32), "next_n": 1}
    for _ in range(rng.randrange(1, 8)):
        op = rng.choice(ops) if rng.random() < 0.5 else ["select", "observe", "commit"][_ % 3]
        described.append(serving_op(rng, s, op, state, opts))
    if verbose:
        print("Serving: " + "; ".join(described))
    return described


def serving_op(rng, s, op, state, opts):
    slots = state["slots"]
    batch = len(slots)
    entries = opts["max_entries"] if isinstance(opts["max_entries"], int) else 100
    width = max(1, entries)
    mutate = rng.random() < 0.5
    if op == "select":
        next_n = rng.choice([1, 2]) if isinstance(opts["max_next_n"], int) and opts["max_next_n"] > 1 else 1
        seq = np.full(batch, min(entries, 90), np.int64)
        args = dict(slots=slots, layer=rng.choice([0, 1]), seq_lens=seq, next_n=next_n)
        if rng.random() < 0.2:
            args["out"] = np.zeros((batch * next_n + 1, s.max_blocks), np.int32)
        text = _mutate_dict(rng, args, ["slots", "seq_lens", "out"], ["layer", "next_n"]) if mutate else "select"
        res = s.select(**args)
        state["next_n"] = args["next_n"] if isinstance(args["next_n"], int) else 1
        valid = res[:batch * state["next_n"]]
        for row in valid:
            live = row[row >= 0]
            if (np.diff(live) <= 0).any() or (live >= s.max_blocks).any() or (row[len(live):] != -1).any():
                raise Finding(f"select wrote a malformed row {row.tolist()}")
        return text
    if op in ("observe", "observe_scored"):
        rows = batch * state["next_n"]
        logits = np.zeros((rows, width), np.float32)
        args = dict(slots=slots, layer=rng.choice([0, 1]))
        args["logits" if op == "observe" else "scored"] = logits
        if rng.random() < 0.3:
            args["topk"] = np.full((rows, 32), -1, np.int32)
        text = _mutate_dict(rng, args, ["slots", "logits", "scored", "topk"], ["layer"]) if mutate else op
        getattr(s, op)(**args)
        return text
    if op == "commit":
        args = dict(slots=slots, accepted=np.zeros(batch, np.int32))
        text = _mutate_dict(rng, args, ["slots", "accepted"], []) if mutate else "commit"
        s.commit(**args)
        return text
    if op == "prefill":
        args = dict(slots=slots, layer=0, seq_lens=np.full(batch, min(entries, 50), np.int64),
                    logits=np.zeros((batch, width), np.float32))
        text = _mutate_dict(rng, args, ["slots", "seq_lens", "logits"], ["layer"]) if mutate else "prefill"
        s.prefill(**args)
        return text
    if op in ("drop", "add"):
        slot, text = mutate_scalar(rng, 0, "slot") if mutate else (rng.randrange(opts["max_requests"]), op)
        s.drop(slot) if op == "drop" else s.add(slot, 99)
        return f"{op}({text})"
    s.counts(rng.choice([0, 1, 5, -1, 2 ** 40]))
    return "counts"


def _mutate_dict(rng, args, arrays, scalars):
    arrays = [a for a in arrays if a in args]
    if arrays and (not scalars or rng.random() < 0.7):
        name = rng.choice(arrays)
        args[name], text = mutate_array(rng, args[name], name)
    else:
        name = rng.choice(scalars)
        args[name], text = mutate_scalar(rng, args[name], name)
    return text


def predictor_case(rng, verbose):
    name = rng.choice(["spin", "prev-iter", "ema-slot", "random", "oracle", "hisa", "spin-hybrid"])
    p = spin_dsa.make_predictor(name, dict(CFG), num_layers=2, request_id=rng.randrange(100))
    described = Notes([name])
    num_entries = rng.choice([0, 10, 100, 500])
    for step in range(rng.randrange(1, 4)):
        next_n = rng.choice([1, 2])
        args = dict(layer=rng.choice([0, 1]), step=step, num_entries=num_entries, next_n=next_n)
        if name == "oracle":
            args["true_topk"] = np.full((next_n, 32), -1, np.int32)
        if rng.random() < 0.3:
            args["visible_entries"] = np.full(next_n, num_entries, np.int64)
        if name in ("hisa", "spin-hybrid") or rng.random() < 0.2:  # the keys and the query
            heads = rng.choice([1, 4])
            args.update(k=np.full((num_entries, 128), 0x38, np.uint8),
                        k_scale=np.ones(num_entries, np.float32),
                        q=np.full((next_n, heads, 128), 0x38, np.uint8),
                        w=np.ones((next_n, heads), np.float32))
        if rng.random() < 0.4:
            described.append(_mutate_dict(rng, args, ["visible_entries", "true_topk", "k", "k_scale", "q", "w"],
                                          ["layer", "step", "num_entries", "next_n"]))
        blocks = p.select(**args)
        if (np.diff(blocks) <= 0).any():
            raise Finding(f"Predictor.select returned unsorted blocks {blocks.tolist()}")
        for row in range(next_n):
            oargs = dict(layer=args["layer"], row=row, scores=np.zeros(max(num_entries, 1), np.float32))
            if rng.random() < 0.3:
                oargs["topk"] = np.full(32, -1, np.int32)
            if rng.random() < 0.3:
                oargs["scored_blocks"] = blocks.copy()
            if rng.random() < 0.4:
                described.append(_mutate_dict(rng, oargs, ["scores", "topk", "scored_blocks"], ["layer", "row"]))
            p.observe(**oargs)
        acc, text = mutate_scalar(rng, 0, "accepted") if rng.random() < 0.2 else (0, "commit")
        described.append(text)
        p.commit(acc)
    if verbose:
        print("Predictor: " + "; ".join(described))
    return described


def trace_case(rng, verbose, files):
    kind = rng.choice(["key", "score", "mtp"])
    src = files[kind]
    path = os.path.join(files["dir"], f"case-{os.getpid()}.safetensors")
    data = open(src, "rb").read()
    described = Notes([kind])
    damage = rng.choice(["none", "none", "truncate", "flip", "utf8", "nul_path", "missing"])
    if damage == "truncate":
        data = data[:rng.randrange(len(data))]
    elif damage == "flip":
        b = bytearray(data)
        for _ in range(rng.randrange(1, 8)):
            b[rng.randrange(min(len(b), 400))] = rng.randrange(256)
        data = bytes(b)
    elif damage == "utf8":
        data = data.replace(b'"model"', b'"mod\xff"', 1)
    described.append(damage)
    open(path, "wb").write(data)
    target = path + "\x00x" if damage == "nul_path" else (path + ".missing" if damage == "missing" else path)
    below = rng.choice([0, 1 << 30])
    r = spin_dsa.open_trace(target, copy_below_bytes=below) if MAP_CHOICE else spin_dsa.open_trace(target)
    if rng.random() < 0.4:  # the file changes under the open reader
        cut = rng.randrange(len(data) + 1)
        with open(path, "r+b") as f:
            f.truncate(cut)
        described.append(f"truncated to {cut} under the reader (mapped={getattr(r, 'mapped', '?')})")
    for _ in range(rng.randrange(1, 6)):
        op = rng.choice(["k", "k_scale", "q", "w", "scores", "entries", "visible_entries", "ctx_len", "accepted",
                         "meta", "describe", "to_trace", "score", "replay", "facts"])
        layer, text = mutate_scalar(rng, 0, "layer") if rng.random() < 0.3 else (rng.choice([0, 1]), "")
        described.append(f"{op} {text}")
        if op in ("k", "k_scale", "q", "w", "scores", "entries"):
            v = getattr(r, op)(layer)
            if isinstance(v, np.ndarray):
                v.sum()  # touch every byte: a lost mapping would fault here
        elif op == "visible_entries":
            r.visible_entries(layer, rng.choice([0, 1, -1, 5]))
        elif op in ("ctx_len", "accepted", "meta"):
            getattr(r, op)
        elif op == "describe":
            r.describe()
        elif op == "to_trace":
            r.to_trace()
        else:
            scored = spin_dsa.score_trace(r, threads=rng.choice([0, 1, 2, 100000]))
            if op == "replay":
                res = spin_dsa.replay(scored, rng.choice(["spin", "prev-iter", "oracle", "bogus"]),
                                      config=rng.choice([None, {"target_sparsity": 0.5}, "alpha=7"]),
                                      open_loop=rng.random() < 0.5, keep_topk=rng.random() < 0.5)
                for layer_topk in res.get("topk", []):
                    if (layer_topk < -1).any():
                        raise Finding("replay keep_topk returned positions below -1")
            elif op == "facts":
                scored.facts(rng.choice([0, 1, 16, 64, -5, 2 ** 31]))
    if verbose:
        print("trace: " + "; ".join(described))
    return described


def misc_case(rng, verbose):
    op = rng.choice(["check_config", "budget_blocks", "visible_entries", "diagnose", "generate_workload",
                     "make_trace", "write_score_trace"])
    described = Notes([op])
    if op == "check_config":
        spin_dsa.check_config(rng.choice([None, {}, {"alpha": 0.3}, {"alpha": "x"}, "topk=0", 7, [1],
                                          {"alpha": float("nan")}, {"\ud800": 1}]))
    elif op == "budget_blocks":
        spin_dsa.budget_blocks(rng.choice([None, dict(CFG), "bad"]), mutate_scalar(rng, 10, "n")[0])
    elif op == "visible_entries":
        ctx, note = mutate_array(rng, np.array([0, 5, 300], np.int64), "context_lens")
        described.append(note)
        spin_dsa.visible_entries(ctx, rng.choice([1, 2, 4, 0, 5, -1]), mutate_scalar(rng, 4, "ratio")[0])
    elif op == "diagnose":
        spin_dsa.diagnose(batch=mutate_scalar(rng, 1, "batch")[0] if rng.random() < 0.5 else 1,
                          next_n=rng.choice([1, 2, 0, 99]), sparsities=rng.choice([None, [0.5], ["x"], 5, [True]]))
    elif op == "generate_workload":
        kw = dict(prompt_tokens=300, steps=2, layers=1, seed=1)
        key = rng.choice(list(kw) + ["next_n", "num_heads", "bogus"])
        kw[key] = rng.choice([0, -1, 10 ** 9, 10 ** 12, 2 ** 40, "x", 1.5, True, None])
        described.append(f"{key}={kw[key]!r}")
        spin_dsa.generate_workload(rng.choice(["doc-qa-10k", None, "nope"]), **kw)
    elif op == "make_trace":
        meta = {"next_n": 1, "num_heads": 2, "page_size": 16, "topk": 8, "compress_ratio": 1, "model": "m"}
        layer = {"k": np.zeros((40, 128), np.uint8), "k_scale": np.ones(40, np.float32),
                 "q": np.zeros((2, 1, 2, 128), np.uint8), "w": np.ones((2, 1, 2), np.float32)}
        ctx = np.array([39, 40], np.int64)
        target = rng.choice(["meta", "ctx", "k", "k_scale", "q", "w", "layers"])
        if target == "meta":
            meta[rng.choice(list(meta))] = rng.choice([None, 2 ** 40, "x", -1, 1.5, True])
        elif target == "ctx":
            ctx, _ = mutate_array(rng, ctx, "ctx_len")
        elif target == "layers":
            layer = rng.choice([None, 5, {"k": 1}, []])
        else:
            layer[target], _ = mutate_array(rng, layer[target], target)
        described.append(target)
        spin_dsa.make_trace(meta, ctx, [layer])
    else:
        scores, text = mutate_array(rng, np.zeros((2, 1, 41), np.float32), "scores")
        described.append(text)
        spin_dsa.write_score_trace({"next_n": 1, "page_size": 16, "topk": 8, "compress_ratio": 1},
                                   np.array([40, 41], np.int64), [scores],
                                   os.path.join(tempfile.gettempdir(), f"fuzz-{os.getpid()}.safetensors"))
    if verbose:
        print("misc: " + "; ".join(described))
    return described


# --- one case, in a child ------------------------------------------------------------------------------

def run_case(seed, case, files, verbose=False):
    """Runs case `case` of `seed`; returns None or a finding (str). Raises nothing."""
    rng = random.Random(seed * 1_000_003 + case)
    Notes.verbose = verbose
    family = rng.choice(["indexer", "topk", "serving", "serving", "predictor", "trace", "trace", "misc"])
    try:
        if family == "indexer":
            run_call(rng, kernel_call, verbose)
        elif family == "topk":
            run_call(rng, topk_call, verbose)
        elif family == "serving":
            serving_case(rng, verbose)
        elif family == "predictor":
            predictor_case(rng, verbose)
        elif family == "trace":
            trace_case(rng, verbose, files)
        else:
            misc_case(rng, verbose)
    except spin_dsa.SpinError as e:
        msg = str(e)
        if not msg or "\n" in msg:
            return f"{family}: {type(e).__name__} without a one-line message: {msg!r}"
        if verbose:
            print(f"  -> {type(e).__name__}: {msg}")
    except TypeError as e:
        if "incompatible function arguments" not in str(e) and "unexpected keyword" not in str(e) \
                and "positional argument" not in str(e):
            return f"{family}: foreign TypeError: {e}"
        if verbose:
            print(f"  -> TypeError (Python's argument check): {str(e).splitlines()[0]}")
    except Finding as e:
        return f"{family}: {e}"
    except Exception as e:  # noqa: BLE001 — every other class is what the search looks for
        return f"{family}: foreign {type(e).__module__}.{type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    return None


def child(seed, case, files, pipe_w):
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_SPACE, ADDRESS_SPACE))
    finding = run_case(seed, case, files)
    os.write(pipe_w, (finding or "").encode("utf-8", "replace")[:4000])
    os._exit(0)


def run_forked(seed, case, files):
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(r)
        try:
            child(seed, case, files, w)
        finally:
            os._exit(70)
    os.close(w)
    deadline = time.monotonic() + CASE_SECONDS
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.monotonic() > deadline:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            os.close(r)
            return f"hang: no result in {CASE_SECONDS} s"
        time.sleep(0.002)
    text = b""
    while chunk := os.read(r, 4096):
        text += chunk
    os.close(r)
    if os.WIFSIGNALED(status):
        return f"signal {signal.Signals(os.WTERMSIG(status)).name}"
    if os.WEXITSTATUS(status) != 0:
        return f"exit status {os.WEXITSTATUS(status)}"
    return text.decode() or None


def make_files(directory):
    """Fixture traces, written by a child so that this process never starts OpenMP before forking."""
    files = {"dir": directory, "key": os.path.join(directory, "key.safetensors"),
             "score": os.path.join(directory, "score.safetensors"), "mtp": os.path.join(directory, "mtp.safetensors")}
    pid = os.fork()
    if pid == 0:
        try:
            spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=400, steps=3, layers=2, seed=4).write(files["key"])
            spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=300, steps=3, layers=1, next_n=2,
                                       seed=5).write(files["mtp"])
            spin_dsa.write_score_trace({"next_n": 1, "page_size": 16, "topk": 8, "compress_ratio": 1},
                                       np.array([40, 41, 42], np.int64),
                                       [np.random.default_rng(1).standard_normal((3, 1, 42)).astype(np.float32)] * 2,
                                       files["score"])
        finally:
            os._exit(0)
    os.waitpid(pid, 0)
    return files


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--seconds", type=float, default=75)
    ap.add_argument("--case", type=int, default=None, help="replay one case in this process")
    ap.add_argument("-v", "--verbose", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="spin-fuzz-") as d:
        files = make_files(d)
        if a.case is not None:
            finding = run_case(a.seed, a.case, files, verbose=True)
            print(finding or "no finding")
            return 1 if finding else 0
        start, case, findings, slowest = time.monotonic(), 0, [], (0.0, -1)
        while time.monotonic() - start < a.seconds:
            t0 = time.monotonic()
            finding = run_forked(a.seed, case, files)
            slowest = max(slowest, (time.monotonic() - t0, case))
            if finding:
                findings.append((case, finding))
                print(f"FINDING case {case}: {finding}\n  reproduce: python python/tests/fuzz_boundary.py "
                      f"--seed {a.seed} --case {case} -v", flush=True)
            case += 1
        print(f"spin fuzz_boundary: seed {a.seed}, {case} cases in {time.monotonic() - start:.0f} s, "
              f"{len(findings)} findings (slowest: case {slowest[1]}, {slowest[0]:.1f} s)")
        return 1 if findings else 0


if __name__ == "__main__":
    sys.exit(main())
