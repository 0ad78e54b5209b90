"""python -m spin_record {record,quality,distill} — real-model score traces, DSA-emulated task quality,
and a distilled DSA lightning indexer with its kind=keys traces.

  record   [--out build/real-traces] [--context 8192] [--steps 32] [--next-n 1 2] [--force]
  quality  [--out build/real-traces] [--decode 128] [--quick] [--signal attention|indexer]
           [--predictors ...] [--force]
  distill  [--out build/real-traces] [--force]   (indexer per layer, distill.md, key traces)

Results are cached by content: the key hashes the recorder's own sources, the model and text
hashes and the arguments; a second run with the same key copies the cached files and returns.
"""

import argparse
import hashlib
import json
import os
import shutil
import sys
import time
from pathlib import Path

from . import assets

SRC = Path(__file__).resolve().parent


RECORD_SOURCES = ("assets.py", "model.py", "record.py", "tokenizer.py")


def content_key(kind, args):
    """A recording depends on the model, tokenizer and recorder sources only; quality on all."""
    h = hashlib.sha256()
    srcs = sorted(SRC.glob("*.py"))
    if kind == "record":
        srcs = [p for p in srcs if p.name in RECORD_SOURCES]
    for p in srcs:
        h.update(p.name.encode() + p.read_bytes())
    h.update(assets.MODEL_WHEEL_SHA256.encode() + assets.ALICE_SHA256.encode())
    h.update(json.dumps([kind, args], sort_keys=True).encode())
    return h.hexdigest()[:16]


