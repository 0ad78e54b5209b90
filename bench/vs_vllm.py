"""spin's indexer against vLLM's own CPU reference, in one process.

vLLM's torch fallback for the lightning indexer, fp8_paged_mqa_logits_torch
(vllm/v1/attention/ops/rocm_aiter_mla_sparse.py), and spin_dsa.indexer_scores score the same
paged FP8 cache (V3.2 shape: 64 heads x 128 dims, page 64, one decode row) on the same threads;
the two are interleaved, each timed as the median of its runs, and their logits compared.

Run it with the vLLM integration venv (scripts/vllm-env.sh, which scripts/test-integration.sh
fills with spin_dsa):

    "$(./scripts/vllm-env.sh)" bench/vs_vllm.py --context 131072 --threads 2

SPIN_CPU (spin/cpu.h) caps spin's side as on a smaller CPU: SPIN_CPU=avx2 runs the AVX2 path.
"""
import argparse
import statistics
import time

import numpy as np
import torch
from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_paged_mqa_logits_torch

import spin_dsa

HEADS, DIM, PAGE = 64, 128, 64
PAGE_BYTES = PAGE * (DIM + 4)


def fp8_codes(rng, shape):
    """Random finite e4m3 bytes (no NaN codes 0x7F / 0xFF), magnitudes up to ~2."""
    codes = rng.integers(0, 0x40, size=shape, dtype=np.uint8)
    return codes | (rng.integers(0, 2, size=shape, dtype=np.uint8) << 7)


def make_inputs(context, seed):
    rng = np.random.default_rng(seed)
    pages = -(-context // PAGE)
    cache = np.zeros((pages + 1, PAGE_BYTES), np.uint8)
    cache[:, :PAGE * DIM] = fp8_codes(rng, (pages + 1, PAGE * DIM))
    cache[:, PAGE * DIM:] = rng.uniform(0.5, 1.5, (pages + 1, PAGE)).astype(np.float32).view(np.uint8)
    table = (rng.permutation(pages) + 1).astype(np.int32)[None]  # physical page 0 never read
    q = fp8_codes(rng, (1, 1, HEADS, DIM))
    w = rng.uniform(-1, 1, (1, 1, HEADS)).astype(np.float32)
    return cache, table, q, w


def median_us(fn, runs):
    fn()  # warm-up
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--context", type=int, default=131072, help="entries of the one request (default 131072)")
    ap.add_argument("--threads", type=int, default=2, help="threads for both sides (default 2)")
    ap.add_argument("--runs", type=int, default=7, help="timed runs per side (default 7)")
    ap.add_argument("--impl", default="auto", help="spin's kernel path (default auto)")
    ap.add_argument("--seed", type=int, default=1)
    a = ap.parse_args()
    if a.context < 1 or a.threads < 1 or a.runs < 1:
        ap.error("--context, --threads and --runs must be ≥ 1")
    torch.set_num_threads(a.threads)
    cache, table, q, w = make_inputs(a.context, a.seed)
    ctx = np.array([a.context], np.int64)
    kv = torch.from_numpy(cache).view(cache.shape[0], PAGE, 1, DIM + 4)
    tq = torch.from_numpy(q).view(torch.float8_e4m3fn)  # [batch, next_n, heads, dim]
    tw, tlen, ttable = torch.from_numpy(w[:, 0]), torch.tensor([[a.context]], dtype=torch.int32), torch.from_numpy(table)

    def vllm():
        return fp8_paged_mqa_logits_torch(tq, kv, tw, tlen, ttable, a.context)

    def spin():
        return spin_dsa.indexer_scores(cache, table, ctx, q, w, page_size=PAGE, impl=a.impl, threads=a.threads)

    ref, ours = vllm()[0, :a.context].numpy(), spin()[0, :a.context]
    worst = float(np.max(np.abs(ref - ours)) / max(1.0, float(np.abs(ref).max())))
    # Interleaved rounds, so a busy neighbour slows both sides alike.
    v_us, s_us = [], []
    for _ in range(3):
        v_us.append(median_us(vllm, a.runs))
        s_us.append(median_us(spin, a.runs))
    v, s = min(v_us), min(s_us)
    flop = 2.0 * HEADS * DIM * a.context
    print(f"cpu: {spin_dsa.cpu_summary()}")
    print(f"context {a.context}, 64 heads x 128, page 64, 1 row, {a.threads} threads, spin impl {a.impl}")
    print(f"vLLM fp8_paged_mqa_logits_torch: {v:10.0f} us  {flop / v / 1e3:7.1f} GFLOP/s")
    print(f"spin_dsa.indexer_scores:         {s:10.0f} us  {flop / s / 1e3:7.1f} GFLOP/s")
    print(f"spin is {v / s:.1f}x vLLM's torch reference; max |diff| / max |score| = {worst:.2e}")


if __name__ == "__main__":
    main()
