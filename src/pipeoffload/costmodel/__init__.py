"""The analytic cost model: what a model costs on given hardware, without running it.

- ``model``: :class:`ModelSpec` (a transformer and its microbatch) → per-layer FLOPs,
  saved activation bytes and parameter bytes; layer groups and the simulator's inputs
  (:func:`pipeline_costs`); the offload ratio k (:func:`k_closed_form`, :func:`k_from_model`);
- ``hardware``: :class:`Hardware` profiles (compute rate, device memory, host link,
  inter-stage link) and profile files;
- ``presets``: the papers' model shapes and the Llama-style ones, and model files.

Pure Python (no torch). See ``docs/cost-model.md``.
"""

from .hardware import HARDWARE, Hardware, get_hardware, load_hardware
from .model import ModelSpec, PipelineCosts, k_closed_form, k_from_model, pipeline_costs
from .presets import PRESETS, get_model

__all__ = ["ModelSpec", "PipelineCosts", "pipeline_costs", "k_closed_form", "k_from_model",
           "Hardware", "HARDWARE", "get_hardware", "load_hardware", "PRESETS", "get_model"]
