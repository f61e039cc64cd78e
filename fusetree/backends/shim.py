"""Environment fixes needed before numba.cuda is imported."""

from __future__ import annotations


def numpy_shim() -> None:
    """numba-cuda 0.30.4 calls ``np.row_stack``, which NumPy 2.5 removed (NVIDIA/numba-cuda#907).

    Guarded: only adds the alias where it is missing, before numba.cuda is imported.
    """
    import numpy as np

    if not hasattr(np, "row_stack"):
        np.row_stack = np.vstack  # type: ignore[attr-defined]
