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
