"""Hardware profiles for the analytic cost model. Pure Python.

API
---
``Hardware(name, compute_rate, hbm_bytes, host_bw, link_bw, link_latency=0.0, note="")``
    One accelerator as the cost model sees it, in SI units: ``compute_rate`` is the *achieved* dense
    matmul rate in FLOP/s (16-bit), ``hbm_bytes`` the device memory in bytes, ``host_bw`` the achieved
    one-direction device↔host bandwidth in bytes/s (what an offload or a reload moves at),
    ``link_bw`` the achieved inter-stage (P2P) bandwidth in bytes/s, ``link_latency`` seconds per hop.
``HARDWARE``: ``{"a100-80g", "h100-80g", "h200"}`` → built-in profiles.
``hardware_names() -> list[str]``
``get_hardware(name_or_path) -> Hardware``: a built-in name, or a path to a ``.toml``/``.json`` profile.
``load_hardware(path) -> Hardware``: read a profile file (format below).
``hardware_from_dict(data, source="<dict>") -> Hardware``: the same from a mapping of file keys.
``read_table(path, param) -> dict``: read one flat TOML or JSON table (shared with model files).

Profile files use human units, one flat table::

    name = "my-gpu"          # optional, default: the file's stem
    compute_tflops = 300     # achieved dense 16-bit matmul TFLOP/s (1e12)
    hbm_gib = 80             # device memory, GiB (2**30 bytes)
    host_link_gbs = 20       # achieved device<->host GB/s (1e9), one direction
    interstage_gbs = 50      # achieved P2P GB/s between adjacent pipeline stages
    link_latency_us = 10     # optional, per P2P hop, microseconds (default 0)
    note = "..."             # optional free text

A missing required key, an unknown key, or a value that is not a positive number raises
:class:`~pipeoffload.errors.ParameterError` (param ``hardware``) naming the key and the file.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from ..errors import ParameterError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

GiB = 2**30
GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """One accelerator: achieved matmul rate, memory, host link and inter-stage link (SI units)."""

    name: str
    compute_rate: float  # FLOP/s achieved on dense 16-bit matmuls
    hbm_bytes: float  # device memory, bytes
    host_bw: float  # device<->host, bytes/s, one direction
    link_bw: float  # stage-to-stage P2P, bytes/s
    link_latency: float = 0.0  # s per P2P hop
    note: str = ""

    def __post_init__(self) -> None:
        for key in ("compute_rate", "hbm_bytes", "host_bw", "link_bw"):
            x = getattr(self, key)
            if not isinstance(x, (int, float)) or isinstance(x, bool) or not math.isfinite(x) or x <= 0:
                raise ParameterError("hardware", f"{self.name}: {key} must be a positive number, got {x!r}")
        lat = self.link_latency
        if not isinstance(lat, (int, float)) or isinstance(lat, bool) or not math.isfinite(lat) or lat < 0:
            raise ParameterError("hardware", f"{self.name}: link_latency must be a number >= 0, got {lat!r}")

    def to_dict(self) -> dict[str, Any]:
        """The profile in the file format's keys and units (round-trips through ``hardware_from_dict``)."""
        return {
            "name": self.name,
            "compute_tflops": self.compute_rate / 1e12,
            "hbm_gib": self.hbm_bytes / GiB,
            "host_link_gbs": self.host_bw / GB,
            "interstage_gbs": self.link_bw / GB,
            "link_latency_us": self.link_latency * 1e6,
            "note": self.note,
        }


def _profile(name: str, tflops: float, hbm_gib: float, host_gbs: float, link_gbs: float,
             latency_us: float, note: str) -> Hardware:
    return Hardware(name, tflops * 1e12, hbm_gib * GiB, host_gbs * GB, link_gbs * GB, latency_us / 1e6, note)


#: Built-in profiles. Compute and host-link numbers for A100/H100 are PipeOffload's (docs/algorithms.md#51-the-offload-ratio-k).
#: The inter-stage link is calibrated on ZB's measured T_comm = 0.601 ms for the 1.5B model
#: (6·1024·2304·2 B = 28.3 MB per hop: 50 GB/s + 10 µs gives 0.58 ms) and scaled 1.5× for NVLink 4.
HARDWARE: dict[str, Hardware] = {
    "a100-80g": _profile(
        "a100-80g", 220, 80, 15, 50, 10,
        "A100 SXM 80GB: 220 TFLOP/s achieved bf16 and 15 GB/s host link (PipeOffload's figures)",
    ),
    "h100-80g": _profile(
        "h100-80g", 440, 80, 21, 75, 10,
        "H100 SXM 80GB: 440 TFLOP/s achieved bf16 and 21 GB/s host link (PipeOffload's figures)",
    ),
    "h200": _profile(
        "h200", 440, 140, 21, 75, 10,
        "H200 SXM 141GB: same GH100 compute as H100 (matmuls are compute-bound, so HBM3e's extra "
        "bandwidth barely moves the achieved rate), the same PCIe Gen5 host path on the HGX board as "
        "H100 (so the same 21 GB/s), the same NVLink 4; only memory grows (~140 GiB usable)",
    ),
}

