#!/usr/bin/env python3
"""How much of each asked target (needle or turn) a top-k holds, at the asking steps.

    scripts/target-recall.py TRACE TOPK_DUMP [TOPK_DUMP ...]

TRACE is a `spin trace gen` trace with metadata "targets" (step:begin:end,...), written by the
needle / MRCR scenarios; each TOPK_DUMP is `spin replay TRACE --dump-topk FILE` (all-keep gives
the ground truth). Prints, per dump, two means over (layer, asking step, row), steps after step 0
(step 0 is the prefill, as in replay): target_in_topk = |target entries in the top-k| / |target
entries| (a needle's recall), and topk_in_target = |top-k entries in the target| / k (how much of
the top-k the question concentrates on a turn). The mean recall of a replay hides a needle: 8 entries of a 2048-entry
top-k are 0.4 % of it, while answering depends on them. Standard library only (no numpy).
"""
import array
import json
import struct
import sys


def read_header(path):
    with open(path, "rb") as f:
        n = struct.unpack("<Q", f.read(8))[0]
        return json.loads(f.read(n)), 8 + n


def targets_of(trace_path):
    header, _ = read_header(trace_path)
    text = header.get("__metadata__", {}).get("targets", "")
    if not text:
        sys.exit(f"{trace_path}: no 'targets' metadata (not a needle / MRCR scenario)")
    return [tuple(int(x) for x in item.split(":")) for item in text.split(",")]


def target_recall(dump_path, targets):
    header, base = read_header(dump_path)
    shares, concentration = [], []
    with open(dump_path, "rb") as f:
        for name, info in sorted(header.items()):
            if not name.endswith(".topk"):
                continue
            steps, next_n, k = info["shape"]
            begin, end = info["data_offsets"]
            f.seek(base + begin)
            ids = array.array("i")
            ids.frombytes(f.read(end - begin))
            for step, lo, hi in targets:
                if step == 0:
                    continue
                for row in range(next_n):
                    at = (step * next_n + row) * k
                    hits = sum(1 for e in ids[at:at + k] if lo <= e < hi)
                    shares.append(hits / (hi - lo))
                    concentration.append(hits / k)
    if not shares:
        return float("nan"), float("nan"), 0
    return sum(shares) / len(shares), sum(concentration) / len(concentration), len(shares)


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    targets = targets_of(sys.argv[1])
    for dump in sys.argv[2:]:
        share, concentration, n = target_recall(dump, targets)
        print(f"{dump}\ttarget_in_topk={share:.4f}\ttopk_in_target={concentration:.4f}\tsamples={n}")


if __name__ == "__main__":
    main()
