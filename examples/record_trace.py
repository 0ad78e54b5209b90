#!/usr/bin/env python3
"""Record a spin trace (schema version 1) of a model's indexer inputs: numpy only, no torch.

A trace holds what the DSA lightning indexer of one request reads at every decode step, so that
`spin` can replay it offline: per indexer layer the e4m3 key cache with its fp32 scales, and per
step the e4m3 queries with their fp32 head weights (see include/spin/trace.h for the schema):

    layer.{l}.k        U8  [entries, 128]              layer.{l}.k_scale F32 [entries]
    layer.{l}.q        U8  [steps, next_n, heads, 128] layer.{l}.w       F32 [steps, next_n, heads]
    ctx_len            I64 [steps]   tokens in the cache at the step, incl. its own next_n rows
    accepted           I32 [steps]   MTP only: draft tokens accepted, 0..next_n-1
    layer.{l}.k_draft  U8  [steps, next_n-1, 128] + k_draft_scale F32 [steps, next_n-1]  (MTP)

In a real engine (vLLM, DeepSeek-V3.2) hook the indexer of each layer and hand over bytes:
  * keys: the indexer cache page is [page_size x 128 e4m3 | page_size x fp32 scale]; gather the
    request's pages in logical order: `k = page[:, :ps*128].view(uint8)`, `k_scale = page[:, ps*128:]
    .view(float32)`; or record each new key row as the indexer writes it (what this script does).
  * queries: `q_fp8.view(torch.uint8).cpu().numpy()`  -> [next_n, heads, 128]
  * weights: the fp32 `weights` tensor passed to the logits kernel (q scale and
    128^-0.5 * 64^-0.5 already folded in) -> [next_n, heads]
  * ctx_len: the request's seq_len at the step (vLLM's `seq_lens`, incl. the step's rows).
torch.float8_e4m3fn tensors saved with `safetensors.torch.save_file` (dtype F8_E4M3) are read too.

Here a fake tiny "model" stands in for the engine: random keys and queries with a slowly drifting
focus, quantised exactly as DeepSeek's act_quant does (UE8M0 scale, e4m3 round-to-nearest-even).

    python3 examples/record_trace.py out.safetensors [--next-n 3] [--layers 2] [--steps 16]
    spin trace info out.safetensors
"""

import argparse
import json
import os
import struct

import numpy as np

HEAD_DIM = 128


# --- e4m3 and UE8M0, bit-exact with spin/numerics.h --------------------------------------------

def _e4m3_table():
    """Values of the positive finite e4m3 codes 0x00..0x7E (increasing with the code)."""
    codes = np.arange(0x7F)
    exp, man = codes >> 3, codes & 7
    sub = man * 2.0 ** -9
    norm = (1 + man / 8.0) * 2.0 ** (exp - 7)
    return np.where(exp == 0, sub, norm)


_E4M3 = _e4m3_table()


def e4m3_encode(x):
    """float32 array -> uint8 e4m3 codes: round to nearest, ties to even, saturate at 448."""
    x = np.asarray(x, dtype=np.float32)
    a = np.minimum(np.abs(x).astype(np.float64), 448.0)
    hi = np.clip(np.searchsorted(_E4M3, a), 1, 0x7E)
    lo = hi - 1
    dlo, dhi = a - _E4M3[lo], _E4M3[hi] - a
    code = np.where(dlo < dhi, lo, np.where(dhi < dlo, hi, np.where(lo % 2 == 0, lo, hi)))
    return (code | np.where(np.signbit(x), 0x80, 0)).astype(np.uint8)


def ue8m0_scale(amax):
    """2^ceil(log2(fl32(max(amax, 1e-4) * fl32(1/448)))), by exponent bits as act_quant does."""
    s = np.maximum(np.asarray(amax, np.float32), np.float32(1e-4)) * np.float32(1.0 / 448.0)
    bits = s.astype(np.float32).view(np.uint32)
    exp = ((bits >> 23) & 0xFF) + ((bits & 0x7FFFFF) != 0)
    return (exp.astype(np.uint32) << 23).view(np.float32)


def quantize_rows(x):
    """[..., 128] float -> (e4m3 codes [..., 128], fp32 scale [...]) with one scale per row."""
    scale = ue8m0_scale(np.abs(x).max(axis=-1))
    codes = e4m3_encode(np.clip(x / scale[..., None], -448.0, 448.0))
    return codes, scale


# --- safetensors, written by hand -------------------------------------------------------------

_DTYPES = {np.dtype(np.uint8): "U8", np.dtype(np.int32): "I32", np.dtype(np.int64): "I64",
           np.dtype(np.float32): "F32"}