_REQUIRED = ("compute_tflops", "hbm_gib", "host_link_gbs", "interstage_gbs")
_OPTIONAL = ("name", "link_latency_us", "note")


def hardware_names() -> list[str]:
    return list(HARDWARE)


def read_table(path: str | Path, param: str) -> dict[str, Any]:
    """Read one flat table from a ``.toml`` or ``.json`` file (other suffixes: tried as JSON, then TOML).

    Raises ParameterError(param) for a missing file, a parse error, or a top level that is not a table.
    """
    p = Path(path)
    try:
        text = p.read_text()
    except FileNotFoundError:
        raise ParameterError(param, f"file not found: {p}") from None
    except OSError as e:
        raise ParameterError(param, f"cannot read {p}: {e.strerror or e}") from None
    suffix = p.suffix.lower()
    data: Any
    if suffix == ".toml":
        data = _parse_toml(text, p, param)
    elif suffix == ".json":
        data = _parse_json(text, p, param)
    else:
        try:
            data = json.loads(text)
        except json.JSONDecodeError:
            data = _parse_toml(text, p, param)
    if not isinstance(data, dict):
        raise ParameterError(param, f"{p}: expected a table of key = value pairs, got {type(data).__name__}")
    return data


def _parse_toml(text: str, p: Path, param: str) -> Any:
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ParameterError(param, f"{p} is not valid TOML: {e}") from None


def _parse_json(text: str, p: Path, param: str) -> Any:
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise ParameterError(param, f"{p} is not valid JSON: {e}") from None


def _number(data: Mapping[str, Any], key: str, source: str, minimum_exclusive: bool = True) -> float:
    x = data[key]
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    ok = ok and (x > 0 if minimum_exclusive else x >= 0)
    if not ok:
        what = "a positive number" if minimum_exclusive else "a number >= 0"
        raise ParameterError("hardware", f"{source}: key {key!r} must be {what}, got {x!r}")
    return float(x)


def hardware_from_dict(data: Mapping[str, Any], source: str = "<dict>", default_name: str = "custom") -> Hardware:
    """Build a profile from file keys (see the module docstring); errors name the key and ``source``."""
    unknown = sorted(set(data) - set(_REQUIRED) - set(_OPTIONAL))
    if unknown:
        raise ParameterError(
            "hardware",
            f"{source}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"valid keys are {', '.join(_REQUIRED + _OPTIONAL)}",
        )
    missing = [k for k in _REQUIRED if k not in data]
    if missing:
        raise ParameterError(
            "hardware", f"{source}: missing key(s) {', '.join(map(repr, missing))} (required: {', '.join(_REQUIRED)})"
        )
    name = data.get("name", default_name)
    note = data.get("note", "")
    for key, val in (("name", name), ("note", note)):
        if not isinstance(val, str) or (key == "name" and not val.strip()):
            raise ParameterError("hardware", f"{source}: key {key!r} must be a non-empty string, got {val!r}")
    latency = _number(data, "link_latency_us", source, minimum_exclusive=False) if "link_latency_us" in data else 0.0
    return _profile(
        name,
        _number(data, "compute_tflops", source),
        _number(data, "hbm_gib", source),
        _number(data, "host_link_gbs", source),
        _number(data, "interstage_gbs", source),
        latency,
        note,
    )


def load_hardware(path: str | Path) -> Hardware:
    """Read a profile from a TOML or JSON file; the name defaults to the file's stem."""
    p = Path(path)
    return hardware_from_dict(read_table(p, "hardware"), source=str(p), default_name=p.stem)


def get_hardware(name_or_path: str | Path | Hardware) -> Hardware:
    """A built-in profile by name (case-insensitive), a profile file, or a Hardware passed through."""
    if isinstance(name_or_path, Hardware):
        return name_or_path
    key = str(name_or_path).strip().lower()
    if key in HARDWARE:
        return HARDWARE[key]
    p = Path(name_or_path)
    if p.suffix.lower() in (".toml", ".json") or p.exists():
        return load_hardware(p)
    raise ParameterError(
        "hardware",
        f"unknown hardware {str(name_or_path)!r}; valid names are {', '.join(HARDWARE)} "
        "(or a path to a .toml/.json profile)",
    )
