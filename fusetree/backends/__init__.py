"""Backends: the only place fusetree imports numba or cupy.

``get(device)`` returns the backend object for a device name ("cpu", "cuda", "cuda-sim"), importing
it on first use. ``device_of(obj)`` tells which device an array-like lives on without importing
cupy or numba.
"""

from __future__ import annotations

import importlib
import threading
from typing import Any

from ..errors import DeviceError

DEVICES = ("cpu", "cuda", "cuda-sim")
_backends: dict[str, Any] = {}
_lock = threading.Lock()


def get(device: str) -> Any:
    """The backend for ``device``; raises DeviceError for unknown or unavailable devices."""
    b = _backends.get(device)
    if b is not None:
        return b
    if device not in DEVICES:
        raise DeviceError(f"unknown device {device!r}; fusetree devices are {DEVICES}")
    with _lock:
        b = _backends.get(device)
        if b is None:
            mod = {"cpu": "cpu", "cuda": "cuda", "cuda-sim": "cudasim"}[device]
            b = importlib.import_module(f"{__name__}.{mod}").make_backend()
            _backends[device] = b
    return b


def xp_for(device: str) -> Any:
    """The array module of ``device`` (NumPy for host devices: no numba import needed)."""
    if device in ("cpu", "cuda-sim", ""):
        import numpy as np

        return np
    return get(device).xp


def codegen_target(target: str) -> tuple[Any, Any]:
    """(codegen Target, ptx_fn or None) of a target name, without needing its device."""
    if target == "cuda":
        from . import cuda

        return cuda.TARGET, cuda.compile_ptx
    if target == "cuda-sim":
        from ..codegen.common import Target

        return Target("cuda-sim"), None
    from .cpu import TARGET

    return TARGET, None


def loaded() -> list[str]:
    return sorted(_backends)


def device_of(obj: Any) -> str | None:
    """'cpu' for NumPy arrays, 'cuda' for CUDA arrays (CuPy, numba, torch via CAI/DLPack), else None."""
    import numpy as np

    if isinstance(obj, np.ndarray):
        return "cpu"
    if hasattr(obj, "__cuda_array_interface__"):
        return "cuda"
    mod = type(obj).__module__ or ""
    if mod.startswith("torch") and hasattr(obj, "device"):
        return "cuda" if getattr(obj.device, "type", "") == "cuda" else "cpu"
    return None
