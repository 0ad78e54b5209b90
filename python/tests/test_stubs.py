"""The type stub _core.pyi: the build writes it with nanobind's stubgen from the bindings' own
signatures (python/CMakeLists.txt, nanobind_add_stub) and installs it next to the module; the
copy committed in python/spin_dsa/ is for readers and editors. All three must be the same text:
the committed copy, the installed one, and a fresh stubgen run over the installed module."""
import ast
import pathlib
import subprocess
import sys

import spin_dsa
from spin_dsa import _core

COMMITTED = pathlib.Path(__file__).resolve().parents[1] / "spin_dsa" / "_core.pyi"


def _lines(text):
    return [line.rstrip() for line in text.rstrip().splitlines()]


def test_committed_stub_is_the_generated_one(tmp_path):
    fresh = tmp_path / "_core.pyi"
    subprocess.run([sys.executable, "-m", "nanobind.stubgen", "-q", "-m", "spin_dsa._core", "-o",
                    str(fresh)], check=True, cwd=tmp_path)
    installed = pathlib.Path(spin_dsa.__file__).with_name("_core.pyi")
    generated = _lines(fresh.read_text())
    assert _lines(installed.read_text()) == generated, "the installed stub is not the build's stubgen output"
    assert _lines(COMMITTED.read_text()) == generated, (
        "python/spin_dsa/_core.pyi differs from what nanobind.stubgen writes for the bindings: copy "
        "build/python/<tag>/python/stub/spin_dsa/_core.pyi over it after changing a binding")


def test_stub_covers_the_module():
    tree = ast.parse(COMMITTED.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    names |= {n.target.id for n in tree.body if isinstance(n, ast.AnnAssign)}
    public = {n for n in dir(_core) if not n.startswith("_")}
    assert public <= names, sorted(public - names)
    assert pathlib.Path(spin_dsa.__file__).with_name("py.typed").exists()
    assert set(spin_dsa.__all__) <= set(dir(spin_dsa))
