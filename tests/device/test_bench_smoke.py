"""bench/gpu/run.py --cpu-smoke: the GPU benchmark's tiny CPU case under the Triton interpreter,
so the prepared script cannot rot while no GPU runs it. It must finish, pass its own device checks
(kernel vs reference, exact top-k vs the sort definition) and write the JSON it documents."""
import json
import os
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("triton", reason="the GPU benchmark needs triton")

REPO = pathlib.Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("next_n", [1, 2])
def test_cpu_smoke(tmp_path, next_n):
    out = tmp_path / "smoke.json"
    env = dict(os.environ, TRITON_INTERPRET="1")
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu" / "run.py"), "--cpu-smoke", "--next-n", str(next_n),
                        "--out", str(out)], env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["meta"]["checks"]["ok"] and data["meta"]["next_n"] == next_n
    assert [r for r in data["meta"]["sweep"]["results"] if r.get("chosen")], "the sweep ran the chosen shape"
    assert all("error" not in r for r in data["meta"]["sweep"]["results"])
    modes = [(row["mode"], row["sparsity"]) for row in data["rows"]]
    assert modes == [("dense", 0.0), ("compact", 0.5)]
    compact = data["rows"][1]
    for key in ("logits_us", "topk_exact_us", "compact_us", "remap_us", "speedup", "ideal_speedup", "pages_read"):
        assert key in compact, key
    assert compact["pages_read"] < data["rows"][0]["logits_bytes"] // (64 * 132)  # fewer pages than dense
    assert "speedup" in r.stdout


def test_cpu_smoke_without_spin_dsa(tmp_path):
    """On a GPU box with only torch and Triton: the kernel and paging load from the checkout's
    files, random block sets stand in for Serving, and the rows say so."""
    out = tmp_path / "smoke.json"
    code = ("import sys, runpy; sys.modules['spin_dsa'] = None; "
            f"sys.argv = ['run.py', '--cpu-smoke', '--no-sweep', '--out', {str(out)!r}]; "
            f"runpy.run_path({str(REPO / 'bench' / 'gpu' / 'run.py')!r}, run_name='__main__')")
    r = subprocess.run([sys.executable, "-c", code], env=dict(os.environ, TRITON_INTERPRET="1"),
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    data = json.loads(out.read_text())
    assert data["meta"]["modules"].startswith("stand-alone modules")
    assert data["rows"][1]["selector"].startswith("random blocks (HOOK")