def save_safetensors(path, tensors, metadata):
    """Writes {name: array} + {str: str} metadata as the safetensors package does, atomically."""
    items = sorted(tensors.items(), key=lambda kv: (-kv[1].dtype.itemsize, kv[0]))
    header, offset = {"__metadata__": metadata}, 0
    for name, arr in items:
        header[name] = {"dtype": _DTYPES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    blob = json.dumps(header, separators=(",", ":")).encode()
    blob += b" " * (-len(blob) % 8)  # pad to 8 bytes so every tensor stays aligned
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(struct.pack("<Q", len(blob)) + blob)
        for _, arr in items:
            f.write(np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<")).tobytes())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


# --- the recorder an engine would call ----------------------------------------------------------

class TraceRecorder:
    """Collects one request's indexer inputs, step by step, for `num_layers` indexer layers."""

    def __init__(self, model, num_layers, next_n, num_heads, page_size, topk, compress_ratio=1):
        self.meta = dict(format="spin-trace", version="1", model=model, num_layers=num_layers,
                         next_n=next_n, num_heads=num_heads, page_size=page_size, topk=topk,
                         compress_ratio=compress_ratio)
        self.next_n = next_n
        self.k = [[] for _ in range(num_layers)]        # final-sequence key rows (codes, scale)
        self.q = [[] for _ in range(num_layers)]        # per step [next_n, heads, 128]
        self.w = [[] for _ in range(num_layers)]        # per step [next_n, heads]
        self.k_draft = [[] for _ in range(num_layers)]  # per step [next_n-1, 128] (+ scales)
        self.ctx_len, self.accepted = [], []

    def append_keys(self, layer, codes, scales):
        """Key rows the indexer wrote to the cache (prefill or accepted tokens)."""
        self.k[layer].extend(zip(codes, scales))

    def record_step(self, layer, q_codes, w, draft_codes=None, draft_scales=None):
        self.q[layer].append(q_codes)
        self.w[layer].append(w)
        if draft_codes is not None:
            self.k_draft[layer].append((draft_codes, draft_scales))

    def end_step(self, ctx_len, accepted=0):
        self.ctx_len.append(ctx_len)
        self.accepted.append(accepted)

    def save(self, path):
        t = {"ctx_len": np.array(self.ctx_len, np.int64)}
        if self.next_n > 1:
            t["accepted"] = np.array(self.accepted, np.int32)
        for l in range(len(self.k)):
            t[f"layer.{l}.k"] = np.stack([c for c, _ in self.k[l]]).astype(np.uint8)
            t[f"layer.{l}.k_scale"] = np.array([s for _, s in self.k[l]], np.float32)
            t[f"layer.{l}.q"] = np.stack(self.q[l]).astype(np.uint8)
            t[f"layer.{l}.w"] = np.stack(self.w[l]).astype(np.float32)
            if self.k_draft[l]:
                t[f"layer.{l}.k_draft"] = np.stack([c for c, _ in self.k_draft[l]])
                t[f"layer.{l}.k_draft_scale"] = np.stack([s for _, s in self.k_draft[l]])
        save_safetensors(path, t, {k: str(v) for k, v in self.meta.items()})


# --- a fake model, so that the example runs standalone -------------------------------------------

def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out")
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--steps", type=int, default=16)
    p.add_argument("--prompt", type=int, default=1000, help="prompt tokens (prefill keys)")
    p.add_argument("--next-n", type=int, default=1, help="1 + MTP draft tokens")
    p.add_argument("--heads", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args()
    rng = np.random.default_rng(a.seed)
    n = a.next_n
    rec = TraceRecorder("fake-tiny-dsa", a.layers, n, a.heads, page_size=64, topk=256)

    def key_rows(count, focus):
        return quantize_rows(rng.normal(size=(count, HEAD_DIM)) + 0.5 * focus)

    focus = rng.normal(size=(a.layers, HEAD_DIM))
    for l in range(a.layers):  # prefill: the prompt's keys
        rec.append_keys(l, *key_rows(a.prompt, focus[l]))
    ctx = a.prompt
    for step in range(a.steps):
        ctx += n  # the step's rows (last token + drafts) are in the cache while it is scored
        acc = int(rng.integers(0, n))  # the verifier's answer: drafts accepted
        focus += 0.1 * rng.normal(size=focus.shape)  # the model's attention drifts
        for l in range(a.layers):
            rows, rows_scale = key_rows(n, focus[l])  # keys of the step's n tokens
            q = focus[l] + rng.normal(size=(n, a.heads, HEAD_DIM))
            q_codes, q_scale = quantize_rows(q)
            gate = rng.normal(size=(n, a.heads)).astype(np.float32)
            w = gate * q_scale * np.float32(HEAD_DIM ** -0.5 * a.heads ** -0.5)
            last = step == a.steps - 1  # keep every row of the last step so its context exists
            keep = n if last else acc + 1
            rec.append_keys(l, rows[:keep], rows_scale[:keep])
            rec.record_step(l, q_codes, w, rows[1:] if n > 1 else None,
                            rows_scale[1:] if n > 1 else None)
        rec.end_step(ctx, acc)
        ctx += acc + 1 - n  # rejected drafts leave the cache
    rec.save(a.out)
    print(f"wrote {a.out}: {a.layers} layers, {a.steps} steps, next_n {n}, "
          f"ctx_len {rec.ctx_len[0]}..{rec.ctx_len[-1]}")


if __name__ == "__main__":
    main()
