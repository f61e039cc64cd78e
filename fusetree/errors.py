"""Exception types. Every error fusetree raises is one of these (or a NumPy-compatible builtin)."""

from __future__ import annotations


class FusetreeError(Exception):
    """Base class of all fusetree errors."""


class ShapeError(FusetreeError, ValueError):
    """Operand shapes cannot be broadcast together, or a reshape/index does not fit."""


class DTypeError(FusetreeError, TypeError):
    """An unsupported dtype, or an op that is not defined for the given dtypes."""


class DeviceError(FusetreeError, ValueError):
    """Operands live on different devices, or a device is unknown or unavailable."""


class UnsupportedError(FusetreeError, TypeError):
    """An object, index or operation fusetree does not support."""


class CompileError(FusetreeError, RuntimeError):
    """A generated kernel failed to compile. The message names the kernel and its source file."""
