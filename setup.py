"""The optional C extension: the package's per-op loops (src/pipeoffload/_engine.c, which
includes the parts in src/pipeoffload/engine_c/).

Everything else is in pyproject.toml. ``optional=True``: where no C compiler is found the
install goes on without it, and the package runs the same loops in Python (the same results,
only slower; pipeoffload.native chooses)."""
from glob import glob

from setuptools import Extension, setup

setup(ext_modules=[Extension("pipeoffload._engine", ["src/pipeoffload/_engine.c"],
                             depends=sorted(glob("src/pipeoffload/engine_c/*.c")), optional=True)])
