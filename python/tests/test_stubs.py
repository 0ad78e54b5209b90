"""The type stubs (_core.pyi) name every public function and class of the module, and parse."""
import ast
import pathlib

import spin_dsa
from spin_dsa import _core


def test_stub_covers_the_module():
    stub = pathlib.Path(spin_dsa.__file__).with_name("_core.pyi")
    tree = ast.parse(stub.read_text())
    names = {n.name for n in tree.body if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    public = {n for n in dir(_core) if not n.startswith("_")}
    assert public <= names, sorted(public - names)
    assert pathlib.Path(spin_dsa.__file__).with_name("py.typed").exists()
    assert set(spin_dsa.__all__) <= set(dir(spin_dsa))
