"""The optional C extension: the timing engine's per-op loops (src/pipeoffload/_engine.c).

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is found the
install goes on without it, and pipeoffload.passes.timing runs the same loops in Python
(the same floats, only slower)."""
from setuptools import Extension, setup

setup(ext_modules=[Extension("pipeoffload._engine", ["src/pipeoffload/_engine.c"], optional=True)])
