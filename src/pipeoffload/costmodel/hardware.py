"""Hardware profiles for the analytic cost model. Pure Python.

API
---
``Hardware(name, compute_rate, hbm_bytes, host_bw, link_bw, link_latency=0.0, note="")``
    One accelerator as the cost model sees it, in SI units: ``compute_rate`` is the *achieved* dense
    matmul rate in FLOP/s (16-bit), ``hbm_bytes`` the device memory in bytes, ``host_bw`` the achieved
    one-direction device↔host bandwidth in bytes/s (what an offload or a reload moves at),
    ``link_bw`` the achieved inter-stage (P2P) bandwidth in bytes/s, ``link_latency`` seconds per hop.
``HARDWARE``: ``{"a100-80g", "h100-80g", "h200", "cpu"}`` → built-in profiles.
``default_reserve(hbm_bytes)``; ``Hardware.default_budget``: device memory minus the reserve.
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
    # optional, all in the units their names say (docs/cost-model.md#hardware-profiles):
    peak_tflops = 312        # nominal dense peak (MFU denominator)
    hbm_gbs = 2000           # HBM bandwidth (prices recomputation)
    tp_busbw_gbs = 230       # NCCL all-reduce bus bandwidth inside a node (TP collectives)
    internode_gbs = 22       # P2P between nodes (a pipeline hop that crosses nodes)
    dp_intra_busbw_gbs = 230 # DP all-reduce bus bandwidth, DP group inside a node
    dp_inter_busbw_gbs = 22  # DP all-reduce bus bandwidth, DP group across nodes
    pinned_host_gib = 1024   # pinned host memory per node available to offload
    reserve_gib = 6          # device memory kept out of the default budget
    gpus_per_node = 8
    host_link_gpus = 2       # GPUs (consecutive ids) sharing one host link
    gemm_half_width = 128    # sharded GEMM width at which it runs at half its large-GEMM rate
    tp_overlap = 0.5         # fraction of the backward's TP collectives hidden
    shape_efficiency = true  # compute_tflops is a large GEMM's; every GEMM at w/(w+gemm_half_width)
    elementwise_f_passes = 4.6  # memory-bound passes over the bytes F writes, in F (needs hbm_gbs)
    elementwise_b_passes = 4.0  # the same in B
    p2p_exposed = 1.0        # fraction of a stage-to-stage hop an F or B holds its stage for
    allocator_overhead = 0.05  # caching allocator's reserve on top of what is allocated
    calibration = "..."      # how far the profile was from measurements (printed by `plan`)

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

from ..errors import ParameterError, read_input

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

GiB = 2**30
GB = 1e9


@dataclass(frozen=True)
class Hardware:
    """One accelerator and its node: achieved rates, memory, links and their topology (SI units).

    Required: ``compute_rate`` (achieved dense 16-bit FLOP/s on large matmuls), ``hbm_bytes``,
    ``host_bw`` (achieved one-direction pinned device<->host bytes/s of **one host link used by one
    GPU alone**), ``link_bw`` (achieved intra-node stage-to-stage P2P bytes/s), ``link_latency``.
    Optional (``None`` = derived, see :func:`pipeoffload.planner.sharding.node_profile`):
    ``peak_rate`` (nominal FLOP/s, the MFU denominator), ``hbm_bw``, ``tp_bw`` (NCCL all-reduce
    *bus* bandwidth inside a node: what a TP collective moves at), ``internode_bw`` (P2P between
    nodes), ``dp_intra_bw``/``dp_inter_bw`` (all-reduce bus bandwidth of a DP group inside / across
    nodes), ``pinned_host_bytes`` (pinned host memory one node can give to offload; ``None`` =
    unchecked), ``reserve_bytes`` (device memory kept out of the default budget; ``None`` = the
    rule of :func:`default_reserve`). Topology: ``gpus_per_node``; ``host_link_gpus`` GPUs with
    consecutive device ids share one host link (a PCIe switch). Efficiency: ``gemm_half_width``
    (a GEMM whose sharded width is w runs at ``w / (w + gemm_half_width)`` of what it runs at
    unsharded; 0 = no loss), ``tp_overlap`` (fraction of the backward's TP collectives hidden behind
    the weight-gradient GEMMs, as Megatron overlaps them). Calibration (docs/planner.md §8):
    ``shape_efficiency`` (``compute_rate`` is a large GEMM's rate and every GEMM runs at
    ``w / (w + gemm_half_width)`` of it, ``w`` its smallest dimension), ``elementwise_f`` /
    ``elementwise_b`` (memory-bound passes over the bytes F writes, at ``hbm_bw``, added to F / B),
    ``p2p_exposed`` (fraction of a stage-to-stage hop an F or B holds its stage for: 1 for a runtime
    with blocking send-and-wait P2P such as Megatron's, 0 for one that posts P2P ahead as pipeoffload's does),
    ``allocator_overhead`` (what the caching allocator reserves on top of the live bytes,
    :meth:`reserved`), ``calibration`` (how far the profile was from measurements, a sentence).
    """

    name: str
    compute_rate: float  # FLOP/s achieved on dense 16-bit matmuls
    hbm_bytes: float  # device memory, bytes
    host_bw: float  # device<->host, bytes/s, one direction, one GPU alone on its host link
    link_bw: float  # stage-to-stage P2P inside a node, bytes/s
    link_latency: float = 0.0  # s per P2P hop
    note: str = ""
    peak_rate: float | None = None
    hbm_bw: float | None = None
    tp_bw: float | None = None
    internode_bw: float | None = None
    dp_intra_bw: float | None = None
    dp_inter_bw: float | None = None
    pinned_host_bytes: float | None = None
    reserve_bytes: float | None = None
    gpus_per_node: int = 8
    host_link_gpus: int = 1
    gemm_half_width: float = 0.0
    tp_overlap: float = 0.0
    shape_efficiency: bool = False
    elementwise_f: float = 0.0
    elementwise_b: float = 0.0
    allocator_overhead: float = 0.05
    p2p_exposed: float = 0.0
    calibration: str = ""

    def __post_init__(self) -> None:
        for key in ("compute_rate", "hbm_bytes", "host_bw", "link_bw"):
            x = getattr(self, key)
            if not _is_number(x) or x <= 0:
                raise ParameterError("hardware", f"{self.name}: {key} must be a positive number, got {x!r}")
        for key in _OPTIONAL_RATES:
            x = getattr(self, key)
            if x is not None and (not _is_number(x) or x <= 0):
                raise ParameterError("hardware", f"{self.name}: {key} must be a positive number, got {x!r}")
        for key in ("link_latency", "gemm_half_width", "elementwise_f", "elementwise_b", "allocator_overhead",
                    "p2p_exposed"):
            x = getattr(self, key)
            if not _is_number(x) or x < 0:
                raise ParameterError("hardware", f"{self.name}: {key} must be a number >= 0, got {x!r}")
        if self.reserve_bytes is not None and (not _is_number(self.reserve_bytes) or self.reserve_bytes < 0
                                               or self.reserve_bytes >= self.hbm_bytes):
            raise ParameterError("hardware", f"{self.name}: reserve must be >= 0 and below the device memory, "
                                             f"got {self.reserve_bytes!r}")
        if (self.elementwise_f or self.elementwise_b) and self.hbm_bw is None:
            raise ParameterError("hardware", f"{self.name}: elementwise passes need hbm_gbs (the HBM bandwidth "
                                             "the memory-bound ops run at)")
        if not isinstance(self.shape_efficiency, bool):
            raise ParameterError("hardware", f"{self.name}: shape_efficiency must be true or false, "
                                             f"got {self.shape_efficiency!r}")
        if not isinstance(self.calibration, str):
            raise ParameterError("hardware", f"{self.name}: calibration must be a string, got {self.calibration!r}")
        if not _is_number(self.tp_overlap) or not 0 <= self.tp_overlap <= 1:
            raise ParameterError("hardware", f"{self.name}: tp_overlap must be in [0, 1], got {self.tp_overlap!r}")
        for key in ("gpus_per_node", "host_link_gpus"):
            x = getattr(self, key)
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise ParameterError("hardware", f"{self.name}: {key} must be an integer >= 1, got {x!r}")
        if self.gpus_per_node % self.host_link_gpus:
            raise ParameterError("hardware", f"{self.name}: host_link_gpus ({self.host_link_gpus}) must divide "
                                             f"gpus_per_node ({self.gpus_per_node})")

    @property
    def reserve(self) -> float:
        """Bytes of device memory the default budget leaves free (:func:`default_reserve`)."""
        if self.reserve_bytes is not None:
            return self.reserve_bytes
        return default_reserve(self.hbm_bytes, self.allocator_overhead)

    def reserved(self, allocated: float) -> float:
        """What the caching allocator holds (``torch.cuda.max_memory_reserved``) for ``allocated``
        bytes of live tensors: ``allocated · (1 + allocator_overhead)`` (fragmentation)."""
        return allocated * (1.0 + self.allocator_overhead)

    @property
    def default_budget(self) -> float:
        """The planner's default per-device budget: device memory minus :attr:`reserve`."""
        return self.hbm_bytes - self.reserve

    def to_dict(self) -> dict[str, Any]:
        """The profile in the file format's keys and units (round-trips through ``hardware_from_dict``)."""
        out: dict[str, Any] = {
            "name": self.name,
            "compute_tflops": self.compute_rate / 1e12,
            "hbm_gib": self.hbm_bytes / GiB,
            "host_link_gbs": self.host_bw / GB,
            "interstage_gbs": self.link_bw / GB,
            "link_latency_us": self.link_latency * 1e6,
            "note": self.note,
            "gpus_per_node": self.gpus_per_node,
            "host_link_gpus": self.host_link_gpus,
            "gemm_half_width": self.gemm_half_width,
            "tp_overlap": self.tp_overlap,
            "shape_efficiency": self.shape_efficiency,
            "elementwise_f_passes": self.elementwise_f,
            "elementwise_b_passes": self.elementwise_b,
            "allocator_overhead": self.allocator_overhead,
            "p2p_exposed": self.p2p_exposed,
            "calibration": self.calibration,
        }
        for key, (file_key, unit) in _OPTIONAL_FILE.items():
            x = getattr(self, key)
            if x is not None:
                out[file_key] = x / unit
        return out


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


