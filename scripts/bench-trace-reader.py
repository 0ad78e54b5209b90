#!/usr/bin/env python3
"""What the TraceReader's truncation safety costs: opening a trace by copying it into
memory (the default up to 256 MiB) against memory-mapping it, and the per-access size check of a
mapped reader. Writes one score trace of about --mib MiB to a temporary folder, then prints
medians of --repeat runs (page cache warm: the file was just written).

    build/venv-dev/bin/python scripts/bench-trace-reader.py --mib 200
"""
import argparse
import os
import statistics
import tempfile
import time

import numpy as np

import spin_dsa


def median_ms(fn, repeat):
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=200)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    entries = 1 << 18  # float32 columns per row
    steps = max(2, a.mib * (1 << 20) // (entries * 4))
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "scores.safetensors")
        scores = np.random.default_rng(0).standard_normal((steps, 1, entries)).astype(np.float32)
        ctx = np.arange(entries - steps + 1, entries + 1, dtype=np.int64)
        spin_dsa.write_score_trace({"next_n": 1, "page_size": 64, "topk": 2048, "compress_ratio": 1},
                                   ctx, [scores], path)
        size = os.path.getsize(path) / (1 << 20)
        big = 1 << 40
        open_copy = median_ms(lambda: spin_dsa.open_trace(path, copy_below_bytes=big), a.repeat)
        open_map = median_ms(lambda: spin_dsa.open_trace(path, copy_below_bytes=0), a.repeat)
        read_copy = median_ms(lambda: spin_dsa.open_trace(path, copy_below_bytes=big).scores(0).sum(), a.repeat)
        read_map = median_ms(lambda: spin_dsa.open_trace(path, copy_below_bytes=0).scores(0).sum(), a.repeat)
        copied, mapped = spin_dsa.open_trace(path, copy_below_bytes=big), spin_dsa.open_trace(path, copy_below_bytes=0)
        n = 20000
        view_copy = median_ms(lambda: [copied.scores(0) for _ in range(n)], a.repeat) * 1e3 / n
        view_map = median_ms(lambda: [mapped.scores(0) for _ in range(n)], a.repeat) * 1e3 / n
        print(f"trace {size:.0f} MiB ({steps} steps x {entries} entries), median of {a.repeat}, page cache warm")
        print(f"  open                : copy {open_copy:8.1f} ms   map {open_map:8.1f} ms")
        print(f"  open + read it all  : copy {read_copy:8.1f} ms   map {read_map:8.1f} ms")
        print(f"  one view (scores(0)): copy {view_copy:8.2f} us   map {view_map:8.2f} us (fstat size check)")
        print(f"  resident after open : copy {size:.0f} MiB more; map: only the pages read")


if __name__ == "__main__":
    main()
