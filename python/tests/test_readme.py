"""The README's Python example runs as written and prints spin's recall, equal to replay's."""
import pathlib
import re

import pytest

import spin_dsa

README = pathlib.Path(__file__).resolve().parents[2] / "README.md"


def test_readme_example(small_trace_path, capsys):
    if not README.exists():
        pytest.skip("README.md not beside the tests")
    section = README.read_text().split("## Python", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S).group(1)
    code = code.replace('"doc-qa.safetensors"', repr(small_trace_path))
    exec(compile(code, "README.md", "exec"), {})
    out = capsys.readouterr().out.split()
    by_hand = float(out[-1])
    replayed = float(out[0])
    assert abs(by_hand - replayed) < 1e-12, (by_hand, replayed)