#: Optional rate/size fields: attribute -> (file key, unit of the file value).
_OPTIONAL_FILE: dict[str, tuple[str, float]] = {
    "peak_rate": ("peak_tflops", 1e12), "hbm_bw": ("hbm_gbs", GB), "tp_bw": ("tp_busbw_gbs", GB),
    "internode_bw": ("internode_gbs", GB), "dp_intra_bw": ("dp_intra_busbw_gbs", GB),
    "dp_inter_bw": ("dp_inter_busbw_gbs", GB), "pinned_host_bytes": ("pinned_host_gib", GiB),
    "reserve_bytes": ("reserve_gib", GiB),
}
_OPTIONAL_RATES = tuple(k for k in _OPTIONAL_FILE if k != "reserve_bytes")

#: The default reserve (docs/cost-model.md#memory-reserve): a fixed part outside PyTorch's
#: allocator (CUDA context, kernel images, the communicators' buffers), and the caching allocator's
#: overhead on what is allocated (``Hardware.allocator_overhead``, 5 % by default).
RESERVE_FIXED_BYTES = 2 * GiB
RESERVE_FRACTION = 0.05


def default_reserve(hbm_bytes: float, allocator_overhead: float = RESERVE_FRACTION) -> float:
    """Device memory the planner keeps free: the budget ``B`` for live tensors is what leaves the
    allocator's overhead room in what the fixed part leaves, ``B · (1 + overhead) = HBM − 2 GiB``;
    the reserve is ``HBM − B`` (5.7 GiB of 80 at 5 %): CUDA context and kernels (~0.5–1 GiB), NCCL
    buffers of the TP, PP and DP communicators (~1 GiB), and the allocator's fragmentation.
    Capped at half the memory for small devices."""
    budget = (hbm_bytes - RESERVE_FIXED_BYTES) / (1.0 + allocator_overhead)
    return min(hbm_bytes - budget, 0.5 * hbm_bytes)


