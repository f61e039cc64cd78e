"""Layers: building trees never imports numba or cupy; only fusetree/backends does."""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def test_front_end_imports_no_numba():
    code = (
        "import sys, numpy as np, fusetree as ft\n"
        "x = ft.asarray(np.ones((3, 4), np.float32))\n"
        "y = ft.sigmoid(x[:, ::2]) * 2 + ft.asarray(np.ones(2, np.float32))\n"
        "dot = ft.to_dot(y)\n"
        "assert 'digraph' in dot\n"
        "bad = [m for m in sys.modules if m.split('.')[0] in ('numba', 'cupy', 'llvmlite')]\n"
        "print(bad)\n"
        "assert not bad, bad\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr


def test_only_backends_import_numba_or_cupy():
    for path in (ROOT / "fusetree").rglob("*.py"):
        if "backends" in path.parts:
            continue
        text = path.read_text()
        for mod in ("numba", "cupy", "llvmlite"):
            assert f"import {mod}" not in text and f"from {mod}" not in text, (path, mod)


def _imports() -> dict[str, set[str]]:
    """Module -> fusetree modules it imports (module level and inside functions; not under
    ``if TYPE_CHECKING:``)."""
    import ast

    pkg = ROOT / "fusetree"
    modules = {}
    for path in pkg.rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        modules[".".join(parts)] = path
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        is_pkg = path.name == "__init__.py"
        here = name if is_pkg else name.rsplit(".", 1)[0]
        tree = ast.parse(path.read_text())
        skip = set()
        for node in ast.walk(tree):
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(n) for n in ast.walk(node))
        deps: set[str] = set()
        for node in ast.walk(tree):
            if id(node) in skip:
                continue
            if isinstance(node, ast.Import):
                deps.update(a.name for a in node.names if a.name.startswith("fusetree"))
            elif isinstance(node, ast.ImportFrom):
                base = here
                for _ in range(node.level - 1):
                    base = base.rsplit(".", 1)[0]
                mod = (
                    (base + "." + node.module if node.module else base) if node.level else (node.module or "")
                )
                if not mod.startswith("fusetree"):
                    continue
                for a in node.names:
                    sub = f"{mod}.{a.name}"
                    deps.add(sub if sub in modules else mod)
        graph[name] = {d for d in deps if d in modules and d != name}
    return graph


def test_no_import_cycles_among_modules():
    graph = _imports()
    color: dict[str, int] = {}
    path: list[str] = []

    def visit(m: str) -> None:
        color[m] = 1
        path.append(m)
        for d in sorted(graph[m]):
            if d == "fusetree" or m == "fusetree":
                continue  # the top-level package imports the public API from everywhere
            if color.get(d) == 1:
                cycle = path[path.index(d) :] + [d]
                raise AssertionError("import cycle: " + " -> ".join(cycle))
            if d not in color:
                visit(d)
        path.pop()
        color[m] = 2

    for m in sorted(graph):
        if m not in color:
            visit(m)
    # the layers: the front end and the IR never import the engine's internals or a backend module
    for m, deps in graph.items():
        if m.startswith(("fusetree.ir", "fusetree.schedule", "fusetree.codegen")):
            bad = [
                d for d in deps if d.startswith(("fusetree.engine", "fusetree.frontend", "fusetree.backends"))
            ]
            assert not bad, (m, bad)
