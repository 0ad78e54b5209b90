#!/usr/bin/env python3
"""spin's own per-row cost in the serving API (spin_dsa.Serving): select, and observe_scored with
and without the kernel's top-k, at 128K context (2048 blocks of 64), 50 % sparsity, 32 requests ×
4 layers. Run after `pip install .`:  python3 examples/serving_overhead.py
"""
import time, numpy as np, spin_dsa
B, L, N = 32, 4, 131072
s = spin_dsa.Serving(max_requests=B, num_layers=L, max_entries=N + 16, config={"target_sparsity": 0.5})
print("memory_bytes", s.memory_bytes, "max_blocks", s.max_blocks)
slots = np.arange(B, dtype=np.int32)
for i in range(B): s.add(i, 1000 + i)
rng = np.random.default_rng(0)
E = s.block_entries
scored = rng.standard_normal((B, s.max_blocks * E)).astype(np.float32)
tsel = tobs = 0.0; steps = 8
for t in range(steps):
    seq = np.full(B, N + t, np.int64)
    for l in range(L):
        t0 = time.perf_counter(); blocks = s.select(slots, l, seq); t1 = time.perf_counter()
        s.observe_scored(slots, l, scored); t2 = time.perf_counter()
        tsel += t1 - t0; tobs += t2 - t1
    s.commit(slots)
n = steps * L * B
print(f"per row (128K ctx, 2048 blocks, 50%): select {tsel/n*1e6:.1f} us, observe_scored {tobs/n*1e6:.1f} us (without top-k)")
# with the kernel's top-k (what an engine has anyway): pooling is O(topk) for the k-th
tobs2 = 0.0; tfull = 0.0
for t in range(steps, 2 * steps):
    seq = np.full(B, N + t, np.int64)
    for l in range(L):
        blocks = s.select(slots, l, seq).copy()
        b = blocks[:, :1024]
        top = np.sort(np.concatenate([b * E, b * E + 1], axis=1), axis=1).astype(np.int32)
        sc = scored.copy()
        cols = np.concatenate([np.arange(1024) * E, np.arange(1024) * E + 1])
        sc[:, cols] = 100.0 + np.arange(2048, dtype=np.float32)  # distinct: these are the top-k
        t1 = time.perf_counter(); s.observe_scored(slots, l, sc, top); t2 = time.perf_counter()
        tobs2 += t2 - t1
    s.commit(slots)
print(f"observe_scored with top-k: {tobs2/n*1e6:.1f} us per row")