def _profile(name: str, tflops: float, hbm_gib: float, host_gbs: float, link_gbs: float,
             latency_us: float, note: str, **extra: Any) -> Hardware:
    return Hardware(name, tflops * 1e12, hbm_gib * GiB, host_gbs * GB, link_gbs * GB, latency_us / 1e6, note,
                    **extra)


def _hgx(peak_tflops: float, hbm_tbs: float, tp_busbw_gbs: float, nic_gbs: float, gemm_half_width: float,
         ) -> dict[str, Any]:
    """The optional fields of an 8-GPU HGX/DGX node (docs/cost-model.md#hardware-profiles): two GPUs
    per PCIe switch share one host link, 1 TiB of pinned host memory per node (half of a DGX's
    2 TiB), one NIC per GPU (a DP ring with one GPU per node runs at one NIC's rate), Megatron's
    backward TP overlap (half of the backward's collectives hidden)."""
    return dict(peak_rate=peak_tflops * 1e12, hbm_bw=hbm_tbs * 1e12, tp_bw=tp_busbw_gbs * GB,
                internode_bw=nic_gbs * GB, dp_intra_bw=tp_busbw_gbs * GB, dp_inter_bw=nic_gbs * GB,
                pinned_host_bytes=1024 * GiB, gpus_per_node=8, host_link_gpus=2,
                gemm_half_width=gemm_half_width, tp_overlap=0.5)


