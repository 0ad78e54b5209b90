"""Parity: spin's indexer (spin_dsa.indexer_scores) and top-k (spin_dsa.topk) against vLLM's own
torch references, fp8_paged_mqa_logits_torch (v1/attention/ops/rocm_aiter_mla_sparse.py) and
SparseIndexerTopk("torch"), on spin traces scattered over random physical pages, two requests of
different lengths per batch.

MTP rows (next_n = 3) go to vLLM as next_n = 1 rows, one per (request, row) with that row's
visible length, as vLLM's own flattening path does: the reference's next_n > 1 branch reads a
page as token-interleaved [128 value bytes | 4 scale bytes], not the paged layout its
next_n = 1 branch and DeepGEMM use, and returns NaN/garbage (an upstream bug; only the ROCm
fallback calls it). test_mtp_rows records whether that still holds.
"""
import numpy as np
import torch
from vllm.model_executor.layers.indexer_topk import SparseIndexerTopk
from vllm.v1.attention.ops.rocm_aiter_mla_sparse import fp8_paged_mqa_logits_torch

import spin_dsa
from cases import PAGE, scatter, visible

# Both sides sum exact e4m3·e4m3 products in fp32; only the order differs (spin: per head then
# weighted; vLLM: F.linear). So |spin - vLLM| ≤ REL_BOUND · (the row's largest |score|).
REL_BOUND = 1e-5


def _traces(next_n, steps):
    return [spin_dsa.generate_workload("doc-qa-10k", prompt_tokens=p, steps=steps, layers=1,
                                       next_n=next_n, seed=s)
            for p, s in ((9000, 5), (5000, 6))]


def _vllm(cache, table, q, w, ctx, topk, max_len):
    """vLLM's reference over next_n = 1 rows: q uint8 [R, H, 128], w [R, H], ctx [R]."""
    kv = torch.from_numpy(cache).view(cache.shape[0], PAGE, 1, 132)
    lens = torch.from_numpy(ctx.astype(np.int32))[:, None]
    logits = fp8_paged_mqa_logits_torch(torch.from_numpy(q[:, None]).view(torch.float8_e4m3fn), kv,
                                        torch.from_numpy(w), lens, torch.from_numpy(table), max_len)
    out = torch.full((q.shape[0], topk), -1, dtype=torch.int32)
    SparseIndexerTopk("torch")(logits, lens, 1, out, topk, max_len)
    return logits.numpy(), out.numpy()


def _compare(next_n, steps, figures):
    traces = _traces(next_n, steps)
    rng = np.random.default_rng(11)
    cache, table = scatter([(t.k(0), t.k_scale(0)) for t in traces], rng)
    topk = traces[0].meta["topk"]
    max_len = max(t.entries(0) for t in traces) + 64
    replayed = [spin_dsa.replay(spin_dsa.score_trace(t), "all-keep", keep_topk=True)["topk"][0]
                for t in traces]
    rows = identical = replay_same = 0
    worst = 0.0
    for s in range(steps):
        ctx = np.array([t.ctx_len[s] for t in traces], np.int64)
        q = np.stack([t.q(0)[s] for t in traces])  # [B, next_n, H, 128]
        w = np.stack([t.w(0)[s] for t in traces])
        scores = spin_dsa.indexer_scores(cache, table, ctx, q, w, page_size=PAGE)
        vis = visible(ctx, next_n).reshape(-1)
        top = spin_dsa.topk(scores, topk, visible_entries=vis)
        # vLLM: every (request, row) as its own next_n = 1 row, on the same pages
        ref, ref_top = _vllm(cache, np.repeat(table, next_n, axis=0), q.reshape(-1, *q.shape[2:]),
                             w.reshape(-1, w.shape[-1]), vis, topk, max_len)
        for r in range(scores.shape[0]):
            v = vis[r]
            ref_row = ref[r, :v]
            bound = REL_BOUND * max(1.0, float(np.abs(ref_row).max()))
            diff = float(np.abs(scores[r, :v] - ref_row).max())
            assert diff <= bound, f"step {s} row {r}: |spin - vLLM| = {diff} > {bound}"
            assert np.all(np.isneginf(scores[r, v:])), "spin wrote past the visible entries"
            worst = max(worst, diff)
            same = set(top[r][top[r] >= 0]) == set(ref_top[r][ref_top[r] >= 0])
            assert same, f"step {s} row {r}: top-k sets differ"
            identical += same
            b, j = divmod(r, next_n)
            replay_same += np.array_equal(top[r], replayed[b][s * next_n + j])
            rows += 1
    assert replay_same == rows  # spin replay --predictor all-keep --dump-topk agrees as well
    figures.append(f"parity next_n={next_n}: {rows} rows (2 requests x {steps} steps, contexts "
                   f"{traces[0].ctx_len[0]}/{traces[1].ctx_len[0]}, scattered pages): identical "
                   f"top-{topk} sets {identical}/{rows}, largest |score diff| {worst:.3g} "
                   f"(bound {REL_BOUND:g} x row max)")
    return traces, cache, table


def test_plain_rows(figures):
    _compare(1, 4, figures)


def test_mtp_rows(figures):
    traces, cache, table = _compare(3, 2, figures)
    # Record what vLLM's own next_n > 1 branch gives on the same input (not asserted: upstream's).
    t = traces[0]
    q = torch.from_numpy(t.q(0)[0][None].copy()).view(torch.float8_e4m3fn)
    kv = torch.from_numpy(cache).view(cache.shape[0], PAGE, 1, 132)
    ctx = torch.tensor([int(t.ctx_len[0])], dtype=torch.int32)
    with np.errstate(all="ignore"):
        native = fp8_paged_mqa_logits_torch(q, kv, torch.from_numpy(t.w(0)[0].copy()), ctx,
                                            torch.from_numpy(table[:1].copy()), int(ctx) + 64)
    spin = spin_dsa.indexer_scores(cache, table[:1], np.array([int(ctx)]), t.q(0)[0][None],
                                   t.w(0)[0][None], page_size=PAGE)
    v = visible(int(ctx), 3)
    agree = all(np.allclose(native[j, :v[j]].numpy(), spin[j, :v[j]], rtol=1e-4, atol=1e-4)
                for j in range(3))
    nan = bool(torch.isnan(native).any())
    figures.append(f"vLLM's fp8_paged_mqa_logits_torch with next_n=3 unflattened: "
                   f"{'agrees with' if agree else 'differs from'} the paged layout"
                   f"{' (NaN in its output)' if nan else ''}")
