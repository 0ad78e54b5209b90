#!/usr/bin/env python3
"""spin's decode indexer layer on a GPU, in one prepared run: does spin make the indexer's share
of a decode step faster, by how much, and is it still exact? (bench/gpu/README.md)

    bench/gpu/device-run.sh                          # on the GPU machine: installs what .whl/ carries, runs this
    python bench/gpu/run.py --out gpu.json           # the run: probe, checks, verdict case, grid as time allows
    python bench/gpu/run.py --grid --out grid.json   # the fuller grid (contexts × batches × sparsities × next_n)
    python bench/gpu/run.py --cpu-smoke --out s.json # the same code, tiny shapes, CPU, TRITON_INTERPRET=1

Stages, each recorded in the JSON (written atomically after each, so a run cut short keeps what it
measured): the probe; the exactness checks (exact.py); the verdict case — batch 64, context 128K,
sparsity 0.5, next_n 1, DeepSeek-V3.2's indexer geometry (chain.py); the verdict (PASS/FAIL per
goal); then further cases while the time budget lasts; the logits kernel's launch-shape sweep.
Exit status 1 when an exactness check fails, else 0 (a missed speed goal is a finding, in the
verdict, not an error of the run).
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import pathlib
import platform
import subprocess
import sys
import time
import traceback
import types

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))

from chain import HEADS, DIM, PAGE, TOPK, MODEL_LAYERS, DeepGemm, Timer, make_inputs, measure_case  # noqa: E402
from exact import check_deepgemm_logits, check_logits, check_selections  # noqa: E402

PEAK_TBS = {"H200": 4.8, "H100 SXM": 3.35, "H100 80GB HBM3": 3.35, "H800": 3.35, "B200": 8.0}
GOALS = {"chain_speedup": 1.6, "spin_own_share": 0.05, "dense_logits_hbm_fraction": 0.60}
VERDICT_CASE = (131072, 64, 0.5, 1)               # (context, batch, sparsity, next_n)
# After the verdict case, as time allows: smaller batches, other sparsities, MTP, 512K (batch 1:
# adapt's observe measures row 0 in one program per request, its longest serial part).
MORE_CASES = [(131072, 8, 0.5, 1), (131072, 64, 0.5, 2), (131072, 1, 0.5, 1), (524288, 1, 0.5, 1),
              (131072, 64, 0.3, 1), (131072, 64, 0.7, 1), (524288, 8, 0.5, 1), (524288, 64, 0.5, 1),
              (65536, 64, 0.5, 1)]
SELECTION_STEPS = 24                              # ≥ 20 graph replays after the first (eager) step


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", help="write the results as JSON here (atomically)")
    p.add_argument("--cpu-smoke", "--small", dest="smoke", action="store_true",
                   help="tiny shapes on the CPU under the Triton interpreter (keeps the script from rotting)")
    p.add_argument("--grid", action="store_true",
                   help="the fuller grid: --contexts × --batches × --sparsities × --next-ns")
    p.add_argument("--contexts", default="65536,131072,524288")
    p.add_argument("--batches", default="1,8,64")
    p.add_argument("--sparsities", default="0.3,0.5,0.7")
    p.add_argument("--next-ns", default="1,2")
    p.add_argument("--budget-s", type=float, default=330,
                   help="start no further case (or the sweep) after this many seconds of the run")
    p.add_argument("--replays", type=int, default=20, help="graph replays per timing")
    p.add_argument("--max-layers", type=int, default=61, help="layers per graph at most (V3.2: 61)")
    p.add_argument("--no-deepgemm", action="store_true")
    p.add_argument("--no-serving", action="store_true", help="random blocks instead of spin_dsa.device.Serving")
    p.add_argument("--no-sweep", action="store_true", help="skip the logits kernel's launch-shape sweep")
    p.add_argument("--render", metavar="JSON", help="print a saved run's table (markdown) and verdict; run nothing")
    p.add_argument("--sweep-only", type=int, metavar="NEXT_N",
                   help="only the logits kernel's launch-shape sweep, at this next_n (after the probe)")
    return p.parse_args(argv)


# ------------------------------------------------------------------------------------------------
# Probe and modules
# ------------------------------------------------------------------------------------------------

def command_line(cmd):
    """First line of a command's output, or why it could not run."""
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=20)
        lines = (r.stdout or r.stderr).strip().splitlines()
        return lines[-1] if cmd[0] == "nvcc" and lines else (lines[0] if lines else f"exit {r.returncode}")
    except Exception as e:  # noqa: BLE001
        return f"unavailable: {type(e).__name__}"