#: What the A100 profile's figures were checked against (benchmarks/reproduce_measured.py,
#: docs/planner.md#calibration): the largest relative error over the ZB paper's 93 measured rows, and
#: over the rows held out of the fit (every row but Table 4's 1.5B and 6.2B settings, whose profiled
#: op times the three constants were fit on: ``measured.FIT_MODELS``), each rounded up to 0.1 point;
#: tests/test_measured.py pins each.
A100_THROUGHPUT_ERROR = 0.087
A100_MEMORY_ERROR = 0.060
A100_HELD_OUT_THROUGHPUT_ERROR = 0.083
A100_HELD_OUT_MEMORY_ERROR = 0.056
A100_CALIBRATION = (f"±{A100_THROUGHPUT_ERROR:.1%} throughput, ±{A100_MEMORY_ERROR:.1%} peak memory on the ZB "
                    f"paper's measured A100 rows (±{A100_HELD_OUT_THROUGHPUT_ERROR:.1%} and "
                    f"±{A100_HELD_OUT_MEMORY_ERROR:.1%} on those held out of the fit)")

#: The H100 and H200 profiles: fit on our runtime's measured F, B and W of the reference transformer's
#: layer groups (h 4096-16384, s 4096, bf16; ``benchmarks/fit_gpu_profile.py`` on docs/gpu/gpu_check_*.json),
#: each checked on the other GPU's run (the same GH100 compute) as a held-out set. ``gemm_half_width``
#: is the least-squares fit of the H200's measured GEMM sweep (gpu_check's profile section). Whole
#: single-GPU iterations (``benchmarks/gpu_iteration.py``, docs/gpu/iteration_*.json) are held out.
GH100_HALF_WIDTH = 320
H100_CALIBRATION = ("±8.8% on the layer op times (F, B, W) our runtime measured on an H100 (h 4096-16384, "
                    "s 4096, bf16), ±8.0% on an H200's, held out; whole single-GPU iterations within 5.3% (time) "
                    "and 6.2% (our reference model's activation memory), held out; pipelines on several "
                    "H100s not checked")
