"""Random numbers keyed by what is computed, not by when or where.

During a forward of layer group ``s`` on microbatch ``j`` in step ``t``, every module
call reseeds the device's default generator (and the CPU's) from
``(seed, t, j, the module's name, how many times it was called in this forward)``
before it runs. Dropout masks and any other random op inside a module therefore
depend only on the seed, the step, the microbatch and the module — not on the
schedule, the order in which ranks run their ops, or how the layers are split into
stages — so the same seed gives the same losses for every schedule and every
pipeline size. Random ops written directly in a stage module's own ``forward``
(outside any submodule) are keyed by the layer group instead (``"<stage s>"``), so
they are reproducible for a given split only.

The module names are the runner's parameter names' prefixes (``model.layers.3.mlp``);
the hooks are process-wide forward pre-hooks installed only for the duration of each
forward (``torch.nn.modules.module.register_module_forward_pre_hook``): no user
module is modified. The generators' states from before the step are restored at its
end, so code outside the runner sees the random stream it would have seen without it.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Iterator, Mapping

import torch
from torch import nn
from torch.nn.modules.module import register_module_forward_pre_hook

_MASK = (1 << 63) - 1
_M64 = 0xFFFFFFFFFFFFFFFF
_START = 0x9E3779B97F4A7C15


def _round(x: int, p: int) -> int:
    """One splitmix64 round of :func:`_mix`: the state ``x`` after mixing in ``p``."""
    x = (x ^ (p & _M64)) * 0xBF58476D1CE4E5B9 & _M64
    x ^= x >> 31
    x = x * 0x94D049BB133111EB & _M64
    return x ^ (x >> 29)


def _mix(*parts: int) -> int:
    """A 63-bit seed from integers (splitmix64 over the parts)."""
    x = _START
    for p in parts:
        x = _round(x, p)
    return x & _MASK


def _name_key(name: str) -> int:
    return int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "little")


class KeyedRNG:
    """The keyed random streams of one runner (module docstring).

    ``names``: module object id -> its name, for every module of this rank's layer
    groups (a stage module itself maps to ``"<stage s>"``). ``device``: the rank's
    device, whose generator is reseeded together with the CPU's."""

    def __init__(self, seed: int, names: Mapping[int, str], device: torch.device) -> None:
        self.seed = int(seed)
        self._keys = {oid: _name_key(n) for oid, n in names.items()}
        self.device = device
        self._calls: dict[int, int] = {}
        self._base = 0
        self._saved: Any = None

    @contextlib.contextmanager
    def step(self) -> Iterator[None]:
        """Around a whole step: restore the generators' states afterwards."""
        cpu = torch.get_rng_state()
        dev = torch.cuda.get_rng_state(self.device) if self.device.type == "cuda" else None
        try:
            yield
        finally:
            torch.set_rng_state(cpu)
            if dev is not None:
                torch.cuda.set_rng_state(dev, self.device)

    @contextlib.contextmanager
    def forward(self, step: int, microbatch: int) -> Iterator[None]:
        """Around one forward: every module call reseeds from its key."""
        self._base = _mix(self.seed, step, microbatch)
        self._calls = {}
        handle = register_module_forward_pre_hook(self._hook())
        try:
            yield
        finally:
            handle.remove()

    def _hook(self) -> Any:
        """The pre-hook of one forward: ``_mix(base, key, n)`` with the base's round done
        once (the same seeds, fewer operations per module call)."""
        keys, calls = self._keys, self._calls
        start = _round(_START, self._base)
        seeders = [torch.default_generator.manual_seed]
        if self.device.type == "cuda":
            seeders.append(torch.cuda.default_generators[self.device.index or 0].manual_seed)

        def pre_hook(module: nn.Module, args: Any) -> None:
            mid = id(module)
            key = keys.get(mid)
            if key is None:
                return
            n = calls.get(mid, 0)
            calls[mid] = n + 1
            seed = _round(_round(start, key), n) & _MASK
            for seed_with in seeders:
                seed_with(seed)

        return pre_hook


def module_names(modules: Mapping[int, nn.Module], prefix_of: Mapping[int, str]) -> dict[int, str]:
    """id -> name of every submodule of the layer groups ``modules``; a layer group's own
    module is ``"<stage s>"``. ``prefix_of[s]``: the prefix the naming adds ("" or "s.")."""
    out: dict[int, str] = {}
    for s in sorted(modules):
        for name, mod in modules[s].named_modules(remove_duplicate=False):
            out.setdefault(id(mod), prefix_of.get(s, "") + name if name else f"<stage {s}>")
    return out