def probe(torch, device):
    """What the run ran on: printed first and kept in the JSON."""
    import triton
    p = {"python": platform.python_version(), "torch": torch.__version__, "triton": triton.__version__,
         "torch_cuda": torch.version.cuda, "cpu": platform.processor() or platform.machine(),
         "nvcc": command_line(["nvcc", "--version"]),
         "driver": command_line(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"])}
    try:
        with open("/proc/cpuinfo") as f:
            p["cpu"] = next((ln.split(":", 1)[1].strip() for ln in f if ln.startswith("model name")), p["cpu"])
    except OSError:
        pass
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        free, total = torch.cuda.mem_get_info(device)
        p.update({"device": props.name, "capability": f"{props.major}.{props.minor}",
                  "sms": props.multi_processor_count, "l2_bytes": props.L2_cache_size,
                  "memory_free_gib": free / 2**30, "memory_total_gib": total / 2**30})
    else:
        p.update({"device": "cpu (Triton interpreter)", "driver": "-"})
    return p


def load_device():
    """(paging, logits, Serving or None, how). spin_dsa.device needs the compiled _core; without it
    the paging and logits modules (torch + Triton only) load from python/spin_dsa/device/ as a
    stand-alone package (its __init__, which imports Serving, skipped)."""
    try:
        from spin_dsa.device import _logits, _paging
        try:
            from spin_dsa.device import Serving
            import spin_dsa
            return _paging, _logits, Serving, f"spin_dsa.device from {pathlib.Path(spin_dsa.__file__).parent}"
        except ImportError as e:
            return _paging, _logits, None, f"spin_dsa.device.Serving not importable: {e}"
    except ImportError as e:
        why = str(e)
    pkg = types.ModuleType("spin_device_standalone")
    pkg.__path__ = [str(REPO / "python" / "spin_dsa" / "device")]
    sys.modules[pkg.__name__] = pkg
    paging = importlib.import_module(pkg.__name__ + "._paging")
    logits = importlib.import_module(pkg.__name__ + "._logits")
    return paging, logits, None, f"stand-alone modules from the checkout (spin_dsa: {why})"


def hbm_peak(torch, device):
    """(bytes/s, source): the datasheet for known parts, else a measured device-to-device copy."""
    if device.type != "cuda":
        return None, "cpu"
    name = torch.cuda.get_device_name(device)
    for key, tbs in PEAK_TBS.items():
        if key in name:
            return tbs * 1e12, f"datasheet ({key})"
    a = torch.empty(1 << 30, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    b.copy_(a)
    torch.cuda.synchronize()
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    e0.record()
    for _ in range(10):
        b.copy_(a)
    e1.record()
    e1.synchronize()
    return 2 * a.numel() * 10 / (e0.elapsed_time(e1) * 1e-3), "measured device-to-device copy"


# ------------------------------------------------------------------------------------------------
# Verdict
# ------------------------------------------------------------------------------------------------

def verdict(row, checks):
    """PASS/FAIL per goal at the verdict case (the row given); the chain by DeepGEMM's logits where they ran, else
    by spin's Triton kernel (named). A goal that could not be measured is "not measured"."""
    kern = "deepgemm" if row.get("chain_speedup_deepgemm") is not None else "triton"
    got = {"chain_speedup": row.get(f"chain_speedup_{kern}"),
           "spin_own_share": row.get(f"spin_own_share_{kern}"),
           "dense_logits_hbm_fraction": row.get("dense_logits_triton_hbm_fraction")}
    v = {"case": {x: row[x] for x in ("context", "batch", "sparsity", "next_n")}, "logits_kernel": kern,
         "selector": row.get("selector")}
    for goal, bar in GOALS.items():
        x = got[goal]
        ok = None if x is None else (x >= bar if goal != "spin_own_share" else x <= bar)
        v[goal] = {"value": x, "goal": ("≥ " if goal != "spin_own_share" else "≤ ") + str(bar),
                   "result": "not measured" if ok is None else ("PASS" if ok else "FAIL")}
    exact = [c.get("ok") for c in checks.values() if isinstance(c, dict) and "ok" in c]
    v["exact"] = "PASS" if exact and all(exact) else "FAIL"
    return v


def verdict_line(v):
    def part(goal, fmt):
        g = v[goal]
        val = "-" if g["value"] is None else format(g["value"], fmt)
        return f"{goal} {val} (goal {g['goal']}) {g['result']}"
    c = v["case"]
    return (f"VERDICT batch {c['batch']}, {c['context'] // 1024}K, sparsity {c['sparsity']}, next_n {c['next_n']} "
            f"[{v['logits_kernel']} logits]: " + "; ".join([part("chain_speedup", ".2f"),
                                                            part("spin_own_share", ".3f"),
                                                            part("dense_logits_hbm_fraction", ".2f")])
            + f"; exact {v['exact']}")


# ------------------------------------------------------------------------------------------------
# Table
# ------------------------------------------------------------------------------------------------

COLUMNS = [("ctx", "context", "{:>7}"), ("B", "batch", "{:>3}"), ("s", "sparsity", "{:>4.1f}"),
           ("nn", "next_n", "{:>2}"), ("dense µs", "dense_chain_triton_us", "{:>9.1f}"),
           ("spin µs", "spin_chain_triton_us", "{:>9.1f}"), ("×", "chain_speedup_triton", "{:>5.2f}"),
           ("own %", "spin_own_share_triton", "{:>5.1%}"), ("HBM% d", "dense_logits_triton_hbm_fraction", "{:>6.0%}"),
           ("plan µs/L", "plan_us_per_layer", "{:>9.1f}"), ("DG dense", "dense_chain_deepgemm_us", "{:>8.1f}"),
           ("DG spin", "spin_chain_deepgemm_us", "{:>8.1f}"), ("DG ×", "chain_speedup_deepgemm", "{:>5.2f}"),
           ("DG own %", "spin_own_share_deepgemm", "{:>8.1%}"), ("ideal", "ideal_speedup", "{:>5.2f}")]


def table(rows):
    head = " ".join(f"{h:>{len(fmt.format(0) if 'f' in fmt or '%' in fmt else fmt.format(0))}}"
                    for h, _, fmt in COLUMNS)
    lines = [head, "-" * len(head)]
    for r in rows:
        if "skipped" in r or "failed" in r:
            lines.append(f"{r['context']:>7} {r['batch']:>3} {r['sparsity']:>4.1f} {r['next_n']:>2}  "
                         f"{r.get('skipped') or r.get('failed')}")
            continue
        cells = []
        for _, key, fmt in COLUMNS:
            x = r.get(key)
            width = len(fmt.format(0)) if x is None else None
            cells.append("-".rjust(width) if x is None else fmt.format(x))
        lines.append(" ".join(cells))
    return "\n".join(lines)


def markdown(rows):
    """The table for docs/results.md (columns no row measured left out, e.g. DeepGEMM's)."""
    rows = [r for r in rows if "skipped" not in r and "failed" not in r]
    cols = [c for c in COLUMNS if any(r.get(c[1]) is not None for r in rows)]
    lines = ["| " + " | ".join(h for h, _, _ in cols) + " |", "|" + "---|" * len(cols)]
    for r in rows:
        lines.append("| " + " | ".join("-" if r.get(k) is None else fmt.format(r[k]).strip()
                                       for _, k, fmt in cols) + " |")
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------
# The run
# ------------------------------------------------------------------------------------------------

def save(path, result):
    if path:
        tmp = pathlib.Path(str(path) + ".tmp")
        tmp.write_text(json.dumps(result, indent=1, default=str))
        os.replace(tmp, path)


def stage(result, name, fn, *args, **kwargs):
    """Runs fn, records its value under result[name] or its failure, never raises."""
    t0 = time.time()
    try:
        value = fn(*args, **kwargs)
    except Exception as e:  # noqa: BLE001 - one stage failing must not lose the others
        value = {"ok": False, "failed": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-3000:]}
    if isinstance(value, dict):
        value["seconds"] = time.time() - t0
    print(f"[{name}] {json.dumps(value, default=str)[:1500]}", flush=True)
    return value


def cases(args, smoke):
    if smoke:
        return [(1024, 2, 0.5, 1), (1024, 2, 0.3, 2)]
    if args.grid:
        return [(int(c), int(b), float(s), int(n)) for n in args.next_ns.split(",") for c in args.contexts.split(",")
                for b in args.batches.split(",") for s in args.sparsities.split(",")]
    return [VERDICT_CASE] + MORE_CASES


def render(path):
    result = json.loads(pathlib.Path(path).read_text())
    print(f"{result['meta']['device']}, torch {result['meta']['torch']}, triton {result['meta']['triton']}")
    print(markdown(result["rows"]))
    if result.get("verdict"):
        print(verdict_line(result["verdict"]))
    return 0


def main(argv=None):
    args = parse_args(argv)
    if args.render:
        return render(args.render)
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")   # before triton is imported
    import torch
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    if device.type == "cpu" and os.environ.get("TRITON_INTERPRET", "0") in ("", "0"):
        sys.exit("bench/gpu/run.py: no CUDA device; run --cpu-smoke (it sets TRITON_INTERPRET=1)")
    t0 = time.time()
    meta = probe(torch, device)
    P, L, Serving, how = load_device()
    if args.no_serving:
        Serving, how = None, how + " (--no-serving)"
    dg, dg_note = (None, "--no-deepgemm") if args.no_deepgemm else DeepGemm.load(torch, device)
    peak, peak_how = hbm_peak(torch, device)
    meta.update({"modules": how, "deep_gemm": dg_note, "hbm_peak_tbs": peak * 1e-12 if peak else None,
                 "hbm_peak_source": peak_how, "heads": HEADS, "dim": DIM, "topk": TOPK, "page_size": PAGE,
                 "model_layers": MODEL_LAYERS, "replays": args.replays, "goals": GOALS,
                 "timing": "CUDA graph replays between CUDA events" if device.type == "cuda" else "one eager run",
                 "top_k_note": "vLLM's own top-k kernels are not installable here: spin's exact top-k "
                               "(torch.topk + emit) in both chains, torch.topk timed beside it"})
    print("probe: " + json.dumps(meta, default=str), flush=True)
    env = {"torch": torch, "device": device, "P": P, "L": L, "Serving": Serving, "peak": peak,
           "timer": Timer(torch, device, args.replays), "deep_gemm": dg, "deep_gemm_note": dg_note,
           "model_layers": 2 if args.smoke else MODEL_LAYERS,
           # The smoke run takes the GPU's code path: the Triton select/observe/commit kernels.
           "impl": "triton" if args.smoke else "auto"}
    result = {"meta": meta, "checks": {}, "verdict": None, "deepgemm_checks": None, "rows": []}
    if args.sweep_only:
        from chain import sweep_logits
        result["sweep"] = stage(result, "sweep", sweep_logits, env, make_inputs, args.sweep_only)
        save(args.out, result)
        return 0
    checks = result["checks"]
    for nn in (1, 2):
        checks[f"logits_next_n{nn}"] = stage(result, f"logits_next_n{nn}", check_logits, env, nn)
    steps = 4 if args.smoke else SELECTION_STEPS
    for nn, name, kth in ((1, "selections_plain", "bitwise"), (2, "selections_mtp", "bitwise"),
                          (2, "selections_mtp_radix", "radix")):
        if Serving is None:
            checks[name] = {"skipped": f"needs spin_dsa's _core: {how}"}
        else:
            small = dict(requests=3, layers=2, max_entries=1024, topk=64) if args.smoke else {}
            checks[name] = stage(result, name, check_selections, env, nn, steps, kth_search=kth,
                                 **small)
    save(args.out, result)
    todo = cases(args, args.smoke)
    for i, (ctx, batch, s, nn) in enumerate(todo):
        if i > 0 and time.time() - t0 > args.budget_s:
            result["rows"].append({"context": ctx, "batch": batch, "sparsity": s, "next_n": nn,
                                   "skipped": f"time budget ({args.budget_s:.0f} s) spent"})
            continue
        row = stage(result, f"case {ctx} {batch} {s} {nn}", measure_case, env, ctx, batch, s, nn, args.max_layers)
        row.update({"context": ctx, "batch": batch, "sparsity": s, "next_n": nn})
        result["rows"].append(row)
        if (ctx, batch, s, nn) == VERDICT_CASE or (args.smoke and i == 0):
            result["verdict"] = verdict(row, checks)
            print(verdict_line(result["verdict"]), flush=True)
            # DeepGEMM's own check after the verdict's Triton figures (see exact.py).
            result["deepgemm_checks"] = {f"next_n{n}": stage(result, f"deepgemm_logits_next_n{n}",
                                                             check_deepgemm_logits, env, n) for n in (1, 2)}
        save(args.out, result)
    if not args.no_sweep and (args.smoke or time.time() - t0 <= args.budget_s):
        from chain import sweep_logits
        result["sweep"] = stage(result, "sweep", sweep_logits, env, make_inputs)
    meta["seconds"] = time.time() - t0
    save(args.out, result)
    print(table(result["rows"]))
    print(markdown(result["rows"]))
    if result["verdict"]:
        print(verdict_line(result["verdict"]))
    exact = [c.get("ok") for c in checks.values() if "ok" in c]
    return 0 if exact and all(exact) else 1


if __name__ == "__main__":
    sys.exit(main())
