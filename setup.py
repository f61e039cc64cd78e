"""Build hook for the optional C accelerator ``fusetree._native`` (metadata lives in pyproject.toml).

The extension is optional: where no C compiler is available the install goes on and fusetree runs
its pure-Python front end (``fusetree.config.NATIVE`` says which one runs)."""

from setuptools import Extension, setup

setup(ext_modules=[Extension("fusetree._native", ["fusetree/_native.c"], optional=True,
                             extra_compile_args=["-O2"])])  # fmt: skip
