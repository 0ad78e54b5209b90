"""examples/device_decode.py — the README's device-path walkthrough — runs end to end (small)."""
import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("spin_dsa")

EXAMPLE = pathlib.Path(__file__).resolve().parents[2] / "examples" / "device_decode.py"


def test_the_example_decodes_and_reports_recall():
    out = subprocess.run([sys.executable, str(EXAMPLE), "--requests", "2", "--steps", "3",
                          "--device", "cpu"], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    steps = [line for line in out.stdout.splitlines() if line.startswith("step")]
    assert len(steps) == 3
    recall = [float(line.split("recall ")[1].split(",")[0]) for line in steps]
    assert all(0.5 < r <= 1.0 for r in recall), out.stdout  # spin at 50 % finds most of the top-k
    assert all("blocks skipped 50.0%" in line for line in steps), out.stdout
