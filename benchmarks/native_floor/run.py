"""How cheap could a compiled front end make an operator? A measurement, not part of fusetree.

``floor.c`` is a minimal C extension with the same work per binary operator as fusetree's Python
fast path (``frontend/array.py``: the dtype rule looked up, an op node with an interned structural
key, the merged leaf tuple, flags and masks, and the result registered as pending through a weakref
in a dict). This script compiles it into a temporary directory (setuptools, the system C compiler)
and times ``a * b`` and ``a * b + c`` against fusetree's operators and NumPy's ``a * b`` in one run
(best of repeats, interleaved)::

    python benchmarks/native_floor/run.py

Stop 35, this 2-core VM (Python 3.11), two runs minutes apart (the VM's speed drifts): C floor
0.65 / 1.18 us, fusetree 2.32 / 4.95 us, NumPy a*b on 4096 float32 (computed) 1.11 us; and C
1.11 / 2.08, fusetree 3.83 / 8.12, NumPy 1.58: the compiled operator 3.5-4x cheaper.
"""

from __future__ import annotations

import os
import sys
import tempfile
import timeit

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", ".."))


def build(tmp: str) -> None:
    from setuptools import Extension
    from setuptools.dist import Distribution

    ext = Extension("floor", [os.path.join(HERE, "floor.c")], extra_compile_args=["-O2"])
    dist = Distribution({"name": "floor", "ext_modules": [ext]})
    cmd = dist.get_command_obj("build_ext")
    cmd.build_lib = cmd.build_temp = tmp
    cmd.ensure_finalized()
    cmd.run()
    sys.path.insert(0, tmp)


def main() -> None:
    import fusetree as ft

    with tempfile.TemporaryDirectory() as tmp:
        build(tmp)
        import floor  # type: ignore[import-not-found]

        f32 = np.dtype(np.float32)
        floor.RULES[("multiply", f32, f32)] = f32
        floor.RULES[("add", f32, f32)] = f32
        pa, pb, pc = (floor.leaf(f32, (4096,), "cpu") for _ in range(3))
        fa, fb, fc = (ft.asarray(np.ones(4096, np.float32)) for _ in range(3))
        na, nb = np.ones(4096, np.float32), np.ones(4096, np.float32)
        cases = [
            ("C floor a*b", lambda: pa * pb),
            ("fusetree a*b", lambda: fa * fb),
            ("C floor a*b+c", lambda: pa * pb + pc),
            ("fusetree a*b+c", lambda: fa * fb + fc),
            ("numpy a*b (4096 float32, computed)", lambda: na * nb),
        ]
        best: dict[str, float] = {}
        for _ in range(5):
            for name, fn in cases:
                us = min(timeit.repeat(fn, number=20000, repeat=3)) / 20000 * 1e6
                best[name] = min(us, best.get(name, us))
        for name, us in best.items():
            print(f"{name:36s} {us:6.2f} us")


if __name__ == "__main__":
    main()
