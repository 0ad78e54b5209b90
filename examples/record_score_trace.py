#!/usr/bin/env python3
"""Record a spin score trace (kind=scores) from an engine's indexer logits buffer.

A score trace holds what the DSA lightning indexer *wrote* rather than what it read: per indexer
layer and decode step, the logits row of each query row over the cached entries (see
include/spin/trace.h for the schema). vLLM, SGLang or a real model can dump it without exposing
the indexer's keys and queries, and `spin replay` / `spin eval` then run every predictor that needs
only scores on it (hisa, which scores pooled keys with the query, needs a key trace, or the
optional block probe layer.{l}.probe [steps, next_n, ceil(entries / probe_block_entries)] that an
engine keeping pooled block keys can dump too; see include/spin/trace.h):

    layer.{l}.scores  F32 (or F16, BF16) [steps, next_n, entries]   the logits rows
    ctx_len           I64 [steps]   tokens in the cache at the step, incl. its own next_n rows
    accepted          I32 [steps]   MTP only (next_n > 1): draft tokens accepted, 0..next_n-1
    metadata: format=spin-trace version=1 kind=scores model num_layers next_n page_size topk
              compress_ratio

Row j of step s sees the first floor((ctx_len[s] - next_n + j + 1) / compress_ratio) columns;
whatever the buffer holds beyond that (vLLM pads with -inf, some kernels leave garbage) is
ignored, so `entries` only has to cover the last step. Inside, -inf is fine, NaN or +inf is an
error. A step whose ctx_len jumps by more than next_n (a tool output appended, a new turn) is
replayed as a prefill: its full scores are observed, not counted.

In vLLM (DeepSeek-V3.2 sparse attention backend) the logits are the output of
`deep_gemm.fp8_paged_mqa_logits` ([batch * next_n, max_model_len] fp32, one row per query row);
take the request's rows `logits[b * next_n:(b + 1) * next_n, :entries].cpu().numpy()` at every
decode step and layer, and the request's `seq_lens[b]` as ctx_len.

Here a fake tiny "model" stands in for the engine: scores with a slowly drifting focus over a
prompt, a tool output appended mid-way, and -inf padding past each row's visible prefix.

    python3 examples/record_score_trace.py out.safetensors [--next-n 3] [--layers 2] [--steps 16]
    spin trace info out.safetensors
    spin replay out.safetensors --predictor spin --sparsity 0.5
"""

import argparse
import json
import os
import struct

import numpy as np

try:  # the safetensors package's numpy API (pip install safetensors), as an engine would use it
    from safetensors.numpy import save_file
except ImportError:  # the same bytes without the package, so the example runs with numpy alone
    def save_file(tensors, path, metadata=None):
        names = {np.dtype(np.float32): "F32", np.dtype(np.float16): "F16",
                 np.dtype(np.int64): "I64", np.dtype(np.int32): "I32"}
        items = sorted(tensors.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
        header, offset = {"__metadata__": metadata or {}}, 0
        for name, arr in items:
            header[name] = {"dtype": names[arr.dtype], "shape": list(arr.shape),
                            "data_offsets": [offset, offset + arr.nbytes]}
            offset += arr.nbytes
        blob = json.dumps(header, separators=(",", ":")).encode()
        blob += b" " * (-len(blob) % 8)
        tmp = f"{path}.tmp-{os.getpid()}"
        with open(tmp, "wb") as f:
            f.write(struct.pack("<Q", len(blob)) + blob)
            for _, arr in items:
                f.write(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        os.replace(tmp, path)


class ScoreTraceRecorder:
    """Collects one request's indexer logits rows, step by step, for `num_layers` layers."""

    def __init__(self, model, num_layers, next_n, page_size, topk, compress_ratio=1):
        self.meta = dict(format="spin-trace", version="1", kind="scores", model=model,
                         num_layers=num_layers, next_n=next_n, page_size=page_size, topk=topk,
                         compress_ratio=compress_ratio)
        self.next_n = next_n
        self.rows = [[] for _ in range(num_layers)]  # per step [next_n, visible of the last row]
        self.ctx_len, self.accepted = [], []

    def record_step(self, layer, logits):
        """The layer's logits rows of this step: [next_n, >= visible entries of the last row]."""
        self.rows[layer].append(np.asarray(logits, np.float32))

    def end_step(self, ctx_len, accepted=0):
        self.ctx_len.append(ctx_len)
        self.accepted.append(accepted)

    def save(self, path, dtype=np.float32):
        entries = max(r.shape[1] for layer in self.rows for r in layer)
        t = {"ctx_len": np.array(self.ctx_len, np.int64)}
        if self.next_n > 1:
            t["accepted"] = np.array(self.accepted, np.int32)
        for l, steps in enumerate(self.rows):
            out = np.full((len(steps), self.next_n, entries), -np.inf, np.float32)
            for s, r in enumerate(steps):
                out[s, :, :r.shape[1]] = r
            t[f"layer.{l}.scores"] = out.astype(dtype)  # F16 halves the file; F32 is exact
        save_file(t, path, metadata={k: str(v) for k, v in self.meta.items()})


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompt", type=int, default=1000, help="prompt tokens")
    p.add_argument("--tool", type=int, default=300, help="tool-output tokens appended mid-way (0: none)")
    p.add_argument("--next-n", type=int, default=1, help="1 + MTP draft tokens")
    p.add_argument("--f16", action="store_true", help="store the scores as F16")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    n = a.next_n
    rec = ScoreTraceRecorder("fake-tiny-dsa", a.layers, n, page_size=64, topk=256)
    # The fake model: each entry has a salience and a position; a layer's focus is a centre that
    # drifts, so scores = salience + closeness to the focus + recency + noise.
    total = a.prompt + a.tool + a.steps * n + n
    salience = rng.normal(size=(a.layers, total)).astype(np.float32)
    focus = rng.uniform(0, a.prompt, size=a.layers)
    ctx = a.prompt
    for step in range(a.steps):
        if a.tool and step == a.steps // 2:
            ctx += a.tool  # a tool output appended: a ctx_len jump, replayed as a prefill
            focus[:] = ctx - a.tool / 2  # and the model looks at it
        ctx += n  # the step's rows (last token + drafts) are in the cache while it is scored
        acc = int(rng.integers(0, n))  # the verifier's answer: drafts accepted
        focus += 20 * rng.normal(size=a.layers)
        for l in range(a.layers):
            pos = np.arange(ctx, dtype=np.float32)
            base = salience[l, :ctx] - np.abs(pos - focus[l]) / 200 + 0.5 * np.exp((pos - ctx) / 50)
            rows = base + 0.3 * rng.normal(size=(n, ctx)).astype(np.float32)
            for j in range(n):  # row j sees ctx - n + j + 1 entries; the buffer's tail is padding
                rows[j, ctx - n + j + 1:] = -np.inf
            rec.record_step(l, rows)
        rec.end_step(ctx, acc)
        ctx += acc + 1 - n  # rejected drafts leave the cache
    rec.save(a.out, np.float16 if a.f16 else np.float32)
    print(f"wrote {a.out}: {a.layers} layers, {a.steps} steps, next_n {n}, "
          f"ctx_len {rec.ctx_len[0]}..{rec.ctx_len[-1]}")


if __name__ == "__main__":
    main()
