"""Reference model and data for the runtime.

- :class:`ModelConfig` (pure), :func:`layer_ranges`, :func:`balanced_ranges` (pure);
- ``hf``: :func:`split_causal_lm`, :func:`causal_lm_loss` (HuggingFace causal LMs);
  ``split``: :func:`split_by_name` (any module); ``aux_loss``: auxiliary loss terms
  (need torch; ``hf`` needs transformers);
- ``transformer``: :class:`LayerGroup`, :func:`build_stage`, :func:`build_stages`,
  :func:`build_reference`, :func:`lm_loss` (need torch);
- ``data``: :func:`load_corpus`, :class:`ByteCorpus` (need torch).

Torch-using names are imported lazily so ``from pipeoffload.models import ModelConfig``
works without torch.
"""

from __future__ import annotations

from .config import ModelConfig, balanced_ranges, layer_ranges

_LAZY = {
    "LayerGroup": "transformer", "build_stage": "transformer", "build_stages": "transformer",
    "build_reference": "transformer", "lm_loss": "transformer",
    "load_corpus": "data", "ByteCorpus": "data",
}

__all__ = ["ModelConfig", "balanced_ranges", "layer_ranges", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    raise AttributeError(name)