H200_CALIBRATION = ("±6.3% on the layer op times (F, B, W) our runtime measured on an H200 (h 4096-16384, "
                    "s 4096, bf16), ±7.1% on an H100's, held out; whole single-GPU iterations within 3.6% (time) "
                    "and 6.2% (our reference model's activation memory), held out; pipelines on several "
                    "H200s not checked")

#: Built-in profiles (sources: docs/cost-model.md#hardware-profiles). Compute: A100 fit on the ZB paper's
#: profiled op times (least squares on its 1.5B and 6.2B stages), H100 and H200 on our own runs (above).
#: The host link is one GPU alone on its PCIe link: H100 measured 44-55 GB/s pinned each way (docs/gpu.md), A100 PCIe Gen4 x16 about half;
#: two GPUs share it (``host_link_gpus``), which brings each to PipeOffload's 15/21 GB/s range.
#: The inter-stage link is calibrated on ZB's measured T_comm = 0.601 ms for the 1.5B model
#: (6·1024·2304·2 B = 28.3 MB per hop: 50 GB/s + 10 µs gives 0.58 ms) and scaled 1.5× for NVLink 4.
HARDWARE: dict[str, Hardware] = {
    "a100-80g": _profile(
        "a100-80g", 260, 80, 24, 50, 10,
        "A100 SXM 80GB (HGX): 260 TFLOP/s on a large 16-bit GEMM, w/(w+128) of it at smallest GEMM "
        "dimension w, elementwise ops 4.5 (F) and 4.0 (B) passes over the bytes F writes at 2.0 TB/s "
        "(least-squares fit on the ZB paper's profiled 1.5B and 6.2B op times on 8 GPUs), "
        "P2P posted ahead as pipeoffload's and ZB's runtimes do (the hop on the dependency, not on the "
        "stage), PCIe Gen4 host link 24 GB/s shared by 2 GPUs, NVLink 3 all-reduce bus bandwidth "
        "230 GB/s, HDR InfiniBand 22 GB/s per GPU",
        **_hgx(312, 2.0, 230, 22, 128),
        shape_efficiency=True, elementwise_f=4.5, elementwise_b=4.0, p2p_exposed=0.0, calibration=A100_CALIBRATION,
    ),
    "h100-80g": _profile(
        "h100-80g", 682, 80, 50, 75, 10,
        "H100 SXM 80GB (HGX): 682 TFLOP/s on a large bf16 GEMM, w/(w+320) of it at smallest GEMM dimension w "
        "(the H200's measured GEMM sweep: the same GH100 compute), elementwise ops 3.0 (F) and 8.25 (B) passes "
        "over the bytes F writes at 3.35 TB/s (fit on our runtime's measured F, B, W on an H100, docs/gpu.md), "
        "PCIe Gen5 host link 50 GB/s (measured 44-55) shared by 2 GPUs, NVLink 4 all-reduce bus bandwidth "
        "360 GB/s, NDR InfiniBand 45 GB/s per GPU",
        **_hgx(989, 3.35, 360, 45, GH100_HALF_WIDTH),
        shape_efficiency=True, elementwise_f=3.0, elementwise_b=8.25, calibration=H100_CALIBRATION,
    ),
    "h200": _profile(
        "h200", 699, 140, 50, 75, 10,
        "H200 SXM 141GB: 699 TFLOP/s on a large bf16 GEMM, w/(w+320) of it at smallest GEMM dimension w "
        "(measured sweep: 754 TFLOP/s at 8192^3), elementwise ops 5.0 (F) and 11.0 (B) passes over the bytes "
        "F writes at 4.8 TB/s (fit on our runtime's measured F, B, W on an H200, docs/gpu.md), PCIe Gen5 host "
        "link 50 GB/s (measured 54-55 each way alone) shared by 2 GPUs, NVLink 4 as H100",
        **_hgx(989, 4.8, 360, 45, GH100_HALF_WIDTH),
        shape_efficiency=True, elementwise_f=5.0, elementwise_b=11.0, calibration=H200_CALIBRATION,
    ),
    "cpu": _profile(
        "cpu", 0.03, 4, 5, 1, 200,
        "This CPU machine (2 cores) running the runtime's gloo ranks: ~30 GFLOP/s per rank under load, "
        "4 GiB per rank, memcpy-speed 'host' copies, loopback gloo P2P; for planning tiny models",
        peak_rate=0.07e12, hbm_bw=10 * GB, tp_bw=1 * GB, internode_bw=1 * GB, dp_intra_bw=1 * GB,
        dp_inter_bw=1 * GB, pinned_host_bytes=8 * GiB, reserve_bytes=0.5 * GiB, gpus_per_node=2,
        host_link_gpus=1, gemm_half_width=0.0, tp_overlap=0.0,
    ),
}

