"""The package's own modules import each other without a cycle — lazy (function-level) imports
included, since a cycle there still ties the modules' initialisation and review together (issue
32: device_path → indexer_op → state → device_path was one). Read from the sources, so it needs
neither torch nor vLLM."""

import ast
import pathlib

PACKAGE = pathlib.Path(__file__).resolve().parents[1] / "spin_dsa"


def _module_name(path):
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path, name):
    """The spin_dsa modules `path` (module `name`) imports, anywhere in the file."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
            else:
                target = node.module or ""
            candidates = [target] + [f"{target}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            candidates = [a.name for a in node.names]
        else:
            continue
        found.update(c for c in candidates if c.startswith("spin_dsa"))
    return found


def test_the_package_has_no_import_cycle():
    modules = {_module_name(p): p for p in PACKAGE.rglob("*.py")}
    graph = {m: {t for t in _imports(p, m) if t in modules and t != m} for m, p in modules.items()}
    # A package's __init__ may import its submodules; a submodule importing its package's
    # __init__ (for shared names) is the usual Python shape and not a cycle of ours.
    for m in graph:
        graph[m] = {t for t in graph[m] if not m.startswith(t + ".")}
    done, on_path = set(), []

    def visit(m):
        if m in on_path:
            cycle = on_path[on_path.index(m):] + [m]
            raise AssertionError("import cycle: " + " → ".join(cycle))
        if m in done:
            return
        on_path.append(m)
        for t in sorted(graph[m]):
            visit(t)
        on_path.pop()
        done.add(m)

    for m in sorted(graph):
        visit(m)
