"""Random numbers keyed by what is computed, not by when or where.

During a forward of layer group ``s`` on microbatch ``j`` in step ``t``, every call of
a module that can draw random numbers reseeds the device's default generator (and the
CPU's) from ``(seed, t, j, the module's name, how many times it was called in this
forward)`` before it runs. Dropout masks and any other random op inside a module
therefore depend only on the seed, the step, the microbatch and the module — not on the
schedule, the order in which ranks run their ops, or how the layers are split into
stages — so the same seed gives the same losses for every schedule and every pipeline
size. Random ops written directly in a stage module's own ``forward`` (outside any
submodule) are keyed by the layer group instead (``"<stage s>"``), so they are
reproducible for a given split only.

Which modules reseed: all but those whose own code never draws, matched by exact type
(subclasses and anything else reseed): torch's deterministic layers and containers
(:data:`DETERMINISTIC`: ``nn.Linear``, ``nn.Embedding``, the norms, convolutions,
activations, ``nn.Sequential``/``ModuleList``/``ModuleDict``) and the classes declared
with :func:`never_draws` (the reference transformer's). A hook on them would cost every
call of theirs the module's slow path and a reseed (about 10 µs each, with the hook's
registration and removal around every forward) for nothing: a module's draws are keyed
by its own reseed, so skipping a module that never draws changes no random number.
A layer group none of whose modules reseeds costs nothing per forward.

The loss function's draws (if any) are keyed like a module named ``"<loss>"``, called
once per microbatch: it is reseeded right before the loss, whatever ran before it.

The module names are the runner's parameter names' prefixes (``model.layers.3.mlp``);
the hooks are forward pre-hooks registered (first in line) on the running layer
group's reseeding modules for the duration of each forward only: between forwards no
user module carries them. The generators' states from before the step are restored at
its end, so code outside the runner sees the random stream it would have seen without
it.
"""

from __future__ import annotations

import contextlib
import hashlib
from typing import Any, Iterator, Mapping

import torch
from torch import nn

from ..errors import ParameterError

_MASK = (1 << 63) - 1
_M64 = 0xFFFFFFFFFFFFFFFF
_START = 0x9E3779B97F4A7C15

#: torch's layers that never draw random numbers (matched by exact type, module docstring).
DETERMINISTIC: frozenset[type] = frozenset(t for t in (
    nn.Linear, nn.Bilinear, nn.Embedding, nn.EmbeddingBag, nn.LayerNorm, getattr(nn, "RMSNorm", None),
    nn.GroupNorm, nn.BatchNorm1d, nn.BatchNorm2d, nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Identity, nn.Flatten,
    nn.ReLU, nn.GELU, nn.SiLU, nn.Tanh, nn.Sigmoid, nn.Softmax, nn.LogSoftmax, nn.Mish, nn.LeakyReLU, nn.ELU,
    nn.Softplus, nn.Hardtanh, nn.Hardswish, nn.PReLU, nn.Sequential, nn.ModuleList, nn.ModuleDict)
    if t is not None)

#: Classes declared with :func:`never_draws` (matched by exact type).
_DECLARED: set[type] = set()
#: The key of the loss function's draws (module docstring).
LOSS_NAME = "<loss>"


def never_draws(cls: type[nn.Module]) -> type[nn.Module]:
    """Declare that the module class ``cls``'s own code never draws random numbers.

    Its submodules are judged on their own (a declared block holding an ``nn.Dropout``
    still reseeds that dropout). Modules of exactly this class then carry no reseeding
    hook (subclasses still do: they may override ``forward``).

    Args:
        cls: an ``nn.Module`` subclass whose ``forward`` (and every function it calls
            outside its submodules) calls no random op: no dropout, no ``torch.rand*``,
            no ``bernoulli``/``multinomial``/``normal_``, no attention with
            ``dropout_p > 0``.

    Returns:
        ``cls`` itself (usable as a class decorator).

    Raises:
        ParameterError: ``cls`` is not an ``nn.Module`` subclass.

    Guarantees:
        For a class that keeps the promise, every random number of every step is the
        same with and without the declaration; a false declaration makes the class's
        own draws follow the stream left by the module reseeded before it.
    """
    if not (isinstance(cls, type) and issubclass(cls, nn.Module)):
        raise ParameterError("cls", f"expected an nn.Module subclass, got {cls!r}")
    _DECLARED.add(cls)
    return cls


def reseeds(module: nn.Module) -> bool:
    """Whether ``module`` gets a reseeding hook: its exact type is neither in
    :data:`DETERMINISTIC` nor declared with :func:`never_draws`."""
    t = type(module)
    return t not in DETERMINISTIC and t not in _DECLARED


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
    groups (a stage module itself maps to ``"<stage s>"``). ``modules``: layer group
    -> its module: the reseeding hooks go on its submodules that can draw random
    numbers. ``device``: the rank's device, whose generator is reseeded together with
    the CPU's."""

    def __init__(self, seed: int, names: Mapping[int, str], device: torch.device,
                 modules: Mapping[int, nn.Module]) -> None:
        self.seed = int(seed)
        self._keys = {oid: _name_key(n) for oid, n in names.items()}
        self.device = device
        #: layer group -> its modules that reseed (each once, in registration order)
        self._hooked: dict[int, list[nn.Module]] = {}
        for s, mod in modules.items():
            seen: dict[int, nn.Module] = {}
            for sub in mod.modules():
                if id(sub) in self._keys and reseeds(sub):
                    seen.setdefault(id(sub), sub)
            self._hooked[s] = list(seen.values())
        self._calls: dict[int, int] = {}
        self._base = 0
        self._loss_key = _name_key(LOSS_NAME)
        self._seeders = [torch.default_generator.manual_seed]
        if self.device.type == "cuda":
            self._seeders.append(torch.cuda.default_generators[self.device.index or 0].manual_seed)

    def before_loss(self, step: int, microbatch: int) -> None:
        """Reseed for the loss function of microbatch ``microbatch`` in step ``step``
        (keyed like a module named :data:`LOSS_NAME`, called once)."""
        seed = _mix(_mix(self.seed, step, microbatch), self._loss_key, 0)
        for seed_with in self._seeders:
            seed_with(seed)

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
    def forward(self, step: int, microbatch: int, stage: int) -> Iterator[None]:
        """Around one forward of layer group ``stage``: each call of its reseeding
        modules reseeds from its key."""
        mods = self._hooked.get(stage)
        if not mods:  # nothing in this layer group draws: no hook, no reseed
            yield
            return
        self._base = _mix(self.seed, step, microbatch)
        self._calls = {}
        hook = self._hook()
        handles = [m.register_forward_pre_hook(hook, prepend=True) for m in mods]
        try:
            yield
        finally:
            for h in handles:
                h.remove()

    def _hook(self) -> Any:
        """The pre-hook of one forward: ``_mix(base, key, n)`` with the base's round done
        once (the same seeds, fewer operations per module call)."""
        keys, calls = self._keys, self._calls
        start = _round(_START, self._base)
        seeders = self._seeders

        def pre_hook(module: nn.Module, args: Any) -> None:
            mid = id(module)
            n = calls.get(mid, 0)
            calls[mid] = n + 1
            seed = _round(_round(start, keys[mid]), n) & _MASK
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