def log(msg):
    print(f"[spin_record {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def load_model():
    from . import model, tokenizer

    g = assets.model_path()
    t0 = time.time()
    m, tok = model.load(g), tokenizer.from_gguf(g)
    log(f"model {assets.MODEL_NAME} loaded ({time.time() - t0:.1f} s)")
    return m, tok


def cmd_record(a):
    from . import record

    args = dict(context=a.context, steps=a.steps, next_n=sorted(a.next_n))
    key = content_key("record", args)
    cdir = assets.cache_dir() / f"record-{key}"
    done = cdir / "summary.json"
    if not done.exists() or a.force:
        tmp = assets.cache_dir() / f"record-{key}.tmp-{os.getpid()}"
        tmp.mkdir(parents=True, exist_ok=True)
        m, tok = load_model()
        text = assets.read_text()
        t0 = time.time()
        extra = [a.context - a.decode_for_quality - 2]  # warm row of the quality decode
        s = record.record(m, tok, text, str(tmp), a.context, a.steps, sorted(a.next_n),
                          extra_rows=extra, keep_cache_to=str(tmp), log=log)
        s["record_wall_s"] = round(time.time() - t0, 1)
        with open(tmp / "summary.json", "w") as f:
            json.dump(s, f, indent=1)
        if cdir.exists():
            shutil.rmtree(cdir)
        os.replace(tmp, cdir)
        log(f"recorded in {s['record_wall_s']} s (cache {cdir})")
    else:
        log(f"cached: {cdir}")
    os.makedirs(a.out, exist_ok=True)
    summary = json.loads(done.read_text())
    for f in cdir.glob("*.safetensors"):
        dst = Path(a.out) / f.name
        if dst.exists():
            dst.unlink()
        try:
            os.link(f, dst)
        except OSError:
            shutil.copyfile(f, dst)
    shutil.copyfile(done, Path(a.out) / "record-summary.json")
    print_record_summary(summary)
    return cdir


def print_record_summary(s):
    print(f"model {s['model']}  context {s['context']}  steps {s['steps']}  topk {s['topk']}")
    print(f"perplexity over the {s['context']} tokens: {s['ppl']:.2f}   "
          f"(forward {s['forward_and_lm_head_s']} s, record {s.get('record_wall_s')} s)")
    print("mean loss by position: " + "  ".join(f"{k}: {v:.3f}"
                                                for k, v in s["loss_by_position"].items()))
    for name, t in s["traces"].items():
        m = t["mean"]
        print(f"{t['file']}: next_n {t['next_n']}, {t['steps']} steps, ctx_len "
              f"{t['ctx_len'][0]}..{t['ctx_len'][1]}" +
              (f", accepted mean {t['accepted_mean']:.2f} hist {t['accepted_hist']}"
               if "accepted_mean" in t else ""))
        print(f"  all-keep, mean of layers: prev-iter top-k recall {m['prev_iter_topk_recall']:.3f}"
              f"  pearson(block max) {m['pearson_block_max']:.3f}  pearson(entries) "
              f"{m['pearson_entries']:.3f}  blocks with >=1 top-k {m['topk_block_share']:.3f}")
        if "probe_pearson_block_max" in m:
            print(f"  block probe vs max-pooled scores: pearson {m['probe_pearson_block_max']:.3f}  "
                  f"top-block recall {m['probe_topk_block_recall']:.3f} (prev-iter's "
                  f"{m['prev_iter_topk_block_recall']:.3f})")


def bindings_hash():
    """The installed spin_dsa extension's hash, or "none": a rebuilt predictor (same recorder
    sources) must not be answered from the cache."""
    try:
        import spin_dsa
    except ImportError:
        return "none"
    core = getattr(getattr(spin_dsa, "_core", None), "__file__", None)
    return assets.sha256(core)[:16] if core else "unknown"


def write_atomic(path, text):
    tmp = Path(f"{path}.tmp-{os.getpid()}")
    tmp.write_text(text)
    os.replace(tmp, path)


def cmd_quality(a):
    from . import quality, quality_indexer

    indexer = a.signal == "indexer"
    if not indexer:  # the attention path decodes from the score recording's forward
        rec_args = argparse.Namespace(**vars(a))
        rec_args.force = False
        cdir = cmd_record(rec_args)
    preds = a.predictors if a.predictors is not None else (
        list(quality_indexer.PREDICTORS) if indexer else [])
    args = dict(context=a.context, steps=a.steps, next_n=sorted(a.next_n), decode=a.decode,
                quick=a.quick, predictors=preds, bindings=bindings_hash(),
                retrieval=not a.no_retrieval)
    if indexer:
        from . import distill
        args.update(signal="indexer", weights=distill.weights_key(distill.HP))
    name = "quality-indexer" if indexer else "quality"
    key = content_key("quality", args)
    qdir = assets.cache_dir() / f"{name}-{key}"
    done = qdir / f"{name}.json"
    if not done.exists() or a.force:
        m, tok = load_model()
        text = assets.read_text()
        if indexer:
            for p in preds:  # a missing binding or a misspelt spec fails now, not after the forward
                quality.selectors.make_selector(p, 0.5, 256)
            layers, _, _ = distill.trained(m, tok, text, distill.HP, log)
            res = quality_indexer.run(m, tok, text, layers, args["weights"], a.context, a.decode,
                                      log, predictors=preds, quick=a.quick,
                                      with_retrieval=not a.no_retrieval)
        else:
            res = quality.run(m, tok, text, cdir, a.context, a.decode, a.quick, log, predictors=preds)
        qdir.mkdir(parents=True, exist_ok=True)
        write_atomic(done, json.dumps(res, indent=1))
    res = json.loads(done.read_text())
    os.makedirs(a.out, exist_ok=True)
    write_atomic(Path(a.out) / f"{name}.json", json.dumps(res, indent=1))
    report = (quality_indexer if indexer else quality).format_report(res)
    write_atomic(Path(a.out) / f"{name}.md", report)
    print(report)


def cmd_distill(a):
    from . import distill

    m, tok = load_model()
    t0 = time.time()
    r = distill.run(m, tok, assets.read_text(), a.out, log=log, force=a.force)
    log(f"distill done ({time.time() - t0:.1f} s)")
    print((Path(a.out) / "distill.md").read_text())
    return r


def main(argv=None):
    p = argparse.ArgumentParser(prog="python -m spin_record", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("record", "quality"):
        s = sub.add_parser(name)
        s.add_argument("--out", default=str(assets.repo_root() / "build" / "real-traces"))
        s.add_argument("--context", type=int, default=8192)
        s.add_argument("--steps", type=int, default=32, help="decode steps after step 0")
        s.add_argument("--next-n", type=int, nargs="+", default=[1, 2])
        s.add_argument("--decode-for-quality", type=int, default=128, help=argparse.SUPPRESS)
        if name == "record":
            s.add_argument("--force", action="store_true")
        else:
            s.add_argument("--decode", type=int, default=128, help="teacher-forced loss steps")
            s.add_argument("--quick", action="store_true", help="one sparsity, three needles")
            s.add_argument("--predictors", nargs="*", default=None,
                           help="attention signal: C++ predictors through spin_dsa added to the "
                                "Python baselines (e.g. spin step-reuse); indexer signal: the whole "
                                "list (default: spin spin-noexplore spin-hybrid hisa prev-iter "
                                "step-reuse oracle random); C++ specs may carry config overrides, "
                                "name:field=value,...")
            s.add_argument("--signal", choices=("attention", "indexer"), default="attention",
                           help="step 1's score: the model's attention (quality.md) or the "
                                "distilled indexer (quality-indexer.md)")
            s.add_argument("--force", action="store_true", help="recompute, ignoring the cache")
            s.add_argument("--no-retrieval", action="store_true",
                           help="indexer signal: the loss table only (no needles, no pass keys)")
    s = sub.add_parser("distill")
    s.add_argument("--out", default=str(assets.repo_root() / "build" / "real-traces"))
    s.add_argument("--force", action="store_true", help="re-record the key traces (not the weights)")
    a = p.parse_args(argv)
    if a.cmd == "quality":
        a.decode_for_quality = a.decode
    try:
        {"record": cmd_record, "quality": cmd_quality, "distill": cmd_distill}[a.cmd](a)
    except (RuntimeError, ValueError, ImportError) as e:
        print(f"spin_record: error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
