"""The training job and the benchmark harness moved out of the engine
(``pipeoffload.training``, ``pipeoffload.bench``); the old import paths keep working
for one release, as the same module objects, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from pipeoffload.runtime import MOVED


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_module_path_is_the_moved_module_with_a_warning(old):
    new = MOVED[old]
    code = (f"import warnings, importlib\n"
            f"with warnings.catch_warnings(record=True) as w:\n"
            f"    warnings.simplefilter('always')\n"
            f"    m = importlib.import_module({old!r})\n"
            f"assert m is importlib.import_module({new!r}), m\n"
            f"assert m.__spec__.name == {new!r}, m.__spec__.name\n"
            f"assert any(issubclass(x.category, DeprecationWarning) and {new!r} in str(x.message) for x in w), w\n")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr


def test_the_config_imports_no_torch_under_either_name():
    code = ("import sys, pipeoffload.runtime.config, pipeoffload.training.config\n"
            "assert 'torch' not in sys.modules, 'torch was imported'\n")
    r = subprocess.run([sys.executable, "-W", "ignore::DeprecationWarning", "-c", code], capture_output=True,
                       text=True)
    assert r.returncode == 0, r.stderr


def test_the_lazy_names_point_at_the_new_modules():
    rt = importlib.import_module("pipeoffload.runtime")
    assert rt.TrainConfig.__module__ == "pipeoffload.training.config"
    assert rt.save_checkpoint.__module__ == "pipeoffload.training.checkpoint"
