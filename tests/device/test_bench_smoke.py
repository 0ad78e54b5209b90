"""bench/gpu/run.py --cpu-smoke: the GPU run's own code on tiny shapes, on the CPU under the
Triton interpreter, so the prepared script cannot rot while no GPU runs it. It must finish, pass
its exactness checks (kernel vs reference, exact top-k vs the sort definition, the device
selections vs the C++ library over a generated trace, plain and MTP), and write the JSON it
documents: the probe, the checks, the verdict with PASS/FAIL per goal, the chain rows."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton", reason="the GPU benchmark needs triton")

REPO = pathlib.Path(__file__).resolve().parents[2]
RUN = REPO / "bench" / "gpu" / "run.py"
ENV = dict(os.environ, TRITON_INTERPRET="1")


def smoke(tmp_path, *extra, code=None):
    out = tmp_path / "smoke.json"
    cmd = [sys.executable, str(RUN), "--cpu-smoke", "--out", str(out), *extra]
    if code is not None:  # run.py under a prelude (e.g. spin_dsa hidden)
        cmd = [sys.executable, "-c", code + f"; import sys, runpy; sys.argv = {cmd[1:]!r}; "
               f"runpy.run_path({str(RUN)!r}, run_name='__main__')"]
    r = subprocess.run(cmd, env=ENV, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    return json.loads(out.read_text()), r.stdout


def test_cpu_smoke(tmp_path):
    pytest.importorskip("spin_dsa._core")
    data, stdout = smoke(tmp_path)
    meta = data["meta"]
    for key in ("device", "python", "torch", "triton", "nvcc", "driver", "modules", "deep_gemm", "seconds"):
        assert key in meta, key
    checks = data["checks"]
    for nn in (1, 2):
        assert checks[f"logits_next_n{nn}"]["ok"], checks[f"logits_next_n{nn}"]
    for name in ("selections_plain", "selections_mtp"):
        c = checks[name]
        assert c["ok"] and c["first_mismatch"] is None, c
        assert c["steps"] == 4 and c["selections_compared"] == 4 * c["layers"]
        assert c["topk_rows_compared"] > 0
    assert checks["selections_mtp"]["next_n"] == 2
    v = data["verdict"]
    assert v["exact"] == "PASS" and v["logits_kernel"] == "triton"
    for goal in ("chain_speedup", "spin_own_share", "dense_logits_hbm_fraction"):
        assert v[goal]["result"] in ("PASS", "FAIL", "not measured"), v[goal]
    assert v["chain_speedup"]["value"] > 0 and v["spin_own_share"]["value"] > 0
    assert v["dense_logits_hbm_fraction"]["result"] == "not measured"   # no HBM peak on a CPU
    rows = data["rows"]
    assert [(r["context"], r["batch"], r["sparsity"], r["next_n"]) for r in rows] == \
        [(1024, 2, 0.5, 1), (1024, 2, 0.3, 2)]
    for row in rows:
        assert not row["errors"], row["errors"]
        assert row["selector"].startswith("spin_dsa.device.Serving")
        for key in ("dense_chain_triton_us", "spin_layer_chain_triton_us", "spin_own_layer_us",
                    "plan_us_per_layer", "observe_us", "compact_us", "remap_us", "topk_exact_us",
                    "topk_torch_us", "chain_speedup_triton", "spin_own_share_triton", "ideal_speedup"):
            assert row.get(key) is not None, key
        assert row["pages_read"] < row["dense_logits_bytes"] // (64 * 132)   # fewer pages than dense
    assert [r for r in data["sweep"]["results"] if r.get("chosen")], "the sweep ran the chosen shape"
    assert "VERDICT" in stdout and "chain_speedup" in stdout


def test_cpu_smoke_without_spin_dsa(tmp_path):
    """On a GPU box with only torch and Triton: the kernel and paging load from the checkout's
    files, random block sets stand in for Serving, the rows say so, and the selection checks say
    what they need instead of failing."""
    data, _ = smoke(tmp_path, "--no-sweep", code="import sys; sys.modules['spin_dsa'] = None")
    assert data["meta"]["modules"].startswith("stand-alone modules")
    assert data["checks"]["logits_next_n1"]["ok"]
    assert "_core" in data["checks"]["selections_plain"]["skipped"]
    assert data["rows"][0]["selector"].startswith("random blocks")
    assert data["verdict"]["exact"] == "PASS"
