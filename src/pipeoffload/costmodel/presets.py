"""Model presets: the papers' GPT-3-like models, Llama-style sizes, and the tiny CPU model. Pure Python.

API
---
``PRESETS: dict[str, ModelSpec]`` in listing order; ``preset_names() -> list[str]``.
``get_model(name_or_path, **overrides) -> ModelSpec``: a preset (exact name, case-insensitive) or a
``.toml``/``.json`` file of ``ModelSpec`` fields; ``overrides`` are applied with ``ModelSpec.replace``.
Unknown names raise ParameterError(``model``) listing the valid names.
``load_model(path) -> ModelSpec`` / ``model_from_dict(data, source)``: a model file (flat table with
``ModelSpec`` field names; ``layers, hidden, heads, seq, vocab`` required; ``name`` defaults to the stem).
``TINY``: the runtime's small CPU model (8 layers, h=128, 4 heads, 2 KV groups, SwiGLU FFN 384,
byte-level vocabulary 256, seq 128, microbatch 4, fp32, RMS-norm style, untied head, flash SDPA, eager kernels).
``PO_RUNTIME``: the overrides that describe PipeOffload's runtime (flash attention, no dropout,
recompute of elementwise ops) — the settings behind the closed-form k.

The GPT-3-like presets (ZB and CM papers: FFN 4h, vocabulary 51200, tied embedding) use those papers'
Megatron setting: fp16, no flash attention, dropout on, no recompute — so a preset's layer bytes are
exactly ZB's ``b·s·(34h + 5as)``. Seq and microbatch are the papers' where given, else 1024 and 1.
Llama-style presets: bf16, SwiGLU, vocabulary 32000, untied head, flash attention, seq 4096, microbatch 1;
``llama-405b`` (Llama-3.1-405B's shape, 405.9B parameters) has its own vocabulary 128256 and seq 8192.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .model import ModelSpec
from ..errors import ParameterError
from .hardware import read_table

_GPT = dict(vocab=51200, dtype="fp16", activation="gelu", flash_attention=False, dropout=True,
            recompute_elementwise=False, tie_embeddings=True)
_LLAMA = dict(vocab=32000, seq=4096, microbatch=1, dtype="bf16", activation="swiglu", flash_attention=True,
              dropout=False, recompute_elementwise=False, tie_embeddings=False)

#: Overrides that describe PipeOffload's runtime setting (the closed-form k assumes these).
PO_RUNTIME: dict[str, Any] = dict(flash_attention=True, dropout=False, recompute_elementwise=True)


def _gpt(name: str, layers: int, heads: int, hidden: int, seq: int = 1024, microbatch: int = 1) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, heads=heads, hidden=hidden, seq=seq, microbatch=microbatch, **_GPT)


def _llama(name: str, layers: int, heads: int, hidden: int, ffn: int, kv_groups: int | None = None,
           **over: Any) -> ModelSpec:
    return ModelSpec(name=name, layers=layers, heads=heads, hidden=hidden, ffn=ffn, kv_groups=kv_groups,
                     **{**_LLAMA, **over})


#: The small model the CPU runtime trains (a Llama-style decoder at toy size), described as the
#: reference transformer runs it: PyTorch's SDPA (a flash kernel on CPU too) and plain ops
#: (``kernels="eager"``, what ``ModelConfig.spec`` says of it).
TINY = ModelSpec(
    name="tiny", layers=8, hidden=128, heads=4, kv_groups=2, ffn=384, vocab=256, seq=128, microbatch=4,
    dtype="fp32", activation="swiglu", flash_attention=True, dropout=False, recompute_elementwise=False,
    tie_embeddings=False, kernels="eager",
)

PRESETS: dict[str, ModelSpec] = {
    m.name: m
    for m in (
        # ZB paper (seq 1024; microbatch as published)
        _gpt("1.5B", 22, 24, 2304, microbatch=6),
        _gpt("6.2B", 30, 32, 4096, microbatch=3),
        _gpt("14.6B", 46, 40, 5120),
        _gpt("28.3B", 62, 48, 6144),
        # CM paper (seq 1024 here; it also runs 3072)
        _gpt("9.6B", 30, 40, 5120),
        _gpt("21B", 46, 48, 6144),
        _gpt("38.5B", 62, 64, 7168),
        _gpt("98.5B", 78, 80, 10240),
        # Llama-style
        _llama("llama-7b", 32, 32, 4096, 11008),
        _llama("llama-13b", 40, 40, 5120, 13824),
        _llama("llama-70b", 80, 64, 8192, 28672, kv_groups=8),
        # Llama-3.1-405B's shape (its published config: 126 layers, hidden 16384, 128 heads, 8 KV
        # heads, FFN 53248, vocabulary 128256; pre-trained at sequence 8192)
        _llama("llama-405b", 126, 128, 16384, 53248, kv_groups=8, vocab=128256, seq=8192),
        TINY,
    )
}

_FIELDS = {f.name: f for f in dataclasses.fields(ModelSpec)}
_REQUIRED = ("layers", "hidden", "heads", "seq", "vocab")


def preset_names() -> list[str]:
    return list(PRESETS)


def model_from_dict(data: dict[str, Any], source: str = "<dict>", default_name: str = "custom") -> ModelSpec:
    """A ModelSpec from a flat table of field names; errors name the key and ``source``."""
    unknown = sorted(set(data) - set(_FIELDS))
    if unknown:
        raise ParameterError(
            "model", f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; valid keys are {', '.join(_FIELDS)}"
        )
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ParameterError("model", f"{source}: missing key(s) {', '.join(map(repr, missing))}")
    kwargs = {"name": default_name, **data}
    try:
        return ModelSpec(**kwargs)
    except ParameterError as e:
        raise ParameterError("model", f"{source}: key {e.param!r}: {e.message}") from None


def load_model(path: str | Path) -> ModelSpec:
    p = Path(path)
    return model_from_dict(read_table(p, "model"), source=str(p), default_name=p.stem)


def get_model(name_or_path: str | Path | ModelSpec, **overrides: Any) -> ModelSpec:
    """A preset by name (case-insensitive), a model file, or a ModelSpec; then ``overrides``."""
    if isinstance(name_or_path, ModelSpec):
        model = name_or_path
    else:
        key = str(name_or_path).strip()
        lower = {k.lower(): v for k, v in PRESETS.items()}
        if key.lower() in lower:
            model = lower[key.lower()]
        else:
            p = Path(key)
            if p.suffix.lower() in (".toml", ".json") or p.exists():
                model = load_model(p)
            else:
                raise ParameterError(
                    "model", f"unknown model {key!r}; valid names are {', '.join(PRESETS)} (or a .toml/.json file)"
                )
    unknown = sorted(set(overrides) - set(_FIELDS))
    if unknown:
        raise ParameterError("model", f"unknown field(s) {', '.join(unknown)}; valid: {', '.join(_FIELDS)}")
    return model.replace(**overrides) if overrides else model
