"""The Python examples of the README and of docs/python.md run as written: the README's prints
spin's recall; the longer one drives a predictor by hand and its recall equals replay's."""
import pathlib
import re

import pytest

import spin_dsa

ROOT = pathlib.Path(__file__).resolve().parents[2]


def _example(page, section, trace):
    path = ROOT / page
    if not path.exists():
        pytest.skip(f"{page} not beside the tests")
    text = path.read_text().split(section, 1)[1]
    code = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    return code.replace('"doc-qa.safetensors"', repr(trace))


def test_readme_example(small_trace_path, capsys):
    code = _example("README.md", "## Python", small_trace_path)
    exec(compile(code, "README.md", "exec"), {})
    recall = float(capsys.readouterr().out.split()[-1])
    assert 0.0 < recall <= 1.0


def test_docs_python_example(small_trace_path, capsys):
    code = _example("docs/python.md", "## Python", small_trace_path)
    exec(compile(code, "docs/python.md", "exec"), {})
    out = capsys.readouterr().out.split()
    by_hand, replayed = float(out[-1]), float(out[0])
    assert abs(by_hand - replayed) < 1e-12, (by_hand, replayed)