_REQUIRED = ("compute_tflops", "hbm_gib", "host_link_gbs", "interstage_gbs")
_INT_KEYS = ("gpus_per_node", "host_link_gpus")
_FLOAT_KEYS = {"gemm_half_width": "gemm_half_width", "tp_overlap": "tp_overlap",
               "elementwise_f_passes": "elementwise_f", "elementwise_b_passes": "elementwise_b",
               "allocator_overhead": "allocator_overhead", "p2p_exposed": "p2p_exposed"}
_OPTIONAL = ("name", "link_latency_us", "note", "calibration", "shape_efficiency") + tuple(_FLOAT_KEYS) + _INT_KEYS + tuple(
    k for k, _ in _OPTIONAL_FILE.values())


def hardware_names() -> list[str]:
    return list(HARDWARE)


def read_table(path: str | Path, param: str) -> dict[str, Any]:
    """Read one flat table from a ``.toml`` or ``.json`` file (other suffixes: tried as JSON, then TOML).

    Raises ParameterError(param) for a missing file, a parse error, or a top level that is not a table.
    """
    p = Path(path)
    text = read_input(p, param)
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
    extra: dict[str, Any] = {}
    for attr, (key, unit) in _OPTIONAL_FILE.items():
        if key in data:
            extra[attr] = _number(data, key, source, minimum_exclusive=key != "reserve_gib") * unit
    for key, attr in _FLOAT_KEYS.items():
        if key in data:
            extra[attr] = _number(data, key, source, minimum_exclusive=False)
    if "shape_efficiency" in data:
        if not isinstance(data["shape_efficiency"], bool):
            raise ParameterError("hardware", f"{source}: key 'shape_efficiency' must be true or false, "
                                             f"got {data['shape_efficiency']!r}")
        extra["shape_efficiency"] = data["shape_efficiency"]
    if "calibration" in data:
        if not isinstance(data["calibration"], str):
            raise ParameterError("hardware", f"{source}: key 'calibration' must be a string, "
                                             f"got {data['calibration']!r}")
        extra["calibration"] = data["calibration"]
    for key in _INT_KEYS:
        if key in data:
            x = data[key]
            if not isinstance(x, int) or isinstance(x, bool) or x < 1:
                raise ParameterError("hardware", f"{source}: key {key!r} must be an integer >= 1, got {x!r}")
            extra[key] = x
    return _profile(
        name,
        _number(data, "compute_tflops", source),
        _number(data, "hbm_gib", source),
        _number(data, "host_link_gbs", source),
        _number(data, "interstage_gbs", source),
        latency,
        note,
        **extra,
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
