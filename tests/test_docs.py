"""The examples in the public API's docstrings run and print what they say."""

import doctest
import importlib
import pkgutil

import pytest

import fusetree

MODULES = ["fusetree"] + sorted(
    m.name
    for m in pkgutil.walk_packages(fusetree.__path__, "fusetree.")
    if not m.name.startswith("fusetree.backends.")  # backends import numba/cupy (tested elsewhere)
)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    mod = importlib.import_module(name)
    result = doctest.testmod(mod, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert result.failed == 0, f"{result.failed} docstring example(s) failed in {name}"
